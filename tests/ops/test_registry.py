"""The pure helpers of the registry adapter: what a version stores and its measures.

The promotion policy itself is tested on plain data in tests/ops/test_promotion.py; no
MLflow store is touched here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qpr.artifacts import LEGACY_SEARCH_FILE, REQUIRED_FILES, SEARCH_FILE
from qpr.ops.registry import _measures, _stage_bundle, bundle_files

METRICS = {"success_1": 0.8, "recip_rank": 0.85, "val": {"recip_rank": 0.9, "success_1": 0.88}}


def test_measures_keep_test_and_val_only():
    flat = _measures({**METRICS, "baselines": {"bm25": {"success_1": 0.5}}, "flag": True})
    assert flat == {
        "success_1": 0.8,
        "recip_rank": 0.85,
        "val.recip_rank": 0.9,
        "val.success_1": 0.88,
    }


@pytest.mark.parametrize("optional", [(), ("index/bm25.npz",), ("index/query_encoder.onnx",)])
def test_staged_bundle_keeps_the_optional_files_present(
    tmp_path: Path, optional: tuple[str, ...]
) -> None:
    """BM25's weights and the int8 query encoder travel with the bundle when it has them:
    a registered model without its query encoder would serve float32 queries, not what its
    evaluation measured."""
    models = tmp_path / "models"
    for rel in (*map(str, REQUIRED_FILES), *optional):
        (models / rel).parent.mkdir(parents=True, exist_ok=True)
        (models / rel).write_text(rel, encoding="utf-8")
    staged = _stage_bundle(models, {"success_1": 0.9}, tmp_path / "staged")
    copied = sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file())
    expected = {*map(str, REQUIRED_FILES), *optional}
    assert set(copied) - {"metrics.json"} == expected


def test_an_older_bundle_is_staged_with_its_threshold_json(tmp_path: Path) -> None:
    """A bundle written before search.json is stored as it is (same files, same
    fingerprint); search.json wins when a directory holds both."""
    models = tmp_path / "models"
    for rel in (*REQUIRED_FILES, LEGACY_SEARCH_FILE):
        (models / rel).parent.mkdir(parents=True, exist_ok=True)
        (models / rel).write_text(str(rel), encoding="utf-8")
    assert SEARCH_FILE in bundle_files(models) and LEGACY_SEARCH_FILE not in bundle_files(models)
    (models / SEARCH_FILE).unlink()
    files = bundle_files(models)
    assert LEGACY_SEARCH_FILE in files and SEARCH_FILE not in files
    staged = _stage_bundle(models, {"success_1": 0.9}, tmp_path / "staged")
    assert (staged / LEGACY_SEARCH_FILE).read_text(encoding="utf-8") == str(LEGACY_SEARCH_FILE)
    assert not (staged / SEARCH_FILE).exists()


def test_predict_names_hit_columns_as_the_cli_and_the_service(tmp_path: Path) -> None:
    from qpr.ops.registry import PREDICTION_COLUMNS, QPRSearchModel
    from qpr.retrieval.bundle import HIT_FIELDS, Bundle
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    model = QPRSearchModel()
    model._bundle = Bundle.load(build_bundle(tmp_path / "models", QUESTIONS, QIDS))
    model._k = 2
    frame = model.predict(None, [QUESTIONS[7], QUESTIONS[3]])
    assert tuple(frame.columns) == PREDICTION_COLUMNS == ("query", "rank", *HIT_FIELDS, "answered")
    top = frame[frame["rank"] == 1]
    assert top["answer_id"].tolist() == ["ans-3", "ans-1"]
    assert top["question_id"].tolist() == [str(QIDS[7]), str(QIDS[3])]
    assert top["score"].tolist() == pytest.approx([1.0, 1.0], abs=1e-5)

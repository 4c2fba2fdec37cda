"""The promotion rule and the pure helpers of the registry adapter, by hand-worked cases.

decide_promotion is the one decision that can replace a serving model, so every branch is
pinned here with numbers small enough to check in one's head; no MLflow store is touched.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from qpr.artifacts import LEGACY_SEARCH_FILE, REQUIRED_FILES, SEARCH_FILE
from qpr.ops.registry import (
    RegistryError,
    VersionInfo,
    _measures,
    _stage_bundle,
    bundle_files,
    decide_promotion,
    metric_value,
)

MARGIN = 0.01
FLOOR = 0.5


@pytest.mark.parametrize(
    ("challenger", "champion", "promoted", "words"),
    [
        # first model: the floor alone decides
        (0.60, None, True, "no champion yet"),
        (0.50, None, True, "no champion yet"),  # exactly at the floor passes
        (0.40, None, False, "below the quality floor"),
        # a champion exists: challenger >= champion + margin
        (0.72, 0.70, True, "beats champion"),  # better by 0.02 > 0.01
        (0.71, 0.70, True, "beats champion"),  # better by exactly the margin
        (0.705, 0.70, False, "less than the margin"),  # better, but within the margin
        (0.70, 0.70, False, "not better"),  # a tie keeps the champion
        (0.65, 0.70, False, "not better"),  # worse
        # the floor holds even when the champion is worse still (a hand-promoted one)
        (0.45, 0.30, False, "below the quality floor"),
        (float("nan"), None, False, "NaN"),
        (0.60, float("nan"), True, "no champion yet"),  # a champion without a measure
    ],
)
def test_decide_promotion(challenger, champion, promoted, words):
    decision, reason = decide_promotion(challenger, champion, margin=MARGIN, floor=FLOOR)
    assert decision is promoted
    assert words in reason


def test_reason_names_both_measures_and_the_margin():
    _, reason = decide_promotion(0.705, 0.70, margin=MARGIN, floor=FLOOR)
    assert "0.7050" in reason and "0.7000" in reason and "0.0100" in reason


def test_zero_margin_promotes_any_improvement_but_not_a_tie():
    assert decide_promotion(0.7001, 0.70, margin=0.0, floor=0.0)[0]
    assert not decide_promotion(0.70, 0.70 + 1e-9, margin=0.0, floor=0.0)[0]


def test_negative_margin_is_rejected():
    with pytest.raises(ValueError, match="margin"):
        decide_promotion(0.8, 0.7, margin=-0.1, floor=0.0)


METRICS = {"success_1": 0.8, "recip_rank": 0.85, "val": {"recip_rank": 0.9, "success_1": 0.88}}


def test_metric_value_follows_dotted_keys():
    assert metric_value(METRICS, "val.recip_rank") == 0.9
    assert metric_value(METRICS, "success_1") == 0.8


@pytest.mark.parametrize(
    ("key", "words"), [("val.map", "'map'"), ("test.recip_rank", "'test'"), ("val", "not a number")]
)
def test_metric_value_missing_or_not_a_number(key, words):
    with pytest.raises(RegistryError, match=words):
        metric_value(METRICS, key)


def test_measures_keep_test_and_val_only():
    flat = _measures({**METRICS, "baselines": {"bm25": {"success_1": 0.5}}, "flag": True})
    assert flat == {
        "success_1": 0.8,
        "recip_rank": 0.85,
        "val.recip_rank": 0.9,
        "val.success_1": 0.88,
    }


def test_version_measure_prefers_the_judged_metric_then_the_recorded_ones():
    info = VersionInfo(
        name="m",
        version=3,
        aliases=("champion",),
        metric="val.recip_rank",
        value=0.9,
        created=datetime.now(UTC),
        run_id=None,
        tags={"qpr.measures": '{"val.success_1": 0.88}'},
    )
    assert info.is_champion
    assert info.measure("val.recip_rank") == 0.9
    assert info.measure("val.success_1") == 0.88
    assert info.measure("val.map") is None


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
    assert top["question_id"].tolist() == [QIDS[7], QIDS[3]]
    assert top["score"].tolist() == pytest.approx([1.0, 1.0], abs=1e-5)

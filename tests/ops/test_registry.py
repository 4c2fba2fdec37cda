"""The registry adapter: what a version stores, its measures, and how it reads in MLflow.

The pure helpers are tested on files; a registered version on the session's real local
MLflow store (tests/conftest.py): a short description, few tags, the rest in its details
file, and a version registered before that file still read the same. The promotion
policy itself is tested on plain data in tests/ops/test_promotion.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from qpr.artifacts import LEGACY_SEARCH_FILE, REQUIRED_FILES, SEARCH_FILE
from qpr.ops import registry
from qpr.ops.registry import _measures, _stage_bundle, bundle_files
from tests.session_experiment import session_experiment

METRICS = {"success_1": 0.8, "recip_rank": 0.85, "val": {"recip_rank": 0.9, "success_1": 0.88}}


def test_measures_keep_test_and_val_only():
    flat = _measures({**METRICS, "baselines": {"bm25": {"success_1": 0.5}}, "flag": True})
    assert flat == {
        "success_1": 0.8,
        "recip_rank": 0.85,
        "val.recip_rank": 0.9,
        "val.success_1": 0.88,
    }


@pytest.mark.parametrize(
    "optional",
    [(), ("index/bm25.npz",), ("index/query_encoder.onnx",), ("index/companion.npy",)],
)
def test_staged_bundle_keeps_the_optional_files_present(
    tmp_path: Path, optional: tuple[str, ...]
) -> None:
    """BM25's weights, the int8 query encoder and the companion's vectors travel with the
    bundle when it has them: a registered model without its query encoder would serve
    float32 queries, not what its evaluation measured."""
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


METRICS_FULL = {**METRICS, "baselines": {"bm25": {"success_1": 0.5}}}
EXPERIMENT = "qpr-registry-tests"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    return build_bundle(tmp_path_factory.mktemp("registry") / "models", QUESTIONS, QIDS)


@pytest.fixture
def experiment() -> Iterator[str]:
    with session_experiment(EXPERIMENT) as experiment_id:
        yield experiment_id


@pytest.mark.slow
def test_a_version_has_a_description_few_tags_and_its_details_file(models, experiment):
    name = "qpr-registry-few-tags"
    given = {registry.TAG_DATA_SOURCE: "logs", registry.TAG_DATA_HASH: "dvc:f7ad410b362bd5d9.dir"}
    given |= {registry.TAG_GIT_COMMIT: "6e60afcf28e2d30da669f9feb64e3cbf0f20ed79"}
    given |= {"qpr.evaluate_run_id": "0123abcd"}

    info = registry.register_bundle(models, METRICS_FULL, name=name, tags=given)

    from tests.serve.test_app import QUESTIONS

    mv = MlflowClient().get_model_version(name, str(info.version))
    assert mv.description == (
        f"CNN; test P@1 0.800, val.recip_rank 0.900; {len(QUESTIONS)} questions; "
        "data logs f7ad410b; commit 6e60afc"
    )
    assert set(mv.tags) <= set(registry.VERSION_TAGS) and len(mv.tags) <= 6
    details = mlflow.artifacts.load_dict(f"models:/{name}/{info.version}/{registry.DETAILS_FILE}")
    assert details["description"] == mv.description
    recorded = details["tags"]
    assert mv.tags.items() <= {k: str(v) for k, v in recorded.items()}.items()
    assert recorded["qpr.measures"] == _measures(METRICS)  # JSON as JSON, not its text
    assert recorded["qpr.evaluate_run_id"] == "0123abcd"
    assert {registry.TAG_BASE, registry.TAG_DELTAS, "qpr.registered_at"} <= set(recorded)
    # Readers find the moved tags through the version, as they found its tags before.
    again = registry.get_version(name, info.version)
    assert again.measures == _measures(METRICS)
    assert again.tag(registry.TAG_BASE) == registry.base_fingerprint(models)
    assert json.loads(again.tag(registry.TAG_DELTAS))["deltas"] == []
    assert again.tag("qpr.no-such-tag") is None


@pytest.mark.slow
def test_a_version_registered_before_the_details_file_reads_the_same(models, experiment):
    """Every registration tag on the version, no details file: what versions registered
    before it look like. Its readers find the same values."""
    name = "qpr-registry-older"
    old_tags = {
        registry.TAG_FINGERPRINT: "f" * 64,
        registry.TAG_METRIC: "val.recip_rank",
        registry.TAG_METRIC_VALUE: "0.9",
        registry.TAG_MEASURES: json.dumps(_measures(METRICS)),
        registry.TAG_BASE: "b" * 64,
        registry.TAG_DELTAS: json.dumps({"deltas": [1, 2]}),
        "qpr.promoted_by": "register-flow",
        "qpr.promoted_at": "2026-11-27T17:12:06+00:00",
        "qpr.promoted_reason": "first champion",
    }
    client = MlflowClient()
    with mlflow.start_run(run_name="register-before"):
        staged = _stage_bundle(models, METRICS, models.parent / "older" / "bundle")
        logged = registry.log_search_model(staged, name=registry.MODEL_ARTIFACT)
    client.create_registered_model(name)
    mv = client.create_model_version(
        name, logged.model_uri, tags=old_tags, model_id=logged.model_id
    )

    info = registry.get_version(name, mv.version)

    assert info.value == 0.9 and info.measure("val.success_1") == 0.88
    assert info.tag(registry.TAG_BASE) == "b" * 64
    assert json.loads(info.tag(registry.TAG_DELTAS))["deltas"] == [1, 2]
    assert info.details == {}  # no file: nothing read, nothing invented
    assert registry.last_event(info, "promoted")["actor"] == "register-flow"
    # The next event numbers after what it holds, and no latest-action tags are added.
    registry.keep_challenger(name, info.version, reason="kept", actor="tests")
    after = registry.get_version(name, info.version)
    assert [e["action"] for e in registry.events(after)] == ["kept_challenger"]
    assert not any(key.startswith("qpr.kept_challenger_") for key in after.tags)

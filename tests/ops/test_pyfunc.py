"""The registered pyfunc is logged as code: no pickle in the model directory, and a bundle
file changed in the store after logging is refused on load (and by download_bundle). The
``filters`` param searches only the matching questions, as the service's filters do.

The bundle is real (random-weight CNN → ONNX → FAISS Flat, as tests/retrieval does); the
MLflow store is the session's throw-away sqlite one (tests/conftest.py)."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from mlflow.pyfunc import PythonModelContext

from qpr.artifacts import (
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.ops import registry
from qpr.ops.pyfunc import (
    BUNDLE_ARTIFACT,
    MANIFEST_ARTIFACT,
    ModelIntegrityError,
    QPRSearchModel,
    _frame,
    _questions,
    _signature,
    digests,
    parse_filters,
    verify_artifacts,
    verify_bundle,
)
from qpr.retrieval.bundle import Bundle
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.retrieval.selection import FilterError
from qpr.text.vocab import Vocabulary
from tests.session_experiment import session_experiment

NAME = "qpr-pyfunc-test"
QUESTIONS = [
    t.format(v=v, o=o)
    for v, o, t in itertools.product(
        ("install", "reset"), ("printer", "garden", "laptop"), ("how do i {v} my {o}",)
    )
]
# The questions' metadata, filterable: one answer per verb, one locale per object.
ANSWER_IDS = [f"ans-{q.split()[3]}" for q in QUESTIONS]
LOCALES = [{"printer": "en", "garden": "de", "laptop": "fr"}[q.split()[-1]] for q in QUESTIONS]
# Above 2^53, and odd: no double holds them, so a JSON number would lose their last digit.
QIDS = [2**53 + 1 + 2 * i for i in range(len(QUESTIONS))]
FILTERS = [  # {filter: the question ids it keeps, as predict writes them}
    ({"locale": "de"}, {str(QIDS[i]) for i, loc in enumerate(LOCALES) if loc == "de"}),
    ({"locale": ["de", "fr"]}, {str(QIDS[i]) for i, loc in enumerate(LOCALES) if loc != "en"}),
    (
        {"locale": ["de", "fr"], "answer_id": "ans-reset"},
        {str(QIDS[i]) for i, loc in enumerate(LOCALES) if loc != "en" and "reset" in QUESTIONS[i]},
    ),
]


@pytest.mark.parametrize(
    "model_input",
    [
        "how do i reset it",
        ["how do i reset it"],
        pd.Series(["how do i reset it"]),
        pd.DataFrame({"question": ["how do i reset it"]}),
        pd.DataFrame({0: ["how do i reset it"]}),  # what MLflow's schema enforcement passes
    ],
)
def test_predict_accepts_what_pyfunc_callers_send(model_input):
    assert _questions(model_input) == ["how do i reset it"]


def test_predict_input_with_two_unnamed_columns_is_an_error():
    with pytest.raises(ValueError, match="question"):
        _questions(pd.DataFrame({"a": ["x"], "b": ["y"]}))


def test_verify_bundle_names_a_changed_missing_and_extra_file(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "index").mkdir(parents=True)
    for rel in ("a.json", "index/b.npy", "c.txt"):
        (bundle / rel).write_text(rel, encoding="utf-8")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(digests(bundle)), encoding="utf-8")
    verify_bundle(bundle, manifest)  # untouched: passes

    (bundle / "index" / "b.npy").write_text("changed", encoding="utf-8")
    (bundle / "c.txt").unlink()
    (bundle / "extra.py").write_text("import os", encoding="utf-8")
    with pytest.raises(ModelIntegrityError) as caught:
        verify_bundle(bundle, manifest)
    message = str(caught.value)
    assert "index/b.npy: sha256" in message
    assert "c.txt: missing" in message and "extra.py: not in the manifest" in message


def _build_bundle(models: Path) -> None:
    vocab = Vocabulary.build(QUESTIONS, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=8)
    export_onnx(
        encoder, models / ENCODER_FILE, metadata={"vocab_sha256": vocab.checksum, "max_len": "16"}
    )
    vectors = encode(load_session(models / ENCODER_FILE), vocab, QUESTIONS, max_len=16)
    index = build_index(
        vectors, IndexConfig("Flat", nprobe=1, use_gpu=False), seed=0, log=lambda _: None
    )
    save_index(index, models / INDEX_FILE)
    qids = np.asarray(QIDS, dtype=np.int64)
    IdMap(qids).save(models / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(qids, pa.int64()),
            "text": pa.array(QUESTIONS, pa.string()),
            "cluster_id": pa.array(np.arange(len(QUESTIONS)), pa.int64()),
            "answer_id": pa.array(ANSWER_IDS, pa.string()),
            "locale": pa.array(LOCALES, pa.string()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    SearchConfig(threshold=1.0, target_precision=0.9).write(models)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("pyfunc-models")
    _build_bundle(models)
    return models


@pytest.fixture(scope="module")
def model(models: Path, tmp_path_factory: pytest.TempPathFactory) -> QPRSearchModel:
    """The pyfunc's model class loaded as MLflow loads it, without a store."""
    manifest = tmp_path_factory.mktemp("pyfunc-manifest") / "manifest.json"
    manifest.write_text(json.dumps(digests(models)), encoding="utf-8")
    loaded = QPRSearchModel()
    artifacts = {BUNDLE_ARTIFACT: str(models), MANIFEST_ARTIFACT: str(manifest)}
    loaded.load_context(PythonModelContext(artifacts, {"k": 10}))
    return loaded


@pytest.fixture(scope="module")
def registered(models: Path) -> registry.VersionInfo:
    with session_experiment("qpr-pyfunc-tests"):
        return registry.register_bundle(
            models, {"val": {"recip_rank": 0.7}}, name=NAME, metric="val.recip_rank"
        )


def _model_dir(info: registry.VersionInfo, dst: Path) -> Path:
    return Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{NAME}/{info.version}", dst_path=str(dst)
        )
    )


@pytest.mark.slow
def test_the_model_directory_holds_code_not_a_pickle(registered, tmp_path: Path) -> None:
    model_dir = _model_dir(registered, tmp_path)
    names = {p.name for p in model_dir.rglob("*") if p.is_file()}
    assert not {n for n in names if n.endswith((".pkl", ".pickle", ".cloudpickle"))}
    assert "python_model.pkl" not in names
    assert "qpr_search_model.py" in names
    manifest = json.loads((model_dir / "artifacts" / "manifest.json").read_text())
    stored = {  # the first version of its model: it stores every file it names
        p.relative_to(model_dir / "artifacts").as_posix()
        for folder in ("bundle", "code")
        for p in (model_dir / "artifacts" / folder).rglob("*")
        if p.is_file()
    }
    assert set(manifest["files"]) == stored and "code/qpr/ops/pyfunc.py" in stored
    assert {entry["version"] for entry in manifest["files"].values()} == {None}
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/{registered.version}")
    out = model.predict([QUESTIONS[3]], params={"k": 2})
    assert out["text"].tolist()[0] == QUESTIONS[3] and len(out) == 2


@pytest.mark.slow
def test_a_tampered_bundle_file_is_refused_on_load(registered, tmp_path: Path) -> None:
    model_dir = _model_dir(registered, tmp_path)
    verify_artifacts(model_dir / "artifacts")  # as logged: passes
    ids = model_dir / "artifacts" / "bundle" / IDS_FILE
    np.save(ids, np.arange(len(QUESTIONS), dtype=np.int64) + 500)  # same shape, other ids
    with pytest.raises(ModelIntegrityError, match=f"{IDS_FILE}: sha256"):
        mlflow.pyfunc.load_model(str(model_dir))
    with pytest.raises(ModelIntegrityError):
        verify_artifacts(model_dir / "artifacts")


@pytest.mark.parametrize("none", [None, "", "  ", "{}", {}])
def test_no_filters_is_none(none):
    assert parse_filters(none, ("locale",)) is None


def test_parse_filters_reads_a_json_object_or_a_mapping():
    wanted = {"locale": ["de", "fr"], "answer_id": "ans-reset"}
    assert parse_filters(json.dumps(wanted), ("answer_id", "locale")) == wanted
    assert parse_filters(wanted) == wanted


@pytest.mark.parametrize("bad", ["locale=en", '["en"]', '"en"', "{'locale': 'en'}"])
def test_filters_that_are_not_a_json_object_are_a_filter_error(bad):
    with pytest.raises(FilterError, match="JSON object") as caught:
        parse_filters(bad, ("answer_id", "locale"))
    assert caught.value.known == ("answer_id", "locale")


@pytest.mark.parametrize(("wanted", "kept"), FILTERS)
def test_a_filtered_prediction_is_the_bundles_filtered_search(model, models, wanted, kept):
    bundle = Bundle.load(models)
    queries = [QUESTIONS[3], "how do i fix my garden"]
    out = model.predict(None, queries, params={"k": 10, "filters": json.dumps(wanted)})
    pd.testing.assert_frame_equal(out, _frame(bundle.search_batch(queries, 10, filters=wanted)))
    for query in queries:  # every matching question, and only those, for each query
        assert set(out.loc[out["query"] == query, "question_id"]) == kept
    direct = model.predict(None, queries, params={"k": 10, "filters": wanted})  # a dict
    pd.testing.assert_frame_equal(direct, out)


def test_no_filters_give_the_unfiltered_search(model, models):
    expected = _frame(Bundle.load(models).search_batch([QUESTIONS[3]], 4))
    for params in ({"k": 4}, {"k": 4, "filters": ""}, {"k": 4, "filters": "{}"}):
        pd.testing.assert_frame_equal(model.predict(None, [QUESTIONS[3]], params=params), expected)
    assert expected["question_id"].iloc[0] == str(QIDS[3])  # a filter on "de" must drop it


def test_ids_come_through_a_json_serving_layer_exactly(model):
    """`mlflow models serve` writes predict's frame as JSON, and a JavaScript client reads
    every number as a double: the ids are strings, so they arrive whole."""
    from mlflow.pyfunc.scoring_server import predictions_to_json

    out = model.predict(None, [QUESTIONS[3]], params={"k": 3})
    written = io.StringIO()
    predictions_to_json(out, written)
    rows = json.loads(written.getvalue(), parse_int=float)["predictions"]  # as JavaScript reads
    assert (rows[0]["question_id"], rows[0]["cluster_id"]) == (str(QIDS[3]), "3")
    assert int(rows[0]["question_id"]) == QIDS[3] > 2**53
    assert all(isinstance(r["question_id"], str) for r in rows)
    declared = {column.name: column.type.name for column in _signature().outputs.inputs}
    assert declared["question_id"] == declared["cluster_id"] == "string"


def test_a_bad_filter_is_the_services_filter_error(model):
    with pytest.raises(FilterError, match="unknown filter field 'tenant'") as caught:
        model.predict(None, [QUESTIONS[3]], params={"filters": '{"tenant": "a"}'})
    assert "answer_id, locale" in str(caught.value)
    assert caught.value.known == ("answer_id", "locale")
    with pytest.raises(FilterError, match="string or a list of strings"):
        model.predict(None, [QUESTIONS[3]], params={"filters": '{"locale": 5}'})


@pytest.mark.slow
def test_the_registered_champion_filters_as_the_searcher_does(registered) -> None:
    from qpr import Searcher

    mlflow.MlflowClient().set_registered_model_alias(NAME, "champion", str(registered.version))
    registry.mark_committed(NAME, registered.version, by="test")  # Searcher serves only these
    uri = f"models:/{NAME}@champion"
    model = mlflow.pyfunc.load_model(uri)
    assert {p.name for p in model.metadata.get_params_schema().params} == {"k", "filters"}
    searcher = Searcher.load(uri)
    for wanted, kept in FILTERS:
        out = model.predict([QUESTIONS[3]], params={"k": 10, "filters": json.dumps(wanted)})
        expected = searcher.search_batch([QUESTIONS[3]], 10, filters=wanted)
        pd.testing.assert_frame_equal(out, _frame(expected))
        assert set(out["question_id"]) == kept
    unfiltered = model.predict([QUESTIONS[3]], params={"k": 10})
    pd.testing.assert_frame_equal(unfiltered, _frame(searcher.search_batch([QUESTIONS[3]], 10)))
    with pytest.raises(FilterError, match=r"unknown filter field 'tenant'.*answer_id, locale"):
        model.predict([QUESTIONS[3]], params={"filters": '{"tenant": "a"}'})

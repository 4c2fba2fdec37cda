"""Loading a bundle (qpr.retrieval.loading): the files it needs, the cross-checks that
refuse files of different runs, the search depth it is loaded at, the query encoder
search.json declares, and older bundles read through `qpr.artifacts.migrate`.

The fixture is a real bundle built with the library itself (`tests.retrieval.cnn_bundle`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qpr.artifacts import (
    BM25_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUANTIZED_FROM,
    QUERY_ENCODER_FILE,
    QUERY_ENCODER_KINDS,
    QUESTIONS_FILE,
    SEARCH_FILE,
    SEARCH_FORMAT,
    VOCAB_FILE,
    QueryEncoderEntry,
    SearchConfig,
)
from qpr.io import file_sha256
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.retrieval.bundle import Bundle
from qpr.retrieval.dense import IdMap
from qpr.retrieval.loading import BundleError, load_bundle_parts
from qpr.text.vocab import Vocabulary
from tests.retrieval.cnn_bundle import (
    DIM,
    QUESTIONS,
    STORED_THRESHOLD,
    UNSEEN,
    make_hybrid,
    write_config,
    write_index,
    write_legacy,
)

ONNX = QueryEncoderEntry("onnx", (ENCODER_FILE,))
INT8 = QueryEncoderEntry("onnx-int8", (QUERY_ENCODER_FILE,))


def _rewrite(models: Path, drop: tuple[str, ...] = (), **values: object) -> None:
    """search.json as an older qpr wrote it: keys dropped, values set."""
    payload = json.loads((models / SEARCH_FILE).read_text(encoding="utf-8"))
    payload = {key: value for key, value in payload.items() if key not in drop}
    (models / SEARCH_FILE).write_text(json.dumps({**payload, **values}), encoding="utf-8")


# ---------------------------------------------------------------- the files


def test_the_parts_of_a_bundle(bundle_dir: Path, bundle: Bundle) -> None:
    parts = load_bundle_parts(bundle_dir)
    assert parts.root == bundle_dir and parts.fingerprint == bundle.fingerprint
    assert parts.encoder.dim == DIM and parts.encoder.path == bundle_dir / ENCODER_FILE
    assert parts.questions.index.ntotal == len(QUESTIONS) and parts.reranker is None
    assert parts.config.format == SEARCH_FORMAT and parts.config.query_encoder == ONNX
    with pytest.raises(ValueError, match="threads"):
        load_bundle_parts(bundle_dir, threads=0)


def test_fingerprint_changes_with_any_file(bundle: Bundle, copy_dir: Path) -> None:
    write_config(copy_dir, 2.0)
    assert load_bundle_parts(copy_dir).fingerprint != bundle.fingerprint


@pytest.mark.parametrize(
    "rel", [VOCAB_FILE, ENCODER_FILE, INDEX_FILE, IDS_FILE, QUESTIONS_FILE, SEARCH_FILE]
)
def test_missing_file(copy_dir: Path, rel: Path) -> None:
    (copy_dir / rel).unlink()
    with pytest.raises(BundleError, match=f"missing .*{rel.name}"):
        load_bundle_parts(copy_dir)


def test_vocabulary_checksum_mismatch(copy_dir: Path) -> None:
    Vocabulary.build([*QUESTIONS, "one new word"], max_words=1000, hash_bins=8).save(
        copy_dir / VOCAB_FILE
    )
    with pytest.raises(BundleError, match=r"encoder\.onnx.*vocab\.json"):
        load_bundle_parts(copy_dir)


def test_encoder_without_metadata(copy_dir: Path) -> None:
    vocab = Vocabulary.load(copy_dir / VOCAB_FILE)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=DIM)
    export_onnx(encoder, copy_dir / ENCODER_FILE, metadata={"vocab_sha256": vocab.checksum})
    with pytest.raises(BundleError, match=r"encoder\.onnx.*max_len"):
        load_bundle_parts(copy_dir)


def test_dimension_mismatch(copy_dir: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((len(QUESTIONS), DIM + 4), dtype=np.float32)
    write_index(copy_dir, vectors)
    with pytest.raises(BundleError, match=rf"index\.faiss holds {DIM + 4}-dim.*{DIM} dim"):
        load_bundle_parts(copy_dir)


def test_id_count_mismatch(copy_dir: Path) -> None:
    qids = IdMap.load(copy_dir / IDS_FILE).qids
    IdMap(qids[:-1]).save(copy_dir / IDS_FILE)
    with pytest.raises(BundleError, match=r"index\.ids\.npy maps 49 rows.*holds 50"):
        load_bundle_parts(copy_dir)


def test_question_count_mismatch(copy_dir: Path) -> None:
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    pq.write_table(table.slice(0, 49), copy_dir / QUESTIONS_FILE)
    with pytest.raises(BundleError, match=r"questions\.parquet has 49 questions.*50"):
        load_bundle_parts(copy_dir)


def test_question_ids_of_another_index(copy_dir: Path) -> None:
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    other = table.set_column(0, "question_id", pa.array(np.arange(50, dtype=np.int64)))
    pq.write_table(other, copy_dir / QUESTIONS_FILE)
    with pytest.raises(BundleError, match=r"questions\.parquet: question ids .* not in"):
        load_bundle_parts(copy_dir)


def test_fused_bundle_refuses_missing_or_foreign_bm25(copy_dir: Path) -> None:
    from qpr.retrieval.bm25 import BM25Index

    make_hybrid(copy_dir, 0.5, dense_candidates=20)
    (copy_dir / BM25_FILE).unlink()
    with pytest.raises(BundleError, match=r"bm25\.npz is missing"):
        load_bundle_parts(copy_dir)
    BM25Index.build(QUESTIONS[:7]).save(copy_dir / BM25_FILE)
    with pytest.raises(BundleError, match="different index runs"):
        load_bundle_parts(copy_dir)


def test_answer_ids_must_be_strings(copy_dir: Path) -> None:
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    ints = pa.array(range(table.num_rows), pa.int64())
    pq.write_table(table.append_column("answer_id", ints), copy_dir / QUESTIONS_FILE)
    with pytest.raises(BundleError, match="answer_id must be strings"):
        load_bundle_parts(copy_dir)


# ---------------------------------------------------------------- search depth


def test_ef_search_for_an_hnsw_index(bundle: Bundle, copy_dir: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((len(QUESTIONS), DIM), dtype=np.float32)
    write_index(copy_dir, vectors, "HNSW8,Flat")  # the index stage's default efSearch
    assert Bundle.load(copy_dir).ef_search == 256
    write_index(copy_dir, vectors, "HNSW8,Flat", ef_search=21)
    assert Bundle.load(copy_dir).ef_search == 21  # as stored by the index stage
    assert Bundle.load(copy_dir, ef_search=64).ef_search == 64
    write_config(copy_dir, STORED_THRESHOLD, ef_search=33)  # the evaluate stage's
    assert Bundle.load(copy_dir).ef_search == 33
    assert Bundle.load(copy_dir, ef_search=64).ef_search == 64
    # a fused bundle: the efSearch the evaluate stage chose, unless the caller says otherwise
    make_hybrid(copy_dir, 0.5, dense_candidates=20, ef_search=40)
    assert Bundle.load(copy_dir).ef_search == 40
    assert Bundle.load(copy_dir, ef_search=64).ef_search == 64
    assert Bundle.load(copy_dir).nprobe is None
    assert bundle.ef_search is None  # Flat: no graph
    with pytest.raises(ValueError, match="ef_search"):
        Bundle.load(copy_dir, ef_search=0)


def test_nprobe_for_an_ivf_index(bundle: Bundle, copy_dir: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((len(QUESTIONS), DIM), dtype=np.float32)
    write_index(copy_dir, vectors, "IVF2,Flat")  # lowered to IVF1 for 50 vectors
    assert Bundle.load(copy_dir).nprobe == 1  # as stored: the search config names none
    assert Bundle.load(copy_dir, nprobe=4).nprobe == 4
    # the depth the evaluate stage searched with (search.json) beats the index file's
    write_config(copy_dir, STORED_THRESHOLD, nprobe=2)
    assert Bundle.load(copy_dir).nprobe == 2
    assert Bundle.load(copy_dir, nprobe=4).nprobe == 4
    # a fused bundle: the nprobe the evaluate stage chose, unless the caller says otherwise
    make_hybrid(copy_dir, 0.5, dense_candidates=20, nprobe=3)
    assert Bundle.load(copy_dir).nprobe == 3
    assert Bundle.load(copy_dir, nprobe=4).nprobe == 4


# ---------------------------------------------------------------- the search config


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"threshold": 1.0, "metric": "ip"}', "metric 'ip'"),
        ('{"threshold": "high", "metric": "l2"}', "not a finite number"),
        ('{"metric": "l2"}', "'threshold' key"),
        ("{not json", "cannot read"),
    ],
)
def test_bad_legacy_threshold_file(copy_dir: Path, content: str, message: str) -> None:
    write_legacy(copy_dir, {})
    (copy_dir / "threshold.json").write_text(content, encoding="utf-8")
    with pytest.raises(BundleError, match=rf"threshold\.json.*{message}|{message}.*threshold"):
        load_bundle_parts(copy_dir)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"threshold": 1.0, "metric": "ip"}, "metric 'ip'"),
        ({"threshold": "high"}, "not a finite number"),
        ({"threshold": 1.0, "nprobe": 0}, "nprobe must be an integer >= 1"),
        ({"threshold": 1.0, "top_k": 3}, "unknown keys"),
        ({"dense_weight": 0.5}, "needs lexical_candidates"),
        ({"lexical_candidates": 5}, "without a dense_weight"),
        ({"dense_weight": 0.5, "lexical_candidates": 5, "fused_nprobe": 2}, "dense_candidates"),
        ({"format": 3}, "format 3 is newer than this qpr reads"),
        ({"format": "2"}, "format must be an integer"),
        ({"query_encoder": {"kind": "tflite", "files": ["a.tflite"]}}, "kind 'tflite'"),
        ({"query_encoder": {"kind": "onnx", "files": ["student.onnx"]}}, "loaded from"),
    ],
)
def test_bad_search_config(copy_dir: Path, payload: dict, message: str) -> None:
    (copy_dir / SEARCH_FILE).write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(BundleError, match=rf"search\.json: .*{message}"):
        load_bundle_parts(copy_dir)


@pytest.mark.parametrize(
    "bad",
    [
        {"dense_weight": 1.5, "candidates": 10},
        {"dense_weight": 0.5},
        "yes",
        {"candidates": 3},
        {"dense_weight": 0.5, "candidates": 3, "dense_candidates": 0},
        {"dense_weight": 0.5, "candidates": 3, "dense_candidates": 2, "nprobe": "all"},
        {"dense_weight": 0.5, "candidates": 3, "ef_search": 64},
    ],
)
def test_bad_legacy_fusion_entry(copy_dir: Path, bad: object) -> None:
    make_hybrid(copy_dir, 0.5)
    write_legacy(copy_dir, {"threshold": None, "metric": "l2", "fusion": bad})
    with pytest.raises(BundleError, match="fusion must be null"):
        load_bundle_parts(copy_dir)


# ---------------------------------------------------------------- the declared query encoder


def _int8_copy(models: Path) -> None:
    """index/query_encoder.onnx as the index stage writes it: it names the encoder.onnx it
    was quantised from (a float32 copy: the loader checks where it came from, not its
    arithmetic)."""
    model = onnx.load(str(models / ENCODER_FILE))
    entry = model.metadata_props.add()
    entry.key, entry.value = QUANTIZED_FROM, file_sha256(models / ENCODER_FILE)
    onnx.save(model, str(models / QUERY_ENCODER_FILE))


def test_queries_go_through_the_declared_encoder(
    bundle: Bundle, copy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _int8_copy(copy_dir)
    write_config(copy_dir, STORED_THRESHOLD, query_encoder=INT8)
    assert Bundle.load(copy_dir).encoder_kernel == "onnx-int8"
    # declared float32: the int8 file is not served (but hashed, as it always was)
    write_config(copy_dir, STORED_THRESHOLD, query_encoder=ONNX)
    declared = Bundle.load(copy_dir)
    assert declared.encoder_kernel == "onnx" and declared.fingerprint != bundle.fingerprint
    # declared none (a bundle older than the declaration): the files decide, as before
    _rewrite(copy_dir, drop=("query_encoder",))
    with caplog.at_level("INFO", logger="qpr.artifacts"):
        undeclared = Bundle.load(copy_dir)
    assert undeclared.encoder_kernel == "onnx-int8"
    assert undeclared.search_config.query_encoder == INT8
    assert "no query_encoder declared: onnx-int8 (index/query_encoder.onnx)" in caplog.text


@pytest.mark.parametrize("kind", ["onnx-int8", "student"])
def test_a_declared_query_encoder_that_is_missing_is_refused(copy_dir: Path, kind: str) -> None:
    (rel,) = QUERY_ENCODER_KINDS[kind]
    write_config(copy_dir, STORED_THRESHOLD, query_encoder={"kind": kind, "files": [str(rel)]})
    with pytest.raises(BundleError, match=rf"declares the {kind} .*{rel.name}, but .* missing"):
        load_bundle_parts(copy_dir)


# ---------------------------------------------------------------- older bundles


def test_a_format_1_bundle_loads_as_the_current_format(
    copy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """search.json without format and query_encoder (written before both): read as the
    current format, the query encoder its files say, and searched alike."""
    write_config(copy_dir, STORED_THRESHOLD, query_encoder=ONNX)
    current = Bundle.load(copy_dir)
    _rewrite(copy_dir, drop=("format", "query_encoder"))
    with caplog.at_level("INFO", logger="qpr.artifacts"):
        old = Bundle.load(copy_dir)
    assert old.search_config == current.search_config
    assert old.search_config.format == SEARCH_FORMAT and old.encoder_kernel == "onnx"
    assert "format 1 read as 2" in caplog.text and "no query_encoder declared" in caplog.text
    migrated = [r for r in caplog.records if r.name == "qpr.artifacts"]
    assert len(migrated) == 1  # logged once, everything it assumed in one line
    for question in (UNSEEN, QUESTIONS[3]):
        assert old.search(question, k=5) == current.search(question, k=5)


def test_an_older_bundle_with_threshold_json_loads(bundle: Bundle, copy_dir: Path) -> None:
    """Bundles written before search.json (and versions registered then) still load and
    search alike; their fingerprint hashes the file they hold."""
    write_legacy(copy_dir, {"threshold": STORED_THRESHOLD, "metric": "l2", "fusion": None})
    old = Bundle.load(copy_dir)
    assert old.threshold == STORED_THRESHOLD and old.fusion is None
    assert old.search_config == SearchConfig(threshold=STORED_THRESHOLD, query_encoder=ONNX)
    assert old.fingerprint != bundle.fingerprint
    for question in (UNSEEN, QUESTIONS[3]):
        assert old.search(question, k=5) == bundle.search(question, k=5)
    # search.json, once written, is what the bundle is searched with
    write_config(copy_dir, 2.0)
    assert Bundle.load(copy_dir).threshold == 2.0


def test_an_older_fused_bundle_loads_as_it_did(copy_dir: Path) -> None:
    fusion = {"dense_weight": 0.5, "candidates": 6, "dense_candidates": 3, "nprobe": 2}
    make_hybrid(copy_dir, 0.5, candidates=6, dense_candidates=3, nprobe=2)
    new = Bundle.load(copy_dir)
    write_legacy(copy_dir, {"threshold": STORED_THRESHOLD, "metric": "l2", "fusion": fusion})
    old = Bundle.load(copy_dir)
    assert old.fusion == new.fusion == fusion
    for question in ("repair bicycle", UNSEEN, QUESTIONS[3]):
        assert old.search(question, k=5) == new.search(question, k=5)


def test_a_bundle_evaluated_before_exact_scoring_is_served_with_it(
    copy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fused threshold.json without dense_candidates: served as a bundle whose index
    gives as many candidates as BM25, every candidate scored by its exact distance."""
    make_hybrid(copy_dir, 0.5, candidates=6, dense_candidates=6)
    exact = Bundle.load(copy_dir)
    fusion = {"dense_weight": 0.5, "candidates": 6}
    write_legacy(copy_dir, {"threshold": STORED_THRESHOLD, "metric": "l2", "fusion": fusion})
    with caplog.at_level("WARNING", logger="qpr.artifacts"):
        old = Bundle.load(copy_dir)
    assert "exact scoring" in caplog.text and "threshold.json" in caplog.text
    assert old.fusion == exact.fusion == {**fusion, "dense_candidates": 6}
    for question in ("repair bicycle", UNSEEN, QUESTIONS[3]):
        assert old.search(question, k=5) == exact.search(question, k=5)


def test_a_bundle_without_answer_ids_loads_with_null_answers(
    copy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="qpr.retrieval.loading"):
        loaded = Bundle.load(copy_dir)  # the fixture's table predates answer ids
    assert "no answer_id column" in caplog.text and "run the index stage again" in caplog.text
    hits = loaded.search(QUESTIONS[3], k=3).hits
    assert hits and all(hit.answer_id is None for hit in hits)
    assert all(hit.as_dict()["answer_id"] is None for hit in hits)


# ---------------------------------------------------------------- deltas


def test_a_delta_with_a_missing_file_is_left_out_and_named(copy_dir: Path) -> None:
    """The bundle loads the main index and the other deltas; the fingerprint hashes the
    files that are there, so a repair changes it."""
    import pandas as pd

    from qpr.artifacts import DELTA_VECTORS_FILE
    from qpr.deltas.add import add_questions
    from qpr.deltas.format import delta_dir

    for number, text in enumerate([UNSEEN, "where can i rent a tent for my trip"], start=1):
        frame = pd.DataFrame({"question_id": [number], "text": [text], "cluster_id": [-1]})
        add_questions(copy_dir, frame)
    whole = load_bundle_parts(copy_dir)
    vectors = copy_dir / delta_dir(1) / DELTA_VECTORS_FILE
    kept = vectors.read_bytes()
    vectors.unlink()

    parts = load_bundle_parts(copy_dir)
    assert dict(parts.failed_deltas) == {1: "deltas/0001: vectors.faiss missing"}
    assert parts.questions.index.ntotal == len(QUESTIONS) + 1 and 2 in parts.questions.qids
    assert whole.failed_deltas == {} and parts.fingerprint != whole.fingerprint
    vectors.write_bytes(kept)
    assert load_bundle_parts(copy_dir).fingerprint == whole.fingerprint

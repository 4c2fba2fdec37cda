"""The model bundle: loading checks, search semantics, and the no-torch query path.

The fixture builds a real bundle with the library itself (random-weight CNN → ONNX →
FAISS Flat), so these tests also pin the file layout the pipeline stages write.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from qpr.artifacts import (
    BM25_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    LEGACY_SEARCH_FILE,
    QUESTIONS_FILE,
    SEARCH_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.text.vocab import Vocabulary

VERBS = ("install", "reset", "update", "clean", "repair")
OBJECTS = ("printer", "garden", "bicycle", "laptop", "kitchen")
TEMPLATES = ("how do i {v} my {o}", "what is the best way to {v} a {o}?")
MAX_LEN = 16
DIM = 8
# Stored threshold: far below any distance between two different random-CNN vectors, so
# an indexed question is answered (distance ~0) and an unseen one is not.
STORED_THRESHOLD = 1e-6


def _questions() -> list[str]:
    return [t.format(v=v, o=o) for v, o, t in itertools.product(VERBS, OBJECTS, TEMPLATES)]


QUESTIONS = _questions()  # 50
UNSEEN = "where can i buy a kite for my nephew"


def _write_config(models: Path, threshold: float | None, **fields: object) -> None:
    SearchConfig(threshold=threshold, target_precision=0.9, **fields).write(models)


def _write_legacy(models: Path, payload: dict) -> None:
    """An older bundle: threshold.json instead of search.json."""
    (models / SEARCH_FILE).unlink(missing_ok=True)
    (models / LEGACY_SEARCH_FILE).write_text(json.dumps(payload), encoding="utf-8")


def _write_index(models: Path, vectors: np.ndarray, factory: str = "Flat", **config) -> None:
    index = build_index(
        vectors,
        IndexConfig(factory, nprobe=1, use_gpu=False, **config),
        seed=0,
        log=lambda _: None,
    )
    save_index(index, models / INDEX_FILE)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/ as the pipeline writes it; question ids are not row numbers, and the
    parquet is stored in another order than the index, as nothing guarantees it is not."""
    models = tmp_path_factory.mktemp("models")
    vocab = Vocabulary.build(QUESTIONS, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=DIM)
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )
    vectors = encode(load_session(models / ENCODER_FILE), vocab, QUESTIONS, max_len=MAX_LEN)
    _write_index(models, vectors)
    qids = np.arange(len(QUESTIONS), dtype=np.int64) * 10 + 1000
    IdMap(qids).save(models / IDS_FILE)
    order = np.random.default_rng(0).permutation(len(QUESTIONS))
    table = pa.table(
        {
            "question_id": pa.array(qids[order], pa.int64()),
            "text": pa.array([QUESTIONS[i] for i in order], pa.string()),
            # cluster = (verb, object); the first cluster's questions belong to none
            "cluster_id": pa.array([i // 2 if i >= 2 else -1 for i in order], pa.int64()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    _write_config(models, STORED_THRESHOLD)
    return models


@pytest.fixture(scope="module")
def bundle(bundle_dir: Path) -> Bundle:
    return Bundle.load(bundle_dir)


@pytest.fixture
def copy_dir(bundle_dir: Path, tmp_path: Path) -> Path:
    """A private copy to break."""
    return Path(shutil.copytree(bundle_dir, tmp_path / "models"))


# ---------------------------------------------------------------- loading


def test_properties(bundle: Bundle, bundle_dir: Path) -> None:
    assert bundle.dim == DIM
    assert bundle.size == len(QUESTIONS)
    assert bundle.max_len == MAX_LEN
    assert bundle.threshold == STORED_THRESHOLD
    assert bundle.nprobe is None  # Flat: no inverted lists
    assert len(bundle.fingerprint) == 64
    assert Bundle.load(bundle_dir).fingerprint == bundle.fingerprint  # deterministic


def test_fingerprint_changes_with_any_file(bundle: Bundle, copy_dir: Path) -> None:
    _write_config(copy_dir, 2.0)
    assert Bundle.load(copy_dir).fingerprint != bundle.fingerprint


def test_ef_search_for_an_hnsw_index(bundle: Bundle, copy_dir: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((len(QUESTIONS), DIM), dtype=np.float32)
    _write_index(copy_dir, vectors, "HNSW8,Flat")  # the index stage's default efSearch
    assert Bundle.load(copy_dir).ef_search == 256
    _write_index(copy_dir, vectors, "HNSW8,Flat", ef_search=21)
    assert Bundle.load(copy_dir).ef_search == 21  # as stored by the index stage
    assert Bundle.load(copy_dir, ef_search=64).ef_search == 64
    _write_config(copy_dir, STORED_THRESHOLD, ef_search=33)  # the evaluate stage's
    assert Bundle.load(copy_dir).ef_search == 33
    assert Bundle.load(copy_dir, ef_search=64).ef_search == 64
    # a fused bundle: the efSearch the evaluate stage chose, unless the caller says otherwise
    _make_hybrid(copy_dir, 0.5, dense_candidates=20, ef_search=40)
    assert Bundle.load(copy_dir).ef_search == 40
    assert Bundle.load(copy_dir, ef_search=64).ef_search == 64
    assert Bundle.load(copy_dir).nprobe is None
    assert bundle.ef_search is None  # Flat: no graph
    with pytest.raises(ValueError, match="ef_search"):
        Bundle.load(copy_dir, ef_search=0)


def test_nprobe_for_an_ivf_index(bundle: Bundle, copy_dir: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((len(QUESTIONS), DIM), dtype=np.float32)
    _write_index(copy_dir, vectors, "IVF2,Flat")  # lowered to IVF1 for 50 vectors
    assert Bundle.load(copy_dir).nprobe == 1  # as stored: the search config names none
    assert Bundle.load(copy_dir, nprobe=4).nprobe == 4
    # the depth the evaluate stage searched with (search.json) beats the index file's
    _write_config(copy_dir, STORED_THRESHOLD, nprobe=2)
    assert Bundle.load(copy_dir).nprobe == 2
    assert Bundle.load(copy_dir, nprobe=4).nprobe == 4
    # a fused bundle: the nprobe the evaluate stage chose, unless the caller says otherwise
    _make_hybrid(copy_dir, 0.5, dense_candidates=20, nprobe=3)
    assert Bundle.load(copy_dir).nprobe == 3
    assert Bundle.load(copy_dir, nprobe=4).nprobe == 4


def test_a_fast_scan_index_is_searched_per_query(bundle: Bundle, copy_dir: Path) -> None:
    import faiss

    vocab = Vocabulary.load(copy_dir / VOCAB_FILE)
    vectors = encode(load_session(copy_dir / ENCODER_FILE), vocab, QUESTIONS, max_len=MAX_LEN)
    _write_index(copy_dir, vectors, "IVF1,PQ4x4fs,RFlat")
    fast = Bundle.load(copy_dir)
    # FAISS does not store the kernel choice: the bundle sets it
    # (qpr.retrieval.dense.use_per_query_scan)
    assert faiss.downcast_index(faiss.extract_index_ivf(fast._index)).implem == 11
    # exact re-ranking of every row (one list, 50 questions): the Flat bundle's ranking
    for question in ("repair bicycle", UNSEEN, QUESTIONS[7]):
        want = [h.question_id for h in bundle.search(question, k=5).hits]
        assert [h.question_id for h in fast.search(question, k=5).hits] == want


@pytest.mark.parametrize(
    "rel", [VOCAB_FILE, ENCODER_FILE, INDEX_FILE, IDS_FILE, QUESTIONS_FILE, SEARCH_FILE]
)
def test_missing_file(copy_dir: Path, rel: Path) -> None:
    (copy_dir / rel).unlink()
    with pytest.raises(BundleError, match=f"missing .*{rel.name}"):
        Bundle.load(copy_dir)


def test_vocabulary_checksum_mismatch(copy_dir: Path) -> None:
    Vocabulary.build([*QUESTIONS, "one new word"], max_words=1000, hash_bins=8).save(
        copy_dir / VOCAB_FILE
    )
    with pytest.raises(BundleError, match=r"encoder\.onnx.*vocab\.json"):
        Bundle.load(copy_dir)


def test_encoder_without_metadata(copy_dir: Path) -> None:
    vocab = Vocabulary.load(copy_dir / VOCAB_FILE)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=DIM)
    export_onnx(encoder, copy_dir / ENCODER_FILE, metadata={"vocab_sha256": vocab.checksum})
    with pytest.raises(BundleError, match=r"encoder\.onnx.*max_len"):
        Bundle.load(copy_dir)


def test_dimension_mismatch(copy_dir: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((len(QUESTIONS), DIM + 4), dtype=np.float32)
    _write_index(copy_dir, vectors)
    with pytest.raises(BundleError, match=rf"index\.faiss holds {DIM + 4}-dim.*{DIM} dim"):
        Bundle.load(copy_dir)


def test_id_count_mismatch(copy_dir: Path) -> None:
    qids = IdMap.load(copy_dir / IDS_FILE).qids
    IdMap(qids[:-1]).save(copy_dir / IDS_FILE)
    with pytest.raises(BundleError, match=r"index\.ids\.npy maps 49 rows.*holds 50"):
        Bundle.load(copy_dir)


def test_question_count_mismatch(copy_dir: Path) -> None:
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    pq.write_table(table.slice(0, 49), copy_dir / QUESTIONS_FILE)
    with pytest.raises(BundleError, match=r"questions\.parquet has 49 questions.*50"):
        Bundle.load(copy_dir)


def test_question_ids_of_another_index(copy_dir: Path) -> None:
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    other = table.set_column(0, "question_id", pa.array(np.arange(50, dtype=np.int64)))
    pq.write_table(other, copy_dir / QUESTIONS_FILE)
    with pytest.raises(BundleError, match=r"questions\.parquet: question ids .* not in"):
        Bundle.load(copy_dir)


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
    (copy_dir / SEARCH_FILE).unlink()
    (copy_dir / LEGACY_SEARCH_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(BundleError, match=rf"threshold\.json.*{message}|{message}.*threshold"):
        Bundle.load(copy_dir)


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
    ],
)
def test_bad_search_config(copy_dir: Path, payload: dict, message: str) -> None:
    (copy_dir / SEARCH_FILE).write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(BundleError, match=rf"search\.json: .*{message}"):
        Bundle.load(copy_dir)


def test_an_older_bundle_with_threshold_json_loads(bundle: Bundle, copy_dir: Path) -> None:
    """Bundles written before search.json (and versions registered then) still load and
    search alike; their fingerprint hashes the file they hold."""
    _write_legacy(copy_dir, {"threshold": STORED_THRESHOLD, "metric": "l2", "fusion": None})
    old = Bundle.load(copy_dir)
    assert old.threshold == STORED_THRESHOLD and old.fusion is None
    assert old.search_config == SearchConfig(threshold=STORED_THRESHOLD)
    assert old.fingerprint != bundle.fingerprint
    for question in (UNSEEN, QUESTIONS[3]):
        assert old.search(question, k=5) == bundle.search(question, k=5)
    # search.json, once written, is what the bundle is searched with
    _write_config(copy_dir, 2.0)
    assert Bundle.load(copy_dir).threshold == 2.0


# ---------------------------------------------------------------- search


def test_indexed_question_finds_itself(bundle: Bundle) -> None:
    for i in (0, 17, 49):
        result = bundle.search(QUESTIONS[i], k=5)
        top = result.hits[0]
        assert top.question_id == 1000 + 10 * i
        assert top.text == QUESTIONS[i]
        assert top.cluster_id == (i // 2 if i >= 2 else -1)
        assert top.distance == pytest.approx(0.0, abs=1e-5)
        assert top.score == pytest.approx(1.0, abs=1e-5)
        assert result.hits[1].distance > top.distance
        assert result.answered and result.query == QUESTIONS[i]


def test_k_respected_and_clipped(bundle: Bundle) -> None:
    hits = bundle.search(UNSEEN, k=3).hits
    assert len(hits) == 3
    distances = [h.distance for h in hits]
    assert distances == sorted(distances)
    assert all(0 < h.score <= 1 for h in hits)
    everything = bundle.search(UNSEEN, k=1000).hits
    assert len(everything) == len(QUESTIONS)
    assert len({h.question_id for h in everything}) == len(QUESTIONS)
    with pytest.raises(ValueError, match="k must be"):
        bundle.search(UNSEEN, k=0)


def test_batch_equals_single(bundle: Bundle) -> None:
    # Mixed lengths, one over max_len (truncated the same way on both paths).
    long_question = " ".join(["please", "tell", "me"] * 8) + " how to clean a boat"
    questions = [UNSEEN, QUESTIONS[3], "reset", long_question, QUESTIONS[40]]
    batch = bundle.search_batch(questions, k=4)
    assert len(batch) == len(questions)
    for question, got in zip(questions, batch, strict=True):
        want = bundle.search(question, k=4)
        assert got.query == want.query and got.answered == want.answered
        assert [h.question_id for h in got.hits] == [h.question_id for h in want.hits]
        np.testing.assert_allclose(
            [h.distance for h in got.hits], [h.distance for h in want.hits], rtol=1e-4, atol=1e-6
        )
    assert bundle.search_batch([], k=4) == []


def test_threshold_decides_answered(bundle: Bundle, copy_dir: Path) -> None:
    d1 = bundle.search(UNSEEN, k=1).hits[0].distance
    assert d1 > STORED_THRESHOLD
    assert not bundle.search(UNSEEN).answered  # stored threshold
    assert bundle.search(QUESTIONS[5]).answered
    assert bundle.search(UNSEEN, threshold=d1 * 1.01).answered  # the argument wins
    assert not bundle.search(UNSEEN, threshold=d1 * 0.99).answered
    assert bundle.search(UNSEEN, threshold=math.inf).answered
    assert [r.answered for r in bundle.search_batch([UNSEEN, QUESTIONS[5]])] == [False, True]
    _write_config(copy_dir, None)
    unthresholded = Bundle.load(copy_dir)
    assert unthresholded.threshold is None
    assert unthresholded.search(UNSEEN).answered  # no threshold: any hit answers


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_empty_question(bundle: Bundle, question: str) -> None:
    with pytest.raises(ValueError, match="empty question"):
        bundle.search(question)
    with pytest.raises(ValueError, match=r"empty question \(question 1\)"):
        bundle.search_batch([UNSEEN, question])


def test_question_without_words(bundle: Bundle) -> None:
    with pytest.raises(ValueError, match="no words"):
        bundle.search("?!? ...")


def test_wrong_types(bundle: Bundle) -> None:
    with pytest.raises(TypeError):
        bundle.search_batch(UNSEEN)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        bundle.search(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- no torch


def test_query_path_never_imports_torch(bundle_dir: Path) -> None:
    script = (
        "import sys\n"
        "import qpr.retrieval.encoders, qpr.retrieval.dense\n"
        "assert 'torch' not in sys.modules, 'the encoders or the dense index import torch'\n"
        "from qpr.retrieval.bundle import Bundle\n"
        f"b = Bundle.load({str(bundle_dir)!r})\n"
        f"r = b.search({QUESTIONS[0]!r}, k=3)\n"
        "assert r.hits[0].text == " + repr(QUESTIONS[0]) + "\n"
        "b.search_batch(['how do i reset my printer', 'clean a boat'])\n"
        "leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not leaked, leaked\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- the qpr search command


def test_search_command_prints_ranked_paraphrases(bundle_dir: Path) -> None:
    from typer.testing import CliRunner

    from qpr.cli import app

    runner = CliRunner()
    result = runner.invoke(
        app, ["search", QUESTIONS[3], "-k", "3", "--models-dir", str(bundle_dir)]
    )
    assert result.exit_code == 0, result.output
    assert QUESTIONS[3] in result.output and "answered" in result.output

    as_json = runner.invoke(
        app, ["search", QUESTIONS[3], "-k", "2", "--json", "--models-dir", str(bundle_dir)]
    )
    payload = json.loads(as_json.output)
    assert payload["hits"][0]["text"] == QUESTIONS[3]
    assert len(payload["hits"]) == 2 and payload["answered"] is True


def test_search_command_rejects_bad_input_without_a_traceback(
    bundle_dir: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from qpr.cli import app

    runner = CliRunner()
    blank = runner.invoke(app, ["search", "   ", "--models-dir", str(bundle_dir)])
    assert blank.exit_code == 1 and "empty question" in blank.output
    missing = runner.invoke(app, ["search", "hi there", "--models-dir", str(tmp_path)])
    assert missing.exit_code == 1 and "Traceback" not in missing.output


# ---------------------------------------------------------------- BM25 fused in


def _make_hybrid(
    models: Path,
    dense_weight: float,
    candidates: int = 20,
    dense_candidates: int | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
) -> None:
    """A fused search config as the evaluate stage writes it (dense_candidates and the
    fused depth) or, without them, as bundles written before candidates were scored
    exactly."""
    from qpr.retrieval.bm25 import BM25Index

    BM25Index.build(QUESTIONS).save(models / BM25_FILE)  # index row order = QUESTIONS
    _write_config(
        models,
        STORED_THRESHOLD,
        dense_weight=dense_weight,
        lexical_candidates=candidates,
        dense_candidates=dense_candidates,
        fused_nprobe=nprobe,
        fused_ef_search=ef_search,
    )


def test_rescored_fusion_scores_every_candidate_exactly(bundle: Bundle, copy_dir: Path) -> None:
    from qpr.retrieval.bm25 import BM25Index

    question = "best way to clean my laptop"
    # α = 1 over BM25's 5 candidates and the index's max(k, 2): all ranked by exact distance
    _make_hybrid(copy_dir, 1.0, candidates=5, dense_candidates=2, nprobe=1)
    hybrid = Bundle.load(copy_dir)
    assert hybrid.fusion == {
        "dense_weight": 1.0,
        "candidates": 5,
        "dense_candidates": 2,
        "nprobe": 1,
    }
    hybrid = Bundle.load(copy_dir, nprobe=bundle.nprobe)  # the dense side as `bundle` searches
    qids = np.arange(len(QUESTIONS), dtype=np.int64) * 10 + 1000
    lexical = {int(qids[r]) for r in BM25Index.build(QUESTIONS).search(question, 5)[1] if r >= 0}
    distance = {h.question_id: h.distance for h in bundle.search(question, k=len(QUESTIONS)).hits}
    for k in (1, 3, 8):
        dense = {h.question_id for h in bundle.search(question, k=max(k, 2)).hits}
        expected = sorted(lexical | dense, key=lambda q: (distance[q], q))[:k]
        hits = hybrid.search(question, k=k).hits
        assert [h.question_id for h in hits] == expected
        for hit in hits:
            assert hit.distance == pytest.approx(distance[hit.question_id], rel=1e-5, abs=1e-6)


def test_fused_question_alone_ranks_as_in_a_batch(bundle: Bundle, copy_dir: Path) -> None:
    # one question takes its own path (the union's distances through RowDistances, the
    # kept hits' distances read at the fusion's slots); a batch goes through the general one
    _make_hybrid(copy_dir, 0.5, candidates=6, dense_candidates=3, nprobe=2)
    hybrid = Bundle.load(copy_dir)
    questions = ["repair bicycle", UNSEEN, QUESTIONS[3], "how to clean a boat", QUESTIONS[40]]
    for k in (1, 4, 12):
        batch = hybrid.search_batch(questions, k=k)
        for question, got in zip(questions, batch, strict=True):
            alone = hybrid.search(question, k=k)
            assert alone.answered == got.answered
            assert [h.question_id for h in alone.hits] == [h.question_id for h in got.hits]
            for a, b in zip(alone.hits, got.hits, strict=True):
                assert a.distance == pytest.approx(b.distance, rel=1e-4, abs=1e-6)
                assert a.score == pytest.approx(b.score, abs=1e-5)


def test_fused_bundle_ranks_by_fused_score_with_true_distances(
    bundle: Bundle, copy_dir: Path
) -> None:
    _make_hybrid(copy_dir, 0.5)
    hybrid = Bundle.load(copy_dir)
    assert hybrid.fusion == {"dense_weight": 0.5, "candidates": 20}
    assert bundle.fusion is None and hybrid.fingerprint != bundle.fingerprint
    result = hybrid.search("repair bicycle", k=10)
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True) and 0.0 <= scores[-1] <= scores[0] <= 1.0
    # every hit's distance is the exact L2 distance the dense search reports for that row
    exact = {h.question_id: h.distance for h in bundle.search("repair bicycle", k=50).hits}
    for hit in result.hits:
        assert hit.distance == pytest.approx(exact[hit.question_id], rel=1e-5, abs=1e-6)
    batch = hybrid.search_batch(["repair bicycle", QUESTIONS[3]], k=10)
    assert batch[0] == result


def test_fusion_weight_one_is_the_dense_ranking_and_zero_is_bm25(
    bundle: Bundle, copy_dir: Path
) -> None:
    from qpr.retrieval.bm25 import BM25Index

    question = "best way to clean my laptop"
    _make_hybrid(copy_dir, 1.0)
    dense_ids = [h.question_id for h in bundle.search(question, k=5).hits]
    assert [h.question_id for h in Bundle.load(copy_dir).search(question, k=5).hits] == dense_ids
    _make_hybrid(copy_dir, 0.0)
    top_row = int(BM25Index.build(QUESTIONS).search(question, 1)[1][0])
    qids = np.arange(len(QUESTIONS), dtype=np.int64) * 10 + 1000
    assert Bundle.load(copy_dir).search(question, k=1).hits[0].question_id == qids[top_row]


def test_fused_bundle_refuses_missing_or_foreign_bm25(copy_dir: Path) -> None:
    from qpr.retrieval.bm25 import BM25Index

    _make_hybrid(copy_dir, 0.5)
    (copy_dir / BM25_FILE).unlink()
    with pytest.raises(BundleError, match=r"bm25\.npz is missing"):
        Bundle.load(copy_dir)
    BM25Index.build(QUESTIONS[:7]).save(copy_dir / BM25_FILE)
    with pytest.raises(BundleError, match="different index runs"):
        Bundle.load(copy_dir)


@pytest.mark.parametrize(
    "fusion",
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
def test_bad_legacy_fusion_entry(copy_dir: Path, fusion: object) -> None:
    _make_hybrid(copy_dir, 0.5)
    _write_legacy(copy_dir, {"threshold": None, "metric": "l2", "fusion": fusion})
    with pytest.raises(BundleError, match="fusion must be null"):
        Bundle.load(copy_dir)


def test_an_older_fused_bundle_loads_as_it_did(bundle: Bundle, copy_dir: Path) -> None:
    fusion = {"dense_weight": 0.5, "candidates": 6, "dense_candidates": 3, "nprobe": 2}
    _make_hybrid(copy_dir, 0.5, candidates=6, dense_candidates=3, nprobe=2)
    new = Bundle.load(copy_dir)
    _write_legacy(copy_dir, {"threshold": STORED_THRESHOLD, "metric": "l2", "fusion": fusion})
    old = Bundle.load(copy_dir)
    assert old.fusion == new.fusion == fusion
    for question in ("repair bicycle", UNSEEN, QUESTIONS[3]):
        assert old.search(question, k=5) == new.search(question, k=5)


# ---------------------------------------------------------------- answers and explain


def _answers(models: Path) -> dict[int, str]:
    """questions.parquet with an answer_id per question (its cluster's; its own for the
    questions in no cluster), as the index stage writes it; {question_id: answer_id}."""
    table = pq.read_table(models / QUESTIONS_FILE)
    qids = table.column("question_id").to_pylist()
    clusters = table.column("cluster_id").to_pylist()
    answers = [f"ans-{c}" if c >= 0 else f"own-{q}" for q, c in zip(qids, clusters, strict=True)]
    pq.write_table(table.append_column("answer_id", pa.array(answers, pa.string())),
                   models / QUESTIONS_FILE)  # fmt: skip
    return dict(zip(qids, answers, strict=True))


def test_hits_carry_the_answer_id_of_their_question(copy_dir: Path) -> None:
    from qpr.retrieval.bundle import HIT_FIELDS

    answers = _answers(copy_dir)
    loaded = Bundle.load(copy_dir)
    for result in loaded.search_batch(QUESTIONS[:10], k=5):
        assert all(hit.answer_id == answers[hit.question_id] for hit in result.hits)
        assert all(tuple(hit.as_dict()) == HIT_FIELDS for hit in result.hits)  # no explain
        assert all(hit.explain is None for hit in result.hits)


def test_a_bundle_without_answer_ids_loads_with_null_answers(
    copy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="qpr.retrieval.bundle"):
        loaded = Bundle.load(copy_dir)  # the fixture's table predates answer ids
    assert "no answer_id column" in caplog.text and "run the index stage again" in caplog.text
    hits = loaded.search(QUESTIONS[3], k=3).hits
    assert hits and all(hit.answer_id is None for hit in hits)
    assert all(hit.as_dict()["answer_id"] is None for hit in hits)


def test_answer_ids_must_be_strings(copy_dir: Path) -> None:
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    ints = pa.array(range(table.num_rows), pa.int64())
    pq.write_table(table.append_column("answer_id", ints), copy_dir / QUESTIONS_FILE)
    with pytest.raises(BundleError, match="answer_id must be strings"):
        Bundle.load(copy_dir)


def _assert_recomposes(hit, weight: float, question: str) -> None:
    """The explanation's parts give the hit's score; its words are the question's."""
    from qpr.text.words import tokenize

    part = hit.explain
    assert part is not None and part.dense_weight == weight
    assert part.fused_score == hit.score and part.dense_distance == hit.distance
    recomposed = weight * part.dense_scaled + (1.0 - weight) * part.bm25_scaled
    assert recomposed == pytest.approx(hit.score, abs=1e-5)
    assert 0.0 <= part.dense_scaled <= 1.0 and 0.0 <= part.bm25_scaled <= 1.0
    assert set(part.matched_words) <= set(tokenize([question])[0])
    assert (part.bm25_score > 0) == bool(part.matched_words)
    assert hit.as_dict()["explain"]["matched_words"] == list(part.matched_words)


@pytest.mark.parametrize(
    ("weight", "dense_candidates"), [(0.5, 3), (0.3, None), (0.8, 20)], ids=str
)
def test_explain_parts_recompose_the_fused_score(
    copy_dir: Path, weight: float, dense_candidates: int | None
) -> None:
    _make_hybrid(copy_dir, weight, candidates=6, dense_candidates=dense_candidates)
    hybrid = Bundle.load(copy_dir)
    questions = ["repair bicycle", UNSEEN, QUESTIONS[3], "how to clean a boat", QUESTIONS[40]]
    batch = hybrid.search_batch(questions, k=8, explain=True)
    for question, result in zip(questions, batch, strict=True):
        alone = hybrid.search(question, k=8, explain=True)
        plain = hybrid.search(question, k=8)
        assert [h.question_id for h in alone.hits] == [h.question_id for h in plain.hits]
        for hit in [*alone.hits, *result.hits]:
            _assert_recomposes(hit, weight, question)


def test_explain_shows_the_query_words_behind_matched_stems(copy_dir: Path) -> None:
    from qpr.retrieval.bm25 import BM25Index

    _make_hybrid(copy_dir, 0.0, candidates=10, dense_candidates=3)
    stemmed = BM25Index.build(QUESTIONS, stemmer="english")
    stemmed.save(copy_dir / BM25_FILE)
    question = "repairing bicycles quickly"
    top = Bundle.load(copy_dir).search(question, k=1, explain=True).hits[0]
    assert top.text in ("how do i repair my bicycle", "what is the best way to repair a bicycle?")
    assert top.explain is not None
    assert top.explain.matched_words == ("repairing", "bicycles")  # words, not stems
    assert top.explain.bm25_scaled == 1.0 and top.score == pytest.approx(1.0)


def test_explain_in_a_dense_only_bundle(bundle: Bundle) -> None:
    for hit in bundle.search("repair bicycle", k=4, explain=True).hits:
        part = hit.explain
        assert part is not None and part.dense_weight == 1.0
        assert part.bm25_score is None and part.bm25_scaled is None and not part.matched_words
        assert part.dense_scaled == part.fused_score == hit.score

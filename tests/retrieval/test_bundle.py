"""The model bundle: what a loaded bundle reports, search semantics, and the no-torch
query path. Loading and its cross-checks: test_loading.py.

The fixture is a real bundle built with the library itself (`tests.retrieval.cnn_bundle`),
so these tests also pin the file layout the pipeline stages write.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qpr.artifacts import BM25_FILE, ENCODER_FILE, INDEX_FILE, QUESTIONS_FILE, VOCAB_FILE
from qpr.retrieval.bundle import Bundle
from qpr.retrieval.dense import save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.text.vocab import Vocabulary
from tests.retrieval.cnn_bundle import (
    DIM,
    MAX_LEN,
    QUESTIONS,
    STORED_THRESHOLD,
    UNSEEN,
    make_hybrid,
    write_config,
)

# ---------------------------------------------------------------- properties


def test_properties(bundle: Bundle, bundle_dir: Path) -> None:
    assert bundle.dim == DIM
    assert bundle.size == len(QUESTIONS)
    assert bundle.max_len == MAX_LEN
    assert bundle.threshold == STORED_THRESHOLD
    assert bundle.nprobe is None  # Flat: no inverted lists
    assert len(bundle.fingerprint) == 64
    assert Bundle.load(bundle_dir).fingerprint == bundle.fingerprint  # deterministic


def test_a_fast_scan_index_is_searched_per_query(bundle: Bundle, copy_dir: Path) -> None:
    import faiss

    vocab = Vocabulary.load(copy_dir / VOCAB_FILE)
    vectors = encode(load_session(copy_dir / ENCODER_FILE), vocab, QUESTIONS, max_len=MAX_LEN)
    # 50 questions are too few for fit_factory to keep PQ (it builds Flat): built as written
    index = faiss.index_factory(vectors.shape[1], "IVF1,PQ4x4fs,RFlat")
    index.train(vectors)
    index.add(vectors)
    save_index(index, copy_dir / INDEX_FILE)
    fast = Bundle.load(copy_dir)
    # FAISS does not store the kernel choice: the bundle sets it
    # (qpr.retrieval.dense.use_per_query_scan)
    assert faiss.downcast_index(faiss.extract_index_ivf(fast._index)).implem == 11
    # exact re-ranking of every row (one list, 50 questions): the Flat bundle's ranking
    for question in ("repair bicycle", UNSEEN, QUESTIONS[7]):
        want = [h.question_id for h in bundle.search(question, k=5).hits]
        assert [h.question_id for h in fast.search(question, k=5).hits] == want


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


def test_an_excluded_question_is_searched_as_if_not_indexed(bundle: Bundle, copy_dir: Path) -> None:
    own = [1000 + 10 * i for i in (0, 17, 49)]
    texts = [QUESTIONS[i] for i in (0, 17, 49)]
    for config in (None, 0.5):
        if config is not None:
            make_hybrid(copy_dir, config)
        searched = bundle if config is None else Bundle.load(copy_dir)
        results = searched.search_batch(texts, 5, exclude=own)
        filtered = searched.search_batch(texts, 6)
        for result, qid, everything in zip(results, own, filtered, strict=True):
            ids = [h.question_id for h in result.hits]
            assert qid not in ids and len(ids) == 5
            if config is None:  # dense: the same order with the question taken out
                assert ids == [h.question_id for h in everything.hits if h.question_id != qid]
    with pytest.raises(ValueError, match="one question id per question"):
        bundle.search_batch(texts, 5, exclude=own[:2])


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
    write_config(copy_dir, None)
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


def test_rescored_fusion_scores_every_candidate_exactly(bundle: Bundle, copy_dir: Path) -> None:
    from qpr.retrieval.bm25 import BM25Index

    question = "best way to clean my laptop"
    # α = 1 over BM25's 5 candidates and the index's max(k, 2): all ranked by exact distance
    make_hybrid(copy_dir, 1.0, candidates=5, dense_candidates=2, nprobe=1)
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
    make_hybrid(copy_dir, 0.5, candidates=6, dense_candidates=3, nprobe=2)
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
    make_hybrid(copy_dir, 0.5)
    hybrid = Bundle.load(copy_dir)
    # no dense_candidates written: read as the BM25 candidates (qpr.artifacts.migrate)
    assert hybrid.fusion == {"dense_weight": 0.5, "candidates": 20, "dense_candidates": 20}
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
    make_hybrid(copy_dir, 1.0)
    dense_ids = [h.question_id for h in bundle.search(question, k=5).hits]
    assert [h.question_id for h in Bundle.load(copy_dir).search(question, k=5).hits] == dense_ids
    make_hybrid(copy_dir, 0.0)
    top_row = int(BM25Index.build(QUESTIONS).search(question, 1)[1][0])
    qids = np.arange(len(QUESTIONS), dtype=np.int64) * 10 + 1000
    assert Bundle.load(copy_dir).search(question, k=1).hits[0].question_id == qids[top_row]


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


def test_a_question_without_an_answer_is_found_but_answers_nothing(copy_dir: Path) -> None:
    # As `qpr index add questions.txt` leaves them: listed questions with no answer id.
    table = pq.read_table(copy_dir / QUESTIONS_FILE)
    qids = table.column("question_id").to_pylist()
    answers = [None if i % 2 else f"ans-{q}" for i, q in enumerate(qids)]
    pq.write_table(table.append_column("answer_id", pa.array(answers, pa.string())),
                   copy_dir / QUESTIONS_FILE)  # fmt: skip
    loaded = Bundle.load(copy_dir)
    for question in QUESTIONS[:6]:
        result = loaded.search(question, k=3, threshold=math.inf)
        top = result.hits[0]
        assert top.text == question  # found all the same
        assert result.answered == (top.answer_id is not None)
    assert {loaded.search(q, threshold=math.inf).answered for q in QUESTIONS[:6]} == {True, False}


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
    make_hybrid(copy_dir, weight, candidates=6, dense_candidates=dense_candidates)
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

    make_hybrid(copy_dir, 0.0, candidates=10, dense_candidates=3)
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


# ---------------------------------------------------------------- memory


def test_a_dropped_bundle_is_freed_without_a_garbage_collection(copy_dir: Path) -> None:
    """Reference counting alone frees a bundle once nothing holds it, filter cache used:
    a swapped-out bundle must not wait for a full collection (benchmarks/swap_memory.py:
    RSS grew by about a bundle a hot swap while it did)."""
    import gc
    import weakref

    answers = _answers(copy_dir)
    loaded = Bundle.load(copy_dir)
    wanted = sorted(set(answers.values()))[:2]
    assert loaded.search(QUESTIONS[0], k=3, filters={"answer_id": wanted}).hits is not None
    assert loaded.allowed({"answer_id": wanted}) is loaded.allowed({"answer_id": wanted[::-1]})
    gone = weakref.ref(loaded)
    gc.disable()
    try:
        del loaded
        assert gone() is None
    finally:
        gc.enable()


# ---------------------------------------------------------------- spelling


def test_spelling_puts_typod_words_back_before_both_searches(copy_dir: Path) -> None:
    """search.json's `spelling`: a typo'd query is searched as the indexed words spell it,
    by BM25 and the encoder alike; the result still names the question as asked."""
    import dataclasses

    from qpr.artifacts import SearchConfig

    make_hybrid(copy_dir, 0.0, candidates=10, dense_candidates=3)  # α 0: BM25 decides
    asked, meant = "how do i repair my bicylce", "how do i repair my bicycle"
    plain = Bundle.load(copy_dir)
    config = SearchConfig.read(copy_dir)
    assert not config.spelling
    dataclasses.replace(config, spelling=True).write(copy_dir)
    spelled = Bundle.load(copy_dir)
    assert spelled.search_config.spelling
    for bundle in (plain, spelled):
        assert bundle.search(meant, k=5).hits  # the word as indexed: both find it
    typo = spelled.search(asked, k=5, explain=True)
    assert typo.query == asked
    assert [h.question_id for h in typo.hits] == [
        h.question_id for h in spelled.search(meant, k=5).hits
    ]
    assert "bicycle" in typo.hits[0].explain.matched_words
    assert typo.hits[0].text == meant
    # unspelled, "bicylce" matches no posting: BM25 cannot tell the objects apart
    assert plain.search(asked, k=1).hits[0].text != meant
    assert np.allclose(spelled.embed([asked]), plain.embed([meant]))


def test_a_deleted_questions_words_are_no_longer_spelled_back(copy_dir: Path) -> None:
    """A tombstoned question leaves the speller's words: a query is not put back to a
    word only deleted questions held."""
    import dataclasses

    from qpr.artifacts import SearchConfig
    from qpr.deltas.add import delete_questions
    from tests.retrieval.cnn_bundle import QIDS

    make_hybrid(copy_dir, 0.0, candidates=10, dense_candidates=3)
    dataclasses.replace(SearchConfig.read(copy_dir), spelling=True).write(copy_dir)
    assert Bundle.load(copy_dir)._corrected(["my bicylce"]) == ["my bicycle"]
    bicycles = [int(q) for q, text in zip(QIDS, QUESTIONS, strict=True) if "bicycle" in text]
    delete_questions(copy_dir, bicycles[:-2])
    assert Bundle.load(copy_dir)._corrected(["my bicylce"]) == ["my bicycle"]  # two left
    delete_questions(copy_dir, bicycles[-2:])
    assert Bundle.load(copy_dir)._corrected(["my bicylce"]) == ["my bicylce"]

"""BM25 weights against hand-computed values and bm25s; fusion on hand-made rankings."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from qpr.evaluation.trec import bm25_search
from qpr.retrieval.bm25 import BM25Index, describe_bm25, lexical_search
from qpr.retrieval.fusion import candidate_union, fuse, fuse_union, fuse_union_one, values_at
from qpr.text.words import tokenize

DOCS = ["reset router password", "router", "bake bread"]


def test_bm25_weights_hand_computed() -> None:
    index = BM25Index.build(DOCS)
    # N = 3, lengths 3, 1, 2 → avgdl 2. "router": df 2 → idf = ln(1 + 1.5/2.5) = ln 1.6.
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    # doc 0: tf 1, |d| 3 → 1 / (1 + 1.5·(0.25 + 0.75·3/2)) = 1 / 3.0625
    w0 = idf * 1 / (1 + 1.5 * (0.25 + 0.75 * 1.5))
    # doc 1: tf 1, |d| 1 → 1 / (1 + 1.5·(0.25 + 0.375)) = 1 / 1.9375
    w1 = idf * 1 / (1 + 1.5 * (0.25 + 0.75 * 0.5))
    scores, rows = index.search("Router?", 5)
    assert rows.tolist() == [1, 0, -1, -1, -1]  # the short document first; bread never
    assert scores[:2].tolist() == pytest.approx([w1, w0], rel=1e-6)
    assert np.isneginf(scores[2:]).all()


def test_repeated_query_words_count_each_time() -> None:
    index = BM25Index.build(DOCS)
    once, _ = index.search("router", 1)
    twice, _ = index.search("router router", 1)
    assert twice[0] == pytest.approx(2 * once[0])


def test_unknown_and_stop_words_find_nothing() -> None:
    index = BM25Index.build(DOCS)
    scores, rows = index.search("what is the", 3)  # stop words only
    assert (rows == -1).all() and np.isneginf(scores).all()
    assert (index.search("zebra", 2)[1] == -1).all()
    with pytest.raises(ValueError, match="k must be"):
        index.search("router", 0)


def test_exclude_row_and_ties_break_by_row() -> None:
    index = BM25Index.build(["apple pie", "apple pie", "apple pie"])
    assert index.search("apple", 3)[1].tolist() == [0, 1, 2]
    assert index.search("apple", 3, exclude_row=1)[1].tolist() == [0, 2, -1]


def test_same_scores_and_ranking_as_bm25s() -> None:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    docs = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(300)]
    queries = [" ".join(rng.choice(words, size=3)) for _ in range(25)]
    exclude = rng.integers(-1, 300, size=25)
    ref_scores, ref_rows = bm25_search(docs, queries, 10, exclude_rows=exclude)
    scores, rows = lexical_search(BM25Index.build(docs), queries, 10, exclude_rows=exclude)
    assert np.array_equal(rows, ref_rows)
    finite = np.isfinite(ref_scores)
    assert np.allclose(scores[finite], ref_scores[finite], rtol=1e-5)


def _exhaustive(index: BM25Index, text: str, k: int, exclude_row: int) -> list[int]:
    """Every document scored, best k by (score desc, row): what pruning must reproduce."""
    acc = np.zeros(index.num_docs, np.float64)
    for t in index.query_terms(text):
        a, z = index.indptr[t], index.indptr[t + 1]
        acc[index.rows[a:z]] += index.weights[a:z]
    if exclude_row >= 0:
        acc[exclude_row] = 0.0
    docs = np.flatnonzero(acc > 0)
    return docs[np.lexsort((docs, -acc[docs]))][:k].tolist()


def test_upper_bounds_are_each_terms_largest_weight() -> None:
    index = BM25Index.build([*DOCS, "stone"])
    for term, t in index.terms.items():
        a, z = index.indptr[t], index.indptr[t + 1]
        assert index.upper_bounds[t] == index.weights[a:z].max(), term


def test_pruned_search_returns_the_exhaustive_top_k() -> None:
    # Zipf-like words: a few in most documents (like "how", "what"), most rare.
    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(400)]
    p = 1.0 / np.arange(1, 401)
    docs = [
        " ".join(rng.choice(vocab, size=rng.integers(2, 10), p=p / p.sum())) for _ in range(3000)
    ]
    index = BM25Index.build(docs)
    for _i in range(300):
        query = " ".join(rng.choice(vocab, size=rng.integers(1, 7), p=p / p.sum()))
        query += " " + vocab[int(rng.integers(100, 400))]  # one rare word, as most questions
        for k in (1, 5, 20):
            exclude = int(rng.integers(-1, 3000))
            # small corpus: its long lists are worth pruning from 50 postings on
            scores, rows = index.search(query, k, exclude_row=exclude, worth_pruning=50)
            want = _exhaustive(index, query, k, exclude)
            assert rows[: len(want)].tolist() == want, (query, k, exclude)
            assert (rows[len(want) :] == -1).all()
            unpruned = index.search(query, k, exclude_row=exclude, worth_pruning=10**9)
            assert np.array_equal(rows, unpruned[1]) and np.array_equal(scores, unpruned[0])


def test_stemming_reduces_inflections_after_removing_stop_words() -> None:
    assert tokenize(["Losing the weights QUICKLY?"], stemmer="english") == [
        ["lose", "weight", "quick"]
    ]
    assert tokenize(["Losing the weights"]) == [["losing", "weights"]]  # default: as written
    with pytest.raises(ValueError, match="unknown stemmer 'klingon'"):
        tokenize(["a"], stemmer="klingon")


def test_a_stemmed_index_matches_other_inflections_and_says_so(tmp_path: Path) -> None:
    docs = ["losing weights fast", "weight of a car", "fast cars"]
    plain = BM25Index.build(docs)
    stemmed = BM25Index.build(docs, stemmer="english", k1=0.9)
    # "lose weight": no word in common with document 0 as written; both stems with stems.
    assert plain.search("how to lose weight", 3)[1].tolist() == [1, -1, -1]
    assert stemmed.search("how to lose weight", 3)[1].tolist()[:2] == [0, 1]
    again = BM25Index.load(stemmed.save(tmp_path / "bm25.npz"))
    assert again.settings == {"stemmer": "english", "k1": 0.9, "b": 0.75}
    assert describe_bm25(again.settings) == "english stems, k1 0.9, b 0.75"
    assert describe_bm25({}) == "words as written, k1 1.5, b 0.75"  # older files and rows
    assert np.array_equal(again.search("losses", 3)[1], stemmed.search("losses", 3)[1])
    with pytest.raises(ValueError, match="k1 >= 0"):
        BM25Index.build(docs, b=2.0)


def test_stemmed_scores_and_ranking_as_bm25s_with_a_pystemmer() -> None:
    import bm25s
    import Stemmer

    rng = np.random.default_rng(1)
    words = ["run", "runs", "running", "ran", "walk", "walks", "walked", "car", "cars", "fly"]
    docs = [" ".join(rng.choice(words, size=rng.integers(1, 7))) for _ in range(200)]
    queries = [" ".join(rng.choice(words, size=2)) for _ in range(20)]
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(k1=0.9, b=0.75)
    retriever.index(
        bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    ours = BM25Index.build(docs, k1=0.9, b=0.75, stemmer="english")
    for query in queries:
        rows, scores = retriever.retrieve(
            bm25s.tokenize([query], stopwords="en", stemmer=stemmer, show_progress=False),
            k=200,
            show_progress=False,
        )
        want = np.zeros(200, np.float32)
        want[rows[0]] = scores[0]
        got_scores, got_rows = ours.search(query, 200)
        found = got_rows >= 0
        assert np.allclose(got_scores[found], want[got_rows[found]], rtol=1e-5)
        assert found.sum() == (want > 0).sum()


def test_maxscore_prunes_long_lists_and_leaves_its_scratch_zeroed() -> None:
    from qpr.retrieval.bm25 import _scratch
    from qpr.retrieval.maxscore import top_k

    # "rare" in 3 documents, "common" in all 2,000: once the top 2 are known, no document
    # holding "common" alone can reach them, so that list is never read.
    docs = ["rare common"] * 3 + ["common filler"] * 1997
    index = BM25Index.build(docs)
    terms = np.array([index.terms["rare"], index.terms["common"]], np.int64)
    bounds = index.upper_bounds[terms].astype(np.float64)
    left = np.array([bounds.sum(), bounds[1], 0.0])
    scratch = _scratch(index.num_docs, len(index.terms))
    postings = (index.indptr, index.rows, index.weights, *index.by_document)
    args = (*postings, terms, np.ones(2, np.float32), left)
    scores, rows, pruned_at = top_k(*args, 2, -1, 100, *scratch)
    assert pruned_at == 1 and rows.tolist() == [0, 1]
    acc, state, _touched, position = scratch
    assert not acc.any() and not state.any() and (position == -1).all()
    # the same search unpruned gives the same top 2 with the same float32 scores
    same = top_k(*args, 2, -1, 10**9, *scratch)
    assert same[2] == -1 and np.array_equal(same[0], scores) and np.array_equal(same[1], rows)


def test_fuse_union_one_returns_slots_into_the_union() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(5, 200))
        dense = rng.integers(0, n, (1, int(rng.integers(1, 30))))
        lexical = rng.permutation(n + 40)[:30][None]
        lexical[lexical >= n] = -1
        scores = np.where(lexical >= 0, rng.integers(0, 5, lexical.shape), -np.inf)
        union = candidate_union(dense, lexical)
        sims = np.where(union >= 0, -rng.integers(0, 6, union.shape), -np.inf).astype(np.float32)
        weight, k = float(rng.choice([0.0, 0.3, 0.5, 1.0])), int(rng.integers(1, 60))
        want_scores, want_rows = fuse_union(sims, union, scores, lexical, weight, k)
        valid = union[0] >= 0
        got_scores, slots = fuse_union_one(
            sims[0][valid], union[0][valid], scores[0], lexical[0], weight, k
        )
        kept = want_rows[0] >= 0
        assert np.array_equal(union[0][valid][slots], want_rows[0][kept])
        assert np.array_equal(got_scores, want_scores[0][kept])
    with pytest.raises(ValueError, match="every lexical row"):
        fuse_union_one(np.zeros(2), np.array([2, 4]), np.ones(2), np.array([2, 9]), 0.5, 2)
    with pytest.raises(ValueError, match="dense_weight"):
        fuse_union_one(np.zeros(2), np.array([2, 4]), np.ones(1), np.array([2]), 1.5, 2)


def test_searches_from_several_threads_agree() -> None:
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(2)
    words = [f"word{i}ing" for i in range(50)] + [f"word{i}s" for i in range(50)]
    docs = [" ".join(rng.choice(words, size=5)) for _ in range(500)]
    index = BM25Index.build(docs, stemmer="english")
    queries = [" ".join(rng.choice(words, size=3)) for _ in range(200)]
    alone = [index.search(q, 5)[1].tolist() for q in queries]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda q: index.search(q, 5)[1].tolist(), queries))
    assert together == alone
    # each thread stems with its own PyStemmer object (one must not be shared)
    from qpr.text.words import _stem_words

    owners: list[object] = []

    def own_stemmer() -> None:
        owners.append(_stem_words("english").__self__)

    threads = [threading.Thread(target=own_stemmer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    here = _stem_words("english").__self__
    assert owners[0] is not owners[1] and all(o is not here for o in owners)


def test_save_load_round_trip_and_bad_files(tmp_path: Path) -> None:
    index = BM25Index.build(DOCS)
    path = index.save(tmp_path / "bm25.npz")
    again = BM25Index.load(path)
    assert again.terms == index.terms and again.num_docs == 3
    assert np.array_equal(again.search("router", 2)[1], index.search("router", 2)[1])
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match=r"junk\.npz"):
        BM25Index.load(tmp_path / "junk.npz")


def test_tokenize_lowercases_and_drops_stop_words_and_single_letters() -> None:
    assert tokenize(["How do I reset the Router?"]) == [["how", "do", "reset", "router"]]


# -- fusion -------------------------------------------------------------------------------


def test_fuse_hand_computed() -> None:
    # dense: rows 5, 7, 9 with sims 0, -1, -2 → scaled 1, 0.5, 0
    # bm25:  rows 9, 3 with scores 4, 2        → scaled 1, 0
    dense_s, dense_r = np.array([[0.0, -1.0, -2.0]]), np.array([[5, 7, 9]])
    lex_s, lex_r = np.array([[4.0, 2.0, -np.inf]]), np.array([[9, 3, -1]])
    scores, rows = fuse(dense_s, dense_r, lex_s, lex_r, 0.5, 4)
    # 5: 0.5·1 = 0.5; 7: 0.5·0.5 = 0.25; 9: 0.5·0 + 0.5·1 = 0.5; 3: 0 → 5 and 9 tie: by row
    assert rows.tolist() == [[5, 9, 7, 3]]
    assert scores.tolist()[0] == pytest.approx([0.5, 0.5, 0.25, 0.0])


def test_fuse_limits_are_the_single_rankings() -> None:
    rng = np.random.default_rng(1)
    dense_r = np.stack([rng.permutation(50)[:10] for _ in range(4)])
    dense_s = -np.sort(rng.random((4, 10)), axis=1)
    lex_r = np.stack([rng.permutation(50)[:10] for _ in range(4)])
    lex_s = -np.sort(-rng.random((4, 10)), axis=1)
    assert np.array_equal(fuse(dense_s, dense_r, lex_s, lex_r, 1.0, 5)[1], dense_r[:, :5])
    assert np.array_equal(fuse(dense_s, dense_r, lex_s, lex_r, 0.0, 5)[1], lex_r[:, :5])


def test_fuse_with_an_empty_side_and_bad_weight() -> None:
    empty_s, empty_r = np.full((1, 2), -np.inf), np.full((1, 2), -1)
    scores, rows = fuse(np.array([[0.0, -3.0]]), np.array([[4, 2]]), empty_s, empty_r, 0.3, 3)
    assert rows.tolist() == [[4, 2, -1]]
    assert scores[0, :2].tolist() == pytest.approx([0.3, 0.0]) and np.isneginf(scores[0, 2])
    with pytest.raises(ValueError, match="dense_weight"):
        fuse(empty_s, empty_r, empty_s, empty_r, 1.5, 1)


def test_candidate_union_is_each_querys_distinct_rows_ascending() -> None:
    dense = np.array([[7, 3, -1], [2, 2, 5]])
    lexical = np.array([[3, 9], [-1, -1]])
    assert candidate_union(dense, lexical).tolist() == [[3, 7, 9, -1, -1], [2, 5, -1, -1, -1]]
    with pytest.raises(ValueError, match="same Q"):
        candidate_union(dense, lexical[:1])


def test_one_questions_compiled_union_equals_the_vectorised_one() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        dense = rng.integers(-1, 60, (3, int(rng.integers(1, 25))))
        lexical = rng.integers(-1, 60, (3, int(rng.integers(1, 40))))
        together = candidate_union(dense, lexical)  # Q = 3: numpy
        for i in range(3):  # Q = 1: compiled
            assert np.array_equal(
                candidate_union(dense[i : i + 1], lexical[i : i + 1]), together[i : i + 1]
            )


def test_values_at_looks_each_wanted_row_up_in_its_own_query() -> None:
    rows = np.array([[3, 7, 9, -1], [7, 2, -1, -1]])
    values = np.array([[0.5, 1.5, 2.5, 9.0], [4.0, 5.0, 9.0, 9.0]])
    got = values_at(rows, values, np.array([[9, 3, -1], [7, 2, 2]]))
    assert got.dtype == np.float32
    assert got.tolist() == [[2.5, 0.5, math.inf], [4.0, 5.0, 5.0]]
    with pytest.raises(ValueError, match="not among"):
        values_at(rows, values, np.array([[9], [3]]))  # 3 is query 0's row, not query 1's


def test_fuse_over_the_union_gives_lexical_only_rows_their_dense_share() -> None:
    # dense search found row 5 only; BM25 found 9 and 3; the union is scored exactly:
    # sims 5: 0, 9: -1, 3: -2 → scaled 1, 0.5, 0; BM25 9: 4, 3: 2 → scaled 1, 0
    union = candidate_union(np.array([[5]]), np.array([[9, 3]]))
    sims = np.array([[{5: 0.0, 9: -1.0, 3: -2.0}[r] for r in union[0]]])
    scores, rows = fuse(sims, union, np.array([[4.0, 2.0]]), np.array([[9, 3]]), 0.5, 3)
    # 9: 0.5·0.5 + 0.5·1 = 0.75 beats 5: 0.5·1; without the union 9 would get 0.5 only
    assert rows.tolist() == [[9, 5, 3]]
    assert scores[0].tolist() == pytest.approx([0.75, 0.5, 0.0])


def test_fuse_union_equals_fuse_on_union_candidates() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, n = int(rng.integers(1, 5)), int(rng.integers(5, 200))
        dense = rng.integers(-1, n, (q, int(rng.integers(1, 30))))
        lexical = np.stack([rng.permutation(n + 40)[:30] for _ in range(q)])
        lexical[lexical >= n] = -1  # empty slots
        scores = np.where(lexical >= 0, rng.integers(0, 5, lexical.shape), -np.inf)
        union = candidate_union(dense, lexical)
        # integer similarities: many ties, which both must break by row
        sims = np.where(union >= 0, -rng.integers(0, 6, union.shape), -np.inf).astype(np.float32)
        weight, k = float(rng.choice([0.0, 0.3, 0.5, 1.0])), int(rng.integers(1, 60))
        expected = fuse(sims, union, scores, lexical, weight, k)
        got = fuse_union(sims, union, scores, lexical, weight, k)
        assert np.array_equal(got[1], expected[1])
        assert np.array_equal(got[0], expected[0])


def test_fuse_union_refuses_rows_outside_the_union() -> None:
    union = candidate_union(np.array([[4, 2]]), np.array([[2]]))
    with pytest.raises(ValueError, match="every lexical row"):
        fuse_union(np.zeros((1, 3)), union, np.array([[1.0, 2.0]]), np.array([[2, 9]]), 0.5, 2)
    with pytest.raises(ValueError, match="dense_weight"):
        fuse_union(np.zeros((1, 3)), union, np.array([[1.0]]), np.array([[2]]), -0.1, 2)

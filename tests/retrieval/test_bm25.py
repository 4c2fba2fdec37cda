"""BM25 weights against hand-computed values and bm25s; MaxScore's pruned search against
the exhaustive one; the words BM25 reads; the index file."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from qpr.evaluation.baselines import bm25_search
from qpr.retrieval.bm25 import BM25Index, describe_bm25, lexical_search
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


def _zipf_docs(
    rng: np.random.Generator, words: int, docs: int
) -> tuple[list[str], np.ndarray, list[str]]:
    """(vocabulary, its Zipf-like probabilities, documents of 2-9 words): a few words in
    most documents (like "how", "what"), most rare."""
    vocab = [f"w{i}" for i in range(words)]
    p = 1.0 / np.arange(1, words + 1)
    p /= p.sum()
    texts = [" ".join(rng.choice(vocab, size=rng.integers(2, 10), p=p)) for _ in range(docs)]
    return vocab, p, texts


def test_upper_bounds_are_each_terms_largest_weight() -> None:
    index = BM25Index.build([*DOCS, "stone"])
    for term, t in index.terms.items():
        a, z = index.indptr[t], index.indptr[t + 1]
        assert index.upper_bounds[t] == index.weights[a:z].max(), term


def test_pruned_search_returns_the_exhaustive_top_k() -> None:
    rng = np.random.default_rng(3)
    vocab, p, docs = _zipf_docs(rng, 400, 3000)
    index = BM25Index.build(docs)
    for _i in range(300):
        query = " ".join(rng.choice(vocab, size=rng.integers(1, 7), p=p))
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


def test_scores_at_gives_each_rows_search_score_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    vocab, p, docs = _zipf_docs(rng, 200, 2000)
    index = BM25Index.build(docs)
    for _ in range(100):
        query = " ".join(rng.choice(vocab, size=rng.integers(1, 7), p=p))
        scores, rows = index.search(query, 30, worth_pruning=50)
        found = rows >= 0
        # the search's own rows, in another order and with empty slots between them
        order = rng.permutation(rows.size)
        assert np.array_equal(index.scores_at(query, rows[order]), scores[order])
        assert np.array_equal(index.scores_at(query, rows)[found], scores[found])
        # every other row: the exhaustive sum, 0 when no word is shared
        others = rng.integers(0, 2000, size=40)
        acc = np.zeros(index.num_docs, np.float64)
        for t in index.query_terms(query):
            a, z = index.indptr[t], index.indptr[t + 1]
            acc[index.rows[a:z]] += index.weights[a:z]
        assert index.scores_at(query, others) == pytest.approx(acc[others], rel=1e-5, abs=0)


def test_scores_at_without_known_words_and_bad_rows() -> None:
    index = BM25Index.build(DOCS)
    assert index.scores_at("zebra", np.array([0, -1, 2])).tolist() == [0.0, -np.inf, 0.0]
    assert index.scores_at("router", np.array([2, 1, -1]))[0] == 0.0
    assert index.scores_at("router", np.array([1]))[0] == index.search("router", 1)[0][0]
    with pytest.raises(ValueError, match="past the 3 documents"):
        index.scores_at("router", np.array([3]))
    with pytest.raises(ValueError, match=r"int64 \[R\]"):
        index.scores_at("router", np.zeros((1, 2), np.int64))


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


def test_shards_merged_with_global_statistics_equal_one_build() -> None:
    from qpr.retrieval.bm25 import count_terms

    texts = [
        f"how do i {w} my {o} today"
        for w in ("fix", "sell", "paint")
        for o in ("car", "bike", "house", "boat")
    ]
    texts += ["", "the a of", "why why why is the sky blue"]
    whole = BM25Index.build(texts, k1=1.2, b=0.7, stemmer="english")
    parts = [count_terms(texts[i : i + 4], stemmer="english") for i in range(0, len(texts), 4)]
    merged = BM25Index.from_counts(parts, k1=1.2, b=0.7)
    assert merged.terms == whole.terms and merged.num_docs == whole.num_docs
    np.testing.assert_array_equal(merged.indptr, whole.indptr)
    np.testing.assert_array_equal(merged.rows, whole.rows)
    np.testing.assert_array_equal(merged.weights, whole.weights)


def test_shards_of_two_stemmers_are_refused() -> None:
    from qpr.retrieval.bm25 import count_terms

    with pytest.raises(ValueError, match="different stemmers"):
        BM25Index.from_counts([count_terms(["a cat"], stemmer="english"), count_terms(["dogs"])])


def test_term_counts_round_trip(tmp_path) -> None:
    from qpr.retrieval.bm25 import TermCounts, count_terms

    counts = count_terms(["losing the game", "he loses games"], stemmer="english")
    again = TermCounts.load(counts.save(tmp_path / "c.npz"))
    assert again.terms == counts.terms and again.stemmer == "english"
    np.testing.assert_array_equal(again.tf, counts.tf)


def test_matches_gives_the_search_score_and_the_query_words_behind_stems() -> None:
    docs = ["losing my keys again", "he loses keys", "a quiet garden", "keys keys keys"]
    index = BM25Index.build(docs, stemmer="english")
    question = "Losing keys, losing KEYS"
    scores, rows = index.search(question, len(docs))
    for score, row in zip(scores.tolist(), rows.tolist(), strict=True):
        if row >= 0:
            assert index.matches(question, row)[0] == pytest.approx(score, rel=1e-5)
    assert index.matches(question, 1) == (pytest.approx(index.matches(question, 1)[0]),
                                          ("losing", "keys"))  # fmt: skip
    assert index.matches(question, 2) == (0.0, ())


@pytest.mark.parametrize("scan_limit", [0, 2048])  # MaxScore over the lists; rows scanned
def test_allowed_documents_only_and_scores_unchanged(
    scan_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("qpr.retrieval.bm25.EXACT_SCAN_DOCS", scan_limit)
    texts = [f"router {w} {i}" for i, w in enumerate(["reset", "fix", "buy"] * 200)]
    index = BM25Index.build(texts)
    allowed = np.zeros(len(texts), bool)
    allowed[::7] = True
    full_s, full_r = index.search("router reset", len(texts), worth_pruning=2)
    keep = allowed[full_r[full_r >= 0]]
    expected_r, expected_s = full_r[full_r >= 0][keep][:20], full_s[full_r >= 0][keep][:20]
    scores, rows = index.search("router reset", 20, allowed=allowed, worth_pruning=2)
    assert rows.tolist() == expected_r.tolist()  # the allowed top 20, as pruning finds them
    assert scores.tolist() == expected_s.tolist()
    _, batch_r = lexical_search(index, ["router reset"], 20, allowed=allowed)
    assert batch_r[0].tolist() == rows.tolist()
    none_s, none_r = index.search("router", 5, allowed=np.zeros(len(texts), bool))
    assert (none_r == -1).all() and np.isneginf(none_s).all()
    with pytest.raises(ValueError, match="allowed must be bool"):
        index.search("router", 5, allowed=np.ones(3, bool))


TYPO_DOCS = [
    "how do i receive my passport",
    "how do i renew my car insurance",
    "where is the nearest post office",
    "what is the capital of france",
]


def test_chars_find_a_typod_question_that_words_miss() -> None:
    question = "Where to recieve a pasport?"
    words = BM25Index.build(TYPO_DOCS, k1=0.9, stemmer="english")
    chars = BM25Index.build(TYPO_DOCS, k1=1.2, analyzer="chars", ngram=3)
    assert words.search(question, 2)[1][0] != 0  # "recieve", "pasport": unknown words; "where" wins
    assert chars.search(question, 2)[1][0] == 0
    assert len(chars.query_terms(question)) > 2 * len(words.query_terms(question))
    assert chars.settings == {"stemmer": None, "k1": 1.2, "b": 0.75, "analyzer": "chars",
                              "ngram": 3}  # fmt: skip
    assert describe_bm25(chars.settings) == "character 3-grams of words as written, k1 1.2, b 0.75"
    assert "analyzer" not in words.settings  # a words index's records are as before


def test_chars_matches_gives_the_search_score_and_the_words_sharing_grams() -> None:
    index = BM25Index.build(TYPO_DOCS, analyzer="chars")
    question = "recieve pasport pasport zzz"
    scores, rows = index.search(question, len(TYPO_DOCS))
    for score, row in zip(scores.tolist(), rows.tolist(), strict=True):
        if row >= 0:
            assert index.matches(question, row)[0] == pytest.approx(score, rel=1e-5)
    assert index.matches(question, 0)[1] == ("recieve", "pasport")


def test_save_load_keeps_the_analyzer_and_an_old_file_loads_as_words(tmp_path: Path) -> None:
    import json

    chars = BM25Index.build(TYPO_DOCS, analyzer="chars", ngram=4)
    again = BM25Index.load(chars.save(tmp_path / "chars.npz"))
    assert (again.analyzer, again.ngram, again.terms) == ("chars", 4, chars.terms)
    assert again.search("pasport", 1)[1][0] == 0
    # a file written before analyzers: its header has no "analyzer" key
    words = BM25Index.build(TYPO_DOCS, stemmer="english")
    header = {"format": "qpr-bm25/1", "num_docs": words.num_docs, "k1": words.k1,
              "b": words.b, "stemmer": "english",
              "terms": sorted(words.terms, key=words.terms.__getitem__)}  # fmt: skip
    np.savez(
        tmp_path / "old.npz",
        header=np.frombuffer(json.dumps(header).encode(), np.uint8),
        indptr=words.indptr,
        rows=words.rows,
        weights=words.weights,
    )
    old = BM25Index.load(tmp_path / "old.npz")
    assert old.analyzer == "words" and old.search("receiving passports", 1)[1][0] == 0
    assert "analyzer" not in json.loads(
        bytes(np.load(words.save(tmp_path / "w.npz"))["header"]).decode()
    )


def test_shards_of_two_analyzers_are_refused_and_chars_shards_merge() -> None:
    from qpr.retrieval.bm25 import count_terms

    with pytest.raises(ValueError, match="different analyzers"):
        BM25Index.from_counts([count_terms(["a cat"], analyzer="chars"), count_terms(["dogs"])])
    with pytest.raises(ValueError, match="different analyzers"):
        BM25Index.from_counts(
            [
                count_terms(["a cat"], analyzer="chars"),
                count_terms(["dogs"], analyzer="chars", ngram=4),
            ]
        )
    parts = [
        count_terms(TYPO_DOCS[:2], analyzer="chars"),
        count_terms(TYPO_DOCS[2:], analyzer="chars"),
    ]
    merged = BM25Index.from_counts(parts)
    whole = BM25Index.build(TYPO_DOCS, analyzer="chars")
    assert merged.analyzer == "chars" and merged.terms == whole.terms
    np.testing.assert_array_equal(merged.weights, whole.weights)


def test_chars_term_counts_round_trip(tmp_path: Path) -> None:
    from qpr.retrieval.bm25 import TermCounts, count_terms

    counts = count_terms(TYPO_DOCS, analyzer="chars", ngram=4)
    again = TermCounts.load(counts.save(tmp_path / "c.npz"))
    assert (again.analyzer, again.ngram, again.terms) == ("chars", 4, counts.terms)

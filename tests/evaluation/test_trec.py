"""TREC files and measures against hand-computed examples, baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qpr.evaluation.baselines import bm25_search, jaccard_search
from qpr.evaluation.trec import (
    MEASURES,
    format_table,
    qrels_from_clusters,
    read_qrels,
    read_run,
    run_from_search,
    trec_measures,
    write_qrels,
    write_run,
)
from qpr.text.words import tokenize

# ---------------------------------------------------------------- trec measures


def test_map_worked_example_from_seed_004():
    # Predictions (d1 .2, d2 .7, d3 .3), truth d1 and d2 relevant: ranked d2, d3, d1
    # AP = (1/1 + 2/3) / 2 = 0.8333
    qrels = {"q1": {"d1": 1, "d2": 1, "d3": 0}}
    run = {"q1": [("d2", 0.7), ("d3", 0.3), ("d1", 0.2)]}
    per_query, summary = trec_measures(qrels, run)
    assert summary["map"] == pytest.approx(5 / 6)
    assert round(summary["map"], 2) == 0.83
    assert per_query["q1"]["recip_rank"] == 1.0
    assert summary["recall_20"] == 1.0
    # same answer when trec_eval sorts by the raw scores (no ties here)
    assert trec_measures(qrels, run, keep_order=False)[1]["map"] == pytest.approx(5 / 6)


def test_mrr_hand_example():
    qrels = {"a": {"1": 1}, "b": {"2": 1, "3": 1}, "c": {"4": 1}}
    run = {
        "a": [("9", 3.0), ("8", 2.0), ("1", 1.0)],  # first paraphrase at rank 3 → 1/3
        "b": [("3", 3.0), ("7", 2.0), ("2", 1.0)],  # rank 1 → 1
        "c": [("6", 1.0)],  # none → 0
    }
    per_query, summary = trec_measures(qrels, run)
    assert per_query["a"]["recip_rank"] == pytest.approx(1 / 3)
    assert per_query["b"]["recip_rank"] == 1.0
    assert per_query["c"]["recip_rank"] == 0.0
    assert summary["recip_rank"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    # b: AP = (1/1 + 2/3) / 2 ; a: AP = (1/3) / 1
    assert per_query["b"]["map"] == pytest.approx(5 / 6)
    assert per_query["a"]["map"] == pytest.approx(1 / 3)


def test_success_at_n_is_the_papers_p_at_n_not_trec_precision():
    # Two paraphrases, found at ranks 2 and 4 of 10 retrieved.
    qrels = {"q": {"r1": 1, "r2": 1, "r3": 1}}
    docs = ["n1", "r1", "n2", "r2", "n3", "n4", "n5", "n6", "n7", "n8"]
    run = {"q": [(d, 10.0 - i) for i, d in enumerate(docs)]}
    m = trec_measures(qrels, run)[0]["q"]
    assert m["success_1"] == 0.0 and m["P_1"] == 0.0  # at cutoff 1 the two coincide
    assert m["success_10"] == 1.0  # paper's P@10: at least one paraphrase in the top 10
    assert m["P_10"] == pytest.approx(0.2)  # trec_eval P_10: share relevant in the top 10
    assert m["recall_20"] == pytest.approx(2 / 3)


def test_empty_run_counts_as_zero_and_stays_in_the_mean():
    qrels = {"hit": {"1": 1}, "empty": {"2": 1}, "absent": {"3": 1}}
    run = {"hit": [("1", 0.0)], "empty": [], "stray": [("2", 1.0)]}  # stray not in qrels
    per_query, summary = trec_measures(qrels, run)
    assert set(per_query) == {"hit", "empty", "absent"}
    for qid in ("empty", "absent"):
        assert all(per_query[qid][m] == 0.0 for m in MEASURES)
    assert summary["num_queries"] == 3
    for m in ("success_1", "success_10", "recip_rank", "P_1", "map", "ndcg_cut_10"):
        assert summary[m] == pytest.approx(1 / 3), m
    assert set(summary) == {*MEASURES, "num_queries"}


def test_agrees_with_ir_measures_which_counts_missing_queries():
    ir_measures = pytest.importorskip("ir_measures")
    from ir_measures import AP, RR, P, Success, nDCG

    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"c": 1}, "q3": {"d": 1, "e": 1}}
    run = {"q1": [("x", 3.0), ("a", 2.0)], "q3": [("e", 5.0), ("y", 4.0), ("d", 1.0)]}
    ours = trec_measures(qrels, run)[1]
    theirs = ir_measures.calc_aggregate(
        [RR, Success @ 1, Success @ 10, P @ 10, AP, nDCG @ 10],
        qrels,
        {q: dict(docs) for q, docs in run.items()},
    )
    assert ours["recip_rank"] == pytest.approx(theirs[RR])
    assert ours["success_1"] == pytest.approx(theirs[Success @ 1])
    assert ours["success_10"] == pytest.approx(theirs[Success @ 10])
    assert ours["P_10"] == pytest.approx(theirs[P @ 10])
    assert ours["map"] == pytest.approx(theirs[AP])
    assert ours["ndcg_cut_10"] == pytest.approx(theirs[nDCG @ 10])


def test_ties_keep_list_order_unless_asked_for_trec_eval_sorting():
    qrels = {"q": {"10": 1}}
    run = {"q": [("10", 0.5), ("20", 0.5)]}  # tied scores, our ranking puts 10 first
    assert trec_measures(qrels, run)[1]["recip_rank"] == 1.0
    # trec_eval breaks ties by docid in decreasing order: "20" before "10"
    assert trec_measures(qrels, run, keep_order=False)[1]["recip_rank"] == 0.5


def test_empty_qrels_summary_is_nan_with_zero_queries():
    _, summary = trec_measures({}, {"q": [("1", 1.0)]})
    assert summary["num_queries"] == 0
    assert math.isnan(summary["map"])


# ---------------------------------------------------------------- files


def test_qrels_and_run_round_trip(tmp_path):
    qrels = {"12": {"13": 1, "14": 1}, "7": {"8": 1}}
    run = {"12": [("14", -0.25), ("99", -0.5000001), ("13", -1e-9 - 3)], "7": []}
    write_qrels(tmp_path / "test.qrels", qrels)
    write_run(tmp_path / "test.run", run, tag="cnn-sdml")
    assert read_qrels(tmp_path / "test.qrels") == qrels
    assert read_run(tmp_path / "test.run") == {"12": run["12"]}  # an empty list writes nothing
    lines = (tmp_path / "test.run").read_text().splitlines()
    assert lines[0].split() == ["12", "Q0", "14", "1", "-0.25", "cnn-sdml"]
    assert (tmp_path / "test.qrels").read_text().splitlines()[0] == "12 0 13 1"


def test_read_run_orders_by_rank_column(tmp_path):
    path = tmp_path / "r.run"
    path.write_text("q Q0 b 2 0.5 t\nq Q0 a 1 0.9 t\n")
    assert read_run(path) == {"q": [("a", 0.9), ("b", 0.5)]}


def test_write_run_rejects_rising_scores_and_bad_tags(tmp_path):
    with pytest.raises(ValueError, match="higher = better"):
        write_run(tmp_path / "r", {"q": [("a", 0.1), ("b", 0.2)]}, tag="t")  # distances
    with pytest.raises(ValueError, match="whitespace"):
        write_run(tmp_path / "r", {"q": [("a", 1.0)]}, tag="two words")


# ---------------------------------------------------------------- qrels / runs from data


def test_qrels_from_clusters_tiny_map():
    cluster_of = {1: 100, 2: 100, 3: 100, 4: 200, 5: 200, 6: 300}
    members = {100: [1, 2, 3], 200: [4, 5], 300: [6]}
    qrels = qrels_from_clusters([1, 5], cluster_of, members)
    assert qrels == {"1": {"2": 1, "3": 1}, "5": {"4": 1}}
    with pytest.raises(ValueError, match="no other question"):
        qrels_from_clusters([1, 6], cluster_of, members)
    assert qrels_from_clusters([1, 6], cluster_of, members, drop_singletons=True) == {
        "1": {"2": 1, "3": 1}
    }


def test_run_from_search_negates_distances_keeps_order_skips_missing():
    rows = np.array([[2, 0, -1], [-1, -1, -1]], dtype=np.int64)
    dist = np.array([[0.5, 1.5, 3.4e38], [3.4e38] * 3], dtype=np.float32)
    row_to_qid = np.array([10, 11, 12], dtype=np.int64)
    run = run_from_search([11, 12], rows, dist, row_to_qid)
    assert run == {"11": [("12", -0.5), ("10", -1.5)], "12": []}
    sims = run_from_search([11, 12], rows, dist, row_to_qid, higher_is_better=True)
    assert sims["11"] == [("12", 0.5), ("10", 1.5)]


# ---------------------------------------------------------------- baselines

CORPUS = [
    "How do I learn Python?",  # {how, do, learn, python}
    # {what, best, way, learn, python, programming}
    "What is the best way to learn Python programming?",
    "How to cook rice",  # {how, cook, rice}
    "Best way to cook rice quickly",  # {best, way, cook, rice, quickly}
    "The and a",  # all stop words: {}
]


def test_tokenize_lowercases_and_drops_stop_words_and_single_letters():
    assert tokenize(["How do I learn the Python?"]) == [["how", "do", "learn", "python"]]
    assert tokenize(["the and a"]) == [[]]
    assert tokenize(["the cat"], stopwords=None) == [["the", "cat"]]


def test_jaccard_hand_computed_scores_ties_and_exclusion():
    scores, rows = jaccard_search(CORPUS, ["learn python fast", "cook rice", "the"], 3)
    # q0 {learn, python, fast}: row 0 2/(3+4-2)=.4, row 1 2/(3+6-2)=2/7, nothing else
    np.testing.assert_array_equal(rows[0], [0, 1, -1])
    np.testing.assert_allclose(scores[0, :2], [0.4, 2 / 7], rtol=1e-6)
    assert scores[0, 2] == -np.inf
    # q1 {cook, rice}: row 2 2/3, row 3 2/5
    np.testing.assert_array_equal(rows[1], [2, 3, -1])
    np.testing.assert_allclose(scores[1, :2], [2 / 3, 2 / 5], rtol=1e-6)
    # q2 has no content word: nothing retrieved
    np.testing.assert_array_equal(rows[2], [-1, -1, -1])
    # equal scores (1/2 each) come out by row
    _, tied = jaccard_search(["xx yy", "xx zz", "xx ww"], ["xx"], 3)
    np.testing.assert_array_equal(tied[0], [0, 1, 2])
    # exclusion: query = index row 2 itself {how, cook, rice}; without it row 2 scores 1
    scores, rows = jaccard_search(CORPUS, [CORPUS[2]], 2, exclude_rows=np.array([2]))
    np.testing.assert_array_equal(rows[0], [3, 0])  # 2/(3+5-2), 1/(3+4-1)
    np.testing.assert_allclose(scores[0], [1 / 3, 1 / 6], rtol=1e-6)


def test_bm25_ranks_the_obvious_document_first_and_excludes_self():
    scores, rows = bm25_search(CORPUS, ["learn python", "cooking rice quickly", "the"], 3)
    assert rows[0, 0] in (0, 1) and set(rows[0, :2]) == {0, 1}
    assert rows[1, 0] == 3  # "rice quickly" both match row 3 only
    assert np.all(np.diff(scores[0][rows[0] >= 0]) <= 0)  # higher = better, in order
    np.testing.assert_array_equal(rows[2], [-1, -1, -1])  # no shared word: no result
    assert np.all(scores[2] == -np.inf)
    _, rows = bm25_search(CORPUS, [CORPUS[3]], 2, exclude_rows=np.array([3]))
    assert 3 not in rows[0] and rows[0, 0] == 2


def test_format_table():
    table = format_table(
        [{"system": "BM25", "success_1": 0.7471, "queries": 11600}, {"system": "a|b"}],
        {"system": "system", "success_1": "P@1", "queries": "queries"},
    )
    assert table.splitlines() == [
        "| system | P@1 | queries |",
        "|---|---:|---:|",
        "| BM25 | 0.747 | 11,600 |",
        "| a\\|b |  |  |",
    ]

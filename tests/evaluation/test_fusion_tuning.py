"""Fusion tuning (qpr.evaluation.fusion_tuning): the (α, w) served, by the best validation
P@1 or the one-standard-error rule; the search depth for fused searches (IVF lists, HNSW
candidates)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from qpr.artifacts import SearchConfig
from qpr.evaluation.fusion_tuning import (
    best_setting,
    choose_dense_weight,
    choose_served_depth,
    choose_setting,
    lean_choice,
    near_best,
    paired_error,
    trained_share,
)
from qpr.evaluation.queries import QuerySet
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.dense import IndexConfig, build_index, ef_search_of, exact_twin, set_nprobe
from qpr.retrieval.hybrid import HybridSearch, fuse

CONFIG = SearchConfig(dense_weight=0.5, lexical_candidates=15, dense_candidates=20)


def _candidates(index, seed: int = 0):
    """(exact candidates, served(): the same queries' over `index` at its depth now)."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((60, index.d)).astype(np.float32)
    words = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(words, 4)) for _ in range(index.ntotal)]
    queries = [" ".join(rng.choice(words, 3)) for _ in range(60)]
    bm25 = BM25Index.build(texts)
    served = HybridSearch(index, CONFIG, bm25=bm25, texts=texts)
    lexical = served.lexical(queries, 10)
    exact = HybridSearch(exact_twin(index), CONFIG, bm25=bm25, texts=texts)
    return (
        exact.candidates(queries, vectors, 10, lexical=lexical),
        lambda: served.candidates(queries, vectors, 10, lexical=lexical),
    )


def _index(nprobe: int):
    x = np.random.default_rng(1).standard_normal((3_000, 16)).astype(np.float32)
    return build_index(x, IndexConfig("IVF32,Flat", nprobe=nprobe), seed=0, log=lambda _: None)


def test_the_fewest_lists_that_reach_the_target_are_chosen_and_set() -> None:
    index = _index(nprobe=32)
    exact = _candidates(index)
    served = choose_served_depth(index, *exact, 0.7, 10, 0.9, log=lambda _: None)
    tried = [int(p) for p in served["by_nprobe"]]
    assert tried == sorted(tried) and tried[-1] == served["nprobe"] <= 32
    assert all(r < 0.9 for r in list(served["by_nprobe"].values())[:-1])
    assert served["recall"] >= 0.9 and served["reached"]
    assert faiss.extract_index_ivf(index).nprobe == served["nprobe"]
    # every list probed: the exact ranking itself
    set_nprobe(index, 32)
    exhaustive = choose_served_depth(index, *exact, 0.7, 10, 1.0, log=lambda _: None)
    assert exhaustive["recall"] == 1.0 and exhaustive["reached"]


def test_an_unreachable_target_keeps_the_index_nprobe_and_says_so() -> None:
    index = _index(nprobe=2)
    served = choose_served_depth(index, *_candidates(index), 1.0, 10, 1.0, log=print)
    assert list(served["by_nprobe"]) == ["1", "2"]
    assert served["nprobe"] == 2 and not served["reached"] and served["recall"] < 1.0


def test_an_index_without_lists_is_measured_as_it_stands() -> None:
    x = np.random.default_rng(1).standard_normal((500, 16)).astype(np.float32)
    flat = build_index(x, IndexConfig("Flat", nprobe=1), seed=0, log=lambda _: None)
    served = choose_served_depth(flat, *_candidates(flat), 0.5, 10, 0.98, log=print)
    assert served["nprobe"] is None and served["ef_search"] is None
    assert served["recall"] == 1.0 and served["reached"]


def test_an_hnsw_index_gets_the_fewest_graph_candidates() -> None:
    x = np.random.default_rng(1).standard_normal((3_000, 16)).astype(np.float32)
    hnsw = build_index(
        x, IndexConfig("HNSW8,Flat", nprobe=1, ef_search=256), seed=0, log=lambda _: None
    )
    served = choose_served_depth(hnsw, *_candidates(hnsw), 0.7, 10, 0.95, log=print)
    assert served["nprobe"] is None and served["by_nprobe"] == {}
    tried = [int(e) for e in served["by_ef_search"]]
    assert tried == sorted(tried) and tried[-1] == served["ef_search"] <= 256
    assert all(r < 0.95 for r in list(served["by_ef_search"].values())[:-1])
    assert served["reached"] and ef_search_of(hnsw) == served["ef_search"]


def _hits(answered: int, lost: int = 0, gained: int = 0, q: int = 400) -> np.ndarray:
    """float64 [q]: the first `answered` queries answered, less the first `lost` of them,
    plus the `gained` right after them (so settings differ on a few queries each way)."""
    hits = np.zeros(q)
    hits[lost : answered + gained] = 1.0
    return hits


def test_lean_choice_keeps_the_least_trained_setting_within_one_paired_error() -> None:
    """400 queries; the best answers 360. (w 0.5, α 0.8), 0.4 of the score on the trained
    encoder, misses 4 of the best's queries and gains none: 0.01 behind at a paired error
    of 0.005, out of reach. (w 0.5, α 0.9), 0.45 of the score, misses 3 and gains 2:
    0.0025 behind at an error of 0.0056, kept. (w 0, α 0.3) holds less still, but misses
    40."""
    hits = {
        (0.0, 1.0): _hits(360),
        (0.0, 0.3): _hits(360, lost=40),
        (0.5, 0.8): _hits(360, lost=4),
        (0.5, 0.9): _hits(360, lost=3, gained=2),
    }
    assert paired_error(hits[(0.5, 0.8)], hits[(0.0, 1.0)]) == pytest.approx(0.005, abs=1e-4)
    chosen = lean_choice(hits)
    assert chosen == (0.5, 0.9)
    assert set(near_best(hits)) == {(0.0, 1.0), (0.5, 0.9)}
    assert choose_setting(hits, "best") == best_setting(hits) == (0.0, 1.0)
    assert choose_setting(hits, "one_se") == chosen
    error = np.sqrt((5 - 400 * (1 / 400) ** 2) / 399 / 400)
    assert paired_error(hits[chosen], hits[(0.0, 1.0)]) == pytest.approx(error)
    assert trained_share(0.8, 0.5) == pytest.approx(0.4)


def test_only_a_difference_the_queries_cannot_resolve_is_forgiven() -> None:
    """Two settings, 2 queries apart on 400: when the leaner one misses 2 the best answers
    and gains none, the gap is real and the best is kept; when the two trade 10 queries each
    way and the leaner nets 2 fewer, the gap is within the error and the leaner is kept."""
    consistent = {(0.0, 0.9): _hits(202), (0.0, 0.5): _hits(202, lost=2)}
    assert lean_choice(consistent) == (0.0, 0.9)
    traded = {(0.0, 0.9): _hits(202), (0.0, 0.5): _hits(202, lost=12, gained=10)}
    assert lean_choice(traded) == (0.0, 0.5)


def test_lean_choice_with_one_clear_winner_keeps_it() -> None:
    hits = {(0.0, 0.9): _hits(380), (0.0, 0.5): _hits(320), (0.25, 0.9): _hits(340, lost=5)}
    assert lean_choice(hits) == (0.0, 0.9)
    assert near_best(hits) == [(0.0, 0.9)]


def test_best_setting_breaks_ties_toward_no_companion_then_the_larger_alpha() -> None:
    hits = {(0.5, 0.9): _hits(300), (0.0, 0.5): _hits(300), (0.0, 0.8): _hits(300)}
    assert best_setting(hits) == (0.0, 0.8)
    with pytest.raises(ValueError, match="unknown fusion rule 'x': best or one_se"):
        choose_setting(hits, "x")


def test_the_rule_decides_what_is_served(tmp_path) -> None:
    """The same candidates: "best" serves the best validation P@1, "one_se" a setting
    within one paired standard error of it that leans less on the dense side; both report
    the best."""
    index = _index(nprobe=32)
    exact, _ = _candidates(index)
    qids = np.arange(index.ntotal, dtype=np.int64)  # row r holds question r
    dense, half = fuse(exact, 1.0, 10).rows, fuse(exact, 0.5, 10).rows
    # Where α 1 and α 0.5 rank different rows first, the paraphrase is α 1's first row for
    # 20 queries and α 0.5's for 19, and for the rest α 1's tenth: α 1 is one query ahead,
    # on 39 queries the two settings trade.
    apart = np.flatnonzero(dense[:, 0] != half[:, 0])
    assert len(apart) > 45
    relevant = dense[:, 0].copy()
    relevant[apart[20:39]] = half[apart[20:39], 0]
    relevant[apart[39:]] = dense[apart[39:], 9]
    queries = QuerySet(
        split="val",
        query_ids=np.arange(10_000, 10_060, dtype=np.int64),
        texts=[""] * 60,
        qrels={str(10_000 + i): {str(int(r)): 1} for i, r in enumerate(relevant)},
    )
    weights = (0.0, 0.5, 1.0)
    best = choose_dense_weight(exact, weights, queries, qids, 10, tmp_path / "a.png")
    lean = choose_dense_weight(exact, weights, queries, qids, 10, tmp_path / "b.png", rule="one_se")
    assert (best["rule"], best["dense_weight"]) == ("best", 1.0)
    assert best["val_success_1"]["1.0"] == best["val_success_1"]["0.5"] + 1 / 60
    assert (
        best["best"]
        == lean["best"]
        == {
            "dense_weight": 1.0,
            "companion_weight": 0.0,
            "val_success_1": best["val_success_1"]["1.0"],
        }
    )
    assert (lean["rule"], lean["dense_weight"]) == ("one_se", 0.5)
    assert lean["standard_error"] > 1 / 60
    # the best serves itself: no error against itself; both name the settings in reach
    assert best["standard_error"] == 0.0
    near = [{"dense_weight": a, "companion_weight": 0.0} for a in (0.5, 1.0)]
    assert best["near_best"] == lean["near_best"] == near
    assert (tmp_path / "a.png").exists() and (tmp_path / "b.png").exists()
    with pytest.raises(ValueError, match="unknown fusion rule"):
        choose_dense_weight(exact, weights, queries, qids, 10, tmp_path / "c.png", rule="x")

"""Fusion tuning (qpr.evaluation.fusion_tuning): the (α, w) served, by the best validation
P@1 or the one-standard-error rule; the search depth for fused searches (IVF lists, HNSW
candidates)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from qpr.artifacts import SearchConfig
from qpr.evaluation.fusion_tuning import (
    choose_dense_weight,
    choose_served_depth,
    lean_choice,
    trained_share,
)
from qpr.evaluation.queries import QuerySet
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.dense import IndexConfig, build_index, ef_search_of, exact_twin, set_nprobe
from qpr.retrieval.hybrid import HybridSearch

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


def _hits(p1: float, q: int = 400, seed: int = 0) -> np.ndarray:
    """float64 [q]: round(p1 q) queries answered, in a seeded order."""
    hits = np.zeros(q)
    hits[: round(p1 * q)] = 1.0
    return np.random.default_rng(seed).permutation(hits)


def test_lean_choice_keeps_the_least_trained_setting_within_one_standard_error() -> None:
    """400 queries, best 0.90: its error is sqrt(0.9 * 0.1 / 400) = 0.015. (w 0.5, α 0.8)
    holds 0.4 of the score against the best's 1.0 and is 0.01 below: it is kept. (w 0, α
    0.3) holds less still, but is 0.05 below: out of reach."""
    hits = {
        (0.0, 1.0): _hits(0.90),
        (0.0, 0.3): _hits(0.85),
        (0.5, 0.8): _hits(0.89),
        (0.5, 0.9): _hits(0.895),
    }
    chosen, error = lean_choice(hits)
    assert error == pytest.approx(0.015)
    assert chosen == (0.5, 0.8)
    assert trained_share(0.8, 0.5) == pytest.approx(0.4)


def test_lean_choice_with_one_clear_winner_keeps_it() -> None:
    hits = {(0.0, 0.9): _hits(0.95), (0.0, 0.5): _hits(0.80), (0.25, 0.9): _hits(0.85)}
    assert lean_choice(hits)[0] == (0.0, 0.9)


def test_the_rule_decides_what_is_served(tmp_path) -> None:
    """The same candidates: "best" serves the best validation P@1, "one_se" a setting
    within one standard error of it that leans less on the dense side; both report the
    best and the error."""
    index = _index(nprobe=32)
    exact, _ = _candidates(index)
    qids = np.arange(index.ntotal, dtype=np.int64)  # row r holds question r
    # Each query's paraphrase is its dense nearest row, its 4th nearest for the last 8: the
    # dense ranking alone is best (52 of 60), α 0.9 a query or two behind.
    nearest = exact.union[np.arange(60)[:, None], np.argsort(exact.distances, axis=1)]
    queries = QuerySet(
        split="val",
        query_ids=np.arange(10_000, 10_060, dtype=np.int64),
        texts=[""] * 60,
        qrels={str(10_000 + i): {str(int(nearest[i, 0 if i < 52 else 3])): 1} for i in range(60)},
    )
    weights = (0.0, 0.5, 0.9, 1.0)
    best = choose_dense_weight(exact, weights, queries, qids, 10, tmp_path / "a.png", rule="best")
    lean = choose_dense_weight(exact, weights, queries, qids, 10, tmp_path / "b.png")
    assert (best["rule"], best["dense_weight"]) == ("best", 1.0)
    assert best["val_success_1"]["1.0"] == pytest.approx(52 / 60)
    assert (
        best["best"]
        == lean["best"]
        == {
            "dense_weight": 1.0,
            "companion_weight": 0.0,
            "val_success_1": best["val_success_1"]["1.0"],
        }
    )
    assert lean["standard_error"] == pytest.approx(np.sqrt(52 / 60 * 8 / 60 / 60))
    assert (lean["rule"], lean["dense_weight"]) == ("one_se", 0.9)
    assert lean["val_success_1"]["0.9"] >= 52 / 60 - lean["standard_error"]
    assert (tmp_path / "a.png").exists() and (tmp_path / "b.png").exists()
    with pytest.raises(ValueError, match="unknown fusion rule"):
        choose_dense_weight(exact, weights, queries, qids, 10, tmp_path / "c.png", rule="x")

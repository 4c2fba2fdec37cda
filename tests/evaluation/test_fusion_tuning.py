"""The choice of search depth for fused searches (qpr.evaluation.fusion_tuning): IVF lists,
HNSW candidates."""

from __future__ import annotations

import faiss
import numpy as np

from qpr.artifacts import SearchConfig
from qpr.evaluation.fusion_tuning import choose_served_depth
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

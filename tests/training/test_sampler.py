"""ClusterDisjointBatchSampler: no cluster twice per batch, full coverage, determinism."""

from __future__ import annotations

import time

import numpy as np
import pytest

from qpr.training.sampler import ClusterDisjointBatchSampler


def _clusters(seed: int = 0, n_clusters: int = 300, big: int = 40) -> np.ndarray:
    """Cluster ids of pairs: sizes 1..12 plus one big cluster, in shuffled order."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 13, size=n_clusters)
    sizes[7] = big
    ids = np.repeat(rng.permutation(10_000)[:n_clusters], sizes)  # arbitrary, sparse ids
    return rng.permutation(ids)


def _check_disjoint(batches: list[list[int]], cluster_ids: np.ndarray) -> None:
    for batch in batches:
        labels = cluster_ids[batch]
        assert np.unique(labels).shape[0] == len(batch), "a cluster repeats inside a batch"


@pytest.mark.parametrize("batch_size", [1, 7, 32, 256])
def test_batches_are_cluster_disjoint_and_cover_every_pair_once(batch_size: int) -> None:
    cluster_ids = _clusters()
    sampler = ClusterDisjointBatchSampler(cluster_ids, batch_size, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    _check_disjoint(batches, cluster_ids)
    used = np.concatenate([np.asarray(b) for b in batches])
    assert np.array_equal(np.sort(used), np.arange(cluster_ids.shape[0]))
    assert max(len(b) for b in batches) <= batch_size
    # As few batches as possible: the total needs ceil(P / B), the big cluster needs 40.
    assert len(sampler) == max(-(-cluster_ids.shape[0] // batch_size), 40)


def test_batch_sizes_are_balanced() -> None:
    cluster_ids = _clusters(big=5)
    sampler = ClusterDisjointBatchSampler(cluster_ids, 64, seed=0)
    sizes = {len(b) for b in sampler}
    assert max(sizes) - min(sizes) <= 1


def test_deterministic_per_seed_and_epoch() -> None:
    cluster_ids = _clusters()
    a = ClusterDisjointBatchSampler(cluster_ids, 32, seed=5)
    b = ClusterDisjointBatchSampler(cluster_ids, 32, seed=5)
    a.set_epoch(2)
    b.set_epoch(2)
    assert list(a) == list(b)
    assert list(a) == list(a)  # iterating twice does not advance anything
    b.set_epoch(3)
    assert list(a) != list(b)
    c = ClusterDisjointBatchSampler(cluster_ids, 32, seed=6)
    c.set_epoch(2)
    assert list(a) != list(c)


def test_drop_last_gives_full_batches() -> None:
    cluster_ids = _clusters()
    sampler = ClusterDisjointBatchSampler(cluster_ids, 32, seed=1, drop_last=True)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler) == cluster_ids.shape[0] // 32
        assert all(len(b) == 32 for b in batches)
        _check_disjoint(batches, cluster_ids)
        used = np.concatenate([np.asarray(b) for b in batches])
        assert np.unique(used).shape[0] == used.shape[0]  # still no pair twice


def test_drop_last_caps_a_dominant_cluster() -> None:
    # 100 pairs in one cluster + 50 singletons, batches of 10: at most T pairs of the big
    # cluster fit, and T = (T + 50) // 10 → T = 5.
    cluster_ids = np.concatenate([np.zeros(100, dtype=np.int64), np.arange(1, 51)])
    sampler = ClusterDisjointBatchSampler(cluster_ids, 10, seed=0, drop_last=True)
    batches = list(sampler)
    assert len(batches) == 5 and all(len(b) == 10 for b in batches)
    _check_disjoint(batches, cluster_ids)


def test_empty_and_invalid_inputs() -> None:
    assert list(ClusterDisjointBatchSampler(np.zeros(0, dtype=np.int64), 4, seed=0)) == []
    with pytest.raises(ValueError):
        ClusterDisjointBatchSampler(np.zeros((2, 2)), 4, seed=0)
    with pytest.raises(ValueError):
        ClusterDisjointBatchSampler(np.zeros(3), 0, seed=0)


def test_fast_enough_for_quora_scale() -> None:
    # ~219k training pairs in ~60k clusters (paper section 4.1.2), N = 512.
    rng = np.random.default_rng(0)
    cluster_ids = rng.integers(0, 60_000, size=219_369)
    sampler = ClusterDisjointBatchSampler(cluster_ids, 512, seed=0)
    start = time.perf_counter()
    batches = sampler.batches()
    elapsed = time.perf_counter() - start
    assert sum(b.shape[0] for b in batches) == cluster_ids.shape[0]
    assert elapsed < 2.0, f"one epoch of batches took {elapsed:.2f} s"

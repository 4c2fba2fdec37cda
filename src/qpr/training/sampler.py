"""Batches of positive pairs in which no two pairs share a cluster.

With in-batch negatives (SDML, triplet) two pairs of one cluster in a batch would make a
true paraphrase a negative: a false negative by construction. This sampler rules that out.

Construction (McNaughton's wrap-around rule, vectorised, O(P) per epoch):

1. per epoch, shuffle the cluster order and the pair order inside each cluster, and lay
   the pairs out cluster after cluster in one sequence of length P;
2. with T batches, sequence position q goes to batch q mod T.

A cluster's pairs are consecutive in the sequence, so as long as no cluster has more than
T pairs they land in T different batches. T = max(ceil(P / batch_size), largest cluster)
is the fewest batches any cluster-disjoint scheme can use, and every batch then holds
floor(P / T) or ceil(P / T) <= batch_size pairs (batches are all full only when P is a
multiple of T; e.g. 200,000 pairs at 512 → 391 batches of 511-512). Batch order and the
order inside each batch are shuffled too.

drop_last=True makes every batch exactly batch_size: T = P' // batch_size where clusters
are first capped at T pairs (a random subset each epoch) and the leftover tail of the
sequence is dropped, so a few pairs sit out each epoch (`len(sampler)` batches, each full).

Determinism: everything comes from numpy's Generator seeded with (seed, epoch); call
set_epoch(epoch) before iterating (as with torch's DistributedSampler).
numpy only; it yields plain lists of pair indices, usable as a torch batch_sampler.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class ClusterDisjointBatchSampler:
    """Yields list[int] of pair indices; no cluster twice in a batch; see module docstring."""

    def __init__(
        self, cluster_ids: np.ndarray, batch_size: int, *, seed: int, drop_last: bool = False
    ) -> None:
        cluster_ids = np.asarray(cluster_ids)
        if cluster_ids.ndim != 1:
            raise ValueError(f"cluster_ids must be 1-D, got shape {cluster_ids.shape}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        # Dense cluster index per pair: int64 [P]; sizes: int64 [C].
        _, self._cluster_of = np.unique(cluster_ids, return_inverse=True)
        self._cluster_of = self._cluster_of.astype(np.int64, copy=False)
        self._sizes = np.bincount(self._cluster_of).astype(np.int64)
        self._num_batches, self._cap = self._plan(self._sizes)

    def _plan(self, sizes: np.ndarray) -> tuple[int, int]:
        """(number of batches T, per-cluster cap on pairs used per epoch)."""
        total = int(sizes.sum())
        if total == 0:
            return 0, 0
        largest = int(sizes.max())
        if not self.drop_last:
            return max(-(-total // self.batch_size), largest), largest
        # Capping clusters at T pairs can lower the total and hence T: iterate to a fixed
        # point (T only decreases, so this ends; in practice after one or two rounds).
        num_batches = total // self.batch_size
        while num_batches > 0:
            capped = int(np.minimum(sizes, num_batches).sum())
            if capped // self.batch_size == num_batches:
                break
            num_batches = capped // self.batch_size
        return num_batches, num_batches

    @property
    def num_pairs(self) -> int:
        return int(self._cluster_of.shape[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; same (seed, epoch) → same batches."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self._num_batches

    def batches(self) -> list[np.ndarray]:
        """This epoch's batches as int64 arrays of pair indices."""
        num_batches = self._num_batches
        if num_batches == 0:
            return []
        rng = np.random.default_rng([self.seed, self.epoch])
        # Sort a random permutation of the pairs by a random rank of their cluster: groups
        # the pairs by cluster, clusters in random order, pairs in random order inside.
        cluster_rank = rng.permutation(self._sizes.shape[0])
        order = rng.permutation(self.num_pairs)
        order = order[np.argsort(cluster_rank[self._cluster_of[order]], kind="stable")]
        if self.drop_last:
            # Position of each pair inside its cluster's run; keep the first `cap` of each.
            clusters = self._cluster_of[order]
            run_start = np.flatnonzero(np.r_[True, clusters[1:] != clusters[:-1]])
            run_len = np.diff(np.r_[run_start, order.shape[0]])
            within = np.arange(order.shape[0]) - np.repeat(run_start, run_len)
            order = order[within < self._cap][: num_batches * self.batch_size]
        # Wrap-around: position q → batch q mod T, i.e. the columns of a row-major
        # [ceil(P/T), T] grid; -1 marks the empty cells of the last row.
        rows = -(-order.shape[0] // num_batches)
        grid = np.full(rows * num_batches, -1, dtype=np.int64)
        grid[: order.shape[0]] = order
        columns = grid.reshape(rows, num_batches).T
        batches = [col[col >= 0] for col in columns]
        batch_order = rng.permutation(num_batches)
        return [rng.permutation(batches[b]) for b in batch_order]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches():
            yield batch.tolist()

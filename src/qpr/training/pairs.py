"""What a run trains on: positive pairs with their clusters, the validation set, and per
pair an optional teacher vector and mined negative; and the seeded subset of max_pairs.

max_pairs: train on a subset of that many pairs, drawn uniformly without replacement by a
numpy Generator seeded with `seed` (select_training_pairs). Pairs rather than whole
clusters: the subset keeps the cluster-size mix and as many distinct clusters (topics) as
possible, and keeps the batches full, since the cluster-disjoint sampler needs at least as
many batches as the largest cluster has pairs (whole clusters of 50 pairs in a 2,000 pair
subset would mean 50 batches of 40). Subsets of one seed are nested: the first k of one
permutation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qpr.io import digest, texts_digest
from qpr.training.validation import ValidationSet

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class TrainData:
    """q1, q2, cluster_ids: pair i is a paraphrase pair of cluster cluster_ids[i].

    teacher_vectors: (float [P, T] for side 1, float [P, T] for side 2), row i belonging to
    pair i, for a loss with a teacher prior (qpr.training.teacher). hard_negatives: one
    question per pair, of another cluster but close to the pair, for a loss that
    `takes_negatives` (qpr.training.negatives).
    """

    q1: Sequence[str]
    q2: Sequence[str]
    cluster_ids: np.ndarray
    val: ValidationSet
    teacher_vectors: tuple[np.ndarray, np.ndarray] | None = None
    hard_negatives: Sequence[str] | None = None

    def __post_init__(self) -> None:
        q1, q2 = self.q1, self.q2
        cluster_ids = np.asarray(self.cluster_ids)
        object.__setattr__(self, "cluster_ids", cluster_ids)
        if not (len(q1) == len(q2) == cluster_ids.shape[0]):
            raise ValueError(
                f"train_pairs lengths differ: {len(q1)}, {len(q2)}, {cluster_ids.shape[0]}"
            )
        if len(q1) == 0:
            raise ValueError("no training pairs")
        if self.hard_negatives is not None and len(self.hard_negatives) != len(q1):
            raise ValueError(
                f"hard_negatives needs one question per pair ({len(q1):,}), "
                f"got {len(self.hard_negatives):,}"
            )
        if self.teacher_vectors is not None:
            teacher = tuple(np.asarray(t, np.float32) for t in self.teacher_vectors)
            if any(t.ndim != 2 or t.shape[0] != len(q1) for t in teacher) or (
                teacher[0].shape != teacher[1].shape
            ):
                raise ValueError(
                    f"teacher_vectors must be two [{len(q1)}, T] arrays, got "
                    f"{[t.shape for t in teacher]}"
                )
            object.__setattr__(self, "teacher_vectors", teacher)

    @classmethod
    def from_frame(cls, pairs: pd.DataFrame, val: ValidationSet, **extra: Any) -> TrainData:
        """From a pairs frame with q1_text, q2_text and cluster_id (qpr.data.splits)."""
        return cls(
            pairs["q1_text"].tolist(),
            pairs["q2_text"].tolist(),
            pairs["cluster_id"].to_numpy(),
            val,
            **extra,
        )

    def __len__(self) -> int:
        return len(self.q1)

    def fingerprint(self) -> dict[str, str]:
        """Digests of the pairs, and of the teacher vectors and negatives when given: a
        checkpoint written on other data is another run."""
        keys = {"train_data": digest((*self.q1, "\x00", *self.q2), self.cluster_ids)}
        if self.teacher_vectors is not None:
            keys["teacher_vectors"] = digest(*self.teacher_vectors)
        if self.hard_negatives is not None:
            keys["hard_negatives"] = texts_digest(self.hard_negatives)
        return keys

    def subset(self, max_pairs: int | None, seed: int) -> TrainData:
        """The pairs a run with these max_pairs and seed trains on (select_training_pairs),
        every per-pair field cut alike; self when that is all of them."""
        chosen = select_training_pairs(len(self), max_pairs, seed)
        if chosen.shape[0] == len(self):
            return self

        def rows(values: Sequence[str] | None) -> list[str] | None:
            if values is None:
                return None
            everything = list(values)
            return [everything[i] for i in chosen]

        teacher = self.teacher_vectors
        return dataclasses.replace(
            self,
            q1=rows(self.q1),
            q2=rows(self.q2),
            cluster_ids=self.cluster_ids[chosen],
            teacher_vectors=None if teacher is None else (teacher[0][chosen], teacher[1][chosen]),
            hard_negatives=rows(self.hard_negatives),
        )


def select_training_pairs(num_pairs: int, max_pairs: int | None, seed: int) -> np.ndarray:
    """Sorted int64 indices of the pairs a run trains on: all of them when max_pairs is None
    or not below num_pairs, else max_pairs drawn uniformly without replacement (seeded;
    the subsets of one seed are nested)."""
    if max_pairs is None or max_pairs >= num_pairs:
        return np.arange(num_pairs, dtype=np.int64)
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs}")
    order = np.random.default_rng([seed, 0x5B5E7]).permutation(num_pairs)
    return np.sort(order[:max_pairs]).astype(np.int64)


def num_training_classes(cluster_ids: np.ndarray, *, max_pairs: int | None, seed: int) -> int:
    """C for a classifying loss: the distinct clusters among the pairs train_encoder will
    use with these max_pairs and seed."""
    cluster_ids = np.asarray(cluster_ids)
    chosen = select_training_pairs(cluster_ids.shape[0], max_pairs, seed)
    return int(np.unique(cluster_ids[chosen]).shape[0])

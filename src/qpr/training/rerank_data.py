"""What a re-ranker trains and is checked on: groups of a question, its paraphrase and
hard negatives that our own BM25 ranks close to it.

A group is (query, candidates) with candidate 0 the query's paraphrase (a pair of the
cluster stage) and the others questions of other clusters among BM25's first ranks for
the query (`qpr.training.negatives.lexical_negatives`). BM25 is the served one's
(`index.lexical`: Snowball stems, k1, b), so the negatives are the kind of candidate the
first stage hands the re-ranker. Training groups draw negatives from the training and
unclustered questions only, never from validation or test ones.

BM25's first ranks of other clusters are often paraphrases nobody labelled (about half of
the audited misses on Quora, docs/results/label_audit.json). A re-ranker taught that they
are wrong may learn to push paraphrases down. With `max_teacher_cosine` set, a candidate
the teacher (a packaged sentence encoder) finds that close to its question is not drawn.
On Quora that re-ranker did worse, not better (docs/models.md, The re-ranker).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qpr.retrieval.bm25 import BM25Index, lexical_search
from qpr.training.negatives import lexical_negatives
from qpr.training.pairs import select_training_pairs

# BM25 ranks fetched per query beyond `window`: same-cluster questions are skipped.
_SLACK = 20


@dataclass(frozen=True)
class RerankGroups:
    """queries [G]; candidates [G][1 + n], candidate 0 the paraphrase."""

    queries: list[str]
    candidates: list[list[str]]

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.candidates):
            raise ValueError(f"{len(self.queries)} queries, {len(self.candidates)} groups")
        if len({len(c) for c in self.candidates}) > 1:
            raise ValueError("every group needs as many candidates")

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def group_size(self) -> int:
        return len(self.candidates[0]) if self.candidates else 0


@dataclass(frozen=True)
class GroupSpec:
    """Which groups: `split`'s pairs (a seeded subset of max_pairs), `negatives` each drawn
    among BM25's first `window` usable ranks (stemmer, k1, b as the served BM25);
    `max_teacher_cosine`: candidates the teacher puts closer to their question are unusable
    (None: every candidate of another cluster is)."""

    split: str = "train"
    negatives: int = 3
    window: int = 20
    max_pairs: int | None = None
    seed: int = 13
    stemmer: str | None = "english"
    k1: float = 0.9
    b: float = 0.75
    max_teacher_cosine: float | None = None


# Questions a query's candidates are compared in: bounds [chunk, C, T] float32 in memory.
_COSINE_CHUNK = 1024


def teacher_filtered(
    candidates: np.ndarray,
    queries: Sequence[str],
    pool_texts: np.ndarray,
    vectors_of: Callable[[list[str]], np.ndarray],
    ceiling: float,
) -> tuple[np.ndarray, int]:
    """(candidates int64 [P, C] with -1 where the teacher's cosine of a candidate with its
    query exceeds `ceiling`, how many were dropped).

    candidates: rows of `pool_texts` (-1: empty); vectors_of(texts) -> float32 [N, T] unit
    vectors. The queries and the distinct candidates go in one call, so a cache keyed by
    the texts serves a rerun."""
    candidates = np.asarray(candidates, np.int64)
    if candidates.ndim != 2 or candidates.shape[0] != len(queries):
        raise ValueError(f"need candidates [{len(queries)}, C], got {candidates.shape}")
    filled = candidates >= 0
    rows = np.unique(candidates[filled])
    if rows.size == 0:
        return candidates, 0
    vectors = vectors_of([*queries, *pool_texts[rows].tolist()])
    query_vectors, row_vectors = vectors[: len(queries)], vectors[len(queries) :]
    at = np.searchsorted(rows, np.where(filled, candidates, rows[0]))
    near = np.zeros(candidates.shape, bool)
    for start in range(0, len(queries), _COSINE_CHUNK):
        part = slice(start, start + _COSINE_CHUNK)
        cosines = np.einsum("pt,pct->pc", query_vectors[part], row_vectors[at[part]])
        near[part] = filled[part] & (cosines > ceiling)
    return np.where(near, -1, candidates), int(near.sum())


def rerank_groups(
    questions: pd.DataFrame,
    pairs: pd.DataFrame,
    spec: GroupSpec,
    *,
    vectors_of: Callable[[list[str]], np.ndarray] | None = None,
    log: Callable[[str], None] = print,
) -> RerankGroups:
    """Groups of `spec.split` from the cluster stage's questions (question_id, text,
    cluster_id, split) and pairs (q1_id, q2_id, cluster_id, split). Each pair's sides are
    swapped at random (seeded) so both directions are learnt. Negatives of training groups
    come from training and unclustered questions; of other splits, from any question.
    vectors_of: the teacher's unit vectors of texts, needed when `spec.max_teacher_cosine`
    is set (`teacher_filtered`)."""
    if spec.max_teacher_cosine is not None and vectors_of is None:
        raise ValueError("max_teacher_cosine needs the teacher's vectors_of")
    chosen = pairs[pairs["split"] == spec.split].reset_index(drop=True)
    keep = select_training_pairs(len(chosen), spec.max_pairs, spec.seed)
    chosen = chosen.iloc[np.sort(keep)].reset_index(drop=True)
    if chosen.empty:
        raise ValueError(f"no {spec.split} pairs to build re-ranker groups from")
    in_pool = questions["split"].isin(["train", "none"]) if spec.split == "train" else None
    pool = questions if in_pool is None else questions[in_pool]
    pool = pool.reset_index(drop=True)
    text_of = pd.Series(questions["text"].to_numpy(), index=questions["question_id"].to_numpy())
    swap = np.random.default_rng(spec.seed).random(len(chosen)) < 0.5
    first, second = chosen["q1_id"].to_numpy(), chosen["q2_id"].to_numpy()
    query_ids, positive_ids = np.where(swap, second, first), np.where(swap, first, second)
    queries = text_of[query_ids].tolist()
    log(
        f"mining {spec.negatives} BM25 negatives for {len(queries):,} {spec.split} pairs "
        f"among {len(pool):,} questions (ranks 1-{spec.window} of other clusters)"
    )
    bm25 = BM25Index.build(pool["text"].tolist(), k1=spec.k1, b=spec.b, stemmer=spec.stemmer)
    _, candidates = lexical_search(bm25, queries, spec.window + _SLACK)
    pool_texts = pool["text"].to_numpy()
    if spec.max_teacher_cosine is not None and vectors_of is not None:
        candidates, dropped = teacher_filtered(
            candidates, queries, pool_texts, vectors_of, spec.max_teacher_cosine
        )
        log(
            f"{dropped:,} BM25 candidates have a teacher cosine above "
            f"{spec.max_teacher_cosine} with their question: none is drawn as a negative"
        )
    rows = lexical_negatives(
        candidates,
        chosen["cluster_id"].to_numpy(),
        pool["cluster_id"].to_numpy(),
        np.ones(len(pool), bool),
        count=spec.negatives,
        window=spec.window,
        seed=spec.seed,
    )
    positives = text_of[positive_ids].tolist()
    return RerankGroups(
        queries,
        [[positive, *pool_texts[r].tolist()] for positive, r in zip(positives, rows, strict=True)],
    )

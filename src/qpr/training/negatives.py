"""Hard negatives: for each training pair, a question of another cluster that an encoder
places close to it (the negatives of DPR, Karpukhin et al. 2020, and of Sentence-BERT's
mined-negative training).

In-batch negatives are random questions: after a few epochs almost all are easy and the
softmax learns little from them. A mined negative is one the encoder still confuses with
the pair. The nearest such question is often an unlabelled paraphrase (Quora's duplicate
labels are far from complete), so the pick is random among the ranks `skip` .. `skip +
window - 1` of the neighbours, not always the first.

The train stage mines with the encoder as it starts (mined_negative_texts), from the
training and unclustered questions only; their vectors are kept in a qpr.io.VectorCache
keyed by the encoder's weights, the tokenizer, max_len and the texts, so a run started
again does not encode them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from qpr.io import VectorCache, digest, module_parts
from qpr.training.embed import embed_with_progress, torch_math
from qpr.training.pairs import select_training_pairs

if TYPE_CHECKING:
    from torch import nn

    from qpr.config import Settings
    from qpr.text.vocab import Vocabulary
    from qpr.training.train_config import TrainConfig

# Questions encoded between two progress lines while mining (a transformer on 2 cores
# takes minutes for Quora's 111k training and unclustered questions).
MINING_CHUNK = 8192


@dataclass(frozen=True)
class MiningConfig:
    """How negatives are picked: uniformly among the ranks skip .. skip + window - 1 of
    each anchor's neighbours, by a Generator seeded with `seed`; `batch_size` anchors at a
    time on `device`."""

    skip: int = 0
    window: int = 10
    seed: int = 0
    device: str = "cpu"
    batch_size: int = 1024

    @classmethod
    def from_settings(cls, settings: Settings, *, device: str) -> MiningConfig:
        """train.hard_negatives of params.yaml, the run's seed, on `device`."""
        mining = settings.train.hard_negatives
        return cls(
            skip=mining.skip,
            window=mining.window,
            seed=settings.seed,
            device=device,
            batch_size=1024 if device == "cuda" else 256,
        )


def mine_hard_negatives(
    vectors: np.ndarray,
    anchors: np.ndarray,
    cluster_ids: np.ndarray,
    eligible: np.ndarray | None = None,
    config: MiningConfig = MiningConfig(),
) -> np.ndarray:
    """Row of one hard negative per anchor, int64 [P].

    vectors: float32 [Q, D], every question's embedding; anchors: int [P], the row of each
    pair's first question; cluster_ids: int [Q] (a negative never shares the anchor's);
    eligible: bool [Q], the rows a negative may come from (None: all; e.g. training and
    unclustered questions, never validation or test ones). The candidates are the eligible
    rows of other clusters by squared L2 distance to the anchor; the pick is uniform among
    the ranks config.skip .. skip + window - 1 (fewer where fewer exist).
    """
    skip, window, device = config.skip, config.window, config.device
    vectors = np.asarray(vectors, dtype=np.float32)
    anchors = np.array(anchors, dtype=np.int64)
    # Copies: torch.from_numpy wants writable arrays (pandas hands out read-only views).
    cluster_ids = np.array(cluster_ids, dtype=np.int64)
    eligible = (
        np.ones(cluster_ids.shape, dtype=bool) if eligible is None else np.array(eligible, bool)
    )
    if vectors.ndim != 2 or cluster_ids.shape != (vectors.shape[0],):
        raise ValueError(
            f"vectors must be [Q, D] and cluster_ids [Q], got {vectors.shape}, {cluster_ids.shape}"
        )
    if eligible.shape != cluster_ids.shape:
        raise ValueError(f"eligible must be [{cluster_ids.shape[0]}], got {eligible.shape}")
    if skip < 0 or window < 1:
        raise ValueError(f"need skip >= 0 and window >= 1, got {skip}, {window}")
    if anchors.size and (anchors.min() < 0 or anchors.max() >= vectors.shape[0]):
        raise ValueError("anchors must be rows of vectors")
    depth = min(skip + window, vectors.shape[0])
    x = torch.from_numpy(vectors).to(device)
    norms = (x * x).sum(dim=1)
    clusters = torch.from_numpy(cluster_ids).to(device)
    blocked = ~torch.from_numpy(eligible).to(device)
    rng = np.random.default_rng(config.seed)
    picked = np.empty(anchors.shape[0], dtype=np.int64)
    for start in range(0, anchors.shape[0], config.batch_size):
        rows = torch.from_numpy(anchors[start : start + config.batch_size]).to(device)
        q = x[rows]
        # ||q||² is the same along a row and does not change the order: left out.
        distance = norms[None, :] - 2.0 * q @ x.T
        same_cluster = clusters[None, :] == clusters[rows][:, None]
        distance = distance.masked_fill(same_cluster | blocked[None, :], float("inf"))
        top = torch.topk(distance, depth, dim=1, largest=False)
        ranks = top.indices[:, skip:].cpu().numpy()
        finite = torch.isfinite(top.values[:, skip:]).sum(dim=1).cpu().numpy()
        if (finite == 0).any():
            raise ValueError("an anchor has no eligible question of another cluster")
        choice = np.floor(rng.random(rows.shape[0]) * finite).astype(np.int64)
        picked[start : start + rows.shape[0]] = ranks[np.arange(rows.shape[0]), choice]
    return picked


def negative_texts(
    pool: pd.DataFrame, vectors: np.ndarray, anchor_ids: np.ndarray, config: MiningConfig
) -> list[str]:
    """One mined negative per anchor question: pool holds the questions a negative may be
    (question_id, text, cluster_id; the anchors among them), vectors their embeddings row
    for row, anchor_ids the anchors' question ids."""
    row_of = pd.Series(np.arange(len(pool)), index=pool["question_id"].to_numpy())
    rows = mine_hard_negatives(
        vectors,
        row_of[np.asarray(anchor_ids)].to_numpy(),
        pool["cluster_id"].to_numpy(),
        config=config,
    )
    return pool["text"].to_numpy()[rows].tolist()


def pool_key(encoder: nn.Module, vocab_checksum: str, max_len: int, texts: list[str]) -> str:
    """The pool's vectors' cache key: the encoder's weights, the tokenizer (its checksum),
    max_len and the texts in order. Nothing is tokenised to find the file."""
    return digest(*module_parts(encoder), vocab_checksum, max_len, texts)


def mined_negative_texts(
    config: TrainConfig,
    mining: MiningConfig,
    questions: pd.DataFrame,
    train_pairs: pd.DataFrame,
    encoder: nn.Module,
    vocab: Vocabulary,
    cache: VectorCache | None = None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """train.hard_negatives.mine: one question per training pair, close to the pair's first
    question by the encoder as it starts, of another cluster, from the training and
    unclustered questions only (never a validation or test one).

    cache: the pool's vectors are read from there when this encoder (the same weights)
    encoded the same texts before, e.g. a killed run started again or a run with another
    budget or learning rate; else they are stored there, replacing the previous entry
    (MiniLM's vectors of Quora's pool take 170 MB)."""
    pool = questions[questions["split"].isin(["train", "none"])].reset_index(drop=True)
    vectors = _pool_vectors(config, mining, pool, encoder, vocab, cache, log)
    # Only the pairs train.max_pairs keeps (train_encoder takes the same seeded subset);
    # the others get an empty text that no batch reads.
    chosen = select_training_pairs(len(train_pairs), config.max_pairs, config.seed)
    negatives = np.full(len(train_pairs), "", dtype=object)
    negatives[chosen] = negative_texts(
        pool, vectors, train_pairs["q1_id"].to_numpy()[chosen], mining
    )
    return negatives.tolist()


def _pool_vectors(
    config: TrainConfig,
    mining: MiningConfig,
    pool: pd.DataFrame,
    encoder: nn.Module,
    vocab: Vocabulary,
    cache: VectorCache | None,
    log: Callable[[str], None],
) -> np.ndarray:
    """The pool's vectors by the encoder as it starts: from the cache, else encoded."""
    ranks = f"ranks {mining.skip + 1}-{mining.skip + mining.window}"
    texts = pool["text"].tolist()
    key = None
    if cache is not None:
        key = pool_key(encoder, vocab.checksum, config.max_len, texts)
        found = cache.get(key)
        if found is not None and found[0].shape[0] == len(pool):
            log(
                f"mining hard negatives ({ranks}): vectors of {len(pool):,} questions from "
                f"{cache.path(key)}"
            )
            return found[0]
    log(
        f"mining hard negatives: encoding {len(pool):,} training and unclustered "
        f"questions with the encoder as it starts ({ranks})"
    )

    def report(done: int, total: int, rate: float) -> None:
        log(
            f"mining: encoded {done:,} / {total:,} questions ({rate:,.0f}/s, "
            f"{(total - done) / rate:,.0f} s left)"
        )

    token_ids, lengths = vocab.encode_batch(texts, max_len=config.max_len)
    with torch_math(config.threads):
        vectors = embed_with_progress(
            encoder.to(config.device),
            token_ids,
            lengths,
            chunk=MINING_CHUNK,
            report=report,
            device=config.device,
        )
    if cache is not None and key is not None:
        info = {"vocab": vocab.checksum, "max_len": config.max_len, "questions": len(pool)}
        cache.put(key, vectors, info)
    return vectors


def lexical_negatives(
    candidates: np.ndarray,
    anchor_clusters: np.ndarray,
    cluster_ids: np.ndarray,
    eligible: np.ndarray,
    *,
    count: int,
    window: int,
    seed: int,
) -> np.ndarray:
    """Rows of `count` hard negatives per anchor, int64 [P, count], for a re-ranker.

    candidates: int [P, C], each anchor's retrieved rows best first (e.g. BM25's top C
    over the pool; -1 = empty slot); anchor_clusters: int [P]; cluster_ids: int [Q], each
    pool row's cluster (-1: in no cluster, never the anchor's); eligible: bool [Q], the
    rows a negative may be (training and unclustered questions, never validation or test
    ones). The negatives are drawn without replacement among the first `window`
    candidates that are eligible and of another cluster (the nearest one is often an
    unlabelled paraphrase, so not always the first); where fewer exist, the rest are
    random eligible rows of other clusters.
    """
    candidates = np.asarray(candidates, np.int64)
    anchor_clusters = np.asarray(anchor_clusters, np.int64)
    cluster_ids = np.asarray(cluster_ids, np.int64)
    eligible = np.asarray(eligible, bool)
    if candidates.ndim != 2 or anchor_clusters.shape != (candidates.shape[0],):
        raise ValueError(
            f"need candidates [P, C] and anchor_clusters [P], got {candidates.shape}, "
            f"{anchor_clusters.shape}"
        )
    if eligible.shape != cluster_ids.shape:
        raise ValueError(f"eligible {eligible.shape} and cluster_ids {cluster_ids.shape} differ")
    if count < 1 or window < 1:
        raise ValueError(f"need count >= 1 and window >= 1, got {count}, {window}")
    pool = np.flatnonzero(eligible)
    rng = np.random.default_rng(seed)
    out = np.empty((candidates.shape[0], count), np.int64)
    valid = candidates >= 0
    safe = np.where(valid, candidates, 0)
    usable = valid & eligible[safe] & (cluster_ids[safe] != anchor_clusters[:, None])
    for i in range(candidates.shape[0]):
        ranked = candidates[i, usable[i]][:window]
        picked = rng.choice(ranked, size=min(count, ranked.size), replace=False)
        if picked.size < count:  # too few retrieved: random rows of other clusters
            others = pool[(cluster_ids[pool] != anchor_clusters[i]) & ~np.isin(pool, picked)]
            if others.size < count - picked.size:
                raise ValueError(f"anchor {i} has too few eligible questions of other clusters")
            extra = rng.choice(others, size=count - picked.size, replace=False)
            picked = np.concatenate([picked, extra])
        out[i] = picked
    return out

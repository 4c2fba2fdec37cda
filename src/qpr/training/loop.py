"""Encoder training: Adam, early stopping on validation ROC AUC, resumable checkpoints.

The loop of the paper's section 4.2: batches of positive pairs (no cluster twice in a
batch), a metric-learning loss over in-batch negatives, Adam (lr 1e-3), early stopping on
the validation ROC AUC (Prechelt 1998; Bradley 1997), where a pair's score is minus the
squared distance of its two vectors, positives being same-cluster validation pairs and
negatives random cross-cluster ones. Validation MRR (each validation question queries all
the others by exact distance; relevant = same cluster) is reported alongside.

Checkpoints (`out_dir/checkpoints/`):

- last.pt: model, optimizer, loss state, epoch, RNG states, history, early-stopping state
  and a fingerprint of the run's settings; written after every epoch.
- best.pt: model and metrics of the best epoch so far (no optimizer: it is what gets
  exported).

Both are written to a temp file and renamed (os.replace is atomic on POSIX), best.pt
before last.pt, so a kill at any moment leaves a loadable and consistent pair. With
resume=True a run continues after the last completed epoch and ends with the same weights
as an uninterrupted one (same seed, same thread count): the per-epoch batches and pair
orientations come from numpy Generators seeded with (seed, epoch), and the torch / numpy /
random global states plus the loss's own generator are restored from last.pt.

Losses that classify (`needs_labels`, e.g. AM-Softmax) get each pair's cluster as a dense
class index 0..C-1 (np.unique order of the cluster ids trained on) and must be built with
num_classes = C = num_training_classes(cluster_ids, max_pairs=..., seed=...).

Losses with a teacher prior (`needs_teacher`, TeacherPriorSDMLLoss) get each batch's
teacher vectors: `teacher_vectors` = (float [P, T] for side 1, float [P, T] for side 2),
row i belonging to pair i and swapped with it when the pair is flipped. They are computed
before training (qpr.training.teacher) and enter the checkpoint fingerprint by digest.

Hard negatives (`hard_negatives`, one question per pair, for a loss with
`takes_negatives`: SDML) are encoded with each batch and passed as forward(anchors,
positives, negatives): extra columns of every anchor's softmax. They are mined before
training (qpr.training.negatives) and enter the fingerprint by digest too.

Two limits on the work done:

- max_pairs: train on a subset of that many pairs, drawn uniformly without replacement by a
  numpy Generator seeded with `seed` (select_training_pairs). Pairs rather than whole
  clusters: the subset keeps the cluster-size mix and as many distinct clusters (topics) as
  possible, and keeps the batches full, since the cluster-disjoint sampler needs at least
  as many batches as the largest cluster has pairs (whole clusters of 50 pairs in a 2,000
  pair subset would mean 50 batches of 40). Subsets of one seed are nested: the first k of
  one permutation.
- time_budget_s: a limit on the summed time of the epochs (training + validation; the
  untrained encoder's evaluation is not counted). When it runs out inside an epoch, the
  epoch is cut before its next batch, then validated and checkpointed like any other (its
  history record has cut_by_budget=True and the batches it ran), and the run ends with
  stopped_by_budget=True. It can overrun by one batch plus one validation pass. The time is
  stored with each epoch, so a killed run resumes with what is left of the budget (the
  killed epoch's time is not counted); a finished budgeted run resumed with the same
  settings does nothing more. Where a cut falls depends on the machine's speed, so a
  budgeted run is not reproducible to the weight.

Both limits are in the checkpoint fingerprint (when set): a last.pt written under other
limits is refused rather than continued, e.g. a cut epoch is never continued by a run
without a budget.

Library code: no Prefect or MLflow here; progress goes to `on_epoch` and a tqdm bar.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from qpr.errors import QPRError
from qpr.model.factory import build_encoder
from qpr.model.losses import needs_labels, needs_teacher
from qpr.text.vocab import Vocabulary
from qpr.training.sampler import ClusterDisjointBatchSampler

CHECKPOINT_VERSION = 1
EpochCallback = Callable[[dict[str, Any]], None]
ProgressCallback = Callable[[dict[str, Any]], None]


class TrainingStateError(QPRError, RuntimeError):
    """last.pt belongs to a run with different settings; refuse to mix the two."""


# --------------------------------------------------------------------------------------
# Validation data and metrics
# --------------------------------------------------------------------------------------


@dataclass
class ValidationSet:
    """Validation questions with their paraphrase clusters.

    texts: N questions; cluster_ids: int [N] (same id = paraphrases).
    positive_pairs: int64 [P, 2] indices into texts; default: consecutive members of each
    cluster (a chain, n - 1 pairs for a cluster of n, so big clusters do not dominate).
    negative_pairs: int64 [Q, 2] cross-cluster pairs; default: max(P, num_negatives)
    random ones drawn with `seed` (fixed for the whole run so epochs are comparable).
    """

    texts: list[str]
    cluster_ids: np.ndarray
    positive_pairs: np.ndarray | None = None
    negative_pairs: np.ndarray | None = None
    num_negatives: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        self.texts = list(self.texts)
        self.cluster_ids = np.asarray(self.cluster_ids)
        if self.cluster_ids.shape != (len(self.texts),):
            raise ValueError(
                f"cluster_ids shape {self.cluster_ids.shape} != ({len(self.texts)},) texts"
            )
        if np.unique(self.cluster_ids).shape[0] < 2:
            raise ValueError("validation needs at least two clusters (negatives cross them)")
        if self.positive_pairs is None:
            self.positive_pairs = _chain_pairs(self.cluster_ids)
        if self.negative_pairs is None:
            count = max(int(self.positive_pairs.shape[0]), self.num_negatives)
            self.negative_pairs = _random_negative_pairs(self.cluster_ids, count, self.seed)
        self.positive_pairs = np.asarray(self.positive_pairs, dtype=np.int64).reshape(-1, 2)
        self.negative_pairs = np.asarray(self.negative_pairs, dtype=np.int64).reshape(-1, 2)
        if self.positive_pairs.shape[0] == 0:
            raise ValueError("validation needs at least one cluster with two questions")


def _chain_pairs(cluster_ids: np.ndarray) -> np.ndarray:
    order = np.argsort(cluster_ids, kind="stable")
    same = cluster_ids[order][1:] == cluster_ids[order][:-1]
    return np.stack([order[:-1][same], order[1:][same]], axis=1).astype(np.int64)


def _random_negative_pairs(cluster_ids: np.ndarray, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0x7E6])
    n = cluster_ids.shape[0]
    found: list[np.ndarray] = []
    have = 0
    while have < count:  # rejection sampling; >= 2 clusters guarantees progress
        cand = rng.integers(0, n, size=(2 * (count - have) + 16, 2))
        cand = cand[cluster_ids[cand[:, 0]] != cluster_ids[cand[:, 1]]]
        found.append(cand)
        have += cand.shape[0]
    return np.concatenate(found)[:count].astype(np.int64)


def roc_auc(positive_scores: np.ndarray, negative_scores: np.ndarray) -> float:
    """ROC AUC = P(score_pos > score_neg) + ½ P(tie) (Mann-Whitney U with average ranks)."""
    pos = np.asarray(positive_scores, dtype=np.float64).ravel()
    neg = np.asarray(negative_scores, dtype=np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        raise ValueError("roc_auc needs at least one positive and one negative score")
    _, inverse, counts = np.unique(
        np.concatenate([pos, neg]), return_inverse=True, return_counts=True
    )
    ends = np.cumsum(counts)
    avg_rank = (ends - counts + 1 + ends) / 2.0  # 1-based mean rank of each tie group
    rank_sum = avg_rank[inverse[: pos.size]].sum()
    return float((rank_sum - pos.size * (pos.size + 1) / 2.0) / (pos.size * neg.size))


def mean_reciprocal_rank(
    embeddings: torch.Tensor, cluster_ids: np.ndarray, *, chunk: int = 1024
) -> float:
    """MRR of every question querying all the others by exact squared L2; relevant = same
    cluster. Questions with no other member of their cluster are not counted. Ties are
    broken against the query (a relevant item tied with a non-relevant one ranks after it),
    so a collapsed encoder that maps everything to one point scores low, not 1.0.
    """
    emb = embeddings.detach().to(torch.float32)
    # Dense int labels: cluster ids may be strings (answer ids) or sparse ints.
    _, dense = np.unique(np.asarray(cluster_ids), return_inverse=True)
    labels = torch.from_numpy(dense.astype(np.int64).ravel()).to(emb.device)
    n = emb.shape[0]
    sq_norm = (emb * emb).sum(dim=1)
    reciprocal: list[torch.Tensor] = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        dist = sq_norm[start:stop, None] - 2.0 * emb[start:stop] @ emb.T + sq_norm[None, :]
        rows = torch.arange(stop - start, device=emb.device)
        self_mask = torch.zeros_like(dist, dtype=torch.bool)
        self_mask[rows, rows + start] = True
        relevant = (labels[start:stop, None] == labels[None, :]) & ~self_mask
        has_relevant = relevant.any(dim=1)
        inf = torch.tensor(float("inf"), device=emb.device)
        best_relevant = torch.where(relevant, dist, inf).amin(dim=1, keepdim=True)
        ahead = (~relevant & ~self_mask & (dist <= best_relevant)).sum(dim=1)
        reciprocal.append((1.0 / (1.0 + ahead.to(torch.float64)))[has_relevant])
    values = torch.cat(reciprocal) if reciprocal else torch.zeros(0, dtype=torch.float64)
    return float(values.mean()) if values.numel() else float("nan")


@torch.no_grad()
def embed_token_ids(
    encoder: nn.Module,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Encode padded ids int64 [N, L] → float32 [N, D] (eval mode, batches sorted by length
    so little time goes to padding; original order restored). Restores the training mode."""
    was_training = encoder.training
    encoder.eval()
    try:
        order = np.argsort(lengths, kind="stable")
        ids = torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64))
        out: torch.Tensor | None = None
        for start in range(0, order.shape[0], batch_size):
            idx = order[start : start + batch_size]
            width = max(1, int(lengths[idx].max()))
            batch = ids[torch.from_numpy(idx), :width].to(device)
            emb = encoder(batch).float()
            if out is None:
                out = torch.empty((order.shape[0], emb.shape[1]), dtype=torch.float32)
            out[torch.from_numpy(idx)] = emb.cpu()
        if out is None:
            raise ValueError("embed_token_ids needs at least one row")
        return out
    finally:
        encoder.train(was_training)


def embed_with_progress(
    encoder: nn.Module,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    chunk: int,
    report: Callable[[int, int, float], None],
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """embed_token_ids `chunk` rows at a time → float32 [N, D], calling report(rows done,
    N, rows per second) after each chunk: minutes of encoding are not spent in silence."""
    total = int(token_ids.shape[0])
    parts = []
    started = time.perf_counter()
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)
        parts.append(
            embed_token_ids(
                encoder, token_ids[lo:hi], lengths[lo:hi], batch_size=batch_size, device=device
            ).numpy()
        )
        report(hi, total, hi / max(time.perf_counter() - started, 1e-9))
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def encode_texts(
    encoder: nn.Module,
    vocab: Vocabulary,
    texts: Sequence[str],
    *,
    max_len: int,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """The torch path to float32 [N, D] question vectors (export.encode is the ONNX one)."""
    token_ids, lengths = vocab.encode_batch(texts, max_len=max_len)
    return embed_token_ids(
        encoder, token_ids, lengths, batch_size=batch_size, device=device
    ).numpy()


def evaluate_encoder(
    encoder: nn.Module,
    vocab: Vocabulary,
    val: ValidationSet,
    *,
    max_len: int,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """{"val_auc", "val_mrr"} of an encoder on a validation set."""
    token_ids, lengths = vocab.encode_batch(val.texts, max_len=max_len)
    return _evaluate(encoder, token_ids, lengths, val, batch_size=batch_size, device=device)


def _evaluate(
    encoder: nn.Module,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    val: ValidationSet,
    *,
    batch_size: int,
    device: str | torch.device,
) -> dict[str, float]:
    emb = embed_token_ids(encoder, token_ids, lengths, batch_size=batch_size, device=device)
    assert val.positive_pairs is not None and val.negative_pairs is not None

    def scores(pairs: np.ndarray) -> np.ndarray:
        diff = emb[torch.from_numpy(pairs[:, 0])] - emb[torch.from_numpy(pairs[:, 1])]
        return -(diff * diff).sum(dim=1).numpy()

    return {
        "val_auc": roc_auc(scores(val.positive_pairs), scores(val.negative_pairs)),
        "val_mrr": mean_reciprocal_rank(emb, val.cluster_ids),
    }


# --------------------------------------------------------------------------------------
# Seeds and checkpoints
# --------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed python's random, numpy's global RNG and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        # Plain lists: torch.load(weights_only=True) refuses numpy arrays.
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np.asarray(np_state["key"], dtype=np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resolve_device(name: str) -> str:
    """ "cpu" or "cuda" for train.device: "auto" takes the GPU when torch sees one. Asking
    for "cuda" without one is an error, not a silent fall back to hours on the CPU."""
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {name!r}")
    available = torch.cuda.is_available()
    if name == "cuda" and not available:
        raise RuntimeError(
            "train.device is 'cuda' but torch sees no GPU (a CPU-only torch build or no "
            "device): set train.device to 'auto' or 'cpu'"
        )
    if name == "auto":
        return "cuda" if available else "cpu"
    return name


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same directory, fsync, then os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_numpy_save(array: np.ndarray, path: Path) -> None:
    """np.save to a temp file in the same directory, then os.replace: a killed run never
    leaves a half-written cache file under the final name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, array)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load last.pt / best.pt safely (weights_only: plain types and tensors, no pickled code)."""
    return torch.load(Path(path), map_location="cpu", weights_only=True)


def load_encoder(path: str | os.PathLike[str]) -> nn.Module:
    """Rebuild the encoder stored in a checkpoint (eval mode), e.g. best.pt for export."""
    ckpt = load_checkpoint(path)
    encoder = build_encoder(ckpt["encoder"]["name"], **ckpt["encoder"]["config"])
    encoder.load_state_dict(ckpt["model"])
    return encoder.eval()


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


def _hash_texts(h: Any, texts: Sequence[str]) -> Any:
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x1f")
    return h


def _data_digest(q1: Sequence[str], q2: Sequence[str], cluster_ids: np.ndarray) -> str:
    h = _hash_texts(hashlib.sha256(), (*q1, "\x00", *q2))
    h.update(np.ascontiguousarray(cluster_ids).tobytes())
    return h.hexdigest()


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside the block (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------


class _EncodedPairs:
    """Every training question encoded once (int32 [P, L] per side, right-padded);
    a batch slices its rows and trims the columns to its own longest question."""

    def __init__(
        self,
        vocab: Vocabulary,
        q1: Sequence[str],
        q2: Sequence[str],
        max_len: int,
        labels: np.ndarray | None = None,
        teacher: tuple[np.ndarray, np.ndarray] | None = None,
        negatives: Sequence[str] | None = None,
    ):
        a_ids, a_len = vocab.encode_batch(q1, max_len=max_len)
        b_ids, b_len = vocab.encode_batch(q2, max_len=max_len)
        width = max(a_ids.shape[1], b_ids.shape[1])
        # One hard negative per pair (None: in-batch negatives only).
        self.negatives = self.negative_len = None
        if negatives is not None:
            n_ids, n_len = vocab.encode_batch(negatives, max_len=max_len)
            self.negatives = torch.from_numpy(n_ids.astype(np.int32))
            self.negative_len = torch.from_numpy(n_len)
        # int32 at rest halves the memory of 2 × P × max_len ids; batches become int64.
        self.side_a = torch.from_numpy(_pad_to(a_ids, width).astype(np.int32))
        self.side_b = torch.from_numpy(_pad_to(b_ids, width).astype(np.int32))
        self.pair_len = torch.from_numpy(np.maximum(a_len, b_len))
        # Dense class index per pair, for losses that classify (None: no such loss).
        self.labels = None if labels is None else torch.from_numpy(np.asarray(labels, np.int64))
        # Teacher vectors per side, for a loss with a teacher prior (None: no such loss).
        self.teacher = None
        if teacher is not None:
            self.teacher = tuple(torch.from_numpy(np.asarray(t, np.float32)) for t in teacher)

    def teacher_batch(
        self, idx: torch.Tensor, flip: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(anchor, positive) teacher vectors, float32 [n, T] each, oriented like batch()."""
        assert self.teacher is not None, "a loss with a teacher prior needs teacher vectors"
        side_a, side_b = self.teacher[0][idx], self.teacher[1][idx]
        swap = flip[idx].unsqueeze(1)
        return torch.where(swap, side_b, side_a), torch.where(swap, side_a, side_b)

    def batch(self, idx: torch.Tensor, flip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(anchor ids, positive ids), int64 [n, w] each; flip[i] swaps pair i's sides."""
        width = max(1, int(self.pair_len[idx].max()))
        rows_a, rows_b = self.side_a[idx, :width], self.side_b[idx, :width]
        swap = flip[idx].unsqueeze(1)
        anchors = torch.where(swap, rows_b, rows_a).long()
        positives = torch.where(swap, rows_a, rows_b).long()
        return anchors, positives

    def negative_batch(self, idx: torch.Tensor) -> torch.Tensor:
        """The pairs' hard negatives, int64 [n, w] (w: their own longest)."""
        assert self.negatives is not None and self.negative_len is not None
        width = max(1, int(self.negative_len[idx].max()))
        return self.negatives[idx, :width].long()


def _pad_to(token_ids: np.ndarray, width: int) -> np.ndarray:
    return np.pad(token_ids, ((0, 0), (0, width - token_ids.shape[1])))


def _train_epoch(
    *,
    encoder: nn.Module,
    loss: nn.Module,
    optimizer: torch.optim.Optimizer,
    pairs: _EncodedPairs,
    batches: list[np.ndarray],
    flip: torch.Tensor,
    device: str | torch.device,
    bar: tqdm,
    epoch: int,
    deadline: float | None,
    on_progress: ProgressCallback | None,
    progress_every_s: float,
) -> tuple[float, int, int]:
    """One pass over `batches`, or up to `deadline` (a time.perf_counter() value, checked
    before each batch but the first); returns (sum of loss × batch size, pairs seen,
    batches run). on_progress gets the bar's figures at most every `progress_every_s`."""
    encoder.train()
    with_labels = needs_labels(loss)
    with_teacher = needs_teacher(loss)
    loss_sum, pairs_seen, done = 0.0, 0, 0
    t0 = last_report = time.perf_counter()
    for batch in batches:
        if done and deadline is not None and time.perf_counter() >= deadline:
            break
        idx = torch.from_numpy(batch)
        anchors, positives = pairs.batch(idx, flip)
        n = anchors.shape[0]
        # Both sides in one forward pass: one big conv/matmul instead of two.
        emb = encoder(torch.cat([anchors, positives]).to(device))
        if pairs.negatives is not None:
            negatives = encoder(pairs.negative_batch(idx).to(device))
            value = loss(emb[:n], emb[n:], negatives)
        elif with_labels:
            assert pairs.labels is not None, "a loss that classifies needs labelled pairs"
            value = loss(emb[:n], emb[n:], pairs.labels[idx].to(device))
        elif with_teacher:
            t_anchors, t_positives = pairs.teacher_batch(idx, flip)
            value = loss(emb[:n], emb[n:], t_anchors.to(device), t_positives.to(device))
        else:
            value = loss(emb[:n], emb[n:])
        batch_loss = value.detach().item()
        if not np.isfinite(batch_loss):
            raise FloatingPointError(f"loss is {batch_loss} at epoch {epoch}")
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        loss_sum += batch_loss * n
        pairs_seen += n
        done += 1
        bar.update(1)
        now = time.perf_counter()
        postfix = {
            "loss": f"{loss_sum / pairs_seen:.4f}",
            "pairs_s": f"{pairs_seen / max(now - t0, 1e-9):.0f}",
        }
        if deadline is not None:
            postfix["budget_left"] = f"{max(deadline - now, 0.0):.0f}s"
        bar.set_postfix(postfix, refresh=False)
        if on_progress is not None and now - last_report >= progress_every_s:
            last_report = now
            on_progress(
                {
                    "epoch": epoch,
                    "batches": done,
                    "planned_batches": len(batches),
                    "pairs": pairs_seen,
                    "train_loss": loss_sum / pairs_seen,
                    "pairs_per_s": pairs_seen / max(now - t0, 1e-9),
                    "seconds": now - t0,
                    "budget_left_s": None if deadline is None else max(deadline - now, 0.0),
                }
            )
    return loss_sum, pairs_seen, done


@dataclass
class TrainResult:
    """What train_encoder did. `history` has one dict per completed (or budget-cut) epoch,
    all of them, including those run before a resume; `initial` is the untrained encoder
    (epoch 0). train_pairs / train_classes: the pairs trained on (after max_pairs) and
    their distinct clusters."""

    best_epoch: int
    best_val_auc: float
    best_val_mrr: float
    last_epoch: int
    stopped_early: bool
    initial: dict[str, float]
    history: list[dict[str, Any]]
    last_checkpoint: Path
    best_checkpoint: Path
    resumed_from_epoch: int | None = None
    seconds: float = 0.0
    stopped_by_budget: bool = False
    train_pairs: int = 0
    train_classes: int = 0


MONITORS = ("val_auc", "val_mrr")


def _save_best(
    path: Path,
    epoch: int,
    encoder_info: dict[str, Any],
    encoder: nn.Module,
    metrics: dict[str, Any],
    vocab: Vocabulary,
    max_len: int,
) -> None:
    atomic_torch_save(
        {
            "version": CHECKPOINT_VERSION,
            "epoch": epoch,
            "encoder": encoder_info,
            "model": encoder.state_dict(),
            "metrics": {k: metrics[k] for k in ("val_auc", "val_mrr")},
            "vocab": vocab.checksum,
            "max_len": max_len,
        },
        path,
    )


def _best_under(
    monitor: str, best: dict[str, Any], history: list[dict[str, Any]]
) -> tuple[dict[str, Any], int]:
    """(best, bad_epochs) of a resumed run under another monitor: the better, by
    `monitor`, of the two epochs whose weights exist (best.pt's and the last epoch's);
    bad_epochs = epochs since it (the patience count)."""
    last = history[-1]
    kept = next((r for r in history if r["epoch"] == best["epoch"]), None)
    chosen = last if kept is None or last[monitor] > kept[monitor] else kept
    record = {"epoch": chosen["epoch"], "val_auc": chosen["val_auc"], "val_mrr": chosen["val_mrr"]}
    return {**record, "monitor": monitor}, int(last["epoch"] - chosen["epoch"])


def train_encoder(
    *,
    encoder: nn.Module,
    loss: nn.Module,
    vocab: Vocabulary,
    train_pairs: tuple[Sequence[str], Sequence[str], np.ndarray],
    val: ValidationSet,
    out_dir: str | os.PathLike[str],
    lr: float = 1e-3,
    batch_size: int = 512,
    max_epochs: int = 50,
    patience: int = 3,
    min_delta: float = 0.0,
    monitor: str = "val_auc",
    max_len: int = 64,
    seed: int = 0,
    resume: bool = True,
    on_epoch: EpochCallback | None = None,
    progress: bool = True,
    on_progress: ProgressCallback | None = None,
    progress_every_s: float = 60.0,
    threads: int | None = None,
    device: str | torch.device = "cpu",
    eval_batch_size: int = 1024,
    max_pairs: int | None = None,
    time_budget_s: float | None = None,
    teacher_vectors: tuple[np.ndarray, np.ndarray] | None = None,
    hard_negatives: Sequence[str] | None = None,
) -> TrainResult:
    """Train `encoder` in place; on return it holds the best epoch's weights.

    train_pairs: (questions_1, questions_2, cluster_ids int [P]); pair i is a paraphrase
    pair of cluster cluster_ids[i]. Early stopping: stop after `patience` epochs without
    the validation `monitor` ("val_auc", ROC AUC of paraphrase vs other pairs, or
    "val_mrr", the retrieval MRR) improving by more than `min_delta`, or at max_epochs; the
    best epoch by `monitor` is the one kept. A run resumed under another monitor picks its
    best again among the epochs whose weights are still there (best.pt's and the last).
    on_epoch gets {epoch, train_loss, val_auc, val_mrr, pairs_per_s, seconds, ...} after
    the epoch's checkpoints are on disk (an exception there leaves a resumable run).
    on_progress gets {epoch, batches, planned_batches, pairs, train_loss, pairs_per_s,
    seconds, budget_left_s} inside an epoch, at most every progress_every_s seconds: the
    bar's figures for a log (a transformer's epoch on 2 cores can take an hour).
    threads: torch intra-op threads for this call (restored afterwards); None keeps torch's.
    max_pairs: train on a seeded subset of this many pairs; time_budget_s: stop when the
    epochs have taken this long (module docstring). A loss with `needs_labels` gets dense
    cluster labels and must have num_classes = num_training_classes(cluster_ids,
    max_pairs=max_pairs, seed=seed).
    hard_negatives: one question per pair, of another cluster but close to the pair (e.g.
    qpr.training.negatives.mine_hard_negatives); each batch's are extra negatives for every anchor
    (a loss with `takes_negatives`, SDML).
    Seed before building the encoder (seed_everything) for reproducible initial weights.
    """
    started = time.perf_counter()
    q1, q2, cluster_ids = train_pairs
    cluster_ids = np.asarray(cluster_ids)
    if not (len(q1) == len(q2) == cluster_ids.shape[0]):
        raise ValueError(
            f"train_pairs lengths differ: {len(q1)}, {len(q2)}, {cluster_ids.shape[0]}"
        )
    if len(q1) == 0:
        raise ValueError("no training pairs")
    if max_epochs < 0 or patience < 1:
        raise ValueError(f"need max_epochs >= 0 and patience >= 1, got {max_epochs}, {patience}")
    if monitor not in MONITORS:
        raise ValueError(f"monitor must be one of {MONITORS}, got {monitor!r}")
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs}")
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be > 0 or None, got {time_budget_s}")
    if needs_teacher(loss) != (teacher_vectors is not None):
        raise ValueError(
            f"{type(loss).__name__} "
            + ("needs teacher_vectors" if needs_teacher(loss) else "takes no teacher_vectors")
        )
    if hard_negatives is not None:
        if not getattr(loss, "takes_negatives", False):
            raise ValueError(f"{type(loss).__name__} takes no hard negatives")
        if len(hard_negatives) != len(q1):
            raise ValueError(
                f"hard_negatives needs one question per pair ({len(q1):,}), "
                f"got {len(hard_negatives):,}"
            )
    teacher_digest = None
    if teacher_vectors is not None:
        teacher_vectors = tuple(np.asarray(t, np.float32) for t in teacher_vectors)
        if any(t.ndim != 2 or t.shape[0] != len(q1) for t in teacher_vectors) or (
            teacher_vectors[0].shape != teacher_vectors[1].shape
        ):
            raise ValueError(
                f"teacher_vectors must be two [{len(q1)}, T] arrays, got "
                f"{[t.shape for t in teacher_vectors]}"
            )
        h = hashlib.sha256()
        for t in teacher_vectors:
            h.update(np.ascontiguousarray(t).tobytes())
        teacher_digest = h.hexdigest()
    data_digest = _data_digest(q1, q2, cluster_ids)
    negatives_digest = None
    if hard_negatives is not None:
        negatives_digest = _hash_texts(hashlib.sha256(), hard_negatives).hexdigest()
    chosen = select_training_pairs(len(q1), max_pairs, seed)
    if chosen.shape[0] < len(q1):
        all_q1, all_q2 = list(q1), list(q2)
        q1 = [all_q1[i] for i in chosen]
        q2 = [all_q2[i] for i in chosen]
        if hard_negatives is not None:
            all_negatives = list(hard_negatives)
            hard_negatives = [all_negatives[i] for i in chosen]
        cluster_ids = cluster_ids[chosen]
        if teacher_vectors is not None:
            teacher_vectors = (teacher_vectors[0][chosen], teacher_vectors[1][chosen])
    _, labels = np.unique(cluster_ids, return_inverse=True)
    num_classes = int(labels.max()) + 1
    if needs_labels(loss) and getattr(loss, "num_classes", None) != num_classes:
        raise ValueError(
            f"{type(loss).__name__} has num_classes={getattr(loss, 'num_classes', None)}, but "
            f"the {len(q1):,} training pairs hold {num_classes:,} distinct clusters; build it "
            "with num_classes=num_training_classes(cluster_ids, max_pairs=..., seed=...)"
        )

    out_dir = Path(out_dir)
    ckpt_dir = out_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    last_path, best_path = ckpt_dir / "last.pt", ckpt_dir / "best.pt"
    for stale in ckpt_dir.glob(".*.tmp"):  # left by a run killed while saving
        stale.unlink(missing_ok=True)

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        encoder_info = {"name": getattr(encoder, "name", type(encoder).__name__)}
        encoder_info["config"] = encoder.config() if hasattr(encoder, "config") else {}
        fingerprint = {
            "encoder": encoder_info,
            "loss": f"{type(loss).__name__}({loss.extra_repr()})",
            "lr": lr,
            "batch_size": batch_size,
            "max_len": max_len,
            "seed": seed,
            "vocab": vocab.checksum,
            "train_data": data_digest,
        }
        # Only when set, so checkpoints from before these options still resume.
        if max_pairs is not None:
            fingerprint["max_pairs"] = max_pairs
        if time_budget_s is not None:
            fingerprint["time_budget_s"] = float(time_budget_s)
        if teacher_digest is not None:
            fingerprint["teacher_vectors"] = teacher_digest
        if negatives_digest is not None:
            fingerprint["hard_negatives"] = negatives_digest
        encoder.to(device)
        loss.to(device)
        # The fused kernel: at paper size (16.5M parameters, mostly the embedding) the
        # default Adam step took 0.12 s of a 0.6 s batch on one CPU core, fused 0.02 s.
        optimizer = torch.optim.Adam(
            [*encoder.parameters(), *loss.parameters()],
            lr=lr,
            fused=torch.device(device).type in ("cpu", "cuda"),
        )

        pairs = _EncodedPairs(vocab, q1, q2, max_len, labels, teacher_vectors, hard_negatives)
        val_ids, val_len = vocab.encode_batch(val.texts, max_len=max_len)

        sampler = ClusterDisjointBatchSampler(cluster_ids, batch_size, seed=seed)

        def evaluate() -> dict[str, float]:
            return _evaluate(
                encoder, val_ids, val_len, val, batch_size=eval_batch_size, device=device
            )

        resumed_from: int | None = None
        if resume and last_path.exists():
            state = load_checkpoint(last_path)
            if state.get("version") != CHECKPOINT_VERSION:
                raise TrainingStateError(f"{last_path}: checkpoint version {state.get('version')}")
            if state["fingerprint"] != fingerprint:
                changed = sorted(
                    k
                    for k in {*fingerprint, *state["fingerprint"]}
                    if state["fingerprint"].get(k) != fingerprint.get(k)
                )
                raise TrainingStateError(
                    f"{last_path} was written by a run with different {changed}; "
                    "use resume=False or another out_dir"
                )
            encoder.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loss.load_state_dict(state["loss"])
            _set_rng_state(state["rng"])
            history: list[dict[str, Any]] = list(state["history"])
            initial: dict[str, float] = dict(state["initial"])
            best: dict[str, Any] = dict(state["best"])
            bad_epochs = int(state["bad_epochs"])
            epoch = resumed_from = int(state["epoch"])
            if best.get("monitor", "val_auc") != monitor and history:
                best, bad_epochs = _best_under(monitor, best, history)
                if best["epoch"] == epoch:  # the last epoch is the new best: its weights
                    _save_best(best_path, epoch, encoder_info, encoder, best, vocab, max_len)
        else:
            # A stale best.pt from an earlier run must not survive into this one.
            best_path.unlink(missing_ok=True)
            last_path.unlink(missing_ok=True)
            seed_everything(seed)
            history, bad_epochs, epoch = [], 0, 0
            initial = evaluate()
            best = {"epoch": 0, "val_auc": float("-inf"), "val_mrr": float("nan")}
        best["monitor"] = monitor

        def budget_spent() -> bool:
            spent = sum(float(r["seconds"]) for r in history)
            return time_budget_s is not None and spent >= time_budget_s

        while epoch < max_epochs and bad_epochs < patience and not budget_spent():
            epoch += 1
            t0 = time.perf_counter()
            deadline = None
            if time_budget_s is not None:
                deadline = t0 + time_budget_s - sum(float(r["seconds"]) for r in history)
            sampler.set_epoch(epoch)
            # Pair orientation per epoch: the loss is not symmetric in (anchor, positive).
            flip = torch.from_numpy(np.random.default_rng([seed, epoch, 1]).random(len(q1)) < 0.5)
            with tqdm(
                total=len(sampler),
                desc=f"epoch {epoch}/{max_epochs}",
                unit="batch",
                disable=not progress,
                leave=False,
            ) as bar:
                loss_sum, pairs_seen, batches_run = _train_epoch(
                    encoder=encoder,
                    loss=loss,
                    optimizer=optimizer,
                    pairs=pairs,
                    batches=sampler.batches(),
                    flip=flip,
                    device=device,
                    bar=bar,
                    epoch=epoch,
                    deadline=deadline,
                    on_progress=on_progress,
                    progress_every_s=progress_every_s,
                )
            train_seconds = time.perf_counter() - t0
            metrics = evaluate()
            record = {
                "epoch": epoch,
                "train_loss": loss_sum / max(pairs_seen, 1),
                "val_auc": metrics["val_auc"],
                "val_mrr": metrics["val_mrr"],
                "pairs_per_s": pairs_seen / max(train_seconds, 1e-9),
                "train_seconds": train_seconds,
                "seconds": time.perf_counter() - t0,
                "batches": batches_run,
                "planned_batches": len(sampler),
                "pairs": pairs_seen,
                "cut_by_budget": batches_run < len(sampler),
            }
            history.append(record)
            so_far = best[monitor] if best["epoch"] > 0 else float("-inf")
            if metrics[monitor] > so_far + min_delta:
                best = {"epoch": epoch, **metrics, "monitor": monitor}
                bad_epochs = 0
                # best.pt before last.pt: a kill between the two replays this epoch on
                # resume, which rewrites the same best.pt; the other order could leave
                # last.pt naming a best epoch that best.pt does not hold.
                _save_best(best_path, epoch, encoder_info, encoder, metrics, vocab, max_len)
            else:
                bad_epochs += 1
            atomic_torch_save(
                {
                    "version": CHECKPOINT_VERSION,
                    "epoch": epoch,
                    "encoder": encoder_info,
                    "model": encoder.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loss": loss.state_dict(),
                    "rng": _rng_state(),
                    "history": history,
                    "initial": initial,
                    "best": best,
                    "bad_epochs": bad_epochs,
                    "fingerprint": fingerprint,
                },
                last_path,
            )
            if on_epoch is not None:
                on_epoch(dict(record))

        if best_path.exists():
            encoder.load_state_dict(load_checkpoint(best_path)["model"])
        # Also true when the budget ran out exactly at an epoch's end, but not when the run
        # would have stopped there anyway (max_epochs, patience).
        stopped_by_budget = any(r.get("cut_by_budget", False) for r in history) or (
            budget_spent() and epoch < max_epochs and bad_epochs < patience
        )
        return TrainResult(
            best_epoch=int(best["epoch"]),
            best_val_auc=float(best["val_auc"]),
            best_val_mrr=float(best["val_mrr"]),
            last_epoch=epoch,
            stopped_early=bad_epochs >= patience,
            initial=initial,
            history=history,
            last_checkpoint=last_path,
            best_checkpoint=best_path,
            resumed_from_epoch=resumed_from,
            seconds=time.perf_counter() - started,
            stopped_by_budget=stopped_by_budget,
            train_pairs=len(q1),
            train_classes=num_classes,
        )
    finally:
        if threads is not None:
            torch.set_num_threads(previous_threads)

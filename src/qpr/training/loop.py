"""Encoder training: Adam, early stopping on validation, resumable checkpoints.

The loop of the paper's section 4.2: batches of positive pairs (no cluster twice in a
batch), a metric-learning loss over in-batch negatives, Adam (lr 1e-3), early stopping on a
validation measure (qpr.training.validation). It reads in four steps: prepare (check the
data against the loss, encode it, build the optimizer), resume or start (last.pt of the
same run, or the seeded untrained encoder), epochs, finish (the best epoch's weights).

With resume=True a run continues after the last completed epoch and ends with the same
weights as an uninterrupted one (same seed, same thread count): the per-epoch batches and
pair orientations come from numpy Generators seeded with (seed, epoch), and the torch /
numpy / random global states plus the loss's own generator are restored from last.pt
(qpr.training.checkpoint). last.pt holds the TrainConfig; its fingerprint fields, with
digests of the data, the encoder's architecture, the loss and the tokenizer, must match
for a resume: another run's last.pt is refused (TrainingStateError), not continued.

Losses that classify (`needs_labels`, e.g. AM-Softmax) get each pair's cluster as a dense
class index 0..C-1 (np.unique order of the cluster ids trained on) and must be built with
num_classes = C = num_training_classes(cluster_ids, max_pairs=..., seed=...).

Losses with a teacher prior (`needs_teacher`, TeacherPriorSDMLLoss) get each batch's
teacher vectors (TrainData.teacher_vectors), swapped with their pair when it is flipped.
They are computed before training (qpr.training.teacher).

Hard negatives (TrainData.hard_negatives, one question per pair, for a loss with
`takes_negatives`: SDML) are encoded with each batch and passed as forward(anchors,
positives, negatives): extra columns of every anchor's softmax. They are mined before
training (qpr.training.negatives).

Two limits on the work done:

- max_pairs: train on a seeded subset of that many pairs (qpr.training.pairs).
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

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from qpr.model.losses import needs_labels, needs_teacher
from qpr.text.vocab import Vocabulary
from qpr.training.checkpoint import (
    CHECKPOINT_VERSION,
    TrainingStateError,
    check_resumable,
    encoder_info,
    load_checkpoint,
    rng_state,
    save_best,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)
from qpr.training.embed import torch_threads
from qpr.training.pairs import TrainData
from qpr.training.sampler import ClusterDisjointBatchSampler
from qpr.training.train_config import TrainConfig
from qpr.training.validation import ValidationSet, evaluate_token_ids

EpochCallback = Callable[[dict[str, Any]], None]
ProgressCallback = Callable[[dict[str, Any]], None]


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


def progress_line(record: dict[str, Any]) -> str:
    """One in-epoch log line from train_encoder's on_progress record."""
    line = (
        f"epoch {record['epoch']}: {record['batches']:,} / {record['planned_batches']:,} "
        f"batches, loss {record['train_loss']:.4f}, {record['pairs_per_s']:.0f} pairs/s"
    )
    if record.get("budget_left_s") is not None:
        line += f", {record['budget_left_s']:,.0f} s of the budget left"
    return line


# --------------------------------------------------------------------------------------
# The run: prepare → resume or start → epochs → finish
# --------------------------------------------------------------------------------------


def train_encoder(
    config: TrainConfig,
    data: TrainData,
    *,
    encoder: nn.Module,
    loss: nn.Module,
    vocab: Vocabulary,
    out_dir: str | os.PathLike[str],
    on_epoch: EpochCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> TrainResult:
    """Train `encoder` in place; on return it holds the best epoch's weights.

    Early stopping: stop after config.patience epochs without the validation
    config.monitor ("val_auc", ROC AUC of paraphrase vs other pairs, or "val_mrr", the
    retrieval MRR) improving by more than min_delta, or at max_epochs; the best epoch by
    the monitor is the one kept. A run resumed under another monitor picks its best again
    among the epochs whose weights are still there (best.pt's and the last).
    on_epoch gets {epoch, train_loss, val_auc, val_mrr, pairs_per_s, seconds, ...} after
    the epoch's checkpoints are on disk (an exception there leaves a resumable run).
    on_progress gets {epoch, batches, planned_batches, pairs, train_loss, pairs_per_s,
    seconds, budget_left_s} inside an epoch, at most every config.progress_every_s
    seconds: the bar's figures for a log (a transformer's epoch on 2 cores can take an hour).
    Seed before building the encoder (seed_everything) for reproducible initial weights.
    """
    started = time.perf_counter()
    with torch_threads(config.threads):
        run = _prepare(config, data, encoder, loss, vocab, Path(out_dir))
        state = _resume_or_start(run)
        while _goes_on(run, state):
            _run_epoch(run, state, on_epoch, on_progress)
        return _finish(run, state, started)


@dataclass
class _Run:
    """What a run sets up once: its config, model, optimizer, encoded data and files."""

    config: TrainConfig
    encoder: nn.Module
    loss: nn.Module
    optimizer: torch.optim.Optimizer
    pairs: _EncodedPairs
    sampler: ClusterDisjointBatchSampler
    val: ValidationSet
    val_ids: np.ndarray
    val_len: np.ndarray
    vocab_checksum: str
    fingerprint: dict[str, Any]
    last_path: Path
    best_path: Path
    num_pairs: int
    num_classes: int

    def evaluate(self) -> dict[str, float]:
        return evaluate_token_ids(
            self.encoder,
            self.val_ids,
            self.val_len,
            self.val,
            batch_size=self.config.eval_batch_size,
            device=self.config.device,
        )


@dataclass
class _State:
    """Where a run is: the epochs done and early stopping's view of them."""

    epoch: int
    history: list[dict[str, Any]]
    initial: dict[str, float]
    best: dict[str, Any]
    bad_epochs: int
    resumed_from: int | None = None

    @property
    def seconds(self) -> float:
        """The time the epochs took, as the time budget counts it."""
        return sum(float(r["seconds"]) for r in self.history)


def _prepare(
    config: TrainConfig,
    data: TrainData,
    encoder: nn.Module,
    loss: nn.Module,
    vocab: Vocabulary,
    out_dir: Path,
) -> _Run:
    """Check the data against the loss, take the max_pairs subset, encode it once, move
    the model to the device and build the optimizer."""
    _check_loss(loss, data)
    fingerprint = {
        **config.fingerprint(),
        "encoder": encoder_info(encoder),
        "loss": f"{type(loss).__name__}({loss.extra_repr()})",
        "vocab": vocab.checksum,
        **data.fingerprint(),
    }
    data = data.subset(config.max_pairs, config.seed)
    _, labels = np.unique(data.cluster_ids, return_inverse=True)
    num_classes = int(labels.max()) + 1
    if needs_labels(loss) and getattr(loss, "num_classes", None) != num_classes:
        raise ValueError(
            f"{type(loss).__name__} has num_classes={getattr(loss, 'num_classes', None)}, but "
            f"the {len(data):,} training pairs hold {num_classes:,} distinct clusters; build it "
            "with num_classes=num_training_classes(cluster_ids, max_pairs=..., seed=...)"
        )
    ckpt_dir = out_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for stale in ckpt_dir.glob(".*.tmp"):  # left by a run killed while saving
        stale.unlink(missing_ok=True)
    encoder.to(config.device)
    loss.to(config.device)
    # The fused kernel: at paper size (16.5M parameters, mostly the embedding) the
    # default Adam step took 0.12 s of a 0.6 s batch on one CPU core, fused 0.02 s.
    optimizer = torch.optim.Adam(
        [*encoder.parameters(), *loss.parameters()],
        lr=config.lr,
        fused=torch.device(config.device).type in ("cpu", "cuda"),
    )
    pairs = _EncodedPairs(
        vocab, data.q1, data.q2, config.max_len, labels, data.teacher_vectors, data.hard_negatives
    )
    val_ids, val_len = vocab.encode_batch(data.val.texts, max_len=config.max_len)
    return _Run(
        config=config,
        encoder=encoder,
        loss=loss,
        optimizer=optimizer,
        pairs=pairs,
        sampler=ClusterDisjointBatchSampler(data.cluster_ids, config.batch_size, seed=config.seed),
        val=data.val,
        val_ids=val_ids,
        val_len=val_len,
        vocab_checksum=vocab.checksum,
        fingerprint=fingerprint,
        last_path=ckpt_dir / "last.pt",
        best_path=ckpt_dir / "best.pt",
        num_pairs=len(data),
        num_classes=num_classes,
    )


def _check_loss(loss: nn.Module, data: TrainData) -> None:
    """The per-pair extras the data brings must be the ones the loss takes."""
    if needs_teacher(loss) != (data.teacher_vectors is not None):
        raise ValueError(
            f"{type(loss).__name__} "
            + ("needs teacher_vectors" if needs_teacher(loss) else "takes no teacher_vectors")
        )
    if data.hard_negatives is not None and not getattr(loss, "takes_negatives", False):
        raise ValueError(f"{type(loss).__name__} takes no hard negatives")


def _resume_or_start(run: _Run) -> _State:
    """last.pt's state when config.resume and it is this run's; else a fresh start: old
    checkpoints removed, everything seeded, the untrained encoder evaluated."""
    config = run.config
    if config.resume and run.last_path.exists():
        state = _resume(run)
    else:
        # A stale best.pt from an earlier run must not survive into this one.
        run.best_path.unlink(missing_ok=True)
        run.last_path.unlink(missing_ok=True)
        seed_everything(config.seed)
        initial = run.evaluate()
        best = {"epoch": 0, "val_auc": float("-inf"), "val_mrr": float("nan")}
        if config.max_epochs == 0:
            # No training asked for: the encoder as built (a pretrained one as packaged)
            # is the model, kept as epoch 0.
            best = {"epoch": 0, **initial}
            _save_best(run, 0, initial)
        state = _State(epoch=0, history=[], initial=initial, best=best, bad_epochs=0)
    state.best["monitor"] = config.monitor
    return state


def _resume(run: _Run) -> _State:
    saved = load_checkpoint(run.last_path)
    check_resumable(run.last_path, saved, run.fingerprint)
    if int(saved["epoch"]) > run.config.max_epochs:
        # A shorter run (`dvc exp run -S train.max_epochs=2` after a 10-epoch run) must not
        # keep the longer run's weights: its epochs past max_epochs cannot be undone.
        raise TrainingStateError(
            f"{run.last_path} holds epoch {saved['epoch']}, past max_epochs {run.config.max_epochs}"
        )
    run.encoder.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    run.loss.load_state_dict(saved["loss"])
    set_rng_state(saved["rng"])
    state = _State(
        epoch=int(saved["epoch"]),
        history=list(saved["history"]),
        initial=dict(saved["initial"]),
        best=dict(saved["best"]),
        bad_epochs=int(saved["bad_epochs"]),
        resumed_from=int(saved["epoch"]),
    )
    monitor = run.config.monitor
    if state.best.get("monitor", "val_auc") != monitor and state.history:
        state.best, state.bad_epochs = _best_under(monitor, state.best, state.history)
        if state.best["epoch"] == state.epoch:  # the last epoch is the new best: its weights
            _save_best(run, state.epoch, state.best)
    return state


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


def _budget_spent(run: _Run, state: _State) -> bool:
    budget = run.config.time_budget_s
    return budget is not None and state.seconds >= budget


def _goes_on(run: _Run, state: _State) -> bool:
    config = run.config
    return (
        state.epoch < config.max_epochs
        and state.bad_epochs < config.patience
        and not _budget_spent(run, state)
    )


def _run_epoch(
    run: _Run,
    state: _State,
    on_epoch: EpochCallback | None,
    on_progress: ProgressCallback | None,
) -> None:
    """One epoch: train, validate, keep it if best, checkpoint, report."""
    config = run.config
    state.epoch += 1
    epoch = state.epoch
    t0 = time.perf_counter()
    deadline = None
    if config.time_budget_s is not None:
        deadline = t0 + config.time_budget_s - state.seconds
    run.sampler.set_epoch(epoch)
    # Pair orientation per epoch: the loss is not symmetric in (anchor, positive).
    flip = torch.from_numpy(
        np.random.default_rng([config.seed, epoch, 1]).random(run.num_pairs) < 0.5
    )
    with tqdm(
        total=len(run.sampler),
        desc=f"epoch {epoch}/{config.max_epochs}",
        unit="batch",
        disable=not config.progress,
        leave=False,
    ) as bar:
        loss_sum, pairs_seen, batches_run = _train_epoch(
            encoder=run.encoder,
            loss=run.loss,
            optimizer=run.optimizer,
            pairs=run.pairs,
            batches=run.sampler.batches(),
            flip=flip,
            device=config.device,
            bar=bar,
            epoch=epoch,
            deadline=deadline,
            on_progress=on_progress,
            progress_every_s=config.progress_every_s,
        )
    train_seconds = time.perf_counter() - t0
    metrics = run.evaluate()
    record = {
        "epoch": epoch,
        "train_loss": loss_sum / max(pairs_seen, 1),
        "val_auc": metrics["val_auc"],
        "val_mrr": metrics["val_mrr"],
        "pairs_per_s": pairs_seen / max(train_seconds, 1e-9),
        "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
        "batches": batches_run,
        "planned_batches": len(run.sampler),
        "pairs": pairs_seen,
        "cut_by_budget": batches_run < len(run.sampler),
    }
    state.history.append(record)
    _checkpoint_epoch(run, state, metrics)
    if on_epoch is not None:
        on_epoch(dict(record))


def _checkpoint_epoch(run: _Run, state: _State, metrics: dict[str, float]) -> None:
    """Early stopping's bookkeeping, then best.pt (when this epoch is the best) and last.pt.

    best.pt before last.pt: a kill between the two replays this epoch on resume, which
    rewrites the same best.pt; the other order could leave last.pt naming a best epoch
    that best.pt does not hold."""
    config, epoch = run.config, state.epoch
    so_far = state.best[config.monitor] if state.best["epoch"] > 0 else float("-inf")
    if metrics[config.monitor] > so_far + config.min_delta:
        state.best = {"epoch": epoch, **metrics, "monitor": config.monitor}
        state.bad_epochs = 0
        _save_best(run, epoch, metrics)
    else:
        state.bad_epochs += 1
    save_checkpoint(
        run.last_path,
        {
            "version": CHECKPOINT_VERSION,
            "epoch": epoch,
            "encoder": run.fingerprint["encoder"],
            "model": run.encoder.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "loss": run.loss.state_dict(),
            "rng": rng_state(),
            "history": state.history,
            "initial": state.initial,
            "best": state.best,
            "bad_epochs": state.bad_epochs,
            "config": dataclasses.asdict(config),
            "fingerprint": run.fingerprint,
        },
    )


def _save_best(run: _Run, epoch: int, metrics: dict[str, Any]) -> None:
    save_best(
        run.best_path,
        epoch,
        run.encoder,
        metrics,
        vocab=run.vocab_checksum,
        max_len=run.config.max_len,
    )


def _finish(run: _Run, state: _State, started: float) -> TrainResult:
    """The best epoch's weights back into the encoder, and what the run did."""
    config = run.config
    if run.best_path.exists():
        run.encoder.load_state_dict(load_checkpoint(run.best_path)["model"])
    # Also true when the budget ran out exactly at an epoch's end, but not when the run
    # would have stopped there anyway (max_epochs, patience).
    stopped_by_budget = any(r.get("cut_by_budget", False) for r in state.history) or (
        _budget_spent(run, state)
        and state.epoch < config.max_epochs
        and state.bad_epochs < config.patience
    )
    return TrainResult(
        best_epoch=int(state.best["epoch"]),
        best_val_auc=float(state.best["val_auc"]),
        best_val_mrr=float(state.best["val_mrr"]),
        last_epoch=state.epoch,
        stopped_early=state.bad_epochs >= config.patience,
        initial=state.initial,
        history=state.history,
        last_checkpoint=run.last_path,
        best_checkpoint=run.best_path,
        resumed_from_epoch=state.resumed_from,
        seconds=time.perf_counter() - started,
        stopped_by_budget=stopped_by_budget,
        train_pairs=run.num_pairs,
        train_classes=run.num_classes,
    )

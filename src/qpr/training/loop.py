"""The one training loop: every model family trains through `fit`.

A family is a small strategy object (`Family`): the model and its optimizer, the epoch's
batches, the loss of one batch, the validation measures. The encoder's is
qpr.training.encoder_step, the query student's qpr.training.distill, the re-ranker's
qpr.training.rerank_step. Each family's config extends LoopConfig (epochs, early stopping,
resume, device, threads, progress) and is built by its own `from_settings`. The loop does
the rest the same way for every family, in three steps: resume or start (last.pt of the
same run, or every generator seeded and the untrained model validated), epochs, and finish
(the best epoch's weights back in the model).

An epoch: the family's batches, each a forward pass and a loss (`Family.batch_loss`), a
finite check, backward, the optimizer's step (and the family's learning-rate schedule);
then validation, early stopping's bookkeeping, best.pt when the epoch is the best so far,
last.pt, and `on_epoch`. Early stopping: stop after config.patience epochs without the
validation `config.monitor` improving by more than min_delta, or at max_epochs; the best
epoch by the monitor is the one kept. Training stops by epochs and validation; the
encoder alone may also have a time budget (below).

With resume=True a run continues after the last completed epoch and ends with the same
weights as an uninterrupted one (same seed, same thread count): last.pt holds the model,
the optimizer, the family's own state (the encoder's loss, the student's batch order, the
re-ranker's warm-up) and the torch / numpy / random global states
(qpr.training.checkpoint). It also holds a fingerprint: the config's fingerprint fields,
the model's architecture and the family's digests of its data. Another run's last.pt is
refused (TrainingStateError), not continued.

The encoder's time_budget_s (TrainConfig): a limit on the summed time of the epochs
(training + validation; the untrained model's validation is not counted). When it runs
out inside an epoch, the epoch is cut before its next batch, then validated and
checkpointed like any other (its history record has cut_by_budget=True and the batches it
ran), and the run ends with stopped_by_budget=True. It can overrun by one batch plus one
validation pass. The time is stored with each epoch, so a killed run resumes with what is
left of the budget; a finished budgeted run resumed with the same settings does nothing
more. Where a cut falls depends on the machine's speed, so a budgeted run is not
reproducible to the weight. The budget is in the fingerprint: a last.pt written under
another budget is refused rather than continued.

Library code: no Prefect or MLflow here; progress goes to `on_epoch`, `on_progress` and a
tqdm bar.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from qpr.environment import math_pinned
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
from qpr.training.embed import torch_math

EpochCallback = Callable[[dict[str, Any]], None]
ProgressCallback = Callable[[dict[str, Any]], None]

# Without a progress bar (a log file, a Prefect run), a line this often inside an epoch: a
# transformer's epoch on 2 cores can run for an hour between two epoch lines.
PROGRESS_EVERY_S = 60.0
FINGERPRINT = "fingerprint"


def fingerprint_field(default: Any) -> Any:
    """A knob of the checkpoint fingerprint: a run that differs in it is another run."""
    return field(default=default, metadata={FINGERPRINT: True})


@dataclass(frozen=True)
class LoopConfig:
    """The knobs every family's run has (qpr.training.loop).

    max_epochs: at most this many epochs; patience: epochs without a gain above min_delta
    in the validation `monitor` (one of the family's MONITORS) before stopping. keep_start:
    the model as built is a candidate too (epoch 0), kept unless an epoch beats it. resume:
    continue last.pt of the same run. threads: torch intra-op threads for the run (None
    keeps torch's). progress: a tqdm bar; progress_every_s: how often on_progress hears
    inside an epoch. seed: every generator is seeded with it at a fresh start.
    """

    # The family's validation measures, each a possible `monitor`.
    MONITORS: ClassVar[tuple[str, ...]] = ()

    seed: int = fingerprint_field(0)
    max_epochs: int = 50
    patience: int = 3
    min_delta: float = 0.0
    monitor: str = ""
    # None (not False) when off: a fingerprint leaves it out, so older checkpoints resume.
    keep_start: bool | None = fingerprint_field(None)
    resume: bool = True
    device: str = "cpu"
    threads: int | None = None
    progress: bool = True
    progress_every_s: float = PROGRESS_EVERY_S

    def __post_init__(self) -> None:
        if self.max_epochs < 0 or self.patience < 1:
            raise ValueError(
                f"need max_epochs >= 0 and patience >= 1, got {self.max_epochs}, {self.patience}"
            )
        if self.monitor not in self.MONITORS:
            raise ValueError(f"monitor must be one of {self.MONITORS}, got {self.monitor!r}")

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint fields, as `dataclasses.asdict` has them. Unset ones (None) are
        left out, so checkpoints written before a knob existed still resume."""
        values = dataclasses.asdict(self)
        return {
            f.name: values[f.name]
            for f in dataclasses.fields(self)
            if f.metadata.get(FINGERPRINT) and values[f.name] is not None
        }


class Family(Protocol):
    """What the loop needs of a model family.

    unit: what `batch_loss` counts ("pairs", "questions"), for records and logs.
    scheduler: a learning-rate schedule stepped after each optimizer step, or None.
    counts: what the run trains on, for its result (e.g. {"train_pairs": P}).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    unit: str
    counts: dict[str, int]

    def fingerprint(self) -> dict[str, Any]:
        """Digests of the data and the loss: a checkpoint of other ones is another run."""
        ...

    def batches(self, epoch: int) -> Sequence[Any]:
        """The batches of `epoch` (1-based), in order."""
        ...

    def batch_loss(self, batch: Any) -> tuple[torch.Tensor, int]:
        """(the loss of `batch`, a scalar tensor to back-propagate; the items it counts)."""
        ...

    def evaluate(self) -> dict[str, float]:
        """The validation measures: one value per name in the config's MONITORS."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The family's own state a resume restores (besides model and optimizer)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def best_extras(self) -> dict[str, Any]:
        """What best.pt holds besides the weights and the metrics (e.g. the tokenizer's
        checksum)."""
        ...


@dataclass
class TrainResult:
    """What fit did. `history` has one dict per completed (or budget-cut) epoch, all of
    them, including those run before a resume; `initial` is the untrained model's
    validation (epoch 0), `best` the best epoch's; `counts` is the family's."""

    best_epoch: int
    best: dict[str, float]
    last_epoch: int
    stopped_early: bool
    initial: dict[str, float]
    history: list[dict[str, Any]]
    last_checkpoint: Path
    best_checkpoint: Path
    resumed_from_epoch: int | None = None
    seconds: float = 0.0
    stopped_by_budget: bool = False
    counts: dict[str, int] = field(default_factory=dict)


def progress_line(record: dict[str, Any]) -> str:
    """One in-epoch log line from fit's on_progress record."""
    unit = record["unit"]
    line = (
        f"epoch {record['epoch']}: {record['batches']:,} / {record['planned_batches']:,} "
        f"batches, loss {record['train_loss']:.4f}, {record[f'{unit}_per_s']:.0f} {unit}/s"
    )
    if record.get("budget_left_s") is not None:
        line += f", {record['budget_left_s']:,.0f} s of the budget left"
    return line


def epoch_line(record: dict[str, Any], unit: str) -> str:
    """One log line from fit's on_epoch record: the loss, the validation measures, speed."""
    measures = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith("val_"))
    return (
        f"epoch {record['epoch']}: loss {record['train_loss']:.4f}, {measures}, "
        f"{record[f'{unit}_per_s']:.0f} {unit}/s"
    )


# --------------------------------------------------------------------------------------
# The run: resume or start → epochs → finish
# --------------------------------------------------------------------------------------


def fit(
    family: Family,
    config: LoopConfig,
    out_dir: str | os.PathLike[str],
    *,
    on_epoch: EpochCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> TrainResult:
    """Train `family.model` in place; on return it holds the best epoch's weights (eval
    mode). Checkpoints go to out_dir/checkpoints (last.pt, best.pt).

    on_epoch gets the epoch's record {epoch, train_loss, the validation measures,
    <unit>_per_s, seconds, batches, ...} after its checkpoints are on disk (an exception
    there leaves a resumable run). on_progress gets {epoch, batches, planned_batches, unit,
    <unit>, train_loss, <unit>_per_s, seconds, budget_left_s} inside an epoch, at most
    every config.progress_every_s seconds: the bar's figures for a log.
    Seed before building the model (seed_everything) for reproducible initial weights.
    """
    started = time.perf_counter()
    with torch_math(config.threads):
        run = _Run.prepare(family, config, Path(out_dir))
        state = _resume_or_start(run)
        while _goes_on(run, state):
            _run_epoch(run, state, on_epoch, on_progress)
        return _finish(run, state, started)


C = TypeVar("C", bound="LoopConfig")
R = TypeVar("R")


def train_or_restart(train: Callable[[C], R], config: C, log: Callable[[str], None] = print) -> R:
    """train(config), resuming its last.pt when config.resume; a checkpoint of another run
    (TrainingStateError) is logged and training starts afresh (resume=False)."""
    try:
        return train(config)
    except TrainingStateError as err:
        log(f"not resuming: {err}; training from scratch")
        return train(dataclasses.replace(config, resume=False))


@dataclass
class _Run:
    """What a run sets up once: its family, config, fingerprint and files."""

    family: Family
    config: LoopConfig
    fingerprint: dict[str, Any]
    last_path: Path
    best_path: Path

    @classmethod
    def prepare(cls, family: Family, config: LoopConfig, out_dir: Path) -> _Run:
        ckpt_dir = out_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_dir.glob(".*.tmp"):  # left by a run killed while saving
            stale.unlink(missing_ok=True)
        fingerprint = {
            **config.fingerprint(),
            "encoder": encoder_info(family.model),
            **family.fingerprint(),
            # Epochs run on another code path round otherwise: resuming them would give a
            # model that neither pinned nor native math gives (qpr.environment.pin_math).
            "math": "pinned" if math_pinned() else "native",
        }
        return cls(family, config, fingerprint, ckpt_dir / "last.pt", ckpt_dir / "best.pt")

    @property
    def budget_s(self) -> float | None:
        # The encoder's TrainConfig only: the other families train by epochs alone.
        return getattr(self.config, "time_budget_s", None)


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


def _resume_or_start(run: _Run) -> _State:
    """last.pt's state when config.resume and it is this run's; else a fresh start: old
    checkpoints removed, everything seeded, the untrained model evaluated."""
    config = run.config
    if config.resume and run.last_path.exists():
        state = _resume(run)
    else:
        # A stale best.pt from an earlier run must not survive into this one.
        run.best_path.unlink(missing_ok=True)
        run.last_path.unlink(missing_ok=True)
        seed_everything(config.seed)
        initial = _measures(run, run.family.evaluate())
        best = {"epoch": 0, **{name: float("nan") for name in config.MONITORS}}
        if config.max_epochs == 0 or config.keep_start:
            # No training asked for, or the start is a candidate: the model as built (a
            # pretrained one as packaged) is kept as epoch 0 until an epoch beats it.
            best = {"epoch": 0, **initial}
            _save_best(run, 0, initial)
        state = _State(epoch=0, history=[], initial=initial, best=best, bad_epochs=0)
    state.best["monitor"] = config.monitor
    return state


def _measures(run: _Run, metrics: dict[str, float]) -> dict[str, float]:
    """The family's validation measures, in the order of the config's MONITORS."""
    return {name: metrics[name] for name in run.config.MONITORS}


def _resume(run: _Run) -> _State:
    saved = load_checkpoint(run.last_path)
    check_resumable(run.last_path, saved, run.fingerprint)
    if int(saved["epoch"]) > run.config.max_epochs:
        # A shorter run (`dvc exp run -S train.max_epochs=2` after a 10-epoch run) must not
        # keep the longer run's weights: its epochs past max_epochs cannot be undone.
        raise TrainingStateError(
            f"{run.last_path} holds epoch {saved['epoch']}, past max_epochs {run.config.max_epochs}"
        )
    family = run.family
    family.model.load_state_dict(saved["model"])
    family.optimizer.load_state_dict(saved["optimizer"])
    family.load_state_dict(saved["step"])
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
    if state.best.get("monitor") != monitor and state.history:
        state.best, state.bad_epochs = _best_under(run, state.best, state.history)
        if state.best["epoch"] == state.epoch:  # the last epoch is the new best: its weights
            _save_best(run, state.epoch, state.best)
    return state


def _best_under(
    run: _Run, best: dict[str, Any], history: list[dict[str, Any]]
) -> tuple[dict[str, Any], int]:
    """(best, bad_epochs) of a resumed run under another monitor: the better, by the
    monitor, of the two epochs whose weights exist (best.pt's and the last epoch's);
    bad_epochs = epochs since it (the patience count)."""
    monitor = run.config.monitor
    last = history[-1]
    kept = next((r for r in history if r["epoch"] == best["epoch"]), None)
    chosen = last if kept is None or last[monitor] > kept[monitor] else kept
    record = {"epoch": chosen["epoch"], **_measures(run, chosen)}
    return {**record, "monitor": monitor}, int(last["epoch"] - chosen["epoch"])


def _budget_spent(run: _Run, state: _State) -> bool:
    return run.budget_s is not None and state.seconds >= run.budget_s


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
    config, unit = run.config, run.family.unit
    state.epoch += 1
    epoch = state.epoch
    t0 = time.perf_counter()
    deadline = None if run.budget_s is None else t0 + run.budget_s - state.seconds
    batches = run.family.batches(epoch)
    with tqdm(
        total=len(batches),
        desc=f"epoch {epoch}/{config.max_epochs}",
        unit="batch",
        disable=not config.progress,
        leave=False,
    ) as bar:
        loss_sum, seen, batches_run = train_pass(
            run.family,
            batches,
            epoch=epoch,
            bar=bar,
            deadline=deadline,
            on_progress=on_progress,
            progress_every_s=config.progress_every_s,
        )
    train_seconds = time.perf_counter() - t0
    metrics = _measures(run, run.family.evaluate())
    record = {
        "epoch": epoch,
        "train_loss": loss_sum / max(seen, 1),
        **metrics,
        f"{unit}_per_s": seen / max(train_seconds, 1e-9),
        "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
        "batches": batches_run,
        "planned_batches": len(batches),
        unit: seen,
        "cut_by_budget": batches_run < len(batches),
    }
    state.history.append(record)
    _checkpoint_epoch(run, state, metrics)
    if on_epoch is not None:
        on_epoch(dict(record))


def train_pass(
    family: Family,
    batches: Sequence[Any],
    *,
    epoch: int,
    bar: tqdm,
    deadline: float | None = None,
    on_progress: ProgressCallback | None = None,
    progress_every_s: float = float("inf"),
) -> tuple[float, int, int]:
    """One pass over `batches`, or up to `deadline` (a time.perf_counter() value, checked
    before each batch but the first); returns (sum of loss × items, items seen, batches
    run). on_progress gets the bar's figures at most every `progress_every_s`."""
    family.model.train()
    loss_sum, seen, done = 0.0, 0, 0
    t0 = last_report = time.perf_counter()
    for batch in batches:
        if done and deadline is not None and time.perf_counter() >= deadline:
            break
        value, n = family.batch_loss(batch)
        batch_loss = value.detach().item()
        if not np.isfinite(batch_loss):
            raise FloatingPointError(f"loss is {batch_loss} at epoch {epoch}")
        family.optimizer.zero_grad(set_to_none=True)
        value.backward()
        family.optimizer.step()
        if family.scheduler is not None:
            family.scheduler.step()
        loss_sum += batch_loss * n
        seen += n
        done += 1
        now = time.perf_counter()
        rate = seen / max(now - t0, 1e-9)
        left = None if deadline is None else max(deadline - now, 0.0)
        bar.update(1)
        postfix = {"loss": f"{loss_sum / seen:.4f}", f"{family.unit}_s": f"{rate:.0f}"}
        if left is not None:
            postfix["budget_left"] = f"{left:.0f}s"
        bar.set_postfix(postfix, refresh=False)
        if on_progress is not None and now - last_report >= progress_every_s:
            last_report = now
            on_progress(
                {
                    "epoch": epoch,
                    "batches": done,
                    "planned_batches": len(batches),
                    "unit": family.unit,
                    family.unit: seen,
                    "train_loss": loss_sum / seen,
                    f"{family.unit}_per_s": rate,
                    "seconds": now - t0,
                    "budget_left_s": left,
                }
            )
    return loss_sum, seen, done


def _checkpoint_epoch(run: _Run, state: _State, metrics: dict[str, float]) -> None:
    """Early stopping's bookkeeping, then best.pt (when this epoch is the best) and last.pt.

    best.pt before last.pt: a kill between the two replays this epoch on resume, which
    rewrites the same best.pt; the other order could leave last.pt naming a best epoch
    that best.pt does not hold."""
    config, epoch, family = run.config, state.epoch, run.family
    started = state.best["epoch"] > 0 or config.keep_start
    so_far = state.best[config.monitor] if started else float("-inf")
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
            "model": family.model.state_dict(),
            "optimizer": family.optimizer.state_dict(),
            "step": family.state_dict(),
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
        run.family.model,
        _measures(run, metrics),
        run.family.best_extras(),
    )


def _finish(run: _Run, state: _State, started: float) -> TrainResult:
    """The best epoch's weights back into the model, and what the run did."""
    config, model = run.config, run.family.model
    if run.best_path.exists():
        model.load_state_dict(load_checkpoint(run.best_path)["model"])
    model.eval()
    # Also true when the budget ran out exactly at an epoch's end, but not when the run
    # would have stopped there anyway (max_epochs, patience).
    stopped_by_budget = any(r.get("cut_by_budget", False) for r in state.history) or (
        _budget_spent(run, state)
        and state.epoch < config.max_epochs
        and state.bad_epochs < config.patience
    )
    return TrainResult(
        best_epoch=int(state.best["epoch"]),
        best=_measures(run, state.best),
        last_epoch=state.epoch,
        stopped_early=state.bad_epochs >= config.patience,
        initial=state.initial,
        history=state.history,
        last_checkpoint=run.last_path,
        best_checkpoint=run.best_path,
        resumed_from_epoch=state.resumed_from,
        seconds=time.perf_counter() - started,
        stopped_by_budget=stopped_by_budget,
        counts=dict(run.family.counts),
    )

"""One TrainConfig: every knob of a training run, built once from the settings.

The fields marked `fingerprint` are what a checkpoint must share with a run that continues
it (lr, batch size, max_len, seed, the pair subset, the time budget): `fingerprint()` is
their `dataclasses.asdict`, stored in last.pt and compared on resume. The others may change
between a run and its resume (more epochs, another patience or monitor, another device or
thread count, progress reporting).

Named train_config.py, not config.py: module file names are unique in the package, and
qpr/config.py is the settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qpr.config import Settings

MONITORS = ("val_auc", "val_mrr")
# Without a progress bar (a log file, a Prefect run), a line this often inside an epoch: a
# transformer's epoch on 2 cores can run for an hour between two epoch lines.
PROGRESS_EVERY_S = 60.0
FINGERPRINT = "fingerprint"


def _key(default: Any) -> Any:
    """A knob of the checkpoint fingerprint: a run that differs in it is another run."""
    return field(default=default, metadata={FINGERPRINT: True})


@dataclass(frozen=True)
class TrainConfig:
    """The knobs of train_encoder (qpr.training.loop).

    monitor: early stopping and the epoch kept, "val_auc" or "val_mrr"; patience: epochs
    without a gain above min_delta before stopping. threads: torch intra-op threads for the
    run (None keeps torch's). max_pairs: train on a seeded subset of this many pairs;
    time_budget_s: stop when the epochs have taken this long (qpr.training.loop).
    progress: a tqdm bar; progress_every_s: how often on_progress hears inside an epoch.
    """

    lr: float = _key(1e-3)
    batch_size: int = _key(512)
    max_len: int = _key(64)
    seed: int = _key(0)
    max_pairs: int | None = _key(None)
    time_budget_s: float | None = _key(None)
    max_epochs: int = 50
    patience: int = 3
    min_delta: float = 0.0
    monitor: str = "val_auc"
    resume: bool = True
    device: str = "cpu"
    threads: int | None = None
    eval_batch_size: int = 1024
    progress: bool = True
    progress_every_s: float = PROGRESS_EVERY_S

    def __post_init__(self) -> None:
        if self.max_epochs < 0 or self.patience < 1:
            raise ValueError(
                f"need max_epochs >= 0 and patience >= 1, got {self.max_epochs}, {self.patience}"
            )
        if self.monitor not in MONITORS:
            raise ValueError(f"monitor must be one of {MONITORS}, got {self.monitor!r}")
        if self.max_pairs is not None and self.max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1 or None, got {self.max_pairs}")
        if self.time_budget_s is not None:
            if not self.time_budget_s > 0:
                raise ValueError(f"time_budget_s must be > 0 or None, got {self.time_budget_s}")
            object.__setattr__(self, "time_budget_s", float(self.time_budget_s))

    @classmethod
    def from_settings(cls, settings: Settings, *, progress: bool = True) -> TrainConfig:
        """The run params.yaml describes: train.*, seed, the encoder's max_len, and
        train.device resolved to the machine's ("auto": the GPU when torch sees one)."""
        from qpr.training.build import encoder_max_len

        train = settings.train
        return cls(
            lr=train.lr,
            batch_size=train.batch_size,
            max_len=encoder_max_len(settings),
            seed=settings.seed,
            max_pairs=train.max_pairs,
            time_budget_s=train.time_budget_s,
            max_epochs=train.max_epochs,
            patience=train.patience,
            monitor=train.monitor,
            device=resolve_device(train.device),
            threads=train.threads,
            progress=progress,
            # Read here, not frozen into the class: a test sets the module's value.
            progress_every_s=PROGRESS_EVERY_S,
        )

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint fields, as `dataclasses.asdict` has them. Unset ones (None) are
        left out, so checkpoints written before a knob existed still resume."""
        values = dataclasses.asdict(self)
        return {
            f.name: values[f.name]
            for f in dataclasses.fields(self)
            if f.metadata.get(FINGERPRINT) and values[f.name] is not None
        }


def resolve_device(name: str) -> str:
    """ "cpu" or "cuda" for train.device: "auto" takes the GPU when torch sees one. Asking
    for "cuda" without one is an error, not a silent fall back to hours on the CPU."""
    import torch

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

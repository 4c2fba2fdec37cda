"""One TrainConfig: every knob of an encoder's training run, built once from the settings.

It extends the one loop's LoopConfig (qpr.training.loop: epochs, early stopping, resume,
device, threads, progress), as StudentConfig (qpr.training.distill) and RerankConfig
(qpr.training.rerank_step) do for the other families. The fields marked `fingerprint` are
what a checkpoint must share with a run that continues it (lr, batch size, max_len, seed,
the pair subset, the time budget); the others may change between a run and its resume
(more epochs, another patience or monitor, another device or thread count, progress).

Named train_config.py, not config.py: module file names are unique in the package, and
qpr/config.py is the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from qpr.training.loop import PROGRESS_EVERY_S, LoopConfig, fingerprint_field

if TYPE_CHECKING:
    from qpr.config import Settings


@dataclass(frozen=True)
class TrainConfig(LoopConfig):
    """The encoder's run (qpr.training.encoder_step.train_encoder).

    monitor: "val_auc" (ROC AUC of paraphrase vs other pairs) or "val_mrr" (the retrieval
    MRR). max_pairs: train on a seeded subset of this many pairs; time_budget_s: stop when
    the epochs have taken this long (qpr.training.loop; the encoder's only: the student
    and the re-ranker stop by epochs and validation alone).
    """

    MONITORS: ClassVar[tuple[str, ...]] = ("val_auc", "val_mrr")

    lr: float = fingerprint_field(1e-3)
    batch_size: int = fingerprint_field(512)
    max_len: int = fingerprint_field(64)
    max_pairs: int | None = fingerprint_field(None)
    time_budget_s: float | None = fingerprint_field(None)
    monitor: str = "val_auc"
    eval_batch_size: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
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

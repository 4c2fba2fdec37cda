"""Where a retraining run reads, writes and keeps its state, the lock that lets one run at
a time work there, and the errors a run stops with. Every other retraining module takes a
`RetrainLayout`, so the paths are resolved and checked once.
"""

from __future__ import annotations

import fcntl
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from qpr.config import Settings
from qpr.errors import QPRError

LEDGER_FILE = "processed.jsonl"
JOURNAL_FILE = "journal.json"
LOCK_FILE = "lock"
SNAPSHOT_DIR = "snapshot"
ACTIVE_RUN_FILE = "active_run.json"


class RetrainError(QPRError, RuntimeError):
    """A retraining run cannot go on; the message says why and what to do."""


class RetrainBusy(RetrainError):
    """Another retraining run holds the lock."""


def utc_stamp(now: datetime | None = None) -> str:
    """A sortable, file-name-safe UTC time stamp: 20261015T030000Z."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S%fZ")[:-7] + "Z"


@dataclass(frozen=True)
class RetrainLayout:
    """Where a retraining run reads, writes and keeps its state (absolute paths)."""

    root: Path  # the project (params.yaml, data.dvc, dvc.yaml)
    incoming: Path  # fresh log files land here
    quarantine: Path  # rejected files, each with its validation report
    archive: Path  # merged (or already known) incoming files, by run
    state_dir: Path  # journal, lock, ledger, snapshots, run summaries
    data_dir: Path  # the DVC-tracked directory (data/)
    logs_dir: Path  # the daily log files inside it (data.path)

    @property
    def dvc_file(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".dvc")

    @property
    def dvc_lock(self) -> Path:
        return self.root / "dvc.lock"

    @property
    def journal(self) -> Path:
        return self.state_dir / JOURNAL_FILE

    @property
    def active_run(self) -> Path:
        """The tracking run of the cycle in progress, written as soon as that run exists:
        a cycle killed even before its journal leaves it for the next start to close."""
        return self.state_dir / ACTIVE_RUN_FILE

    @property
    def snapshot(self) -> Path:
        return self.state_dir / SNAPSHOT_DIR

    @property
    def ledger(self) -> Path:
        return self.state_dir / LEDGER_FILE

    @property
    def lock(self) -> Path:
        return self.state_dir / LOCK_FILE

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    @classmethod
    def from_settings(cls, settings: Settings, root: Path) -> RetrainLayout:
        """The layout the `retrain:` and `data:` settings describe; retraining merges QA
        logs, so any other data source is refused."""
        if settings.data.source != "logs":
            raise RetrainError(
                f"retraining merges QA logs; data.source is {settings.data.source!r}"
            )
        cfg = settings.retrain
        return cls.build(
            root,
            incoming=cfg.incoming,
            quarantine=cfg.quarantine,
            archive=cfg.archive,
            state_dir=cfg.state_dir,
            logs_path=settings.data.path,
        )

    @classmethod
    def build(
        cls,
        root: Path,
        *,
        incoming: Path,
        quarantine: Path,
        archive: Path,
        state_dir: Path,
        logs_path: Path,
    ) -> RetrainLayout:
        """Resolve the configured paths against the project root and check that the logs
        live inside one DVC-tracked directory of the project (data/ by default)."""
        root = Path(root).resolve()

        def absolute(path: Path) -> Path:
            return (path if path.is_absolute() else root / path).resolve()

        logs_dir = absolute(logs_path)
        try:
            relative = logs_dir.relative_to(root)
        except ValueError:
            raise RetrainError(
                f"data.path {logs_path} is outside the project {root}: retraining merges "
                "into the DVC-tracked data/ of the project"
            ) from None
        if not relative.parts:
            raise RetrainError("data.path must be a directory inside data/, not the project")
        data_dir = root / relative.parts[0]
        layout = cls(
            root=root,
            incoming=absolute(incoming),
            quarantine=absolute(quarantine),
            archive=absolute(archive),
            state_dir=absolute(state_dir),
            data_dir=data_dir,
            logs_dir=logs_dir,
        )
        if not layout.dvc_file.is_file():
            raise RetrainError(
                f"{layout.dvc_file} not found: data/ must be versioned with DVC first "
                f"(`qpr data ensure`, or `dvc add {data_dir.name}`)"
            )
        for name in ("incoming", "quarantine", "archive"):
            path = getattr(layout, name)
            if path == data_dir or data_dir in path.parents:
                raise RetrainError(f"retrain.{name} ({path}) must not be inside {data_dir}")
        return layout


class RetrainLock:
    """An exclusive lock on ``<state_dir>/lock``: one retraining run at a time per project.

    flock is released by the kernel when the holder dies, however it dies, so a killed run
    never leaves a stale lock; what it leaves is the journal, which the next holder reads.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def __enter__(self) -> RetrainLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.path.read_text(encoding="utf-8").strip() or "unknown"
            raise RetrainBusy(
                f"another retraining run holds {self.path} ({holder}); try again later"
            ) from None
        os.ftruncate(fd, 0)
        since = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

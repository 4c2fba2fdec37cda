"""One writer at a time per models folder: the lock every writer of a bundle and its
deltas holds (add, delete, drop, compact, the index stage's swap, publishing).

The lock is `fcntl.flock` on `<models>/.writer.lock` (`qpr.artifacts.WRITER_LOCK_FILE`).
The kernel releases it when its holder dies, however it dies: a killed writer never
leaves a stale lock. The holder writes its pid, command and start time into the file, so
a writer that waits too long says who holds it. Readers (a bundle load, a search) never
take it: a manifest's rename is their commit point.

The lock is re-entrant within one thread (an add takes it, then `manifest_update` inside
takes it again) and excludes other threads of the same process as it excludes processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from qpr.artifacts import WRITER_LOCK_FILE
from qpr.errors import QPRError

__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "WAIT_ENV",
    "WriterBusy",
    "holds_lock",
    "wait_seconds",
    "writer_lock",
]

# How long a writer waits for another to finish before it gives up.
WAIT_ENV = "QPR_WRITER_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 60.0
_POLL_SECONDS = 0.05

# Lock paths this thread holds, with their depth: flock alone would deadlock a thread
# that takes the lock it already holds (each open() is a new lock owner).
_held = threading.local()


class WriterBusy(QPRError, RuntimeError):
    """Another writer held the models folder's lock for the whole wait."""


def wait_seconds(wait: float | None = None) -> float:
    """`wait`, or QPR_WRITER_WAIT_SECONDS, or the default (60 s). ValueError for a bad one."""
    if wait is not None:
        return max(float(wait), 0.0)
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_SECONDS
    try:
        return max(float(raw), 0.0)
    except ValueError:
        raise ValueError(f"{WAIT_ENV}={raw!r}: not a number of seconds") from None


def _depths() -> dict[str, int]:
    if not hasattr(_held, "depths"):
        _held.depths = {}
    return _held.depths


def _lock_path(models_dir: str | os.PathLike[str]) -> Path:
    return Path(models_dir).resolve() / WRITER_LOCK_FILE


def holds_lock(models_dir: str | os.PathLike[str]) -> bool:
    """Whether this thread holds the writer lock of `models_dir`."""
    return _depths().get(str(_lock_path(models_dir)), 0) > 0


@contextmanager
def writer_lock(models_dir: str | os.PathLike[str], *, wait: float | None = None) -> Iterator[Path]:
    """Hold the writer lock of `models_dir` for the block (created with the folder when
    missing). Waits up to `wait` seconds (None: `wait_seconds()`) for another holder, then
    raises WriterBusy naming it. Yields the lock file's path."""
    path = _lock_path(models_dir)
    key = str(path)
    depths = _depths()
    if depths.get(key, 0) > 0:  # this thread holds it already
        depths[key] += 1
        try:
            yield path
        finally:
            depths[key] -= 1
        return
    fd = _acquire(path, wait_seconds(wait))
    depths[key] = 1
    try:
        yield path
    finally:
        depths.pop(key, None)
        # The holder's note goes first: once unlocked, the next holder writes its own.
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _acquire(path: Path, wait: float) -> int:
    """An open descriptor of `path` holding its exclusive flock, with the holder's note."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise WriterBusy(_busy_message(path, wait)) from None
            time.sleep(_POLL_SECONDS)
    note = {
        "pid": os.getpid(),
        "command": " ".join(sys.argv)[:300] or sys.executable,
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "thread": threading.current_thread().name,
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(note) + "\n").encode(), 0)
    return fd


def _busy_message(path: Path, wait: float) -> str:
    """busy: <models> is being written by pid N (command) since T; what to do."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
        holder = f"pid {note['pid']} ({note['command']}) since {note['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        # Its holder has not written its note yet, or is a thread of this process.
        holder = "another writer"
    return (
        f"busy: {path.parent} is being written by {holder}; waited {wait:g} s "
        f"({WAIT_ENV} sets the wait): try again when it is done"
    )

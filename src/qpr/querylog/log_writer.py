"""`QueryLog`: appends served queries and feedback to rotating files, off the request path.

A search calls `QueryLog.queries` (feedback: `QueryLog.feedback`). That call decides the
sample, puts one event holding references into a bounded in-memory queue and returns; it
never touches a file, formats JSON or takes longer when the disk is slow. One background
thread drains the queue every ``flush_seconds``: it formats and redacts the lines
(`qpr.querylog.log_records`), a few at a time between yields of the GIL, and appends them
to the stream's open file.

Losing lines is allowed and counted, slowing or failing a search is not:

- queue full (the writer is behind): the event is dropped at once, ``queue_full``;
- a write that fails (full disk, file-size limit, folder gone or not writable): the lines
  of that write are dropped, ``write_error``, and the file is cut back to its last whole
  line; the next write tries again (a new file if the old one cannot be used);
- sampled out: ``sampled_out``. The sample is decided from the request id, so a search
  and its feedback are both in the log or both out.

Counts are in `QueryLog.counts` ((stream, outcome) → lines); errors go to the given
logger, one line per failure (the service passes its rate-limited one).

Files (one writer per folder; a second one of another process is told apart by its id
and its lock): lines are written whole, each write ends at a newline, and a file is
closed by renaming ``<name>.jsonl.part`` to ``<name>.jsonl``. So a reader that takes the
closed files, and the open one up to its last newline, never sees half a line. A file is
closed when the next write would pass ``file_bytes``, when it is ``rotate_seconds`` old,
and at `close`; then the oldest closed files are deleted while the folder holds more than
``total_bytes``. A ``.part`` file left by a process that died is cut to its last newline
and closed when the next writer starts (unless a live writer holds its lock).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import queue
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qpr.querylog.log_records import (
    FEEDBACK,
    OPEN_SUFFIX,
    OUTCOMES,
    QUERIES,
    STREAMS,
    SUFFIX,
    FeedbackEvent,
    QueryEvent,
)

if TYPE_CHECKING:
    from qpr.retrieval.bundle import SearchResult

__all__ = ["LogLimits", "QueryLog"]

# Events the writer takes from the queue for one write per stream.
_BATCH = 512
# Events formatted between two yields of the GIL: a search waiting for it waits for at
# most this many lines (about 20 µs each), not for a whole batch.
_CHUNK = 16
_SAMPLE_SCALE = 1 << 32  # crc32's range


@dataclass(frozen=True)
class LogLimits:
    """How much is logged and kept. `sample`: the share of requests logged (0 to 1);
    `file_bytes`: a file is closed before it would pass this; `total_bytes`: the folder's
    bound (at least two files: each stream has one open); `rotate_seconds`: a file is
    closed at this age; `queue_events`: requests waiting for the writer, past which
    new ones are dropped; `flush_seconds`: how often the writer wakes to write what was
    queued (woken at each search instead, it would vie with the searches for the GIL)."""

    sample: float = 1.0
    file_bytes: int = 64 * 2**20
    total_bytes: int = 2**30
    rotate_seconds: float = 3600.0
    queue_events: int = 10_000
    flush_seconds: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample <= 1.0:
            raise ValueError(f"sample must be between 0 and 1, got {self.sample}")
        if self.file_bytes < 1024:
            raise ValueError(f"file_bytes must be >= 1024, got {self.file_bytes}")
        if self.total_bytes < 2 * self.file_bytes:
            raise ValueError(
                f"total_bytes ({self.total_bytes}) must be at least twice file_bytes "
                f"({self.file_bytes}): each stream keeps one file open"
            )
        if not self.rotate_seconds > 0:
            raise ValueError(f"rotate_seconds must be > 0, got {self.rotate_seconds}")
        if self.queue_events < 1:
            raise ValueError(f"queue_events must be >= 1, got {self.queue_events}")
        if not 0 < self.flush_seconds <= 60:
            raise ValueError(f"flush_seconds must be in (0, 60], got {self.flush_seconds}")


class QueryLog:
    """The writer of one log folder. `start` it, call `queries` / `feedback`, `close` it
    (a context manager does both)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        limits: LogLimits | None = None,
        *,
        log: logging.Logger | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.limits = limits or LogLimits()
        self._log = log or logging.getLogger("qpr.querylog")
        self._queue: queue.Queue[Any] = queue.Queue(self.limits.queue_events)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._counts_lock = threading.Lock()
        self._accepting = True
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._threshold = int(self.limits.sample * _SAMPLE_SCALE)
        self._writer_id = uuid.uuid4().hex[:8]
        self._files = _Files(self.folder, self.limits, self._writer_id)
        self._reported_full = 0

    # ------------------------------------------------------------ the request side

    def sampled(self, request_id: str) -> bool:
        """Whether requests with this id are logged: a hash of the id against `sample`."""
        if self._threshold >= _SAMPLE_SCALE:
            return True
        return zlib.crc32(request_id.encode("utf-8", "replace")) < self._threshold

    def queries(
        self,
        request_id: str,
        results: Sequence[SearchResult],
        *,
        endpoint: str,
        model: Mapping[str, Any],
        k: int,
        threshold: float | None,
        latency_ms: float,
    ) -> str | None:
        """Queue one request's questions (one line each). None when queued, else why not:
        "sampled out", "queue full" or "closed". Never blocks, never raises."""
        event = QueryEvent(
            time.time(), request_id, endpoint, results, model, k, threshold, latency_ms
        )
        return self._offer(event)

    def feedback(
        self,
        request_id: str,
        outcome: str,
        *,
        position: int = 0,
        answer_id: str | None = None,
        feedback_id: str | None = None,
    ) -> str | None:
        """Queue a verdict on question `position` of request `request_id`: "taken" or
        "rejected", and `answer_id` when the right answer is known. None when queued, else
        why not (as `queries`). ValueError for an unknown outcome."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        event = FeedbackEvent(time.time(), request_id, position, outcome, answer_id, feedback_id)
        return self._offer(event)

    def _offer(self, event: QueryEvent | FeedbackEvent) -> str | None:
        lines = event.size
        if not self.sampled(event.request_id):
            self._count(event.stream, "sampled_out", lines)
            return "sampled out"
        if not self._accepting:
            self._count(event.stream, "closed", lines)
            return "closed"
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._count(event.stream, "queue_full", lines)
            return "queue full"
        return None

    def _count(self, stream: str, outcome: str, lines: int) -> None:
        with self._counts_lock:
            self._counts[stream, outcome] += lines

    def counts(self) -> dict[tuple[str, str], int]:
        """Lines by (stream, outcome): written, sampled_out, queue_full, write_error,
        closed (offered after `close`)."""
        with self._counts_lock:
            return dict(self._counts)

    def waiting(self) -> int:
        """Requests in the queue, not yet written."""
        return self._queue.qsize()

    # ------------------------------------------------------------ the writer side

    def start(self) -> QueryLog:
        """Start the writer thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="qpr-query-log", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking events, write what is queued, close the open files. Waits at most
        `timeout` seconds for the writer (a hung disk must not hold a shutdown)."""
        self._accepting = False
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._log.error(
                "query log: the writer did not finish in %.0f s; %d requests not written",
                timeout,
                self.waiting(),
            )

    def __enter__(self) -> QueryLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        self._guard(self._files.recover, "recovering the files an earlier writer left")
        while True:
            # Woken by the clock, not by each event: one pass writes what a period queued.
            stopping = self._stopping.wait(self.limits.flush_seconds)
            while events := self._drain(_BATCH):
                self._guard(functools.partial(self._write, events), "a write")
            self._guard(self._files.rotate_aged, "closing an aged file")
            self._report_drops()
            if stopping:
                break
        self._guard(self._files.close_all, "closing the open files")

    def _drain(self, most: int) -> list[Any]:
        taken: list[Any] = []
        while len(taken) < most:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def _write(self, events: list[QueryEvent | FeedbackEvent]) -> None:
        by_stream: dict[str, list[bytes]] = {QUERIES: [], FEEDBACK: []}
        for number, event in enumerate(events, 1):
            if number % _CHUNK == 0:
                time.sleep(0)  # let a search take the GIL
            try:
                by_stream[event.stream].extend(event.lines())
            except (ValueError, TypeError, AttributeError) as exc:  # a record JSON cannot hold
                self._count(event.stream, "write_error", event.size)
                self._log.error("query log: a %s record could not be made: %s", event.stream, exc)
        for stream in STREAMS:
            lines = by_stream[stream]
            if not lines:
                continue
            written, error = self._files.append(stream, lines)
            if written:
                self._count(stream, "written", written)
            if error is not None:
                self._count(stream, "write_error", len(lines) - written)
                self._log.warning(
                    "query log: %d lines of the %s stream dropped, cannot write to %s: %s",
                    len(lines) - written,
                    stream,
                    self.folder,
                    error.strerror or error,
                )

    def _report_drops(self) -> None:
        """Queue-full drops are counted on the request path and logged here, once a pass."""
        with self._counts_lock:
            full = self._counts[QUERIES, "queue_full"] + self._counts[FEEDBACK, "queue_full"]
        if full > self._reported_full:
            self._log.warning(
                "query log: %d lines dropped, the queue (%d requests) was full",
                full - self._reported_full,
                self.limits.queue_events,
            )
            self._reported_full = full

    def _guard(self, step: Callable[[], None], what: str) -> None:
        """Run a step of the writer; a failure is logged, and the writer goes on."""
        try:
            step()
        except Exception as exc:  # the thread must outlive any one failure
            self._log.warning("query log: %s in %s failed: %s", what, self.folder, exc)


class _Files:
    """The open file of each stream and the folder's closed files (writer thread only)."""

    def __init__(self, folder: Path, limits: LogLimits, writer_id: str) -> None:
        self.folder = folder
        self.limits = limits
        self.writer_id = writer_id
        self._open: dict[str, _OpenFile] = {}
        self._closed: list[tuple[str, Path, int]] = []  # (name, path, size), oldest first
        self._sequence = 0

    def recover(self) -> None:
        """Close the .part files a dead writer left (cut to the last newline), then bound
        the folder."""
        for stream in STREAMS:
            directory = self.folder / stream
            if not directory.is_dir():
                continue
            for path in sorted(directory.glob(f"*{SUFFIX}{OPEN_SUFFIX}")):
                _close_abandoned(path)
        self._scan()
        self._evict()

    def append(self, stream: str, lines: list[bytes]) -> tuple[int, OSError | None]:
        """Append whole lines, closing a file before it would pass file_bytes (a line
        longer than that gets a file of its own). The lines written, and the error that
        stopped the rest, if one did."""
        written = 0
        try:
            while written < len(lines):
                current = self._open.get(stream)
                take = _fitting(
                    lines, written, self.limits.file_bytes - (current.size if current else 0)
                )
                if take == 0 and current is not None and current.size:
                    self._rotate(stream)
                    continue
                take = max(take, 1)
                if current is None:
                    current = self._open[stream] = self._new_file(stream)
                self._write_to(stream, current, b"".join(lines[written : written + take]))
                written += take
        except OSError as exc:
            return written, exc
        finally:
            self._evict()
        return written, None

    def _write_to(self, stream: str, current: _OpenFile, data: bytes) -> None:
        try:
            current.write(data)
        except OSError:
            # The next write goes to a new file: a file-size limit is per file, and a file
            # that could not be cut back to a newline must not be appended to.
            self._open.pop(stream, None)
            if current.broken:
                current.abandon()
            else:
                with contextlib.suppress(OSError):
                    self._closed_file(current)
            raise

    def rotate_aged(self) -> None:
        now = time.monotonic()
        for stream, current in list(self._open.items()):
            if now - current.opened >= self.limits.rotate_seconds:
                self._rotate(stream)
        self._evict()

    def close_all(self) -> None:
        for stream in list(self._open):
            self._rotate(stream)
        self._evict()

    def _new_file(self, stream: str) -> _OpenFile:
        directory = self.folder / stream
        directory.mkdir(parents=True, exist_ok=True)
        self._sequence += 1
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}Z"
        name = f"{stream}-{stamp}-{self.writer_id}-{self._sequence:06d}{SUFFIX}"
        return _OpenFile(directory / name)

    def _rotate(self, stream: str) -> None:
        current = self._open.pop(stream, None)
        if current is not None:
            self._closed_file(current)

    def _closed_file(self, current: _OpenFile) -> None:
        closed = current.finish()
        if closed is not None:
            self._closed.append((closed.name, closed, current.size))

    def _scan(self) -> None:
        found = []
        for stream in STREAMS:
            directory = self.folder / stream
            if directory.is_dir():
                for path in directory.glob(f"*{SUFFIX}"):
                    with contextlib.suppress(OSError):
                        found.append((path.name, path, path.stat().st_size))
        self._closed = sorted(found, key=lambda entry: _age_key(entry[0]))

    def _evict(self) -> None:
        """Delete the oldest closed files while the folder holds more than total_bytes."""
        total = sum(size for _, _, size in self._closed)
        total += sum(f.size for f in self._open.values())
        if total <= self.limits.total_bytes:
            return
        self._closed.sort(key=lambda entry: _age_key(entry[0]))
        while self._closed and total > self.limits.total_bytes:
            _, path, size = self._closed.pop(0)
            with contextlib.suppress(OSError):  # gone already, or not ours to delete
                path.unlink()
            total -= size


def _fitting(lines: list[bytes], start: int, room: int) -> int:
    """How many of lines[start:] fit in `room` bytes."""
    taken = 0
    for line in lines[start:]:
        room -= len(line)
        if room < 0:
            break
        taken += 1
    return taken


def _age_key(name: str) -> str:
    """Closed files sort by the time their writer opened them: the part after the stream."""
    return name.partition("-")[2]


class _OpenFile:
    """One .part file, appended with whole lines under an exclusive lock."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.path = final.with_name(final.name + OPEN_SUFFIX)
        self.opened = time.monotonic()
        self.broken = False
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            # Tells a writer starting beside this one that the file is not abandoned.
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise
        self.size = 0

    def write(self, data: bytes) -> None:
        """All of `data`, or none of it: a failed write is cut off again, so the file always
        ends at a newline. `broken` when even that fails."""
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                if written == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
        except OSError:
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                self.broken = True
            raise
        self.size += len(data)

    def finish(self) -> Path | None:
        """Close and rename to the final name; an empty file is deleted. The closed path."""
        os.close(self.fd)
        if self.size == 0:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return None
        os.replace(self.path, self.final)
        return self.final

    def abandon(self) -> None:
        """Stop using a file that could not be cut back; the next writer's `recover` cuts
        it to its last newline and closes it. Readers stop at that newline anyway."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _close_abandoned(path: Path) -> None:
    """A dead writer's .part file: cut to its last newline, renamed to its final name
    (deleted when nothing is left). Left alone while its writer holds the lock."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live writer's file
        end = _last_newline_end(fd)
        os.ftruncate(fd, end)
        if end == 0:
            path.unlink()
        else:
            os.replace(path, path.with_name(path.name[: -len(OPEN_SUFFIX)]))
    finally:
        os.close(fd)


def _last_newline_end(fd: int, chunk: int = 65536) -> int:
    """The offset just past the file's last newline (0 when it has none)."""
    end = os.fstat(fd).st_size
    while end > 0:
        start = max(0, end - chunk)
        block = os.pread(fd, end - start, start)
        at = block.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0

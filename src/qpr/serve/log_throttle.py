"""Log rate limiting: a flood of one message costs a few lines, not the disk.

When the service is under a connection flood, asyncio and uvicorn log one traceback per
failed accept or broken connection; one minute of that once wrote 416 MB. `RateLimitFilter`
lets through `burst` records of one kind per `interval` seconds, then one notice that the
rest are being suppressed, and with the next record let through after the interval, how
many were. A record's kind is its logger, level, exception type and first line with the
numbers taken out (addresses, ports and file descriptors differ from record to record).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["THROTTLED_LOGGERS", "RateLimitFilter", "install"]

# The loggers a connection flood writes to; the access log is per request by design.
THROTTLED_LOGGERS = ("asyncio", "uvicorn.error", "qpr.serve")
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
# Kinds remembered at most: a flood of ever-new kinds cannot grow the table without bound.
_MAX_KINDS = 4096


class RateLimitFilter(logging.Filter):
    """At most `burst` records of a kind per `interval` seconds (see the module docstring)."""

    def __init__(
        self, burst: int = 10, interval: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = burst
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, int, str, str], list[float]] = {}  # [start, count]
        self.suppressed = 0  # in all, for tests and /metrics-minded readers

    @staticmethod
    def _kind(record: logging.LogRecord) -> tuple[str, int, str, str]:
        text = record.msg if isinstance(record.msg, str) else str(record.msg)
        first = text.split("\n", 1)[0][:160]
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        return record.name, record.levelno, _NUMBERS.sub("#", first), exc

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self._kind(record)
        now = self._clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None or now - window[0] >= self.interval:
                dropped = 0 if window is None else int(max(0.0, window[1] - self.burst - 1))
                if len(self._windows) >= _MAX_KINDS:
                    self._forget(now)
                self._windows[kind] = [now, 1]
                if dropped:
                    _append(record, f" [suppressed {dropped} similar messages before this one]")
                return True
            window[1] += 1
            count = window[1]
        if count <= self.burst:
            return True
        if count == self.burst + 1:
            # One notice, without the traceback, so the reader knows lines are missing.
            record.exc_info = None
            record.exc_text = None
            left = self.interval - (now - window[0])
            _append(record, f" [similar messages suppressed for the next {left:.0f} s]")
            return True
        self.suppressed += 1
        return False

    def _forget(self, now: float) -> None:
        expired = [k for k, (start, _) in self._windows.items() if now - start >= self.interval]
        for key in expired or list(self._windows)[: _MAX_KINDS // 2]:
            del self._windows[key]


def _append(record: logging.LogRecord, note: str) -> None:
    record.msg = record.getMessage() + note
    record.args = None


def install(
    burst: int, interval: float, loggers: Iterable[str] = THROTTLED_LOGGERS
) -> RateLimitFilter:
    """Put one shared `RateLimitFilter` on each logger, replacing an earlier one (an app
    built twice in one process, as tests do, keeps one filter a logger)."""
    shared = RateLimitFilter(burst, interval)
    for name in loggers:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, RateLimitFilter)]:
            logger.removeFilter(old)
        logger.addFilter(shared)
    return shared

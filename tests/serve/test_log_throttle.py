"""Log rate limiting: a flood of one message is a few lines and a count."""

from __future__ import annotations

import logging

import pytest

from qpr.serve.log_throttle import RateLimitFilter, install


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_is_cut_to_the_burst_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    logger = logging.getLogger("qpr.test.flood")
    logger.addFilter(RateLimitFilter(burst=5, interval=60, clock=clock))
    with caplog.at_level(logging.ERROR, logger="qpr.test.flood"):
        for fd in range(10_000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                # as asyncio logs a failed accept: a number that differs every time
                logger.exception("socket.accept() out of system resource (fd=%d)", fd)
        logger.error("another kind of message")
        assert len(caplog.records) == 5 + 1 + 1  # the burst, one notice, the other kind
        notice = caplog.records[5]
        assert "suppressed for the next 60 s" in notice.getMessage() and not notice.exc_info
        caplog.clear()
        clock.now = 61
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            logger.exception("socket.accept() out of system resource (fd=%d)", 1)
    (summary,) = caplog.records
    assert "suppressed 9994 similar messages" in summary.getMessage()


def test_install_covers_asyncio_and_uvicorn_once() -> None:
    first = install(3, 10.0)
    second = install(4, 10.0)
    for name in ("asyncio", "uvicorn.error", "qpr.serve"):
        limiters = [f for f in logging.getLogger(name).filters if isinstance(f, RateLimitFilter)]
        assert limiters == [second]
        logging.getLogger(name).removeFilter(second)  # leave the loggers as found
    assert first is not second

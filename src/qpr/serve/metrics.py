"""Prometheus metrics in the text exposition format (version 0.0.4), without a client library.

Why not ``prometheus_client``: it is in the virtualenv only as a transitive dependency of
MLflow/Prefect, not a declared one, and its default registry is process-global, so two apps
in one process (tests, a reload) would share or collide on series. The format is small:
``# HELP``/``# TYPE`` lines, then ``name{label="value"} number`` per series; histograms add
cumulative ``_bucket{le=...}`` series plus ``_sum`` and ``_count``.

Each family keeps its series under its own lock: requests are served from many threads.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. Dense below 10 ms, where the service is expected to live (about 1 ms a search),
# so a regression from 1 to 3 ms is visible; sparse above, where only outages land.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


def _escape(value: str) -> str:
    """Label values: backslash, double quote and newline must be escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Family:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Sequence[str]) -> tuple[str, ...]:
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        return tuple(str(v) for v in labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> list[str]:
        return [*self.header(), *self.samples()]


class Counter(_Family):
    """A value that only goes up (requests, reloads); name ends in ``_total``."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]


class Gauge(_Family):
    """A value that is set; `replace` swaps the whole set of series at once (model info)."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def replace(self, series: Iterable[tuple[Sequence[str], float]]) -> None:
        """Drop every series and set these: an info gauge must not keep the old model."""
        fresh = {self._key(labels): float(value) for labels, value in series}
        with self._lock:
            self._values = fresh

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]


class Histogram(_Family):
    """Observations counted into cumulative buckets (``le`` = less or equal)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labelnames)
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(math.isinf(b) or math.isnan(b) for b in bounds):
            raise ValueError("buckets must be finite numbers (+Inf is added)")
        self.buckets = tuple(bounds)
        # per label set: [count per finite bucket (not cumulative)..., +Inf bucket], sum
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        slot = bisect.bisect_left(self.buckets, value)  # first bound >= value
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0] * (len(self.buckets) + 1)
                self._sums[key] = 0.0
            counts[slot] += 1
            self._sums[key] += value

    def count(self, *labels: str) -> int:
        with self._lock:
            return sum(self._counts.get(self._key(labels), []))

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(c), self._sums[k]) for k, c in self._counts.items())
        lines = []
        for key, counts, total in items:
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                running += n
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {running}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {running}")
        return lines


class Registry:
    """An ordered set of families; `collect` hooks refresh gauges just before rendering."""

    def __init__(self) -> None:
        self._families: list[_Family] = []
        self._hooks: list[Callable[[], None]] = []

    def add(self, family: _Family) -> _Family:
        if any(f.name == family.name for f in self._families):
            raise ValueError(f"metric {family.name} registered twice")
        self._families.append(family)
        return family

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        family = Counter(name, help_text, labelnames)
        self.add(family)
        return family

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        family = Gauge(name, help_text, labelnames)
        self.add(family)
        return family

    def histogram(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        family = Histogram(name, help_text, labelnames, buckets)
        self.add(family)
        return family

    def on_collect(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def render(self) -> str:
        for hook in self._hooks:
            hook()
        lines: list[str] = []
        for family in self._families:
            lines.extend(family.render())
        return "\n".join(lines) + "\n"

"""The service's Prometheus metrics, through ``prometheus_client`` with one registry per app.

Why the library and not our own code: measured side by side
(`benchmarks/library_choices.py`, docs/results/library_choices.md), it costs 1.5 µs more a
request (3.5 against 2.0 µs: 0.07% of the service's HTTP p50 of 2 ms) and 0.6 ms more a
scrape (0.8 against 0.19 ms), and writes the same families, types, labels, buckets and
values (as floats: ``2.0``, ``le="1.0"``; a series' labels sorted by name), in 95 lines of
code where ours took 225.

Why one `CollectorRegistry` per app: the library's default registry is process-global, so
two apps in one process (tests, a reload) would share or collide on series.

Why no ``_created`` series: the text format 0.0.4 has no place for them (each would be
one more gauge per series), and the service never showed them. The switch is the
library's, process-wide (`prometheus_client.disable_created_metrics`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from qpr.monitor.status import read_status
from qpr.querylog.log_records import STREAMS

if TYPE_CHECKING:
    from qpr.querylog.log_writer import QueryLog
    from qpr.serve.reload import Served

__all__ = ["CONTENT_TYPE", "DROP_REASONS", "LATENCY_BUCKETS", "Telemetry"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

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


class Telemetry:
    """The service's metric families, and the model gauges refreshed at each scrape."""

    def __init__(self) -> None:
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        into = self.registry
        self.requests = Counter(
            "qpr_http_requests_total",
            "HTTP requests by endpoint, method and status code.",
            ("endpoint", "method", "status"),
            registry=into,
        )
        self.latency = Histogram(
            "qpr_http_request_duration_seconds",
            "Time from request start to the end of the response, by endpoint.",
            ("endpoint",),
            buckets=LATENCY_BUCKETS,
            registry=into,
        )
        self.questions = Counter(
            "qpr_questions_total",
            "Questions searched, by whether the top hit was within the no-answer threshold.",
            ("answered",),
            registry=into,
        )
        self.model_info = Gauge(
            "qpr_model_info",
            "The serving model (value 1); labels say which.",
            ("name", "version", "alias", "fingerprint"),
            registry=into,
        )
        self.model_loaded = Gauge(
            "qpr_model_loaded_timestamp_seconds",
            "When the serving model was loaded.",
            registry=into,
        )
        self.model_questions = Gauge(
            "qpr_model_index_questions", "Questions in the serving model's index.", registry=into
        )
        self.ready = Gauge("qpr_ready", "1 when a model serves, else 0.", registry=into)
        self.failed_deltas = Gauge(
            "qpr_model_failed_deltas",
            "Deltas the serving model leaves out because they fail their check.",
            registry=into,
        )
        self.reloads = Counter(
            "qpr_model_reloads_total",
            "Reload attempts by outcome (swapped, refused, error).",
            ("outcome",),
            registry=into,
        )
        self._served: Callable[[], Served | None] = lambda: None
        self._lock = threading.Lock()

    def watch_query_log(self, query_log: QueryLog) -> None:
        """Show the query log's counts (read at each scrape: the request path only adds to
        the writer's own counters), and the monitor's verdict on that log when it wrote
        one (`qpr.monitor.status`)."""
        self.registry.register(_QueryLogCollector(query_log))
        self.registry.register(_MonitorCollector(query_log.folder))

    def observe(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        """One request: counted, and its time in the latency histogram."""
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def watch_model(self, served: Callable[[], Served | None]) -> None:
        """Where `render` reads the serving model from (the app's model holder)."""
        self._served = served

    def render(self) -> bytes:
        """The text exposition (format 0.0.4), the model gauges refreshed first."""
        with self._lock:  # the info gauge is cleared, then set: one scrape at a time
            self._refresh_model(self._served())
            return generate_latest(self.registry)

    def _refresh_model(self, served: Served | None) -> None:
        self.model_info.clear()  # an info gauge must not keep the old model's series
        if served is None:
            self.ready.set(0)
            self.failed_deltas.set(0)
            return
        info = served.info
        self.model_info.labels(
            info.name, info.version or "", info.alias or "", info.fingerprint
        ).set(1)
        self.model_loaded.set(info.loaded_at)
        self.model_questions.set(info.questions)
        self.failed_deltas.set(len(info.failed_deltas))
        self.ready.set(1)


# Ways a query log line is lost (qpr.querylog.log_writer), always shown, 0 until one is.
DROP_REASONS = ("queue_full", "write_error")


class _QueryLogCollector:
    """qpr_query_log_* from a `QueryLog`'s counts."""

    def __init__(self, query_log: QueryLog) -> None:
        self.query_log = query_log

    def collect(self) -> Iterator[Metric]:
        counts = self.query_log.counts()
        written = CounterMetricFamily(
            "qpr_query_log_written", "Query log lines written, by stream.", labels=["stream"]
        )
        dropped = CounterMetricFamily(
            "qpr_query_log_dropped",
            "Query log lines lost, by stream and reason (queue_full, write_error, closed).",
            labels=["stream", "reason"],
        )
        sampled = CounterMetricFamily(
            "qpr_query_log_sampled_out",
            "Query log lines left out by the sampling rate, by stream.",
            labels=["stream"],
        )
        for stream in STREAMS:
            written.add_metric([stream], counts.get((stream, "written"), 0))
            sampled.add_metric([stream], counts.get((stream, "sampled_out"), 0))
            for reason in DROP_REASONS:
                dropped.add_metric([stream, reason], counts.get((stream, reason), 0))
            if counts.get((stream, "closed")):
                dropped.add_metric([stream, "closed"], counts[stream, "closed"])
        yield written
        yield dropped
        yield sampled
        yield GaugeMetricFamily(
            "qpr_query_log_queue",
            "Requests waiting for the query log's writer.",
            value=self.query_log.waiting(),
        )


class _MonitorCollector:
    """qpr_monitor_* from the monitor's status file in the query log folder: nothing until
    the monitor wrote one. Read at each scrape (a small file; scrapes are rare)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def collect(self) -> Iterator[Metric]:
        status = read_status(self.folder)
        if status is None:
            return
        alarm = GaugeMetricFamily(
            "qpr_monitor_alarm",
            "1 when the monitor's last report tripped this measure's threshold.",
            labels=["measure"],
        )
        value = GaugeMetricFamily(
            "qpr_monitor_value", "The monitor's last value of each measure.", labels=["measure"]
        )
        for name, measure in sorted(status["measures"].items()):
            alarm.add_metric([name], 1.0 if measure.get("alarm") else 0.0)
            if isinstance(measure.get("value"), int | float):
                value.add_metric([name], float(measure["value"]))
        yield alarm
        yield value
        yield GaugeMetricFamily(
            "qpr_monitor_report_timestamp_seconds",
            "When the monitor wrote its last report.",
            value=float(status.get("at", 0.0)),
        )

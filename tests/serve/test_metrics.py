"""qpr.serve.metrics: one registry per app, the model gauges refreshed at each scrape."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from qpr.serve.metrics import LATENCY_BUCKETS, Telemetry


def _samples(telemetry: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = telemetry.render().decode("utf-8")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _served(version: str, failed_deltas: dict[int, str] | None = None) -> SimpleNamespace:
    info = SimpleNamespace(
        name="qpr",
        version=version,
        alias="champion",
        fingerprint=f"f{version}",
        loaded_at=5.0,
        questions=12,
        failed_deltas=failed_deltas or {},
    )
    return SimpleNamespace(info=info)


def test_two_apps_keep_their_own_series() -> None:
    first, second = Telemetry(), Telemetry()
    first.observe("/search", "POST", 200, 0.0012)
    first.observe("/search", "POST", 200, 0.0041)
    requests = (
        "qpr_http_requests_total",
        (("endpoint", "/search"), ("method", "POST"), ("status", "200")),
    )
    assert _samples(first)[requests] == 2
    assert requests not in _samples(second)
    buckets = [
        float(dict(labels)["le"])
        for (name, labels) in _samples(first)
        if name == "qpr_http_request_duration_seconds_bucket"
    ]
    assert buckets == [*LATENCY_BUCKETS, float("inf")]
    assert not any(name.endswith("_created") for name, _ in _samples(first))


def test_model_info_follows_the_serving_model() -> None:
    telemetry = Telemetry()
    serving: list[SimpleNamespace | None] = [None]
    telemetry.watch_model(lambda: serving[0])
    assert _samples(telemetry)[("qpr_ready", ())] == 0
    serving[0] = _served("1")
    assert _samples(telemetry)[("qpr_ready", ())] == 1
    serving[0] = _served("2")
    samples = _samples(telemetry)
    info = [labels for name, labels in samples if name == "qpr_model_info"]
    assert [dict(labels)["version"] for labels in info] == ["2"]  # the old model is gone
    assert samples[("qpr_ready", ())] == 1
    assert samples[("qpr_model_index_questions", ())] == 12
    assert samples[("qpr_model_failed_deltas", ())] == 0
    serving[0] = _served("3", {2: "deltas/0002: ids.npy missing", 5: "deltas/0005: ..."})
    assert _samples(telemetry)[("qpr_model_failed_deltas", ())] == 2
    serving[0] = None
    assert not [name for name, _ in _samples(telemetry) if name == "qpr_model_info"]

"""qpr.monitor.report and render on a tiny bundle and a real query log: questions like
the training traffic raise no alarm, questions of another topic do; too few questions
wait; the service's own thresholds (no answer, acceptance, latency) trip on their own."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from qpr.config import MonitorSettings
from qpr.monitor.render import write_html, write_plot
from qpr.monitor.report import ALARMS, measure, reference_sample
from qpr.monitor.status import read_status, status_of, write_status
from qpr.querylog import QueryLog, read_feedback, read_queries
from qpr.retrieval.bundle import Bundle
from tests.retrieval.cnn_bundle import QUESTIONS, build_bundle

SETTINGS = MonitorSettings(min_questions=100, max_questions=400, reference_questions=400)
PLACES = ("paris", "lima", "oslo", "cairo", "delhi", "quito", "hanoi", "accra", "riga", "doha")
OTHER_TOPIC = [
    t.format(p=p)
    for p, t in itertools.product(
        PLACES,
        (
            "what is the population and the official currency of {p} today",
            "which famous museums should a tourist visit first in {p} during winter",
            "how expensive is a hotel near the old town of {p} in december",
        ),
    )
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return Bundle.load(build_bundle(tmp_path_factory.mktemp("models")))


def _traffic(questions: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(questions) for _ in range(n)]


def _logged(bundle: Bundle, folder: Path, questions: list[str], *, rejected: int = 0) -> None:
    """`questions` searched and logged as the service logs them, one request each;
    the first `rejected` answers rejected, the next ones taken."""
    with QueryLog(folder) as log:
        for i, question in enumerate(questions):
            result = bundle.search(question, k=3, threshold=1e9)
            log.queries(
                f"r{i}", [result], endpoint="/search", model={}, k=3, threshold=None, latency_ms=1.0
            )
            if i < 2 * rejected:
                log.feedback(f"r{i}", "rejected" if i < rejected else "taken")


def _report(bundle: Bundle, folder: Path, settings: MonitorSettings = SETTINGS) -> dict:
    reference = reference_sample(_traffic(QUESTIONS, 2000, 1), bundle, 400, seed=0)
    return measure(read_queries(folder), read_feedback(folder), bundle, reference, settings, seed=0)


def test_traffic_like_the_training_traffic_raises_no_alarm(bundle: Bundle, tmp_path: Path):
    _logged(bundle, tmp_path, _traffic(QUESTIONS, 300, 2))
    report = _report(bundle, tmp_path)
    assert report["drift_measured"] and report["alarms"] == []
    assert set(report["measures"]) == set(ALARMS)
    assert report["service"]["questions"] == 300
    json.dumps(report)  # plain values only


def test_questions_of_another_topic_are_flagged(bundle: Bundle, tmp_path: Path):
    shifted = _traffic(QUESTIONS, 150, 2) + _traffic(OTHER_TOPIC, 150, 3)
    _logged(bundle, tmp_path, shifted)
    report = _report(bundle, tmp_path)
    assert {"embedding_auc", "unseen_words", "length_ks"} <= set(report["alarms"])
    words = report["measures"]["unseen_words"]["detail"]
    assert words["live_unseen_share"] > words["reference_unseen_share"]


def test_too_few_questions_wait_and_measure_the_service_alone(bundle: Bundle, tmp_path: Path):
    _logged(bundle, tmp_path, _traffic(OTHER_TOPIC, 40, 2))
    report = _report(bundle, tmp_path)
    assert not report["drift_measured"] and report["waiting_for"] == 60
    assert set(report["measures"]) == {"no_answer_rate", "acceptance", "latency_p99"}


def test_rejected_answers_slow_searches_and_no_answers_trip_their_thresholds(
    bundle: Bundle, tmp_path: Path
):
    _logged(bundle, tmp_path, _traffic(QUESTIONS, 120, 2), rejected=30)
    strict = SETTINGS.model_copy(
        update={"min_acceptance": 0.6, "max_p99_ms": 0.5, "max_no_answer_rate": 0.9}
    )
    report = _report(bundle, tmp_path, strict)
    assert report["service"]["feedback"] == {
        "taken": 30,
        "rejected": 30,
        "acceptance": 0.5,
        "decides": True,
    }
    assert {"acceptance", "latency_p99"} <= set(report["alarms"])
    assert "no_answer_rate" not in report["alarms"]  # threshold 1e9: every one answered


def test_the_report_renders_and_its_status_reads_back(bundle: Bundle, tmp_path: Path):
    _logged(bundle, tmp_path / "log", _traffic(QUESTIONS, 150, 2) + OTHER_TOPIC * 5)
    report = _report(bundle, tmp_path / "log")
    plot = write_plot(report, tmp_path / "out" / "report.png")
    page = write_html(report, plot, tmp_path / "out" / "report.html").read_text()
    assert plot.read_bytes()[:4] == b"\x89PNG" and "ALARM" in page
    write_status(tmp_path / "log", status_of(report, at=1.5))
    status = read_status(tmp_path / "log")
    assert status is not None and status["alarms"] == report["alarms"] and status["at"] == 1.5
    (tmp_path / "log" / "monitor.json").write_text("{not json")
    assert read_status(tmp_path / "log") is None


def test_hourly_figures_follow_the_timestamps(bundle: Bundle, tmp_path: Path):
    _logged(bundle, tmp_path, _traffic(QUESTIONS, 120, 2))
    queries = read_queries(tmp_path)
    queries["timestamp"] = ["2026-11-27T01:10:00Z"] * 60 + ["2026-11-27T02:20:00Z"] * 60
    reference = reference_sample(QUESTIONS, bundle, 400, seed=0)
    report = measure(queries, pd.DataFrame({"outcome": []}), bundle, reference, SETTINGS, seed=0)
    assert [h["questions"] for h in report["hourly"]] == [60, 60]
    assert report["window"]["first"].startswith("2026-11-27T01:10")

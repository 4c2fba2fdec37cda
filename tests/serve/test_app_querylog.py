"""The service's query log and POST /feedback (qpr.querylog behind qpr.serve.app): what a
search and a verdict write, what /feedback refuses, and that a log that cannot be written
never fails a search, only counts."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from qpr.querylog.log_reader import read_joined
from qpr.serve.app import create_app
from qpr.serve.sources import LocalSource
from tests.serve import test_app
from tests.serve.test_app import QIDS, QUESTIONS, SETTINGS, UNSEEN, assert_refused, build_bundle

KEY = "k3y-for-query-log-tests-0123456789"
# The app tests' fixtures: their bundle, and a service over it without a query log.
bundle_dir = test_app.bundle_dir
client = test_app.client


def metric(client: TestClient, name: str, **labels: str) -> float:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no {name} {labels} in /metrics")


def wait_for_metric(client: TestClient, name: str, at_least: float, **labels: str) -> float:
    """Until the writer thread has counted (a sync point, not a timing)."""
    deadline = time.monotonic() + 30
    while (value := metric(client, name, **labels)) < at_least:
        assert time.monotonic() < deadline, f"{name} {labels} stayed at {value}"
        time.sleep(0.02)
    return value


def test_searches_and_feedback_are_logged_and_joined(bundle_dir: Path, tmp_path: Path) -> None:
    settings = SETTINGS.replace(query_log=str(tmp_path / "log"))
    with TestClient(create_app(LocalSource(bundle_dir), settings)) as client:
        one = client.post("/search", json={"question": QUESTIONS[7]})
        questions = [QUESTIONS[3], f"{UNSEEN}, mail me at a@b.example"]
        batch = client.post("/search/batch", json={"questions": questions, "k": 3})
        assert one.status_code == batch.status_code == 200
        one_id, batch_id = one.headers["x-request-id"], batch.headers["x-request-id"]
        taken = client.post("/feedback", json={"request_id": one_id, "outcome": "taken"})
        assert taken.status_code == 202
        assert taken.json() == {
            "request_id": one_id,
            "position": 0,
            "outcome": "taken",
            "answer_id": None,
            "logged": True,
            "reason": None,
        }
        named = {"request_id": batch_id, "position": 1, "outcome": "rejected", "answer_id": "a-9"}
        assert client.post("/feedback", json=named).json()["logged"] is True
        wait_for_metric(client, "qpr_query_log_written_total", 3, stream="queries")
        wait_for_metric(client, "qpr_query_log_written_total", 2, stream="feedback")
        assert (
            metric(client, "qpr_query_log_dropped_total", stream="queries", reason="queue_full")
            == 0
        )
    # Shut down: everything written, the open files closed (renamed).
    assert not list((tmp_path / "log").rglob("*.part"))
    rows = read_joined(tmp_path / "log").set_index(["request_id", "position"])
    assert list(rows.index) == [(one_id, 0), (batch_id, 0), (batch_id, 1)]
    first = rows.loc[(one_id, 0)]
    assert first["question"] == QUESTIONS[7] and not first["redacted"]
    assert first["answered"] and first["answer_id"] == one.json()["hits"][0]["answer_id"]
    assert first["question_ids"] == [h["question_id"] for h in one.json()["hits"]]
    assert first["model_fingerprint"] == one.json()["model"]["fingerprint"]
    assert (first["endpoint"], first["k"], first["feedback"]) == ("/search", 5, "taken")
    unseen = rows.loc[(batch_id, 1)]
    assert unseen["question"] == f"{UNSEEN}, mail me at <email>" and unseen["redacted"]
    assert not unseen["answered"] and pd.isna(unseen["answer_id"]) and unseen["k"] == 3
    assert (unseen["feedback"], unseen["right_answer_id"]) == ("rejected", "a-9")
    assert rows.loc[(batch_id, 0)]["feedback"] is None


@pytest.mark.parametrize(
    ("payload", "code", "words"),
    [
        ({"outcome": "taken"}, "invalid_request", ["request_id"]),
        ({"request_id": "abc"}, "invalid_request", ["outcome"]),
        ({"request_id": "abc", "outcome": "liked"}, "invalid_outcome", ["taken", "liked"]),
        ({"request_id": "a b", "outcome": "taken"}, "invalid_request_id", ["X-Request-ID"]),
        ({"request_id": "x" * 65, "outcome": "taken"}, "invalid_request_id", []),
        ({"request_id": 12, "outcome": "taken"}, "invalid_request", ["request_id"]),
        (
            {"request_id": "abc", "outcome": "taken", "answer_id": "no spaces"},
            "invalid_answer_id",
            ["answer_id"],
        ),
        (
            {"request_id": "abc", "outcome": "taken", "position": 4},
            "position_out_of_range",
            ["between 0 and 3"],
        ),
        ({"request_id": "abc", "outcome": "taken", "stars": 5}, "invalid_request", ["stars"]),
    ],
)
def test_malformed_feedback_is_refused(
    client: TestClient, payload: dict, code: str, words: list[str]
) -> None:
    assert_refused(client.post("/feedback", json=payload), 422, code, *words)


def test_feedback_that_is_not_json_is_refused(client: TestClient) -> None:
    response = client.post("/feedback", content=b"taken", headers={"content-type": "text/plain"})
    assert_refused(response, 415, "unsupported_media_type")
    as_json = {"content-type": "application/json"}
    assert_refused(client.post("/feedback", content=b"{", headers=as_json), 400, "invalid_json")


def test_feedback_needs_the_api_key_like_search(bundle_dir: Path, tmp_path: Path) -> None:
    settings = SETTINGS.replace(api_key=KEY, query_log=str(tmp_path / "log"))
    body = {"request_id": "abc", "outcome": "taken"}
    with TestClient(create_app(LocalSource(bundle_dir), settings)) as keyed:
        assert_refused(keyed.post("/feedback", json=body), 401, "unauthorized")
        wrong = {"authorization": "Bearer not-the-key-0123456789"}
        assert_refused(keyed.post("/feedback", json=body, headers=wrong), 401, "unauthorized")
        good = keyed.post("/feedback", json=body, headers={"x-api-key": KEY})
        assert good.status_code == 202 and good.json()["logged"] is True
    lines = [json.loads(p.read_text()) for p in (tmp_path / "log" / "feedback").iterdir()]
    assert [line["request_id"] for line in lines] == ["abc"]  # the refused ones left no line


def test_with_the_log_off_feedback_is_answered_and_not_logged(
    client: TestClient, bundle_dir: Path, tmp_path: Path
) -> None:
    body = {"request_id": "abc", "outcome": "rejected"}
    response = client.post("/feedback", json=body)
    assert response.status_code == 202
    assert (
        response.json()["logged"] is False and response.json()["reason"] == "the query log is off"
    )
    assert "qpr_query_log" not in client.get("/metrics").text
    switched_off = SETTINGS.replace(query_log=str(tmp_path / "log"), query_log_enabled=False)
    with TestClient(create_app(LocalSource(bundle_dir), switched_off)) as off:
        assert off.post("/search", json={"question": QUESTIONS[1]}).status_code == 200
        assert off.post("/feedback", json=body).json()["logged"] is False
    assert not (tmp_path / "log").exists()


def test_sampled_out_requests_are_counted_not_written(bundle_dir: Path, tmp_path: Path) -> None:
    settings = SETTINGS.replace(query_log=str(tmp_path / "log"), query_log_sample=0.0)
    with TestClient(create_app(LocalSource(bundle_dir), settings)) as client:
        search = client.post("/search", json={"question": QUESTIONS[2]})
        feedback = {"request_id": search.headers["x-request-id"], "outcome": "taken"}
        assert client.post("/feedback", json=feedback).json()["reason"] == "sampled out"
        assert metric(client, "qpr_query_log_sampled_out_total", stream="queries") == 1
        assert metric(client, "qpr_query_log_sampled_out_total", stream="feedback") == 1
    assert not list((tmp_path / "log").rglob("*.jsonl"))


def test_the_monitors_verdict_on_the_log_shows_on_metrics(bundle_dir: Path, tmp_path: Path):
    from qpr.monitor.status import write_status

    settings = SETTINGS.replace(query_log=str(tmp_path / "log"))
    with TestClient(create_app(LocalSource(bundle_dir), settings)) as client:
        assert "qpr_monitor" not in client.get("/metrics").text  # no report yet
        measures = {"embedding_auc": {"value": 0.91, "alarm": True}}
        measures["acceptance"] = {"value": None, "alarm": False}
        write_status(
            tmp_path / "log", {"at": 123.0, "alarms": ["embedding_auc"], "measures": measures}
        )
        assert metric(client, "qpr_monitor_alarm", measure="embedding_auc") == 1
        assert metric(client, "qpr_monitor_alarm", measure="acceptance") == 0
        assert metric(client, "qpr_monitor_value", measure="embedding_auc") == 0.91
        assert metric(client, "qpr_monitor_report_timestamp_seconds") == 123.0


def test_an_unwritable_folder_never_fails_a_search(bundle_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings = SETTINGS.replace(query_log=str(blocker / "log"))
    with TestClient(create_app(LocalSource(bundle_dir), settings)) as client:
        for question in QUESTIONS[:10]:
            assert client.post("/search", json={"question": question}).status_code == 200
        feedback = client.post("/feedback", json={"request_id": "abc", "outcome": "taken"})
        assert feedback.status_code == 202  # queued: the write fails later, off the request
        wait_for_metric(
            client, "qpr_query_log_dropped_total", 10, stream="queries", reason="write_error"
        )
        wait_for_metric(
            client, "qpr_query_log_dropped_total", 1, stream="feedback", reason="write_error"
        )
        assert metric(client, "qpr_query_log_written_total", stream="queries") == 0
        assert metric(client, "qpr_http_requests_total", endpoint="/search", status="200") == 10


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _limit_file_size() -> None:  # in the child, before exec: a disk that fills at 4 KB a file
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


@pytest.mark.slow
def test_a_full_disk_never_fails_a_search(tmp_path: Path) -> None:
    """`qpr serve` over a real socket with every file it writes capped at 4 KB
    (RLIMIT_FSIZE): writes fail part way as on a full disk; searches still answer 200,
    the lost lines are counted on /metrics, and the files hold whole lines only."""
    import httpx

    bundle = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    port = _free_port()
    log_dir = tmp_path / "log"
    env = {
        **os.environ,
        "QPR_SERVE_QUERY_LOG": str(log_dir),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(bundle)]
    server = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_limit_file_size,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            deadline = time.monotonic() + 60
            while not _ready(http):
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                assert time.monotonic() < deadline, "the service did not become ready in 60 s"
                time.sleep(0.2)
            for i in range(6):  # one request a write: each line about 1.3 KB
                question = f"{QUESTIONS[i]} " + "please " * 120
                assert http.post("/search", json={"question": question}).status_code == 200
                deadline = time.monotonic() + 30
                while sum((counts := _log_counts(http.get("/metrics").text)).values()) <= i:
                    assert time.monotonic() < deadline, counts
                    time.sleep(0.05)
        assert counts["written"] > 0 and counts["write_error"] > 0, counts
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert "File too large" in output and "Traceback" not in output
    lines = 0
    for path in (log_dir / "queries").iterdir():
        data = path.read_bytes()
        assert path.stat().st_size <= 4096 and (not data or data.endswith(b"\n"))
        lines += sum(1 for line in data.splitlines() if json.loads(line)["question"])
    assert lines == counts["written"]


def _ready(http) -> bool:
    import httpx

    try:
        return http.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def _log_counts(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("stream") != "queries":
                continue
            if sample.name == "qpr_query_log_written_total":
                out["written"] = sample.value
            elif sample.name == "qpr_query_log_dropped_total":
                out[sample.labels["reason"]] = sample.value
    return out

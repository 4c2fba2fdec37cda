"""The search service over HTTP (FastAPI TestClient): every endpoint, every bad input.

The bundle is real (random-weight CNN → ONNX → FAISS Flat, built with the library in a
module fixture, as tests/retrieval/test_bundle.py does), so a search goes through the same
tokeniser, ONNX Runtime session and index as in production.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from qpr.artifacts import (
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.retrieval.bundle import HIT_FIELDS
from qpr.serve.app import create_app
from qpr.serve.metrics import LATENCY_BUCKETS
from qpr.serve.settings import ServeSettings
from qpr.serve.sources import LocalSource

VERBS = ("install", "reset", "update", "clean", "repair")
OBJECTS = ("printer", "garden", "bicycle", "laptop", "kitchen")
TEMPLATES = ("how do i {v} my {o}", "what is the best way to {v} a {o}?")
QUESTIONS = [t.format(v=v, o=o) for v, o, t in itertools.product(VERBS, OBJECTS, TEMPLATES)]
QIDS = [1000 + 10 * i for i in range(len(QUESTIONS))]
UNSEEN = "where can i buy a kite for my nephew"
MAX_LEN = 16
# Far below the distance between two different random-CNN vectors: an indexed question is
# answered (distance ~0), an unseen one is not.
STORED_THRESHOLD = 1e-6
# Small limits, so that the tests of the limits stay small.
# startup_wait: the tests start on a loaded model (the service itself opens at once).
SETTINGS = ServeSettings(
    max_k=20,
    default_k=5,
    max_question_chars=200,
    max_body_bytes=16384,
    max_batch=4,
    poll_seconds=0,
    startup_wait=60,
)


# Ids as the pipeline makes them (hashes): above 2^53 and odd, so no double holds them,
# and the largest int64. As JSON numbers, a JavaScript client would round every one.
BIG_QIDS = [2**53 + 1 + 2 * i for i in range(len(QUESTIONS) - 1)] + [2**63 - 1]


def build_bundle(
    models: Path,
    questions: list[str],
    qids: list[int],
    seed: int = 0,
    cluster_ids: list[int] | None = None,
) -> Path:
    """models/ as the pipeline writes it (torch only here, to make the encoder). The
    clusters are pairs of questions, numbered 0, 1, ..., unless `cluster_ids` are given."""
    import torch

    from qpr.model import CNNEncoder
    from qpr.model.onnx import export_onnx
    from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
    from qpr.retrieval.encoders import encode, load_session
    from qpr.text.vocab import Vocabulary

    models.mkdir(parents=True, exist_ok=True)
    vocab = Vocabulary.build(questions, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(seed)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=8)
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )
    vectors = encode(load_session(models / ENCODER_FILE), vocab, questions, max_len=MAX_LEN)
    index = build_index(
        vectors, IndexConfig("Flat", nprobe=1, use_gpu=False), seed=0, log=lambda _: None
    )
    save_index(index, models / INDEX_FILE)
    IdMap(np.asarray(qids, dtype=np.int64)).save(models / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(qids, pa.int64()),
            "text": pa.array(questions, pa.string()),
            "cluster_id": pa.array(
                cluster_ids or [i // 2 for i in range(len(questions))], pa.int64()
            ),
            "answer_id": pa.array([f"ans-{i // 2}" for i in range(len(questions))], pa.string()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    SearchConfig(threshold=STORED_THRESHOLD, target_precision=0.9).write(models)
    return models


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS)


@pytest.fixture(scope="module")
def client(bundle_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(LocalSource(bundle_dir), SETTINGS)) as test_client:
        yield test_client


def assert_refused(response, status: int, code: str, *words: str) -> dict:
    """A refusal: the status, our JSON error shape, a message with `words`, no trace."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) >= {"error", "message", "request_id"}, body
    assert body["error"] == code, body
    for word in words:
        assert word in body["message"], body["message"]
    assert body["request_id"] == response.headers["x-request-id"]
    assert "Traceback" not in response.text and 'File "' not in response.text
    return body


# ---------------------------------------------------------------- endpoints


def test_search_returns_ranked_paraphrases(client: TestClient, bundle_dir: Path) -> None:
    response = client.post("/search", json={"question": QUESTIONS[7], "k": 3})
    assert response.status_code == 200
    body = response.json()
    assert body["query"] == QUESTIONS[7] and body["answered"] is True
    assert body["threshold"] == STORED_THRESHOLD
    assert len(body["hits"]) == 3
    top = body["hits"][0]
    assert tuple(top) == HIT_FIELDS  # the CLI's and the pyfunc's names; no explain asked
    assert (top["question_id"], top["text"], top["cluster_id"]) == (str(QIDS[7]), QUESTIONS[7], "3")
    assert top["answer_id"] == "ans-3"
    assert top["distance"] == pytest.approx(0.0, abs=1e-5)
    assert top["score"] == pytest.approx(1.0, abs=1e-5)
    distances = [h["distance"] for h in body["hits"]]
    assert distances == sorted(distances)
    assert body["model"]["name"] == "local" and len(body["model"]["fingerprint"]) == 64
    assert len(response.headers["x-request-id"]) == 32


def test_search_default_k_threshold_and_clipping(client: TestClient) -> None:
    unseen = client.post("/search", json={"question": UNSEEN}).json()
    assert len(unseen["hits"]) == SETTINGS.default_k
    assert unseen["answered"] is False  # nothing within the stored threshold
    d1 = unseen["hits"][0]["distance"]
    relaxed = client.post("/search", json={"question": UNSEEN, "threshold": d1 * 1.01}).json()
    assert relaxed["answered"] is True and relaxed["threshold"] == pytest.approx(d1 * 1.01)
    # an int is a valid number; k larger than the index is clipped to it
    small = ServeSettings(max_k=100, poll_seconds=0)
    assert small.max_k > len(QUESTIONS)
    everything = client.post("/search", json={"question": UNSEEN, "k": 20, "threshold": 0})
    assert everything.status_code == 200 and len(everything.json()["hits"]) == 20


def test_batch_matches_single_searches(client: TestClient) -> None:
    questions = [UNSEEN, QUESTIONS[3], QUESTIONS[40]]
    response = client.post("/search/batch", json={"questions": questions, "k": 4})
    assert response.status_code == 200
    body = response.json()
    assert [r["query"] for r in body["results"]] == questions
    for question, got in zip(questions, body["results"], strict=True):
        want = client.post("/search", json={"question": question, "k": 4}).json()
        assert got["answered"] == want["answered"]
        assert [h["question_id"] for h in got["hits"]] == [h["question_id"] for h in want["hits"]]
    assert [r["answered"] for r in body["results"]] == [False, True, True]
    assert body["model"]["name"] == "local"


def test_explain_adds_the_parts_of_each_score(client: TestClient) -> None:
    body = client.post("/search", json={"question": QUESTIONS[7], "k": 3, "explain": True})
    assert body.status_code == 200
    for hit in body.json()["hits"]:
        part = hit.pop("explain")
        assert tuple(hit) == HIT_FIELDS
        assert set(part) == {
            "dense_distance",
            "dense_scaled",
            "bm25_score",
            "bm25_scaled",
            "matched_words",
            "dense_weight",
            "fused_score",
        }
        # a dense-only bundle: the whole score is the dense side's
        assert part["dense_weight"] == 1.0 and part["fused_score"] == hit["score"]
        assert part["bm25_score"] is None and part["matched_words"] == []
    batch = client.post(
        "/search/batch", json={"questions": [QUESTIONS[3], UNSEEN], "k": 2, "explain": True}
    ).json()
    assert all("explain" in h for r in batch["results"] for h in r["hits"])
    plain = client.post("/search/batch", json={"questions": [QUESTIONS[3]], "k": 2}).json()
    assert all("explain" not in h for r in plain["results"] for h in r["hits"])
    refused = client.post("/search", json={"question": QUESTIONS[7], "explain": "yes"})
    assert_refused(refused, 422, "invalid_request", "explain")


def test_health_ready_version(client: TestClient, bundle_dir: Path) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    version = client.get("/version").json()
    model = version["model"]
    assert model["name"] == "local" and model["version"] is None
    # no absolute path: outside the project directory, the bundle's folder name only
    assert model["source"] == f"local:{bundle_dir.name}"
    assert str(bundle_dir.parent) not in json.dumps(version)
    assert len(model["fingerprint"]) == 64
    assert (model["questions"], model["dim"], model["threshold"]) == (50, 8, STORED_THRESHOLD)
    assert model["fusion"] is None  # this bundle ranks by its encoder alone
    assert model["encoder_kernel"] == "folded"  # QPR_SERVE_FOLD_ENCODER's default
    assert model["spelling"] is False  # its search.json predates spelling correction
    assert "git_commit" in version["service"] and version["service"]["package_version"]
    assert version["reload"]["refused"] == 0 and version["reload"]["swaps"] == 1
    assert version["limits"]["max_k"] == SETTINGS.max_k


def test_metrics_in_prometheus_format(client: TestClient) -> None:
    client.post("/search", json={"question": QUESTIONS[1]})
    client.post("/search", json={"question": ""})
    client.get("/nowhere/at/all")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    lines = text.splitlines()
    assert "# TYPE qpr_http_requests_total counter" in lines
    assert "# TYPE qpr_http_request_duration_seconds histogram" in lines

    def value(prefix: str) -> float:
        found = [ln for ln in lines if ln.startswith(prefix + " ")]
        assert len(found) == 1, (prefix, found)
        return float(found[0].rsplit(" ", 1)[1])

    assert value('qpr_http_requests_total{endpoint="/search",method="POST",status="200"}') >= 1
    assert value('qpr_http_requests_total{endpoint="/search",method="POST",status="422"}') >= 1
    # unknown paths are pooled, never a label value of their own
    assert value('qpr_http_requests_total{endpoint="other",method="GET",status="404"}') >= 1
    assert "nowhere" not in text
    assert "_created" not in text  # only the families docs/serving.md lists
    histogram, search = "qpr_http_request_duration_seconds", 'endpoint="/search"'
    count = value('qpr_http_request_duration_seconds_count{endpoint="/search"}')
    inf = value('qpr_http_request_duration_seconds_bucket{endpoint="/search",le="+Inf"}')
    assert count == inf >= 2
    search_buckets = [ln for ln in lines if ln.startswith(f"{histogram}_bucket{{{search}")]
    bounds = [ln.split('le="')[1].split('"')[0] for ln in search_buckets]
    assert [float(b) for b in bounds] == [*LATENCY_BUCKETS, math.inf]
    fingerprint = client.get("/version").json()["model"]["fingerprint"]
    # labels sorted by name, as prometheus_client writes them
    info = f'qpr_model_info{{alias="",fingerprint="{fingerprint}",name="local",version=""}}'
    assert value(info) == 1
    assert value("qpr_ready") == 1
    assert value('qpr_model_reloads_total{outcome="swapped"}') == 1
    assert value('qpr_questions_total{answered="true"}') >= 1


def test_request_id_is_echoed(client: TestClient) -> None:
    given = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    # an id that could smuggle anything into logs is replaced by our own
    odd = client.get("/healthz", headers={"X-Request-ID": 'x" <script>'})
    assert len(odd.headers["x-request-id"]) == 32 and "<" not in odd.headers["x-request-id"]


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("payload", "status", "code", "words"),
    [
        ({"question": ""}, 422, "empty_question", ["empty"]),
        ({"question": "   \n\t "}, 422, "empty_question", ["whitespace"]),
        ({"question": "why " * 2500}, 422, "question_too_long", ["10,000 characters", "200"]),
        ({"question": "?!? ..."}, 422, "invalid_question", ["no words"]),
        ({"question": 42}, 422, "invalid_request", ["question", "string"]),
        ({"question": None}, 422, "invalid_request", ["question"]),
        ({"question": ["a"]}, 422, "invalid_request", ["question"]),
        ({}, 422, "invalid_request", ["question", "required"]),
        ({"question": "hi", "k": "5"}, 422, "invalid_request", ["k", "integer"]),
        ({"question": "hi", "k": 2.5}, 422, "invalid_request", ["k"]),
        ({"question": "hi", "k": True}, 422, "invalid_request", ["k"]),
        ({"question": "hi", "threshold": "1"}, 422, "invalid_request", ["threshold"]),
        ({"question": "hi", "top_k": 3}, 422, "invalid_request", ["top_k", "not permitted"]),
        ({"question": "hi", "k": 0}, 422, "k_out_of_range", ["between 1 and 20", "0"]),
        ({"question": "hi", "k": -3}, 422, "k_out_of_range", ["-3"]),
        ({"question": "hi", "k": 21}, 422, "k_out_of_range", ["21"]),
        ({"question": "hi", "k": 10**30}, 422, "k_out_of_range", []),
        ({"question": "hi", "threshold": -1}, 422, "invalid_threshold", [">= 0"]),
        ([{"question": "hi"}], 422, "invalid_request", ["JSON object", "list"]),
        ("how do i reset my printer", 422, "invalid_request", ["JSON object", "str"]),
    ],
)
def test_bad_search_requests(client, payload, status, code, words) -> None:
    assert_refused(client.post("/search", json=payload), status, code, *words)


@pytest.mark.parametrize(
    ("body", "headers", "status", "code", "words"),
    [
        (b'{"question": "caf\xe9 au lait"}', {}, 400, "invalid_utf8", ["UTF-8", "byte 17"]),
        (b"\xff\xfe{}", {}, 400, "invalid_utf8", ["UTF-8"]),
        (b'{"question": ', {}, 400, "invalid_json", ["not valid JSON"]),
        (b'{"question": "hi", "threshold": NaN}', {}, 400, "invalid_json", ["NaN"]),
        (b'{"question": "hi", "threshold": Infinity}', {}, 400, "invalid_json", []),
        (b"", {}, 400, "empty_body", ["empty"]),
        # Nested past the parser's recursion limit in 2 KB: refused, not a 500.
        (b"[" * 1000 + b"]" * 1000, {}, 400, "invalid_json", ["nested"]),
        (b'{"question": ' + b"[" * 3000 + b"]" * 3000 + b"}", {}, 400, "invalid_json", []),
        # A lone surrogate is valid JSON but no Unicode text: refused before any search.
        (b'{"question": "caf\\ud800 au lait"}', {}, 400, "invalid_unicode", ["surrogate"]),
        (b'{"questions": ["ok", "\\udfff"]}', {}, 400, "invalid_unicode", []),
        (b"question=hi", {"content-type": "application/x-www-form-urlencoded"}, 415, "", []),
    ],
)
def test_bad_bodies(client, body, headers, status, code, words) -> None:
    headers = {"content-type": "application/json", **headers}
    response = client.post("/search", content=body, headers=headers)
    assert_refused(response, status, code or "unsupported_media_type", *words)


@pytest.mark.parametrize(
    ("content_type", "words"),
    [
        (None, ["got none"]),
        ("text/plain", ["text/plain"]),
        ("application/x-www-form-urlencoded", []),
        ("application/jsonx", []),
        ("application/vnd.api+json", []),
        ("text/json", []),
        ("application/json; charset=latin-1", ["UTF-8", "latin-1"]),
        ("application/json; charset=utf-16", ["utf-16"]),
    ],
)
def test_content_type_must_be_json(client, content_type, words) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    for path in ("/search", "/search/batch"):
        response = client.post(path, content=b'{"question": "hi"}', headers=headers)
        assert_refused(response, 415, "unsupported_media_type", *words)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        'application/json;charset="UTF-8"',
        "application/json; charset=utf8; q=1",
    ],
)
def test_json_content_types_are_accepted(client, content_type) -> None:
    body = json.dumps({"question": QUESTIONS[0], "k": 1}).encode()
    response = client.post("/search", content=body, headers={"content-type": content_type})
    assert response.status_code == 200, response.text


def test_oversize_body_by_content_length(client: TestClient) -> None:
    big = json.dumps({"question": "x" * (SETTINGS.max_body_bytes + 10)})
    response = client.post("/search", content=big, headers={"content-type": "application/json"})
    assert_refused(response, 413, "body_too_large", str(SETTINGS.max_body_bytes))


def test_oversize_body_streamed_without_length(client: TestClient) -> None:
    # A generator body goes out chunked, with no Content-Length: only counting the bytes
    # as they arrive can stop it.
    def chunks() -> Iterator[bytes]:
        yield b'{"question": "'
        for _ in range(20):
            yield b"y" * 1000
        yield b'"}'

    response = client.post(
        "/search", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert_refused(response, 413, "body_too_large", "larger than the limit")


def test_unparsable_content_length_is_refused(client: TestClient) -> None:
    response = client.post(
        "/search",
        content=b"{}",
        headers={"content-type": "application/json", "content-length": "x"},
    )
    assert_refused(response, 400, "bad_request", "Content-Length 'x'")


@pytest.mark.parametrize(
    ("payload", "code", "words"),
    [
        ({"questions": []}, "empty_batch", ["at least one"]),
        ({"questions": ["a b"] * 5}, "batch_too_large", ["5 questions", "limit is 4"]),
        ({"questions": [QUESTIONS[0], "  "]}, "empty_question", ["questions[1]"]),
        ({"questions": [QUESTIONS[0], "z" * 201]}, "question_too_long", ["questions[1]"]),
        ({"questions": [QUESTIONS[0], 7]}, "invalid_request", ["questions.1"]),
        ({"questions": "how do i"}, "invalid_request", ["questions"]),
        ({"questions": [QUESTIONS[0]], "k": 0}, "k_out_of_range", []),
        ({"questions": [QUESTIONS[0], "?!"]}, "invalid_question", ["question 1"]),
        ({"question": QUESTIONS[0]}, "invalid_request", ["questions", "required"]),
    ],
)
def test_bad_batch_requests(client, payload, code, words) -> None:
    assert_refused(client.post("/search/batch", json=payload), 422, code, *words)


def test_unknown_path_and_wrong_method(client: TestClient) -> None:
    assert_refused(client.get("/nope"), 404, "not_found", "/nope", "/search")
    wrong = client.get("/search")
    assert_refused(wrong, 405, "method_not_allowed", "GET /search")


def test_a_long_url_is_not_echoed_whole(client: TestClient) -> None:
    long = "/" + "a" * 60_000  # httpx refuses URLs past 64 KB; uvicorn takes 100 KB
    body = assert_refused(client.get(long), 404, "not_found", "59,901 more characters")
    assert len(body["message"]) < 400 and len(client.get(long).content) < 1000
    odd = assert_refused(client.get("/a%1b%5b2Jb"), 404, "not_found")
    assert "\x1b" not in odd["message"] and "\\x1b[2J" in odd["message"]


def test_internal_error_gives_request_id_not_trace(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bundle = client.app.state.service.holder.current.bundle

    def broken(*args, **kwargs):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(bundle, "search", broken)
    with caplog.at_level(logging.ERROR, logger="qpr.serve"):
        response = client.post("/search", json={"question": QUESTIONS[0]})
    body = assert_refused(response, 500, "internal_error", "request id")
    assert "secret" not in response.text
    # the log has what the client must not see: the trace, under the same request id
    logged = [r for r in caplog.records if body["request_id"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "secret internal detail" in str(logged[0].exc_info[1])
    monkeypatch.undo()
    assert client.post("/search", json={"question": QUESTIONS[0]}).status_code == 200


def test_not_ready_without_a_model(tmp_path: Path) -> None:
    with TestClient(create_app(LocalSource(tmp_path), SETTINGS)) as empty:
        assert empty.get("/healthz").status_code == 200
        ready = empty.get("/readyz")
        assert ready.status_code == 503 and "missing" in ready.json()["reason"]
        assert_refused(empty.post("/search", json={"question": "hi"}), 503, "not_ready")
        version = empty.get("/version").json()
        assert version["model"] is None and version["reload"]["refused"] == 1
        assert "incomplete model bundle" in version["reload"]["last_refused"]["reason"]
        assert "qpr_ready 0.0" in empty.get("/metrics").text.splitlines()


def test_limits_from_environment(monkeypatch: pytest.MonkeyPatch, bundle_dir: Path) -> None:
    monkeypatch.setenv("QPR_SERVE_MAX_K", "3")
    monkeypatch.setenv("QPR_SERVE_DEFAULT_K", "2")
    monkeypatch.setenv("QPR_SERVE_MODELS_DIR", str(bundle_dir))
    monkeypatch.setenv("QPR_SERVE_POLL_SECONDS", "0")
    monkeypatch.setenv("QPR_SERVE_STARTUP_WAIT", "60")
    with TestClient(create_app()) as env_client:
        assert len(env_client.post("/search", json={"question": UNSEEN}).json()["hits"]) == 2
        refused = env_client.post("/search", json={"question": UNSEEN, "k": 4})
        assert_refused(refused, 422, "k_out_of_range", "between 1 and 3")


def test_search_depth_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from qpr.serve.settings import ServeSettings, SettingsError

    monkeypatch.setenv("QPR_SERVE_EF_SEARCH", "96")
    monkeypatch.setenv("QPR_SERVE_NPROBE", "4")
    settings = ServeSettings.from_env()
    assert (settings.ef_search, settings.nprobe) == (96, 4)
    monkeypatch.setenv("QPR_SERVE_EF_SEARCH", "0")
    with pytest.raises(SettingsError, match="ef_search"):
        ServeSettings.from_env()
    monkeypatch.setenv("QPR_SERVE_EF_SEARCH", "many")
    with pytest.raises(SettingsError, match="QPR_SERVE_EF_SEARCH"):
        ServeSettings.from_env()


# ---------------------------------------------------------------- process-level


def test_service_never_imports_torch(bundle_dir: Path) -> None:
    script = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "import qpr.cli\n"
        "from qpr.serve.app import create_app\n"
        "from qpr.serve.settings import ServeSettings\n"
        "from qpr.serve.sources import LocalSource, RegistrySource\n"
        "# the registry path imports MLflow, which must not pull torch in either; a server\n"
        "# address that is never contacted keeps MLflow from creating a local store\n"
        "RegistrySource('qpr', tracking_uri='http://127.0.0.1:9', registry_uri='http://127.0.0.1:9')\n"
        "import mlflow.artifacts\n"
        f"app = create_app(LocalSource({str(bundle_dir)!r}), "
        "ServeSettings(poll_seconds=0, startup_wait=60))\n"
        "with TestClient(app) as c:\n"
        f"    r = c.post('/search', json={{'question': {QUESTIONS[0]!r}}})\n"
        "    assert r.status_code == 200, r.text\n"
        "    assert c.post('/search/batch', json={'questions': ['a printer']}).status_code == 200\n"
        "leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not leaked, leaked\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_serve_command_rejects_two_sources(bundle_dir: Path) -> None:
    from typer.testing import CliRunner

    from qpr.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--models-dir", str(bundle_dir), "--registry-name", "qpr"]
    )
    assert result.exit_code == 1 and "not both" in result.output


@pytest.mark.slow
def test_serve_command_answers_over_http(tmp_path: Path) -> None:
    """`qpr serve` end to end: uvicorn on a free loopback port, one search, clean stop.
    Ids above 2^53 reach a client whole, even one that reads numbers as doubles."""
    import socket
    import time

    import httpx

    clusters = [BIG_QIDS[i - i % 2] for i in range(len(QUESTIONS))]  # a pair's first id
    bundle_dir = build_bundle(tmp_path / "models", QUESTIONS, BIG_QIDS, cluster_ids=clusters)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(bundle_dir)]
    server = subprocess.Popen(
        [*command, "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "the service did not become ready in 60 s"
            time.sleep(0.2)
        for i in (3, len(QUESTIONS) - 1):
            response = httpx.post(
                f"http://127.0.0.1:{port}/search", json={"question": QUESTIONS[i], "k": 2}
            )
            assert response.status_code == 200
            # JavaScript's JSON.parse: every number a double.
            top = json.loads(response.text, parse_int=float)["hits"][0]
            assert (top["question_id"], top["cluster_id"]) == (str(BIG_QIDS[i]), str(clusters[i]))
            assert int(top["question_id"]) == BIG_QIDS[i] and float(BIG_QIDS[i]) != BIG_QIDS[i]
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert "serving local" in output  # the reloader's log line reached the console
    assert "Traceback" not in output


def test_sigterm_stops_the_service_while_the_registry_never_answers(tmp_path: Path) -> None:
    """A registry that accepts connections and never answers: `qpr serve` still stops
    within 3 s of SIGTERM (the reloader's registry call is not waited for)."""
    import socket
    import threading
    import time

    import httpx

    registry = socket.socket()
    registry.bind(("127.0.0.1", 0))
    registry.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(registry.accept()[0])  # held open, never answered

    threading.Thread(target=accept, daemon=True).start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{registry.getsockname()[1]}",
        "QPR_SERVE_CACHE_DIR": str(tmp_path / "cache"),
    }
    command = [sys.executable, "-m", "qpr.cli", "serve", "--registry-name", "qpr"]
    server = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not accepted or not _answers(httpx, f"http://127.0.0.1:{port}/healthz"):
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "no health answer and no registry call in 60 s"
            time.sleep(0.1)
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=3)  # TimeoutExpired fails the test
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        registry.close()
        for conn in accepted:
            conn.close()
    assert "Application shutdown complete" in output
    assert "Traceback" not in output


def _answers(httpx: Any, url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_filters_select_the_questions_searched(client: TestClient) -> None:
    wanted = ["ans-3", "ans-20"]
    body = client.post(
        "/search", json={"question": QUESTIONS[7], "k": 10, "filters": {"answer_id": wanted}}
    ).json()
    assert body["hits"] and {h["answer_id"] for h in body["hits"]} == set(wanted)
    assert body["hits"][0]["question_id"] == str(QIDS[7]) and body["answered"]
    batch = client.post(
        "/search/batch",
        json={"questions": [QUESTIONS[7], UNSEEN], "filters": {"answer_id": "ans-20"}},
    ).json()
    assert [{h["answer_id"] for h in r["hits"]} for r in batch["results"]] == [{"ans-20"}] * 2
    none = client.post("/search", json={"question": QUESTIONS[7], "filters": {"answer_id": []}})
    assert none.status_code == 200 and none.json()["hits"] == [] and not none.json()["answered"]


def test_unknown_or_malformed_filters_are_refused(client: TestClient) -> None:
    for path, body in (
        ("/search", {"question": QUESTIONS[0]}),
        ("/search/batch", {"questions": [QUESTIONS[0]]}),
    ):
        response = client.post(path, json={**body, "filters": {"locale": "en"}})
        refused = assert_refused(response, 400, "unknown_filter_field", "'locale'", "answer_id")
        assert refused["details"] == [{"field": "filters.locale", "known": ["answer_id"]}]
    bad = client.post("/search", json={"question": QUESTIONS[0], "filters": {"answer_id": 3}})
    assert_refused(bad, 422, "invalid_request", "filters")

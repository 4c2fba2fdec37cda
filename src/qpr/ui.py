"""`qpr ui` (`make ui`): the Prefect UI and the MLflow UI over this project's own records.

`make run` and `qpr retrain` record their flow runs in the project's Prefect home
(`.prefect/prefect.db`, written through a temporary API server per run) and their MLflow
runs in `mlflow.db` and `mlruns/`. Here a Prefect server and an MLflow server start on
those same files, on 127.0.0.1, and Ctrl-C stops both. In team mode (`PREFECT_API_URL`,
`MLFLOW_TRACKING_URI` naming servers) there is nothing to start: the shared server's
address is printed instead.

Both run as subprocesses (`python -m prefect`, `python -m mlflow`): nothing here imports
either framework.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qpr.environment import MLFLOW_UI_PORT, PREFECT_UI_PORT, UI_HOST
from qpr.ops.processes import stop_on_sigterm

# Seconds a server gets to stop on SIGTERM before it is killed.
STOP_TIMEOUT_S = 10


@dataclass(frozen=True)
class UiServer:
    """One UI: where to open it and, for a local one, how to start it."""

    name: str
    url: str
    command: tuple[str, ...] = ()  # empty: a shared server that is already running
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the caller's
    port: int | None = None  # a local one's, checked free before anything starts
    port_option: str = ""  # the `qpr ui` option that picks another port

    def busy(self) -> str | None:
        """Why this local server cannot start on its port, in a line saying what to do; None
        when the port is free. The servers' own messages name their own flags (`--port`)."""
        if not self.local or self.port is None:
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As the servers bind: a port left in TIME_WAIT by a stopped server is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((UI_HOST, self.port))
            except OSError:
                return (
                    f"{self.name} UI: port {self.port} on {UI_HOST} is in use (another "
                    f"{self.name} server?): stop it, or pass {self.port_option} PORT"
                )
        return None

    @property
    def local(self) -> bool:
        return bool(self.command)


def _remote(uri: str | None) -> bool:
    return bool(uri) and uri.split(":", 1)[0] in ("http", "https")


def prefect_server(root: Path, env: Mapping[str, str], *, port: int = PREFECT_UI_PORT) -> UiServer:
    """The Prefect UI: the shared server of PREFECT_API_URL, else a server on the
    project's Prefect home (PREFECT_HOME, default `root/.prefect`)."""
    api_url = env.get("PREFECT_API_URL")
    if _remote(api_url):
        # The UI of a server is its API address without /api, unless PREFECT_UI_URL says.
        ui_url = env.get("PREFECT_UI_URL") or api_url.rstrip("/").removesuffix("/api")
        return UiServer("Prefect", ui_url)
    home = env.get("PREFECT_HOME") or str(root / ".prefect")
    url = f"http://{UI_HOST}:{port}"
    command = (sys.executable, "-m", "prefect", "server", "start")
    # --no-services: a viewer; no scheduler or late-run service writing to the SQLite file
    # that the pipeline's runs write to at the same time.
    command += ("--host", UI_HOST, "--port", str(port), "--no-services")
    server_env = {
        "PREFECT_HOME": home,
        "PREFECT_SERVER_UI_ENABLED": "true",
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_UI_URL": url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    return UiServer("Prefect", url, command, server_env, port, "--prefect-port")


def mlflow_server(root: Path, env: Mapping[str, str], *, port: int = MLFLOW_UI_PORT) -> UiServer:
    """The MLflow UI: the shared server of MLFLOW_TRACKING_URI, else a server on the
    project's store (default `root/mlflow.db`, artifacts in `root/mlruns`)."""
    store = env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}"
    if _remote(store):
        return UiServer("MLflow", store.rstrip("/"))
    artifacts = env.get("QPR_MLFLOW_ARTIFACTS") or (root / "mlruns").as_uri()
    command = (sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store)
    command += ("--default-artifact-root", artifacts, "--host", UI_HOST, "--port", str(port))
    # One worker: a UI for one person, on a machine that may be training at the same time.
    command += ("--workers", "1")
    return UiServer("MLflow", f"http://{UI_HOST}:{port}", command, {}, port, "--mlflow-port")


def ui_servers(
    root: Path,
    env: Mapping[str, str],
    *,
    prefect_port: int = PREFECT_UI_PORT,
    mlflow_port: int = MLFLOW_UI_PORT,
) -> list[UiServer]:
    """The Prefect UI and the MLflow UI for the project at `root` under `env`."""
    return [
        prefect_server(root, env, port=prefect_port),
        mlflow_server(root, env, port=mlflow_port),
    ]


def _stop(processes: list[subprocess.Popen]) -> None:
    """Stop the servers and whatever they started (each its own process group): all are
    asked at once, then each gets STOP_TIMEOUT_S before SIGKILL."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def serve(
    servers: list[UiServer],
    *,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Start the local servers, print every address, wait. Ctrl-C stops them all (exit 0);
    one that stops by itself (a bad store) stops the others (exit 1). A port in use starts
    nothing: exit 1, with the option that picks another."""
    busy = [reason for server in servers if (reason := server.busy())]
    for reason in busy:
        log(reason)
    if busy:
        return 1
    running: list[tuple[UiServer, subprocess.Popen]] = []
    previous = stop_on_sigterm()
    try:
        for server in servers:
            if server.local:
                # Its own process group: stopping it stops the workers it starts too.
                process = subprocess.Popen(
                    server.command, env={**os.environ, **server.env}, start_new_session=True
                )
                running.append((server, process))
        for server in servers:
            where = "starting here" if server.local else "shared server"
            log(f"{server.name} UI: {server.url}  ({where})")
        if not running:
            return 0
        log("Ctrl-C stops " + ("both" if len(running) == 2 else "it"))
        while all(process.poll() is None for _, process in running):
            sleep(0.5)
        stopped = [f"{s.name} (exit {p.returncode})" for s, p in running if p.poll() is not None]
        log(f"{', '.join(stopped)} stopped; stopping the rest")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop([process for _, process in running])
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

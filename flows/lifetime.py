"""A flow program (`python -m flows.stage NAME`, flows.pipeline, flows.retrain,
flows.refresh) leaves nothing running when it ends, however it is stopped.

With no PREFECT_API_URL, Prefect 3 starts a temporary API server (a uvicorn child) at the
first flow run and stops it only from an `atexit` hook. No atexit hook runs after a
SIGKILL, nor after Python's default SIGTERM handler, which Prefect's flow engine hands a
SIGTERM back to. The server then ran on for ever (75 minutes later, after `dvc exp run`
stopped a stage). So a flow program

- starts that server itself, as Prefect would (`start_temporary_api`), as a child that
  gets SIGKILL when this process dies (Linux parent-death signal), and points
  PREFECT_API_URL at it: the flows here and the stages under `dvc repro` report to it;
- turns SIGTERM and SIGHUP into SystemExit(128 + signal) (`exit_on_signals`), so
  `finally` blocks and atexit hooks run and the exit status names the signal.

The server is stopped at exit by an atexit hook registered before Prefect's own; atexit
runs the last-registered first, so Prefect sends its last logs and events before the
server goes. Or the kernel stops it when we die. (flows.retrain keeps its own SIGTERM
handling, `qpr.ops.processes.stops_with_its_group`, and takes only the server from here.)
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from qpr.errors import QPRError
from qpr.parent_death import set_parent_death_signal

HOST = "127.0.0.1"
# Signals that end a flow program as an exception, so its clean-up runs.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# Seconds the server gets to stop after SIGTERM before SIGKILL (Prefect's own figure).
STOP_TIMEOUT_S = 5.0
START_ATTEMPTS = 3


@dataclass
class TemporaryAPI:
    """A temporary Prefect API server that this process started and owns."""

    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/api"

    def healthy(self) -> bool:
        """True when the server answers its health check (no proxy: a direct socket)."""
        connection = http.client.HTTPConnection(HOST, self.port, timeout=2)
        try:
            connection.request("GET", "/api/health")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def wait_until_up(self, timeout_s: float) -> bool:
        """True once healthy; False when the server exited first (a port taken since we
        chose it); TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.healthy():
                return True
            time.sleep(0.1)
        raise TimeoutError(f"the temporary Prefect API server gave no answer in {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; safe to call twice."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()


_OWNED: TemporaryAPI | None = None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _launch(port: int) -> subprocess.Popen:
    """The server as Prefect's SubprocessASGIServer starts it (prefect 3.8), plus the
    parent-death signal that Prefect's Popen lacks (why this module exists)."""
    from prefect.settings import get_current_settings

    command = [
        *(sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app"),
        *("--host", HOST, "--port", str(port), "--log-level", "error", "--lifespan", "on"),
    ]
    env = {
        **os.environ,
        # ephemeral: no UI and no background services, as for Prefect's temporary server
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **get_current_settings().to_environment_variables(exclude_unset=True),
    }
    return subprocess.Popen(command, env=env, preexec_fn=set_parent_death_signal(signal.SIGKILL))


def start_temporary_api() -> str | None:
    """Start the temporary Prefect API server this process runs its flows against, unless
    a Prefect API is set (team mode, a test harness) or it runs already; its URL or None.

    Call it from the main thread: the parent-death signal follows the thread that started
    the child."""
    global _OWNED
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    if _OWNED is not None:
        return _OWNED.url
    if PREFECT_API_URL.value():
        return None
    timeout_s = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    for _ in range(START_ATTEMPTS):
        port = _free_port()
        api = TemporaryAPI(_launch(port), port)
        atexit.register(api.stop)
        if api.wait_until_up(timeout_s):
            break
    else:
        code = api.process.returncode
        raise RuntimeError(f"the temporary Prefect API server exited with code {code}")
    _OWNED = api
    # Prefect reads its settings from the environment when it is imported: refresh them.
    os.environ["PREFECT_API_URL"] = api.url
    refresh_global_settings_context()
    return api.url


class NoScheduler(QPRError, RuntimeError):
    """A flow asked to run on a schedule with no Prefect server to schedule it."""


def require_scheduler() -> None:
    """NoScheduler unless PREFECT_API_URL names a server: a temporary local API has no
    scheduler, so a runner on it (`flow.serve`) would wait for ever."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise NoScheduler(
            "scheduling needs a Prefect server: start one (`prefect server start`) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api, then run this again"
        )


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread, as a
    shell would report the signal. Prefect's flow engine catches SIGTERM during a run,
    marks the run crashed and sends it again: to this handler. Handlers restored after."""
    previous = {sig: signal.signal(sig, _exit) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def flow_program() -> Iterator[None]:
    """Around a flow program's work: stopped by a signal it exits cleanly, and its
    temporary Prefect API server (started here when none is set) dies with it."""
    with exit_on_signals():
        start_temporary_api()
        yield

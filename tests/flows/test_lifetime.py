"""flows/lifetime.py: a flow program's temporary Prefect API server dies with it, whether
the program is stopped by SIGTERM, SIGHUP or SIGKILL; stopped by a signal it handles,
the program exits cleanly with 128 + the signal's number. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from qpr.ops.processes import pid_alive

# What `python -m flows.stage NAME` does around its flow, with a flow that waits.
PROGRAM = """
import sys, time
from pathlib import Path

import flows  # the shared environment, as for every flow program
from prefect import flow

from flows.lifetime import flow_program


@flow(name="wait")
def wait(ready: str) -> None:
    import os
    Path(ready).write_text(os.environ["PREFECT_API_URL"])
    # Working in steps, as a stage does: Python runs a signal handler in the main thread
    # between two steps (a signal that lands in another thread never ends one long sleep).
    for _ in range(3000):
        time.sleep(0.1)


with flow_program():
    wait(sys.argv[1])
"""


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Prefect home for the module: its database is created once."""
    return tmp_path_factory.mktemp("prefect-home")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _start_flow_program(tmp_path: Path, prefect_home: Path) -> tuple[subprocess.Popen, int, str]:
    """The program, once its flow runs: (process, its server's pid, the server's URL)."""
    script, ready = tmp_path / "program.py", tmp_path / "ready"
    script.write_text(PROGRAM, encoding="utf-8")
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)
    program = subprocess.Popen([sys.executable, str(script), str(ready)], cwd=tmp_path, env=env)
    deadline = time.monotonic() + 180
    while not ready.is_file() or not ready.read_text():
        assert program.poll() is None, f"the program ended with {program.returncode}"
        assert time.monotonic() < deadline, "the flow never started"
        time.sleep(0.2)
    url = ready.read_text()
    servers = [pid for pid in _children(program.pid) if b"uvicorn" in _cmdline(pid)]
    assert len(servers) == 1, servers
    return program, servers[0], url


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _answers(url: str) -> bool:
    import http.client

    parsed = urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=2)
    try:
        connection.request("GET", "/api/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid):  # a zombie counts as gone: it runs nothing
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow  # a Prefect API server per case: seconds each on 2 cores
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda sig: sig.name
)
def test_the_temporary_server_dies_with_its_program(
    sig: signal.Signals, tmp_path: Path, prefect_home: Path
) -> None:
    program, server, url = _start_flow_program(tmp_path, prefect_home)
    try:
        assert urlparse(url).hostname == "127.0.0.1" and _answers(url)
        program.send_signal(sig)
        code = program.wait(timeout=60)
        assert _gone_within(server, 5), f"the server {server} outlived its program"
        assert not _answers(url)
        # A handled signal unwinds (atexit hooks ran); SIGKILL cannot be handled.
        assert code == (-sig if sig == signal.SIGKILL else 128 + sig)
    finally:
        for pid in (program.pid, server):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        program.wait()


def _server_up(program: subprocess.Popen, timeout_s: float = 180) -> tuple[int, str]:
    """The pid and URL of `program`'s temporary server, once it answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert program.poll() is None, f"the program ended with {program.returncode}"
        for pid in _children(program.pid):
            command = _cmdline(pid).split(b"\0")
            if b"uvicorn" in command and b"--port" in command:
                port = int(command[command.index(b"--port") + 1])
                url = f"http://127.0.0.1:{port}/api"
                if _answers(url):
                    return pid, url
        time.sleep(0.1)
    raise AssertionError("no temporary server answered")


@pytest.mark.slow
def test_a_stage_stopped_by_sigterm_takes_its_server_along(
    tiny_params_file: Path, prefect_home: Path
) -> None:
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)
    stage = subprocess.Popen(
        [sys.executable, "-m", "flows.stage", "cluster", "--params", str(tiny_params_file)],
        cwd=tiny_params_file.parent,
        env=env,
    )
    try:
        server, url = _server_up(stage)
        stage.send_signal(signal.SIGTERM)  # what `dvc exp run` sent the student stage
        assert stage.wait(timeout=60) == 128 + signal.SIGTERM
        assert _gone_within(server, 5) and not _answers(url)
    finally:
        stage.kill()
        stage.wait()


def test_a_set_prefect_api_starts_no_server(tmp_path: Path) -> None:
    # Team mode: the flows report to that server; nothing needs to listen for this check.
    script = (
        "import os, flows\n"
        "from flows.lifetime import start_temporary_api\n"
        "print(start_temporary_api(), os.environ['PREFECT_API_URL'])\n"
    )
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "http://127.0.0.1:9/api"]

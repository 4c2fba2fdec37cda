"""`qpr ui`: which servers start on which files, and that Ctrl-C stops them all."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from qpr.ui import UiServer, mlflow_server, prefect_server, serve, ui_servers

ROOT = Path(__file__).resolve().parents[1]


def test_local_servers_use_the_projects_own_records(tmp_path: Path) -> None:
    prefect, mlflow = ui_servers(tmp_path, {}, prefect_port=4201, mlflow_port=5001)
    assert prefect.url == "http://127.0.0.1:4201"
    assert prefect.env["PREFECT_HOME"] == str(tmp_path / ".prefect")
    assert prefect.env["PREFECT_SERVER_UI_ENABLED"] == "true"
    assert prefect.env["PREFECT_UI_URL"] == prefect.url
    assert prefect.command[1:5] == ("-m", "prefect", "server", "start")
    assert prefect.command[5:7] == ("--host", "127.0.0.1")
    assert mlflow.url == "http://127.0.0.1:5001"
    command = " ".join(mlflow.command)
    assert f"--backend-store-uri sqlite:///{tmp_path / 'mlflow.db'}" in command
    assert f"--default-artifact-root {(tmp_path / 'mlruns').as_uri()}" in command
    assert "--host 127.0.0.1 --port 5001" in command


def test_the_environment_names_the_home_and_the_store(tmp_path: Path) -> None:
    env = {
        "PREFECT_HOME": "/elsewhere/.prefect",
        "MLFLOW_TRACKING_URI": "sqlite:////elsewhere/mlflow.db",
        "QPR_MLFLOW_ARTIFACTS": "file:///elsewhere/mlruns",
    }
    assert prefect_server(tmp_path, env).env["PREFECT_HOME"] == "/elsewhere/.prefect"
    command = mlflow_server(tmp_path, env).command
    assert "sqlite:////elsewhere/mlflow.db" in command
    assert "file:///elsewhere/mlruns" in command


def test_team_mode_starts_nothing_and_names_the_shared_servers(tmp_path: Path) -> None:
    env = {
        "PREFECT_API_URL": "http://prefect.team:4200/api",
        "MLFLOW_TRACKING_URI": "https://mlflow.team/",
    }
    prefect, mlflow = ui_servers(tmp_path, env)
    assert (prefect.url, prefect.local) == ("http://prefect.team:4200", False)
    assert (mlflow.url, mlflow.local) == ("https://mlflow.team", False)
    printed: list[str] = []
    assert serve([prefect, mlflow], log=printed.append) == 0
    assert any("http://prefect.team:4200" in line for line in printed)
    env["PREFECT_UI_URL"] = "https://prefect-ui.team"
    assert prefect_server(tmp_path, env).url == "https://prefect-ui.team"


def _sleeper(name: str, seconds: float = 60) -> UiServer:
    code = f"import time; time.sleep({seconds})"
    return UiServer(name, f"http://127.0.0.1/{name}", (sys.executable, "-c", code))


def test_ctrl_c_stops_every_server() -> None:
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "Popen", popen)
        printed: list[str] = []
        code = serve([_sleeper("a"), _sleeper("b")], log=printed.append, sleep=interrupt)
    assert code == 0
    assert len(started) == 2 and all(p.poll() is not None for p in started)
    assert "Ctrl-C stops both" in printed


def test_sigterm_stops_every_server(tmp_path: Path) -> None:
    """`docker stop` or a test harness sends SIGTERM: the servers, in their own process
    groups, stop with the ui process instead of running on."""
    pids = tmp_path / "pids"
    script = f"""
import subprocess, sys
from pathlib import Path
from qpr.ui import UiServer, serve
real = subprocess.Popen
def popen(*args, **kwargs):
    process = real(*args, **kwargs)
    with open({str(pids)!r}, "a") as out:
        out.write(f"{{process.pid}}\\n")
    return process
subprocess.Popen = popen
code = "import time; time.sleep(60)"
servers = [UiServer(n, "http://127.0.0.1/" + n, (sys.executable, "-c", code)) for n in "ab"]
sys.exit(serve(servers))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    ui = subprocess.Popen(
        [sys.executable, "-u", "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    assert ui.stdout is not None
    assert "Ctrl-C stops both" in [ui.stdout.readline() for _ in range(3)][-1]
    ui.send_signal(signal.SIGTERM)
    assert ui.wait(timeout=30) == 0
    children = [int(line) for line in pids.read_text().split()]
    assert len(children) == 2
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_one_server_stopping_stops_the_other() -> None:
    printed: list[str] = []
    code = serve([_sleeper("lasting"), _sleeper("brief", 0)], log=printed.append)
    assert code == 1
    assert any("brief (exit 0) stopped" in line for line in printed)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str) -> object:
    request = urllib.request.Request(
        url, data=b"{}", headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.mark.slow
def test_the_ui_server_lists_the_runs_of_the_project(tmp_path: Path) -> None:
    """A flow run as `make run` makes one, then the Prefect server `qpr ui` starts on the
    same home lists it; the run's log points at that UI, without the temporary server's
    banner."""
    (tmp_path / "params.yaml").write_text("seed: 1\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "QPR_LOG"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    script = "import flows\nfrom prefect import flow\nflow(name='ui-check')(lambda: 1)()\n"
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "View at http://127.0.0.1:4200/runs/flow-run/" in run.stderr
    assert "temporary server" not in run.stderr

    server = prefect_server(tmp_path, {}, port=_free_port())
    process = subprocess.Popen(
        server.command,
        env={**env, **server.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{server.url}/api/health", timeout=2).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.5)
        flows = _post(f"{server.url}/api/flows/filter")
        assert [flow["name"] for flow in flows] == ["ui-check"]
        assert _post(f"{server.url}/api/flow_runs/count") == 1
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)


def test_a_port_in_use_starts_nothing_and_names_the_option_to_change_it(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        prefect, mlflow = ui_servers(tmp_path, {}, prefect_port=port, mlflow_port=port)
        printed: list[str] = []
        assert serve([prefect, mlflow], log=printed.append) == 1
    assert printed == [
        f"Prefect UI: port {port} on 127.0.0.1 is in use (another Prefect server?): "
        "stop it, or pass --prefect-port PORT",
        f"MLflow UI: port {port} on 127.0.0.1 is in use (another MLflow server?): "
        "stop it, or pass --mlflow-port PORT",
    ]
    assert prefect.busy() is None  # free again once closed

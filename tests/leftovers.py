"""A pytest plugin: a test session fails when a process it started still runs at its end.

At the start the session gets a mark, QPR_TEST_SESSION=<a new id>, in its environment;
every process a test starts inherits it, and so do their children (unless one is given
an environment of its own). At the end, after every fixture is torn down, the processes
carrying this session's mark get GRACE_S seconds to finish stopping. Those left are
killed (their process group first, when one of them leads it), listed with pid, age and
command line, and the session fails. The mark is read from /proc/PID/environ, which shows
a process's environment as it started: another session's processes, or the user's own,
never carry this mark and are never touched. Linux only; elsewhere the check is skipped.

Under pytest-xdist (`make test`) each worker is a session with a mark of its own; it
checks its processes and hands what it found to the controller, which fails the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from qpr.ops.processes import pid_alive, process_start_time

SESSION_VARIABLE = "QPR_TEST_SESSION"
# Seconds a server gets to finish stopping (its fixture sent SIGTERM) before it counts.
GRACE_S = 5.0
KILL_WAIT_S = 5.0

# Helpers of the pytest process itself that end when it ends (each reads a pipe from it).
ENDS_WITH_PYTEST = (
    b"from multiprocessing.resource_tracker import main",
    b"from multiprocessing.forkserver import main",
)

# Under pytest-xdist each worker is a session with its own mark; it hands what it found
# to the controller in its `workeroutput` under this key.
WORKER_KEY = "qpr_leftovers"

_mark = pytest.StashKey[str]()
_previous = pytest.StashKey["str | None"]()
_left = pytest.StashKey["list[str]"]()  # described
_from_workers = pytest.StashKey["list[str]"]()


@dataclass(frozen=True)
class Leftover:
    """A process this session started that outlived it."""

    pid: int
    command: str
    age_s: float | None

    def describe(self) -> str:
        age = "?" if self.age_s is None else f"{self.age_s:.0f} s"
        return f"pid {self.pid}, running {age}: {self.command}"


def marked(mark: str) -> list[int]:
    """The live processes (not this one) whose environment holds `mark` as an entry."""
    entry = mark.encode()
    found = []
    for path in Path("/proc").iterdir():
        if not path.name.isdigit() or int(path.name) == os.getpid():
            continue
        try:
            environ = (path / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        pid = int(path.name)
        if entry in environ.split(b"\0") and pid_alive(pid) and not _ends_with_pytest(pid):
            found.append(pid)
    return found


def _ends_with_pytest(pid: int) -> bool:
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, IndexError, ValueError):
        return False
    return parent == os.getpid() and any(helper in command for helper in ENDS_WITH_PYTEST)


def _age_s(pid: int) -> float | None:
    start = process_start_time(pid)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    return None if start is None else uptime - int(start) / os.sysconf("SC_CLK_TCK")


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    command = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return command if len(command) <= 300 else command[:297] + "..."


def kill(pids: list[int]) -> None:
    """SIGKILL to each process group that one of `pids` leads (never our own group),
    then to each pid; waits until they are gone."""
    own_group = os.getpgrp()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid != own_group:
                os.killpg(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.05)


def leftovers(mark: str, grace_s: float = GRACE_S) -> list[Leftover]:
    """The processes carrying `mark` still running after `grace_s`, killed and described."""
    deadline = time.monotonic() + grace_s
    while (pids := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    found = [Leftover(pid, _command(pid), _age_s(pid)) for pid in pids]
    kill(pids)
    return found


def pytest_configure(config: pytest.Config) -> None:
    # A new id for every session, a session run inside a test's session included.
    config.stash[_previous] = os.environ.get(SESSION_VARIABLE)
    config.stash[_mark] = f"{SESSION_VARIABLE}={uuid.uuid4().hex}"
    os.environ[SESSION_VARIABLE] = config.stash[_mark].partition("=")[2]


def pytest_unconfigure(config: pytest.Config) -> None:
    previous = config.stash.get(_previous, None)
    if previous is None:
        os.environ.pop(SESSION_VARIABLE, None)
    else:
        os.environ[SESSION_VARIABLE] = previous


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, on its controller
def pytest_testnodedown(node, error) -> None:
    """What a worker found left running counts for the whole run: a worker's own exit
    status never reaches the controller's."""
    found = getattr(node, "workeroutput", {}).get(WORKER_KEY, [])
    node.config.stash.setdefault(_from_workers, []).extend(found)


@pytest.hookimpl(trylast=True)  # after the runner's hook has torn every fixture down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not Path("/proc/self/environ").is_file():
        return
    found = [leftover.describe() for leftover in leftovers(session.config.stash[_mark])]
    worker_output = getattr(session.config, "workeroutput", None)  # set on an xdist worker
    if worker_output is not None:
        worker_output[WORKER_KEY] = found
    found += session.config.stash.get(_from_workers, [])
    session.config.stash[_left] = found
    if found and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    found = config.stash.get(_left, [])
    if not found:
        return
    count = f"{len(found)} process" + ("es" if len(found) > 1 else "")
    terminalreporter.write_sep("=", f"{count} left running", red=True)
    for described in found:
        terminalreporter.write_line(described)
    terminalreporter.write_line(
        "Started by this test session, still running after its last test: killed now. "
        "A test stops what it starts, in its teardown."
    )

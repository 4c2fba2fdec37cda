"""The commands a retraining run starts (dvc, git) and how it stops what they leave behind.

`dvc repro` runs in its own process group and dies with the run (Linux parent-death
signal), so a killed run never goes on registering a model; a successor recognises a
recorded process by its pid *and* start time, never a later process reusing the pid.
The same holds one level up: `qpr retrain` runs its cycle with `run_owned`, and the cycle's
process stops its whole group with `stops_with_its_group` (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from qpr.ops.layout import RetrainError
from qpr.parent_death import set_parent_death_signal


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for dvc/git and the stage commands they start: ours, plus the
    directory of the running Python first on PATH, so `python -m flows.x` in dvc.yaml is
    this interpreter (the venv) whatever PATH the scheduler gave us."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    env.update(extra or {})
    return env


def run_tool(
    args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run a short command (dvc add, git commit) and fail with its output when it fails."""
    result = subprocess.run(
        list(args), cwd=cwd, env=dict(env) if env else tool_env(), capture_output=True, text=True
    )
    if check and result.returncode != 0:
        output = (result.stderr or result.stdout).strip()[-2000:]
        raise RetrainError(f"`{' '.join(args)}` failed (exit {result.returncode}):\n{output}")
    return result


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat), so a recorded pid
    is recognised as the same process and never confused with a later one reusing it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def run_pipeline(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    on_start: Callable[[int, str | None], None],
    *,
    timeout_s: float | None = None,
    echo: Callable[[str], None] | None = None,
) -> int:
    """Run the pipeline command (dvc repro) in its own process group and wait for it.

    `on_start(pid, start_time)` is called as soon as it runs (the journal records it);
    its output goes to `log_path` (and line by line to `echo`). On a timeout or an
    exception here (KeyboardInterrupt included) the whole group is killed before this
    returns or raises, so no stage keeps running behind our back.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # own group: killing it stops every stage process
            preexec_fn=set_parent_death_signal(signal.SIGKILL),
        )
        try:
            on_start(process.pid, process_start_time(process.pid))
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                log.flush()
                if echo is not None:
                    echo(line.rstrip("\n"))
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"`{' '.join(args)}` ran past {timeout_s:.0f} s")
            return process.wait()
        except BaseException:
            kill_group(process.pid, process_start_time(process.pid), root=Path(cwd))
            process.wait()
            raise


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(entry.name))
    return members


def _cwd_inside(pid: int, root: Path) -> bool:
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return cwd == root or root in cwd.parents


def kill_group(
    pid: int, start_time: str | None, *, root: Path | None = None, wait_s: float = 30.0
) -> bool:
    """Stop what is left of the process group that `pid` led; True when something was.

    While the leader runs (recognised by its start time) the whole group gets SIGKILL.
    When the leader is gone (dvc dies with the flow, see run_pipeline) a stage process
    may still run in its group: the kernel does not reuse a pid as a process id while a
    group with that id exists, so the group's members are killed when they run inside
    the project (`root`), which guards against a group id reused since.
    """
    if start_time is not None and process_start_time(pid) == start_time:
        targets = [-pid]
    elif root is not None:
        targets = [p for p in _group_members(pid) if _cwd_inside(p, Path(root))]
    else:
        targets = []
    if not targets:
        return False
    for target in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if target < 0:
                os.killpg(-target, signal.SIGKILL)
            else:
                os.kill(target, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _group_members(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-pid, os.WNOHANG)
        time.sleep(0.1)
    return True


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return Path(f"/proc/{pid}/stat").is_file() and "Z" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


# Seconds a stopped child gets to clean up (roll back, kill its stages) before SIGKILL.
STOP_TIMEOUT_S = 30.0


def stop_on_sigterm() -> signal.Handlers | Callable | int | None:
    """SIGTERM (docker stop, systemd, a process manager, a parent stopping us) unwinds as
    Ctrl-C does, so `finally` blocks stop what we started: its default ends Python at once.
    Returns the handler it replaced (None off the main thread, where none can be set)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        return None


def run_owned(args: Sequence[str], *, stop_timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Run `args` as a child we own and return its exit code: it leads its own process
    group, gets SIGTERM when we die (even by SIGKILL), and SIGTERM or Ctrl-C here is passed
    to its whole group, which gets `stop_timeout_s` before SIGKILL. Interrupted, the code
    is 130 (SIGINT) or 143 (SIGTERM) once the group has stopped."""
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)

    process = subprocess.Popen(
        list(args), start_new_session=True, preexec_fn=set_parent_death_signal(signal.SIGTERM)
    )
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = process.wait(timeout=stop_timeout_s if received else None)
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                received.append(signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _kill_group_members(process.pid)  # a member that outlived the leader
    return 128 + received[0] if received else code


def _kill_group_members(pgid: int) -> None:
    for member in _group_members(pgid):
        if member != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, signal.SIGKILL)


@contextlib.contextmanager
def stops_with_its_group() -> Iterator[None]:
    """Around a command's whole work (the retraining cycle's `main`): SIGTERM unwinds it
    like Ctrl-C, and then, when this process leads its group (`run_owned` started it), the
    rest of the group (a Prefect API server, a stage) is killed before exit 130."""
    previous = stop_on_sigterm()
    try:
        yield
    except KeyboardInterrupt:
        if os.getpgrp() == os.getpid():
            _kill_group_members(os.getpid())
        print("interrupted: stopped; the next run recovers", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

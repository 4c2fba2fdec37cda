"""qpr/parent_death.py: a child started with the parent-death signal dies when its parent
is killed by SIGKILL; one started without it runs on. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from qpr.ops.processes import pid_alive

# A parent that starts a `sleep` child (with or without the signal), prints its pid, waits.
PARENT = """
import signal, subprocess, sys, time
from qpr.parent_death import set_parent_death_signal
preexec = set_parent_death_signal(signal.SIGKILL) if sys.argv[1] == "yes" else None
child = subprocess.Popen(["sleep", "60"], preexec_fn=preexec)
print(child.pid, flush=True)
time.sleep(60)
"""


def _child_after_killing_its_parent(with_signal: bool) -> int:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, "yes" if with_signal else "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    return child


def _alive_after(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid_alive(pid)


@pytest.mark.parametrize("with_signal", [True, False], ids=["with", "without"])
def test_a_child_dies_with_its_killed_parent_only_when_asked(with_signal: bool) -> None:
    child = _child_after_killing_its_parent(with_signal)
    try:
        assert _alive_after(child, 2 if with_signal else 0.5) is not with_signal
    finally:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)

"""qpr.ops.processes: stopping what a killed pipeline left running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from qpr.ops.processes import kill_group, process_start_time


def test_kill_group_stops_a_leftover_pipeline(tmp_path: Path):
    # A "pipeline" whose leader dies and leaves a worker behind in its process group.
    script = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); time.sleep(60)"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, start_new_session=True)
    time.sleep(1.0)
    started = process_start_time(leader.pid)
    assert kill_group(leader.pid, started, root=tmp_path)
    # kill_group reaps the group it killed (the leader is this test's child here), so the
    # exit status may already be collected: check that the process is gone instead.
    leader.wait(timeout=10)
    assert process_start_time(leader.pid) != started
    assert not kill_group(leader.pid, started, root=tmp_path)  # nothing left to stop

"""tests/leftovers.py: a session that leaves a process running fails, names it and kills
it; a session that leaves nothing passes; other processes are never touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qpr.ops.processes import pid_alive
from tests import leftovers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def subsession(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytest session of its own, in a process of its own, with the plugin loaded."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    return pytester


def _run(pytester: pytest.Pytester, test: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test)
    return pytester.runpytest_subprocess("-p", "tests.leftovers", "-p", "no:cacheprovider", *args)


# `make test` runs on pytest-xdist's workers: a worker's leftovers must fail the run too.
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "two-workers"])
def test_a_session_that_leaves_a_child_running_fails_and_the_child_is_gone(
    subsession, tmp_path, workers
):
    pid_file = tmp_path / "pid"
    result = _run(
        subsession,
        f"""
        import subprocess
        def test_leaves_a_sleep_behind():
            child = subprocess.Popen(["sleep", "300"], start_new_session=True)
            open({str(pid_file)!r}, "w").write(str(child.pid))
        def test_leaves_one_in_the_sessions_own_group():
            subprocess.Popen(["sleep", "301"])
        """,
        *workers,
    )
    pid = int(pid_file.read_text())
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    # One line each, in the order the workers reported them.
    for line in (f"pid {pid}, running * s: sleep 300", "pid *, running * s: sleep 301"):
        result.stdout.fnmatch_lines(["*2 processes left running*", line])
    result.assert_outcomes(passed=2)
    assert not pid_alive(pid)


def test_a_session_that_leaves_nothing_passes(subsession):
    result = _run(
        subsession,
        """
        import multiprocessing, subprocess
        from multiprocessing import resource_tracker
        def test_waits_for_its_child():
            subprocess.run(["sleep", "0.1"], check=True)
        def test_a_spawn_pool_leaves_only_its_resource_tracker():
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                assert pool.map(abs, [-1]) == [1]
            assert resource_tracker._resource_tracker._pid is not None  # ends with pytest
        """,
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "left running" not in result.stdout.str()


def test_processes_without_the_sessions_mark_are_not_touched() -> None:
    mark = f"{leftovers.SESSION_VARIABLE}=another-session"
    env = {**os.environ, leftovers.SESSION_VARIABLE: "another-session"}
    other = subprocess.Popen(["sleep", "60"], env=env)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = leftovers.leftovers(f"{leftovers.SESSION_VARIABLE}=this-session", grace_s=0)
        assert found == []
        assert leftovers.marked(mark) == [other.pid]
        assert pid_alive(other.pid) and pid_alive(ours.pid)
    finally:
        for child in (other, ours):
            child.kill()
            child.wait()

"""qpr.ops.journal: the journal that undoes a crashed run. No DVC and no registry here:
`dvc checkout` and the registry are stand-ins (tests/flows has the real thing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from qpr.ops.journal import Journal, clear_stale_dvc_lock, recover, uncached_outputs
from qpr.ops.layout import RetrainLayout
from qpr.ops.merge import merge_logs

from .factories import incoming_file, tree, write_log_day


def test_uncached_outputs_come_from_dvc_yaml():
    outs = uncached_outputs(Path(__file__).resolve().parents[2] / "dvc.yaml")
    assert "reports/evaluate" in outs and "plots/train/history.csv" in outs
    assert "models/vocab.json" not in outs  # cached: dvc checkout restores it


def _calls():
    calls: list[str] = []

    def restore_registry(journal: dict) -> list[str]:
        calls.append(f"registry {journal['registry']}")
        return ["registry restored"]

    def checkout() -> str:
        calls.append("checkout")
        return "checked out"

    return calls, dict(restore_registry=restore_registry, checkout_outputs=checkout)


def test_a_crashed_run_is_rolled_back(project: RetrainLayout):
    root = project.root
    (root / "metrics").mkdir()
    (root / "metrics" / "train.json").write_text('{"epochs": 3}')
    before = tree(project.data_dir)
    pin, lock = project.dvc_file.read_text(), project.dvc_lock.read_text()

    fresh = incoming_file(write_log_day(project.incoming))
    journal = Journal.begin(
        project,
        run="r1",
        files=[fresh],
        registry={"aliases": {"champion": "1"}},
        outputs=["metrics/train.json", "metrics.json"],
    )
    # What a run does before it is killed: merge, re-pin, pipeline rewrites outputs.
    merge_logs([fresh], project.logs_dir)
    project.dvc_file.write_text("outs:\n- md5: bbb.dir\n  path: data\n")
    project.dvc_lock.write_text("changed\n")
    (root / "metrics" / "train.json").write_text('{"epochs": 1}')
    (root / "metrics.json").write_text("{}")
    journal.set(phase="repro")
    assert tree(project.data_dir) != before

    calls, hooks = _calls()
    recovery = recover(project, finish_commit=lambda j: ["never"], **hooks)
    assert recovery is not None and recovery.action == "rolled-back"
    assert tree(project.data_dir) == before
    assert project.dvc_file.read_text() == pin and project.dvc_lock.read_text() == lock
    assert (root / "metrics" / "train.json").read_text() == '{"epochs": 3}'
    assert not (root / "metrics.json").exists()  # it did not exist before the run
    assert calls == ["checkout", "registry {'aliases': {'champion': '1'}}"]
    assert fresh.path.exists()  # the incoming file waits for the next run
    assert not project.journal.exists() and not project.snapshot.exists()
    assert (project.state_dir / "recovered" / "r1.json").is_file()
    assert recover(project, finish_commit=lambda j: [], **hooks) is None  # nothing left


def test_the_hold_spans_the_restore_from_checkout_to_registry(project: RetrainLayout):
    """The caller's hold (the models folder's writer lock) is taken after the leftover
    pipeline is stopped and released after the registry is back: no add in between."""
    from contextlib import contextmanager

    fresh = incoming_file(write_log_day(project.incoming))
    Journal.begin(project, run="r2", files=[fresh], registry={})
    calls, hooks = _calls()

    @contextmanager
    def hold():
        calls.append("hold")
        yield
        calls.append("release")

    recover(project, finish_commit=lambda j: ["never"], hold=hold, **hooks)

    assert calls == ["hold", "checkout", "registry {}", "release"]


def test_the_snapshot_shares_inodes_that_the_merge_never_writes_to(project: RetrainLayout):
    day = project.logs_dir / "2026-10-01.jsonl"
    fresh = incoming_file(write_log_day(project.incoming))
    Journal.begin(project, run="r0", files=[fresh])
    saved = project.snapshot / "data" / "logs" / day.name
    assert saved.stat().st_ino == day.stat().st_ino  # a hard link, not a copy
    before = saved.read_bytes()
    extra = project.incoming / "late.jsonl"
    extra.write_text(
        json.dumps({"timestamp": "2026-10-01T12:00:00Z", "question": "new", "answer_id": "a"})
        + "\n"
    )
    merge_logs([incoming_file(extra)], project.logs_dir)  # extends 2026-10-01
    assert day.read_bytes() != before and saved.read_bytes() == before


def test_recovery_survives_a_crash_in_the_middle_of_restoring(project: RetrainLayout):
    before = tree(project.data_dir)
    fresh = incoming_file(write_log_day(project.incoming))
    Journal.begin(project, run="r2", files=[fresh])
    merge_logs([fresh], project.logs_dir)
    # Recovery itself was killed after moving data/ aside, before putting the snapshot back.
    os.replace(project.data_dir, project.data_dir.with_name(f".{project.data_dir.name}.old"))
    _, hooks = _calls()
    recover(project, finish_commit=lambda j: [], **hooks)
    assert tree(project.data_dir) == before


def test_a_committed_run_is_rolled_forward(project: RetrainLayout):
    fresh = incoming_file(write_log_day(project.incoming))
    journal = Journal.begin(project, run="r3", files=[fresh])
    merge_logs([fresh], project.logs_dir)
    journal.set(phase="committed")
    after = tree(project.data_dir)
    calls, hooks = _calls()
    recovery = recover(project, finish_commit=lambda j: calls.append("finish") or ["done"], **hooks)
    assert recovery is not None and recovery.action == "rolled-forward"
    assert calls == ["finish"] and tree(project.data_dir) == after


def test_stale_dvc_lock_of_a_killed_repro_is_cleared(tmp_path: Path):
    lock = tmp_path / ".dvc" / "tmp" / "rwlock"
    lock.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({"write": {"models": {"pid": dead.pid, "cmd": "dvc repro"}}}))
    assert clear_stale_dvc_lock(tmp_path) and not lock.exists()

    lock.write_text(json.dumps({"read": {"data": [{"pid": os.getpid(), "cmd": "dvc status"}]}}))
    assert clear_stale_dvc_lock(tmp_path) == [] and lock.exists()  # a live holder keeps it

"""The library half of retraining (qpr.ops.retraining): discovery, validation and quarantine,
merging without duplicates, and the journal that undoes a crashed run. No Prefect, no
MLflow, no DVC: the registry and `dvc checkout` are stand-ins here (tests/flows has the
real thing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from qpr.config import QualitySettings
from qpr.data.synth import write_day
from qpr.ops.retraining import (
    IncomingFile,
    Journal,
    Ledger,
    RetrainBusy,
    RetrainError,
    RetrainLayout,
    RetrainLock,
    discover,
    kill_group,
    merge_logs,
    process_start_time,
    quarantine,
    recover,
    sha256_file,
    uncached_outputs,
    validate,
)

DAY = date(2026, 10, 4)


def _file(path: Path) -> IncomingFile:
    return IncomingFile(path=path, sha256=sha256_file(path), size=path.stat().st_size)


def _day(directory: Path, day: date = DAY, rows: int = 120) -> Path:
    return write_day(directory, day, seed=7, rows=rows, intents=20)


@pytest.fixture
def project(tmp_path: Path) -> RetrainLayout:
    """A project directory with data/logs (two days), a data.dvc and a dvc.lock."""
    logs = tmp_path / "data" / "logs"
    for offset in (1, 2):
        _day(logs, date(2026, 10, offset))
    (tmp_path / "data.dvc").write_text("outs:\n- md5: aaa.dir\n  path: data\n")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    return RetrainLayout.build(
        tmp_path,
        incoming=Path("incoming/logs"),
        quarantine=Path("incoming/quarantine"),
        archive=Path("incoming/processed"),
        state_dir=Path(".retrain"),
        logs_path=Path("data/logs"),
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_layout_refuses_paths_that_cannot_work(tmp_path: Path):
    with pytest.raises(RetrainError, match="versioned with DVC"):
        RetrainLayout.build(
            tmp_path,
            incoming=Path("in"),
            quarantine=Path("q"),
            archive=Path("a"),
            state_dir=Path(".r"),
            logs_path=Path("data/logs"),
        )
    (tmp_path / "data.dvc").write_text("outs: []\n")
    with pytest.raises(RetrainError, match="must not be inside"):
        RetrainLayout.build(
            tmp_path,
            incoming=Path("data/incoming"),
            quarantine=Path("q"),
            archive=Path("a"),
            state_dir=Path(".r"),
            logs_path=Path("data/logs"),
        )


def test_discover_skips_files_still_being_written(tmp_path: Path):
    for name in ("b.jsonl", "a.csv", ".hidden.jsonl", "c.jsonl.tmp", "d.part", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    assert [f.name for f in discover(tmp_path)] == ["a.csv", "b.jsonl"]
    assert discover(tmp_path / "missing") == []


def test_validation_passes_a_good_day_and_quarantines_bad_files(tmp_path: Path):
    quality = QualitySettings()
    good = _file(_day(tmp_path / "in"))
    result = validate(good, quality, tmp_path / "reports" / "good")
    assert result.ok and result.rows == 120

    broken = tmp_path / "in" / "broken.jsonl"
    rows = [json.loads(line) for line in good.path.read_text().splitlines()]
    for i, row in enumerate(rows):
        if i % 3 == 0:
            row["answer_id"] = "!! not an id"
    broken.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = validate(_file(broken), quality, tmp_path / "reports" / "broken")
    assert not bad.ok and "raw_logs" in bad.reason

    folder = quarantine(bad, tmp_path / "quarantine", "20261015T030000Z")
    assert not broken.exists()
    assert (folder / "broken.jsonl").read_bytes() == "".join(
        json.dumps(r) + "\n" for r in rows
    ).encode()
    report = json.loads((folder / "raw_logs.json").read_text())
    assert report["success"] is False
    assert "answer_id" in (folder / "REASON.txt").read_text()

    not_a_log = tmp_path / "in" / "notes.csv"
    not_a_log.write_text("a,b\n1,2\n")
    result = validate(_file(not_a_log), quality, tmp_path / "reports" / "notes")
    assert not result.ok and "missing column" in result.reason
    assert json.loads((tmp_path / "reports" / "notes" / "raw_logs.json").read_text())["message"]


def test_merge_adds_new_days_byte_for_byte_and_never_a_duplicate(project: RetrainLayout):
    incoming = project.incoming
    fresh = _day(incoming)  # day 4: new
    repeat = _day(incoming / "again", date(2026, 10, 2))  # day 2 again: all duplicates
    report = merge_logs([_file(fresh), _file(repeat)], project.logs_dir)
    assert report.days_created == [DAY.isoformat()]
    assert report.rows_added == 120 and report.rows_duplicate == 120
    assert (project.logs_dir / f"{DAY}.jsonl").read_bytes() == fresh.read_bytes()

    before = _tree(project.data_dir)
    again = merge_logs([_file(fresh)], project.logs_dir)
    assert again.rows_added == 0 and again.rows_duplicate == 120
    assert _tree(project.data_dir) == before  # idempotent: nothing rewritten


def test_merge_splits_rows_by_utc_day_and_reads_csv(project: RetrainLayout):
    csv = project.incoming / "export.csv"
    csv.parent.mkdir(parents=True)
    pd.DataFrame(
        {
            "timestamp": [
                "2026-10-01T00:01:10Z",  # already in data/ … unless the text differs
                "2026-10-05T23:59:00-01:00",  # 00:59 UTC on the 6th
                "not a time",
            ],
            "question": ["a brand new question", "late night question", "no time"],
            "answer_id": ["ans-1", "ans-2", "ans-3"],
        }
    ).to_csv(csv, index=False)
    report = merge_logs([_file(csv)], project.logs_dir)
    assert report.rows_added == 2 and report.rows_unplaceable == 1
    assert report.days_extended == ["2026-10-01"] and report.days_created == ["2026-10-06"]
    last = (project.logs_dir / "2026-10-06.jsonl").read_text().splitlines()
    assert json.loads(last[0])["question"] == "late night question"


def test_ledger_and_lock(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append([{"sha256": "x", "outcome": "merged"}, {"sha256": "y", "outcome": "quarantined"}])
    assert ledger.merged_hashes() == {"x"}
    with RetrainLock(tmp_path / "lock"):
        # A second holder in another process is refused (flock is per open file).
        code = (
            "import sys; from qpr.ops.retraining import RetrainLock, RetrainBusy\n"
            "try:\n    RetrainLock(sys.argv[1]).__enter__()\n"
            "except RetrainBusy:\n    sys.exit(3)\n"
        )
        probe = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lock")])
        assert probe.returncode == 3
    with RetrainLock(tmp_path / "lock"):
        pass
    assert issubclass(RetrainBusy, RetrainError)


def test_uncached_outputs_come_from_dvc_yaml():
    outs = uncached_outputs(Path(__file__).resolve().parents[2] / "dvc.yaml")
    assert "metrics.json" in outs and "reports/gates/cluster" in outs
    assert "models/vocab.json" not in outs  # cached: dvc checkout restores it


def _calls():
    calls: list[str] = []

    def restore_registry(journal: dict) -> list[str]:
        calls.append(f"registry {journal['registry']}")
        return ["registry restored"]

    def checkout() -> str:
        calls.append("checkout")
        return "checked out"

    def finish(journal: Journal) -> list[str]:
        calls.append("finish")
        return ["finished"]

    return calls, dict(restore_registry=restore_registry, checkout_outputs=checkout)


def test_a_crashed_run_is_rolled_back(project: RetrainLayout):
    root = project.root
    (root / "metrics").mkdir()
    (root / "metrics" / "train.json").write_text('{"epochs": 3}')
    before = _tree(project.data_dir)
    pin, lock = project.dvc_file.read_text(), project.dvc_lock.read_text()

    fresh = _file(_day(project.incoming))
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
    assert _tree(project.data_dir) != before

    calls, hooks = _calls()
    recovery = recover(project, finish_commit=lambda j: ["never"], **hooks)
    assert recovery is not None and recovery.action == "rolled-back"
    assert _tree(project.data_dir) == before
    assert project.dvc_file.read_text() == pin and project.dvc_lock.read_text() == lock
    assert (root / "metrics" / "train.json").read_text() == '{"epochs": 3}'
    assert not (root / "metrics.json").exists()  # it did not exist before the run
    assert calls == ["checkout", "registry {'aliases': {'champion': '1'}}"]
    assert fresh.path.exists()  # the incoming file waits for the next run
    assert not project.journal.exists() and not project.snapshot.exists()
    assert (project.state_dir / "recovered" / "r1.json").is_file()
    assert recover(project, finish_commit=lambda j: [], **hooks) is None  # nothing left


def test_recovery_survives_a_crash_in_the_middle_of_restoring(project: RetrainLayout):
    before = _tree(project.data_dir)
    fresh = _file(_day(project.incoming))
    Journal.begin(project, run="r2", files=[fresh])
    merge_logs([fresh], project.logs_dir)
    # Recovery itself was killed after moving data/ aside, before putting the snapshot back.
    os.replace(project.data_dir, project.state_dir / "trash")
    _, hooks = _calls()
    recover(project, finish_commit=lambda j: [], **hooks)
    assert _tree(project.data_dir) == before


def test_a_committed_run_is_rolled_forward(project: RetrainLayout):
    fresh = _file(_day(project.incoming))
    journal = Journal.begin(project, run="r3", files=[fresh])
    merge_logs([fresh], project.logs_dir)
    journal.set(phase="committed")
    after = _tree(project.data_dir)
    calls, hooks = _calls()
    recovery = recover(project, finish_commit=lambda j: calls.append("finish") or ["done"], **hooks)
    assert recovery is not None and recovery.action == "rolled-forward"
    assert calls == ["finish"] and _tree(project.data_dir) == after


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


def test_prefect_yaml_deploys_the_retrain_flow_on_the_params_schedule():
    import yaml
    from prefect.cli.deploy._models import PrefectYamlModel

    from qpr.config import load_settings

    root = Path(__file__).resolve().parents[2]
    spec = PrefectYamlModel.model_validate(yaml.safe_load((root / "prefect.yaml").read_text()))
    (deployment,) = spec.deployments
    path, function = deployment.entrypoint.split(":")
    assert f"def {function}(" in (root / path).read_text()
    cfg = load_settings(root / "params.yaml").retrain
    (schedule,) = deployment.schedules
    assert (schedule.cron, schedule.timezone) == (cfg.cron, cfg.timezone)


def test_stale_dvc_lock_of_a_killed_repro_is_cleared(tmp_path: Path):
    from qpr.ops.retraining import clear_stale_dvc_lock

    lock = tmp_path / ".dvc" / "tmp" / "rwlock"
    lock.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({"write": {"models": {"pid": dead.pid, "cmd": "dvc repro"}}}))
    assert clear_stale_dvc_lock(tmp_path) and not lock.exists()

    lock.write_text(json.dumps({"read": {"data": [{"pid": os.getpid(), "cmd": "dvc status"}]}}))
    assert clear_stale_dvc_lock(tmp_path) == [] and lock.exists()  # a live holder keeps it

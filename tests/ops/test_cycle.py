"""qpr.ops.cycle without Prefect: one cycle on a real DVC project with the pipeline
replaced by a stand-in (tests/flows/test_retrain_flow.py runs the real `dvc repro`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from qpr.config import settings_from_dict
from qpr.ops.cycle import Cycle, CycleSteps, run_cycle
from qpr.ops.journal import Journal
from qpr.ops.layout import RetrainLayout
from qpr.ops.summary import describe, new_summary
from tests.conftest import tiny_overrides

from .factories import tree, write_log_day

pytestmark = pytest.mark.slow

RUN = "20261015T030000Z"


def _dvc(root: Path, *args: str) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["dvc", *args], cwd=root, env=env, check=True, capture_output=True)


def _registered(cycle: Cycle, journal: Journal) -> None:
    """Stands in for `dvc repro`: the register stage's decision."""
    register = {"version": 1, "promoted": 1, "reason": "the first model"}
    metrics = cycle.layout.root / "metrics" / "register.json"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text(json.dumps(register))


def _failed(cycle: Cycle, journal: Journal) -> None:
    raise RuntimeError("the pipeline failed")


def _cycle(root: Path, repro, run: str = RUN) -> Cycle:
    tree_ = tiny_overrides(root, registry={"name": "qpr-cycle-test"})
    tree_["data"]["path"] = "data/logs"
    settings = settings_from_dict(tree_)
    layout = RetrainLayout.from_settings(settings, root)
    return Cycle(settings, layout, run=run, log=lambda _: None, steps=CycleSteps(repro=repro))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A DVC project (no git) with two days of logs versioned in data.dvc."""
    for day in (1, 2):
        write_log_day(tmp_path / "data" / "logs", date(2026, 10, day))
    _dvc(tmp_path, "init", "--no-scm", "-q")
    _dvc(tmp_path, "add", "-q", "data")
    return tmp_path


def test_a_cycle_merges_valid_files_and_quarantines_the_rest(root: Path):
    cycle = _cycle(root, _registered)
    incoming = cycle.layout.incoming
    day4 = write_log_day(incoming)
    (incoming / "notes.csv").write_text("a,b\n1,2\n")
    pin = cycle.layout.dvc_file.read_text()

    summary = run_cycle(cycle, new_summary(RUN))

    assert summary["outcome"] == "retrained", summary
    assert [q["file"] for q in summary["quarantined"]] == ["notes.csv"]
    assert summary["merge"]["rows_added"] == 120
    assert cycle.layout.dvc_file.read_text() != pin  # dvc add pinned the merged data
    assert (cycle.layout.archive / RUN / day4.name).is_file() and not day4.exists()
    assert not cycle.layout.journal.exists() and not cycle.layout.snapshot.exists()
    report = describe(summary)
    assert "quarantined notes.csv" in report and "version 1 promoted to champion" in report

    resent = incoming / "day4-again.jsonl"
    resent.write_bytes((cycle.layout.archive / RUN / day4.name).read_bytes())
    again = run_cycle(_cycle(root, _registered, run="20261016T030000Z"), new_summary("2"))
    assert again["outcome"] == "nothing-new"
    assert again["files_already_merged"] == ["day4-again.jsonl"]


def test_a_failed_pipeline_is_rolled_back(root: Path):
    cycle = _cycle(root, _failed)
    day4 = write_log_day(cycle.layout.incoming)
    before = tree(cycle.layout.data_dir)
    pin = cycle.layout.dvc_file.read_text()
    summary = new_summary(RUN)

    with pytest.raises(RuntimeError, match="pipeline failed"):
        run_cycle(cycle, summary)

    assert tree(cycle.layout.data_dir) == before and cycle.layout.dvc_file.read_text() == pin
    assert day4.is_file()  # waits for the next run
    assert summary["rollback"] and not cycle.layout.journal.exists()


def test_a_run_whose_every_file_is_quarantined_says_so(root: Path, tmp_path_factory):
    from qpr.ops.summary import EXIT_ALL_QUARANTINED, exit_code

    cycle = _cycle(root, _registered)
    incoming = cycle.layout.incoming
    incoming.mkdir(parents=True)
    (incoming / "notes.csv").write_text("a,b\n1,2\n")
    outside = write_log_day(tmp_path_factory.mktemp("outside"))
    (incoming / "linked.jsonl").symlink_to(outside)

    summary = run_cycle(cycle, new_summary(RUN))

    assert summary["outcome"] == "only-quarantined", summary
    assert sorted(q["file"] for q in summary["quarantined"]) == ["linked.jsonl", "notes.csv"]
    assert exit_code(summary) == EXIT_ALL_QUARANTINED != 0
    assert outside.is_file() and not list(incoming.iterdir())

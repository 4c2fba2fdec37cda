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
from qpr.ops.cycle import Cycle, CycleSteps, recover_run, repro_env, run_cycle
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


# ---------------------------------------------------------------- the registry and the cycle


def _register_stage(fake, *, then=None):
    """Stands in for `dvc repro` up to the register stage, run as the cycle runs it."""
    from qpr.paths import ProjectPaths
    from qpr.pipeline.register import RETRAIN_RUN_ENV, run_register

    def repro(cycle: Cycle, journal: Journal) -> None:
        paths = ProjectPaths(cycle.layout.root)
        paths.stage_metrics("evaluate").parent.mkdir(parents=True, exist_ok=True)
        paths.stage_metrics("evaluate").write_text(json.dumps({"val": {"recip_rank": 0.8}}))
        env = repro_env(cycle)
        result = run_register(
            cycle.settings,
            paths,
            log=lambda _: None,
            cycle_run=env.get(RETRAIN_RUN_ENV),
            rescore=lambda champion: None,
        )
        paths.stage_metrics("register").write_text(json.dumps(result))
        if then is not None:
            then()

    return repro


def _killed() -> None:
    raise KeyboardInterrupt  # SIGINT, or the point a SIGKILL would stop the run


@pytest.fixture
def fake(monkeypatch):
    from qpr.ops import registry

    from .fake_registry import FakeRegistry

    fake = FakeRegistry().install(monkeypatch)
    champion = {registry.TAG_METRIC: "val.recip_rank", registry.TAG_METRIC_VALUE: "0.5"}
    fake.add({**champion, registry.TAG_COMMITTED: "earlier"}, alias=registry.CHAMPION)
    return fake


def test_a_cycle_killed_after_register_leaves_no_alias_on_its_version(root: Path, fake):
    from qpr.ops import registry

    cycle = _cycle(root, _register_stage(fake, then=_killed))
    write_log_day(cycle.layout.incoming)

    with pytest.raises(KeyboardInterrupt):
        run_cycle(cycle, new_summary(RUN))

    assert fake.aliases == {registry.CHAMPION: 1}
    assert not fake.versions[2].get(registry.TAG_COMMITTED)  # never served, never promoted
    with pytest.raises(registry.RegistryError, match="committed mark"):
        fake.promote("qpr-cycle-test", 2, reason="by hand", actor="tests")


def test_the_champion_moves_only_after_the_commit_point(root: Path, fake, monkeypatch):
    from qpr.ops import registry

    cycle = _cycle(root, _register_stage(fake))
    write_log_day(cycle.layout.incoming)
    phases = []
    promote = fake.promote

    def watched(*args, **kwargs):
        phases.append(Journal.load(cycle.layout).phase)
        return promote(*args, **kwargs)

    monkeypatch.setattr(registry, "promote", watched)

    summary = run_cycle(cycle, new_summary(RUN))

    assert summary["outcome"] == "retrained" and phases == ["committed"]
    assert fake.calls[-2:] == [("committed", 2), ("alias champion", 2)]
    assert "registry: version 2 promoted to champion" in summary["steps"]


def test_a_cycle_killed_while_promoting_is_rolled_forward(root: Path, fake, monkeypatch):
    from qpr.ops import registry

    cycle = _cycle(root, _register_stage(fake))
    write_log_day(cycle.layout.incoming)
    monkeypatch.setattr(registry, "promote", lambda *a, **k: _killed())

    with pytest.raises(KeyboardInterrupt):
        run_cycle(cycle, new_summary(RUN))
    assert Journal.load(cycle.layout).phase == "committed"
    assert fake.aliases[registry.CHAMPION] == 1

    monkeypatch.setattr(registry, "promote", fake.promote)
    recovery = recover_run(_cycle(root, _registered, run="20261015T040000Z"))

    assert recovery is not None and recovery.action == "rolled-forward"
    assert fake.aliases[registry.CHAMPION] == 2 and fake.versions[2][registry.TAG_COMMITTED]


def test_too_few_new_rows_wait_in_incoming(root: Path):
    import dataclasses

    base = _cycle(root, _failed)  # the pipeline must not run
    retrain = base.settings.retrain.model_copy(update={"min_new_rows": 1_000})
    cycle = dataclasses.replace(
        base, settings=base.settings.model_copy(update={"retrain": retrain})
    )
    day4 = write_log_day(cycle.layout.incoming)
    pin = cycle.layout.dvc_file.read_text()

    summary = run_cycle(cycle, new_summary(RUN))

    assert summary["outcome"] == "waiting-for-rows" and 0 < summary["new_rows"] < 1_000
    assert day4.is_file() and cycle.layout.dvc_file.read_text() == pin
    assert not cycle.layout.journal.exists()


# ---------------------------------------------------------------- the service's feedback


def _feedback(root: Path) -> None:
    """The service's query log (query_log: logs/service) with three verdicts."""
    from qpr.querylog.log_writer import QueryLog
    from tests.querylog.test_log_writer import log_search, result

    with QueryLog(root / "logs" / "service") as log:
        log_search(log, "r1", result("zorbic flange tuning", answer="ans-00003"))
        log_search(log, "r2", result("quaffle lamp glow", answer="ans-00004"))
        log_search(log, "r3", result("wimble sprocket noise", answer="ans-00005"))
        log.feedback("r1", "taken")
        log.feedback("r2", "rejected", answer_id="ans-00006")  # the right answer named
        log.feedback("r3", "rejected")


def _run_failing(cycle: Cycle) -> dict:
    summary = new_summary(cycle.run)
    with pytest.raises(RuntimeError, match="pipeline failed"):
        run_cycle(cycle, summary)
    return summary


def test_a_cycle_harvests_the_feedback_and_a_rollback_keeps_the_harvest(root: Path):
    _feedback(root)
    failed = _run_failing(_cycle(root, _failed))
    harvested = Path(failed["harvest"]["file"])
    assert failed["harvest"]["rows"] == 2 and harvested.is_file()  # waits in the inbox

    summary = run_cycle(_cycle(root, _registered, run="20261016T030000Z"), new_summary(RUN))

    assert summary["outcome"] == "retrained" and summary["harvest"]["feedback_lines"] == 0
    assert summary["files_valid"] == [harvested.name] and summary["merge"]["rows_added"] == 2
    merged = {
        (row["question"], row["answer_id"])
        for path in (root / "data" / "logs").glob("*.jsonl")
        for row in map(json.loads, path.read_text().splitlines())
    }
    assert {("zorbic flange tuning", "ans-00003"), ("quaffle lamp glow", "ans-00006")} <= merged
    assert "wimble sprocket noise" not in {q for q, _ in merged}  # a bare rejection
    assert ("quaffle lamp glow", "ans-00004") not in merged  # the rejected answer
    assert "2 row(s) harvested" in describe(failed)


def test_harvesting_off_leaves_the_feedback_alone(root: Path):
    import dataclasses

    _feedback(root)
    base = _cycle(root, _failed)
    retrain = base.settings.retrain.model_copy(update={"harvest": False})
    cycle = dataclasses.replace(
        base, settings=base.settings.model_copy(update={"retrain": retrain})
    )

    summary = run_cycle(cycle, new_summary(RUN))

    assert summary["outcome"] == "nothing-new" and summary["harvest"] is None
    assert not cycle.layout.incoming.exists() and not (root / ".retrain" / "feedback").exists()

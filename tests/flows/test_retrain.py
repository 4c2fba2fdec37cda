"""Scheduled retraining end to end (flows/retrain.py) on a throw-away copy of the project:
its own git repository, DVC project, tiny params and MLflow registry model.

The tests share one project and run in file order, as a retraining history does:

1. cycle 1: day 4 arrives with a corrupted file and a file that is no log at all; both
   are quarantined with their reports, day 4 is merged, `dvc repro` trains, the first
   model is champion, data.dvc + dvc.lock are committed. A second run changes nothing.
2. cycle 2: day 5 arrives and the model is deliberately worse (a 2-dimensional
   embedding): the new version stays challenger. Promoting it by hand and rolling back
   restores the champion.
3. a third cycle is killed with SIGKILL while `dvc repro` trains; the documented recovery
   (the next run's first step, here `--recover-only`) leaves data/, data.dvc, dvc.lock
   and the registry exactly as before, and the fresh file waiting in incoming/.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import mlflow
import pytest
import yaml

from qpr.config import settings_from_dict
from qpr.data.synth import SynthSpec, write_day, write_logs
from qpr.ops import registry
from tests.conftest import REPO_ROOT, tiny_overrides

pytestmark = pytest.mark.slow

NAME = "qpr-retrain-test"  # its own registered model: other tests register "qpr"
EXPERIMENT = "qpr-retrain-tests"
COPIED = ("dvc.yaml", ".gitignore", ".dvcignore", "flows", "src")


def _sh(root: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(list(args), cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed: {done.stderr or done.stdout}"
    return done.stdout


def _digest(root: Path) -> dict[str, str]:
    """What must not change when a run is rolled back: data/, data.dvc, dvc.lock."""
    files = [*sorted((root / "data").rglob("*")), root / "data.dvc", root / "dvc.lock"]
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if p.is_file()
    }


def _registry_state() -> dict:
    versions = registry.list_versions(NAME)
    return {v.version: (v.aliases, v.tags) for v in versions}


def _day(project: Path, day: int) -> Path:
    synth = yaml.safe_load((project / "params.yaml").read_text())["data"]["synth"]
    return write_day(
        project / "incoming" / "logs",
        date(2026, 10, day),
        seed=synth["seed"],
        rows=synth["rows_per_day"],
        intents=synth["intents"],
    )


def _set_params(project: Path, **sections: dict) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    for name, values in sections.items():
        params[name].update(values)
    (project / "params.yaml").write_text(yaml.safe_dump(params))


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC project: this repository's pipeline code, tiny params, three days of
    logs versioned with `dvc add` and committed. No pipeline has run yet."""
    return retrain_project(tmp_path_factory.mktemp("retrain") / "project", NAME, EXPERIMENT)


def retrain_project(root: Path, name: str, experiment: str) -> Path:
    """The `project` fixture's project in `root`, its model registered as `name`."""
    root.mkdir()
    for copied in COPIED:
        source = REPO_ROOT / copied
        if source.is_dir():
            shutil.copytree(source, root / copied, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / copied)
    tree = tiny_overrides(
        root,
        registry={"name": name, "margin": 0.002, "min_metric": 0.0},
        retrain={"git_commit": True},
        mlflow={"experiment": experiment},
    )
    tree["data"]["path"] = "data/logs"  # relative: data/ is the DVC-tracked directory
    settings = settings_from_dict(tree)
    (root / "params.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    synth = settings.data.synth
    write_logs(
        root / "data" / "logs",
        SynthSpec(
            seed=synth.seed,
            start=synth.start,
            days=synth.days,
            rows_per_day=synth.rows_per_day,
            intents=synth.intents,
        ),
    )
    _sh(root, "git", "init", "-q")
    _sh(root, "git", "config", "user.email", "tests@example.com")
    _sh(root, "git", "config", "user.name", "tests")
    _sh(root, "dvc", "init", "-q")
    _sh(root, "dvc", "add", "-q", "data")
    _sh(root, "git", "add", "-A")
    _sh(root, "git", "commit", "-q", "-m", "three days of logs")
    return root


def _retrain(project: Path, **kwargs) -> dict:
    from flows.retrain import retrain_flow

    return retrain_flow(params=str(project / "params.yaml"), **kwargs)


def test_first_cycle_quarantines_bad_files_and_promotes_the_first_model(
    prefect_harness, project: Path
):
    day4 = _day(project, 4)
    rows = [json.loads(line) for line in day4.read_text().splitlines()]
    for i, row in enumerate(rows[:200]):
        if i % 3 == 0:
            row["answer_id"] = "!! not an id"  # a third of the rows: far above the 5 % tolerance
    (day4.parent / "2026-10-04-corrupted.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows[:200])
    )
    (day4.parent / "notes.csv").write_text("a,b\n1,2\n")
    head = _sh(project, "git", "rev-parse", "HEAD")

    summary = _retrain(project)

    assert summary["outcome"] == "retrained", summary
    quarantined = {q["file"]: Path(q["folder"]) for q in summary["quarantined"]}
    assert set(quarantined) == {"2026-10-04-corrupted.jsonl", "notes.csv"}
    corrupted = quarantined["2026-10-04-corrupted.jsonl"]
    assert (corrupted / "2026-10-04-corrupted.jsonl").is_file()
    report = json.loads((corrupted / "raw_logs.json").read_text())
    assert report["success"] is False
    assert "answer_id" in (corrupted / "REASON.txt").read_text()
    assert (quarantined["notes.csv"] / "raw_logs.json").is_file()

    assert (project / "data" / "logs" / "2026-10-04.jsonl").read_bytes() == (
        project / "incoming" / "processed" / summary["run"] / "2026-10-04.jsonl"
    ).read_bytes()
    assert list((project / "incoming" / "logs").iterdir()) == []
    assert summary["merge"]["rows_added"] == 400 and summary["merge"]["rows_duplicate"] == 0

    register = summary["register"]
    assert register["promoted"] == 1 and register["champion"] is None  # the first model
    assert registry.champion(NAME).version == register["version"]
    # The cycle's run is the parent of the stage runs its `dvc repro` started.
    from flows.stage import STAGES

    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    (cycle,) = [r for r in runs if r.info.run_name == f"retrain {summary['run']}"]
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == cycle.info.run_id]
    assert sorted(r.data.tags["qpr.stage"] for r in nested) == sorted(STAGES)
    # Versioned: data.dvc and dvc.lock committed by the flow; the work tree is clean.
    assert _sh(project, "git", "rev-parse", "HEAD") != head
    assert "retrain" in _sh(project, "git", "log", "-1", "--format=%s")
    assert _sh(project, "git", "status", "--porcelain", "data.dvc", "dvc.lock") == ""
    assert json.loads(_sh(project, "dvc", "status", "--json") or "{}") == {}


def test_a_second_run_on_the_same_inputs_changes_nothing(prefect_harness, project: Path):
    before, registry_before = _digest(project), _registry_state()
    head = _sh(project, "git", "rev-parse", "HEAD")
    archived = next((project / "incoming" / "processed").rglob("2026-10-04.jsonl"))
    shutil.copy2(archived, project / "incoming" / "logs" / "day4-resent.jsonl")

    summary = _retrain(project)

    assert summary["outcome"] == "nothing-new"
    assert summary["files_already_merged"] == ["day4-resent.jsonl"]
    assert _digest(project) == before and _registry_state() == registry_before
    assert _sh(project, "git", "rev-parse", "HEAD") == head


def test_a_worse_model_stays_challenger_and_rollback_restores_the_champion(
    prefect_harness, project: Path
):
    champion = registry.champion(NAME)
    _day(project, 5)
    # Deliberately worse: a 2-dimensional embedding (val MRR ≈ 0.27 against ≈ 0.80). Not
    # one epoch: on this tiny data one or two epochs end below the untrained encoder, and
    # the train stage's gate stops such a model before it could be registered at all.
    _set_params(project, model={"output_dim": 2})

    summary = _retrain(project)

    assert summary["outcome"] == "retrained", summary
    register = summary["register"]
    assert register["new_version"] == 1
    assert register["challenger"] < register["champion"] + register["margin"]
    assert register["promoted"] == 0
    new = registry.get_version(NAME, register["version"])
    assert "challenger" in new.aliases
    assert registry.champion(NAME).version == champion.version
    assert "kept_challenger" in [e["action"] for e in registry.events(new)]

    # A person promotes it anyway, sees bad answers, and rolls back.
    registry.promote(NAME, new.version, reason="try it", actor="tests")
    assert registry.champion(NAME).version == new.version
    restored = registry.rollback(NAME, reason="worse answers", actor="tests")
    assert restored.version == champion.version == registry.champion(NAME).version


def test_killing_the_flow_during_the_pipeline_changes_nothing(prefect_harness, project: Path):
    from prefect.settings import PREFECT_API_URL

    before, registry_before = _digest(project), _registry_state()
    day6 = _day(project, 6)
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    log = project / "killed-run.log"
    with log.open("w") as out:
        flow = subprocess.Popen(
            [sys.executable, "-m", "flows.retrain", "--params", str(project / "params.yaml")],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    journal = project / ".retrain" / "journal.json"
    deadline = time.monotonic() + 150
    # Wait until data/ and data.dvc have changed and dvc repro is training: mid-pipeline.
    while time.monotonic() < deadline and flow.poll() is None:
        phase = json.loads(journal.read_text()).get("phase") if journal.is_file() else None
        if phase == "repro" and "Running stage 'train'" in log.read_text():
            break
        time.sleep(0.5)
    assert flow.poll() is None, log.read_text()[-3000:]
    assert _digest(project) != before  # the run had changed data/ and data.dvc
    os.kill(flow.pid, signal.SIGKILL)
    flow.wait()

    from flows.retrain import retrain_flow

    summary = retrain_flow(params=str(project / "params.yaml"), recover_only=True)

    assert summary["recovered"]["action"] == "rolled-back", summary
    assert _digest(project) == before
    assert _registry_state() == registry_before
    assert day6.is_file()  # still waiting for the next run
    assert not journal.exists()
    # Cached outputs are checked out again and uncached ones restored: nothing to rerun.
    assert json.loads(_sh(project, "dvc", "status", "--json") or "{}") == {}


def test_echoed_stage_lines_lose_their_own_timestamp():
    from flows.retrain import unstamped

    line = "16:14:53.732 | INFO    | Task run 'run-stage-2a0' - cluster: cleaning 1 log files"
    assert unstamped(line) == "INFO    | Task run 'run-stage-2a0' - cluster: cleaning 1 log files"
    # dvc's own lines, and a time inside a message, stay as they are
    assert unstamped("Running stage 'cluster':") == "Running stage 'cluster':"
    assert unstamped("cluster: at 16:14:53.732 | x") == "cluster: at 16:14:53.732 | x"

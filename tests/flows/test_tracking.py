"""Stage runs nest under one parent run per pipeline invocation (flows/tracking.py).

The DVC case runs the real thing: a throw-away git + DVC project whose two stages are
separate processes opening `tracking.stage_run`, reproduced by the `dvc` command. One
repro's stages share a parent; another repro (same commit, same params) gets its own; a
DVC experiment's parent is named by the experiment. The in-process cases (a caller's
parent, a stage run on its own) use the session's real local MLflow store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow.tracking import MlflowClient

from flows import tracking
from qpr.config import settings_from_dict
from tests.conftest import REPO_ROOT, tiny_overrides

PARENT = "mlflow.parentRunId"

# A stage command: one stage run, then its output (a stage that is told to fails first).
STAGE_SCRIPT = """
import os, sys
from pathlib import Path
from flows import tracking
from qpr.config import load_settings

name = sys.argv[1]
with tracking.stage_run(name, load_settings(Path("params.yaml")), root=Path.cwd()):
    tracking.log_metrics({"answer": 42})
    if os.environ.get("FAIL_STAGE") == name:
        raise SystemExit(f"stage {name} fails as asked")
Path(f"{name}.txt").write_text(os.environ.get("CONTENT", "one"))
"""


def _settings(tmp_path: Path, experiment: str):
    return settings_from_dict(tiny_overrides(tmp_path, mlflow={"experiment": experiment}))


def _runs(experiment: str) -> list[mlflow.entities.Run]:
    return mlflow.search_runs(experiment_names=[experiment], output_format="list")


def _sh(root: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> int:
    done = subprocess.run(
        list(args), cwd=root, env=env or _env(), capture_output=True, text=True, timeout=600
    )
    assert not check or done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.returncode


def _env(**extra: str) -> dict[str, str]:
    """This interpreter first on PATH, this worktree's code importable, the session's store."""
    env = {**os.environ, **extra}
    env.pop(tracking.PARENT_RUN_ENV, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])
    return env


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two stages, a → b, each `python stage.py NAME`, in a committed git + DVC project."""
    root = tmp_path_factory.mktemp("nesting") / "project"
    root.mkdir()
    experiment = f"qpr-nesting-{uuid.uuid4().hex[:8]}"
    settings = _settings(root, experiment)
    (root / "params.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    (root / "stage.py").write_text(STAGE_SCRIPT)
    python = Path(sys.executable).name
    stages = {
        "a": {"cmd": f"{python} stage.py a", "deps": ["stage.py"], "outs": ["a.txt"]},
        "b": {"cmd": f"{python} stage.py b", "deps": ["stage.py", "a.txt"], "outs": ["b.txt"]},
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for args in (
        ("git", "init", "-q"),
        ("git", "config", "user.email", "tests@example.com"),
        ("git", "config", "user.name", "tests"),
        ("dvc", "init", "-q"),
        ("git", "add", "-A"),
        ("git", "commit", "-q", "-m", "two stages"),
    ):
        _sh(root, *args)
    return root, experiment


def _stage_runs(experiment: str, parent: str) -> dict[str, str]:
    """{stage: status} of the runs nested under `parent`."""
    return {
        r.data.tags["qpr.stage"]: r.info.status
        for r in _runs(experiment)
        if r.data.tags.get(PARENT) == parent
    }


@pytest.mark.slow
def test_one_dvc_repro_nests_its_stage_processes_under_one_parent(dvc_project):
    root, experiment = dvc_project
    commit = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()

    _sh(root, "dvc", "repro")
    _sh(root, "dvc", "repro", "--force")  # same commit, same params: another repro all the same

    stage_runs = [r for r in _runs(experiment) if r.data.tags["qpr.stage"] in ("a", "b")]
    assert len(stage_runs) == 4
    parents = {r.data.tags.get(PARENT) for r in stage_runs}
    assert len(parents) == 2 and None not in parents
    client = MlflowClient()
    for parent_id in parents:
        parent = client.get_run(parent_id)
        assert _stage_runs(experiment, parent_id) == {"a": "FINISHED", "b": "FINISHED"}
        assert parent.info.run_name == f"repro {commit}"
        assert parent.info.status == "FINISHED"  # the last stage's outcome
        assert parent.data.tags["qpr.stage"] == tracking.PARENT_STAGE
        assert parent.data.tags[tracking.TAG_PIPELINE] == "repro"
        assert parent.data.params["mlflow.experiment"] == experiment  # the settings, to compare
        assert PARENT not in parent.data.tags
    keys = {client.get_run(p).data.tags[tracking.TAG_INVOCATION] for p in parents}
    assert len(keys) == 2  # two dvc processes, never one parent


@pytest.mark.slow
def test_a_failed_stage_fails_its_repro_parent(dvc_project):
    root, experiment = dvc_project
    before = {r.info.run_id for r in _runs(experiment)}

    code = _sh(root, "dvc", "repro", "--force", env=_env(FAIL_STAGE="b"), check=False)

    assert code != 0
    new = [r for r in _runs(experiment) if r.info.run_id not in before]
    (parent,) = [r for r in new if r.data.tags["qpr.stage"] == tracking.PARENT_STAGE]
    assert parent.info.status == "FAILED"
    assert _stage_runs(experiment, parent.info.run_id) == {"a": "FINISHED", "b": "FAILED"}


@pytest.mark.slow
def test_a_dvc_experiment_names_its_parent(dvc_project):
    root, experiment = dvc_project
    before = {r.info.run_id for r in _runs(experiment)}

    _sh(root, "dvc", "exp", "run", "--force", "--name", "longer-pairs", env=_env(CONTENT="two"))

    new = [r for r in _runs(experiment) if r.info.run_id not in before]
    (parent,) = [r for r in new if r.data.tags["qpr.stage"] == tracking.PARENT_STAGE]
    assert parent.info.run_name == "longer-pairs"
    assert parent.data.tags[tracking.TAG_PIPELINE] == "experiment"
    assert parent.data.tags[tracking.TAG_EXPERIMENT] == "longer-pairs"
    assert set(_stage_runs(experiment, parent.info.run_id)) == {"a", "b"}


def test_a_callers_parent_takes_the_stage_runs_and_closes_itself(tmp_path: Path):
    experiment = f"qpr-nesting-{uuid.uuid4().hex[:8]}"
    settings = _settings(tmp_path, experiment)

    with tracking.parent_run("pipeline", "pipeline abc1234", settings, root=tmp_path) as parent:
        assert os.environ[tracking.PARENT_RUN_ENV] == parent
        for stage in ("cluster", "train"):
            with tracking.stage_run(stage, settings, root=tmp_path):
                tracking.log_metrics({"epochs": 3})
                tracking.log_parent_metrics({"train_epochs": 3})
    assert tracking.PARENT_RUN_ENV not in os.environ
    with tracking.stage_run("evaluate", settings, root=tmp_path) as alone:
        pass

    run = MlflowClient().get_run(parent)
    assert run.info.run_name == "pipeline abc1234" and run.info.status == "FINISHED"
    assert run.data.metrics == {"train_epochs": 3.0}
    assert _stage_runs(experiment, parent) == {"cluster": "FINISHED", "train": "FINISHED"}
    assert PARENT not in MlflowClient().get_run(alone.info.run_id).data.tags


def test_a_failing_body_fails_the_callers_parent(tmp_path: Path):
    experiment = f"qpr-nesting-{uuid.uuid4().hex[:8]}"
    settings = _settings(tmp_path, experiment)

    with (
        pytest.raises(RuntimeError),
        tracking.parent_run("pipeline", "p", settings) as parent,
        tracking.stage_run("cluster", settings, root=tmp_path),
    ):
        raise RuntimeError("gate failed")

    assert MlflowClient().get_run(parent).info.status == "FAILED"
    assert _stage_runs(experiment, parent) == {"cluster": "FAILED"}


def test_a_parent_that_does_not_exist_leaves_the_stage_run_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    experiment = f"qpr-nesting-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(tracking.PARENT_RUN_ENV, uuid.uuid4().hex)

    with tracking.stage_run("cluster", _settings(tmp_path, experiment), root=tmp_path) as run:
        pass

    assert PARENT not in MlflowClient().get_run(run.info.run_id).data.tags
    assert "not found: not nested" in capsys.readouterr().err


def test_outside_dvc_there_is_no_invocation(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(tracking.DVC_STAGE_ENV, raising=False)
    assert tracking.dvc_invocation() is None
    # Started by DVC but not by a dvc process (pytest above us): no parent to share.
    monkeypatch.setenv(tracking.DVC_STAGE_ENV, "a")
    assert tracking.dvc_invocation() is None


@pytest.mark.parametrize(
    ("cmdline", "is_dvc"),
    [
        (["dvc", "repro"], True),
        (["/venv/bin/python3", "/venv/bin/dvc", "exp", "run"], True),
        (["python", "-m", "dvc", "repro"], True),
        (["C:\\venv\\Scripts\\dvc.exe", "repro"], True),
        (["/bin/sh", "-c", "python -m flows.stage train"], False),
        (["python", "-m", "pytest", "tests/dvc"], False),
        ([], False),
    ],
)
def test_which_processes_are_dvc(cmdline: list[str], is_dvc: bool):
    assert tracking._is_dvc(cmdline) is is_dvc

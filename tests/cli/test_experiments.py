"""`qpr experiments` on a tiny DVC project, with real `dvc exp run --temp` experiments: every
changed param shown (data.* included), a baseline row with numbers on a fresh clone, and a
failed experiment that leaves the workspace as it was."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpr.cli import app

# The stage: needs at least 3 lines of data (as clustering needs enough questions), writes
# an output folder and a headline metric. JITTER stands for another CPU's last digits.
WORK = """\
import json, os, pathlib, sys, yaml
p = yaml.safe_load(open("params.yaml"))
lines = sum(len(f.read_text().splitlines()) for f in pathlib.Path(p["data"]["path"]).iterdir())
if lines < 3:
    sys.exit(f"{lines} lines of data: at least 3 needed")
pathlib.Path("artifacts/out").mkdir(parents=True, exist_ok=True)
pathlib.Path("artifacts/out/rows.txt").write_text(str(lines))
score = lines * p["train"]["lr"] + float(os.environ.get("JITTER", 0))
pathlib.Path("metrics").mkdir(exist_ok=True)
json.dump({"test_p1": score}, open("metrics/headline.json", "w"))
"""
DVC_YAML = """\
stages:
  work:
    cmd: {python} work.py
    deps:
      - ${{data.path}}
      - work.py
    params: [data.path, train]
    outs: [artifacts/out]
    metrics: [metrics/headline.json]
"""
PARAMS = "data:\n  path: data/logs\n  source: logs\ntrain:\n  lr: 0.1\n  epochs: 2\n"


def _run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, check=False, env=env or None
    )


def _dvc(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return _run(sys.executable, "-m", "dvc", *args, cwd=cwd, **({**os.environ, **env}))


def _git_identity(root: Path) -> None:
    for key, value in (("user.name", "qpr"), ("user.email", "qpr@example.com")):
        _run("git", "config", key, value, cwd=root)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed tiny DVC project whose pipeline ran once (the baseline)."""
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    root = tmp_path / "project"
    (root / "data" / "logs").mkdir(parents=True)
    (root / "data" / "logs" / "day1.csv").write_text("a\nb\nc\nd\n", encoding="utf-8")
    (root / "data" / "tiny").mkdir()
    (root / "data" / "tiny" / "day1.csv").write_text("a\n", encoding="utf-8")
    (root / "work.py").write_text(WORK, encoding="utf-8")
    (root / "dvc.yaml").write_text(DVC_YAML.format(python=sys.executable), encoding="utf-8")
    (root / "params.yaml").write_text(PARAMS, encoding="utf-8")
    _run("git", "init", "-q", "-b", "main", cwd=root)
    _git_identity(root)
    assert _dvc(root, "init", "-q").returncode == 0
    ran = _dvc(root, "repro")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    _run("git", "add", "-A", cwd=root)
    assert _run("git", "commit", "-qm", "baseline", cwd=root).returncode == 0
    return root


def _experiments(root: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, ["experiments"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return [line.split() for line in result.output.splitlines() if line.strip()]


def _digest(root: Path) -> dict[str, str]:
    files = [root / "params.yaml", *sorted((root / "artifacts").rglob("*")), root / "dvc.lock"]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def test_two_experiments_compare_with_their_changed_params(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "data" / "more").mkdir()
    (project / "data" / "more" / "day1.csv").write_text("a\nb\nc\nd\ne\n", encoding="utf-8")
    before = _digest(project)
    # An untracked folder reaches the experiment's copy only when named by --copy-paths.
    more = ("-n", "more", "-S", "data.path=data/more")
    assert _dvc(project, "exp", "run", "--temp", "-q", *more).returncode != 0
    ran = _dvc(project, "exp", "run", "--temp", "-q", "-C", "data/more", *more)
    assert ran.returncode == 0, ran.stderr
    ran = _dvc(project, "exp", "run", "--temp", "-q", "-n", "fast", "-S", "train.lr=0.5")
    assert ran.returncode == 0, ran.stderr
    assert _digest(project) == before  # --temp: the workspace stays the baseline

    header, *rows = _experiments(project, monkeypatch)
    assert header == ["experiment", "data.path", "train.lr", "test_p1"]
    assert rows[:2] == [
        ["workspace", "data/logs", "0.1", "0.4000"],
        ["main", "data/logs", "0.1", "0.4000"],
    ]
    assert sorted(rows[2:]) == [  # DVC lists experiments newest first
        ["fast", "data/logs", "0.5", "2.0000"],
        ["more", "data/more", "0.1", "0.5000"],
    ]


def test_a_fresh_clone_shows_the_baseline_with_numbers(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another CPU gives other last digits: the commit's metrics are not in the clone's
    cache, so the workspace's run of the same params stands in for the baseline."""
    clone = tmp_path / "clone"
    assert _run("git", "clone", "-q", str(project), str(clone), cwd=tmp_path).returncode == 0
    _git_identity(clone)
    assert _dvc(clone, "repro", "-q", JITTER="0.001").returncode == 0
    ran = _dvc(clone, "exp", "run", "--temp", "-q", "-n", "fast", "-S", "train.lr=0.5")
    assert ran.returncode == 0, ran.stderr

    header, *rows = _experiments(clone, monkeypatch)
    assert header == ["experiment", "train.lr", "test_p1"]
    assert rows[:3] == [
        ["workspace", "0.1", "0.4010"],
        ["main*", "0.1", "0.4010"],
        ["fast", "0.5", "2.0000"],
    ]
    assert rows[3][0] == "*"  # the note saying where the baseline's numbers come from


def test_a_failed_temp_experiment_leaves_the_workspace_as_it_was(project: Path) -> None:
    before = _digest(project)
    failed = _dvc(project, "exp", "run", "--temp", "-q", "-S", "data.path=data/tiny")
    assert failed.returncode != 0
    assert _digest(project) == before  # params.yaml, dvc.lock and every output unchanged
    assert (project / "artifacts" / "out" / "rows.txt").read_text() == "4"
    assert _run("git", "status", "--porcelain", cwd=project).stdout == ""

"""The pipeline's commands: the stages, retraining, the metrics tables, the UIs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from qpr.cli import app
from qpr.config import load_settings, settings_from_dict
from qpr.ops.layout import RetrainLayout, RetrainLock
from tests.conftest import tiny_overrides

runner = CliRunner()


def test_metrics_prints_strings_nulls_and_numbers(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "register.json").write_text(
        '{"version": 3, "promoted": false, "reason": "within margin", "champion_value": null,'
        ' "challenger_value": 0.8125}'
    )
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(metrics)])
    assert result.exit_code == 0, result.output
    assert "within margin" in result.output and "0.8125" in result.output


def test_metrics_shows_the_fused_model_beside_its_encoder_alone(tmp_path):
    (tmp_path / "metrics").mkdir()
    measures = {"success_1": 0.75, "success_10": 0.9, "recip_rank": 0.8}
    evaluation = {
        **measures,
        "num_queries": 10,
        "baselines": {"bm25": {**measures, "success_1": 0.7}},
        "fusion": {"dense_weight": 0.3, "dense_test": {**measures, "success_1": 0.625}},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(evaluation))
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(tmp_path / "metrics")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("dense" in line and "0.6250" in line for line in lines)
    assert any("model" in line and "0.7500" in line for line in lines)
    text = " ".join(result.output.split())  # the console wraps long lines
    assert "fused at α 0.3, chosen on validation: both fused" in text


def test_metrics_rounds_the_no_answer_threshold_for_people(tmp_path):
    (tmp_path / "metrics").mkdir()
    measures = {"success_1": 0.75, "success_10": 0.9, "recip_rank": 0.8, "num_queries": 10}
    threshold = {
        "value": 2.9205896854400635,
        "target_precision": 0.95,
        "test_answered_share": 0.7379,
        "test_precision_at_1": 0.9978768577494692,
        "test_false_answer_rate": None,
    }
    (tmp_path / "metrics.json").write_text(json.dumps({**measures, "threshold": threshold}))
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(tmp_path / "metrics")])
    assert result.exit_code == 0, result.output
    assert "threshold 2.9206" in result.output and "P@1 0.9979" in result.output
    assert "73.8%" in result.output and "0.99787" not in result.output


def test_metrics_summary_is_the_evaluation_table_and_the_decision(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    measures = {"success_1": 0.75, "success_10": 0.9, "recip_rank": 0.8, "num_queries": 10}
    (tmp_path / "metrics.json").write_text(json.dumps(measures))
    (metrics / "cluster.json").write_text('{"clusters_kept": 400}')
    (metrics / "register.json").write_text('{"version": 2, "reason": "champion kept"}')
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(metrics), "--summary"])
    assert result.exit_code == 0, result.output
    assert "0.7500" in result.output and "version 2: champion kept" in result.output
    assert "clusters_kept" not in result.output


def test_retrain_passes_the_flow_exit_code_through(monkeypatch, tmp_path):
    from qpr.cli import stages

    monkeypatch.setattr(stages, "run_flow", lambda *args: 3)  # every file quarantined
    result = runner.invoke(app, ["retrain", "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 3


def test_ui_help_names_both_uis():
    result = runner.invoke(app, ["ui", "--help"])
    assert result.exit_code == 0, result.output
    assert "Prefect" in result.output and "MLflow" in result.output


def test_every_dvc_stage_is_a_command_that_runs_its_flow(monkeypatch, tmp_path):
    """`qpr STAGE` runs `python -m flows.stage STAGE`, as dvc.yaml does, then prints the
    stage's metrics; a failed flow is exit 1."""
    import yaml

    from qpr.cli import common
    from qpr.paths import ProjectPaths
    from tests.conftest import REPO_ROOT

    stages = list(yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"])
    params = tmp_path / "params.yaml"
    ran = []

    def flow(module: str, *args: str) -> int:
        ran.append((module, *args))
        metrics = ProjectPaths(tmp_path).stage_metrics(args[0])
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps({"num_queries": 12345}))
        return 0

    monkeypatch.setattr(common, "run_flow", flow)
    for stage in stages:
        result = runner.invoke(app, [stage, "--params", str(params)])
        assert result.exit_code == 0, (stage, result.output)
        assert "12,345" in result.output, stage
    assert ran == [("flows.stage", s, "--params", str(params.resolve())) for s in stages]
    assert len(stages) == 8

    monkeypatch.setattr(common, "run_flow", lambda *args: 1)
    assert runner.invoke(app, ["student", "--params", str(params)]).exit_code == 1


# ------------------------------------------- `qpr retrain` owns its cycle (real processes)

# A stand-in for flows/retrain.py: the same guard as its `main`, the cycle's lock, a
# stage process in its group, then a wait long enough to be killed in.
FAKE_CYCLE = """
import os, subprocess, sys, time
from pathlib import Path
from qpr.ops.layout import RetrainLock
from qpr.ops.processes import stops_with_its_group

with stops_with_its_group():
    home = Path(sys.argv[sys.argv.index("--params") + 1]).parent
    with RetrainLock(home / "lock"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (home / "ready").write_text(str(os.getpid()))
        time.sleep(120)
"""


def _group(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _retrain_project(root: Path) -> Path:
    """A retraining project's params.yaml: data/logs versioned by a data.dvc."""
    tree = tiny_overrides(root)
    tree["data"]["path"] = "data/logs"
    (root / "data" / "logs").mkdir(parents=True)
    (root / "data.dvc").write_text("outs:\n- md5: aaa.dir\n  path: data\n")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(settings_from_dict(tree).model_dump(mode="json")))
    return params


def _command_env(*first: Path) -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    path = [*map(str, first), str(root / "src"), str(root)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killing_qpr_retrain_stops_its_cycle_and_frees_the_lock(tmp_path, sig):
    _retrain_project(tmp_path)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "__init__.py").write_text("")
    (tmp_path / "flows" / "retrain.py").write_text(FAKE_CYCLE)
    command = subprocess.Popen(
        [sys.executable, "-m", "qpr.cli", "retrain", "--params", str(tmp_path / "params.yaml")],
        cwd=tmp_path,  # first on its sys.path: the stand-in flows/ shadows the real one
        env=_command_env(tmp_path),
        start_new_session=True,  # its own group, so the test can look for what it leaves
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").is_file():
        assert command.poll() is None and time.monotonic() < deadline, "the cycle never began"
        time.sleep(0.1)
    cycle = int((tmp_path / "ready").read_text())
    assert len(_group(cycle)) == 2  # the cycle and its stage, in their own group

    os.kill(command.pid, sig)
    command.wait(timeout=30)
    deadline = time.monotonic() + 15
    while _group(cycle) or _group(command.pid):
        assert time.monotonic() < deadline, f"left running: {_group(cycle)}"
        time.sleep(0.1)
    with RetrainLock(tmp_path / "lock"):  # free: the next run is not refused as busy
        pass


def test_a_refused_retrain_is_one_line_who_holds_the_lock_since_when(tmp_path):
    params = _retrain_project(tmp_path)
    layout = RetrainLayout.from_settings(load_settings(params), tmp_path)

    with RetrainLock(layout.lock):
        result = subprocess.run(
            [sys.executable, "-m", "qpr.cli", "retrain", "--params", str(params)],
            env=_command_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pid {os.getpid()}" in lines[0] and "since " in lines[0]

"""prefect.yaml: the team-mode deployments of flows/retrain.py: the cycle on the params'
schedule, recovery on its own light schedule every few minutes, and the refresh of the
index with new questions (flows/refresh.py) every few minutes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from qpr.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def deployments() -> dict:
    from prefect.cli.deploy._models import PrefectYamlModel

    spec = PrefectYamlModel.model_validate(yaml.safe_load((ROOT / "prefect.yaml").read_text()))
    return {d.name: d for d in spec.deployments}


def _entrypoint_exists(deployment) -> bool:
    path, function = deployment.entrypoint.split(":")
    return f"def {function}(" in (ROOT / path).read_text()


def test_prefect_yaml_deploys_the_retrain_flow_on_the_params_schedule(deployments):
    deployment = deployments["retrain"]
    assert _entrypoint_exists(deployment)
    cfg = load_settings(ROOT / "params.yaml").retrain
    (schedule,) = deployment.schedules
    assert (schedule.cron, schedule.timezone) == (cfg.cron, cfg.timezone)


def test_recovery_runs_every_five_minutes_on_its_own(deployments):
    deployment = deployments["recover"]
    assert deployment.entrypoint == "flows/retrain.py:recover_flow"
    assert _entrypoint_exists(deployment)
    (schedule,) = deployment.schedules
    assert schedule.cron == "*/5 * * * *"
    assert set(deployments) == {"retrain", "recover", "refresh", "monitor"}


def test_the_monitor_reports_on_the_params_schedule(deployments):
    deployment = deployments["monitor"]
    assert deployment.entrypoint == "flows/monitor.py:monitor_flow"
    assert _entrypoint_exists(deployment)
    cfg = load_settings(ROOT / "params.yaml").monitor
    (schedule,) = deployment.schedules
    assert (schedule.cron, schedule.timezone) == (cfg.cron, cfg.timezone)


def test_refresh_puts_new_questions_in_the_index_every_few_minutes(deployments):
    deployment = deployments["refresh"]
    assert deployment.entrypoint == "flows/refresh.py:refresh_flow"
    assert _entrypoint_exists(deployment)
    (schedule,) = deployment.schedules
    minutes = schedule.cron.split()[0]
    # minutes, not days: fresher than the daily retrain
    assert minutes.startswith("*/") and int(minutes[2:]) <= 15
    assert deployment.concurrency_limit.limit == 1

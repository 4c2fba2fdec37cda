"""prefect.yaml: the team-mode deployment of flows/retrain.py, on the params' schedule."""

from __future__ import annotations

from pathlib import Path

import yaml

from qpr.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_prefect_yaml_deploys_the_retrain_flow_on_the_params_schedule():
    from prefect.cli.deploy._models import PrefectYamlModel

    spec = PrefectYamlModel.model_validate(yaml.safe_load((ROOT / "prefect.yaml").read_text()))
    (deployment,) = spec.deployments
    path, function = deployment.entrypoint.split(":")
    assert f"def {function}(" in (ROOT / path).read_text()
    cfg = load_settings(ROOT / "params.yaml").retrain
    (schedule,) = deployment.schedules
    assert (schedule.cron, schedule.timezone) == (cfg.cron, cfg.timezone)

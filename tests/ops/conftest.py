"""Fixtures for the retraining tests: a project directory with two days of logs."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from qpr.ops.layout import RetrainLayout

from .factories import write_log_day


@pytest.fixture
def project(tmp_path: Path) -> RetrainLayout:
    """A project directory with data/logs (two days), a data.dvc and a dvc.lock."""
    logs = tmp_path / "data" / "logs"
    for offset in (1, 2):
        write_log_day(logs, date(2026, 10, offset))
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

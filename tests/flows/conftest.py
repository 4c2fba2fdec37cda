from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for all flow tests (starting it costs seconds)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def tiny_params_file(tmp_path: Path, tiny_settings) -> Path:
    """A params.yaml for a tiny run, in its own project directory (outputs go beside it)."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_settings.model_dump(mode="json")), encoding="utf-8")
    return path

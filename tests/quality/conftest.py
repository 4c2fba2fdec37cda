"""Fixtures for the data-quality gate tests: crafted good frames and a warm GX context.

Great Expectations takes seconds to import, so one session-scoped fixture pays for the
import (and the ephemeral context) once; every gate test depends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pandas as pd
import pytest

from .factories import make_cluster_outputs, make_log_frame


@pytest.fixture(scope="session")
def gx_gate() -> ModuleType:
    """The gate module with GX imported and its cached ephemeral context created."""
    from qpr.quality import gate as gate_module

    gate_module._get_context()
    return gate_module


@pytest.fixture
def log_frame() -> Callable[[int], pd.DataFrame]:
    """Factory for a fresh valid log frame (tests mutate their copy)."""
    return make_log_frame


@pytest.fixture
def cluster_outputs() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Fresh valid (clusters, questions, pairs) frames."""
    return make_cluster_outputs()

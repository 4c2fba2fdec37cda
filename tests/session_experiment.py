"""MLflow's active experiment in tests: set in the session's store, and put back.

MLflow keeps the active experiment for the rest of the process, as a module global and as
MLFLOW_EXPERIMENT_ID in os.environ (which child processes inherit). `make test` spreads
files over worker processes, so an experiment a file leaves active would decide where a
later file logs, depending on which files ran before it in that process."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_VARIABLE = "MLFLOW_EXPERIMENT_ID"  # mlflow's own constant would import mlflow (1.4 s)
_FLUENT = "mlflow.tracking.fluent"


@contextlib.contextmanager
def active_experiment_kept() -> Iterator[None]:
    """Whatever the body makes active, the caller's active experiment afterwards. Imports
    no mlflow: a session that never loads it pays nothing."""
    before = os.environ.get(_VARIABLE)
    active = getattr(sys.modules.get(_FLUENT), "_active_experiment_id", None)
    try:
        yield
    finally:
        fluent = sys.modules.get(_FLUENT)
        if fluent is not None:
            fluent._active_experiment_id = active  # MLflow has no public way to unset it
        if before is None:
            os.environ.pop(_VARIABLE, None)
        else:
            os.environ[_VARIABLE] = before


@contextlib.contextmanager
def session_experiment(name: str) -> Iterator[str]:
    """`name` active meanwhile, created in the session's store (conftest's
    `isolated_tracking`) if missing; yields its id. A plain `mlflow.set_experiment` would
    create it with its artifacts under ./mlruns, inside the checkout."""
    import mlflow

    with active_experiment_kept():
        if mlflow.get_experiment_by_name(name) is None:
            mlflow.create_experiment(name, artifact_location=os.environ["QPR_MLFLOW_ARTIFACTS"])
        yield mlflow.set_experiment(name).experiment_id

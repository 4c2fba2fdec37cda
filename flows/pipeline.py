"""The whole pipeline as one Prefect flow: cluster → train → export → index → evaluate →
register.

Each stage is a subflow with its own MLflow run, nested under one parent run named
"pipeline <commit>". `dvc repro` is the way to rerun only what changed; this flow reruns
everything.

    python -m flows.pipeline [--params params.yaml]
"""

from __future__ import annotations

import argparse
from typing import Any

from prefect import flow

from flows import tracking
from flows.lifetime import flow_program
from flows.stage import STAGES, run_cli, settings_and_paths, stage_flow


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: str | None = None) -> dict[str, Any]:
    """Run every stage in order; a failing gate stops the line."""
    settings, paths = settings_and_paths(params)
    commit = tracking.git_commit(paths.root)[0][:7]
    with tracking.parent_run("pipeline", f"pipeline {commit}", settings, root=paths.root):
        return {name: stage_flow(name)(params=params) for name in STAGES}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__)
    parser.add_argument("--params", default=None, help="parameter file (default: params.yaml)")
    args = parser.parse_args(argv)
    with flow_program():
        run_cli(pipeline_flow, params=args.params)


if __name__ == "__main__":
    main()

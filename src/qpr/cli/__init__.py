"""The `qpr` command: one sub-command per pipeline stage and per user task.

Stage commands run the stage's Prefect flow (which logs to MLflow), exactly as `dvc repro`
does; `qpr data ...` works on the raw data without Prefect or MLflow. This module holds the
Typer `app` (pyproject's `qpr = "qpr.cli:app"`) and registers each module's commands:
`stages` (the pipeline), `evaluate_file` (`qpr evaluate [FILE]`), `serving` (search, serve),
`experiments` (DVC experiments compared), and the groups `data_commands`, `model_commands`,
`index_commands`; `common` holds what they share.
"""

from __future__ import annotations

from typing import Annotated

import typer

from qpr import environment
from qpr.cli import serving, stages
from qpr.cli.data_commands import data_app
from qpr.cli.evaluate_file import evaluate
from qpr.cli.experiments import experiments
from qpr.cli.index_commands import index_app
from qpr.cli.model_commands import model_app
from qpr.cli.terminal import command_group

app = command_group(
    name="qpr",
    help=(
        "Question paraphrase retrieval: map new, noisy questions onto the questions you "
        "already answer.\n\nThe pipeline (cluster → train → export → index → student → "
        "rerank → evaluate → register) is reproduced by `dvc repro`; each stage is also a "
        "sub-command here. Settings come from params.yaml."
    ),
    no_args_is_help=True,
)


@app.callback()
def main(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Every framework's log lines too (as QPR_LOG_LEVEL=INFO does); quiet "
            "by default: the stages' progress, warnings and results.",
        ),
    ] = False,
) -> None:
    """Question paraphrase retrieval."""
    if verbose:
        environment.set_log_level("INFO")


# In the order `qpr --help` lists them: the stages as dvc.yaml runs them, then the rest.
for _command in (
    stages.cluster,
    stages.train,
    stages.export,
    stages.student,
    stages.rerank,
    evaluate,
    stages.register,
    stages.pipeline,
    stages.retrain,
    stages.monitor,
    stages.ui,
    serving.search,
    serving.serve,
    stages.metrics,
    experiments,
):
    app.command(_command.__name__)(_command)
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")
app.add_typer(index_app, name="index")

__all__ = ["app"]

"""What every `qpr` command shares: the consoles, the one-line error, the `--params`
option, running a flow of flows/ as a child process, and the metrics tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from qpr import environment
from qpr.cli.terminal import FittingConsole
from qpr.errors import printable

# Every table printed fits the terminal's width (qpr.cli.terminal).
console = FittingConsole()
errors = FittingConsole(stderr=True)

ParamsOption = Annotated[
    Path, typer.Option("--params", "-p", help="Parameter file (the pipeline's knobs).")
]


def shown(text: object) -> str:
    """Text a file or a person controls (a path, a column name, a question), ready to put
    into a Rich markup string: control characters escaped, ``[`` never read as a tag."""
    return escape(printable(text, multiline=True))


def fail(message: str) -> NoReturn:
    """One red line on stderr, exit 1: how a command reports an error a person can fix.

    The message often quotes a file (a header, a path): it is never read as markup."""
    errors.print(f"[bold red]error:[/] {shown(message)}", soft_wrap=True)
    raise typer.Exit(1)


def run_flow(module: str, *args: str) -> int:
    """Run `python -m module args` (a Prefect flow of flows/) in the project's environment;
    the library never imports flows/. Returns the exit code; the flow prints its errors.
    The flow is ours: killing this command (SIGTERM, Ctrl-C, SIGKILL) stops it and all it
    started (qpr.ops.processes.run_owned)."""
    from qpr.ops.processes import run_owned

    environment.apply()
    return run_owned([sys.executable, "-m", module, *args])


def run_stage(stage: str, params: Path) -> dict:
    """Run one pipeline stage as its flow; its metrics, or exit 1 when it failed."""
    from qpr.paths import ProjectPaths

    if run_flow("flows.stage", stage, "--params", str(params.resolve())) != 0:
        raise typer.Exit(1)
    paths = ProjectPaths(params.resolve().parent)
    return with_timings(paths.stage_metrics(stage), paths.stage_timings(stage))


def with_timings(metrics_file: Path, timings_file: Path) -> dict:
    """A stage's metrics with its wall-clock figures put back (they are kept apart, outside
    DVC, because they differ on every run)."""
    from qpr.io import join_timings

    metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
    if not timings_file.is_file():
        return metrics
    return join_timings(metrics, json.loads(timings_file.read_text(encoding="utf-8")))


def _format_value(value: object) -> str:
    """Metrics files hold numbers, but also strings (a reason) and nulls (no champion yet)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return str(value) if value is not None else "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value, default=str)


def print_metrics(groups: dict[str, dict]) -> None:
    """One table a stage: its metrics, sorted by name."""
    for name, values in groups.items():
        table = Table(title=name, show_header=True, header_style="bold")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in sorted(values.items()):
            table.add_row(key, _format_value(value))
        console.print(table)


def actor_name(given: str | None) -> str:
    """Who does it: the --actor given, else the login name ("unknown" in a bare container)."""
    if given:
        return given
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in a bare container
        return "unknown"

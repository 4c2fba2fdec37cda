"""`qpr experiments` (`make experiments`): DVC experiments side by side, one row each.

It reads `dvc exp show --json` and prints the params that differ between the rows (data.*
included) and the headline metrics. On a fresh clone the baseline commit's metrics are
not in the DVC cache (another machine made them), so `dvc exp show` prints `!`; when the
workspace ran the baseline's params (`make run`), its metrics stand in, marked `*`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from qpr.cli.common import console, fail, shown

PARAMS_FILE = "params.yaml"
STAND_IN_NOTE = (
    "* the baseline's own metrics are not in this clone's DVC cache: these are the "
    "workspace's, run with the same params"
)


@dataclass
class Row:
    """One line of the comparison: the workspace, a baseline commit or an experiment."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    complete: bool = True  # every metrics file was read


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"data": {"path": "x"}} -> {"data.path": "x"}; lists stay values."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _row(name: str, data: dict[str, Any]) -> Row:
    params: dict[str, Any] = {}
    for file, content in (data.get("params") or {}).items():
        flat = _flat(content.get("data") or {})
        prefix = "" if file == PARAMS_FILE else f"{file}:"
        params.update({prefix + key: value for key, value in flat.items()})
    row = Row(name, params)
    for content in (data.get("metrics") or {}).values():
        if content.get("error") or "data" not in content:
            row.complete = False
            continue
        row.metrics.update(_flat(content["data"]))
    return row


def rows_from_show(show: list[dict[str, Any]]) -> list[Row]:
    """The rows of `dvc exp show --json`: workspace, each baseline, then its experiments
    (queued, running or failed ones, which have no results, are left out)."""
    rows: list[Row] = []
    workspace: Row | None = None
    for entry in show:
        data = entry.get("data")
        if not data:
            continue
        if entry.get("rev") == "workspace":
            workspace = _row("workspace", data)
            rows.append(workspace)
            continue
        baseline = _row(entry.get("name") or str(entry.get("rev", ""))[:7], data)
        # The workspace ran the baseline's params: its results are the baseline's, made here.
        stand_in = workspace is not None and workspace.complete and not baseline.complete
        if stand_in and workspace.params == baseline.params:
            baseline = Row(f"{baseline.name}*", baseline.params, dict(workspace.metrics))
        rows.append(baseline)
        for experiment in entry.get("experiments") or []:
            for rev in experiment.get("revs") or []:
                if rev.get("data") and not rev.get("error"):
                    name = rev.get("name") or str(rev.get("rev", ""))[:7]
                    rows.append(_row(f"  {name}", rev["data"]))
    return rows


def changed_params(rows: list[Row]) -> list[str]:
    """The params whose value is not the same in every row, in params.yaml's order."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row.params))
    missing = object()
    return [
        key
        for key in keys
        if len({json.dumps(r.params.get(key, missing), default=str) for r in rows}) > 1
    ]


def _param(value: Any) -> str:
    """A param as params.yaml spells it (0.1, null, [5]); "-" where a row lacks it."""
    return shown(value if isinstance(value, str) else json.dumps(value))


def _metric(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else _param(value)


def comparison(rows: list[Row]) -> Table:
    """The table: a row an experiment, the params that differ, then the metrics."""
    params = changed_params(rows)
    metrics: dict[str, None] = {}
    for row in rows:
        metrics.update(dict.fromkeys(row.metrics))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("experiment", no_wrap=True)
    for key in params:
        table.add_column(shown(key), overflow="fold")
    for key in metrics:
        table.add_column(shown(key), justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            shown(row.name),
            *(_param(row.params[key]) if key in row.params else "-" for key in params),
            *(_metric(row.metrics[key]) if key in row.metrics else "!" for key in metrics),
        )
    return table


def dvc_show() -> list[dict[str, Any]]:
    """`dvc exp show --json` of the project in the current directory."""
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        fail(f"dvc exp show failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return json.loads(done.stdout or "[]")


def experiments() -> None:
    """Compare DVC experiments (`dvc exp run --temp -S key=value`): one row each, the
    params that differ and the headline metrics. `!`: metrics not in the DVC cache."""
    rows = rows_from_show(dvc_show())
    if not rows:
        fail("no DVC project here: run it in the project's folder")
    console.print(comparison(rows))
    if any(row.name.endswith("*") for row in rows):
        console.print(STAND_IN_NOTE)

"""Output for any terminal: every `--help` whole at 80 columns, and tables that split
rather than cut a number or wrap a label, on a console that is not a tty."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
import typer
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from qpr.cli import app
from qpr.cli.terminal import READABLE_WIDTH, FittedTable, FittingConsole

runner = CliRunner()
WIDTH = 80


def _command_paths(command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and sub-command of the `qpr` tree, as its words after `qpr`."""
    paths = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not sub.hidden:
            paths += _command_paths(sub, (*path, name))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


def _cut_or_too_wide(text: str) -> list[str]:
    """The help lines that are cut ("…", or click's "..." at a summary's end), wider than
    the terminal, or end in a flag broken at a hyphen."""
    bad = []
    for line in text.splitlines():
        summary_cut = line.rstrip().endswith("...") and not line.startswith("Usage:")
        broken_flag = re.search(r"(^|\s)--[\w-]*-$", line.rstrip())
        if "…" in line or summary_cut or len(line) > WIDTH or broken_flag:
            bad.append(line)
    return bad


def test_the_tree_has_every_group_and_sub_command():
    assert {("evaluate",), ("model", "list"), ("index", "add"), ("data", "check")} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "qpr")
def test_every_help_is_whole_at_80_columns(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    assert not _cut_or_too_wide(result.output), result.output


def test_help_piped_from_the_real_command_is_whole() -> None:
    """`qpr evaluate --help | cat`: stdout is a pipe and COLUMNS unset (Rich and click then
    take 80 columns); its options' help was cut with "…" in Rich's panels."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "qpr.cli", "evaluate", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not _cut_or_too_wide(done.stdout), done.stdout
    flat = " ".join(done.stdout.split())
    assert "a folder or .csv/.jsonl/.json/.parquet is logs" in flat  # once cut to ".jso…"
    assert "(MLFLOW_TRACKING_URI)" in flat and "--with-model-index" in flat


def test_the_command_list_shows_each_summary_whole() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": str(WIDTH)})
    flat = " ".join(result.output.split())
    assert "Exit codes: 0 done, 1 failed (rolled back), 3 every new file was quarantined" in flat


# Realistic figures, as `qpr evaluate FILE` prints them: eleven columns at 80 columns.
SYSTEMS = {
    "served": ["1.0000", "1.0000", "1.0000", "0.9457", "0.9652", "1.0000", "0.0500"],
    "encoder alone": ["0.9500", "1.0000", "0.9615", "0.9297", "0.9485", "1.0000", "0.9000"],
    "BM25 alone": ["0.9250", "0.9750", "0.9500", "0.8709", "0.9116", "0.9250", "-"],
}
HEADERS = ["P@1", "P@10", "MRR", "MAP", "nDCG@10", "R@20", "answered"]
HEADERS += ["P@1 answered", "false answers", "p50 ms"]


def _results_table() -> Table:
    table = Table(title="examples/my_logs.csv (logs, split all): 40 queries, 8 clusters")
    table.add_column("system")
    for header in HEADERS:
        table.add_column(header, justify="right")
    for name, values in SYSTEMS.items():
        table.add_row(name, *values, "1.0000", "0.0125", "12,345.67")
    return table


def _printed(renderable, width: int = WIDTH, console: type[Console] = Console) -> str:
    out = console(width=width, file=io.StringIO(), record=True)  # a file: not a tty
    out.print(renderable)
    return out.export_text()


@pytest.mark.parametrize("width", [WIDTH, 60])
def test_a_wide_table_is_split_every_number_whole(width: int) -> None:
    text = _printed(_results_table(), width, FittingConsole)
    lines = text.splitlines()
    assert "…" not in text and max(len(line) for line in lines) <= width
    for name, values in SYSTEMS.items():
        rows = [line for line in lines if line.startswith(f"│ {name} ")]  # one line a row
        assert len(rows) >= 2  # the row label starts each part
        cells = [cell.strip() for row in rows for cell in row.split("│")[2:-1]]
        assert cells == [*values, "1.0000", "0.0125", "12,345.67"]
    assert text.count("examples/my_logs.csv") == 1  # the title once, above the first part


def test_a_table_that_fits_prints_as_it_is() -> None:
    table = Table("system", "P@1")
    table.add_row("served", "0.9500")
    assert _printed(FittedTable(table)) == _printed(table)


def test_text_wraps_at_words_no_narrower_than_readable() -> None:
    """`qpr search --explain` at 80 columns: nine columns, a long question."""
    question = "how tall is the eiffel tower and how many steps lead to its top floor"
    table = Table()
    for header in ("#", "question", "answer", "distance", "rank score", "dense", "bm25"):
        table.add_column(header)
    table.add_column("matched")
    table.add_column("alpha")
    table.add_row(
        *("1", question, "ans-00250", "0.8106", "0.937", "0.911", "10.20 (1.00)"),
        *("how tall eiffel tower steps top floor", "0.70"),
    )
    text = _printed(FittedTable(table))
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= WIDTH
    assert "10.20 (1.00)" in text  # a cell within the readable width stays on one line
    first = text.split("\n\n")[0].splitlines()  # the first part: #, question, ...
    cells = [line.split("│")[2] for line in first if line.startswith("│")]
    assert " ".join(cell.strip() for cell in cells) == question  # wrapped between words
    assert min(len(cell) - 2 for cell in cells) >= READABLE_WIDTH

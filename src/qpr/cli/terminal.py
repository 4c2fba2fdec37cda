"""How `qpr` prints for any terminal: 80 columns, a wide one, or a pipe (Rich then assumes
80 columns, or $COLUMNS).

Tables: `FittingConsole` prints each table as a `FittedTable`: as it is where it fits;
else its columns go into several tables, each repeating the row labels, so that no
number or label is cut ("0.9…") and no text column wraps into fragments of a word or two.

Help: click's plain layout, wrapped to the width and never cut (`command_group`). Typer's
Rich panels put option names, types and help side by side and cut the help with "…" when
the names leave it too little room; click's plain list of commands cuts each summary to
one line, with "...", so `PlainHelpGroup` lists each command's first paragraph whole.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import typer
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

# Text may wrap, but not into a column narrower than this: a question two words a line
# reads badly. A table whose columns need more room than the width is split instead.
READABLE_WIDTH = 16
# Wide enough to measure any cell on one line.
_UNLIMITED = 1_000_000


@dataclasses.dataclass(frozen=True)
class _Size:
    floor: int  # the narrowest the column may be: no number or label cut, text readable
    natural: int  # the width it takes with every cell on one line


def _size(console: Console, options: ConsoleOptions, table: Table, index: int, keys: int) -> _Size:
    """A column's floor and natural width. A number is one word: its floor is all of it.
    Row labels (the first `keys` columns) and no_wrap columns keep each cell on one line;
    a header may wrap at its spaces, except in a no_wrap column (Rich renders it so)."""
    column = table.columns[index]
    header = Measurement.get(console, options, column.header)
    header_floor = header.maximum if column.no_wrap else header.minimum
    floor, natural = max(header_floor, column.min_width or 0), header.maximum
    for cell in column.cells:
        size = Measurement.get(console, options, cell)
        whole = column.no_wrap or index < keys
        need = size.maximum if whole else min(size.maximum, max(size.minimum, READABLE_WIDTH))
        floor, natural = max(floor, need), max(natural, size.maximum)
    return _Size(floor, max(floor, natural))


def _part(table: Table, indexes: list[int], widths: list[int]) -> Table:
    """A table of some of `table`'s columns (same style and rows), each of a fixed width."""
    part = copy.copy(table)
    part.columns, part.rows = [], []
    for index, width in zip(indexes, widths, strict=True):
        column = table.columns[index]
        settings = {
            field.name: getattr(column, field.name)
            for field in dataclasses.fields(column)
            if not field.name.startswith("_")
        }
        part.add_column(**(settings | {"width": width}))
    cells = [list(table.columns[index].cells) for index in indexes]
    for number, row in enumerate(table.rows):
        part.add_row(
            *(column[number] for column in cells), style=row.style, end_section=row.end_section
        )
    return part


def _room(console: Console, options: ConsoleOptions, table: Table, indexes: list[int]) -> int:
    """The width left for these columns' content once borders and padding are drawn."""
    frame = _part(table, indexes, [0] * len(indexes))
    return options.max_width - console.measure(frame, options=options).maximum


def _allot(sizes: list[_Size], room: int) -> list[int]:
    """Natural widths, the widest narrowed first, one character at a time, to fit `room`
    (never below a floor)."""
    widths = [size.natural for size in sizes]
    excess = sum(widths) - room
    while excess > 0:
        narrowable = [i for i, width in enumerate(widths) if width > sizes[i].floor]
        if not narrowable:
            break
        widest = max(narrowable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


@dataclasses.dataclass
class FittedTable:
    """`table` as it is where it fits; else split into tables of fewer columns that do,
    each starting with the row labels (the first `keys` columns). The title goes above
    the first, the caption below the last."""

    table: Table
    keys: int = 1

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table, width = self.table, options.max_width
        wide = options.update_width(_UNLIMITED)
        if console.measure(table, options=wide).maximum <= width or len(table.columns) <= 1:
            yield table
            return
        keys = min(self.keys, len(table.columns) - 1)
        sizes = [_size(console, wide, table, i, keys) for i in range(len(table.columns))]

        def fits(indexes: list[int]) -> bool:
            floors = sum(sizes[i].floor for i in indexes)
            return floors <= _room(console, options, table, indexes)

        groups: list[list[int]] = []
        current = list(range(keys))
        for index in range(keys, len(table.columns)):
            if len(current) > keys and not fits([*current, index]):
                groups.append(current)
                current = list(range(keys))
            current.append(index)
        groups.append(current)
        for number, indexes in enumerate(groups):
            room = _room(console, options, table, indexes)
            part = _part(table, indexes, _allot([sizes[i] for i in indexes], room))
            part.title = table.title if number == 0 else None
            part.caption = table.caption if number == len(groups) - 1 else None
            if number:
                yield Text("")
            yield part


class FittingConsole(Console):
    """A Rich console that prints each table as a `FittedTable`: no table a `qpr` command
    prints is cut at the terminal's width."""

    def print(self, *objects: Any, **settings: Any) -> None:
        fitted = (FittedTable(o) if isinstance(o, Table) else o for o in objects)
        super().print(*fitted, **settings)


def _summary(command: Any) -> str:
    """A command's short help, or its help's first paragraph, on one line."""
    text = inspect.cleandoc(command.short_help or command.help or "")
    return " ".join(text.split("\n\n")[0].split())


class PlainHelpGroup(TyperGroup):
    """A command group whose help lists each command with its first paragraph whole."""

    # ctx and formatter are typer's own copy of click's types, which it does not export.
    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, _summary(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def command_group(**settings: Any) -> typer.Typer:
    """A `typer.Typer` whose help, and that of its commands, reads on any terminal: click's
    plain layout, wrapped, never cut (`settings`: typer.Typer's own)."""
    return typer.Typer(cls=PlainHelpGroup, rich_markup_mode=None, **settings)

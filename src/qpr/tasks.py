"""How batch tasks run: a `Mapper` maps a task function over small task records.

A task record is a frozen dataclass of paths and a few settings, never large data: a task
reads its input from disk and writes its result there, atomically. `local_map` runs the
tasks one by one in this process; `flows/engine.py` gives Ray's map. Stages take a Mapper,
so the same code runs on either engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
Mapper = Callable[[Callable[[T], R], Sequence[T]], list[R]]


def local_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """The local engine: each task in turn, in this process."""
    return [fn(item) for item in items]

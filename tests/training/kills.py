"""A training run killed after an epoch, as a crash would end it: the `on_epoch` hook of
`qpr.training.loop.fit` raises once the epoch's checkpoint is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Killed(RuntimeError):
    """What the hook raises: the run ends there, its last.pt already written."""


def kill_after(epoch: int) -> Callable[[dict[str, Any]], None]:
    """An on_epoch hook that raises `Killed` after epoch `epoch` (1-based)."""

    def hook(record: dict[str, Any]) -> None:
        if record["epoch"] == epoch:
            raise Killed

    return hook

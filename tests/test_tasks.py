"""The local engine: tasks in input order, in this process."""

from __future__ import annotations

import os

from qpr.tasks import local_map


def test_local_map_runs_each_task_in_order_in_this_process() -> None:
    seen: list[int] = []

    def task(item: int) -> tuple[int, int]:
        seen.append(item)
        return item * item, os.getpid()

    assert local_map(task, [3, 1, 2]) == [(9, os.getpid()), (1, os.getpid()), (4, os.getpid())]
    assert seen == [3, 1, 2]
    assert local_map(task, []) == []

"""The engine batch tasks run on: `local` (this process) or `ray` (a Ray cluster).

`params.yaml` `engine: local | ray` picks it. With ray, `RAY_ADDRESS` names a running
cluster (its workers must have this project installed, e.g. the Dockerfile's image); with
no address a local Ray cluster starts inside the run and stops with it. Tasks get and
return small frozen dataclasses of paths (`qpr.retrieval.indexer`), never large data: a
task reads its shard from the shared disk and writes its result there, atomically.

A task whose worker dies (killed, out of memory, a node lost) is run again by Ray, up to
`RETRIES` times; the task's file is written atomically under a name of its inputs, so a
rerun writes the same bytes and a half-written file never exists.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from qpr.errors import QPRError
from qpr.tasks import Mapper, local_map

T = TypeVar("T")
R = TypeVar("R")

ENGINES = ("local", "ray")
RETRIES = 3
# The object store holds only small task results here: keep it from taking a fifth of RAM.
OBJECT_STORE_BYTES = 256 * 1024**2


def mapper(
    engine: str, *, num_cpus: int | None = None, log: Callable[[str], None] = print
) -> Mapper:
    """The map function of `engine` (ValueError for an unknown one)."""
    if engine == "local":
        return local_map
    if engine == "ray":
        return lambda fn, items: ray_map(fn, items, num_cpus=num_cpus, log=log)
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def ensure_ray(num_cpus: int | None = None) -> Any:
    """Ray, connected: to RAY_ADDRESS when set, else to a local cluster started here."""
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or None
        # "local": a new cluster, never one another run on this machine happens to have.
        ray.init(
            address=address or "local",
            num_cpus=None if address else num_cpus,
            object_store_memory=None if address else OBJECT_STORE_BYTES,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    return ray


def ray_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    num_cpus: int | None = None,
    retries: int = RETRIES,
    log: Callable[[str], None] = print,
) -> list[R]:
    """fn over items as Ray tasks (one CPU each), results in input order, a progress line
    as tasks finish. A task that raises stops the map with its error (a QPRError, such as
    a failed gate, as itself); a dead worker's task is retried `retries` times."""
    ray = ensure_ray(num_cpus)
    remote = ray.remote(num_cpus=1, max_retries=retries)(fn)
    refs = [remote.remote(item) for item in items]
    pending, started = list(refs), time.perf_counter()
    while pending:
        _, pending = ray.wait(pending, num_returns=1)
        finished = len(refs) - len(pending)
        log(f"ray: {finished}/{len(refs)} tasks done ({time.perf_counter() - started:.0f} s)")
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, QPRError):  # a gate or a bad file: its own message, as local
            raise err.cause from None
        raise

"""A flow on a schedule in this process: the local runner behind `--serve` (retrain,
monitor). Needs a Prefect server with a scheduler (`require_scheduler`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.lifetime import require_scheduler


def serve_on_cron(flow: Any, name: str, *, cron: str, timezone: str, params: Path) -> None:
    """Run `flow` with the params file at `params` on `cron` (in `timezone`), as the
    deployment `name`, one run at a time (a second would only be refused or overlap).
    Stop with Ctrl-C."""
    from prefect.schedules import Cron

    require_scheduler()
    print(f"serving {flow.name} on '{cron}' ({timezone}) for {params.parent}")
    flow.serve(
        name=name,
        schedules=[Cron(cron, timezone=timezone)],
        parameters={"params": str(params)},
        limit=1,
    )

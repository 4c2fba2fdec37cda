"""Scheduled retraining on fresh logs: one Prefect flow run = one cycle (qpr.ops.cycle).

    recover a crashed run (journal) → harvest the service's feedback into the inbox →
    find new files in retrain.incoming → raw-log gate per
    file (a bad one goes to retrain.quarantine with its report) → merge the good ones into
    data/logs without duplicate rows → dvc add data → dvc repro (ends with the register
    stage: register, promote or keep the champion) → commit point → git commit (optional),
    archive the merged files → summary (printed, returned, one MLflow run)

Why `dvc repro` and not the in-process pipeline flow: DVC decides what to rerun and pins
the result (dvc.lock), so every retrained model is reproducible from a commit. The cycle,
its crash safety (journal, rollback, what SIGKILL does) and its summary live in qpr.ops
and docs/operations.md; this module makes its steps Prefect tasks, logs the run to MLflow
and schedules it.

    python -m flows.retrain                 # one cycle now (what `qpr retrain` runs)
    python -m flows.retrain --serve         # a local runner that runs it on retrain.cron
    python -m flows.retrain --recover-only  # only roll back / finish a crashed run

Recovery also runs on its own light schedule (`recover_flow`, the `recover` deployment of
prefect.yaml, every 5 minutes): a crashed run is undone within minutes, not at the next
day's cycle. It stands aside while a cycle holds the lock (that cycle recovers itself).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows import tracking
from flows.lifetime import start_temporary_api
from flows.schedule import serve_on_cron
from flows.stage import run_cli, settings_and_paths
from qpr.config import Settings
from qpr.io import write_json_atomic
from qpr.ops import cycle as ops
from qpr.ops.journal import Journal
from qpr.ops.layout import RetrainBusy, RetrainLayout, RetrainLock, utc_stamp
from qpr.ops.processes import stops_with_its_group, tool_env
from qpr.ops.summary import describe, exit_code, new_summary, record_failure
from qpr.redact import redact, redact_tree


def _prefect_api_url() -> str | None:
    """The API this flow run talks to, so the stage flows that `dvc repro` starts report
    to the same server instead of each starting a temporary one (≈10 s per stage)."""
    try:
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        url = str(context.client.api_url) if context and context.client else None
    except Exception:  # outside a flow run
        url = None
    if not url:
        from prefect.settings import PREFECT_API_URL

        url = PREFECT_API_URL.value()
    if url and urlparse(url).hostname not in (None, "ephemeral-prefect"):
        return url
    return None


def child_env() -> dict[str, str]:
    """tool_env, plus the Prefect API of this flow run for the stage flows."""
    extra: dict[str, str] = {}
    if not os.environ.get("PREFECT_API_URL") and (url := _prefect_api_url()):
        extra["PREFECT_API_URL"] = url
    return tool_env(extra)


def _close_run(run_id: str | None, outcome: str) -> bool:
    """Mark a crashed cycle's MLflow run FAILED (it stays RUNNING forever otherwise); True
    when it was still running."""
    if not run_id:
        return False
    client = MlflowClient()
    try:
        if client.get_run(run_id).info.status != "RUNNING":
            return False
        client.set_tag(run_id, "qpr.retrain.outcome", outcome)
        client.set_terminated(run_id, "FAILED")
    except MlflowException:
        return False
    return True


def _mark_killed(journal: Journal) -> None:
    _close_run(journal.data.get("mlflow_run_id"), "crashed, rolled back")


def close_orphan_run(layout: RetrainLayout) -> str | None:
    """Close the MLflow run a killed cycle left (its id in `layout.active_run`, written as
    soon as the run existed); the run id when one was closed. The caller holds the lock."""
    marker = layout.active_run
    try:
        run_id = json.loads(marker.read_text(encoding="utf-8")).get("mlflow_run_id")
    except (OSError, ValueError):
        return None
    closed = _close_run(run_id, "killed, closed by the next start")
    marker.unlink(missing_ok=True)
    return run_id if closed else None


# ---------------------------------------------------------------- tasks


@task(name="recover", cache_policy=NO_CACHE)
def recover_task(cycle: ops.Cycle) -> dict[str, Any] | None:
    recovery = ops.recover_run(cycle, on_rolled_back=_mark_killed)
    orphan = close_orphan_run(cycle.layout)
    if orphan is not None:
        get_run_logger().warning(f"closed the MLflow run {orphan} of a killed cycle as FAILED")
    if recovery is None:
        return None
    get_run_logger().warning(
        f"run {recovery.run} had crashed in phase {recovery.phase!r}: {recovery.action}; "
        + "; ".join(recovery.steps)
    )
    return recovery.as_dict()


# The time a stage's own Prefect log line starts with ("16:14:46.309 | INFO | ..."): the
# retraining run's logger stamps each echoed line again, so it goes.
_STAMP = re.compile(r"^\d{2}:\d{2}:\d{2}\.\d{3} \| ")


def unstamped(line: str) -> str:
    """A line of `dvc repro`'s output without the time its stage's logger put first."""
    return _STAMP.sub("", line, count=1)


@task(name="dvc-repro", cache_policy=NO_CACHE)
def repro_task(cycle: ops.Cycle, journal: Journal) -> None:
    log = get_run_logger().info
    ops.repro(cycle, journal, echo=lambda line: log(unstamped(line)))


STEPS = ops.CycleSteps(
    harvest=task(ops.harvest_feedback, name="harvest-feedback", cache_policy=NO_CACHE),
    validate=task(ops.validate_file, name="validate-file", cache_policy=NO_CACHE),
    merge=task(ops.merge_files, name="merge", cache_policy=NO_CACHE),
    version=task(ops.version_merged_data, name="version-data", cache_policy=NO_CACHE),
    repro=repro_task,
)


# ---------------------------------------------------------------- the flow


def record_summary(summary: Mapping[str, Any], summary_file: Path, repro_log: Path) -> None:
    """The summary on disk and in the MLflow run, credentials masked (an error message may
    repeat a tracking URI with its password)."""
    write_json_atomic(summary_file, redact_tree(dict(summary)))
    _log_to_mlflow(summary, summary_file, repro_log)
    print(redact(describe(dict(summary))))


def _log_to_mlflow(summary: Mapping[str, Any], summary_file: Path, repro_log: Path) -> None:
    merge = summary.get("merge") or {}
    reg = summary.get("register") or {}
    harvested = summary.get("harvest") or {}
    tracking.log_metrics(
        {
            "files_found": len(summary.get("files_found", [])),
            "files_merged": len(summary.get("files_valid", [])),
            "files_quarantined": len(summary["quarantined"]),
            "rows_added": merge.get("rows_added", 0),
            "rows_duplicate": merge.get("rows_duplicate", 0),
            "promoted": int(bool(reg.get("promoted"))),
            "harvested_rows": harvested.get("rows", 0),
            "harvested_rejections": harvested.get("rejections", 0),
            "seconds": summary.get("seconds", 0.0),
        }
    )
    tags = {"qpr.retrain.outcome": summary["outcome"], "qpr.retrain.run": summary["run"]}
    if reg:
        tags["qpr.registered_version"] = str(reg.get("version"))
        tags["qpr.promoted"] = str(bool(reg.get("promoted"))).lower()
    if summary.get("data_md5_after"):
        tags["qpr.data_hash_after"] = f"dvc:{summary['data_md5_after']}"
    mlflow.set_tags(redact_tree(tags))
    tracking.log_artifacts({"retrain": summary_file, "retrain/logs": repro_log})


def _tracked_cycle(
    cycle: ops.Cycle, summary: dict[str, Any], settings: Settings, root: Path, started: float
) -> None:
    """The cycle inside its MLflow run, whose id is on disk before anything else happens;
    the stage runs of its `dvc repro` nest under it."""
    # Nothing the run stores may hold a credential (a token in a path, a password in a URI).
    with tracking.stage_run(
        "retrain", settings, root=root, scrub=redact_tree, run_name=f"retrain {cycle.run}"
    ) as mlflow_run:
        extra = {"mlflow_run_id": mlflow_run.info.run_id}
        write_json_atomic(cycle.layout.active_run, {**extra, "run": cycle.run})
        try:
            with tracking.children_of(mlflow_run.info.run_id):
                ops.run_cycle(cycle, summary, journal_extra=extra)
        except BaseException as err:
            record_failure(summary, err)
            raise
        finally:
            summary["seconds"] = round(time.monotonic() - started, 1)
            record_summary(summary, cycle.summary_file, cycle.repro_log)


# The lock `main` took before the flow started (None under a deployment or `--serve`).
_HELD_LOCK: RetrainLock | None = None


def _cycle_lock(layout: RetrainLayout) -> contextlib.AbstractContextManager:
    """The cycle's lock: the one `main` already holds for this project, else taken here."""
    if _HELD_LOCK is not None and _HELD_LOCK.path == layout.lock:
        return contextlib.nullcontext()
    return RetrainLock(layout.lock)


def _refuse_when_busy(params: str | None) -> RetrainLock:
    """Take the cycle's lock before Prefect starts, so a refused run is one line on stderr
    (who holds it, since when) and exit 1: raised inside the flow, Prefect's engine would
    log the error with its traceback first."""
    settings, paths = settings_and_paths(params)
    lock = RetrainLock(RetrainLayout.from_settings(settings, paths.root).lock)
    try:
        return lock.__enter__()
    except RetrainBusy as err:
        print(f"ERROR: {err}", file=sys.stderr)
        raise SystemExit(1) from None


@flow(name="retrain", log_prints=True)
def retrain_flow(params: str | None = None, recover_only: bool = False) -> dict[str, Any]:
    """One retraining cycle on the log files waiting in retrain.incoming; returns (and
    prints) what it did. A second run on the same inputs changes nothing."""
    settings, paths = settings_and_paths(params)
    layout = RetrainLayout.from_settings(settings, paths.root)
    cycle = ops.Cycle(
        settings, layout, run=utc_stamp(), log=print, steps=STEPS, environment=child_env
    )
    started = time.monotonic()
    summary = new_summary(cycle.run)
    with _cycle_lock(layout):
        summary["recovered"] = recover_task(cycle)
        if recover_only:
            summary["outcome"] = "recovered" if summary["recovered"] else "nothing-to-recover"
            print(redact(describe(summary)))
            return summary
        try:
            _tracked_cycle(cycle, summary, settings, paths.root, started)
        finally:
            # Reached unless the process is killed: then the next start closes the run.
            layout.active_run.unlink(missing_ok=True)
    return summary


@flow(name="recover", log_prints=True)
def recover_flow(params: str | None = None) -> dict[str, Any]:
    """Roll back (or finish) a crashed cycle and close its MLflow run; light enough to run
    every few minutes. A cycle holding the lock is left alone: it recovers for itself."""
    settings, paths = settings_and_paths(params)
    layout = RetrainLayout.from_settings(settings, paths.root)
    cycle = ops.Cycle(settings, layout, run=utc_stamp(), log=print, environment=child_env)
    summary = new_summary(cycle.run)
    try:
        with RetrainLock(layout.lock):
            summary["recovered"] = recover_task(cycle)
    except RetrainBusy:
        summary["outcome"] = "busy"
        print("a retraining cycle is running; it recovers for itself")
        return summary
    summary["outcome"] = "recovered" if summary["recovered"] else "nothing-to-recover"
    print(redact(describe(summary)))
    return summary


def serve(params: str | None = None) -> None:
    """Run retrain_flow on retrain.cron in this process (a local Prefect runner); the
    deployment is named retrain-local. Stop with Ctrl-C."""
    settings, paths = settings_and_paths(params)
    cfg = settings.retrain
    serve_on_cron(
        retrain_flow, "retrain-local", cron=cfg.cron, timezone=cfg.timezone, params=paths.params
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.retrain", description=__doc__)
    parser.add_argument("--params", help="params file (default: the project's params.yaml)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--serve", action="store_true", help="run on retrain.cron until stopped")
    mode.add_argument(
        "--recover-only", action="store_true", help="roll back or finish a crashed run, then stop"
    )
    args = parser.parse_args(argv)
    with stops_with_its_group():
        if args.serve:
            run_cli(serve, args.params)
            return
        global _HELD_LOCK
        _HELD_LOCK = run_cli(_refuse_when_busy, args.params)
        try:
            # Dies with this process, even by SIGKILL; SIGTERM unwinds as Ctrl-C does.
            start_temporary_api()
            summary = run_cli(retrain_flow, params=args.params, recover_only=args.recover_only)
        finally:
            _HELD_LOCK.__exit__(None, None, None)
            _HELD_LOCK = None
        raise SystemExit(exit_code(summary))


if __name__ == "__main__":
    main()

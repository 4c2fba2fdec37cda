"""Scheduled retraining on fresh logs: one Prefect flow run = one cycle.

    recover a crashed run (journal) → find new files in retrain.incoming → raw-log gate per
    file (a bad one goes to retrain.quarantine with its report) → merge the good ones into
    data/logs without duplicate rows → dvc add data → dvc repro (ends with the register
    stage: register, promote or keep the champion) → commit point → git commit (optional),
    archive the merged files → summary (printed, returned, one MLflow run)

Why `dvc repro` and not the in-process pipeline flow: DVC decides what to rerun and pins
the result (dvc.lock), so every retrained model is reproducible from a commit. Crash
safety (journal, rollback, what SIGKILL does) is explained in qpr.ops.retraining and in
docs/operations.md; this module wires it to Prefect, MLflow and the registry.

    python -m flows.retrain                 # one cycle now (what `qpr retrain` runs)
    python -m flows.retrain --serve         # a local runner that runs it on retrain.cron
    python -m flows.retrain --recover-only  # only roll back / finish a crashed run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
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
from flows.stage import EXPECTED_ERRORS, settings_and_paths, write_metrics
from qpr.config import Settings
from qpr.data.versioning import pinned_md5
from qpr.ops import registry
from qpr.ops.retraining import (
    LOCK_FILE,
    IncomingFile,
    Journal,
    Ledger,
    RetrainError,
    RetrainLayout,
    RetrainLock,
    Validation,
    archive,
    discover,
    ledger_records,
    merge_logs,
    quarantine,
    recover,
    run_pipeline,
    run_tool,
    tool_env,
    uncached_outputs,
    utc_stamp,
    validate,
)

ACTOR = "retrain-flow"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "qpr retrain",
    "GIT_AUTHOR_EMAIL": "qpr-retrain@localhost",
    "GIT_COMMITTER_NAME": "qpr retrain",
    "GIT_COMMITTER_EMAIL": "qpr-retrain@localhost",
}


def layout_for(settings: Settings, root: Path) -> RetrainLayout:
    cfg = settings.retrain
    if settings.data.source != "logs":
        raise RetrainError(f"retraining merges QA logs; data.source is {settings.data.source!r}")
    return RetrainLayout.build(
        root,
        incoming=cfg.incoming,
        quarantine=cfg.quarantine,
        archive=cfg.archive,
        state_dir=cfg.state_dir,
        logs_path=settings.data.path,
    )


# ---------------------------------------------------------------- registry snapshot (MLflow)


def registry_snapshot(name: str) -> dict[str, Any]:
    """Aliases and every version's tags: what a rollback must put back."""
    client = MlflowClient()
    try:
        model = client.get_registered_model(name)
    except MlflowException:
        return {"name": name, "exists": False, "aliases": {}, "versions": {}}
    versions = client.search_model_versions(f"name = '{name}'")
    return {
        "name": name,
        "exists": True,
        "aliases": {alias: str(v) for alias, v in (model.aliases or {}).items()},
        "versions": {str(v.version): dict(v.tags or {}) for v in versions},
    }


def restore_registry(journal: dict[str, Any]) -> list[str]:
    """Undo what a rolled-back run did to the registry: delete the versions it registered,
    put the aliases back, and restore every older version's tags (promotion events).

    "Registered by that run": created after the run began and trained on the data it
    made (the version's qpr.data_hash is the run's new data hash, or missing). Before
    the data was versioned (no data_md5 in the journal) the run cannot have registered
    anything, so nothing is deleted."""
    snapshot = journal.get("registry") or {}
    name = snapshot.get("name")
    if not name:
        return []
    client = MlflowClient()
    try:
        client.get_registered_model(name)
    except MlflowException:
        return []
    steps: list[str] = []
    before_versions: dict[str, dict[str, str]] = snapshot.get("versions") or {}
    md5 = journal.get("data_md5")
    started_ms = int(journal.get("started_ms", 0))
    for mv in client.search_model_versions(f"name = '{name}'"):
        version = str(mv.version)
        tags = dict(mv.tags or {})
        if version in before_versions:
            wanted = before_versions[version]
            for key, value in wanted.items():
                if tags.get(key) != value:
                    client.set_model_version_tag(name, version, key, value)
            for key in set(tags) - set(wanted):
                client.delete_model_version_tag(name, version, key)
            if tags != wanted:
                steps.append(f"registry: tags of version {version} restored")
            continue
        data_hash = tags.get(registry.TAG_DATA_HASH)
        ours = md5 is not None and data_hash in (None, f"dvc:{md5}")
        if ours and mv.creation_timestamp >= started_ms:
            client.delete_model_version(name, version)
            steps.append(f"registry: version {version} (registered by the run) deleted")
    current = dict(client.get_registered_model(name).aliases or {})
    wanted_aliases: dict[str, str] = snapshot.get("aliases") or {}
    for alias in set(current) - set(wanted_aliases):
        client.delete_registered_model_alias(name, alias)
        steps.append(f"registry: alias {alias} removed")
    for alias, version in wanted_aliases.items():
        if str(current.get(alias)) != version:
            client.set_registered_model_alias(name, alias, version)
            steps.append(f"registry: alias {alias} → version {version} again")
    if not snapshot.get("exists") and not client.search_model_versions(f"name = '{name}'"):
        client.delete_registered_model(name)
        steps.append(f"registry: model {name!r} removed (it did not exist before)")
    return steps or ["registry: unchanged"]


def _mark_killed(journal: Journal) -> None:
    """The crashed run's MLflow run stays RUNNING forever otherwise."""
    run_id = journal.data.get("mlflow_run_id")
    if not run_id:
        return
    client = MlflowClient()
    try:
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, "qpr.retrain.outcome", "crashed, rolled back")
            client.set_terminated(run_id, "KILLED")
    except MlflowException:
        pass


# ---------------------------------------------------------------- tools


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
    extra: dict[str, str] = {}
    if not os.environ.get("PREFECT_API_URL") and (url := _prefect_api_url()):
        extra["PREFECT_API_URL"] = url
    return tool_env(extra)


def _git(layout: RetrainLayout, *args: str, check: bool = True):
    env = child_env()
    probe = run_tool(["git", "var", "GIT_COMMITTER_IDENT"], layout.root, env, check=False)
    if probe.returncode != 0:  # no identity configured (CI, a container): use the flow's
        env.update(GIT_IDENTITY)
    return run_tool(["git", *args], layout.root, env, check=check)


def checkout_outputs(layout: RetrainLayout) -> str:
    """Cached stage outputs back to what the restored dvc.lock pins (best effort: the
    uncached ones, metrics and reports, come back with the next `dvc repro`)."""
    result = run_tool(["dvc", "checkout", "--force", "-q"], layout.root, child_env(), check=False)
    if result.returncode == 0:
        return "dvc checkout: stage outputs match the restored dvc.lock"
    last = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
    return f"dvc checkout --force exited {result.returncode} ({last[0][:200]}): run `dvc repro`"


def finish_commit(settings: Settings, layout: RetrainLayout, journal: Journal) -> list[str]:
    """Everything after the commit point; each step is idempotent (a roll-forward after a
    crash repeats it): git commit, dvc push, archive the merged files, ledger."""
    cfg = settings.retrain
    run = journal.data["run"]
    steps: list[str] = []
    pinned = [p.name for p in (layout.dvc_file, layout.dvc_lock) if p.exists()]
    if cfg.git_commit:
        changed = _git(layout, "status", "--porcelain", "--", *pinned).stdout.strip()
        if changed:
            register = journal.data.get("register") or {}
            message = (
                f"retrain {run}: {journal.data.get('rows_added', '?')} new log rows from "
                f"{len(journal.files)} file(s); model version {register.get('version', '?')} "
                f"{'promoted' if register.get('promoted') else 'kept as challenger'}"
            )
            _git(layout, "add", "--", *pinned)  # dvc.lock may be new to git
            result = _git(layout, "commit", "-q", "-m", message, "--", *pinned, check=False)
            if result.returncode == 0:
                sha = _git(layout, "rev-parse", "--short", "HEAD").stdout.strip()
                steps.append(f"git commit {sha}")
                journal.data["git_commit"] = sha
            else:
                steps.append(f"WARNING: git commit failed: {(result.stderr or '').strip()[:300]}")
        else:
            steps.append("git: data.dvc and dvc.lock already committed")
    if cfg.dvc_push:
        pushed = run_tool(
            ["dvc", "push", "-q", layout.dvc_file.name], layout.root, child_env(), check=False
        )
        steps.append(
            "dvc push: data pushed"
            if pushed.returncode == 0
            else f"WARNING: dvc push failed: {(pushed.stderr or '').strip()[:300]}"
        )
    target = layout.archive / run
    moved = archive(journal.files, target)
    ledger = Ledger(layout.ledger)
    recorded = {(e.get("run"), e.get("sha256")) for e in ledger.entries()}
    ledger.append(
        r
        for r in ledger_records(journal.files, run=run, outcome="merged", archived_to=target)
        if (run, r["sha256"]) not in recorded
    )
    steps.append(f"archived {len(moved)} merged file(s) to {target}")
    return steps


def recover_run(settings: Settings, layout: RetrainLayout, *, mark_killed: bool = True):
    """Roll back (or forward) whatever run left a journal; the caller holds the lock."""
    return recover(
        layout,
        restore_registry=restore_registry,
        checkout_outputs=lambda: checkout_outputs(layout),
        finish_commit=lambda journal: finish_commit(settings, layout, journal),
        on_rolled_back=_mark_killed if mark_killed else None,
    )


def _require_data_in_sync(layout: RetrainLayout) -> None:
    """A rollback restores data/ to what data.dvc pins; refuse to start when data/ holds
    changes nobody versioned (they would be versioned by this run without anyone asking)."""
    status = run_tool(
        ["dvc", "status", "--json", layout.dvc_file.name], layout.root, child_env(), check=False
    )
    try:
        clean = status.returncode == 0 and json.loads(status.stdout or "{}") == {}
    except json.JSONDecodeError:
        clean = False
    if not clean:
        raise RetrainError(
            f"{layout.data_dir.name}/ does not match {layout.dvc_file.name} (or is not in the DVC "
            f"cache): `dvc add {layout.data_dir.name}` to keep what is there, or `dvc checkout "
            f"{layout.dvc_file.name}` to drop it, then retrain. dvc status: "
            f"{(status.stdout or status.stderr).strip()[:300]}"
        )


# ---------------------------------------------------------------- tasks


@task(name="recover", cache_policy=NO_CACHE)
def recover_task(settings: Settings, layout: RetrainLayout) -> dict[str, Any] | None:
    recovery = recover_run(settings, layout)
    if recovery is None:
        return None
    get_run_logger().warning(
        f"run {recovery.run} had crashed in phase {recovery.phase!r}: {recovery.action}; "
        + "; ".join(recovery.steps)
    )
    return recovery.as_dict()


@task(name="validate-file", cache_policy=NO_CACHE)
def validate_task(file: IncomingFile, settings: Settings, report_dir: Path) -> Validation:
    return validate(file, settings.quality, report_dir)


@task(name="merge", cache_policy=NO_CACHE)
def merge_task(files: list[IncomingFile], layout: RetrainLayout) -> dict[str, Any]:
    return merge_logs(files, layout.logs_dir).as_dict()


@task(name="version-data", cache_policy=NO_CACHE)
def version_task(layout: RetrainLayout) -> str:
    run_tool(["dvc", "add", "-q", layout.data_dir.name], layout.root, child_env())
    md5 = pinned_md5(layout.dvc_file)
    if md5 is None:
        raise RetrainError(f"`dvc add` wrote no hash into {layout.dvc_file}")
    return md5


@task(name="dvc-repro", cache_policy=NO_CACHE)
def repro_task(settings: Settings, layout: RetrainLayout, journal: Journal, log: Path) -> None:
    def started(pid: int, start_time: str | None) -> None:
        journal.set(phase="repro", child={"pid": pid, "start_time": start_time})

    logger = get_run_logger()
    code = run_pipeline(
        ["dvc", "repro"],
        layout.root,
        child_env(),
        log,
        started,
        timeout_s=settings.retrain.repro_timeout_s,
        echo=logger.info,
    )
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-15:])
        raise RetrainError(f"`dvc repro` failed (exit {code}); full log {log}:\n{tail}")


# ---------------------------------------------------------------- one cycle


def _quarantined(v: Validation, where: Path) -> dict[str, Any]:
    first = v.reason.strip().splitlines()[0] if v.reason.strip() else "failed"
    return {"file": v.file.name, "reason": first[:300], "folder": str(where)}


def run_cycle(
    settings: Settings,
    layout: RetrainLayout,
    run: str,
    summary: dict[str, Any],
    log: Callable[[str], None],
    mlflow_run_id: str | None = None,
) -> dict[str, Any]:
    """One retraining cycle (the lock is held, no journal is pending)."""
    _require_data_in_sync(layout)
    run_dir = layout.runs_dir / run
    summary["data_md5_before"] = pinned_md5(layout.dvc_file)
    ledger = Ledger(layout.ledger)
    merged_before = ledger.merged_hashes()
    found = discover(layout.incoming)
    known = [f for f in found if f.sha256 in merged_before]
    new = [f for f in found if f.sha256 not in merged_before]
    summary["files_found"] = [f.name for f in found]
    if known:  # the same bytes again, under any name: nothing to merge, move them away
        target = layout.archive / run
        archive(known, target)
        ledger.append(ledger_records(known, run=run, outcome="already-merged", archived_to=target))
        summary["files_already_merged"] = [f.name for f in known]
    if not new:
        summary["outcome"] = "nothing-new"
        return summary

    validations = [validate_task(f, settings, run_dir / "reports" / f.name) for f in new]
    good = [v.file for v in validations if v.ok]
    for v in (v for v in validations if not v.ok):
        where = quarantine(v, layout.quarantine, run)
        ledger.append(ledger_records([v.file], run=run, outcome="quarantined", archived_to=where))
        summary["quarantined"].append(_quarantined(v, where))
        log(f"quarantined {v.file.name} → {where}: {_quarantined(v, where)['reason']}")
    summary["files_valid"] = [f.name for f in good]
    if not good:
        summary["outcome"] = "only-quarantined"
        return summary

    name = settings.registry.name
    journal = Journal.begin(
        layout,
        run=run,
        files=good,
        registry=registry_snapshot(name),
        outputs=uncached_outputs(layout.root / "dvc.yaml"),
        extra={"mlflow_run_id": mlflow_run_id},
    )
    try:
        merge = merge_task(good, layout)
        summary["merge"] = merge
        journal.set(rows_added=merge["rows_added"])
        if merge["rows_added"] == 0:  # every row already known: data/ did not change
            journal.set(phase="committed")
            summary["steps"] = finish_commit(settings, layout, journal)
            journal.close()
            summary["outcome"] = "no-new-rows"
            return summary
        md5 = version_task(layout)
        journal.set(data_md5=md5)
        summary["data_md5_after"] = md5
        repro_task(settings, layout, journal, run_dir / "repro.log")
        register_file = layout.root / "metrics" / "register.json"
        register = json.loads(register_file.read_text(encoding="utf-8"))
        journal.set(phase="committed", register=register)  # ← the commit point
    except BaseException:
        try:
            recovery = recover_run(settings, layout, mark_killed=False)
        except Exception as err:  # the journal stays: the next run rolls back
            log(f"rollback failed ({err}); the next run (or --recover-only) retries it")
        else:
            if recovery is not None:
                summary["rollback"] = recovery.steps
                log("rolled back: " + "; ".join(recovery.steps))
        raise
    summary["register"] = register
    summary["steps"] = finish_commit(settings, layout, journal)
    summary["git_commit"] = journal.data.get("git_commit")
    journal.close()
    summary["outcome"] = "retrained"
    return summary


def describe(summary: dict[str, Any]) -> str:
    """The short report a person reads in the flow log or the terminal."""
    lines = [f"retrain {summary['run']}: {summary['outcome']}"]
    if summary.get("recovered"):
        rec = summary["recovered"]
        lines.append(f"  recovered crashed run {rec['run']} ({rec['action']})")
    found = summary.get("files_found", [])
    if found:
        lines.append(
            f"  files: {len(found)} found, {len(summary.get('files_valid', []))} valid, "
            f"{len(summary['quarantined'])} quarantined, "
            f"{len(summary.get('files_already_merged', []))} already merged"
        )
    for q in summary["quarantined"]:
        lines.append(f"  quarantined {q['file']}: {q['reason']} (see {q['folder']})")
    merge = summary.get("merge")
    if merge:
        lines.append(
            f"  data: +{merge['rows_added']} rows ({merge['rows_duplicate']} duplicates, "
            f"{merge['rows_unplaceable']} without a timestamp left out); days created "
            f"{merge['days_created'] or '-'}, extended {merge['days_extended'] or '-'}"
        )
    if summary.get("data_md5_after"):
        lines.append(f"  data.dvc: {summary['data_md5_before']} → {summary['data_md5_after']}")
    reg = summary.get("register")
    if reg:
        verdict = "promoted to champion" if reg.get("promoted") else "champion kept"
        lines.append(f"  model: version {reg.get('version')} {verdict}: {reg.get('reason')}")
    for step in summary.get("steps", []):
        lines.append(f"  {step}")
    if summary.get("error"):
        lines.append(f"  FAILED: {summary['error']}")
    return "\n".join(lines)


def _log_to_mlflow(summary: dict[str, Any], summary_file: Path, repro_log: Path) -> None:
    merge = summary.get("merge") or {}
    reg = summary.get("register") or {}
    tracking.log_metrics(
        {
            "files_found": len(summary.get("files_found", [])),
            "files_merged": len(summary.get("files_valid", [])),
            "files_quarantined": len(summary["quarantined"]),
            "rows_added": merge.get("rows_added", 0),
            "rows_duplicate": merge.get("rows_duplicate", 0),
            "promoted": int(bool(reg.get("promoted"))),
            "seconds": summary.get("seconds", 0.0),
        }
    )
    tags = {"qpr.retrain.outcome": summary["outcome"], "qpr.retrain.run": summary["run"]}
    if reg:
        tags["qpr.registered_version"] = str(reg.get("version"))
        tags["qpr.promoted"] = str(bool(reg.get("promoted"))).lower()
    if summary.get("data_md5_after"):
        tags["qpr.data_hash_after"] = f"dvc:{summary['data_md5_after']}"
    mlflow.set_tags(tags)
    tracking.log_artifacts({"retrain": summary_file, "retrain/logs": repro_log})


@flow(name="retrain", log_prints=True)
def retrain_flow(params: str | None = None, recover_only: bool = False) -> dict[str, Any]:
    """One retraining cycle on the log files waiting in retrain.incoming; returns (and
    prints) what it did. A second run on the same inputs changes nothing."""
    settings, paths = settings_and_paths(params)
    layout = layout_for(settings, paths.root)
    run = utc_stamp()
    started = time.monotonic()
    summary: dict[str, Any] = {"run": run, "outcome": "started", "quarantined": []}
    with RetrainLock(layout.state_dir / LOCK_FILE):
        summary["recovered"] = recover_task(settings, layout)
        if recover_only:
            summary["outcome"] = "recovered" if summary["recovered"] else "nothing-to-recover"
            print(describe(summary))
            return summary
        run_dir = layout.runs_dir / run
        summary_file = run_dir / "summary.json"
        with tracking.stage_run("retrain", settings, root=paths.root) as mlflow_run:
            try:
                run_cycle(settings, layout, run, summary, print, mlflow_run.info.run_id)
            except BaseException as err:
                summary["outcome"] = "failed"
                summary["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                raise
            finally:
                summary["seconds"] = round(time.monotonic() - started, 1)
                write_metrics(summary_file, summary)
                _log_to_mlflow(summary, summary_file, run_dir / "repro.log")
                print(describe(summary))
    return summary


def serve(params: str | None = None) -> None:
    """Run retrain_flow on retrain.cron in this process (a local Prefect runner); the
    deployment is named retrain-local. Stop with Ctrl-C."""
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        # A temporary local API has no scheduler: the runner would wait forever.
        raise RetrainError(
            "scheduling needs a Prefect server: start one (`prefect server start`) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api, then run this again"
        )
    settings, paths = settings_and_paths(params)
    cfg = settings.retrain
    print(f"serving retrain on '{cfg.cron}' ({cfg.timezone}) for {paths.root}")
    retrain_flow.serve(
        name="retrain-local",
        schedules=[Cron(cfg.cron, timezone=cfg.timezone)],
        parameters={"params": str(paths.params)},
        limit=1,  # never two cycles at once (the lock would refuse the second anyway)
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
    try:
        if args.serve:
            serve(args.params)
            return
        retrain_flow(params=args.params, recover_only=args.recover_only)
    except EXPECTED_ERRORS as err:
        print(f"\nERROR: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()

"""One retraining cycle, as plain functions: the order of its steps, what it keeps before
data/ changes, when it commits and how it rolls back.

    data/ in sync with data.dvc? → harvest the service's feedback into the inbox
    (qpr.ops.harvest; retrain.harvest) → discover new files (bytes merged before: archived) →
    raw-log gate per file (a bad one goes to quarantine) → journal (snapshot of data/,
    pins, uncached outputs, registry) → merge → dvc add → dvc repro (ends with the register
    stage, which registers and decides but moves no alias) → commit point → finish: the
    deltas pinned, git commit, dvc push, archive, ledger, and last the registry: the
    committed mark on the new version, then the champion alias when the decision was to
    promote, then the deltas added after the register stage's copy

Adds, deletes and drops may run while a cycle does: none it acknowledged is lost, by a
rollback or a commit (qpr.ops.carry; the journal records the deltas' version at its start).

`recover_run` first deals with a journal a crashed run left (qpr.ops.journal). The caller
holds the RetrainLock. flows/retrain.py runs the cycle as a Prefect flow in an MLflow run
and makes the `CycleSteps` Prefect tasks; a test calls `run_cycle` as it is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qpr.config import Settings
from qpr.data.versioning import pinned_md5
from qpr.deltas.lock import writer_lock
from qpr.deltas.publish import publish
from qpr.ops import carry, promotion, registry
from qpr.ops.harvest import harvest
from qpr.ops.incoming import (
    IncomingFile,
    Ledger,
    Validation,
    archive,
    discover,
    ledger_records,
    quarantine,
    quarantine_refused,
    refused,
    validate,
)
from qpr.ops.journal import Journal, Recovery, recover, uncached_outputs
from qpr.ops.layout import RetrainLayout
from qpr.ops.merge import MergeReport, merge_logs
from qpr.ops.processes import tool_env
from qpr.ops.registry_snapshot import restore_registry, snapshot_registry
from qpr.ops.summary import quarantined_entry
from qpr.ops.vcs import (
    checkout_outputs,
    commit_pins,
    push_data,
    require_data_in_sync,
    run_repro,
    version_data,
)
from qpr.paths import ProjectPaths

ACTOR = "retrain-cycle"


def harvest_feedback(cycle: Cycle) -> dict[str, Any] | None:
    """The service's feedback since the last harvest: accepted answers into one inbox
    file, rejected ones set aside as evaluation cases; None when retrain.harvest is off."""
    if not cycle.settings.retrain.harvest:
        return None
    log_dir = cycle.layout.root / cycle.settings.query_log  # an absolute path stays as is
    layout = cycle.layout
    report = harvest(log_dir, layout.incoming, layout.state_dir, stamp=cycle.run)
    if report.feedback_lines:
        cycle.log(
            f"harvested {report.feedback_lines} feedback line(s) from {log_dir}: "
            f"{report.rows} row(s) into the inbox, {report.rejections} rejection(s) set aside"
        )
    return report.as_dict()


def validate_file(cycle: Cycle, file: IncomingFile) -> Validation:
    """The raw-log gate on one new file; its reports under the run's folder."""
    return validate(file, cycle.settings.quality, cycle.run_dir / "reports" / file.name)


def merge_files(cycle: Cycle, files: list[IncomingFile]) -> MergeReport:
    """The valid files merged into data/ (the journal is written)."""
    return merge_logs(files, cycle.layout.logs_dir)


def version_merged_data(cycle: Cycle) -> str:
    """`dvc add` data/; the new md5."""
    return version_data(cycle.layout, cycle.env)


def repro(cycle: Cycle, journal: Journal, echo: Callable[[str], None] | None = None) -> None:
    """`dvc repro`, its output in the run's repro.log (and to `echo`)."""
    run_repro(
        cycle.layout,
        journal,
        repro_env(cycle),
        cycle.repro_log,
        timeout_s=cycle.settings.retrain.repro_timeout_s,
        echo=echo,
    )


def repro_env(cycle: Cycle) -> dict[str, str]:
    """The environment of `dvc repro`: the register stage reads the run from it and so
    leaves the aliases to `settle_registry`."""
    return {**cycle.env, registry.RETRAIN_RUN_ENV: cycle.run}


def settle_registry(cycle: Cycle, journal: Journal) -> list[str]:
    """After the commit point only: mark the run's version committed, then carry out the
    register stage's decision (promote, or make it challenger). Idempotent: a roll-forward
    repeats it, and a version already champion or already judged is left as it is."""
    register = journal.data.get("register") or {}
    if not register.get("version") or not register.get("deferred"):
        return []
    name, version = str(register["name"]), int(register["version"])
    steps = []
    if registry.mark_committed(name, version, by=f"{ACTOR} {journal.data['run']}"):
        steps.append(f"registry: version {version} marked committed")
    current = registry.champion(name)
    reason = str(register.get("reason", ""))
    if register.get("promoted"):
        if current is None or current.version != version:
            # A refusal is permanent: raising would fail every later recovery on it.
            refusal = promotion.promotion_refusal(registry.get_version(name, version), current)
            if refusal:
                return [*steps, f"registry: version {version} not promoted: {refusal}"]
            registry.promote(name, version, reason=reason, actor=ACTOR)
            steps.append(f"registry: version {version} promoted to champion")
    elif register.get("new_version"):
        info = registry.get_version(name, version)
        if promotion.last_event(info, "kept_challenger") is None:
            registry.keep_challenger(name, version, reason=reason, actor=ACTOR)
        if registry.CHALLENGER not in info.aliases:
            registry.set_challenger(name, version)
            steps.append(f"registry: version {version} is challenger")
    return steps


@dataclass(frozen=True)
class CycleSteps:
    """The steps an orchestrator may wrap (flows/retrain.py makes each a Prefect task);
    the plain functions above by default."""

    harvest: Callable[[Cycle], dict[str, Any] | None] = harvest_feedback
    validate: Callable[[Cycle, IncomingFile], Validation] = validate_file
    merge: Callable[[Cycle, list[IncomingFile]], MergeReport] = merge_files
    version: Callable[[Cycle], str] = version_merged_data
    repro: Callable[[Cycle, Journal], None] = repro
    settle: Callable[[Cycle, Journal], list[str]] = settle_registry


@dataclass(frozen=True)
class Cycle:
    """One run: its settings, where it works, its name, and how it runs things.

    `environment` makes the environment of each dvc/git command when it starts (the
    orchestrator may add to tool_env, e.g. the Prefect API the stage flows report to)."""

    settings: Settings
    layout: RetrainLayout
    run: str
    log: Callable[[str], None] = print
    steps: CycleSteps = field(default_factory=CycleSteps)
    environment: Callable[[], dict[str, str]] = tool_env

    @property
    def env(self) -> dict[str, str]:
        return self.environment()

    @property
    def run_dir(self) -> Path:
        return self.layout.runs_dir / self.run

    @property
    def repro_log(self) -> Path:
        return self.run_dir / "repro.log"

    @property
    def summary_file(self) -> Path:
        return self.run_dir / "summary.json"


def commit_message(journal: Journal) -> str:
    """The git commit message of a retrained data.dvc + dvc.lock."""
    register = journal.data.get("register") or {}
    return (
        f"retrain {journal.data['run']}: {journal.data.get('rows_added', '?')} new log rows "
        f"from {len(journal.files)} file(s); model version {register.get('version', '?')} "
        f"{'promoted' if register.get('promoted') else 'kept as challenger'}"
    )


def finish_commit(cycle: Cycle, journal: Journal) -> list[str]:
    """Everything after the commit point; each step is idempotent (a roll-forward after a
    crash repeats it): git commit, dvc push, archive the merged files, ledger, and last
    the registry (`settle_registry`): nothing serves the new model before all else is kept."""
    cfg = cycle.settings.retrain
    layout = cycle.layout
    models_dir = ProjectPaths(layout.root).models_dir
    steps = carry.pin_carried(models_dir, cycle.env) if journal.data.get("register") else []
    if cfg.git_commit:
        sha, step = commit_pins(layout, commit_message(journal), cycle.env)
        steps.append(step)
        if sha is not None:
            journal.data["git_commit"] = sha
    if cfg.dvc_push:
        steps.append(push_data(layout, cycle.env))
    run = journal.data["run"]
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
    steps += cycle.steps.settle(cycle, journal)
    register = journal.data.get("register") or {}
    if register.get("version"):
        reason = f"retrain {run}: deltas acknowledged after the register stage"
        version = int(register["version"])
        steps += carry.register_carried(
            models_dir, cycle.settings, version, actor=ACTOR, reason=reason
        )
    return steps


def recover_run(
    cycle: Cycle, *, on_rolled_back: Callable[[Journal], None] | None = None
) -> Recovery | None:
    """Roll back (or forward) whatever run left a journal; None when none did.

    Rolling back puts the registry back from the journal's snapshot and the cached stage
    outputs back with `dvc checkout`, keeping the deltas acknowledged meanwhile
    (`qpr.ops.carry`), which it then publishes; rolling forward finishes the commit."""
    kept: list[bool] = []

    def checkout_keeping_deltas() -> str:
        done, changed = _checkout_keeping_deltas(cycle)
        kept.append(changed)
        return "; ".join(done)

    models_dir = ProjectPaths(cycle.layout.root).models_dir

    def hold() -> contextlib.AbstractContextManager[Any]:
        # No add between the checkout and the registry's restore, which would undo its
        # registry version: it waits, then publishes on the restored registry.
        return writer_lock(models_dir) if models_dir.is_dir() else contextlib.nullcontext()

    recovery = recover(
        cycle.layout,
        restore_registry=restore_registry,
        checkout_outputs=checkout_keeping_deltas,
        finish_commit=lambda journal: finish_commit(cycle, journal),
        on_rolled_back=on_rolled_back,
        hold=hold,
    )
    if recovery is not None and any(kept):
        reason = f"retrain {recovery.run} rolled back: deltas acknowledged while it ran kept"
        published = publish(models_dir, cycle.settings, actor=ACTOR, reason=reason)
        recovery.steps += [f"deltas: {what}: {said}" for what, said in published.items()]
    return recovery


def _checkout_keeping_deltas(cycle: Cycle) -> tuple[list[str], bool]:
    """`dvc checkout` of a rollback, the deltas kept (`carry.checkout_keeping_deltas`)."""
    journal = Journal.load(cycle.layout)
    since = journal.data.get("deltas_version") if journal is not None else None
    return carry.checkout_keeping_deltas(
        ProjectPaths(cycle.layout.root).models_dir,
        cycle.layout.snapshot / carry.KEPT_DIR,
        since,
        lambda: checkout_outputs(cycle.layout, cycle.env),
        cycle.settings,
    )


def run_cycle(
    cycle: Cycle, summary: dict[str, Any], *, journal_extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One retraining cycle (the lock is held, no journal is pending); fills in and returns
    `summary`. `journal_extra` goes into the journal (the orchestrator's run id, so that
    a recovery can mark that run killed)."""
    layout = cycle.layout
    require_data_in_sync(layout, cycle.env)
    summary["data_md5_before"] = pinned_md5(layout.dvc_file)
    summary["harvest"] = cycle.steps.harvest(cycle)
    new = _new_files(cycle, summary)
    if not new:
        summary["outcome"] = "only-quarantined" if summary["quarantined"] else "nothing-new"
        return summary
    good = _valid_files(cycle, new, summary)
    if not good:
        summary["outcome"] = "only-quarantined"
        return summary
    wanted = cycle.settings.retrain.min_new_rows
    if summary["new_rows"] < wanted:
        # Not enough new pairs to be worth a retraining: the files stay for the next cycle.
        summary["outcome"] = "waiting-for-rows"
        cycle.log(f"{summary['new_rows']} new rows, retrain.min_new_rows is {wanted}: waiting")
        return summary
    # Deltas above this version were acknowledged after the snapshot: a rollback encodes
    # them again with the model it restores.
    since = carry.deltas_version(ProjectPaths(layout.root).models_dir)
    journal = Journal.begin(
        layout,
        run=cycle.run,
        files=good,
        registry=snapshot_registry(cycle.settings.registry.name),
        outputs=uncached_outputs(layout.root / "dvc.yaml"),
        extra={**(journal_extra or {}), "deltas_version": since},
    )
    return _merge_and_retrain(cycle, journal, good, summary)


def _new_files(cycle: Cycle, summary: dict[str, Any]) -> list[IncomingFile]:
    """The incoming files not merged before. Files whose bytes were merged before (under
    any name) change nothing: they are archived as already merged."""
    layout, run = cycle.layout, cycle.run
    ledger = Ledger(layout.ledger)
    for path, reason in refused(layout.incoming):
        where = quarantine_refused(path, reason, layout.quarantine, run)
        summary["quarantined"].append({"file": path.name, "reason": reason, "folder": str(where)})
        cycle.log(f"quarantined {path.name} → {where}: {reason}")
    merged_before = ledger.merged_hashes()
    found = discover(layout.incoming)
    known = [f for f in found if f.sha256 in merged_before]
    new = [f for f in found if f.sha256 not in merged_before]
    summary["files_found"] = [f.name for f in found]
    if known:
        target = layout.archive / run
        archive(known, target)
        ledger.append(ledger_records(known, run=run, outcome="already-merged", archived_to=target))
        summary["files_already_merged"] = [f.name for f in known]
    return new


def _valid_files(
    cycle: Cycle, new: list[IncomingFile], summary: dict[str, Any]
) -> list[IncomingFile]:
    """The files that pass the raw-log gate; the others go to quarantine."""
    layout, run = cycle.layout, cycle.run
    validations = [cycle.steps.validate(cycle, f) for f in new]
    good = [v.file for v in validations if v.ok]
    ledger = Ledger(layout.ledger)
    for v in (v for v in validations if not v.ok):
        where = quarantine(v, layout.quarantine, run)
        ledger.append(ledger_records([v.file], run=run, outcome="quarantined", archived_to=where))
        summary["quarantined"].append(quarantined_entry(v, where))
        cycle.log(f"quarantined {v.file.name} → {where}: {quarantined_entry(v, where)['reason']}")
    summary["files_valid"] = [f.name for f in good]
    summary["new_rows"] = sum(v.rows for v in validations if v.ok)
    return good


def _merge_and_retrain(
    cycle: Cycle, journal: Journal, good: list[IncomingFile], summary: dict[str, Any]
) -> dict[str, Any]:
    """The journaled part: merge, version, `dvc repro`, then the commit point. Any failure
    (KeyboardInterrupt included) rolls the run back before it is raised again."""
    try:
        merge = cycle.steps.merge(cycle, good).as_dict()
        summary["merge"] = merge
        journal.set(rows_added=merge["rows_added"])
        if merge["rows_added"] == 0:  # every row already known: data/ did not change
            journal.set(phase="committed")
            summary["steps"] = finish_commit(cycle, journal)
            journal.close()
            summary["outcome"] = "no-new-rows"
            return summary
        md5 = cycle.steps.version(cycle)
        journal.set(data_md5=md5)
        summary["data_md5_after"] = md5
        cycle.steps.repro(cycle, journal)
        register_file = ProjectPaths(cycle.layout.root).stage_metrics("register")
        register = json.loads(register_file.read_text(encoding="utf-8"))
        journal.set(phase="committed", register=register)  # ← the commit point
    except BaseException:
        _roll_back(cycle, summary)
        raise
    summary["register"] = register
    summary["steps"] = finish_commit(cycle, journal)
    summary["git_commit"] = journal.data.get("git_commit")
    journal.close()
    summary["outcome"] = "retrained"
    return summary


def _roll_back(cycle: Cycle, summary: dict[str, Any]) -> None:
    """Undo a failed run now; when that fails too, the journal stays for the next run."""
    try:
        recovery = recover_run(cycle)
    except Exception as err:
        cycle.log(f"rollback failed ({err}); the next run (or --recover-only) retries it")
    else:
        if recovery is not None:
            summary["rollback"] = recovery.steps
            cycle.log("rolled back: " + "; ".join(recovery.steps))

"""The summary of one retraining run: a JSON-able dict the cycle fills in step by step
(written to ``<state_dir>/runs/<run>/summary.json`` and returned by the flow), and the
short report a person reads in the flow log or the terminal.

Outcomes: ``retrained``, ``nothing-new``, ``only-quarantined``, ``no-new-rows``,
``waiting-for-rows`` (fewer valid new rows than retrain.min_new_rows: the files wait),
``failed``; with ``--recover-only``: ``recovered``, ``nothing-to-recover``.

Exit codes of `qpr retrain` / `python -m flows.retrain` (`exit_code`): 0 the cycle did
its work (a model kept as challenger is a normal outcome), 1 it failed (rolled back), 3
every new file was quarantined: nothing was merged and someone must look at the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qpr.ops.incoming import Validation

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ALL_QUARANTINED = 3


def exit_code(summary: dict[str, Any]) -> int:
    """The process exit code that says what the run did (see the module docstring)."""
    outcome = summary.get("outcome")
    if outcome == "failed":
        return EXIT_FAILED
    if outcome == "only-quarantined":
        return EXIT_ALL_QUARANTINED
    return EXIT_OK


def new_summary(run: str) -> dict[str, Any]:
    """The summary of run `run` before any step."""
    return {"run": run, "outcome": "started", "quarantined": []}


def quarantined_entry(validation: Validation, where: Path) -> dict[str, Any]:
    """A quarantined file in the summary: its name, the first line of why, its folder."""
    reason = validation.reason.strip()
    first = reason.splitlines()[0] if reason else "failed"
    return {"file": validation.file.name, "reason": first[:300], "folder": str(where)}


def record_failure(summary: dict[str, Any], err: BaseException) -> None:
    """Mark the run failed, with the first line of the error."""
    first = (str(err).splitlines() or [""])[0]
    summary["outcome"] = "failed"
    summary["error"] = f"{type(err).__name__}: {first[:300]}"


def describe(summary: dict[str, Any]) -> str:
    """The short report a person reads in the flow log or the terminal."""
    lines = [f"retrain {summary['run']}: {summary['outcome']}"]
    if summary.get("recovered"):
        rec = summary["recovered"]
        lines.append(f"  recovered crashed run {rec['run']} ({rec['action']})")
    harvested = summary.get("harvest")
    if harvested and harvested.get("feedback_lines"):
        lines.append(
            f"  feedback: {harvested['feedback_lines']} new line(s), {harvested['rows']} "
            f"row(s) harvested into {Path(harvested['file']).name if harvested['file'] else '-'}"
            f", {harvested['rejections']} rejection(s) set aside, "
            f"{harvested['unmatched']} without their query"
        )
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

"""Data-quality gates: run Great Expectations suites on DataFrames and stop loudly on failure.

A gate sits between two pipeline stages. It validates the frames a stage produced (or is
about to consume) against expectation suites and either returns a `GateResult` or raises
`GateFailed`, so nothing downstream of a bad batch is ever written. Whatever the outcome,
the full GX validation results go to `<report_dir>/<name>.json` (the artifact a person
opens after a failure) and a short human summary to `<name>.md`.

Great Expectations takes seconds to import, so it is imported lazily, only when a gate
actually runs; importing this module is cheap. One ephemeral GX context is created per
process and reused; every gate run adds its own uniquely named data source and deletes it
afterwards, so repeated gates (retraining loops, tests, a stage's pieces) neither clash nor
keep their frames in memory.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from qpr.errors import QPRError, printable
from qpr.io import write_bytes_atomic

if TYPE_CHECKING:  # imported for type hints only: the real import is lazy (about 3-5 s)
    from great_expectations.data_context import AbstractDataContext
    from great_expectations.expectations import Expectation

__all__ = ["GateFailed", "GateResult", "gate", "report_unread"]

#: How many offending values / rows a failure message shows per expectation.
MAX_EXAMPLES = 5
#: How many failed expectations the exception message lists before "… and N more".
MAX_MESSAGE_FAILURES = 25
#: Values longer than this are shortened in messages (the JSON report keeps what GX returned).
MAX_VALUE_CHARS = 40
#: How many unexpected values GX keeps per expectation in the JSON report. SUMMARY rather than
#: COMPLETE: a wholly bad 30k-row batch would otherwise put every bad value into the report.
PARTIAL_UNEXPECTED_COUNT = 20

_lock = threading.RLock()  # GX contexts are not thread-safe; Prefect may run tasks in threads
_context: AbstractDataContext | None = None


class GateFailed(QPRError, RuntimeError):
    """A gate's expectations failed: the batch must not flow downstream.

    Attributes:
        gate_name: the gate's name (also the report's file stem).
        failures: one dict per failed expectation (frame, expectation, columns, counts,
            examples, observed value or exception) — the same data the message is built from.
        report_path: the JSON report with the full GX results, or None when none was written.
    """

    def __init__(
        self,
        message: str,
        *,
        gate_name: str,
        failures: list[dict[str, Any]],
        report_path: Path | None,
    ) -> None:
        super().__init__(message)
        self.gate_name = gate_name
        self.failures = failures
        self.report_path = report_path

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A gate may fail in another process (a Ray task): pickle the keyword-only fields.
        return _gate_failed, (str(self), self.gate_name, self.failures, self.report_path)


def _gate_failed(
    message: str, gate_name: str, failures: list[dict[str, Any]], report_path: Path | None
) -> GateFailed:
    return GateFailed(message, gate_name=gate_name, failures=failures, report_path=report_path)


@dataclass(frozen=True)
class GateResult:
    """Outcome of a gate that passed (a failing gate raises `GateFailed` instead).

    `evaluated` / `failed` count expectations over all frames; `statistics` holds the
    totals plus per-frame GX statistics and row counts, ready to log as metrics.
    """

    gate_name: str
    success: bool
    evaluated: int
    failed: int
    report_path: Path | None
    statistics: dict[str, Any] = field(default_factory=dict)


def gate(
    name: str,
    frames: Mapping[str, pd.DataFrame],
    suites: Mapping[str, list[Expectation]],
    report_dir: Path | None,
    *,
    row_ids: Mapping[str, Sequence[str]] | None = None,
) -> GateResult:
    """Validate each frame against its suite; raise `GateFailed` if any expectation fails.

    Args:
        name: gate name, used in messages and as the report file stem (`<name>.json/.md`).
        frames: frame name → DataFrame.
        suites: frame name → expectations for that frame; every suite needs a frame.
            Frames without a suite are an error too (a frame nobody checks is a bug).
        report_dir: where to write the reports; None writes nothing.
        row_ids: optional frame name → columns that identify a row (e.g. `cluster_id`).
            Failure examples then name the offending rows, not just the bad values.
            Columns absent from the frame are ignored.

    Returns:
        a `GateResult` with success True and the expectation counts.

    Raises:
        GateFailed: when at least one expectation failed; its message lists each failure
            with its column(s), counts and up to five offending values.
        ValueError: when frames and suites do not name the same frames, or `name` is not
            usable as a file stem.
    """
    _check_names(name, frames, suites)
    started = time.perf_counter()
    row_ids = row_ids or {}
    per_frame: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    for frame_name, expectations in suites.items():
        df = frames[frame_name]
        ids = [c for c in row_ids.get(frame_name, ()) if c in df.columns]
        result = _validate(name, frame_name, df, expectations, ids)
        per_frame[frame_name] = {"rows": len(df), "columns": [str(c) for c in df.columns]}
        per_frame[frame_name]["validation"] = result
        failures.extend(
            _describe_failure(frame_name, r, df)
            for r in _ordered(result["results"], expectations)
            if not r.get("success", False)
        )

    statistics = _statistics(per_frame)
    statistics["tolerated"] = _tolerated(per_frame)
    statistics["seconds"] = round(time.perf_counter() - started, 3)
    evaluated = statistics["evaluated_expectations"]
    success = not failures
    report_path = None
    if report_dir is not None:
        report_path = _write_reports(
            Path(report_dir), name, success, statistics, per_frame, failures
        )
    if not success:
        raise GateFailed(
            _failure_message(name, evaluated, failures, report_path, multi=len(frames) > 1),
            gate_name=name,
            failures=failures,
            report_path=report_path,
        )
    return GateResult(
        gate_name=name,
        success=True,
        evaluated=evaluated,
        failed=0,
        report_path=report_path,
        statistics=statistics,
    )


# --------------------------------------------------------------------------- GX plumbing


def _get_context() -> AbstractDataContext:
    """The process-wide ephemeral GX context, created on first use (imports GX)."""
    global _context
    with _lock:
        if _context is None:
            os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            context = gx.get_context(mode="ephemeral")
            # Progress bars would flood CI logs and Prefect task logs, one bar per metric.
            context.variables.progress_bars = ProgressBarsConfig(
                globally=False, metric_calculations=False
            )
            _context = context
        return _context


def _validate(
    gate_name: str,
    frame_name: str,
    df: pd.DataFrame,
    expectations: Sequence[Expectation],
    id_columns: list[str],
) -> dict[str, Any]:
    """Run one frame's expectations; return GX's suite result as a JSON-ready dict."""
    import great_expectations as gx

    result_format: dict[str, Any] = {
        "result_format": "SUMMARY",
        "partial_unexpected_count": PARTIAL_UNEXPECTED_COUNT,
    }
    if id_columns:
        result_format["unexpected_index_column_names"] = id_columns
    # Unique names: the cached context outlives a gate, and GX refuses duplicate names.
    unique = f"{_slug(gate_name)}-{_slug(frame_name)}-{uuid.uuid4().hex[:12]}"
    with _lock:
        context = _get_context()
        # A data source of its own, deleted after: its execution engine caches every batch's
        # DataFrame and metrics, which grew a process by ~130 MB a 500k-row gate.
        datasource = context.data_sources.add_pandas(unique)
        try:
            asset = datasource.add_dataframe_asset(name=unique)
            batch_definition = asset.add_batch_definition_whole_dataframe(unique)
            batch = batch_definition.get_batch(batch_parameters={"dataframe": df})
            suite = gx.ExpectationSuite(name=unique, expectations=list(expectations))
            result = batch.validate(suite, result_format=result_format)
        finally:
            context.data_sources.delete(unique)
    return result.to_json_dict()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text)[:60] or "x"


def _check_names(
    name: str, frames: Mapping[str, pd.DataFrame], suites: Mapping[str, Iterable[Any]]
) -> None:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"gate name {name!r} must be a plain file stem (it names the report)")
    missing = sorted(set(suites) - set(frames))
    unchecked = sorted(set(frames) - set(suites))
    if missing or unchecked:
        raise ValueError(
            f"gate {name!r}: suites without a frame {missing}, frames without a suite {unchecked}"
        )
    for frame_name, df in frames.items():
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"gate {name!r}: frame {frame_name!r} is {type(df).__name__}")


def _ordered(results: list[dict[str, Any]], expectations: Sequence[Expectation]) -> list[dict]:
    """GX returns results grouped by domain; put them back in suite order for readability."""
    order = {
        json.dumps(_config_key(e.configuration.to_json_dict()), sort_keys=True, default=str): i
        for i, e in reversed(list(enumerate(expectations)))
    }

    def rank(r: dict[str, Any]) -> int:
        key = json.dumps(_config_key(r["expectation_config"]), sort_keys=True, default=str)
        return order.get(key, len(order))

    return sorted(results, key=rank)


def _config_key(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    kwargs = {k: v for k, v in config.get("kwargs", {}).items() if k != "batch_id"}
    return config.get("type"), kwargs


# --------------------------------------------------------------------------- describing


_KWARG_LABELS = {"min_value": "min", "max_value": "max", "value_set": "in", "type_": "type"}
_DOMAIN_KWARGS = ("column", "column_A", "column_B", "column_list")
_HIDDEN_KWARGS = {"batch_id", "result_format", "catch_exceptions", "meta", "notes"}


def _describe_failure(frame: str, result: dict[str, Any], df: pd.DataFrame) -> dict[str, Any]:
    """Flatten one failed GX result into the dict that messages and reports are built from."""
    config = result.get("expectation_config", {})
    kwargs = {k: v for k, v in config.get("kwargs", {}).items() if k not in _HIDDEN_KWARGS}
    columns: list[str] = []
    for key in _DOMAIN_KWARGS:
        value = kwargs.get(key)
        if isinstance(value, list):
            columns.extend(str(v) for v in value)
        elif value is not None:
            columns.append(str(value))
    res = result.get("result") or {}
    missing = [c for c in columns if c not in df.columns]
    failure: dict[str, Any] = {
        "frame": frame,
        "expectation": config.get("type", "?"),
        "columns": columns,
        "kwargs": kwargs,
        "description": config.get("description"),
        "element_count": res.get("element_count"),
        "unexpected_count": res.get("unexpected_count"),
        "unexpected_percent": res.get("unexpected_percent"),
        "examples": _examples(res),
        "observed_value": res.get("observed_value"),
        "missing_columns": missing,
        "exception": _exception_message(result.get("exception_info")),
    }
    failure["summary"] = _summary_line(failure, df)
    return failure


def _examples(res: dict[str, Any]) -> list[str]:
    """Up to MAX_EXAMPLES offending values (or identified rows), shortened, as display text."""
    index_list = res.get("partial_unexpected_index_list") or []
    id_columns = res.get("unexpected_index_column_names") or []
    if id_columns and index_list and isinstance(index_list[0], dict):
        shown = []
        for row in index_list[:MAX_EXAMPLES]:  # "cluster_id=17: coherence=0.05"
            ids = " ".join(f"{k}={_short(row[k])}" for k in id_columns if k in row)
            rest = " ".join(f"{k}={_short(v)}" for k, v in row.items() if k not in id_columns)
            shown.append(f"{ids}: {rest}" if ids and rest else ids or rest)
        return shown
    # Distinct values, most frequent first. GX counts only within its partial sample, so
    # the counts themselves would mislead and are not shown.
    counts = res.get("partial_unexpected_counts")
    values = [e.get("value") for e in counts] if counts else res.get("partial_unexpected_list")
    shown: list[str] = []
    for value in values or []:
        text = _short(value)
        if text not in shown:
            shown.append(text)
        if len(shown) == MAX_EXAMPLES:
            break
    return shown


def _short(value: Any) -> str:
    """repr() so '' and control characters are visible; long values cut with an ellipsis."""
    if isinstance(value, list | tuple):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    text = f"{value:.6g}" if isinstance(value, float) and math.isfinite(value) else repr(value)
    if len(text) > MAX_VALUE_CHARS:
        quote = text[0] if text[:1] in "'\"" else ""
        text = text[: MAX_VALUE_CHARS - 1] + "…" + quote
    return text


def _exception_message(info: Any) -> str | None:
    """GX nests exceptions per metric when a metric fails; return the first message."""
    if not isinstance(info, dict):
        return None
    candidates = [info] + [v for v in info.values() if isinstance(v, dict)]
    for entry in candidates:
        if entry.get("raised_exception") or entry.get("exception_message"):
            message = str(entry.get("exception_message") or "exception (see report)")
            return message.strip().splitlines()[0][:200] if message.strip() else message
    return None


def _signature(failure: dict[str, Any]) -> str:
    """`expect_x(column, min 2, max 400)`: the expectation as a person would write it."""
    kwargs = failure["kwargs"]
    parts = []
    if "column_A" in kwargs and "column_B" in kwargs:
        parts.append(f"{kwargs['column_A']}, {kwargs['column_B']}")
    elif "column_list" in kwargs:
        parts.append(", ".join(str(c) for c in kwargs["column_list"]))
    elif "column" in kwargs:
        parts.append(str(kwargs["column"]))
    # mostly last: it qualifies the whole check rather than being one of its bounds.
    for key, value in sorted(kwargs.items(), key=lambda kv: kv[0] == "mostly"):
        if key in _DOMAIN_KWARGS or value is None:
            continue
        label = _KWARG_LABELS.get(key, key)
        if isinstance(value, list | tuple | set):
            shown = "{" + ", ".join(str(v) for v in value) + "}"
        elif key == "regex":
            shown = f"r'{value}'"  # as written in source, not repr's doubled backslashes
        elif isinstance(value, str):
            shown = repr(value)
        else:
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        parts.append(f"{label} {shown}")
    return f"{failure['expectation']}({', '.join(parts)})"


def _summary_line(failure: dict[str, Any], df: pd.DataFrame) -> str:
    """One line: what was expected, how much failed, and what the bad data looks like."""
    head = _signature(failure)
    if failure["expectation"] == "expect_column_to_exist":
        return f"{head}: column missing; frame has {_column_list(df)}"
    if failure["missing_columns"]:
        cols = ", ".join(repr(c) for c in failure["missing_columns"])
        return f"{head}: not run, column {cols} missing"
    if failure["exception"]:
        return f"{head}: error: {failure['exception']}"
    unexpected, total = failure["unexpected_count"], failure["element_count"]
    if unexpected is not None and total:
        text = f"{head}: {unexpected:,} of {total:,} rows ({100.0 * unexpected / total:.2f}%)"
        if failure["examples"]:
            # rows ("id=3: col=x") read better apart; plain values as a comma list
            joiner = "; " if any(": " in e for e in failure["examples"]) else ", "
            text += " — e.g. " + joiner.join(failure["examples"])
        return text
    if failure["observed_value"] is not None:
        return f"{head}: observed {_short(failure['observed_value'])}"
    return f"{head}: failed"


def _column_list(df: pd.DataFrame, limit: int = 12) -> str:
    names = [printable(c, limit=60) for c in df.columns]  # the file's header, not ours
    if not names:
        return "no columns"
    shown = ", ".join(names[:limit]) + (f", … ({len(names)} in all)" if len(names) > limit else "")
    return f"columns {shown}"


def _failure_message(
    name: str,
    evaluated: int,
    failures: list[dict[str, Any]],
    report_path: Path | None,
    *,
    multi: bool,
) -> str:
    lines = [f"gate {name!r} failed: {len(failures)} of {evaluated} expectations"]
    for failure in failures[:MAX_MESSAGE_FAILURES]:
        prefix = f"[{failure['frame']}] " if multi else ""
        lines.append(f"  - {prefix}{failure['summary']}")
    if len(failures) > MAX_MESSAGE_FAILURES:
        lines.append(f"  … and {len(failures) - MAX_MESSAGE_FAILURES} more (see the report)")
    lines.append(f"  full report: {report_path}" if report_path else "  (no report written)")
    # A message quotes the data (values, an exception about them): no control character in it.
    return printable("\n".join(lines), multiline=True)


def _statistics(per_frame: dict[str, dict[str, Any]]) -> dict[str, Any]:
    keys = ("evaluated_expectations", "successful_expectations", "unsuccessful_expectations")
    totals = {k: 0 for k in keys}
    frames: dict[str, Any] = {}
    for frame_name, info in per_frame.items():
        stats = info["validation"].get("statistics", {})
        for k in keys:
            totals[k] += int(stats.get(k) or 0)
        frames[frame_name] = {"rows": info["rows"], **{k: stats.get(k) for k in keys}}
    evaluated = totals["evaluated_expectations"]
    success_percent = 100.0 * totals["successful_expectations"] / evaluated if evaluated else 100.0
    return {**totals, "success_percent": success_percent, "frames": frames}


def _tolerated(per_frame: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Frame → reason → rows: the bad rows an expectation let through (its `mostly`), which
    the cleaner drops. Counted so that a tolerated loss is seen, not silent."""
    out: dict[str, dict[str, int]] = {}
    for frame_name, info in per_frame.items():
        for result in info["validation"].get("results", []):
            count = (result.get("result") or {}).get("unexpected_count")
            if not result.get("success", False) or not count:
                continue
            config = result.get("expectation_config", {})
            reason = config.get("description") or config.get("type", "?")
            column = (config.get("kwargs") or {}).get("column")
            key = f"{column}: {reason}" if column else str(reason)
            out.setdefault(frame_name, {})[key] = int(count)
    return out


# --------------------------------------------------------------------------- reports


_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _write_reports(
    report_dir: Path,
    name: str,
    success: bool,
    statistics: dict[str, Any],
    per_frame: dict[str, dict[str, Any]],
    failures: list[dict[str, Any]],
) -> Path:
    """Write `<name>.json` (full GX results) and `<name>.md` (short summary); return the JSON."""
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / f"{name}.json"
    report = {
        "gate": name,
        "success": success,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "statistics": statistics,
        "failures": failures,
        "frames": per_frame,
    }
    _write_json(json_path, report)
    _atomic_write(report_dir / f"{name}.md", _markdown(name, success, statistics, failures))
    return json_path


def _write_json(path: Path, report: dict[str, Any]) -> None:
    # ensure_ascii=False keeps questions readable; a lone surrogate (undecodable bytes read
    # with surrogateescape) is then written as a \udcXX escape, which is still valid JSON.
    text = json.dumps(report, indent=2, ensure_ascii=False, default=str)
    # JSON escapes C0 controls but not DEL, C1 (\x9b is a terminal's CSI) or bidi overrides:
    # \uXXXX them too, so a person who cats the report sees the data, never runs it.
    _atomic_write(path, _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def report_unread(report_dir: Path, name: str, error: str, message: str) -> Path:
    """The gate's reports for a batch that could not even be read (not a log, not text,
    unparseable): `<name>.json` with the error and `<name>.md` saying no expectation ran.
    `message` is shown escaped. Returns the JSON report's path."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    safe = printable(message, multiline=True)
    report = {
        "gate": name,
        "success": False,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "error": error,
        "message": safe,
    }
    json_path = report_dir / f"{name}.json"
    _write_json(json_path, report)
    lines = [
        f"# Gate `{name}`: FAILED",
        "",
        f"The batch could not be read ({error}), so no expectation ran. Full report: "
        f"`{name}.json`.",
        "",
        "## Why",
        "",
        *(f"    {line}" for line in safe.splitlines()),
    ]
    _atomic_write(report_dir / f"{name}.md", "\n".join(lines) + "\n")
    return json_path


def _markdown(
    name: str, success: bool, statistics: dict[str, Any], failures: list[dict[str, Any]]
) -> str:
    verdict = "PASSED" if success else "FAILED"
    lines = [
        f"# Gate `{name}`: {verdict}",
        "",
        f"{statistics['successful_expectations']} of {statistics['evaluated_expectations']} "
        f"expectations met ({statistics['seconds']} s). Full results: `{name}.json`.",
        "",
        "| frame | rows | expectations | failed |",
        "|---|---:|---:|---:|",
    ]
    for frame_name, stats in statistics["frames"].items():
        lines.append(
            f"| {frame_name} | {stats['rows']:,} | {stats['evaluated_expectations']} "
            f"| {stats['unsuccessful_expectations']} |"
        )
    for frame_name, reasons in statistics.get("tolerated", {}).items():
        lines += ["", f"## Rows tolerated in {frame_name} (the cleaner drops them)", ""]
        lines += [f"- {count} row(s): {reason}" for reason, count in reasons.items()]
    if failures:
        lines += ["", "## Failed expectations", ""]
        for failure in failures:
            lines.append(f"- **{failure['frame']}**: `{failure['summary']}`")
            if failure.get("description"):
                lines.append(f"  - why it matters: {failure['description']}")
    return printable("\n".join(lines), multiline=True) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    """Write so that a reader never sees half a report. A lone surrogate (undecodable bytes
    read with surrogateescape) becomes a \\udcXX escape rather than an error."""
    write_bytes_atomic(path, text.encode("utf-8", errors="backslashreplace"))

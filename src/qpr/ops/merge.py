"""Merge incoming log files into the daily files of data/ without duplicate rows.

A row's identity is every field as text, the timestamp normalised to UTC, so the same
record logged as "…Z" or "…+00:00", in JSON Lines or CSV, is one row. JSON Lines keep the
exact bytes that were logged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from qpr.data.loaders import LOG_SUFFIXES, parse_timestamps, read_log_file
from qpr.io import write_bytes_atomic
from qpr.ops.incoming import IncomingFile


@dataclass
class MergeReport:
    rows_read: int = 0
    rows_added: int = 0
    rows_duplicate: int = 0
    rows_unplaceable: int = 0  # no parseable timestamp: no day file to put it in
    days_created: list[str] = field(default_factory=list)
    days_extended: list[str] = field(default_factory=list)
    by_file: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.rows_added > 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _json_safe(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, pd.Timestamp | datetime):
        return value.isoformat()
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalar → Python
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


# Columns the loader adds to every frame; they are not part of a logged record.
_DERIVED = ("timestamp_utc", "source_file", "malformed")


def _records(path: Path) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
    """(record, raw line) per row: JSON Lines keep their exact line so a merged day file
    holds the bytes that were logged; CSV/Parquet rows become JSON objects."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with path.open("rb") as handle:
            for raw in handle:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                yield (record if isinstance(record, dict) else None), line
        return
    frame = read_log_file(path).drop(columns=list(_DERIVED), errors="ignore")
    for row in frame.to_dict(orient="records"):
        yield {str(k): _json_safe(v) for k, v in row.items()}, None


def _keyed(path: Path) -> list[tuple[str | None, str | None, str | None]]:
    """(day, key, line to write) per row of a log file.

    day: the UTC day of the row's timestamp (None when it has none that parses); key: the
    row's identity for duplicate detection, every field as text with the timestamp
    normalised to UTC (so "…Z" and "…+00:00" match); None for a line that is no record.
    """
    rows = list(_records(path))
    stamps = parse_timestamps(
        pd.Series([r.get("timestamp") if r else None for r, _ in rows], dtype="object")
    )
    keyed: list[tuple[str | None, str | None, str | None]] = []
    for (record, line), stamp in zip(rows, stamps, strict=True):
        if record is None:
            keyed.append((None, None, line))
            continue
        fields = {k: ("" if v is None else str(v)) for k, v in record.items()}
        day = None
        if not pd.isna(stamp):
            day = stamp.date().isoformat()
            fields["timestamp"] = stamp.isoformat()
        text = line if line is not None else json.dumps(record, ensure_ascii=False)
        keyed.append((day, json.dumps(fields, sort_keys=True, ensure_ascii=False), text))
    return keyed


def _existing_keys(logs_dir: Path) -> set[str]:
    keys: set[str] = set()
    if not logs_dir.is_dir():
        return keys
    for path in sorted(logs_dir.iterdir()):
        if path.is_file() and path.suffix.lower() in LOG_SUFFIXES:
            keys.update(key for _, key, _ in _keyed(path) if key is not None)
    return keys


def _new_lines(
    files: Sequence[IncomingFile], seen: set[str], report: MergeReport
) -> dict[str, list[str]]:
    """The lines to add per day; counts every row in `report`, adds new keys to `seen`."""
    new_lines: dict[str, list[str]] = {}
    for file in files:
        counts = {"read": 0, "added": 0, "duplicate": 0, "unplaceable": 0}
        batch_keys: set[str] = set()
        for day, key, text in _keyed(file.path):
            counts["read"] += 1
            if day is None or key is None:
                counts["unplaceable"] += 1
                continue
            if key in seen:
                counts["duplicate"] += 1
                continue
            batch_keys.add(key)
            new_lines.setdefault(day, []).append(str(text))
            counts["added"] += 1
        seen |= batch_keys
        report.by_file[file.name] = counts
        report.rows_read += counts["read"]
        report.rows_added += counts["added"]
        report.rows_duplicate += counts["duplicate"]
        report.rows_unplaceable += counts["unplaceable"]
    return new_lines


def merge_logs(files: Sequence[IncomingFile], logs_dir: Path) -> MergeReport:
    """Merge incoming log files into the daily files ``<logs_dir>/YYYY-MM-DD.jsonl``.

    A row goes to the day of its UTC timestamp. It is left out when the same record is
    already in `logs_dir` (any file) or came in an earlier file of this batch, so merging
    the same batch twice adds nothing. Repeats *within* one file are kept as logged: a
    client retry is a logged event, which the cluster stage's cleaning counts and drops.
    Rows without a parseable timestamp belong to no day and are counted, not merged (the
    raw-log gate already limited how many a file may have).

    Each day file is rewritten as existing bytes + new lines and renamed into place; a
    crash between two days is undone by the journal, not here.
    """
    logs_dir = Path(logs_dir)
    logs_dir.mkdir(parents=True, exist_ok=True)
    report = MergeReport()
    new_lines = _new_lines(files, _existing_keys(logs_dir), report)
    for day, lines in sorted(new_lines.items()):
        target = logs_dir / f"{day}.jsonl"
        existing = target.read_bytes() if target.is_file() else b""
        if existing and not existing.endswith(b"\n"):
            existing += b"\n"
        (report.days_extended if existing else report.days_created).append(day)
        added = "".join(f"{line}\n" for line in lines).encode("utf-8")
        # A new inode renamed into place (its directory synced): the journal's hard-link
        # snapshot of the old file stays intact.
        write_bytes_atomic(target, existing + added)
    return report

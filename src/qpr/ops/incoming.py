"""Fresh log files on their way in: find them, validate each with the raw-log gate, move a
bad one to quarantine with its report, archive the merged ones, and keep a ledger of every
file a run dealt with.

Incoming files are moved away only after a run's commit point (see qpr.ops.journal): a run
that is rolled back leaves them where they were, for the next run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qpr.config import QualitySettings
from qpr.data.loaders import LOG_SUFFIXES, DataFormatError, read_log_file
from qpr.errors import printable
from qpr.io import file_sha256

# What a file being written must look like to be left alone: write under a dot-name or a
# .tmp/.part suffix, then rename (qpr data synth does exactly that).
_IN_PROGRESS_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload")


@dataclass(frozen=True)
class IncomingFile:
    path: Path
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.path.name


class Ledger:
    """Append-only record of every incoming file a run dealt with (JSON Lines).

    It makes discovery idempotent even when the same bytes arrive again under another
    name: a file whose sha256 was merged before is archived as "already merged" and
    changes nothing.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        entries = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                entries.append(json.loads(line))
        return entries

    def merged_hashes(self) -> set[str]:
        return {e["sha256"] for e in self.entries() if e.get("outcome") == "merged"}

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(dict(record), sort_keys=True, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def ledger_records(
    files: Iterable[IncomingFile], *, run: str, outcome: str, archived_to: Path | None = None
) -> list[dict[str, Any]]:
    """One ledger line per file: what `run` did with it (`outcome`) and where it went."""
    at = datetime.now(UTC).isoformat()
    return [
        {
            "name": f.name,
            "sha256": f.sha256,
            "size": f.size,
            "run": run,
            "outcome": outcome,
            "at": at,
            "archived_to": str(archived_to / f.name) if archived_to else None,
        }
        for f in files
    ]


def _candidates(incoming: Path) -> list[Path]:
    """The names in `incoming` that look like finished log files (links included)."""
    found = []
    for path in sorted(incoming.iterdir()):
        name = path.name
        if name.startswith((".", "_")) or name.lower().endswith(_IN_PROGRESS_SUFFIXES):
            continue
        if path.suffix.lower() in LOG_SUFFIXES and (path.is_file() or path.is_symlink()):
            found.append(path)
    return found


def outside_reason(path: Path, incoming: Path) -> str | None:
    """Why `path` must not be read as an incoming file, or None: a link (or a name) that
    resolves outside `incoming` would merge whatever file it points at into the data."""
    target = path.resolve()
    if target.parent != Path(incoming).resolve():
        return f"{path.name} resolves to {target}, outside the inbox {incoming}: refused"
    if not target.is_file():
        return f"{path.name} resolves to {target}, which is not a file: refused"
    return None


def discover(incoming: Path) -> list[IncomingFile]:
    """Log files waiting in `incoming` (not recursive), oldest name first.

    Skipped: hidden names, names starting with "_", in-progress suffixes (.tmp, .part, ...),
    anything that is not a log file type the loaders read, and names that resolve outside
    `incoming` (`refused` lists those)."""
    incoming = Path(incoming)
    if not incoming.is_dir():
        return []
    return [
        IncomingFile(path=path, sha256=file_sha256(path), size=path.stat().st_size)
        for path in _candidates(incoming)
        if outside_reason(path, incoming) is None
    ]


def refused(incoming: Path) -> list[tuple[Path, str]]:
    """The log-file names in `incoming` that resolve outside it, each with the reason."""
    incoming = Path(incoming)
    if not incoming.is_dir():
        return []
    return [
        (path, reason)
        for path in _candidates(incoming)
        if (reason := outside_reason(path, incoming)) is not None
    ]


def quarantine_refused(path: Path, reason: str, quarantine_dir: Path, stamp: str) -> Path:
    """Move a refused name (the link itself, never its target, which is not read) to
    ``<quarantine>/<stamp>_<name>/`` with REASON.txt."""
    target = Path(quarantine_dir) / f"{stamp}_{path.name}"
    target.mkdir(parents=True, exist_ok=True)
    (target / "REASON.txt").write_text(
        f"file: {printable(path.name)}\nquarantined: {stamp}\n\n"
        f"{printable(reason, multiline=True)}\n",
        encoding="utf-8",
    )
    os.replace(path, target / path.name)
    return target


@dataclass
class Validation:
    file: IncomingFile
    ok: bool
    rows: int = 0
    reason: str = ""
    report_dir: Path | None = None
    tolerated: dict[str, int] = field(default_factory=dict)  # reason → rows the cleaner drops

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file.name,
            "sha256": self.file.sha256,
            "ok": self.ok,
            "rows": self.rows,
            "reason": self.reason,
            "report_dir": str(self.report_dir) if self.report_dir else None,
            "tolerated": dict(self.tolerated),
        }


def validate(file: IncomingFile, quality: QualitySettings, report_dir: Path) -> Validation:
    """Run the raw-log gate on one file, the same gate the cluster stage runs on data/.

    A file that is not a log at all (unknown type, missing columns, unparseable) fails
    too, with the loader's message as its report. Reports go to `report_dir`.
    """
    from qpr.quality.data_gates import gate_raw_logs
    from qpr.quality.gate import GateFailed, report_unread

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        raw = read_log_file(file.path)
        if raw.empty:
            raise DataFormatError(f"{file.path} holds no rows")
        result = gate_raw_logs(raw, quality, report_dir)
    except DataFormatError as err:
        # The message quotes the file (its header, its name): escaped before anyone reads it.
        reason = printable(err, multiline=True)
        # The same two reports as a batch the gate judged: raw_logs.json and raw_logs.md.
        report_unread(report_dir, "raw_logs", "DataFormatError", reason)
        return Validation(file, ok=False, reason=reason, report_dir=report_dir)
    except GateFailed as err:
        rows, reason = len(raw), printable(err, multiline=True)
        return Validation(file, ok=False, rows=rows, reason=reason, report_dir=report_dir)
    tolerated = result.statistics.get("tolerated", {}).get("logs", {})
    return Validation(file, ok=True, rows=len(raw), report_dir=report_dir, tolerated=tolerated)


def quarantine(validation: Validation, quarantine_dir: Path, stamp: str) -> Path:
    """Move a rejected file and its validation report to ``<quarantine>/<stamp>_<name>/``.

    The folder holds the file exactly as it arrived, the gate's reports (raw_logs.json with
    the full Great Expectations result, raw_logs.md) and REASON.txt with the message.
    """
    target = Path(quarantine_dir) / f"{stamp}_{validation.file.name}"
    target.mkdir(parents=True, exist_ok=True)
    if validation.report_dir is not None and validation.report_dir.is_dir():
        for report in validation.report_dir.iterdir():
            if report.is_file():
                shutil.copy2(report, target / report.name)
    (target / "REASON.txt").write_text(
        f"file: {printable(validation.file.name)}\nsha256: {validation.file.sha256}\n"
        f"quarantined: {stamp}\n\n{printable(validation.reason, multiline=True)}\n",
        encoding="utf-8",
    )
    shutil.move(str(validation.file.path), str(target / validation.file.name))
    return target


def archive(files: Sequence[IncomingFile], archive_dir: Path) -> list[Path]:
    """Move processed incoming files into `archive_dir` (idempotent: a file already moved
    is skipped, so a roll-forward after a crash can call it again)."""
    archive_dir = Path(archive_dir)
    archive_dir.mkdir(parents=True, exist_ok=True)
    moved = []
    for file in files:
        target = archive_dir / file.name
        if file.path.exists():
            shutil.move(str(file.path), str(target))
        if target.exists():
            moved.append(target)
    return moved

"""Retraining on fresh logs, the parts that need no orchestrator: find new log files,
validate them (a bad one goes to quarantine with its report), merge the good ones into the
daily files of data/ without duplicate rows, and make the whole change undoable.

Crash safety rests on a journal (``<state_dir>/journal.json``) written *before* data/
changes. It holds what is needed to put everything back: a hard-link snapshot of data/
(cheap: the merge writes new files and renames them, so the snapshot's inodes are never
written to), copies of data.dvc and dvc.lock, and an opaque snapshot of the model
registry that the caller supplies. A run moves the journal through three phases:

``begun``      data/ may be modified from here on
``repro``      ``dvc repro`` is running (the pid and start time of its process group are
               recorded, so a successor can stop what a killed run left behind)
``committed``  the commit point: the pipeline succeeded and everything is kept

Whoever finds a journal (the next run, first thing, or ``qpr retrain --recover-only``)
rolls a ``begun``/``repro`` run back and rolls a ``committed`` one forward (finishes
archiving the incoming files). Every recovery step is idempotent, so a crash during
recovery is recovered by the next one. Incoming files are moved away only after the
commit point: a run that is rolled back leaves them where they were, for the next run.

Prefect and MLflow stay out of this module: flows/retrain.py wires it to them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from qpr.config import QualitySettings
from qpr.data.loaders import LOG_SUFFIXES, DataFormatError, parse_timestamps, read_log_file
from qpr.errors import QPRError

JOURNAL_VERSION = 1
PHASES = ("begun", "repro", "committed")
LEDGER_FILE = "processed.jsonl"
JOURNAL_FILE = "journal.json"
LOCK_FILE = "lock"
SNAPSHOT_DIR = "snapshot"
# What a file being written must look like to be left alone: write under a dot-name or a
# .tmp/.part suffix, then rename (qpr data synth does exactly that).
_IN_PROGRESS_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload")


class RetrainError(QPRError, RuntimeError):
    """A retraining run cannot go on; the message says why and what to do."""


class RetrainBusy(RetrainError):
    """Another retraining run holds the lock."""


def utc_stamp(now: datetime | None = None) -> str:
    """A sortable, file-name-safe UTC time stamp: 20261015T030000Z."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S%fZ")[:-7] + "Z"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    # A rename is durable only once the directory holding it is synced.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> Path:
    """Write JSON so that a reader (or a crash) sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(dict(payload), handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


# ---------------------------------------------------------------- layout and lock


@dataclass(frozen=True)
class RetrainLayout:
    """Where a retraining run reads, writes and keeps its state (absolute paths)."""

    root: Path  # the project (params.yaml, data.dvc, dvc.yaml)
    incoming: Path  # fresh log files land here
    quarantine: Path  # rejected files, each with its validation report
    archive: Path  # merged (or already known) incoming files, by run
    state_dir: Path  # journal, lock, ledger, snapshots, run summaries
    data_dir: Path  # the DVC-tracked directory (data/)
    logs_dir: Path  # the daily log files inside it (data.path)

    @property
    def dvc_file(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".dvc")

    @property
    def dvc_lock(self) -> Path:
        return self.root / "dvc.lock"

    @property
    def journal(self) -> Path:
        return self.state_dir / JOURNAL_FILE

    @property
    def snapshot(self) -> Path:
        return self.state_dir / SNAPSHOT_DIR

    @property
    def ledger(self) -> Path:
        return self.state_dir / LEDGER_FILE

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    @classmethod
    def build(
        cls,
        root: Path,
        *,
        incoming: Path,
        quarantine: Path,
        archive: Path,
        state_dir: Path,
        logs_path: Path,
    ) -> RetrainLayout:
        """Resolve the configured paths against the project root and check that the logs
        live inside one DVC-tracked directory of the project (data/ by default)."""
        root = Path(root).resolve()

        def absolute(path: Path) -> Path:
            return (path if path.is_absolute() else root / path).resolve()

        logs_dir = absolute(logs_path)
        try:
            relative = logs_dir.relative_to(root)
        except ValueError:
            raise RetrainError(
                f"data.path {logs_path} is outside the project {root}: retraining merges "
                "into the DVC-tracked data/ of the project"
            ) from None
        if not relative.parts:
            raise RetrainError("data.path must be a directory inside data/, not the project")
        data_dir = root / relative.parts[0]
        layout = cls(
            root=root,
            incoming=absolute(incoming),
            quarantine=absolute(quarantine),
            archive=absolute(archive),
            state_dir=absolute(state_dir),
            data_dir=data_dir,
            logs_dir=logs_dir,
        )
        if not layout.dvc_file.is_file():
            raise RetrainError(
                f"{layout.dvc_file} not found: data/ must be versioned with DVC first "
                f"(`qpr data ensure`, or `dvc add {data_dir.name}`)"
            )
        for name in ("incoming", "quarantine", "archive"):
            path = getattr(layout, name)
            if path == data_dir or data_dir in path.parents:
                raise RetrainError(f"retrain.{name} ({path}) must not be inside {data_dir}")
        return layout


class RetrainLock:
    """An exclusive lock on ``<state_dir>/lock``: one retraining run at a time per project.

    flock is released by the kernel when the holder dies, however it dies, so a killed run
    never leaves a stale lock; what it leaves is the journal, which the next holder reads.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def __enter__(self) -> RetrainLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.path.read_text(encoding="utf-8").strip() or "unknown"
            raise RetrainBusy(
                f"another retraining run holds {self.path} ({holder}); try again later"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# ---------------------------------------------------------------- ledger and discovery


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


def discover(incoming: Path) -> list[IncomingFile]:
    """Log files waiting in `incoming` (not recursive), oldest name first.

    Skipped: hidden names, names starting with "_", in-progress suffixes (.tmp, .part, ...)
    and anything that is not a log file type the loaders read."""
    incoming = Path(incoming)
    if not incoming.is_dir():
        return []
    found = []
    for path in sorted(incoming.iterdir()):
        name = path.name
        if not path.is_file() or name.startswith((".", "_")):
            continue
        if name.lower().endswith(_IN_PROGRESS_SUFFIXES):
            continue
        if path.suffix.lower() not in LOG_SUFFIXES:
            continue
        found.append(IncomingFile(path=path, sha256=sha256_file(path), size=path.stat().st_size))
    return found


# ---------------------------------------------------------------- validation, quarantine


@dataclass
class Validation:
    file: IncomingFile
    ok: bool
    rows: int = 0
    reason: str = ""
    report_dir: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file.name,
            "sha256": self.file.sha256,
            "ok": self.ok,
            "rows": self.rows,
            "reason": self.reason,
            "report_dir": str(self.report_dir) if self.report_dir else None,
        }


def validate(file: IncomingFile, quality: QualitySettings, report_dir: Path) -> Validation:
    """Run the raw-log gate on one file, the same gate the cluster stage runs on data/.

    A file that is not a log at all (unknown type, missing columns, unparseable) fails
    too, with the loader's message as its report. Reports go to `report_dir`.
    """
    from qpr.pipeline.cluster import gate_raw_logs
    from qpr.quality.gate import GateFailed

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        raw = read_log_file(file.path)
        if raw.empty:
            raise DataFormatError(f"{file.path} holds no rows")
        gate_raw_logs(raw, quality, report_dir)
    except DataFormatError as err:
        write_json_atomic(
            report_dir / "raw_logs.json",
            {"success": False, "gate": "raw_logs", "error": "DataFormatError", "message": str(err)},
        )
        return Validation(file, ok=False, reason=str(err), report_dir=report_dir)
    except GateFailed as err:
        rows = len(raw)
        return Validation(file, ok=False, rows=rows, reason=str(err), report_dir=report_dir)
    return Validation(file, ok=True, rows=len(raw), report_dir=report_dir)


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
        f"file: {validation.file.name}\nsha256: {validation.file.sha256}\n"
        f"quarantined: {stamp}\n\n{validation.reason}\n",
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


# ---------------------------------------------------------------- merge


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
    seen = _existing_keys(logs_dir)
    report = MergeReport()
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

    for day, lines in sorted(new_lines.items()):
        target = logs_dir / f"{day}.jsonl"
        existing = target.read_bytes() if target.is_file() else b""
        if existing and not existing.endswith(b"\n"):
            existing += b"\n"
        (report.days_extended if existing else report.days_created).append(day)
        tmp = target.with_name(f".{target.name}.tmp")
        with tmp.open("wb") as handle:
            handle.write(existing)
            handle.write("".join(f"{line}\n" for line in lines).encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)  # a new inode: the journal's hard-link snapshot stays intact
    _fsync_dir(logs_dir)
    return report


# ---------------------------------------------------------------- tools (dvc, git)


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for dvc/git and the stage commands they start: ours, plus the
    directory of the running Python first on PATH, so `python -m flows.x` in dvc.yaml is
    this interpreter (the venv) whatever PATH the scheduler gave us."""
    import sys

    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    env.update(extra or {})
    return env


def run_tool(
    args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run a short command (dvc add, git commit) and fail with its output when it fails."""
    result = subprocess.run(
        list(args), cwd=cwd, env=dict(env) if env else tool_env(), capture_output=True, text=True
    )
    if check and result.returncode != 0:
        output = (result.stderr or result.stdout).strip()[-2000:]
        raise RetrainError(f"`{' '.join(args)}` failed (exit {result.returncode}):\n{output}")
    return result


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat), so a recorded pid
    is recognised as the same process and never confused with a later one reusing it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _set_parent_death_signal() -> None:
    # Linux: the child gets SIGKILL when the thread that started it dies, so a killed
    # retraining run does not leave `dvc repro` going on to register a model on its own.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_pipeline(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    on_start: Callable[[int, str | None], None],
    *,
    timeout_s: float | None = None,
    echo: Callable[[str], None] | None = None,
) -> int:
    """Run the pipeline command (dvc repro) in its own process group and wait for it.

    `on_start(pid, start_time)` is called as soon as it runs (the journal records it);
    its output goes to `log_path` (and line by line to `echo`). On a timeout or an
    exception here (KeyboardInterrupt included) the whole group is killed before this
    returns or raises, so no stage keeps running behind our back.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # own group: killing it stops every stage process
            preexec_fn=_set_parent_death_signal,
        )
        try:
            on_start(process.pid, process_start_time(process.pid))
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                log.flush()
                if echo is not None:
                    echo(line.rstrip("\n"))
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"`{' '.join(args)}` ran past {timeout_s:.0f} s")
            return process.wait()
        except BaseException:
            kill_group(process.pid, process_start_time(process.pid), root=Path(cwd))
            process.wait()
            raise


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(entry.name))
    return members


def _cwd_inside(pid: int, root: Path) -> bool:
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return cwd == root or root in cwd.parents


def kill_group(
    pid: int, start_time: str | None, *, root: Path | None = None, wait_s: float = 30.0
) -> bool:
    """Stop what is left of the process group that `pid` led; True when something was.

    While the leader runs (recognised by its start time) the whole group gets SIGKILL.
    When the leader is gone (dvc dies with the flow, see run_pipeline) a stage process
    may still run in its group: the kernel does not reuse a pid as a process id while a
    group with that id exists, so the group's members are killed when they run inside
    the project (`root`), which guards against a group id reused since.
    """
    if start_time is not None and process_start_time(pid) == start_time:
        targets = [-pid]
    elif root is not None:
        targets = [p for p in _group_members(pid) if _cwd_inside(p, Path(root))]
    else:
        targets = []
    if not targets:
        return False
    for target in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if target < 0:
                os.killpg(-target, signal.SIGKILL)
            else:
                os.kill(target, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _group_members(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-pid, os.WNOHANG)
        time.sleep(0.1)
    return True


# ---------------------------------------------------------------- the journal


def _link_tree(source: Path, target: Path) -> None:
    """Mirror `source` into `target` with hard links (copies where linking fails)."""
    for dirpath, _dirnames, filenames in os.walk(source):
        rel = Path(dirpath).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            src = Path(dirpath) / name
            dst = target / rel / name
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


@dataclass
class Journal:
    """The on-disk record of one run in progress (see the module docstring)."""

    layout: RetrainLayout
    data: dict[str, Any]

    @property
    def phase(self) -> str:
        return str(self.data["phase"])

    @property
    def files(self) -> list[IncomingFile]:
        return [
            IncomingFile(path=Path(f["path"]), sha256=f["sha256"], size=int(f["size"]))
            for f in self.data.get("files", [])
        ]

    def save(self) -> None:
        write_json_atomic(self.layout.journal, self.data)

    def set(self, **values: Any) -> None:
        self.data.update(values)
        self.save()

    @classmethod
    def load(cls, layout: RetrainLayout) -> Journal | None:
        if not layout.journal.is_file():
            return None
        data = json.loads(layout.journal.read_text(encoding="utf-8"))
        if data.get("version") != JOURNAL_VERSION or data.get("phase") not in PHASES:
            raise RetrainError(
                f"{layout.journal} is not a journal this qpr understands ({data.get('version')}"
                f", {data.get('phase')}): resolve by hand, then delete it"
            )
        return cls(layout, data)

    @classmethod
    def begin(
        cls,
        layout: RetrainLayout,
        *,
        run: str,
        files: Sequence[IncomingFile],
        registry: Any = None,
        outputs: Sequence[str] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> Journal:
        """Snapshot data/, data.dvc, dvc.lock and copies of the given stage `outputs`
        (project-relative: the uncached ones, which `dvc checkout` cannot bring back);
        then write the journal. Only after this returns may anything in data/ change."""
        if layout.journal.exists():
            raise RetrainError(f"{layout.journal} exists: recover the previous run first")
        snap = layout.snapshot
        shutil.rmtree(snap, ignore_errors=True)  # a leftover from a run that never began
        snap.mkdir(parents=True)
        _link_tree(layout.data_dir, snap / "data")
        shutil.copy2(layout.dvc_file, snap / layout.dvc_file.name)
        had_lock = layout.dvc_lock.is_file()
        if had_lock:
            shutil.copy2(layout.dvc_lock, snap / "dvc.lock")
        saved, absent = [], []
        for rel in outputs:
            source = layout.root / rel
            target = snap / "outs" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            # Copies, not links: a stage may rewrite these files in place.
            if source.is_dir():
                shutil.copytree(source, target)
            elif source.is_file():
                shutil.copy2(source, target)
            else:
                absent.append(rel)
                continue
            saved.append(rel)
        journal = cls(
            layout,
            {
                "version": JOURNAL_VERSION,
                "run": run,
                "phase": "begun",
                "started_at": datetime.now(UTC).isoformat(),
                "started_ms": int(time.time() * 1000),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "files": [{"path": str(f.path), "sha256": f.sha256, "size": f.size} for f in files],
                "had_dvc_lock": had_lock,
                "outputs": {"saved": saved, "absent": absent},
                "registry": registry,
                "child": None,
                **dict(extra or {}),
            },
        )
        journal.save()
        return journal

    def close(self) -> None:
        """Forget the run: drop the snapshot, then the journal (the last thing to go)."""
        shutil.rmtree(self.layout.snapshot, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.layout.journal.unlink()
        _fsync_dir(self.layout.state_dir)

    def keep_copy(self, outcome: str) -> Path:
        """Keep the journal under ``<state_dir>/recovered/`` for the record."""
        target = self.layout.state_dir / "recovered" / f"{self.data['run']}.json"
        return write_json_atomic(target, {**self.data, "recovery": outcome})


def restore_data(journal: Journal) -> list[str]:
    """Put data/, data.dvc and dvc.lock back as the journal's snapshot has them.

    Idempotent, and safe to interrupt: data/ is swapped by two renames on one file
    system (current → trash, snapshot → data/), and each step checks what is done."""
    layout = journal.layout
    snap = layout.snapshot
    done = []
    saved_data = snap / "data"
    if saved_data.is_dir():
        trash = layout.state_dir / "trash"
        shutil.rmtree(trash, ignore_errors=True)
        if layout.data_dir.exists():
            os.replace(layout.data_dir, trash)
        os.replace(saved_data, layout.data_dir)
        _fsync_dir(layout.root)
        shutil.rmtree(trash, ignore_errors=True)
        done.append(f"{layout.data_dir.name}/ restored")
    saved_pin = snap / layout.dvc_file.name
    if saved_pin.is_file():
        shutil.copy2(saved_pin, layout.dvc_file)
        done.append(f"{layout.dvc_file.name} restored")
    saved_lock = snap / "dvc.lock"
    if saved_lock.is_file():
        shutil.copy2(saved_lock, layout.dvc_lock)
        done.append("dvc.lock restored")
    elif not journal.data.get("had_dvc_lock") and layout.dvc_lock.is_file():
        layout.dvc_lock.unlink()
        done.append("dvc.lock removed (there was none before)")
    outputs = journal.data.get("outputs") or {}
    restored = 0
    for rel in outputs.get("saved", []):
        saved = snap / "outs" / rel
        if not saved.exists():  # restored by an interrupted earlier recovery
            continue
        _remove(layout.root / rel)
        (layout.root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(saved, layout.root / rel)
        restored += 1
    for rel in outputs.get("absent", []):
        _remove(layout.root / rel)
    if outputs.get("saved") or outputs.get("absent"):
        done.append(f"{restored} uncached stage output(s) restored")
    return done


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def uncached_outputs(dvc_yaml: Path) -> list[str]:
    """The outputs, metrics and plots that dvc.yaml marks `cache: false`: DVC keeps no
    copy of them, so a rollback must (metrics, reports, plots, training checkpoints)."""
    import yaml

    if not Path(dvc_yaml).is_file():
        return []
    stages = (yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8")) or {}).get("stages")
    paths: list[str] = []
    for stage in (stages or {}).values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or []:
                if isinstance(entry, Mapping):
                    for path, options in entry.items():
                        if isinstance(options, Mapping) and options.get("cache") is False:
                            paths.append(str(path))
    return sorted(set(paths))


@dataclass
class Recovery:
    run: str
    phase: str
    action: str  # rolled-back | rolled-forward
    steps: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recover(
    layout: RetrainLayout,
    *,
    restore_registry: Callable[[dict[str, Any]], list[str]],
    checkout_outputs: Callable[[], str],
    finish_commit: Callable[[Journal], list[str]],
    on_rolled_back: Callable[[Journal], None] | None = None,
) -> Recovery | None:
    """Deal with the journal a crashed (or failed) run left; None when there is none.

    ``begun``/``repro``: stop what is left of its pipeline process group, restore data/,
    data.dvc and dvc.lock, check the cached stage outputs out for that dvc.lock
    (`checkout_outputs`), put the registry back (`restore_registry(journal data)`: the
    journal holds the caller's registry snapshot), then drop the journal.
    ``committed``: finish the commit (`finish_commit`: git commit, archive the incoming
    files) and drop the journal.
    The caller must hold the RetrainLock.
    """
    journal = Journal.load(layout)
    if journal is None:
        return None
    steps: list[str] = []
    if journal.phase == "committed":
        steps += finish_commit(journal)
        journal.keep_copy("rolled-forward")
        journal.close()
        return Recovery(journal.data["run"], journal.phase, "rolled-forward", steps)

    child = journal.data.get("child") or {}
    same_host = journal.data.get("host") == socket.gethostname()
    if (
        child.get("pid")
        and same_host
        and kill_group(int(child["pid"]), child.get("start_time"), root=layout.root)
    ):
        steps.append(f"killed the leftover pipeline process group {child['pid']}")
    steps += clear_stale_dvc_lock(layout.root)
    steps += restore_data(journal)
    steps.append(checkout_outputs())
    steps += restore_registry(journal.data)
    if on_rolled_back is not None:
        on_rolled_back(journal)
    journal.keep_copy("rolled-back")
    journal.close()
    return Recovery(journal.data["run"], journal.phase, "rolled-back", steps)


def clear_stale_dvc_lock(root: Path) -> list[str]:
    """Remove DVC's read/write lock when every process it names is dead.

    A `dvc repro` killed while a stage ran leaves `.dvc/tmp/rwlock` naming it, and DVC
    then refuses `status`/`checkout` ("is busy, it is being blocked by ...") until the
    file is removed by hand. Only locks of dead processes are cleared."""
    path = Path(root) / ".dvc" / "tmp" / "rwlock"
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError):
        return []
    holders: list[dict[str, Any]] = []
    for mode in ("read", "write"):
        for value in (info.get(mode) or {}).values():
            holders.extend(value if isinstance(value, list) else [value])
    alive = [h for h in holders if h.get("pid") and _pid_alive(int(h["pid"]))]
    if not holders or alive:
        return []
    path.unlink(missing_ok=True)
    return [f"removed DVC's stale lock of {len(holders)} dead process(es)"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return Path(f"/proc/{pid}/stat").is_file() and "Z" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def ledger_records(
    files: Iterable[IncomingFile], *, run: str, outcome: str, archived_to: Path | None = None
) -> list[dict[str, Any]]:
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

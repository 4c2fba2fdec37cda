"""Readers for QA logs (CSV / JSONL / Parquet) and the Quora question-pairs release.

Readers never fail on a bad *row*: they return every row, with what could not be read
marked (NaT timestamps, None fields, U+FFFD where bytes were not UTF-8), so a quality gate
can judge the batch and `clean_logs` can drop and count. They fail, with a message a person
can act on, when a whole *file* is unusable: unknown extension, unreadable, or not a log at
all (required columns missing).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from qpr.errors import QPRError, printable

LOG_REQUIRED_COLUMNS: tuple[str, ...] = ("timestamp", "question", "answer_id")
LOG_SUFFIXES: tuple[str, ...] = (".csv", ".jsonl", ".json", ".parquet")
QUORA_COLUMNS: tuple[str, ...] = ("id", "qid1", "qid2", "question1", "question2", "is_duplicate")

_ANSWER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES = re.compile(r"\s+")
# A text log that starts like this is a compressed or binary file: say so, rather than
# parse its bytes as a header and quote them back.
_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed: decompress it first"),
    (b"PK\x03\x04", "a zip archive: unpack it first"),
    (b"BZh", "bzip2-compressed: decompress it first"),
    (b"\xfd7zXZ\x00", "xz-compressed: decompress it first"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed: decompress it first"),
    (b"PAR1", "a Parquet file: name it .parquet"),
)
_BINARY_BYTES = frozenset(range(0x20)) - frozenset(b"\t\n\r\x0c\x1b")
_TEXT_SUFFIXES = (".csv", ".jsonl", ".json")
_QUOTED_MAX = 60  # characters of one column name a message quotes


class DataFormatError(QPRError, ValueError):
    """A whole input file cannot be used (as opposed to a bad row, which is dropped)."""


@dataclass
class DropReport:
    """What cleaning removed, by reason, with a few examples of each."""

    rows_in: int = 0
    rows_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def rows_dropped(self) -> int:
        return self.rows_in - self.rows_out

    def as_metrics(self) -> dict[str, int]:
        metrics = {"rows_in": self.rows_in, "rows_out": self.rows_out}
        metrics.update(
            {f"dropped_{reason}": count for reason, count in sorted(self.dropped.items())}
        )
        return metrics

    def summary(self) -> str:
        if not self.dropped:
            return f"{self.rows_in:,} rows read, none dropped"
        parts = ", ".join(f"{reason} {count:,}" for reason, count in self.dropped.most_common())
        return f"{self.rows_in:,} rows read, {self.rows_dropped:,} dropped ({parts})"


def log_files(path: Path) -> list[Path]:
    """The log files at `path`: the file itself, or every log file in a directory, sorted
    (hidden files, such as a scale corpus' .manifest.json, are not logs)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.iterdir()
            if p.is_file() and p.suffix.lower() in LOG_SUFFIXES and not p.name.startswith(".")
        )
        if not files:
            raise DataFormatError(f"no log files ({', '.join(LOG_SUFFIXES)}) in directory {path}")
        return files
    raise DataFormatError(f"log path does not exist: {path}")


def _read_jsonl(path: Path) -> pd.DataFrame:
    records: list[dict] = []
    malformed = 0
    with path.open("rb") as handle:
        for raw_line in handle:
            line = raw_line.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict):
                # Kept as an all-empty row so the drop is counted, not silent.
                malformed += 1
                records.append({"_malformed": True})
                continue
            records.append(record)
    if records and malformed == len(records):
        raise DataFormatError(f"{path} is not JSON Lines: none of its {malformed} lines parse")
    return pd.DataFrame.from_records(records)


_CSV_OPTIONS = {
    "dtype": str,
    "keep_default_na": False,
    "na_values": [],
    "encoding_errors": "replace",
}


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **_CSV_OPTIONS)
    except pd.errors.ParserError as err:
        # Most often a ragged row (more fields than the header): read again without it,
        # keeping it as a malformed row (dropped and counted), not losing the whole file.
        first = printable(str(err).strip(), limit=200)
    except (pd.errors.EmptyDataError, UnicodeError) as err:
        raise DataFormatError(
            f"{path} is not a readable CSV file: {printable(err, limit=200)}"
        ) from None
    unreadable = DataFormatError(f"{path} is not a readable CSV file: {first}")
    try:
        # The C parser skips ragged rows and still fails on what is not a row problem (a
        # quote left open), where the Python one would stop reading without a word.
        frame = pd.read_csv(path, on_bad_lines="skip", **_CSV_OPTIONS)
    except (pd.errors.ParserError, UnicodeError) as err:
        raise DataFormatError(
            f"{path} is not a readable CSV file: {printable(str(err).strip(), limit=200)}"
        ) from None
    ragged = 0

    def count(fields: list[str]) -> None:  # the Python parser's hook: skip, but count
        nonlocal ragged
        ragged += 1

    # Only the Python parser reports each row it skips.
    try:
        counted = pd.read_csv(path, engine="python", on_bad_lines=count, **_CSV_OPTIONS)
    except (pd.errors.ParserError, UnicodeError):
        raise unreadable from None
    if len(counted) != len(frame) or not ragged:
        raise unreadable
    # Kept as all-empty rows so the drop is counted, as _read_jsonl does; the raw-log gate
    # refuses a file with more of them than its tolerance.
    return pd.concat([frame, pd.DataFrame({"_malformed": [True] * ragged})], ignore_index=True)


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several unrelated types for non-parquet bytes
        raise DataFormatError(
            f"{path} is not a readable Parquet file: {printable(err, limit=200)}"
        ) from None


def check_text_file(path: Path) -> None:
    """Raise DataFormatError, naming its first bytes, when `path` is compressed or binary:
    it starts with an archive's magic number, or a tenth of its first bytes are controls."""
    with Path(path).open("rb") as handle:
        head = handle.read(4096)
    what = next((why for magic, why in _BINARY_MAGIC if head.startswith(magic)), None)
    # One odd byte is a bad row (dropped and counted); a tenth of them is not text at all.
    if what is None and sum(byte in _BINARY_BYTES for byte in head) * 10 > len(head):
        what = "binary"
    if what is not None:
        first = " ".join(f"{byte:02x}" for byte in head[:4])
        raise DataFormatError(f"{path} is not a text file: starts with bytes {first} ({what})")


_READERS = {
    ".csv": _read_csv,
    ".jsonl": _read_jsonl,
    ".json": _read_jsonl,
    ".parquet": _read_parquet,
}


def parse_timestamps(values: pd.Series) -> pd.Series:
    """ISO 8601 strings (any offset) or Unix epoch seconds / milliseconds → UTC; NaT otherwise."""
    text = values.astype("string").str.strip()
    parsed = pd.to_datetime(text, utc=True, errors="coerce", format="ISO8601")
    epoch = text.str.fullmatch(r"\d{9,13}(\.\d+)?").fillna(False)
    if epoch.any():
        numbers = pd.to_numeric(text[epoch], errors="coerce")
        unit_ms = numbers > 1e11
        seconds = numbers.where(~unit_ms, numbers / 1000.0)
        parsed.loc[epoch] = pd.to_datetime(seconds, unit="s", utc=True, errors="coerce")
    return parsed.astype("datetime64[ns, UTC]")


def read_log_file(path: Path) -> pd.DataFrame:
    """One log file → the raw frame the raw-log gate checks.

    Columns: timestamp (str as logged), timestamp_utc (datetime64[ns, UTC], NaT when
    unparseable), question (str, may be empty), answer_id (str or None), source_file, plus
    whatever optional fields the file carries (confidence, locale, ...).
    """
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise DataFormatError(
            f"unknown log file type {path.suffix!r} for {path}; expected one of {LOG_SUFFIXES}"
        )
    if path.suffix.lower() in _TEXT_SUFFIXES:
        check_text_file(path)
    frame = reader(path)
    malformed = frame.pop("_malformed") if "_malformed" in frame.columns else None
    missing = [col for col in LOG_REQUIRED_COLUMNS if col not in frame.columns]
    if missing:
        # Column names are the file's words: shown escaped and cut, never run by a terminal.
        found = ", ".join(printable(c, limit=_QUOTED_MAX) for c in frame.columns[:10]) or "none"
        raise DataFormatError(
            f"{path} is not a QA log: missing column(s) {', '.join(missing)} "
            f"(found: {found}). A log needs {', '.join(LOG_REQUIRED_COLUMNS)}."
        )
    for col in ("question", "answer_id", "timestamp"):
        frame[col] = frame[col].map(lambda v: None if v is None or pd.isna(v) else str(v))
    frame["question"] = frame["question"].fillna("")
    frame["timestamp_utc"] = parse_timestamps(frame["timestamp"])
    frame["source_file"] = path.name
    if malformed is not None:
        frame["malformed"] = malformed.fillna(False).astype(bool)
    else:
        frame["malformed"] = False
    return frame


def read_logs(path: Path) -> pd.DataFrame:
    """Every log file at `path` (a file or a directory of daily files), concatenated."""
    frames = [read_log_file(file) for file in log_files(path)]
    return pd.concat(frames, ignore_index=True, sort=False)


def _clean_question(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def clean_logs(
    raw: pd.DataFrame, *, min_chars: int, max_chars: int
) -> tuple[pd.DataFrame, DropReport]:
    """Drop unusable rows, counting each by its first failing reason.

    Reasons, checked in this order: malformed (a line that is not a record), empty_question,
    invalid_encoding (U+FFFD from undecodable bytes, or control characters), too_short,
    too_long, bad_answer_id, bad_timestamp, duplicate_row (a repeated request: same
    timestamp, question and answer, as client retries log them).
    """
    report = DropReport(rows_in=len(raw))
    frame = raw.copy()
    frame["question"] = frame["question"].map(_clean_question)
    lengths = frame["question"].str.len()
    answer = frame["answer_id"].fillna("")
    checks: list[tuple[str, pd.Series]] = [
        ("malformed", frame["malformed"].astype(bool)),
        ("empty_question", lengths == 0),
        (
            "invalid_encoding",
            frame["question"].str.contains("\ufffd", regex=False)
            | frame["question"].str.contains(_CONTROL),
        ),
        ("too_short", lengths < min_chars),
        ("too_long", lengths > max_chars),
        ("bad_answer_id", ~answer.str.fullmatch(_ANSWER_ID)),
        ("bad_timestamp", frame["timestamp_utc"].isna()),
    ]
    keep = pd.Series(True, index=frame.index)
    for reason, bad in checks:
        hit = keep & bad.fillna(True)
        if hit.any():
            report.dropped[reason] = int(hit.sum())
            report.examples[reason] = [repr(q)[:80] for q in frame.loc[hit, "question"].head(3)]
        keep &= ~hit
    frame = frame[keep]
    duplicate = frame.duplicated(subset=["timestamp_utc", "question", "answer_id"], keep="first")
    if duplicate.any():
        report.dropped["duplicate_row"] = int(duplicate.sum())
        report.examples["duplicate_row"] = list(frame.loc[duplicate, "question"].head(3))
        frame = frame[~duplicate]
    frame = frame.drop(columns=["malformed"]).reset_index(drop=True)
    report.rows_out = len(frame)
    return frame, report


def read_quora(path: Path) -> tuple[pd.DataFrame, DropReport]:
    """The Quora question-pairs release (tab separated, csv quoting) → a typed pairs frame.

    Rows with a missing question text (the official file has a few) or a label other than
    0/1 are dropped and counted.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"Quora pairs file not found: {path}")
    try:
        frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeError) as err:
        raise DataFormatError(
            f"{path} is not a readable Quora pairs file: {printable(err, limit=200)}"
        ) from None
    missing = [col for col in QUORA_COLUMNS if col not in frame.columns]
    if missing:
        raise DataFormatError(
            f"{path} is not in the Quora pairs format: missing column(s) {', '.join(missing)}; "
            f"expected {', '.join(QUORA_COLUMNS)} (tab separated)"
        )
    report = DropReport(rows_in=len(frame))
    for col in ("question1", "question2"):
        frame[col] = frame[col].fillna("").map(_clean_question)
    checks = [
        ("empty_question", (frame["question1"] == "") | (frame["question2"] == "")),
        ("bad_label", ~frame["is_duplicate"].isin(["0", "1"])),
        (
            "bad_id",
            ~(frame["qid1"].str.fullmatch(r"\d+").fillna(False))
            | ~(frame["qid2"].str.fullmatch(r"\d+").fillna(False)),
        ),
    ]
    keep = pd.Series(True, index=frame.index)
    for reason, bad in checks:
        hit = keep & bad
        if hit.any():
            report.dropped[reason] = int(hit.sum())
        keep &= ~hit
    frame = frame[keep].reset_index(drop=True)
    for col in ("qid1", "qid2", "is_duplicate"):
        frame[col] = frame[col].astype("int64")
    report.rows_out = len(frame)
    return frame[list(QUORA_COLUMNS)], report

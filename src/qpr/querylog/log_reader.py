"""Reading a query log folder back: the queries, the feedback, and the two joined.

Each stream is read from its closed files (``*.jsonl``, whole) and its open ones
(``*.jsonl.part``, up to the last newline, so a line being written is never half read).
A line that does not parse (a file cut by hand, another program's output) is skipped
and counted in the frame's ``attrs["malformed"]``.

The closed query files are also plain QA logs: `qpr.data.loaders.read_logs` on
``<folder>/queries`` reads them (timestamp, question, answer_id and the rest as extra
columns). `read_joined` is what the retraining and monitoring use: each query line with
the last verdict given on it.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pandas as pd

from qpr.data.loaders import parse_timestamps
from qpr.querylog.log_records import (
    FEEDBACK,
    FEEDBACK_FIELDS,
    OPEN_SUFFIX,
    QUERIES,
    QUERY_FIELDS,
    SUFFIX,
)

__all__ = [
    "JOINED_FIELDS",
    "join_feedback",
    "read_feedback",
    "read_joined",
    "read_queries",
    "stream_files",
]

# Columns read_joined adds to the query lines.
JOINED_FIELDS = (
    "feedback",  # "taken", "rejected" or null: the last verdict on the line
    "feedback_answer_id",  # the right answer the person named, if any
    "feedback_at",  # when (UTC)
    "right_answer_id",  # taken: the named answer, else the top answer; rejected: the named one
)


def stream_files(folder: str | os.PathLike[str], stream: str) -> list[Path]:
    """A stream's files, oldest first: closed ones, then the open ones."""
    directory = Path(folder) / stream
    if not directory.is_dir():
        return []
    closed = sorted(directory.glob(f"*{SUFFIX}"), key=_age)
    open_ = sorted(directory.glob(f"*{SUFFIX}{OPEN_SUFFIX}"), key=_age)
    return closed + open_


def _age(path: Path) -> str:
    return path.name.partition("-")[2]


def _modified(path: Path) -> float:
    """When the file was last written; +inf when it went (renamed: read it anyway)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def _complete_lines(path: Path) -> list[bytes]:
    """The file's whole lines; for an open file, those before its last newline."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # closed (renamed) or deleted since it was listed
        renamed = path.with_name(path.name.removesuffix(OPEN_SUFFIX))
        if renamed == path or not renamed.is_file():
            return []
        data = renamed.read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines()


def _read_stream(
    folder: str | os.PathLike[str], stream: str, fields: tuple[str, ...], since: datetime | None
) -> pd.DataFrame:
    records, malformed = [], 0
    start = None if since is None else _utc(since)
    cutoff = None if start is None else start.timestamp()
    for path in stream_files(folder, stream):
        if cutoff is not None and _modified(path) < cutoff:
            continue  # last written before `since`: none of its lines can be newer
        for line in _complete_lines(path):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                malformed += 1
                continue
            record["source_file"] = path.name.removesuffix(OPEN_SUFFIX)
            records.append(record)
    frame = pd.DataFrame.from_records(records, columns=[*fields, "source_file"])
    frame["timestamp_utc"] = parse_timestamps(frame["timestamp"])
    # The join key's type must not depend on whether a file was found.
    frame["position"] = pd.to_numeric(frame["position"], errors="coerce").fillna(-1).astype(int)
    if start is not None:
        frame = frame[frame["timestamp_utc"] >= start].reset_index(drop=True)
    frame.attrs["malformed"] = malformed
    return frame


def _utc(moment: datetime) -> pd.Timestamp:
    """A point in time in UTC; a naive one is taken to be UTC already."""
    stamp = pd.Timestamp(moment)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def read_queries(folder: str | os.PathLike[str], *, since: datetime | None = None) -> pd.DataFrame:
    """Every logged query line (`QUERY_FIELDS`, source_file, timestamp_utc), oldest
    file first; with `since` (naive: UTC), only lines from that time on."""
    return _read_stream(folder, QUERIES, QUERY_FIELDS, since)


def read_feedback(folder: str | os.PathLike[str], *, since: datetime | None = None) -> pd.DataFrame:
    """Every feedback line (`FEEDBACK_FIELDS`, source_file, timestamp_utc)."""
    return _read_stream(folder, FEEDBACK, FEEDBACK_FIELDS, since)


def read_joined(folder: str | os.PathLike[str], *, since: datetime | None = None) -> pd.DataFrame:
    """The query lines, each with the last feedback given on it (`JOINED_FIELDS`; null
    where none was). Joined on (request_id, position); feedback on a query that is not in
    the log (sampled out, deleted by the size bound) is left out and counted in
    ``attrs["unmatched_feedback"]``. `since` selects queries; their feedback is read whole."""
    return join_feedback(read_queries(folder, since=since), read_feedback(folder))


def join_feedback(queries: pd.DataFrame, feedback: pd.DataFrame) -> pd.DataFrame:
    """`read_joined` on frames already read: each query line with the last of `feedback`
    given on it (the retraining's harvest passes only the feedback lines it has not seen)."""
    key = ["request_id", "position"]
    last = (
        feedback.sort_values("timestamp_utc", kind="stable")
        .drop_duplicates(key, keep="last")
        .rename(
            columns={
                "outcome": "feedback",
                "answer_id": "feedback_answer_id",
                "timestamp_utc": "feedback_at",
            }
        )[[*key, "feedback", "feedback_answer_id", "feedback_at"]]
    )
    joined = queries.merge(last, on=key, how="left", validate="many_to_one")
    taken = joined["feedback"] == "taken"
    named = joined["feedback_answer_id"]
    joined["right_answer_id"] = named.where(named.notna(), joined["answer_id"].where(taken))
    joined.loc[joined["feedback"].isna(), "right_answer_id"] = None
    for column in ("feedback", "feedback_answer_id", "right_answer_id"):  # None, not NaN
        joined[column] = joined[column].astype(object).where(joined[column].notna(), None)
    found = last[key].merge(queries[key].drop_duplicates(), on=key, how="left", indicator=True)
    joined.attrs = {
        "malformed": queries.attrs.get("malformed", 0) + feedback.attrs.get("malformed", 0),
        "unmatched_feedback": int((found["_merge"] == "left_only").sum()),
    }
    return joined

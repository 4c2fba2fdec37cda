"""The service's feedback as new data: the first step of a retraining cycle.

The service logs each question it served and each verdict people gave on an answer
(`qpr.querylog`). A harvest reads the feedback lines that arrived since the last harvest,
joins each to its query line and splits the verdicts:

- an accepted answer (``taken``, or a right answer the person named) becomes one QA-log
  row (timestamp asked, question, answer_id = the right answer, request_id, source), all of
  them in ONE new file ``service-feedback-<stamp>.jsonl`` in retrain.incoming. It is written
  under a dot-name, then renamed in, so it goes through the raw-log gate, quarantine and
  merge like any file: nothing unvalidated reaches data/;
- a rejected answer never becomes training data: it is an evaluation case
  (`CASE_FIELDS`) in ``<state_dir>/feedback/rejected-<stamp>.jsonl``, and
  ``<state_dir>/feedback/rejected.jsonl`` is the accumulated view over every harvest
  (`read_rejections`), for a shadow check to score a challenger on.

A rejection that names the right answer gives both: the named answer is a row, the
rejected one a case. Within one harvest a question (its normalised text) counts once and
its last verdict wins, so a question taken twice is one row, and one taken then rejected is
only a case.

Where it stopped is ``<state_dir>/feedback/position.json``: how many feedback lines of each
log file were harvested. A harvest is not lost nor doubled by a crash: its files are first
written under dot-names, then the position file records them as pending with the position
they lead to (one atomic rename), then they are renamed in and the position advances. A
harvest that finds a pending record finishes it first; a dot-named file without one is a
leftover and is deleted (its lines are harvested again). Once the file is in the inbox the
cycle owns it: a rolled-back cycle leaves it there, a committed one archives it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from qpr.io import fsync_dir, write_bytes_atomic, write_json_atomic
from qpr.querylog.log_reader import join_feedback, read_feedback, read_queries
from qpr.text.normalize import normalize

__all__ = [
    "CASE_FIELDS",
    "FEEDBACK_DIR",
    "HARVEST_FIELDS",
    "HARVEST_PREFIX",
    "HarvestReport",
    "harvest",
    "read_rejections",
]

HARVEST_PREFIX = "service-feedback-"  # the inbox file: service-feedback-<stamp>.jsonl
SOURCE = "service-feedback"  # the rows' `source` field
FEEDBACK_DIR = "feedback"  # under retrain.state_dir
POSITION_FILE = "position.json"
REJECTED_PREFIX = "rejected-"  # one file per harvest: rejected-<stamp>.jsonl
REJECTED_VIEW = "rejected.jsonl"  # every harvest's cases, one per question
CASE_VERSION = 1

# A harvested row, in the order written: the QA-log fields first.
HARVEST_FIELDS = ("timestamp", "question", "answer_id", "request_id", "source")
# An evaluation case (a rejected answer), in the order written.
CASE_FIELDS = (
    "question",  # as logged (personal data already replaced)
    "rejected_answer_id",  # the answer the service gave; null when it gave none
    "right_answer_id",  # the answer the person named; null for a bare rejection
    "answer_ids",  # every hit the service returned, nearest first
    "request_id",
    "position",
    "asked_at",  # UTC, when the search ran
    "judged_at",  # UTC, when the feedback arrived
    "model_name",
    "model_version",
    "model_fingerprint",
    "harvest",  # the harvest's stamp (the retraining run)
    "case_version",  # CASE_VERSION
)


@dataclass
class HarvestReport:
    """What one harvest found and wrote (the cycle's summary keeps it as a dict)."""

    feedback_lines: int = 0  # feedback lines not harvested before
    unmatched: int = 0  # ... whose query line is not in the log (sampled out, deleted)
    questions: int = 0  # distinct questions judged (a question's last verdict counts)
    rows: int = 0  # accepted answers: rows in the inbox file
    rejections: int = 0  # rejected answers: evaluation cases
    file: str | None = None  # the inbox file, when rows were harvested
    cases_file: str | None = None  # this harvest's evaluation cases
    finished_pending: bool = False  # a crashed harvest was finished first

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    lines = (json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _value(value: Any) -> Any:
    """A frame cell as JSON: NaN/NaT → null, times → ISO 8601 UTC, numpy → Python."""
    if value is None or value is pd.NaT or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, pd.Timestamp):
        return value.tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _value(value.tolist())
    return value


# ---------------------------------------------------------------- the position


def _state(home: Path) -> dict[str, Any]:
    path = home / POSITION_FILE
    if not path.is_file():
        return {"files": {}, "pending": None}
    return json.loads(path.read_text(encoding="utf-8"))


def _finish(incoming: Path, home: Path, state: dict[str, Any]) -> None:
    """Rename a pending harvest's files in (those not renamed yet), rebuild the view,
    then advance the position. Idempotent: a crash in here is finished by the next call."""
    pending = state["pending"]
    for where, name in pending["moves"]:  # names, not paths: the project may have moved
        folder = incoming if where == "incoming" else home
        if (folder / f".{name}").exists():
            os.replace(folder / f".{name}", folder / name)
            fsync_dir(folder)
    _write_view(home)
    write_json_atomic(home / POSITION_FILE, {"files": pending["files"], "pending": None})


def _drop_leftovers(incoming: Path, home: Path) -> None:
    """Dot-named files of a harvest that crashed before recording them: written again."""
    for folder, prefix in ((incoming, HARVEST_PREFIX), (home, REJECTED_PREFIX)):
        if folder.is_dir():
            # ".name" awaiting its rename, "..name.*.tmp" cut short while it was written
            for path in folder.glob(f".*{prefix}*"):
                path.unlink(missing_ok=True)


def _new_lines(feedback: pd.DataFrame, done: dict[str, int]) -> tuple[pd.DataFrame, dict]:
    """The feedback lines past the position, and the position after them. A log file is
    only ever appended to, so a line is known by its file and its rank in it."""
    rank = feedback.groupby("source_file", sort=False).cumcount()
    seen = feedback["source_file"].map(done).fillna(0).astype(int)
    # Files the log deleted (its size bound) drop out of the position.
    after = {str(k): int(v) for k, v in feedback.groupby("source_file").size().items()}
    return feedback[rank >= seen], after


# ---------------------------------------------------------------- the verdicts


def _verdicts(queries: pd.DataFrame, new: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The judged query lines, one per question (its last verdict), oldest verdict first;
    and how many feedback lines found no query line."""
    joined = join_feedback(queries, new)
    judged = joined[joined["feedback"].notna()].copy()
    key = judged["question"].astype(str).map(normalize)
    judged["question_key"] = key.where(key != "", judged["question"].astype(str))
    judged = judged.sort_values("feedback_at", kind="stable")
    last = judged.drop_duplicates("question_key", keep="last")
    return last.reset_index(drop=True), int(joined.attrs.get("unmatched_feedback", 0))


def _rows(verdicts: pd.DataFrame) -> list[dict[str, Any]]:
    accepted = verdicts[verdicts["right_answer_id"].notna()].sort_values(
        "timestamp_utc", kind="stable"
    )
    return [
        {
            "timestamp": r.timestamp,
            "question": r.question,
            "answer_id": r.right_answer_id,
            "request_id": r.request_id,
            "source": SOURCE,
        }
        for r in accepted.itertuples(index=False)
    ]


def _cases(verdicts: pd.DataFrame, stamp: str) -> list[dict[str, Any]]:
    rejected = verdicts[verdicts["feedback"] == "rejected"]
    return [
        {
            "question": r.question,
            "rejected_answer_id": _value(r.answer_id),
            "right_answer_id": _value(r.feedback_answer_id),
            "answer_ids": _value(r.answer_ids),
            "request_id": r.request_id,
            "position": int(r.position),
            "asked_at": r.timestamp,
            "judged_at": _value(r.feedback_at),
            "model_name": _value(r.model_name),
            "model_version": _value(r.model_version),
            "model_fingerprint": _value(r.model_fingerprint),
            "harvest": stamp,
            "case_version": CASE_VERSION,
        }
        for r in rejected.itertuples(index=False)
    ]


# ---------------------------------------------------------------- the view


def _write_view(home: Path) -> None:
    """``rejected.jsonl``: every harvest's cases, oldest harvest first, one per question
    (its latest case). Derived from the per-harvest files, so it can always be rebuilt."""
    cases: dict[str, dict[str, Any]] = {}
    for path in sorted(home.glob(f"{REJECTED_PREFIX}*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                key = normalize(case["question"]) or case["question"]
                cases.pop(key, None)  # re-inserted: the view stays in judged order
                cases[key] = case
    write_bytes_atomic(home / REJECTED_VIEW, _jsonl(list(cases.values())))


def read_rejections(state_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The accumulated evaluation cases (`CASE_FIELDS`), one per question: what a shadow
    check scores a challenger on. Empty when nothing was rejected yet."""
    path = Path(state_dir) / FEEDBACK_DIR / REJECTED_VIEW
    if not path.is_file():
        return pd.DataFrame(columns=list(CASE_FIELDS))
    return pd.read_json(path, lines=True, dtype=False).reindex(columns=list(CASE_FIELDS))


# ---------------------------------------------------------------- the harvest


def _free_name(folder: Path, prefix: str, stamp: str) -> str:
    """``<prefix><stamp>.jsonl``, with ``-2``, ``-3``… when that name was used already."""
    name, n = f"{prefix}{stamp}.jsonl", 1
    while (folder / name).exists() or (folder / f".{name}").exists():
        n += 1
        name = f"{prefix}{stamp}-{n}.jsonl"
    return name


def harvest(
    log_dir: str | os.PathLike[str],
    incoming: str | os.PathLike[str],
    state_dir: str | os.PathLike[str],
    *,
    stamp: str,
) -> HarvestReport:
    """Harvest the feedback lines of the query log `log_dir` not harvested before (see
    the module docstring): rows into `incoming`, cases and the position under
    `state_dir`/feedback. The caller holds the retraining lock."""
    incoming, home = Path(incoming), Path(state_dir) / FEEDBACK_DIR  # made when written to
    report = HarvestReport()
    state = _state(home)
    if state.get("pending"):
        _finish(incoming, home, state)
        state, report.finished_pending = _state(home), True
    _drop_leftovers(incoming, home)
    feedback = read_feedback(log_dir)
    new, after = _new_lines(feedback, state["files"])
    report.feedback_lines = len(new)
    if new.empty:
        if after != state["files"]:
            write_json_atomic(home / POSITION_FILE, {"files": after, "pending": None})
        return report
    verdicts, report.unmatched = _verdicts(read_queries(log_dir), new)
    rows, cases = _rows(verdicts), _cases(verdicts, stamp)
    report.questions, report.rows, report.rejections = len(verdicts), len(rows), len(cases)
    moves = []
    for where, folder, prefix, records in (
        ("incoming", incoming, HARVEST_PREFIX, rows),
        (FEEDBACK_DIR, home, REJECTED_PREFIX, cases),
    ):
        if records:
            name = _free_name(folder, prefix, stamp)
            write_bytes_atomic(folder / f".{name}", _jsonl(records))
            moves.append((where, name))
            if where == "incoming":
                report.file = str(folder / name)
            else:
                report.cases_file = str(folder / name)
    # The commit of the harvest: its files and the position they lead to, in one rename.
    state = {"files": state["files"], "pending": {"stamp": stamp, "moves": moves, "files": after}}
    write_json_atomic(home / POSITION_FILE, state)
    _finish(incoming, home, state)
    return report

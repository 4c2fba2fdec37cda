"""The query log's format: two streams of JSON Lines, one record a line.

A log folder holds two sub-folders, one per stream, so that each is a directory of QA logs
on its own (`qpr.data.loaders.read_logs` takes a directory of one kind of file):

- ``queries/``: one line per question served (a /search request, or each question of a
  /search/batch). The fields the pipeline's QA-log reader needs come first: ``timestamp``
  (UTC, ISO 8601), ``question`` (after `redact_personal`) and ``answer_id`` (the top
  hit's answer when the question was answered, else null). Then what the retraining,
  monitoring and shadow checks use: `QUERY_FIELDS`.
- ``feedback/``: one line per POST /feedback: ``request_id`` and ``position`` name the
  query line it is about; ``outcome`` is ``taken`` or ``rejected``; ``answer_id`` is the
  right answer when the person named it (null otherwise).

Why JSON Lines and not CSV: the pipeline's reader takes both, but a query line carries
lists (the hits' ids and scores), which CSV would have to flatten into strings; a JSON
line is one record whatever the question holds (commas, quotes, newlines are escaped), and
a line cut short is visibly malformed, which the reader counts and drops.

Files: ``<stream>-<opened, UTC>-<writer>-<n>.jsonl`` when closed; the file being written
ends in ``.jsonl.part``, a suffix the pipeline's reader and the retraining's incoming
scan leave alone (`qpr.querylog.log_writer`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qpr.ids import id_text
from qpr.querylog.personal_data import redact_personal

if TYPE_CHECKING:
    from qpr.retrieval.bundle import SearchResult

__all__ = [
    "FEEDBACK",
    "FEEDBACK_FIELDS",
    "FORMAT_VERSION",
    "OPEN_SUFFIX",
    "OUTCOMES",
    "QUERIES",
    "QUERY_FIELDS",
    "STREAMS",
    "SUFFIX",
    "FeedbackEvent",
    "QueryEvent",
    "utc_text",
]

FORMAT_VERSION = 1
QUERIES = "queries"
FEEDBACK = "feedback"
STREAMS = (QUERIES, FEEDBACK)
SUFFIX = ".jsonl"
OPEN_SUFFIX = ".part"  # the file being written: <name>.jsonl.part
OUTCOMES = ("taken", "rejected")

# A query line's fields, in the order written.
QUERY_FIELDS = (
    "timestamp",  # UTC, ISO 8601 with microseconds: when the search ended
    "question",  # as asked, with personal data replaced (redact_personal)
    "answer_id",  # the top hit's answer when answered, else null
    "answered",  # the top hit was within the threshold
    "request_id",  # the X-Request-ID of the search: the key feedback joins on
    "position",  # the question's place in a /search/batch request (0 for /search)
    "endpoint",  # "/search" or "/search/batch"
    "k",
    "threshold",  # the threshold used: the request's, else the model's
    "answer_ids",  # the hits' answer ids, nearest first (null where a hit has none)
    "question_ids",  # the hits' question ids, as decimal strings (qpr.ids)
    "scores",  # the hits' scores, higher first
    "distances",  # the hits' L2 distances (the threshold's unit)
    "latency_ms",  # the search itself (encode, index, rank), not the HTTP exchange
    "redacted",  # redact_personal changed the question
    "model_name",
    "model_version",  # registry version; null for a local bundle
    "model_fingerprint",
    "log_version",  # FORMAT_VERSION
)
FEEDBACK_FIELDS = (
    "timestamp",  # UTC, ISO 8601: when the feedback arrived
    "request_id",  # the search's request id
    "position",  # which question of that request (0 for /search)
    "outcome",  # "taken" or "rejected"
    "answer_id",  # the right answer, when the person named it; else null
    "feedback_id",  # the X-Request-ID of the feedback request itself
    "log_version",
)


def utc_text(seconds: float) -> str:
    """Unix seconds as ISO 8601 UTC with microseconds (``2026-11-28T10:15:00.123456Z``)."""
    whole = int(seconds)
    micros = round((seconds - whole) * 1e6)
    if micros == 1_000_000:
        whole, micros = whole + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{micros:06d}Z"


def _line(record: Mapping[str, Any]) -> bytes:
    # ensure_ascii=False keeps questions readable; "replace" turns a lone surrogate (which
    # the service refuses, a Python caller may not) into "?" rather than an error.
    text = json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "replace")


@dataclass(frozen=True)
class QueryEvent:
    """What a search hands the log: references only, formatted later by the writer thread
    (the request path builds no JSON and runs no redaction)."""

    at: float  # unix seconds
    request_id: str
    endpoint: str
    results: Sequence[SearchResult]
    model: Mapping[str, Any]  # name, version, fingerprint
    k: int
    threshold: float | None
    latency_ms: float

    stream = QUERIES

    @property
    def size(self) -> int:
        """Lines this event writes."""
        return len(self.results)

    def lines(self) -> list[bytes]:
        """One JSON line per question, in `QUERY_FIELDS` order."""
        stamp = utc_text(self.at)
        out = []
        for position, result in enumerate(self.results):
            hits = result.hits
            question = redact_personal(result.query)
            top = hits[0].answer_id if result.answered and hits else None
            record = {
                "timestamp": stamp,
                "question": question,
                "answer_id": top,
                "answered": bool(result.answered),
                "request_id": self.request_id,
                "position": position,
                "endpoint": self.endpoint,
                "k": self.k,
                "threshold": self.threshold,
                "answer_ids": [h.answer_id for h in hits],
                "question_ids": [id_text(h.question_id) for h in hits],
                "scores": [round(float(h.score), 6) for h in hits],
                "distances": [round(float(h.distance), 6) for h in hits],
                "latency_ms": round(self.latency_ms, 3),
                "redacted": question != result.query,
                "model_name": self.model.get("name"),
                "model_version": self.model.get("version"),
                "model_fingerprint": self.model.get("fingerprint"),
                "log_version": FORMAT_VERSION,
            }
            out.append(_line(record))
        return out


@dataclass(frozen=True)
class FeedbackEvent:
    """A person's verdict on one logged question."""

    at: float
    request_id: str
    position: int
    outcome: str  # one of OUTCOMES
    answer_id: str | None
    feedback_id: str | None

    stream = FEEDBACK
    size = 1

    def lines(self) -> list[bytes]:
        record = {
            "timestamp": utc_text(self.at),
            "request_id": self.request_id,
            "position": self.position,
            "outcome": self.outcome,
            "answer_id": self.answer_id,
            "feedback_id": self.feedback_id,
            "log_version": FORMAT_VERSION,
        }
        return [_line(record)]

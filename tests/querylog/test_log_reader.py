"""qpr.querylog.log_reader: the streams read back (open files up to their last newline)
and joined: each query line with the last verdict on it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from qpr.querylog.log_reader import JOINED_FIELDS, read_feedback, read_joined, read_queries
from qpr.querylog.log_records import QUERY_FIELDS
from qpr.querylog.log_writer import QueryLog
from tests.querylog.test_log_writer import log_search, result

LINE = b'{"timestamp":"2026-11-01T00:00:00Z","question":"%s","answer_id":"x","position":0}\n'


def test_feedback_joins_its_query_line_and_the_last_verdict_wins(tmp_path: Path) -> None:
    with QueryLog(tmp_path) as log:
        log_search(log, "r1", result("first", answer="ans-1"), result("second", answered=False))
        log_search(log, "r2", result("third", answer="ans-3"))
        log_search(log, "r3", result("fourth", answer="ans-4"))
        log_search(log, "r4", result("fifth", answer="ans-5"))
        log.feedback("r1", "taken")
        log.feedback("r1", "rejected", position=1, answer_id="ans-9")  # the right one named
        log.feedback("r2", "taken")
        log.feedback("r2", "rejected")  # changed their mind: the last verdict counts
        log.feedback("r3", "taken", answer_id="ans-7")  # took another answer than the top
        log.feedback("gone", "taken")  # its query is not in the log
    joined = read_joined(tmp_path)
    assert list(joined.columns[: len(QUERY_FIELDS)]) == list(QUERY_FIELDS)
    assert set(JOINED_FIELDS) <= set(joined.columns)
    rows = {
        (r.request_id, r.position): (r.feedback, r.feedback_answer_id, r.right_answer_id)
        for r in joined.itertuples()
    }
    assert rows == {
        ("r1", 0): ("taken", None, "ans-1"),
        ("r1", 1): ("rejected", "ans-9", "ans-9"),
        ("r2", 0): ("rejected", None, None),
        ("r3", 0): ("taken", "ans-7", "ans-7"),
        ("r4", 0): (None, None, None),
    }
    assert joined.attrs == {"malformed": 0, "unmatched_feedback": 1}
    assert len(read_feedback(tmp_path)) == 6


def test_an_open_file_is_read_up_to_its_last_newline(tmp_path: Path) -> None:
    queries = tmp_path / "queries"
    queries.mkdir()
    closed = queries / "queries-20261101T000000000000Z-aaaaaaaa-000001.jsonl"
    closed.write_bytes(LINE % b"one" + b"not json\n")
    part = queries / "queries-20261101T010000000000Z-aaaaaaaa-000002.jsonl.part"
    part.write_bytes(LINE % b"two" + (LINE % b"three")[:30])  # a line being written
    frame = read_queries(tmp_path)
    assert frame["question"].tolist() == ["one", "two"]
    assert frame.attrs["malformed"] == 1  # the line that is not JSON, not the half line
    assert frame["source_file"].tolist() == [closed.name, part.name.removesuffix(".part")]


def test_since_keeps_the_lines_from_that_time_on(tmp_path: Path) -> None:
    with QueryLog(tmp_path) as log:
        log_search(log, "r1", result("q"))
    now = datetime.now(UTC)
    assert len(read_queries(tmp_path, since=now - timedelta(minutes=5))) == 1
    assert read_queries(tmp_path, since=now + timedelta(minutes=5)).empty
    assert read_joined(tmp_path, since=now + timedelta(minutes=5)).empty


def test_an_empty_or_missing_folder_reads_as_no_lines(tmp_path: Path) -> None:
    joined = read_joined(tmp_path / "never-written")
    assert joined.empty and set(JOINED_FIELDS) <= set(joined.columns)
    assert joined.attrs == {"malformed": 0, "unmatched_feedback": 0}

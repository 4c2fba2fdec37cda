"""qpr.ops.harvest on tiny query logs written by the real QueryLog: accepted answers into
one inbox file, rejections set aside as evaluation cases, the position kept, and a crash
at any point neither losing nor doubling a harvest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpr.ops import harvest as harvest_module
from qpr.ops.harvest import CASE_FIELDS, HARVEST_FIELDS, harvest, read_rejections
from qpr.ops.incoming import discover
from qpr.querylog.log_writer import QueryLog
from tests.querylog.test_log_writer import MODEL, log_search, result

STAMP = "20261201T030000Z"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the service's log folder, the inbox, the retraining state folder)."""
    return tmp_path / "log", tmp_path / "incoming", tmp_path / ".retrain"


def _served(log_dir: Path) -> None:
    """Searches and verdicts, as a day of the service would log them."""
    with QueryLog(log_dir) as log:
        log_search(log, "r1", result("how do i reset my router", answer="ans-1"))
        log_search(log, "r2", result("How do I reset my router?", answer="ans-2"))  # the same
        log_search(log, "r3", result("kite shop nearby", answer="ans-3"))
        log_search(log, "r4", result("bike repair", answer="ans-4"), result("tyre", False))
        log_search(log, "r5", result("best pizza", answer="ans-5"))
        log_search(log, "r6", result("best pizza", answer="ans-5"))
        log.feedback("r1", "taken")
        log.feedback("r2", "rejected", answer_id="ans-1")  # same question: the last verdict
        log.feedback("r3", "rejected")  # a bare rejection: a case, never a row
        log.feedback("r4", "taken", answer_id="ans-44")  # took another answer than the top
        log.feedback("r4", "taken", position=1)  # nothing answered, nothing named: no row
        log.feedback("r5", "taken")
        log.feedback("r6", "taken")  # the same verdict twice on one question: one row
        log.feedback("gone", "taken")  # its query is not in the log


def test_accepted_answers_become_one_inbox_file_and_rejections_cases(dirs) -> None:
    log_dir, incoming, state = dirs
    _served(log_dir)

    report = harvest(log_dir, incoming, state, stamp=STAMP)

    assert (report.feedback_lines, report.unmatched) == (8, 1)
    assert (report.questions, report.rows, report.rejections) == (5, 3, 2)
    inbox = Path(report.file)
    assert inbox.name == f"service-feedback-{STAMP}.jsonl"
    assert [f.path for f in discover(incoming)] == [inbox]  # a file the cycle picks up
    rows = _lines(inbox)
    assert all(list(r) == list(HARVEST_FIELDS) for r in rows)
    assert [(r["question"], r["answer_id"], r["request_id"]) for r in rows] == [
        ("How do I reset my router?", "ans-1", "r2"),  # the rejection named the right answer
        ("bike repair", "ans-44", "r4"),
        ("best pizza", "ans-5", "r6"),
    ]
    assert all(r["source"] == "service-feedback" and r["timestamp"].endswith("Z") for r in rows)
    cases = _lines(Path(report.cases_file))
    assert all(list(c) == list(CASE_FIELDS) for c in cases)
    by_question = {c["question"]: c for c in cases}
    assert set(by_question) == {"How do I reset my router?", "kite shop nearby"}
    router = by_question["How do I reset my router?"]
    assert (router["rejected_answer_id"], router["right_answer_id"]) == ("ans-2", "ans-1")
    kite = by_question["kite shop nearby"]
    assert (kite["rejected_answer_id"], kite["right_answer_id"]) == ("ans-3", None)
    assert kite["model_fingerprint"] == MODEL["fingerprint"] and kite["harvest"] == STAMP
    assert kite["answer_ids"] == ["ans-3", "ans-2"] and kite["judged_at"].endswith("Z")
    assert read_rejections(state)["question"].tolist() == [
        "How do I reset my router?",
        "kite shop nearby",
    ]


def test_only_feedback_not_harvested_before_is_harvested(dirs) -> None:
    log_dir, incoming, state = dirs
    _served(log_dir)
    first = harvest(log_dir, incoming, state, stamp=STAMP)

    again = harvest(log_dir, incoming, state, stamp="20261201T040000Z")
    assert (again.feedback_lines, again.rows, again.file, again.cases_file) == (0, 0, None, None)

    with QueryLog(log_dir) as log:  # a second writer (a restarted service): its own files
        log_search(log, "r7", result("kite shop nearby", answer="ans-8"))
        log.feedback("r7", "taken")
        log.feedback("r3", "taken", answer_id="ans-8")  # a new verdict on an old question
    later = harvest(log_dir, incoming, state, stamp="20261201T050000Z")

    assert (later.feedback_lines, later.rows, later.rejections) == (2, 1, 0)
    assert [(r["question"], r["answer_id"]) for r in _lines(Path(later.file))] == [
        ("kite shop nearby", "ans-8")
    ]
    assert sorted(p.name for p in incoming.iterdir()) == sorted(
        [Path(first.file).name, Path(later.file).name]
    )
    assert len(read_rejections(state)) == 2  # the earlier case stays an evaluation case


def test_the_same_stamp_twice_gets_a_second_name(dirs) -> None:
    log_dir, incoming, state = dirs
    _served(log_dir)
    first = harvest(log_dir, incoming, state, stamp=STAMP)
    with QueryLog(log_dir) as log:
        log.feedback("r5", "taken")
    second = harvest(log_dir, incoming, state, stamp=STAMP)
    assert Path(second.file).name == f"service-feedback-{STAMP}-2.jsonl"
    assert Path(first.file).read_bytes() != Path(second.file).read_bytes()


class Crash(Exception):
    pass


def crash(*_args: object) -> None:
    raise Crash


def test_a_crash_after_the_harvest_is_recorded_finishes_it_once(dirs, monkeypatch) -> None:
    log_dir, incoming, state = dirs
    _served(log_dir)
    with monkeypatch.context() as patch:
        # Killed between the pending record and the renames.
        patch.setattr(harvest_module, "_finish", crash)
        with pytest.raises(Crash):
            harvest(log_dir, incoming, state, stamp=STAMP)
    assert discover(incoming) == []  # nothing visible yet: only dot-names

    report = harvest(log_dir, incoming, state, stamp="20261201T040000Z")

    assert report.finished_pending and report.feedback_lines == 0
    (inbox,) = discover(incoming)
    assert inbox.name == f"service-feedback-{STAMP}.jsonl" and len(_lines(inbox.path)) == 3
    assert len(read_rejections(state)) == 2
    assert [p.name for p in incoming.iterdir()] == [inbox.name]  # no dot-file left


def test_a_crash_before_the_harvest_is_recorded_harvests_the_lines_again(dirs, monkeypatch) -> None:
    log_dir, incoming, state = dirs
    _served(log_dir)
    real = harvest_module.write_json_atomic

    def crash_on_the_record(path, payload):
        if path.name == "position.json":
            raise Crash
        return real(path, payload)

    with monkeypatch.context() as patch:
        patch.setattr(harvest_module, "write_json_atomic", crash_on_the_record)
        with pytest.raises(Crash):
            harvest(log_dir, incoming, state, stamp=STAMP)
    assert [p.name for p in incoming.iterdir()] == [f".service-feedback-{STAMP}.jsonl"]

    report = harvest(log_dir, incoming, state, stamp="20261201T040000Z")

    assert not report.finished_pending and report.rows == 3
    assert [p.name for p in incoming.iterdir()] == ["service-feedback-20261201T040000Z.jsonl"]
    assert sorted(p.name for p in (state / "feedback").iterdir()) == [
        "position.json",
        "rejected-20261201T040000Z.jsonl",
        "rejected.jsonl",
    ]


def test_a_folder_without_a_log_harvests_nothing(dirs) -> None:
    log_dir, incoming, state = dirs
    report = harvest(log_dir, incoming, state, stamp=STAMP)
    assert report.as_dict()["feedback_lines"] == 0 and not incoming.exists()
    assert not (state / "feedback").exists()
    assert read_rejections(state).empty

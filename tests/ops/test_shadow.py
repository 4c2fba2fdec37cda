"""The shadow check's figures (qpr.ops.shadow) on hand-made results and log lines: what
counts as the same answer, what counts as right on feedback, and what is recorded."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from qpr.ops import shadow
from qpr.retrieval.bundle import Hit, SearchResult


def _result(*answers: str | None, answered: bool = True) -> SearchResult:
    hits = [
        Hit(
            question_id=100 + i,
            text=f"q{i}",
            cluster_id=i,
            distance=0.1 * i,
            score=1.0,
            answer_id=a,
        )
        for i, a in enumerate(answers)
    ]
    return SearchResult(query="how do i reset my laptop", hits=hits, answered=answered)


def test_the_served_answer_is_the_top_answer_only_when_answered():
    assert shadow.served_answer(_result("ans-1", "ans-2")) == "ans-1"
    assert shadow.served_answer(_result("ans-1", "ans-2", answered=False)) is None
    assert shadow.served_answer(_result()) is None
    # A bundle without answer ids answers with its top question.
    assert shadow.served_answer(_result(None, "ans-2")) == "question:100"


def test_agreement_counts_the_same_answer_and_no_answer_on_both_sides():
    ours = ["a", "b", None, None, "c"]
    theirs = ["a", "x", None, "d", "c"]
    assert shadow.agreed(ours, theirs) == 3  # a, both none, c
    with pytest.raises(ValueError, match="2 answers against 1"):
        shadow.agreed(["a", "b"], ["a"])


def test_right_on_feedback_taken_named_and_bare_rejections():
    answers = ["a", "b", None, "x", "y", None, "z"]
    right = ["a", "c", "c", None, None, None, None]  # taken a; named c twice
    rejected = [None, None, None, "x", "r", "r", None]  # bare rejections of x, r, r
    # right: a (taken) yes; b for c no; none for c no; x again no; y not r yes; none not r
    # yes; the last line has no feedback and is not a case.
    assert shadow.scored(answers, right, rejected) == (6, 3)
    with pytest.raises(ValueError):
        shadow.scored(["a"], [], [])


def _joined(rows: list[dict]) -> pd.DataFrame:
    """Lines as read_joined gives them (the columns the check reads)."""
    frame = pd.DataFrame.from_records(rows)
    frame["timestamp_utc"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame


def test_the_latest_questions_are_the_newest_lines_oldest_first():
    joined = _joined(
        [
            {"timestamp": "2026-11-28T10:00:03Z", "question": "third"},
            {"timestamp": "2026-11-28T10:00:01Z", "question": "first"},
            {"timestamp": "2026-11-28T10:00:04Z", "question": "  "},  # no question
            {"timestamp": "2026-11-28T10:00:02Z", "question": "second"},
        ]
    )
    assert shadow.latest_questions(joined, 2)["question"].tolist() == ["second", "third"]
    assert shadow.latest_questions(joined, 10)["question"].tolist() == [
        "first",
        "second",
        "third",
    ]
    assert shadow.latest_questions(joined.iloc[:0], 5).empty  # an empty log: nothing
    with pytest.raises(ValueError):
        shadow.latest_questions(joined, 0)


def test_feedback_targets_from_joined_lines():
    lines = pd.DataFrame(
        {
            "answer_id": ["a", "b", "c", None, "e"],
            "feedback": ["taken", "rejected", "rejected", "rejected", None],
            "right_answer_id": ["a", "named", None, None, None],
        }
    )
    right, rejected = shadow.feedback_targets(lines)
    assert right == ["a", "named", None, None, None]
    # Only a bare rejection of an answer given names what was rejected.
    assert rejected == [None, None, "c", None, None]


def test_the_record_its_tags_and_its_line():
    record = shadow.shadow_record(
        ["a", "b", None, "d"],
        ["a", "x", None, "e"],
        ["a", "x", None, None],
        [None, None, None, "e"],
        champion_version=3,
    )
    assert record == {
        "measured": True,
        "champion_version": 3,
        "k": shadow.SHADOW_K,
        "questions": 4,
        "skipped": 0,
        "agreed": 2,
        "agreement": 0.5,
        "challenger_answered": 3,
        "champion_answered": 3,
        "feedback": 3,
        "challenger_right": 2,  # a taken; d is not the rejected e
        "champion_right": 2,  # a taken; x named
        "challenger_accuracy": 2 / 3,
        "champion_accuracy": 2 / 3,
    }
    tags = shadow.shadow_tags(record)
    assert json.loads(tags[shadow.TAG_SHADOW]) == record
    assert tags[shadow.TAG_SHADOW_AGREEMENT] == "0.500 (2 of 4 questions, champion version 3)"
    assert tags[shadow.TAG_SHADOW_ACCURACY] == "challenger 0.667, champion 0.667 (3 verdicts)"
    assert shadow.describe(record) == (
        "shadow check against champion version 3: agreement 0.500 (2 of 4 questions); "
        "right on 3 verdicts: challenger 0.667, champion 0.667"
    )


def test_without_feedback_accuracies_are_none_and_the_tag_says_so():
    record = shadow.shadow_record(["a"], ["a"], [None], [None], champion_version=1)
    assert record["feedback"] == 0 and record["challenger_accuracy"] is None
    assert (
        shadow.shadow_tags(record)[shadow.TAG_SHADOW_ACCURACY] == "no feedback on these questions"
    )


def test_not_measured_is_one_constant_record_with_why():
    record = shadow.not_measured("no query log at logs/service")
    assert record == {"measured": False, "why": "no query log at logs/service"}
    assert shadow.shadow_tags(record) == {shadow.TAG_SHADOW: json.dumps(record, sort_keys=True)}
    assert shadow.describe(record) == "shadow check: not measured (no query log at logs/service)"

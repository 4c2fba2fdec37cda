"""The shadow check: how a challenger would have answered the service's own questions,
beside the champion that is answering them now.

Both models answer the last N logged questions as the service serves them (k
`SHADOW_K`, each bundle's own "no answer" threshold). What is compared is the served
answer: the top hit's answer id when the question was answered, else no answer
(`served_answer`). So two models agree on a question when both give the same answer,
or both give none.

Where people gave feedback on a question, each model is also scored on it:

- taken, or a right answer named: right when its served answer is that answer;
- a bare rejection (no answer named): right when its served answer is not the rejected
  one (no answer counts as right: it does not repeat the mistake);
- a rejection of a question that was not answered names nothing: not scored.

Pure functions over answers and log columns; the register stage does the I/O
(`qpr.pipeline.register`) and `qpr.ops.promotion.ShadowRequirement` reads the record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nothing imported at run time: the registry names the tags below
    import pandas as pd

    from qpr.retrieval.bundle import SearchResult

__all__ = [
    "SHADOW_K",
    "TAG_SHADOW",
    "TAG_SHADOW_ACCURACY",
    "TAG_SHADOW_AGREEMENT",
    "agreed",
    "describe",
    "feedback_targets",
    "latest_questions",
    "not_measured",
    "scored",
    "served_answer",
    "shadow_record",
    "shadow_tags",
]

# As the service answers by default (ServeSettings.default_k): the depth of the fused
# candidates can depend on k, so the top answer is taken from a search as served.
SHADOW_K = 10
# Version tags (qpr.ops.registry records them): the whole record in the details file,
# two short readable lines on the version itself.
TAG_SHADOW = "qpr.shadow"
TAG_SHADOW_AGREEMENT = "qpr.shadow_agreement"
TAG_SHADOW_ACCURACY = "qpr.shadow_accuracy"


def served_answer(result: SearchResult) -> str | None:
    """What the service answers for this result: the top hit's answer id when answered,
    None for "no answer". A bundle without answer ids answers with its top question
    (``question:<id>``), so two such bundles are still compared."""
    if not result.answered or not result.hits:
        return None
    top = result.hits[0]
    return top.answer_id if top.answer_id is not None else f"question:{top.question_id}"


def latest_questions(joined: pd.DataFrame, n: int) -> pd.DataFrame:
    """The last `n` logged questions of `read_joined`'s frame (by time; a line with no
    readable time counts as oldest), oldest first; lines without a question left out."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    asked = joined.loc[
        joined["question"].map(lambda q: isinstance(q, str) and bool(q.strip())).astype(bool)
    ]
    ordered = asked.sort_values("timestamp_utc", kind="stable", na_position="first")
    return ordered.tail(n).reset_index(drop=True)


def feedback_targets(lines: pd.DataFrame) -> tuple[list[str | None], list[str | None]]:
    """(right, rejected) per line of `read_joined`'s frame: the answer the person took or
    named, else None; for a bare rejection, the answer served and rejected, else None."""
    right = [v if isinstance(v, str) else None for v in lines["right_answer_id"]]
    rejected = [
        served if verdict == "rejected" and named is None and isinstance(served, str) else None
        for verdict, named, served in zip(lines["feedback"], right, lines["answer_id"], strict=True)
    ]
    return right, rejected


def agreed(ours: Sequence[str | None], theirs: Sequence[str | None]) -> int:
    """How many questions the two models answer alike (same answer, or both none)."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} answers against {len(theirs)}")
    return sum(a == b for a, b in zip(ours, theirs, strict=True))


def scored(
    answers: Sequence[str | None],
    right: Sequence[str | None],
    rejected: Sequence[str | None],
) -> tuple[int, int]:
    """(feedback cases, cases answered right) for one model's served answers; the module
    docstring says what counts as right."""
    if not len(answers) == len(right) == len(rejected):
        raise ValueError(f"{len(answers)} answers, {len(right)} right, {len(rejected)} rejected")
    cases = hits = 0
    for answer, wanted, refused in zip(answers, right, rejected, strict=True):
        if wanted is not None:
            cases, hits = cases + 1, hits + (answer == wanted)
        elif refused is not None:
            cases, hits = cases + 1, hits + (answer != refused)
    return cases, hits


def shadow_record(
    challenger: Sequence[str | None],
    champion: Sequence[str | None],
    right: Sequence[str | None],
    rejected: Sequence[str | None],
    *,
    champion_version: int,
    skipped: int = 0,
) -> dict[str, Any]:
    """The figures recorded on the challenger's version and in metrics/register.json:
    agreement at rank 1 and each model's accuracy on the feedback, with their counts
    (accuracies None when no question had feedback). `skipped`: logged questions left out
    (a model could not search them)."""
    questions = len(challenger)
    same = agreed(challenger, champion)
    cases, ours = scored(challenger, right, rejected)
    _, theirs = scored(champion, right, rejected)
    return {
        "measured": True,
        "champion_version": champion_version,
        "k": SHADOW_K,
        "questions": questions,
        "skipped": skipped,
        "agreed": same,
        "agreement": same / questions if questions else None,
        "challenger_answered": sum(a is not None for a in challenger),
        "champion_answered": sum(a is not None for a in champion),
        "feedback": cases,
        "challenger_right": ours,
        "champion_right": theirs,
        "challenger_accuracy": ours / cases if cases else None,
        "champion_accuracy": theirs / cases if cases else None,
    }


def not_measured(why: str) -> dict[str, Any]:
    """The record when there was nothing to compare: why, in words (no figure)."""
    return {"measured": False, "why": why}


def shadow_tags(record: Mapping[str, Any]) -> dict[str, str]:
    """The version tags of a record: the record itself (JSON, with why when not measured),
    and when measured two short lines for MLflow's version table."""
    tags = {TAG_SHADOW: json.dumps(dict(record), sort_keys=True)}
    if not record.get("measured"):  # the version's few tags stay few: `why` is in the record
        return tags
    tags[TAG_SHADOW_AGREEMENT] = (
        f"{_share(record['agreement'])} ({record['agreed']} of {record['questions']} "
        f"questions, champion version {record['champion_version']})"
    )
    if record["feedback"]:
        tags[TAG_SHADOW_ACCURACY] = (
            f"challenger {_share(record['challenger_accuracy'])}, champion "
            f"{_share(record['champion_accuracy'])} ({record['feedback']} verdicts)"
        )
    else:
        tags[TAG_SHADOW_ACCURACY] = "no feedback on these questions"
    return tags


def describe(record: Mapping[str, Any]) -> str:
    """The record in one line, as the register stage prints it."""
    if not record.get("measured"):
        return f"shadow check: not measured ({record.get('why')})"
    line = (
        f"shadow check against champion version {record['champion_version']}: agreement "
        f"{_share(record['agreement'])} ({record['agreed']} of {record['questions']} questions)"
    )
    if not record["feedback"]:
        return f"{line}; no feedback on these questions"
    return (
        f"{line}; right on {record['feedback']} verdicts: challenger "
        f"{_share(record['challenger_accuracy'])}, champion {_share(record['champion_accuracy'])}"
    )


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"

"""The promotion policy (qpr.ops.promotion), by hand-worked cases on plain data.

decide_promotion is the one decision that can replace a serving model, so every branch is
pinned here with numbers small enough to check in one's head; judge and the refusals are
checked on VersionInfo records built by hand. No MLflow store is touched.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from qpr.artifacts import TAG_COMMITTED
from qpr.ops.promotion import (
    TAG_DATA_SOURCE,
    RegistryError,
    ShadowRequirement,
    VersionInfo,
    decide_promotion,
    events,
    is_committed,
    judge,
    last_event,
    metric_value,
    promotion_refusal,
)
from qpr.ops.shadow import not_measured, shadow_record

MARGIN = 0.01
FLOOR = 0.5
METRICS = {"success_1": 0.8, "recip_rank": 0.85, "val": {"recip_rank": 0.9, "success_1": 0.88}}


def _version(version: int, value: float | None = None, **tags: str) -> VersionInfo:
    return VersionInfo(
        name="m",
        version=version,
        aliases=(),
        metric="val.recip_rank" if value is not None else None,
        value=value,
        created=datetime(2027, 1, 1, tzinfo=UTC),
        run_id=None,
        tags=dict(tags),
    )


@pytest.mark.parametrize(
    ("challenger", "champion", "promoted", "words"),
    [
        # first model: the floor alone decides
        (0.60, None, True, "first champion (none before)"),
        (0.50, None, True, "first champion (none before)"),  # exactly at the floor passes
        (0.40, None, False, "below the quality floor"),
        # a champion exists: challenger >= champion + margin
        (0.72, 0.70, True, "beats champion"),  # better by 0.02 > 0.01
        (0.71, 0.70, True, "beats champion"),  # better by exactly the margin
        (0.705, 0.70, False, "less than the margin"),  # better, but within the margin
        (0.70, 0.70, False, "not better"),  # a tie keeps the champion
        (0.65, 0.70, False, "not better"),  # worse
        # the floor holds even when the champion is worse still (a hand-promoted one)
        (0.45, 0.30, False, "below the quality floor"),
        (float("nan"), None, False, "NaN"),
        (0.60, float("nan"), True, "champion unmeasured"),  # a champion without a measure
    ],
)
def test_decide_promotion(challenger, champion, promoted, words):
    decision, reason = decide_promotion(challenger, champion, margin=MARGIN, floor=FLOOR)
    assert decision is promoted
    assert words in reason


def test_reason_names_both_measures_and_the_margin():
    _, reason = decide_promotion(0.705, 0.70, margin=MARGIN, floor=FLOOR)
    assert "0.7050" in reason and "0.7000" in reason and "0.0100" in reason


def test_zero_margin_promotes_any_improvement_but_not_a_tie():
    assert decide_promotion(0.7001, 0.70, margin=0.0, floor=0.0)[0]
    assert not decide_promotion(0.70, 0.70 + 1e-9, margin=0.0, floor=0.0)[0]


def test_negative_margin_is_rejected():
    with pytest.raises(ValueError, match="margin"):
        decide_promotion(0.8, 0.7, margin=-0.1, floor=0.0)


def test_metric_value_follows_dotted_keys():
    assert metric_value(METRICS, "val.recip_rank") == 0.9
    assert metric_value(METRICS, "success_1") == 0.8


@pytest.mark.parametrize(
    ("key", "words"), [("val.map", "'map'"), ("test.recip_rank", "'test'"), ("val", "not a number")]
)
def test_metric_value_missing_or_not_a_number(key, words):
    with pytest.raises(RegistryError, match=words):
        metric_value(METRICS, key)


def test_version_measure_prefers_the_judged_metric_then_the_recorded_ones():
    info = VersionInfo(
        name="m",
        version=3,
        aliases=("champion",),
        metric="val.recip_rank",
        value=0.9,
        created=datetime.now(UTC),
        run_id=None,
        tags={"qpr.measures": '{"val.success_1": 0.88}'},
    )
    assert info.is_champion
    assert info.measure("val.recip_rank") == 0.9
    assert info.measure("val.success_1") == 0.88
    assert info.measure("val.map") is None


def test_tags_the_version_lacks_are_read_from_its_details_once():
    """A version keeps few tags; the rest of its registration record is read when first
    asked for, once. A version registered before that file holds every tag itself."""
    reads: list[int] = []

    def load() -> dict[str, str]:
        reads.append(1)
        return {"qpr.measures": '{"val.success_1": 0.88}', "qpr.metric": "ignored"}

    info = VersionInfo(
        name="m",
        version=3,
        aliases=(),
        metric="val.recip_rank",
        value=0.9,
        created=datetime.now(UTC),
        run_id=None,
        tags={"qpr.metric": "val.recip_rank"},
        load_details=load,
    )
    assert info.tag("qpr.metric") == "val.recip_rank" and reads == []  # a tag: no read
    assert info.measure("val.success_1") == 0.88 and info.tag("qpr.deltas") is None
    assert reads == [1]
    assert _version(1, **{"qpr.measures": '{"val.map": 0.5}'}).measure("val.map") == 0.5


def test_last_event_reads_the_event_log_then_the_older_latest_action_tags():
    promoted = '{"action": "promoted", "actor": "a", "at": "t1", "reason": "r", "seq": 1}'
    again = '{"action": "promoted", "actor": "b", "at": "t3", "reason": "r3", "seq": 3}'
    kept = '{"action": "kept_challenger", "actor": "c", "at": "t2", "reason": "r2", "seq": 2}'
    info = _version(1, **{"qpr.event.001": promoted, "qpr.event.003": again})
    info.tags["qpr.event.002"] = kept
    assert [e["seq"] for e in events(info)] == [1, 2, 3]
    assert last_event(info, "promoted")["actor"] == "b"
    assert last_event(info, "rolled_back") is None
    older = _version(2, **{"qpr.rolled_back_at": "t", "qpr.rolled_back_by": "alice"})
    assert last_event(older, "rolled_back") == {
        "action": "rolled_back",
        "actor": "alice",
        "at": "t",
        "reason": None,
    }


def _judge(challenger: VersionInfo, value: float, champion: VersionInfo | None, **kw):
    return judge(
        challenger, value, champion, metric="val.recip_rank", margin=MARGIN, floor=FLOOR, **kw
    )


def test_judge_compares_with_the_champions_recorded_measure() -> None:
    champion = _version(1, 0.70)
    assert _judge(_version(2), 0.72, champion)[0]
    promoted, reason = _judge(_version(2), 0.705, champion)
    assert not promoted and "less than the margin" in reason
    assert _judge(_version(2), 0.60, None) == decide_promotion(
        0.60, None, margin=MARGIN, floor=FLOOR
    )


def test_judge_takes_the_champion_re_scored_when_given() -> None:
    """Re-scored alike, the champion measures 0.60: the challenger wins although the
    champion's recorded 0.80 is higher."""
    champion = _version(1, 0.80)
    assert _judge(_version(2), 0.72, champion, champion_value=0.60)[0]
    assert not _judge(_version(2), 0.72, champion)[0]


@pytest.mark.parametrize(
    ("challenger", "champion", "words"),
    [
        (_version(1, 0.9), _version(1, 0.9), "already the champion"),
        (
            _version(2, **{"qpr.rolled_back_at": "t", "qpr.rolled_back_by": "ann"}),
            _version(1, 0.5),
            "rolled back by ann",
        ),
        (
            _version(2, **{TAG_DATA_SOURCE: "quora"}),
            _version(1, 0.5, **{TAG_DATA_SOURCE: "logs"}),
            "not comparable",
        ),
        (_version(2), _version(1), "has no val.recip_rank recorded"),
    ],
)
def test_judge_refuses_what_the_numbers_cannot_decide(
    challenger: VersionInfo, champion: VersionInfo, words: str
) -> None:
    promoted, reason = _judge(challenger, 0.99, champion)
    assert not promoted and words in reason


# The challenger answers 3 of 4 questions as the champion does, and 1 of 2 verdicts right.
SHADOW = shadow_record(
    ["a", "b", "c", "d"],
    ["a", "b", "c", "x"],
    ["a", "z", None, None],
    [None, None, None, None],
    champion_version=1,
)


@pytest.mark.parametrize(
    ("agreement", "accuracy", "words"),
    [
        (0.8, None, "shadow agreement 0.750 (3 of 4) is below registry.min_shadow_agreement 0.8"),
        (
            None,
            0.6,
            "shadow accuracy 0.500 (1 of 2 verdicts) is below registry.min_shadow_accuracy",
        ),
        (0.75, 0.9, "below registry.min_shadow_accuracy 0.9"),  # agreement met exactly
    ],
)
def test_judge_refuses_a_challenger_the_shadow_check_holds_back(agreement, accuracy, words):
    rule = ShadowRequirement(SHADOW, min_agreement=agreement, min_accuracy=accuracy)
    promoted, reason = _judge(_version(2), 0.72, _version(1, 0.60), shadow=rule)
    assert not promoted
    assert words in reason
    assert "by the measure alone challenger 0.7200 beats champion 0.6000" in reason
    assert "qpr model promote 2" in reason


def test_judge_promotes_when_the_shadow_requirements_are_met_or_off():
    champion = _version(1, 0.60)
    met = ShadowRequirement(SHADOW, min_agreement=0.75, min_accuracy=0.5)
    assert _judge(_version(2), 0.72, champion, shadow=met)[0]
    off = ShadowRequirement(not_measured("no champion"))  # nothing asked: nothing checked
    assert _judge(_version(2), 0.72, champion, shadow=off)[0]


def test_a_shadow_requirement_that_cannot_be_checked_refuses_but_not_a_first_champion():
    """Set but not measurable: the champion stays (a check someone asked for is never
    skipped); a first champion has nothing to be compared with and is promoted."""
    unmeasured = ShadowRequirement(not_measured("no query log at logs/service"), 0.5)
    promoted, reason = _judge(_version(2), 0.72, _version(1, 0.60), shadow=unmeasured)
    assert not promoted
    assert (
        "registry.min_shadow_agreement 0.5 is set but the shadow check was not measured" in reason
    )
    assert "(no query log at logs/service)" in reason
    assert _judge(_version(2), 0.72, None, shadow=unmeasured)[0]
    no_feedback = shadow_record(["a"], ["a"], [None], [None], champion_version=1)
    promoted, reason = _judge(
        _version(2), 0.72, _version(1, 0.60), shadow=ShadowRequirement(no_feedback, None, 0.5)
    )
    assert not promoted and "no logged question has feedback" in reason


def test_the_shadow_check_never_promotes_what_the_measure_refuses():
    met = ShadowRequirement(SHADOW, min_agreement=0.1)
    promoted, reason = _judge(_version(2), 0.605, _version(1, 0.60), shadow=met)
    assert not promoted and "less than the margin" in reason and "shadow" not in reason


def test_a_version_without_the_committed_mark_is_refused() -> None:
    orphan, committed = _version(2), _version(2, **{TAG_COMMITTED: "run 1"})
    assert not is_committed(orphan) and is_committed(committed)
    assert "no committed mark" in (promotion_refusal(orphan, None) or "")
    assert promotion_refusal(committed, None) is None
    logs = _version(1, **{TAG_DATA_SOURCE: "logs"})
    quora = _version(2, **{TAG_COMMITTED: "run 1", TAG_DATA_SOURCE: "quora"})
    assert "not comparable" in (promotion_refusal(quora, logs) or "")
    assert promotion_refusal(quora, _version(1)) is None  # an untagged champion compares

"""The no-answer threshold (qpr.evaluation.threshold): its curve, the choice on validation
with a bound on false answers, what it gives on test and the warnings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qpr.evaluation.no_answer import Unanswerable
from qpr.evaluation.queries import SystemResult
from qpr.evaluation.threshold import (
    choose_threshold,
    outcome,
    pick_threshold,
    plot_threshold_curve,
    threshold_curve,
    threshold_report,
    warnings_for,
)


def _result(top1: list[float], correct: list[bool]) -> SystemResult:
    per_query = {str(i): {"success_1": float(ok)} for i, ok in enumerate(correct)}
    return SystemResult("model", {}, per_query, {}, np.asarray(top1, np.float64), 0.0)


def test_threshold_curve_and_pick_hand_example():
    d = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    correct = np.array([True, True, False, True])
    curve = threshold_curve(d, correct, points=5)
    np.testing.assert_allclose(curve["threshold"], [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    np.testing.assert_allclose(curve["answered_share"], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(curve["precision_at_1"], [1.0, 1.0, 2 / 3, 0.75])
    assert curve["false_answer_rate"].isna().all()  # not measured
    assert pick_threshold(curve, 0.9) == pytest.approx(0.2)
    assert pick_threshold(curve, 0.75) == pytest.approx(0.4)  # non-monotone: last qualifying
    assert pick_threshold(curve, 1.01) is None
    # unmeasured false answers do not block a choice (the warnings say so)
    assert pick_threshold(curve, 0.9, 0.2) == pytest.approx(0.2)
    empty = threshold_curve(d, correct, points=5, unanswerable=np.empty(0))
    assert choose_threshold(empty, 0.9, 0.2).threshold == pytest.approx(0.2)


def test_threshold_curve_similarities_and_queries_with_no_result():
    sims = np.array([0.9, 0.8, -np.inf, 0.5])  # third query retrieved nothing
    correct = np.array([True, False, False, True])
    curve = threshold_curve(sims, correct, points=3, higher_is_better=True)
    np.testing.assert_allclose(curve["threshold"], [0.9, 0.8, 0.5])
    np.testing.assert_allclose(curve["answered_share"], [0.25, 0.5, 0.75])  # never 1
    np.testing.assert_allclose(curve["precision_at_1"], [1.0, 0.5, 2 / 3])
    assert pick_threshold(curve, 0.6) == pytest.approx(0.5)


def test_false_answers_are_counted_and_bound_the_choice():
    d = np.array([0.1, 0.2, 0.3, 0.4])
    correct = np.array([True, True, True, True])
    # queries with no paraphrase: one close (0.15), one far, one found nothing
    unanswerable = np.array([0.15, 0.35, np.inf])
    curve = threshold_curve(d, correct, points=6, unanswerable=unanswerable)
    np.testing.assert_allclose(curve["threshold"], [0.1, 0.15, 0.2, 0.3, 0.35, 0.4])
    np.testing.assert_allclose(curve["answered_share"], [0.25, 0.25, 0.5, 0.75, 0.75, 1.0])
    np.testing.assert_array_equal(curve["false_answers"], [0, 1, 1, 1, 2, 2])
    np.testing.assert_allclose(curve["false_answer_rate"], np.array([0, 1, 1, 1, 2, 2]) / 3)
    # precision alone would answer everything; the bound stops before the second one
    assert pick_threshold(curve, 0.9) == pytest.approx(0.4)
    assert pick_threshold(curve, 0.9, 0.4) == pytest.approx(0.3)
    assert pick_threshold(curve, 0.9, 0.0) == pytest.approx(0.1)
    choice = choose_threshold(curve, 0.9, 0.4)
    assert (choice.threshold, choice.rule, choice.meets_target) == (
        pytest.approx(0.3),
        "target",
        True,
    )


def test_when_nothing_meets_both_the_bound_wins_then_the_strictest():
    d = np.array([0.1, 0.2, 0.3])
    correct = np.array([False, True, False])  # P@1 never reaches 0.9
    curve = threshold_curve(d, correct, points=4, unanswerable=np.array([0.25]))
    bound = choose_threshold(curve, 0.9, 0.5)
    assert (bound.threshold, bound.rule, bound.meets_target) == (pytest.approx(0.2), "bound", False)
    # every threshold falsely answers a query that sits closer than any answerable one
    curve = threshold_curve(d, correct, points=4, unanswerable=np.array([0.05]))
    strictest = choose_threshold(curve, 0.9, 0.5)
    assert (strictest.threshold, strictest.rule) == (pytest.approx(0.05), "strictest")


def test_outcome_counts_answerable_and_unanswerable_apart():
    result = _result([0.1, 0.2, 0.9, 0.3], [True, False, True, True])
    answerable = np.array([True, True, True, False])  # the last one is held out
    got = outcome(0.5, result, np.array([0.4, 0.6]), answerable)
    assert got["answered_share"] == pytest.approx(2 / 3)
    assert got["precision_at_1"] == pytest.approx(0.5)
    assert got["false_answer_rate"] == pytest.approx(0.5)
    assert (got["answerable"], got["unanswerable"]) == (3, 2)
    # no threshold: everything with a hit is answered
    assert outcome(None, result, np.array([0.4, 0.6]))["false_answer_rate"] == 1.0


def test_warnings_name_what_is_wrong():
    fine = {
        "meets_target": True,
        "target_precision": 0.9,
        "max_false_answer_rate": 0.2,
        "rule": "target",
        "test_answered_share": 0.5,
        "test_false_answer_rate": 0.2,
        "val_unanswerable": 10,
        "test_unanswerable": 10,
    }
    assert warnings_for(fine) == []
    unmeasured = warnings_for({**fine, "test_unanswerable": 0})
    assert unmeasured == ["no test query without a paraphrase: false answers not measured"]
    shy = warnings_for({**fine, "test_answered_share": 0.019})
    assert len(shy) == 1 and "1.9%" in shy[0]
    rash = warnings_for({**fine, "test_false_answer_rate": 0.25})
    assert len(rash) == 1 and "25.0%" in rash[0]
    missed = warnings_for({**fine, "meets_target": False, "rule": "bound"})
    assert len(missed) == 1 and "'bound'" in missed[0]


def test_threshold_report_chooses_on_val_and_warns_on_test(tmp_path: Path):
    rng = np.random.default_rng(0)
    close = rng.uniform(0.0, 1.0, 40)  # answerable, all right
    val = _result([*close, 5.0, 5.0], [True] * 42)
    val_held = np.array([False] * 40 + [True, True])
    # the held-out queries sit far on val, but near on test: test falsely answers them
    val_unans = Unanswerable(val_held, np.where(val_held, 3.0, np.inf))
    test = _result([*close, 0.5, 0.5], [True] * 42)
    test_unans = Unanswerable(val_held, np.where(val_held, 0.5, np.inf))
    chosen, summary, curve = threshold_report(
        val,
        test,
        tmp_path,
        tmp_path / "threshold.png",
        target=0.9,
        max_false_answer_rate=0.2,
        no_paraphrase={"val": val_unans, "test": test_unans},
    )
    assert chosen == pytest.approx(close.max())  # everything answerable, nothing false
    assert summary["val_answered_share"] == 1.0 and summary["val_false_answer_rate"] == 0.0
    assert summary["test_false_answer_rate"] == 1.0 and summary["warning"] == 1
    assert summary["test_unanswerable"] == 2 and summary["test_answerable"] == 40
    report = (tmp_path / "threshold.md").read_text(encoding="utf-8")
    assert "## WARNING" in report and "falsely answers 100.0%" in report
    assert (tmp_path / "threshold.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the curve goes on to the held-out queries' distance, where both are answered
    assert curve.loc[curve["threshold"] == chosen, "false_answer_rate"].item() == 0.0
    assert curve["false_answer_rate"].iloc[-1] == 1.0


def test_plot_threshold_curve_writes_png(tmp_path):
    rng = np.random.default_rng(0)
    d = rng.random(200)
    curve = threshold_curve(d, d < rng.random(200), unanswerable=rng.random(50))
    chosen = pick_threshold(curve, 0.5)
    path = plot_threshold_curve(curve, tmp_path / "plots" / "threshold.png", chosen)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

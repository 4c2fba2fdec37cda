"""The evaluate stage's parts that need no trained model (qpr.pipeline.evaluate)."""

from __future__ import annotations

from qpr.pipeline.evaluate import _log_threshold


def test_the_threshold_log_shouts_each_warning() -> None:
    lines: list[str] = []
    threshold = {
        "value": 0.61,
        "rule": "bound",
        "test_answered_share": 0.449,
        "test_precision_at_1": 0.861,
        "test_false_answer_rate": 0.18,
        "test_unanswerable": 2259,
        "warnings": ["answers only 44.9% of the answerable test queries"],
    }
    _log_threshold(threshold, lines.append)
    assert "44.9%" in lines[0] and "18.0% of the 2259 with no paraphrase" in lines[0]
    assert lines[1:] == [
        "WARNING: no-answer threshold: answers only 44.9% of the answerable test queries"
    ]
    quiet: list[str] = []
    _log_threshold({**threshold, "warnings": []}, quiet.append)
    assert len(quiet) == 1 and "WARNING" not in quiet[0]

"""What a retraining run's exit code says."""

from __future__ import annotations

import pytest

from qpr.ops.summary import exit_code


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        ("retrained", 0),
        ("nothing-new", 0),
        ("no-new-rows", 0),
        ("recovered", 0),
        ("failed", 1),
        ("only-quarantined", 3),
    ],
)
def test_exit_code_says_what_happened(outcome, code):
    assert exit_code({"outcome": outcome, "quarantined": []}) == code

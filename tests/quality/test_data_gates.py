"""The raw-log gate's tolerance: a fraction of the rows and an absolute floor for small files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpr.config import QualitySettings
from qpr.quality.data_gates import gate_raw_logs, tolerated_fraction
from qpr.quality.gate import GateFailed

from .factories import make_log_frame


@pytest.mark.parametrize(
    ("rows", "fraction", "floor", "allowed_rows"),
    [(6, 0.05, 2, 2), (1000, 0.05, 2, 50), (6, 0.05, 0, 0.3), (0, 0.05, 2, None)],
)
def test_tolerated_share_is_the_larger_of_fraction_and_floor(rows, fraction, floor, allowed_rows):
    share = tolerated_fraction(rows, fraction, floor)
    if allowed_rows is None:
        assert share == fraction
    else:
        assert share * rows == pytest.approx(allowed_rows, abs=1e-5)


def test_one_bad_row_in_a_six_row_file_is_dropped_and_counted(gx_gate, tmp_path: Path):
    raw = make_log_frame(6)
    raw.loc[2, "question"] = "x" * 500  # overlong: the cleaner drops it

    result = gate_raw_logs(raw, QualitySettings(max_drop_rows=2), tmp_path)

    tolerated = result.statistics["tolerated"]["logs"]
    assert sum(tolerated.values()) == 1 and any("overlong" in k for k in tolerated), tolerated
    report = json.loads((tmp_path / "raw_logs.json").read_text())
    assert report["statistics"]["tolerated"] == result.statistics["tolerated"]
    assert "Rows tolerated" in (tmp_path / "raw_logs.md").read_text()


def test_a_small_file_with_more_bad_rows_than_the_floor_still_fails(gx_gate, tmp_path: Path):
    raw = make_log_frame(6)
    raw.loc[[1, 2, 3], "question"] = "x" * 500

    with pytest.raises(GateFailed):
        gate_raw_logs(raw, QualitySettings(max_drop_rows=2), tmp_path)

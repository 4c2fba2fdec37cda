import json

import pytest

from qpr.quality.checks import Check, require
from qpr.quality.gate import GateFailed


def test_passing_checks_write_a_report(tmp_path):
    checks = [Check("parity", 3e-7, "<", 1e-4), Check("count", 5, "==", 5)]
    assert require("export", checks, tmp_path) == checks
    report = json.loads((tmp_path / "export.json").read_text())
    assert report["success"] is True and len(report["checks"]) == 2


def test_failure_names_check_value_and_bound(tmp_path):
    with pytest.raises(GateFailed) as err:
        require("index", [Check("self_retrieval", 0.42, ">=", 0.95, "500 sampled")], tmp_path)
    assert "self_retrieval: measured 0.42, required >= 0.95 (500 sampled)" in str(err.value)
    assert err.value.report_path == tmp_path / "index.json"


def test_nan_never_passes():
    assert not Check("loss", float("nan"), "<", 1.0).passed
    assert not Check("loss", float("inf"), ">", 0.0).passed

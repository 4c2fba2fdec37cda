"""The gate keeps nothing of a frame once it has judged it."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pandas as pd

from qpr.quality import gate as gx_gate


def test_a_gated_frame_is_not_kept_alive() -> None:
    """GX's execution engine caches each batch's DataFrame; a stage gating many pieces in
    one process would hold them all (measured: ~130 MB more per 500k-row file)."""
    import great_expectations.expectations as gxe

    suite = [gxe.ExpectColumnValuesToNotBeNull(column="x")]
    refs = []
    for _ in range(3):
        frame = pd.DataFrame({"x": np.arange(1000)})
        refs.append(weakref.ref(frame))
        assert gx_gate.gate("kept", {"f": frame}, {"f": suite}, None).success
        del frame
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert not gx_gate._get_context().data_sources.all()


def test_an_unread_batch_gets_both_reports(tmp_path) -> None:
    import json
    import re

    path = gx_gate.report_unread(
        tmp_path, "raw_logs", "DataFormatError", "day.csv: header \x1b[2J\nsecond line"
    )
    report = json.loads(path.read_text(encoding="utf-8"))
    assert path == tmp_path / "raw_logs.json"
    assert (report["gate"], report["success"], report["error"]) == (
        "raw_logs",
        False,
        "DataFormatError",
    )
    summary = (tmp_path / "raw_logs.md").read_text(encoding="utf-8")
    assert summary.startswith("# Gate `raw_logs`: FAILED")
    assert "no expectation ran" in summary and "header \\x1b[2J" in summary
    assert "second line" in summary
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", summary + path.read_text())

"""qpr.ops.merge: new log rows into the daily files of data/, never a duplicate."""

from __future__ import annotations

import json
from datetime import date

import pandas as pd

from qpr.ops.layout import RetrainLayout
from qpr.ops.merge import merge_logs

from .factories import DAY, incoming_file, tree, write_log_day


def test_merge_adds_new_days_byte_for_byte_and_never_a_duplicate(project: RetrainLayout):
    incoming = project.incoming
    fresh = write_log_day(incoming)  # day 4: new
    repeat = write_log_day(incoming / "again", date(2026, 10, 2))  # day 2 again: all duplicates
    report = merge_logs([incoming_file(fresh), incoming_file(repeat)], project.logs_dir)
    assert report.days_created == [DAY.isoformat()]
    assert report.rows_added == 120 and report.rows_duplicate == 120
    assert (project.logs_dir / f"{DAY}.jsonl").read_bytes() == fresh.read_bytes()

    before = tree(project.data_dir)
    again = merge_logs([incoming_file(fresh)], project.logs_dir)
    assert again.rows_added == 0 and again.rows_duplicate == 120
    assert tree(project.data_dir) == before  # idempotent: nothing rewritten


def test_merge_splits_rows_by_utc_day_and_reads_csv(project: RetrainLayout):
    csv = project.incoming / "export.csv"
    csv.parent.mkdir(parents=True)
    pd.DataFrame(
        {
            "timestamp": [
                "2026-10-01T00:01:10Z",  # already in data/ … unless the text differs
                "2026-10-05T23:59:00-01:00",  # 00:59 UTC on the 6th
                "not a time",
            ],
            "question": ["a brand new question", "late night question", "no time"],
            "answer_id": ["ans-1", "ans-2", "ans-3"],
        }
    ).to_csv(csv, index=False)
    report = merge_logs([incoming_file(csv)], project.logs_dir)
    assert report.rows_added == 2 and report.rows_unplaceable == 1
    assert report.days_extended == ["2026-10-01"] and report.days_created == ["2026-10-06"]
    last = (project.logs_dir / "2026-10-06.jsonl").read_text().splitlines()
    assert json.loads(last[0])["question"] == "late night question"

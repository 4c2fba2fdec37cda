"""qpr.ops.incoming: discovery, validation and quarantine of fresh log files, the ledger."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from qpr.config import QualitySettings
from qpr.ops.incoming import Ledger, discover, quarantine, quarantine_refused, refused, validate

from .factories import incoming_file, write_log_day


def test_discover_skips_files_still_being_written(tmp_path: Path):
    for name in ("b.jsonl", "a.csv", ".hidden.jsonl", "c.jsonl.tmp", "d.part", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    assert [f.name for f in discover(tmp_path)] == ["a.csv", "b.jsonl"]
    assert discover(tmp_path / "missing") == []


def test_validation_passes_a_good_day_and_quarantines_bad_files(tmp_path: Path):
    quality = QualitySettings()
    good = incoming_file(write_log_day(tmp_path / "in"))
    result = validate(good, quality, tmp_path / "reports" / "good")
    assert result.ok and result.rows == 120

    broken = tmp_path / "in" / "broken.jsonl"
    rows = [json.loads(line) for line in good.path.read_text().splitlines()]
    for i, row in enumerate(rows):
        if i % 3 == 0:
            row["answer_id"] = "!! not an id"
    broken.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = validate(incoming_file(broken), quality, tmp_path / "reports" / "broken")
    assert not bad.ok and "raw_logs" in bad.reason

    folder = quarantine(bad, tmp_path / "quarantine", "20261015T030000Z")
    assert not broken.exists()
    assert (folder / "broken.jsonl").read_bytes() == "".join(
        json.dumps(r) + "\n" for r in rows
    ).encode()
    report = json.loads((folder / "raw_logs.json").read_text())
    assert report["success"] is False
    assert "answer_id" in (folder / "REASON.txt").read_text()

    not_a_log = tmp_path / "in" / "notes.csv"
    not_a_log.write_text("a,b\n1,2\n")
    result = validate(incoming_file(not_a_log), quality, tmp_path / "reports" / "notes")
    assert not result.ok and "missing column" in result.reason
    assert json.loads((tmp_path / "reports" / "notes" / "raw_logs.json").read_text())["message"]
    # A file that could not be read gets the summary the docs promise, as a judged one does.
    folder = quarantine(result, tmp_path / "quarantine", "20261015T030000Z")
    assert {"raw_logs.json", "raw_logs.md", "REASON.txt", "notes.csv"} <= {
        p.name for p in folder.iterdir()
    }
    summary = (folder / "raw_logs.md").read_text(encoding="utf-8")
    assert "FAILED" in summary and "missing column" in summary


def test_one_ragged_row_is_dropped_under_the_tolerance_not_the_file(tmp_path: Path):
    from tests.data.test_loaders import _ragged_csv

    quality = QualitySettings()
    path = _ragged_csv(tmp_path / "in" / "day.csv", good=204, ragged=1)
    result = validate(incoming_file(path), quality, tmp_path / "reports" / "day")
    assert result.ok and result.rows == 205
    assert result.tolerated and max(result.tolerated.values()) == 1
    assert "Rows tolerated" in (tmp_path / "reports" / "day" / "raw_logs.md").read_text()
    # More ragged rows than the tolerance: the gate refuses the batch, with its report.
    many = _ragged_csv(tmp_path / "in" / "many.csv", good=20, ragged=5)
    refused = validate(incoming_file(many), quality, tmp_path / "reports" / "many")
    assert not refused.ok and "raw_logs" in refused.reason and refused.rows == 25


def test_ledger(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append([{"sha256": "x", "outcome": "merged"}, {"sha256": "y", "outcome": "quarantined"}])
    assert ledger.merged_hashes() == {"x"}


def test_names_that_resolve_outside_the_inbox_are_refused_not_read(tmp_path: Path):
    inbox = tmp_path / "incoming"
    inbox.mkdir()
    secret = tmp_path / "elsewhere" / "private.jsonl"
    secret.parent.mkdir()
    secret.write_text('{"question": "not for the model"}\n')
    (inbox / "leak.jsonl").symlink_to(secret)
    good = write_log_day(inbox)
    (inbox / "alias.jsonl").symlink_to(good)  # a link inside the inbox is only another name

    assert sorted(f.name for f in discover(inbox)) == sorted(["alias.jsonl", good.name])
    ((path, reason),) = refused(inbox)
    assert path.name == "leak.jsonl" and "outside the inbox" in reason

    where = quarantine_refused(path, reason, tmp_path / "quarantine", "20261015T030000Z")
    assert not (inbox / "leak.jsonl").is_symlink() and (where / "leak.jsonl").is_symlink()
    assert "outside the inbox" in (where / "REASON.txt").read_text()
    assert secret.read_text().startswith('{"question"')  # the target is never touched


CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _reports_are_clean(folder: Path, arrived: str) -> None:
    """Every report in a quarantine folder (not the file as it arrived) is free of control
    characters: `cat REASON.txt` cannot set a terminal's title or clear its screen."""
    reports = [p for p in folder.iterdir() if p.name != arrived]
    assert {p.name for p in reports} >= {"REASON.txt", "raw_logs.json", "raw_logs.md"}
    for report in reports:
        assert not CONTROL.search(report.read_text(encoding="utf-8")), report.name


def test_a_hostile_header_and_name_are_escaped_in_the_quarantine(tmp_path: Path):
    name = "day\x1b[2J.csv"
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(b"timestamp,question,\x1b]0;title\x07\x1b[2J\n2026-01-01T00:00:00Z,hi,x\n")
    bad = validate(incoming_file(path), QualitySettings(), tmp_path / "reports")
    assert not bad.ok and "\\x1b]0;title\\x07\\x1b[2J" in bad.reason

    folder = quarantine(bad, tmp_path / "quarantine", "20261015T030000Z")
    _reports_are_clean(folder, name)
    reason = (folder / "REASON.txt").read_text(encoding="utf-8")
    assert "file: day\\x1b[2J.csv" in reason and "\\x1b]0;title" in reason


def test_a_gzip_file_is_named_not_quoted_in_the_quarantine(tmp_path: Path):
    path = tmp_path / "in" / "day.csv"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(write_log_day(tmp_path / "src").read_bytes()))
    bad = validate(incoming_file(path), QualitySettings(), tmp_path / "reports")
    assert bad.reason.endswith(
        "starts with bytes 1f 8b 08 00 (gzip-compressed: decompress it first)"
    )
    _reports_are_clean(quarantine(bad, tmp_path / "quarantine", "20261015T030000Z"), "day.csv")


def test_values_a_failed_gate_quotes_are_escaped(tmp_path: Path):
    good = write_log_day(tmp_path / "src")
    rows = [json.loads(line) for line in good.read_text().splitlines()]
    for row in rows[::2]:
        row["answer_id"] = "\x1b[31mred\x9b2J"
    path = tmp_path / "in" / "day.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = validate(incoming_file(path), QualitySettings(), tmp_path / "reports")
    assert not bad.ok and "answer_id" in bad.reason
    folder = quarantine(bad, tmp_path / "quarantine", "20261015T030000Z")
    _reports_are_clean(folder, "day.jsonl")
    assert not CONTROL.search((folder / "raw_logs.md").read_text(encoding="utf-8"))

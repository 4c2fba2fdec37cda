"""`qpr data ...`: synthetic logs (daily and at scale) and the raw-log gate's check."""

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_data_help_lists_its_tasks():
    result = runner.invoke(app, ["data", "--help"])
    assert result.exit_code == 0
    for command in ("synth", "check", "ensure"):
        assert command in result.output


def test_synth_bad_day_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["data", "synth", "--out", str(tmp_path), "--day", "tomorrow"])
    assert result.exit_code == 1 and "YYYY-MM-DD" in result.output


def test_synth_one_day_then_check_it(tmp_path):
    out = tmp_path / "logs"
    made = runner.invoke(app, ["data", "synth", "--out", str(out), "--day", "2026-11-02"])
    assert made.exit_code == 0, made.output
    assert (out / "2026-11-02.jsonl").is_file()
    checked = runner.invoke(app, ["data", "check", str(out)])
    assert checked.exit_code == 0, checked.output
    assert "gate passed" in checked.output


def test_check_on_a_file_that_is_not_a_log(tmp_path):
    path = tmp_path / "sales.csv"
    path.write_text("a,b\n1,2\n")
    result = runner.invoke(app, ["data", "check", str(path)])
    assert result.exit_code == 1 and "not a QA log" in result.output


def test_data_scale_writes_shards_the_loader_reads(tmp_path):
    out = tmp_path / "scale"
    made = runner.invoke(
        app, ["data", "scale", "--questions", "3k", "--out", str(out), "--shard-rows", "1000"]
    )
    assert made.exit_code == 0, made.output
    assert "3,000 questions in 3 shards" in made.output
    checked = runner.invoke(app, ["data", "check", str(out)])
    assert checked.exit_code == 0, checked.output


def test_data_scale_refuses_a_bad_count(tmp_path):
    result = runner.invoke(app, ["data", "scale", "--questions", "lots", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "not a count" in result.output


# Files an attacker or an accident controls: their text is shown, never run or parsed.
HOSTILE = {
    "markup.csv": b"timestamp,question,[/]\n2026-01-01T00:00:00Z,hi,x\n",
    "escapes.csv": b"timestamp,question,\x1b]0;title\x07\x1b[2J\n2026-01-01T00:00:00Z,hi,x\n",
    "gzip.csv": gzip.compress(b"timestamp,question,answer_id\n2026-01-01T00:00:00Z,hi,a1\n"),
}
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _check(path: Path) -> subprocess.CompletedProcess:
    """`qpr data check` as a person runs it: its own process, its real stdout and stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "qpr.cli", "data", "check", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_file_gives_one_clean_line(tmp_path: Path, name: str) -> None:
    # Folders named like a markup tag too ("in[" holding "]"): the message quotes the path.
    folder = tmp_path / "in[/]"
    folder.mkdir(parents=True)
    path = folder / name
    path.write_bytes(HOSTILE[name])
    result = _check(path)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(path) in lines[0]
    assert "Traceback" not in result.stderr and not CONTROL.search(result.stderr)


def test_hostile_text_is_escaped_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "escapes.csv"
    path.write_bytes(HOSTILE["escapes.csv"])
    result = runner.invoke(app, ["data", "check", str(path)])
    assert result.exit_code == 1
    assert "\\x1b]0;title\\x07\\x1b[2J" in result.output

    packed = tmp_path / "gzip.csv"
    packed.write_bytes(HOSTILE["gzip.csv"])
    result = runner.invoke(app, ["data", "check", str(packed)])
    assert "not a text file: starts with bytes 1f 8b" in result.output
    assert "gzip-compressed: decompress it first" in result.output


def test_questions_shown_as_examples_are_not_markup(tmp_path: Path) -> None:
    rows = ["timestamp,question,answer_id"]
    rows += [f"2026-01-01T00:00:{i:02d}Z,how do I reset my phone {i},a1" for i in range(40)]
    rows += ["2026-01-01T00:01:00Z,[/] [bold]x,a1"] * 2  # a duplicate: shown as an example
    path = tmp_path / "day.csv"
    path.write_text("\n".join(rows) + "\n")
    result = runner.invoke(app, ["data", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "[/] [bold]x" in result.output

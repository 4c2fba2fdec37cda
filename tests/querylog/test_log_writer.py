"""qpr.querylog.log_writer: whole lines in rotating files, bounded in size, sampled by
request id, and every line lost counted (queue full, write errors), never raised."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from qpr.data.loaders import clean_logs, read_logs
from qpr.querylog.log_records import QUERY_FIELDS
from qpr.querylog.log_writer import LogLimits, QueryLog
from qpr.retrieval.bundle import Hit, SearchResult

MODEL = {"name": "local", "version": None, "fingerprint": "f" * 64}
REPO = Path(__file__).resolve().parents[2]


def result(question: str, answered: bool = True, answer: str = "ans-1") -> SearchResult:
    hits = [
        Hit(
            question_id=2**53 + 1,
            text="a",
            cluster_id=1,
            distance=0.01,
            score=0.99,
            answer_id=answer,
        ),
        Hit(question_id=7, text="b", cluster_id=2, distance=0.5, score=0.66, answer_id="ans-2"),
    ]
    return SearchResult(query=question, hits=hits, answered=answered)


def log_search(log: QueryLog, request_id: str, *results: SearchResult) -> str | None:
    return log.queries(
        request_id,
        list(results),
        endpoint="/search" if len(results) == 1 else "/search/batch",
        model=MODEL,
        k=2,
        threshold=0.1,
        latency_ms=0.8,
    )


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> None:
    """Until the writer thread has done something (not a timing: a sync point)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the writer did not get there"
        time.sleep(0.01)


def all_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_lines_are_whole_and_read_by_the_pipeline_reader(tmp_path: Path) -> None:
    with QueryLog(tmp_path) as log:
        assert log_search(log, "r1", result("how do i reset my password")) is None
        batch = (result("how do i clean my printer"), result("who won in 1990", answered=False))
        log_search(log, "r2", *batch)
        assert log.feedback("r1", "taken") is None
    assert log.counts() == {("queries", "written"): 3, ("feedback", "written"): 1}
    files = all_files(tmp_path)
    assert [p.parent.name for p in files] == ["feedback", "queries"]
    assert all(p.suffix == ".jsonl" for p in files)  # closed: renamed from .jsonl.part
    for path in files:
        assert path.read_bytes().endswith(b"\n")
    raw = read_logs(tmp_path / "queries")  # the pipeline's QA-log reader
    assert list(raw.columns[: len(QUERY_FIELDS)]) == list(QUERY_FIELDS)
    assert raw["question"].tolist()[1:] == ["how do i clean my printer", "who won in 1990"]
    assert raw["answer_id"].tolist()[:2] == ["ans-1", "ans-1"]
    assert raw["answer_id"].isna().tolist() == [False, False, True]  # unanswered: none
    assert raw["timestamp_utc"].notna().all()
    first = raw.iloc[1]
    assert (first["request_id"], first["position"], first["endpoint"]) == ("r2", 0, "/search/batch")
    assert first["question_ids"] == [str(2**53 + 1), "7"]  # ids as strings (qpr.ids)
    assert first["answer_ids"] == ["ans-1", "ans-2"] and first["scores"] == [0.99, 0.66]
    assert first["model_fingerprint"] == "f" * 64 and first["log_version"] == 1
    clean, report = clean_logs(raw, min_chars=3, max_chars=500)
    assert len(clean) == 2 and report.dropped == {"bad_answer_id": 1}


def test_questions_are_redacted_before_they_are_written(tmp_path: Path) -> None:
    with QueryLog(tmp_path) as log:
        log_search(log, "r1", result("mail jane@example.com or call 555-123-4567 re 48213377"))
        log_search(log, "r2", result("how do i reset my password"))
    data = b"".join(p.read_bytes() for p in all_files(tmp_path))
    for secret in (b"jane@example.com", b"555-123-4567", b"48213377"):
        assert secret not in data
    lines = [json.loads(line) for line in data.splitlines()]
    assert lines[0]["question"] == "mail <email> or call <phone> re <number>"
    assert [line["redacted"] for line in lines] == [True, False]


def test_sampling_is_by_request_id_so_feedback_follows_its_query(tmp_path: Path) -> None:
    ids = [f"req-{i}" for i in range(2000)]
    with QueryLog(tmp_path, LogLimits(sample=0.3)) as log:
        outcomes = {rid: log_search(log, rid, result("q")) for rid in ids}
        feedback = {rid: log.feedback(rid, "rejected") for rid in ids[:200]}
    kept = [rid for rid, why in outcomes.items() if why is None]
    assert 0.25 * len(ids) < len(kept) < 0.35 * len(ids)
    assert set(outcomes.values()) == {None, "sampled out"}
    assert {rid for rid, why in feedback.items() if why is None} == set(kept) & set(ids[:200])
    counts = log.counts()
    assert counts["queries", "written"] == len(kept)
    assert counts["queries", "sampled_out"] == len(ids) - len(kept)
    with QueryLog(tmp_path / "none", LogLimits(sample=0.0)) as log:
        assert log_search(log, "r1", result("q")) == "sampled out"
    assert not (tmp_path / "none" / "queries").exists()


def test_files_rotate_and_the_oldest_go_past_the_total_bound(tmp_path: Path) -> None:
    limits = LogLimits(file_bytes=2048, total_bytes=8192, flush_seconds=0.02)
    with QueryLog(tmp_path, limits) as log:
        for i in range(300):
            log_search(log, f"r{i:04d}", result(f"question number {i}"))
            if i % 50 == 0:  # several writer passes, not one
                wait_for(lambda n=i: log.counts().get(("queries", "written"), 0) > n)
    assert log.counts()[("queries", "written")] == 300
    files = all_files(tmp_path / "queries")
    assert len(files) >= 3
    assert all(p.stat().st_size <= 2048 for p in files)
    assert sum(p.stat().st_size for p in files) <= 8192
    kept = [json.loads(line)["request_id"] for p in files for line in p.read_bytes().splitlines()]
    # The newest lines stay, in order, with none missing between them; the oldest went.
    assert kept == [f"r{i:04d}" for i in range(300 - len(kept), 300)]
    assert kept[-1] == "r0299" and "r0000" not in kept


def test_a_line_longer_than_a_file_gets_a_file_of_its_own(tmp_path: Path) -> None:
    with QueryLog(tmp_path, LogLimits(file_bytes=1024, total_bytes=1 << 20)) as log:
        log_search(log, "long", result("word " * 400))
        log_search(log, "short", result("a short one"))
    files = all_files(tmp_path / "queries")
    assert [len(p.read_bytes().splitlines()) for p in files] == [1, 1]


def test_a_full_queue_drops_and_counts_at_once(tmp_path: Path) -> None:
    log = QueryLog(tmp_path, LogLimits(queue_events=3))  # the writer not started: overload
    outcomes = [log_search(log, f"r{i}", result("q"), result("q")) for i in range(10)]
    assert outcomes == [None] * 3 + ["queue full"] * 7
    assert log.feedback("r0", "taken") == "queue full"
    assert log.counts() == {("queries", "queue_full"): 14, ("feedback", "queue_full"): 1}
    log.start()
    log.close()  # what was queued is written at shutdown
    assert log.counts()[("queries", "written")] == 6
    assert log_search(log, "late", result("q")) == "closed"


def test_an_unwritable_folder_is_counted_and_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    with caplog.at_level(logging.WARNING, logger="qpr.querylog"), QueryLog(blocker / "log") as log:
        for i in range(5):
            assert log_search(log, f"r{i}", result("q")) is None  # queued: the caller is fine
        log.feedback("r0", "taken")
    assert log.counts() == {("queries", "write_error"): 5, ("feedback", "write_error"): 1}
    assert "cannot write to" in caplog.text and "Not a directory" in caplog.text
    assert blocker.read_text() == "not a folder\n"


def test_a_dead_writers_file_is_cut_to_its_last_line_and_closed(tmp_path: Path) -> None:
    queries = tmp_path / "queries"
    queries.mkdir()
    dead = queries / "queries-20261101T000000000000Z-deadbeef-000001.jsonl.part"
    whole = b'{"timestamp":"2026-11-01T00:00:00Z","question":"a","answer_id":"x"}\n'
    dead.write_bytes(whole * 2 + b'{"timestamp":"2026-11-01T00:00:01Z","quest')
    with QueryLog(tmp_path, LogLimits(flush_seconds=0.02)) as live:
        log_search(live, "r1", result("q"))
        wait_for(lambda: live.counts().get(("queries", "written")) == 1)
        (open_file,) = queries.glob("*.part")  # the live writer's own, under its lock
        with QueryLog(tmp_path):  # a second writer starts: it leaves that file alone
            pass
        assert open_file.exists()
    assert not dead.exists()
    assert dead.with_name(dead.name.removesuffix(".part")).read_bytes() == whole * 2


def test_a_write_cut_short_by_a_file_size_limit_leaves_whole_lines(tmp_path: Path) -> None:
    """A real process under RLIMIT_FSIZE (a full disk, for one file): writes fail part way
    (EFBIG); the file is cut back to its last line, the loss counted, and the writer goes on
    in a new file."""
    script = textwrap.dedent(
        f"""
        import json, resource, sys
        sys.path[:0] = [{str(REPO / "src")!r}, {str(REPO)!r}]
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
        from qpr.querylog.log_writer import LogLimits, QueryLog
        from tests.querylog.test_log_writer import log_search, result, wait_for
        limits = LogLimits(file_bytes=1 << 20, total_bytes=1 << 22, flush_seconds=0.01)
        with QueryLog(sys.argv[1], limits) as log:
            for i in range(60):  # one line a write
                log_search(log, f"r{{i:03d}}", result("how do i reset my password " * 3))
                wait_for(lambda: sum(log.counts().values()) == i + 1)
        print(json.dumps({{"/".join(k): v for k, v in log.counts().items()}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["queries/written"] > 0 and counts["queries/write_error"] > 0
    assert counts["queries/written"] + counts["queries/write_error"] == 60
    files = all_files(tmp_path / "queries")
    assert len(files) >= 2  # after a failure the writer moved on to a new file
    lines = 0
    for path in files:
        data = path.read_bytes()
        assert path.stat().st_size <= 3000 and data.endswith(b"\n")
        lines += sum(1 for line in data.splitlines() if json.loads(line))
    assert lines == counts["queries/written"]

"""The models folder's writer lock (qpr.deltas.lock): writers at once, in threads and in
processes, lose nothing they acknowledged; a killed holder frees it; a writer that waits
too long says who holds it."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qpr.artifacts import DELTAS_DIR, WRITER_LOCK_FILE
from qpr.deltas.add import add_questions
from qpr.deltas.format import live_questions, read_manifest, write_delta
from qpr.deltas.lock import WAIT_ENV, WriterBusy, holds_lock, wait_seconds, writer_lock

from .factories import MAIN_IDS, frame
from .writers import run_writer

ROOT = Path(__file__).resolve().parents[2]
# Child processes: one thread each, the project's code first on the path.
CHILD_ENV = os.environ | {
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
}
ADD = [sys.executable, "-m", "qpr.cli", "index", "add", "--local", "--models-dir"]
HOLDER = """
import sys, time
from qpr.deltas.lock import writer_lock
with writer_lock(sys.argv[1], wait=0):
    print("held", flush=True)
    time.sleep(120)
"""


def _texts(tag: str, n: int) -> list[str]:
    return [f"how do i {tag} my sailing boat number {i}" for i in range(n)]


@pytest.fixture
def holder(models: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the lock of `models` until the test ends or kills it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(models)],
        stdout=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_writer_that_cannot_wait_says_who_holds_the_lock(models: Path, holder) -> None:
    with pytest.raises(WriterBusy) as busy:
        add_questions(models, frame(_texts("paint", 2), [1, 2]), wait=0)
    message = str(busy.value)
    assert message.startswith(f"busy: {models.resolve()} is being written by pid {holder.pid}")
    assert "-c" in message and " since 20" in message and WAIT_ENV in message
    assert read_manifest(models).version == 0  # nothing was written


def test_the_busy_error_is_one_line_from_the_command(models: Path, holder, tmp_path) -> None:
    questions = tmp_path / "new.txt"
    questions.write_text("\n".join(_texts("paint", 3)) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "qpr.cli",
            "index",
            "add",
            "--local",
            "--models-dir",
            models,
            str(questions),
        ],
        cwd=ROOT,
        env=CHILD_ENV | {WAIT_ENV: "0.2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "busy:" in done.stderr and f"pid {holder.pid}" in done.stderr
    assert "Traceback" not in done.stderr and read_manifest(models).version == 0


def test_a_killed_holder_frees_the_lock(models: Path, holder) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    entry = add_questions(models, frame(_texts("paint", 2), [1, 2]), wait=10)
    assert entry["version"] == 1
    assert {1, 2} <= set(live_questions(models)["question_id"].tolist())


def test_the_lock_is_reentrant_in_a_thread_and_excludes_other_threads(models: Path) -> None:
    seen: list[BaseException | None] = []

    def other() -> None:
        try:
            with writer_lock(models, wait=0):
                seen.append(None)
        except WriterBusy as err:
            seen.append(err)

    with writer_lock(models), writer_lock(models, wait=0):
        assert holds_lock(models)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert not holds_lock(models)
    assert isinstance(seen[0], WriterBusy) and "busy:" in str(seen[0])
    with writer_lock(models, wait=0):  # released: free again
        pass
    # The holder's note goes with the lock.
    assert (models / WRITER_LOCK_FILE).read_text() == ""


def test_no_delta_is_written_without_the_lock(models: Path) -> None:
    with pytest.raises(RuntimeError, match="without the writer lock"):
        write_delta(models, 1, np.zeros((1, 8), np.float32), frame(["a"], [1]), {})


def test_the_wait_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WAIT_ENV, "2.5")
    assert wait_seconds() == 2.5 and wait_seconds(0) == 0.0
    monkeypatch.setenv(WAIT_ENV, "soon")
    with pytest.raises(ValueError, match=WAIT_ENV):
        wait_seconds()


def test_writers_in_threads_lose_nothing(models: Path) -> None:
    jobs = [
        {"kind": "add", "texts": _texts(f"t{w}", 3), "ids": [10 * w + i for i in range(3)]}
        for w in range(1, 5)
    ] + [{"kind": "delete", "ids": MAIN_IDS[:3]}]
    start = time.time() + 0.2
    jobs = [j | {"models": str(models), "wait": 30, "start": start} for j in jobs]
    results: list[dict[str, Any]] = [{}] * len(jobs)

    def work(i: int) -> None:
        results[i] = run_writer(jobs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _check(models, results)
    assert read_manifest(models).version == 5


def test_writer_processes_through_the_command_lose_nothing(models: Path, tmp_path) -> None:
    files = []
    for w in range(3):
        files.append(tmp_path / f"c{w}.txt")
        files[-1].write_text("\n".join(_texts(f"c{w}", 20)) + "\n")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "qpr.cli",
                "index",
                "add",
                "--local",
                "--models-dir",
                str(models),
                str(f),
            ],
            cwd=ROOT,
            env=CHILD_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    added = [json.loads(out)["added"] for out, _ in outs]
    assert added == [20, 20, 20]
    live = live_questions(models)["text"].tolist()
    assert all(live.count(t) == 1 for w in range(3) for t in _texts(f"c{w}", 20))
    manifest = read_manifest(models)
    assert sorted(int(d["number"]) for d in manifest.deltas) == [1, 2, 3]
    assert manifest.tombstones == []  # nobody replaced another's questions


def _check(models: Path, results: list[dict[str, Any]]) -> int:
    """Every acknowledged add live once, every acknowledged delete gone, one manifest
    version per change. Returns the number of acknowledged changes."""
    live = live_questions(models)
    texts, qids = live["text"].tolist(), live["question_id"].tolist()
    assert len(set(qids)) == len(qids) and len(set(texts)) == len(texts)
    changes = 0
    for job in results:
        if job["outcome"] != "ok":
            continue
        if job["kind"] == "delete":
            assert not set(job["result"]["deleted"]) & set(qids)
            changes += bool(job["result"]["deleted"])
        else:
            assert set(job["texts"]) <= set(texts), job
            changes += 1
    assert read_manifest(models).version == changes
    assert not list((models / DELTAS_DIR).glob(".tmp-*"))
    return changes


def _trial(rng: random.Random, trial: int, models: Path, files: Path) -> list[dict[str, Any]]:
    """2-3 writers: small adds (as frames or as a file) and deletes of main questions;
    one in five gives up at once when the lock is held."""
    jobs = []
    for w in range(rng.randint(2, 3)):
        kind = rng.choice(["add", "add", "add_file", "delete"])
        n = rng.randint(1, 4)
        job: dict[str, Any] = {"kind": kind, "models": str(models)}
        job["wait"] = 0 if rng.random() < 0.2 else 30
        if kind == "delete":
            job["ids"] = rng.sample(MAIN_IDS, n)
        else:
            job["texts"] = _texts(f"t{trial}w{w}", n)
            job["ids"] = [100_000 + 100 * trial + 10 * w + i for i in range(n)]
            job["file"] = str(files / f"t{trial}w{w}.txt")
        jobs.append(job)
    return jobs


@pytest.mark.slow
def test_fifty_random_trials_of_concurrent_writers_lose_nothing(
    base_dir: Path, tmp_path: Path
) -> None:
    rng = random.Random(39)
    acknowledged = busy = 0
    context = multiprocessing.get_context("spawn")  # no fork of a process using OpenMP
    with context.Pool(3) as pool:
        pool.map(time.sleep, [0.0] * 3)  # the workers are up before the first trial
        for trial in range(50):
            models = Path(shutil.copytree(base_dir, tmp_path / f"m{trial}"))
            jobs = _trial(rng, trial, models, tmp_path)
            start = time.time() + 0.05
            results = pool.map(run_writer, [j | {"start": start} for j in jobs])
            acknowledged += _check(models, results)
            busy += sum(r["outcome"] == "busy" for r in results)
            shutil.rmtree(models)
    assert acknowledged > 60  # the trials did change the bundles

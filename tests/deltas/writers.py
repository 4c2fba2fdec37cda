"""Writers for the concurrency tests of test_lock.py, run in worker processes (importable
by module name, as a spawned process needs): each waits for a shared start time, then
makes one change to the bundle and says what it acknowledged."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from qpr.config import QualitySettings
from qpr.deltas.add import add_files, add_questions, delete_questions
from qpr.deltas.lock import WriterBusy

from .factories import frame


def run_writer(job: dict[str, Any]) -> dict[str, Any]:
    """One change described by `job`: kind "add" (texts, ids), "add_file" (texts, file) or
    "delete" (ids); wait: the lock wait; start: the wall-clock time to begin at. Returns
    the job with "outcome" ("ok" or "busy") and "result"."""
    time.sleep(max(job["start"] - time.time(), 0.0))
    models, wait = Path(job["models"]), job["wait"]
    try:
        if job["kind"] == "add":
            result = add_questions(models, frame(job["texts"], job["ids"]), wait=wait)
        elif job["kind"] == "add_file":
            path = Path(job["file"])
            path.write_text("\n".join(job["texts"]) + "\n", encoding="utf-8")
            result = add_files(models, [path], QualitySettings(), wait=wait)
        else:
            result = delete_questions(models, job["ids"], wait=wait)
    except WriterBusy as err:
        return job | {"outcome": "busy", "result": str(err)}
    return job | {"outcome": "ok", "result": result}

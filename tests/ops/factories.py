"""Small builders for the retraining tests: log days, incoming files, file trees."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from qpr.data.synth import write_day
from qpr.io import file_sha256
from qpr.ops.incoming import IncomingFile

DAY = date(2026, 10, 4)


def incoming_file(path: Path) -> IncomingFile:
    return IncomingFile(path=path, sha256=file_sha256(path), size=path.stat().st_size)


def write_log_day(directory: Path, day: date = DAY, rows: int = 120) -> Path:
    return write_day(directory, day, seed=7, rows=rows, intents=20)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }

"""qpr.ops.layout: the paths a retraining run may use, and one run at a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from qpr.ops.layout import RetrainBusy, RetrainError, RetrainLayout, RetrainLock


def test_layout_refuses_paths_that_cannot_work(tmp_path: Path):
    with pytest.raises(RetrainError, match="versioned with DVC"):
        RetrainLayout.build(
            tmp_path,
            incoming=Path("in"),
            quarantine=Path("q"),
            archive=Path("a"),
            state_dir=Path(".r"),
            logs_path=Path("data/logs"),
        )
    (tmp_path / "data.dvc").write_text("outs: []\n")
    with pytest.raises(RetrainError, match="must not be inside"):
        RetrainLayout.build(
            tmp_path,
            incoming=Path("data/incoming"),
            quarantine=Path("q"),
            archive=Path("a"),
            state_dir=Path(".r"),
            logs_path=Path("data/logs"),
        )


def test_lock(tmp_path: Path):
    with RetrainLock(tmp_path / "lock"):
        # A second holder in another process is refused (flock is per open file).
        code = (
            "import sys; from qpr.ops.layout import RetrainLock, RetrainBusy\n"
            "try:\n    RetrainLock(sys.argv[1]).__enter__()\n"
            "except RetrainBusy:\n    sys.exit(3)\n"
        )
        probe = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lock")])
        assert probe.returncode == 3
    with RetrainLock(tmp_path / "lock"):
        pass
    assert issubclass(RetrainBusy, RetrainError)

"""The fresh-clone promise: `qpr data ensure` regenerates exactly what data.dvc pins, offline,
and never overwrites data a user put in data/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qpr.data.versioning import ensure_data, pinned_md5

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bare DVC project holding the repository's params.yaml and data.dvc, nothing else."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copy(REPO / "data.dvc", tmp_path / "data.dvc")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["dvc", "init", "--no-scm", "-q"], check=True)
    return tmp_path


def test_regenerated_data_matches_the_pin(project: Path):
    pinned = pinned_md5(project / "data.dvc")
    message = ensure_data(Path("params.yaml"), Path("data.dvc"))
    assert "identical to the pinned version" in message, message
    assert pinned_md5(project / "data.dvc") == pinned
    assert "matches" in ensure_data(Path("params.yaml"), Path("data.dvc"))


def test_user_data_is_never_overwritten(project: Path):
    own = project / "data" / "logs" / "mine.csv"
    own.parent.mkdir(parents=True)
    own.write_text("timestamp,question,answer_id\n2026-10-01T00:00:00Z,hi there,ans-1\n")
    with pytest.raises(RuntimeError, match="left as it is"):
        ensure_data(Path("params.yaml"), Path("data.dvc"))
    assert own.read_text().startswith("timestamp,question")

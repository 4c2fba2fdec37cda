"""Publishing an index change (qpr.deltas.publish). pin_deltas on a real git + DVC project:
an index change is pinned in dvc.lock by `dvc commit`; with another change pending in the
stage, dvc.lock is left alone. publish says what it did, and a registry that cannot take
the change leaves it served from the folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qpr.deltas.publish import pin_deltas, publish
from qpr.ops.processes import tool_env

STAGE = """stages:
  index:
    cmd: python build.py
    deps:
      - build.py
    outs:
      - models/index
      - models/deltas:
          persist: true
"""
BUILD = """from pathlib import Path
Path("models/index").mkdir(parents=True, exist_ok=True)
Path("models/index/index.faiss").write_text("main")
Path("models/deltas").mkdir(parents=True, exist_ok=True)
if not Path("models/deltas/deltas.json").exists():
    Path("models/deltas/deltas.json").write_text("{}")
"""


def _run(root: Path, *args: str) -> str:
    done = subprocess.run(args, cwd=root, env=tool_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    if shutil.which("dvc", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("dvc is not installed beside this Python")
    root = tmp_path / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text(STAGE)
    (root / "build.py").write_text(BUILD)
    _run(root, "git", "init", "-q")
    _run(root, "dvc", "init", "-q")
    _run(root, "dvc", "repro", "-q")
    return root


def test_an_index_change_is_pinned_in_dvc_lock(project: Path) -> None:
    lock = (project / "dvc.lock").read_text()
    (project / "models" / "deltas" / "deltas.json").write_text('{"version": 1}')
    assert pin_deltas(project / "models") == "pinned in dvc.lock (dvc commit index)"
    assert (project / "dvc.lock").read_text() != lock
    assert "up to date" in _run(project, "dvc", "status")
    assert pin_deltas(project / "models") == "dvc.lock already pins this state"


def test_a_changed_dep_leaves_dvc_lock_alone(project: Path) -> None:
    lock = (project / "dvc.lock").read_text()
    (project / "build.py").write_text(BUILD + "# changed\n")
    (project / "models" / "deltas" / "deltas.json").write_text('{"version": 1}')
    said = pin_deltas(project / "models")
    assert said.startswith("dvc.lock left as it was") and "build.py" in said
    assert (project / "dvc.lock").read_text() == lock


def test_a_folder_outside_a_dvc_project_is_not_pinned(tmp_path: Path) -> None:
    assert pin_deltas(tmp_path / "models").startswith("not the models/ of a DVC project")


def test_publish_says_what_it_could_not_do(tmp_path: Path) -> None:
    """Outside a DVC project and with a registry that has no such model: nothing pinned,
    nothing registered, both said, nothing raised (the change stays served)."""
    from qpr.config import settings_from_dict
    from tests.conftest import tiny_overrides

    overrides = tiny_overrides(tmp_path, registry={"name": "no-such-model"})
    settings = settings_from_dict(overrides)
    assert settings.registry.follow_deltas
    out = publish(tmp_path / "models", settings, actor="tests", reason="delta 1")
    assert out["dvc"].startswith("not the models/ of a DVC project")
    assert out["registry"].startswith("not registered:") and "no-such-model" in out["registry"]

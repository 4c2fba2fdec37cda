"""The tiny CNN bundle that the bundle and loading tests share (`tests.retrieval.cnn_bundle`):
one per test module, and a private copy for a test that breaks it. A module with its own
`bundle_dir` (a transformer bundle, a folded one) overrides these."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qpr.retrieval.bundle import Bundle
from tests.retrieval.cnn_bundle import build_bundle


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def bundle(bundle_dir: Path) -> Bundle:
    return Bundle.load(bundle_dir)


@pytest.fixture
def copy_dir(bundle_dir: Path, tmp_path: Path) -> Path:
    """A private copy to break."""
    return Path(shutil.copytree(bundle_dir, tmp_path / "models"))

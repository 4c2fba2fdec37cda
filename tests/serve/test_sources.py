"""RegistrySource serves only versions whose run committed (the qpr.committed mark)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qpr.serve.sources import RegistrySource, SourceError


class _Client:
    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags

    def get_model_version_by_alias(self, name: str, alias: str) -> SimpleNamespace:
        return SimpleNamespace(version="7", run_id="", tags=self.tags)


def test_a_version_without_the_committed_mark_is_not_served():
    source = RegistrySource("qpr", client=_Client({"qpr.bundle_fingerprint": "ab"}))
    with pytest.raises(SourceError, match=r"qpr\.committed"):
        source.poll()


def test_a_committed_version_is_served():
    source = RegistrySource("qpr", client=_Client({"qpr.committed": "retrain-cycle run"}))
    assert source.poll().version == "7"

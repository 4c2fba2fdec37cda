"""The committed mark on a real (sqlite) MLflow registry: promote refuses a version without
it, --force promotes past the refusal and records why, and marks an old champion."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from qpr.ops import promotion, registry

NAME = "qpr-commit-mark-test"


def _version(client: MlflowClient, **tags: str) -> int:
    return int(client.create_model_version(NAME, source="file:///nowhere", tags=tags).version)


@pytest.fixture(scope="module")
def client() -> MlflowClient:
    client = MlflowClient()
    client.create_registered_model(NAME)
    return client


def test_promote_refuses_a_version_its_run_never_committed(client):
    orphan = _version(client, **{registry.TAG_RETRAIN_RUN: "20261015T030000Z"})
    with pytest.raises(registry.RegistryError, match="no committed mark"):
        registry.promote(NAME, orphan, reason="by hand", actor="tests")
    assert registry.champion(NAME) is None

    forced = registry.promote(NAME, orphan, reason="checked by hand", actor="tests", force=True)
    assert forced.is_champion and promotion.is_committed(forced)
    assert forced.tags[registry.TAG_FORCED] == "checked by hand"


def test_a_committed_version_of_another_data_source_needs_force(client):
    registry.mark_committed(NAME, 1, by="tests")
    client.set_model_version_tag(NAME, "1", registry.TAG_DATA_SOURCE, "logs")
    quora = _version(client, **{registry.TAG_COMMITTED: "tests", registry.TAG_DATA_SOURCE: "quora"})
    with pytest.raises(registry.RegistryError, match="not comparable"):
        registry.promote(NAME, quora, reason="by hand", actor="tests")
    assert registry.champion(NAME).version == 1


def test_force_on_an_unmarked_champion_only_marks_it(client):
    old = _version(client)
    client.set_registered_model_alias(NAME, registry.CHAMPION, str(old))  # as before the mark

    marked = registry.promote(NAME, old, reason="registered before the mark", actor="t", force=True)

    assert promotion.is_committed(marked) and marked.is_champion

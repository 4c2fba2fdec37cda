"""An index change as a registry event (qpr.deltas.publish.register_deltas), on a real
(sqlite) MLflow registry: a delta becomes a promoted version that extends the champion's
base, `rollback` takes it out of what is served, and a rolled-back state is not promoted
again by the next refresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpr.deltas.add import add_questions, drop_delta
from qpr.deltas.publish import register_deltas
from qpr.ops import registry
from qpr.retrieval.bundle import Bundle
from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

NAME = "qpr-refresh-test"
METRICS = {"success_1": 0.5, "val": {"recip_rank": 0.6}}
NEW = "how do i return a parcel abroad"


def _served_ids(tmp: Path, question: str) -> list[int]:
    bundle_dir = registry.download_bundle(NAME, registry.CHAMPION, tmp)
    bundle = Bundle.load(bundle_dir)
    return [hit.question_id for hit in bundle.search(question, k=bundle.size).hits]


@pytest.fixture
def models(tmp_path: Path) -> Path:
    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    first = registry.register_bundle(models, METRICS, name=NAME, dedupe=False)
    registry.mark_committed(NAME, first.version, by="tests")
    registry.promote(NAME, first.version, reason="first", actor="tests")
    return models


def test_a_delta_is_a_version_and_rollback_takes_it_out(models: Path, tmp_path: Path) -> None:
    base = registry.champion(NAME)
    add_questions(
        models,
        __import__("pandas").DataFrame(
            {"question_id": [9001], "text": [NEW], "cluster_id": [-1], "answer_id": ["new"]}
        ),
    )
    info, said = register_deltas(models, name=NAME, actor="tests", reason="delta 1")
    assert said == "promoted" and info is not None and info.is_champion
    assert info.tag(registry.TAG_BASE) == base.tag(registry.TAG_BASE)
    assert json.loads(info.tag(registry.TAG_DELTAS))["deltas"] == [1]
    assert 9001 in _served_ids(tmp_path / "with", NEW)

    registry.rollback(NAME, reason="bad delta", actor="tests")
    assert registry.champion(NAME).version == base.version
    assert 9001 not in _served_ids(tmp_path / "without", NEW)
    again, said = register_deltas(models, name=NAME, actor="tests", reason="delta 1")
    assert again.version == info.version and "rolled back" in said
    assert registry.champion(NAME).version == base.version

    drop_delta(models, 1, reason="bad delta")
    after, said = register_deltas(models, name=NAME, actor="tests", reason="drop 1")
    assert said == "promoted" and after.version > info.version
    assert json.loads(after.tag(registry.TAG_DELTAS))["deltas"] == []


def test_a_champion_of_another_base_keeps_the_change_local(models: Path) -> None:
    (models / "index" / "bm25.npz").unlink(missing_ok=True)
    (models / "vocab.json").write_text((models / "vocab.json").read_text() + " ")
    info, said = register_deltas(models, name=NAME, actor="tests", reason="x")
    assert info is None and "another base" in said


def test_a_bundle_its_first_build_has_not_finished_is_not_registered(models: Path) -> None:
    """An add while the first retraining runs its evaluate stage: no search.json yet. The
    add is served; publishing says it registered nothing instead of failing the command."""
    from qpr.artifacts import SEARCH_FILE
    from qpr.config import settings_from_dict
    from qpr.deltas.publish import publish
    from tests.conftest import tiny_overrides

    (models / SEARCH_FILE).unlink()
    settings = settings_from_dict(tiny_overrides(models.parent, registry={"name": NAME}))

    out = publish(models, settings, actor="tests", reason="delta 1")

    assert out["registry"].startswith("not registered:") and SEARCH_FILE.name in out["registry"]

"""The deltas on disk (qpr.deltas.format): the manifest and its one writer, tombstones,
what a load refuses, what the registry and the service's source see, what a full build
indexes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qpr.artifacts import DELTA_QUESTIONS_FILE, DELTA_VECTORS_FILE, DELTAS_MANIFEST_FILE
from qpr.deltas.add import add_questions, compact, delete_questions
from qpr.deltas.format import (
    DeltaError,
    Manifest,
    dead_rows,
    delta_dir,
    ensure_manifest,
    for_full_build,
    manifest_update,
    read_manifest,
)
from qpr.retrieval.bundle import Bundle, BundleError

from .factories import LATER, MAIN, MAIN_IDS, flat, frame


def test_the_manifest_is_written_only_when_a_change_commits(tmp_path: Path) -> None:
    path = tmp_path / DELTAS_MANIFEST_FILE
    with manifest_update(tmp_path):
        pass  # nothing changed: nothing written
    assert not path.exists()
    with pytest.raises(RuntimeError), manifest_update(tmp_path) as manifest:
        manifest.version = 1
        raise RuntimeError("failed before the commit")
    assert not path.exists()
    with manifest_update(tmp_path) as manifest:
        manifest.version = 1
        manifest.tombstones.append([5, 1])
    assert read_manifest(tmp_path) == Manifest(version=1, tombstones=[[5, 1]])


def test_an_empty_manifest_is_created_once(tmp_path: Path) -> None:
    path = ensure_manifest(tmp_path)
    assert path == tmp_path / DELTAS_MANIFEST_FILE and read_manifest(tmp_path) == Manifest()
    with manifest_update(tmp_path) as manifest:
        manifest.version = 4
    assert ensure_manifest(tmp_path) == path and read_manifest(tmp_path).version == 4


def test_an_unreadable_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / DELTAS_MANIFEST_FILE).parent.mkdir()
    (tmp_path / DELTAS_MANIFEST_FILE).write_text('{"format": "other/9"}')
    with pytest.raises(DeltaError, match="other/9"):
        read_manifest(tmp_path)


def test_the_newest_tombstone_of_an_id_decides() -> None:
    qids = np.array([1, 2, 3, 1, 2], np.int64)
    versions = np.array([0, 0, 0, 2, 4], np.int64)
    # id 1 deleted at 1 (hides main), re-added at 2; id 2 hidden up to version 3
    stones = [[1, 1], [2, 3], [2, 1]]
    assert dead_rows(qids, versions, stones).tolist() == [True, True, False, False, False]
    assert not dead_rows(qids, versions, []).any()


def test_a_broken_delta_is_refused(models: Path) -> None:
    add_questions(models, frame(LATER[:3], [1, 2, 3]))
    table = models / delta_dir(1) / DELTA_QUESTIONS_FILE
    table.write_bytes(table.read_bytes()[:-10])
    with pytest.raises(BundleError, match="sha256"):
        Bundle.load(models)


def test_a_broken_delta_is_refused_while_serving_continues(models: Path) -> None:
    from fastapi.testclient import TestClient

    from qpr.serve.app import create_app
    from qpr.serve.reload import REFUSED, SWAPPED
    from qpr.serve.settings import ServeSettings
    from qpr.serve.sources import LocalSource

    settings = ServeSettings(poll_seconds=0, canaries=4, default_k=3, startup_wait=60)
    app = create_app(LocalSource(models), settings)
    reloader = app.state.service.reloader
    with TestClient(app) as client:
        first = client.get("/version").json()["model"]
        add_questions(models, frame(LATER[:3], [1, 2, 3]))
        assert reloader.check() == SWAPPED
        hit = client.post("/search", json={"question": LATER[1], "k": 1}).json()["hits"][0]
        assert hit["question_id"] == 2
        good = client.get("/version").json()["model"]
        assert good != first

        add_questions(models, frame(LATER[3:5], [4, 5]))
        vectors = models / delta_dir(2) / DELTA_VECTORS_FILE
        vectors.write_bytes(b"not an index")
        assert reloader.check() == REFUSED
        assert client.get("/version").json()["model"] == good
        response = client.post("/search", json={"question": LATER[1], "k": 1})
        assert response.status_code == 200 and response.json()["hits"][0]["question_id"] == 2


def test_the_source_watches_the_manifest(models: Path) -> None:
    from qpr.serve.sources import LocalSource

    source = LocalSource(models)
    token = source.poll().token
    add_questions(models, frame(LATER[:1], [1]))
    assert source.poll().token != token
    token = source.poll().token
    delete_questions(models, [1])
    assert source.poll().token != token


def test_the_registry_stores_the_deltas(models: Path) -> None:
    from qpr.ops.registry import bundle_files

    add_questions(models, frame(LATER[:1], [1]))
    files = {p.as_posix() for p in bundle_files(models)}
    assert {"deltas/deltas.json", "deltas/0001/vectors.faiss"} <= files


def test_a_full_build_takes_every_deltas_questions_less_the_tombstoned(models: Path) -> None:
    """for_full_build: the cluster stage's rows first, then the deltas' (absorbed or not);
    tombstones apply to both; a replaced row gives way to its replacement."""
    add_questions(models, frame(LATER[:2], [1, 2]))
    compact(models, flat)
    add_questions(models, frame([MAIN[0], LATER[2]], [MAIN_IDS[0], 3], "changed"))
    delete_questions(models, [MAIN_IDS[1], 2])
    clustered = pd.DataFrame(
        {"question_id": MAIN_IDS, "text": MAIN, "cluster_id": 7, "split": "train"}
    )
    built, version = for_full_build(models, clustered)
    assert version == read_manifest(models).version == 3
    rows = built.set_index("question_id")
    assert set(rows.index) == (set(MAIN_IDS) - {MAIN_IDS[1]}) | {1, 3}
    assert rows.index.is_unique
    assert rows.loc[MAIN_IDS[0], "answer_id"] == "changed"  # the replacement
    assert rows.loc[MAIN_IDS[2], "cluster_id"] == 7 and rows.loc[1, "cluster_id"] == -1
    untouched, none = for_full_build(models / "missing", clustered)
    assert none == 0 and untouched is clustered

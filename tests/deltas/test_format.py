"""The deltas on disk (qpr.deltas.format): the manifest and its one writer, tombstones,
what a load refuses, a delta that fails its check left out alone, what the registry and
the service's source see, what a full build indexes."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import pytest

from qpr.artifacts import (
    DELTA_IDS_FILE,
    DELTA_QUESTIONS_FILE,
    DELTA_VECTORS_FILE,
    DELTAS_MANIFEST_FILE,
)
from qpr.deltas.add import add_questions, compact, delete_questions
from qpr.deltas.format import (
    DeltaError,
    Manifest,
    check_deltas,
    dead_rows,
    delta_dir,
    delta_sha256,
    ensure_manifest,
    for_full_build,
    manifest_update,
    read_manifest,
)
from qpr.retrieval.bundle import Bundle

from .factories import LATER, MAIN, MAIN_IDS, flat, frame, ids


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
    # entries edited by hand fail once, here, not in each reader
    good = Manifest(version=1, deltas=[{"number": 1, "version": 1, "rows": 2, "sha256": "ab"}])
    for broken in ({"number": 1, "version": 1, "rows": 2}, {**good.deltas[0], "rows": "two"}):
        payload = {**good.as_dict(), "deltas": [broken]}
        (tmp_path / DELTAS_MANIFEST_FILE).write_text(json.dumps(payload))
        with pytest.raises(DeltaError, match="not a readable deltas manifest"):
            read_manifest(tmp_path)
    stones = {**good.as_dict(), "tombstones": [[5]]}
    (tmp_path / DELTAS_MANIFEST_FILE).write_text(json.dumps(stones))
    with pytest.raises(DeltaError, match=r"tombstone \[5\]"):
        read_manifest(tmp_path)
    (tmp_path / DELTAS_MANIFEST_FILE).write_text(json.dumps(good.as_dict()))
    assert read_manifest(tmp_path) == good


def test_the_newest_tombstone_of_an_id_decides() -> None:
    qids = np.array([1, 2, 3, 1, 2], np.int64)
    versions = np.array([0, 0, 0, 2, 4], np.int64)
    # id 1 deleted at 1 (hides main), re-added at 2; id 2 hidden up to version 3
    stones = [[1, 1], [2, 3], [2, 1]]
    assert dead_rows(qids, versions, stones).tolist() == [True, True, False, False, False]
    assert not dead_rows(qids, versions, []).any()


def _nan_vectors(folder: Path) -> None:
    """Vectors that are not finite, the manifest's sha256 made to match (a bad encoder)."""
    flat_index = faiss.read_index(str(folder / DELTA_VECTORS_FILE))
    vectors = flat_index.reconstruct_n(0, flat_index.ntotal)
    vectors[0, 0] = np.nan
    bad = faiss.IndexFlatL2(vectors.shape[1])
    bad.add(vectors)
    faiss.write_index(bad, str(folder / DELTA_VECTORS_FILE))
    _reseal(folder)


def _narrow_vectors(folder: Path) -> None:
    """Vectors of another width, the manifest's sha256 made to match."""
    narrow = faiss.IndexFlatL2(3)
    narrow.add(np.ones((2, 3), np.float32))
    faiss.write_index(narrow, str(folder / DELTA_VECTORS_FILE))
    _reseal(folder)


def _reseal(folder: Path) -> None:
    with manifest_update(folder.parents[1]) as manifest:
        entry = next(d for d in manifest.deltas if int(d["number"]) == int(folder.name))
        entry["sha256"] = delta_sha256(folder)


def _wrong_rows(folder: Path) -> None:
    with manifest_update(folder.parents[1]) as manifest:
        manifest.deltas[1]["rows"] = 5


def _truncated(folder: Path) -> None:
    table = folder / DELTA_QUESTIONS_FILE
    table.write_bytes(table.read_bytes()[:-10])


# How a delta breaks, and words of the reason its check gives.
BREAKS = {
    "truncated": (_truncated, "differ from the sha256"),
    "missing": (lambda f: (f / DELTA_IDS_FILE).unlink(), "ids.npy missing"),
    "garbage": (lambda f: (f / DELTA_VECTORS_FILE).write_bytes(b"not an index"), "sha256"),
    "rows": (_wrong_rows, "the manifest records 5"),
    "nan": (_nan_vectors, "non-finite vectors"),
    "width": (_narrow_vectors, "3-d vectors, the main index holds 8-d"),
}


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_delta_that_fails_its_check_fails_alone(models: Path, broken: str) -> None:
    """The main index and the other deltas serve; the bad delta is named, and the row its
    add replaced serves again (its tombstone goes with it, as a drop would lift it)."""
    add_questions(models, frame(LATER[:2], [1, 2]))
    add_questions(models, frame([LATER[2], MAIN[0]], [3, MAIN_IDS[0]], "bad"))
    add_questions(models, frame(LATER[4:6], [5, 6]))
    corrupt, words = BREAKS[broken]
    corrupt(models / delta_dir(2))

    bundle = Bundle.load(models)
    assert list(bundle.failed_deltas) == [2] and words in bundle.failed_deltas[2]
    assert bundle.failed_deltas[2].startswith("deltas/0002")  # relative: fit to show
    assert check_deltas(models) == bundle.failed_deltas
    assert bundle.size == len(MAIN) + 4
    for text, qid in [(LATER[0], 1), (LATER[5], 6), (MAIN[3], MAIN_IDS[3])]:
        assert ids(bundle, text, 1) == [qid]
    assert 3 not in ids(bundle, LATER[2], bundle.size)
    hit = bundle.search(MAIN[0], k=1).hits[0]
    assert (hit.question_id, hit.answer_id) == (MAIN_IDS[0], f"a{MAIN_IDS[0]}")


def test_a_broken_delta_is_left_out_while_serving_continues(models: Path) -> None:
    from fastapi.testclient import TestClient

    from qpr.serve.app import create_app
    from qpr.serve.reload import SWAPPED
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
        assert hit["question_id"] == "2"  # as JSON writes ids: a string
        good = client.get("/version").json()["model"]
        assert good != first and good["failed_deltas"] == []

        add_questions(models, frame(LATER[3:5], [4, 5]))
        vectors = models / delta_dir(2) / DELTA_VECTORS_FILE
        vectors.write_bytes(b"not an index")
        assert reloader.check() == SWAPPED  # the main index and delta 1 serve on
        model = client.get("/version").json()["model"]
        assert [d["delta"] for d in model["failed_deltas"]] == [2]
        for question, qid in [(LATER[1], 2), (MAIN[4], MAIN_IDS[4])]:
            response = client.post("/search", json={"question": question, "k": 1})
            assert response.status_code == 200
            assert response.json()["hits"][0]["question_id"] == str(qid)
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert "qpr index drop 2" in ready.json()["degraded"]
        assert ready.json()["failed_deltas"][0]["delta"] == 2
        assert "qpr_model_failed_deltas 1.0" in client.get("/metrics").text.splitlines()


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

"""Index deltas, tombstones and compaction (qpr.retrieval.deltas), as Bundle serves them.

The fixture is a pipeline-shaped bundle (random-weight CNN → ONNX → FAISS Flat, BM25
fused in); the deltas are added with the library, as `qpr index add` adds them.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qpr.artifacts import (
    BM25_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.retrieval import deltas
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.text.vocab import Vocabulary

MAX_LEN = 16
VERBS = ("install", "reset", "update", "clean", "paint", "sell", "insure", "move")
OBJECTS = ("printer", "garden", "bicycle", "laptop", "house", "boat", "piano", "car")
ALL = [
    t.format(v=v, o=o)
    for v, o, t in itertools.product(
        VERBS, OBJECTS, ("how do i {v} my {o}", "what is the best way to {v} a {o}?")
    )
]
# The main index holds the first 96; later questions arrive as deltas.
MAIN, LATER = ALL[:96], ALL[96:]
MAIN_IDS = [1000 + 3 * i for i in range(len(MAIN))]
FLAT = IndexConfig("Flat", nprobe=1, use_gpu=False)


def _config(fused: bool) -> SearchConfig:
    if not fused:
        return SearchConfig(threshold=1e-3, target_precision=0.9)
    return SearchConfig(
        threshold=1e-3,
        target_precision=0.9,
        dense_weight=0.5,
        lexical_candidates=20,
        dense_candidates=10,
    )


def _write_index(models: Path, texts: list[str], qids: list[int]) -> None:
    """The index stage's files for these questions (Flat, BM25 over them)."""
    vocab = Vocabulary.load(models / VOCAB_FILE)
    vectors = encode(load_session(models / ENCODER_FILE), vocab, texts, max_len=MAX_LEN)
    save_index(build_index(vectors, FLAT, seed=0, log=lambda _: None), models / INDEX_FILE)
    IdMap(np.asarray(qids, np.int64)).save(models / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(qids, pa.int64()),
            "text": pa.array(texts, pa.string()),
            "cluster_id": pa.array([-1] * len(texts), pa.int64()),
            "answer_id": pa.array([f"a{q}" for q in qids], pa.string()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    BM25Index.build(texts, stemmer="english").save(models / BM25_FILE)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from qpr.model import CNNEncoder
    from qpr.model.onnx import export_onnx

    models = tmp_path_factory.mktemp("models")
    vocab = Vocabulary.build(ALL, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=8)
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )
    _write_index(models, MAIN, MAIN_IDS)
    _config(True).write(models)
    return models


@pytest.fixture
def models(base_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base_dir, tmp_path / "models"))


def _frame(texts: list[str], ids: list[int], answer: str = "new") -> pd.DataFrame:
    return pd.DataFrame({"question_id": ids, "text": texts, "cluster_id": -1, "answer_id": answer})


def _ids(bundle: Bundle, question: str, k: int) -> list[int]:
    return [hit.question_id for hit in bundle.search(question, k=k).hits]


def test_a_deltas_questions_are_found_without_retraining(models: Path) -> None:
    before = Bundle.load(models)
    entry = deltas.add_questions(models, _frame(LATER[:10], list(range(1, 11))))
    bundle = Bundle.load(models)
    assert bundle.size == before.size + 10 and entry["rows"] == 10
    assert bundle.fingerprint != before.fingerprint
    for i, text in enumerate(LATER[:10]):
        hit = bundle.search(text, k=3).hits[0]
        assert (hit.question_id, hit.answer_id, hit.distance) == (i + 1, "new", 0.0)
    # a reworded question still finds its delta question (BM25 on main's words + dense)
    reworded = LATER[0].replace("how do i", "how can i").replace("?", "")
    assert 1 in _ids(bundle, reworded, k=5)
    # batches, explanations and dense-only search see the delta too
    batch = bundle.search_batch(LATER[:10], k=1)
    assert [r.hits[0].question_id for r in batch] == list(range(1, 11))
    assert bundle.search(LATER[3], k=2, explain=True).hits[0].explain is not None


def test_bm25_drift_is_measured(models: Path) -> None:
    entry = deltas.add_questions(
        models, _frame(["how do i varnish my canoe", "how do i sell my car"], [1, 2])
    )
    # "varnish" and "canoe" are unknown to the main vocabulary: they score nothing
    assert (entry["unknown_terms"], entry["unknown_tokens"]) == (2, 2)
    assert entry["tokens"] > entry["unknown_tokens"]


def test_a_tombstoned_question_never_comes_back(models: Path) -> None:
    deltas.add_questions(models, _frame(LATER[:4], [1, 2, 3, 4]))
    out = deltas.delete_questions(models, [MAIN_IDS[5], 2, 999_999])
    assert out["deleted"] == [2, MAIN_IDS[5]] and out["unknown"] == [999_999]
    bundle = Bundle.load(models)
    everything = bundle.size
    for text in (MAIN[5], LATER[1]):
        assert not {MAIN_IDS[5], 2} & set(_ids(bundle, text, everything))
        (result,) = bundle.search_batch([text], k=everything, explain=True)
        assert not {MAIN_IDS[5], 2} & {hit.question_id for hit in result.hits}
        assert len(result.hits) == everything  # the dead rows leave no hole
    dense = bundle.with_questions(_questions_of(bundle), dense_only=True)
    assert not {MAIN_IDS[5], 2} & set(_ids(dense, MAIN[5], 20))


def _questions_of(bundle: Bundle):
    """The loaded rows, dead mask included, without BM25 (a dense-only search)."""
    from qpr.retrieval.bundle import IndexedQuestions

    return IndexedQuestions(
        bundle._index,
        bundle._qids,
        bundle._texts,
        bundle._cluster_ids,
        None,
        bundle._answer_ids,
        dead=None if bundle._live_rows is None else ~bundle._live_rows,
    )


def test_a_changed_answer_replaces_the_old_row(models: Path) -> None:
    deltas.add_questions(models, _frame([MAIN[7]], [MAIN_IDS[7]], answer="changed"))
    bundle = Bundle.load(models)
    hits = [h for h in bundle.search(MAIN[7], k=bundle.size).hits if h.question_id == MAIN_IDS[7]]
    assert len(hits) == 1 and hits[0].answer_id == "changed"
    assert bundle.size == len(MAIN)


@pytest.mark.parametrize("fused", [False, True])
def test_compaction_equals_a_full_build(models: Path, tmp_path: Path, fused: bool) -> None:
    _config(fused).write(models)
    deltas.add_questions(models, _frame(LATER[:16], list(range(1, 17))))
    deltas.delete_questions(models, [MAIN_IDS[0], 3])
    deltas.add_questions(models, _frame(LATER[16:24], list(range(17, 25))))
    live = deltas.live_questions(models)
    with_deltas = Bundle.load(models)
    queries = [*MAIN[::7], *LATER[:24:3], "clean the bicycle", "sell boat"]
    served = [_ids(with_deltas, q, 5) for q in queries]

    full = Path(shutil.copytree(models, tmp_path / "full"))
    shutil.rmtree(full / "index")
    shutil.rmtree(full / deltas.DELTAS_DIR)
    (full / "index").mkdir()
    _write_index(full, live["text"].tolist(), live["question_id"].tolist())
    out = deltas.compact(models, lambda v: build_index(v, FLAT, seed=0, log=lambda _: None))
    assert out == {
        "questions": len(live),
        "deltas_merged": 2,
        "tombstones_applied": 2,
        "version": 3,
    }
    # The manifest stays (a full build needs the deltas again); loads skip what is absorbed.
    assert deltas.absorbed_version(models) == deltas.read_manifest(models).version == 3
    assert deltas.delta_files(models) == [deltas.ABSORBED_FILE, deltas.MANIFEST_FILE]
    compacted, rebuilt = Bundle.load(models), Bundle.load(full)
    assert compacted.size == rebuilt.size == with_deltas.size
    assert [_ids(compacted, q, 5) for q in queries] == [_ids(rebuilt, q, 5) for q in queries]
    if not fused:  # the same exact distances before and after; fused: IDF is recomputed
        assert [_ids(compacted, q, 5) for q in queries] == served


def test_a_broken_delta_is_refused(models: Path) -> None:
    deltas.add_questions(models, _frame(LATER[:3], [1, 2, 3]))
    table = models / deltas.delta_dir(1) / "questions.parquet"
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
        deltas.add_questions(models, _frame(LATER[:3], [1, 2, 3]))
        assert reloader.check() == SWAPPED
        hit = client.post("/search", json={"question": LATER[1], "k": 1}).json()["hits"][0]
        assert hit["question_id"] == 2
        good = client.get("/version").json()["model"]
        assert good != first

        deltas.add_questions(models, _frame(LATER[3:5], [4, 5]))
        vectors = models / deltas.delta_dir(2) / "vectors.faiss"
        vectors.write_bytes(b"not an index")
        assert reloader.check() == REFUSED
        assert client.get("/version").json()["model"] == good
        response = client.post("/search", json={"question": LATER[1], "k": 1})
        assert response.status_code == 200 and response.json()["hits"][0]["question_id"] == 2


def _state(models: Path) -> tuple[str, list[list[int]]]:
    bundle = Bundle.load(models)
    return bundle.fingerprint, [_ids(bundle, q, 3) for q in (MAIN[1], LATER[0], LATER[5])]


def test_an_add_that_fails_before_its_commit_changes_nothing(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deltas.add_questions(models, _frame(LATER[:3], [1, 2, 3]))
    before = _state(models)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(deltas, "write_json_atomic", crash)
    with pytest.raises(OSError, match="disk full"):
        deltas.add_questions(models, _frame(LATER[3:8], [4, 5, 6, 7, 8]))
    assert (models / deltas.delta_dir(2)).is_dir()  # written, but named by no manifest
    assert _state(models) == before
    monkeypatch.undo()
    deltas.add_questions(models, _frame(LATER[3:8], [4, 5, 6, 7, 8]))
    assert 5 in _ids(Bundle.load(models), LATER[4], 1)


def test_a_killed_add_leaves_the_served_state_unchanged(models: Path) -> None:
    before = _state(models)
    # SIGKILL at the commit point: the delta folder is renamed, the manifest not written
    script = f"""
import os, signal
import pandas as pd
from qpr.retrieval import deltas
deltas.write_json_atomic = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
frame = pd.DataFrame({{"question_id": [1, 2], "text": {LATER[:2]!r}, "cluster_id": -1}})
deltas.add_questions({str(models)!r}, frame)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, check=False)
    assert done.returncode == -signal.SIGKILL
    assert (models / deltas.DELTAS_DIR).is_dir()
    assert _state(models) == before
    assert json.loads(json.dumps(deltas.read_manifest(models).as_dict()))["deltas"] == []


def test_the_source_watches_the_manifest(models: Path) -> None:
    from qpr.serve.sources import LocalSource

    source = LocalSource(models)
    token = source.poll().token
    deltas.add_questions(models, _frame(LATER[:1], [1]))
    assert source.poll().token != token
    token = source.poll().token
    deltas.delete_questions(models, [1])
    assert source.poll().token != token


def test_the_registry_stores_the_deltas(models: Path) -> None:
    from qpr.ops.registry import bundle_files

    deltas.add_questions(models, _frame(LATER[:1], [1]))
    files = {p.as_posix() for p in bundle_files(models)}
    assert {"deltas/deltas.json", "deltas/0001/vectors.faiss"} <= files


def test_filters_see_deltas_tombstones_and_survive_compaction(models: Path) -> None:
    """A filter field of the main index: a delta's rows are null (no filter matches
    them), a tombstone hides a matching row, and compaction keeps the field."""
    locale = ["en" if i % 2 == 0 else "de" for i in range(len(MAIN))]
    table = pq.read_table(models / QUESTIONS_FILE)
    pq.write_table(
        table.append_column("locale", pa.array(locale, pa.string())), models / QUESTIONS_FILE
    )
    deltas.add_questions(models, _frame(LATER[:4], [1, 2, 3, 4]))
    deltas.delete_questions(models, [MAIN_IDS[0]])
    english = {q for q, lang in zip(MAIN_IDS, locale, strict=True) if lang == "en"} - {MAIN_IDS[0]}

    def found(bundle: Bundle) -> set[int]:
        (result,) = bundle.search_batch([LATER[0]], k=bundle.size, filters={"locale": "en"})
        return {hit.question_id for hit in result.hits}

    bundle = Bundle.load(models)
    assert found(bundle) == english  # no delta row, not the tombstoned one
    by_answer = bundle.search(LATER[0], k=bundle.size, filters={"answer_id": "new"})
    assert {hit.question_id for hit in by_answer.hits} == {1, 2, 3, 4}
    deltas.compact(models, lambda v: build_index(v, FLAT, seed=0, log=lambda _: None))
    assert found(Bundle.load(models)) == english


def test_dropping_a_delta_undoes_its_add(models: Path) -> None:
    """The dropped delta's questions go, the rows it replaced come back, a later delta
    stays, and its number is never given again."""
    deltas.add_questions(models, _frame([*LATER[:2], MAIN[2]], [1, 2, MAIN_IDS[2]], "bad"))
    deltas.add_questions(models, _frame(LATER[2:4], [3, 4]))
    bundle = Bundle.load(models)
    assert bundle.search(MAIN[2], k=1).hits[0].answer_id == "bad"

    out = deltas.drop_delta(models, 1, reason="wrong answers")
    assert out == {"dropped": 1, "questions": 3, "tombstones_lifted": 1, "version": 3}
    assert not (models / deltas.delta_dir(1)).exists()
    live = deltas.live_questions(models).set_index("question_id")
    assert {1, 2}.isdisjoint(live.index) and {3, 4} <= set(live.index)
    assert live.loc[MAIN_IDS[2], "answer_id"] == f"a{MAIN_IDS[2]}"
    bundle = Bundle.load(models)
    assert bundle.search(MAIN[2], k=1).hits[0].answer_id == f"a{MAIN_IDS[2]}"
    assert bundle.search(LATER[0], k=1).hits[0].question_id not in (1, 2)
    assert deltas.add_questions(models, _frame(LATER[4:5], [5]))["number"] == 3
    assert deltas.read_manifest(models).dropped[0]["reason"] == "wrong answers"
    with pytest.raises(deltas.DeltaError, match="no delta 1"):
        deltas.drop_delta(models, 1)


def test_a_compacted_delta_cannot_be_dropped_and_later_ones_still_load(models: Path) -> None:
    deltas.add_questions(models, _frame(LATER[:2], [1, 2]))
    deltas.compact(models, lambda v: build_index(v, FLAT, seed=0, log=lambda _: None))
    with pytest.raises(deltas.DeltaError, match="main index"):
        deltas.drop_delta(models, 1)
    deltas.add_questions(models, _frame(LATER[2:3], [3]))
    deltas.delete_questions(models, [1])
    bundle = Bundle.load(models)
    assert bundle.size == len(MAIN) + 2  # main (with 1 and 2) + 3, less the deleted 1
    live = set(deltas.live_questions(models)["question_id"])
    assert live == set(MAIN_IDS) | {2, 3}
    assert _ids(bundle, LATER[2], 1) == [3]
    assert 1 not in _ids(bundle, LATER[0], bundle.size)


def test_a_full_build_takes_every_deltas_questions_less_the_tombstoned(models: Path) -> None:
    """for_full_build: the cluster stage's rows first, then the deltas' (absorbed or not);
    tombstones apply to both; a replaced row gives way to its replacement."""
    deltas.add_questions(models, _frame(LATER[:2], [1, 2]))
    deltas.compact(models, lambda v: build_index(v, FLAT, seed=0, log=lambda _: None))
    deltas.add_questions(models, _frame([MAIN[0], LATER[2]], [MAIN_IDS[0], 3], "changed"))
    deltas.delete_questions(models, [MAIN_IDS[1], 2])
    clustered = pd.DataFrame(
        {"question_id": MAIN_IDS, "text": MAIN, "cluster_id": 7, "split": "train"}
    )
    built, version = deltas.for_full_build(models, clustered)
    assert version == deltas.read_manifest(models).version == 3
    rows = built.set_index("question_id")
    assert set(rows.index) == (set(MAIN_IDS) - {MAIN_IDS[1]}) | {1, 3}
    assert rows.index.is_unique
    assert rows.loc[MAIN_IDS[0], "answer_id"] == "changed"  # the replacement
    assert rows.loc[MAIN_IDS[2], "cluster_id"] == 7 and rows.loc[1, "cluster_id"] == -1
    untouched, none = deltas.for_full_build(models / "missing", clustered)
    assert none == 0 and untouched is clustered

"""The index stage keeps its last encoding: an index rebuilt with other settings and the
same encoder reuses the vectors; another encoder or other questions encode again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


def test_index_settings_change_reuses_the_encoding(tmp_path: Path, tiny_settings) -> None:
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.handoff import read_cluster_outputs
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train

    quiet = lambda _: None  # noqa: E731
    paths = ProjectPaths(tmp_path)
    settings = tiny_settings
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )
    run_train(settings, paths, progress=False, log=quiet)
    run_export(settings, paths, log=quiet)
    first = run_index(settings, paths, log=quiet)
    assert first["vectors_reused"] == 0
    _assert_hits_carry_the_logged_answers(settings, paths)
    vectors = paths.index_cache_dir / "vectors"
    cached = sorted(vectors.glob("*.npy"))
    assert [p.name.split("-")[0] for p in cached] == ["questions"]
    texts = read_cluster_outputs(paths)[0]["text"].tolist()
    assert np.load(cached[0]).shape[0] == len(texts)
    # The question shards and BM25 counts are gone once the stage is done.
    assert [p.name for p in paths.index_cache_dir.iterdir()] == ["vectors"]

    # Another index (exact search, BM25 on): the same vectors, not encoded again.
    other = settings.model_copy(
        update={
            "index": settings.index.model_copy(
                update={
                    "factory": "Flat",
                    "lexical": settings.index.lexical.model_copy(update={"enabled": True}),
                }
            )
        }
    )
    lines: list[str] = []
    second = run_index(other, paths, log=lines.append)
    assert second["vectors_reused"] == 1
    assert any(line.startswith("vectors of the") and "reused" in line for line in lines)
    assert second["encode_seconds"] == first["encode_seconds"]
    assert (paths.index_dir / "bm25.npz").is_file()

    # A cached file that does not match its key is never read: another encoder (a changed
    # ONNX file) encodes again and keeps only its own encoding.
    import onnx

    original = paths.encoder_onnx.read_bytes()
    model = onnx.load(str(paths.encoder_onnx))
    note = model.metadata_props.add()
    note.key, note.value = "note", "another file, same function"
    onnx.save(model, str(paths.encoder_onnx))
    lines.clear()
    try:
        third = run_index(settings, paths, log=lines.append)
    finally:
        paths.encoder_onnx.write_bytes(original)
    assert third["vectors_reused"] == 0
    assert not any("reused" in line for line in lines)
    now = sorted(vectors.glob("*.npy"))
    assert len(now) == 1 and now != cached  # one encoding kept: the new one
    assert np.isfinite(np.load(now[0])).all()


def test_shards_build_the_index_of_the_whole(tmp_path: Path, tiny_settings) -> None:
    """Questions in shards of 300: the same BM25 and index as one shard of all of them."""
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train
    from qpr.retrieval.dense import load_index, search

    quiet = lambda _: None  # noqa: E731
    paths = ProjectPaths(tmp_path)
    run_cluster(
        tiny_settings, out_dir=paths.cluster_dir, report_dir=tmp_path / "reports", log=quiet
    )
    run_train(tiny_settings, paths, progress=False, log=quiet)
    run_export(tiny_settings, paths, log=quiet)
    whole = run_index(tiny_settings, paths, log=quiet)
    kept = {p.name: p.read_bytes() for p in paths.index_dir.iterdir()}
    sharded = tiny_settings.model_copy(
        update={"index": tiny_settings.index.model_copy(update={"shard_rows": 300})}
    )
    parts = run_index(sharded, paths, log=quiet)
    assert parts["questions"] == whole["questions"] > 300
    assert (paths.index_dir / "bm25.npz").read_bytes() == kept["bm25.npz"]
    a = load_index(paths.index_dir / "index.faiss", nprobe=8)
    probe = np.random.default_rng(1).standard_normal((20, a.d)).astype(np.float32)
    b_path = tmp_path / "whole.faiss"
    b_path.write_bytes(kept["index.faiss"])
    b = load_index(b_path, nprobe=8)
    for x, y in zip(search(a, probe, 5), search(b, probe, 5), strict=True):
        np.testing.assert_array_equal(x, y)


def _assert_hits_carry_the_logged_answers(settings, paths) -> None:
    """Each hit's answer_id is the answer the logs gave its question (by normalised text:
    the cluster stage joins a question's logged forms)."""
    from qpr.artifacts import SearchConfig
    from qpr.data.loaders import read_logs
    from qpr.retrieval.bundle import Bundle
    from qpr.text.normalize import normalize

    logs = read_logs(Path(settings.data.path))
    logged: dict[str, set[str]] = {}
    for question, answer in zip(logs["question"], logs["answer_id"], strict=True):
        logged.setdefault(normalize(str(question)), set()).add(answer)
    SearchConfig().write(paths.models_dir)  # the evaluate stage's file, not run here
    bundle = Bundle.load(paths.models_dir)
    asked = logs["question"].drop_duplicates().head(20).tolist()
    hits = [hit for result in bundle.search_batch(asked, k=3) for hit in result.hits]
    assert hits and all(hit.answer_id in logged[normalize(hit.text)] for hit in hits)


def test_quora_answer_ids_are_the_smallest_qid_of_the_cluster(tmp_path: Path) -> None:
    from qpr.paths import ProjectPaths
    from qpr.pipeline.index import with_answer_ids

    questions = pd.DataFrame(
        {"question_id": [7, 3, 5, 9], "text": list("abcd"), "cluster_id": [3, 3, -1, 3]}
    )
    got = with_answer_ids(questions, ProjectPaths(tmp_path), "quora")  # no clusters read
    assert got["answer_id"].tolist() == ["3", "3", "5", "3"]


def test_filter_fields_reach_the_bundle(tmp_path: Path, tiny_settings) -> None:
    """A log column named in data.filter_fields goes through the cluster stage into the
    bundle's question table, and a filtered search returns only its questions."""
    import json
    import zlib

    from qpr.artifacts import SearchConfig
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train
    from qpr.retrieval.bundle import Bundle
    from qpr.text.normalize import normalize

    def locale_of(question: str) -> str:
        return ("en", "de", "fr")[zlib.crc32(normalize(question).encode()) % 3]

    for file in Path(tiny_settings.data.path).glob("*.jsonl"):
        lines = []
        for line in file.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                lines.append(line)  # the synthetic logs' malformed lines stay malformed
                continue
            if isinstance(row, dict):
                row["locale"] = locale_of(str(row.get("question")))
            lines.append(json.dumps(row))
        file.write_text("\n".join(lines) + "\n")
    settings = tiny_settings.model_copy(
        update={"data": tiny_settings.data.model_copy(update={"filter_fields": ("locale",)})}
    )
    quiet = lambda _: None  # noqa: E731
    paths = ProjectPaths(tmp_path)
    run_cluster(settings, out_dir=paths.cluster_dir, report_dir=tmp_path / "reports", log=quiet)
    run_train(settings, paths, progress=False, log=quiet)
    run_export(settings, paths, log=quiet)
    run_index(settings, paths, log=quiet)
    table = pd.read_parquet(paths.index_dir / "questions.parquet")
    assert table["locale"].tolist() == [locale_of(t) for t in table["text"]]
    SearchConfig().write(paths.models_dir)  # the evaluate stage's file, not run here
    bundle = Bundle.load(paths.models_dir)
    assert bundle.filter_fields == ("answer_id", "locale")
    hits = bundle.search(table["text"].iloc[0], 10, filters={"locale": ["de", "fr"]}).hits
    assert hits and all(locale_of(h.text) in ("de", "fr") for h in hits)


@contextmanager
def _held_elsewhere(models_dir: Path) -> Iterator[None]:
    """The writer lock of `models_dir` held by another thread for the block."""
    from qpr.deltas.lock import writer_lock

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer_lock(models_dir):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join()


def test_a_full_build_absorbs_the_deltas(
    tmp_path: Path, tiny_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index stage indexes the deltas' questions less the tombstoned ones, records the
    manifest version it holds, and serves the same questions and answers as before. It
    holds the writer lock: while another writer does, it stops with WriterBusy."""
    from qpr.artifacts import SearchConfig
    from qpr.deltas.add import add_questions, delete_questions
    from qpr.deltas.format import absorbed_version, live_questions, read_manifest
    from qpr.deltas.lock import WAIT_ENV, WriterBusy
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train
    from qpr.retrieval.bundle import Bundle

    quiet = lambda _: None  # noqa: E731
    paths = ProjectPaths(tmp_path)
    run_cluster(
        tiny_settings,
        out_dir=paths.cluster_dir,
        report_dir=paths.gate_reports("cluster"),
        log=quiet,
    )
    run_train(tiny_settings, paths, progress=False, log=quiet)
    run_export(tiny_settings, paths, log=quiet)
    first = run_index(tiny_settings, paths, log=quiet)
    assert first["deltas_version"] == 0 and read_manifest(paths.models_dir).version == 0
    SearchConfig().write(paths.models_dir)
    served = live_questions(paths.models_dir)
    changed, gone = served["question_id"].iloc[0], served["question_id"].iloc[1]
    new = pd.DataFrame(
        {
            "question_id": [changed, 42],
            "text": [served["text"].iloc[0], "how do i grow tomatoes on a balcony"],
            "cluster_id": -1,
            "answer_id": ["changed", "balcony"],
        }
    )
    add_questions(paths.models_dir, new)
    delete_questions(paths.models_dir, [gone])
    before = live_questions(paths.models_dir).set_index("question_id")
    # Another writer holds the models folder: the stage waits, then stops with nothing done.
    with _held_elsewhere(paths.models_dir), pytest.raises(WriterBusy, match=r"^busy: "):
        monkeypatch.setenv(WAIT_ENV, "0.1")
        run_index(tiny_settings, paths, log=quiet)
    monkeypatch.delenv(WAIT_ENV)
    assert absorbed_version(paths.models_dir) == 0

    second = run_index(tiny_settings, paths, log=quiet)
    assert second["deltas_version"] == absorbed_version(paths.models_dir) == 2
    # one question added, one deleted
    assert second["questions"] == first["questions"] == second["questions_clustered"]
    after = live_questions(paths.models_dir).set_index("question_id")
    assert (after["version"] == 0).all()  # every row in the main index, no delta loaded
    assert sorted(after.index) == sorted(before.index)
    assert after.loc[changed, "answer_id"] == "changed" and gone not in after.index
    bundle = Bundle.load(paths.models_dir)
    assert bundle.size == len(after)
    assert bundle.search("how do i grow tomatoes on a balcony", k=1).hits[0].question_id == 42

"""The sharded indexer: the same index and BM25 as the in-memory path, resumable, atomic."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import pytest

from qpr.artifacts import ENCODER_FILE, VOCAB_FILE
from qpr.data.scale import ScaleSpec, write_scale_corpus
from qpr.retrieval import indexer as indexer_module
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.dense import (
    IndexConfig,
    VectorShards,
    build_index,
    build_index_from_shards,
    search,
)
from qpr.retrieval.encoders import encode, load_session, onnx_max_len
from qpr.retrieval.indexer import EncodeTask, Indexer, LexicalConfig, encode_shard
from qpr.text import load_tokenizer
from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

QUIET = lambda _: None  # noqa: E731


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "models", QUESTIONS, QIDS)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    spec = ScaleSpec(3_000, seed=5, shard_rows=1_100)
    return write_scale_corpus(spec, tmp_path_factory.mktemp("corpus"), log=QUIET)


def texts_of(shards: list[Path]) -> list[str]:
    return pd.concat([pd.read_parquet(p) for p in shards])["question"].tolist()


def onnx_vectors(models: Path, texts: list[str]) -> np.ndarray:
    session = load_session(models / ENCODER_FILE)
    vocab = load_tokenizer(models / VOCAB_FILE)
    return encode(session, vocab, texts, max_len=onnx_max_len(session))


def make(models: Path, work: Path, factory: str = "Flat", **kwargs) -> Indexer:
    return Indexer(
        config=IndexConfig(factory, nprobe=8, use_gpu=False),
        encoder=models / ENCODER_FILE,
        vocab=models / VOCAB_FILE,
        work_dir=work,
        lexical=LexicalConfig(stemmer="english"),
        **kwargs,
    )


def test_onnx_shards_are_the_onnx_vectors(models: Path, shards: list[Path], tmp_path: Path) -> None:
    files = make(models, tmp_path, fold=False, threads=1).encode(shards, log=QUIET)
    mine = np.concatenate([np.load(f) for f in files])
    np.testing.assert_allclose(mine, onnx_vectors(models, texts_of(shards)), rtol=0, atol=1e-6)


def test_folded_shards_match_onnx(models: Path, shards: list[Path], tmp_path: Path) -> None:
    files = make(models, tmp_path, fold=True, threads=2).encode(shards, log=QUIET)
    mine = np.concatenate([np.load(f) for f in files])
    reference = onnx_vectors(models, texts_of(shards))
    assert np.abs(mine - reference).max() <= 1e-4 * np.abs(reference).max()


def test_index_and_bm25_equal_the_in_memory_build(
    models: Path, shards: list[Path], tmp_path: Path
) -> None:
    indexer = make(models, tmp_path, "IVF16,Flat", fold=False)
    made = indexer.index(shards, log=QUIET)
    # FAISS's tasks give the bytes of the one-process build over the same vector files.
    one_process = build_index_from_shards(
        VectorShards(indexer.vector_files(shards)), indexer.config, seed=13, log=QUIET
    )
    assert (
        faiss.serialize_index(made.index).tobytes() == faiss.serialize_index(one_process).tobytes()
    )
    texts = texts_of(shards)
    vectors = onnx_vectors(models, texts)
    whole = build_index(
        vectors, IndexConfig("IVF16,Flat", nprobe=8, use_gpu=False), seed=13, log=QUIET
    )
    assert made.rows == made.index.ntotal == len(texts)
    queries = vectors[::97]
    for a, b in zip(search(made.index, queries, 10), search(whole, queries, 10), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # vectors equal to 1e-6
    expected = BM25Index.build(texts, k1=0.9, b=0.75, stemmer="english")
    assert made.bm25 is not None and made.bm25.terms == expected.terms
    np.testing.assert_array_equal(made.bm25.rows, expected.rows)
    np.testing.assert_array_equal(made.bm25.weights, expected.weights)


def test_chars_shards_counted_apart_equal_the_in_memory_build(
    models: Path, shards: list[Path], tmp_path: Path
) -> None:
    from dataclasses import replace

    chars = LexicalConfig(k1=1.2, stemmer=None, analyzer="chars", ngram=4)
    indexer = replace(make(models, tmp_path), lexical=chars)
    words = make(models, tmp_path).bm25(shards, log=QUIET)
    made = indexer.bm25(shards, log=QUIET)  # beside the words' cached counts, not from them
    expected = BM25Index.build(texts_of(shards), k1=1.2, analyzer="chars", ngram=4)
    assert (made.analyzer, made.ngram) == ("chars", 4) and words.analyzer == "words"
    assert made.terms == expected.terms
    np.testing.assert_array_equal(made.weights, expected.weights)


def test_a_finished_shard_is_not_encoded_again(
    models: Path, shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexer = make(models, tmp_path)
    first = indexer.encode(shards, log=QUIET)
    stamps = [f.stat().st_mtime_ns for f in first]

    def never(*args, **kwargs):
        raise AssertionError("encoded again")

    monkeypatch.setattr(indexer_module, "read_texts", never)
    assert indexer.encode(shards, log=QUIET) == first
    assert [f.stat().st_mtime_ns for f in first] == stamps


def test_a_failed_task_leaves_no_file(
    models: Path, shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(indexer_module, "_encode_folded", broken)
    out = tmp_path / "vectors.npy"
    task = EncodeTask(shards[0], "question", models / ENCODER_FILE, models / VOCAB_FILE, out)
    with pytest.raises(RuntimeError, match="disk full"):
        encode_shard(task)
    assert list(tmp_path.iterdir()) == []

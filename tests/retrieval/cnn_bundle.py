"""A tiny CNN bundle built with the library itself (random-weight CNN → ONNX → FAISS Flat),
shared by test_bundle.py (search) and test_loading.py (loading and cross-checks), so both
pin the file layout the pipeline stages write."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from qpr.artifacts import (
    BM25_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    LEGACY_SEARCH_FILE,
    QUESTIONS_FILE,
    SEARCH_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.text.vocab import Vocabulary

VERBS = ("install", "reset", "update", "clean", "repair")
OBJECTS = ("printer", "garden", "bicycle", "laptop", "kitchen")
TEMPLATES = ("how do i {v} my {o}", "what is the best way to {v} a {o}?")
MAX_LEN = 16
DIM = 8
# Stored threshold: far below any distance between two different random-CNN vectors, so
# an indexed question is answered (distance ~0) and an unseen one is not.
STORED_THRESHOLD = 1e-6
QUESTIONS = [t.format(v=v, o=o) for v, o, t in itertools.product(VERBS, OBJECTS, TEMPLATES)]
UNSEEN = "where can i buy a kite for my nephew"
QIDS = np.arange(len(QUESTIONS), dtype=np.int64) * 10 + 1000  # index row order


def write_config(models: Path, threshold: float | None, **fields: object) -> None:
    SearchConfig(threshold=threshold, target_precision=0.9, **fields).write(models)


def write_legacy(models: Path, payload: dict) -> None:
    """An older bundle: threshold.json instead of search.json."""
    (models / SEARCH_FILE).unlink(missing_ok=True)
    (models / LEGACY_SEARCH_FILE).write_text(json.dumps(payload), encoding="utf-8")


def write_index(models: Path, vectors: np.ndarray, factory: str = "Flat", **config) -> None:
    index = build_index(
        vectors,
        IndexConfig(factory, nprobe=1, use_gpu=False, **config),
        seed=0,
        log=lambda _: None,
    )
    save_index(index, models / INDEX_FILE)


def build_bundle(models: Path) -> Path:
    """models/ as the pipeline writes it; question ids are not row numbers, and the
    parquet is stored in another order than the index, as nothing guarantees it is not.
    Its question table predates answer ids; its search.json declares no query encoder."""
    vocab = Vocabulary.build(QUESTIONS, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=DIM)
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )
    vectors = encode(load_session(models / ENCODER_FILE), vocab, QUESTIONS, max_len=MAX_LEN)
    write_index(models, vectors)
    IdMap(QIDS).save(models / IDS_FILE)
    order = np.random.default_rng(0).permutation(len(QUESTIONS))
    table = pa.table(
        {
            "question_id": pa.array(QIDS[order], pa.int64()),
            "text": pa.array([QUESTIONS[i] for i in order], pa.string()),
            # cluster = (verb, object); the first cluster's questions belong to none
            "cluster_id": pa.array([i // 2 if i >= 2 else -1 for i in order], pa.int64()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    write_config(models, STORED_THRESHOLD)
    return models


def make_hybrid(
    models: Path,
    dense_weight: float,
    candidates: int = 20,
    dense_candidates: int | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
) -> None:
    """A fused search config as the evaluate stage writes it (dense_candidates and the
    fused depth) or, without them, as bundles written before candidates were scored
    exactly (read with dense_candidates = candidates, `qpr.artifacts.migrate`)."""
    from qpr.retrieval.bm25 import BM25Index

    BM25Index.build(QUESTIONS).save(models / BM25_FILE)  # index row order = QUESTIONS
    write_config(
        models,
        STORED_THRESHOLD,
        dense_weight=dense_weight,
        lexical_candidates=candidates,
        dense_candidates=dense_candidates,
        fused_nprobe=nprobe,
        fused_ef_search=ef_search,
    )

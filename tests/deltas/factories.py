"""The deltas tests' bundle: a pipeline-shaped one (random-weight CNN → ONNX → FAISS Flat,
BM25 fused in) over 96 questions; later questions arrive as deltas."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from qpr.artifacts import (
    BM25_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.bundle import Bundle
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


def search_config(fused: bool) -> SearchConfig:
    if not fused:
        return SearchConfig(threshold=1e-3, target_precision=0.9)
    return SearchConfig(
        threshold=1e-3,
        target_precision=0.9,
        dense_weight=0.5,
        lexical_candidates=20,
        dense_candidates=10,
    )


def write_index(models: Path, texts: list[str], qids: list[int]) -> None:
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


def flat(vectors: np.ndarray):
    """The compaction's index factory: exact Flat, as the fixture's main index."""
    return build_index(vectors, FLAT, seed=0, log=lambda _: None)


def frame(texts: list[str], ids: list[int], answer: str = "new") -> pd.DataFrame:
    return pd.DataFrame({"question_id": ids, "text": texts, "cluster_id": -1, "answer_id": answer})


def ids(bundle: Bundle, question: str, k: int) -> list[int]:
    return [hit.question_id for hit in bundle.search(question, k=k).hits]


def write_encoder(models: Path, *, seed: int, output_dim: int) -> None:
    """Another random-weight CNN as the bundle's encoder.onnx (a retrained model)."""
    import torch

    from qpr.model import CNNEncoder
    from qpr.model.onnx import export_onnx

    vocab = Vocabulary.load(models / VOCAB_FILE)
    torch.manual_seed(seed)
    encoder = CNNEncoder(
        vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=output_dim
    )
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )


def found_at_zero(models: Path, texts: list[str]) -> bool:
    """Whether a search for each text finds it first at distance 0 (the same encoder
    made its vector and the query's)."""
    bundle = Bundle.load(models)
    for text in texts:
        hits = bundle.search(text, k=1, threshold=float("inf")).hits
        if not hits or hits[0].text != text or hits[0].distance > 1e-5:
            return False
    return True

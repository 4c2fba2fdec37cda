"""What one stage reads of another's outputs, in one place: a stage imports this module,
never another stage. Each reader fails with MissingInputError naming the stage to run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from qpr.artifacts import BM25_FILE, IDS_FILE, INDEX_FILE, QUESTIONS_FILE
from qpr.errors import QPRError
from qpr.paths import ProjectPaths


class MissingInputError(QPRError, FileNotFoundError):
    """A stage's input does not exist yet: an earlier stage has not run."""


def read_cluster_outputs(paths: ProjectPaths) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(questions, pairs) written by the cluster stage."""
    questions_file = paths.cluster_dir / "questions.parquet"
    pairs_file = paths.cluster_dir / "pairs.parquet"
    for file in (questions_file, pairs_file):
        if not file.is_file():
            raise MissingInputError(f"{file} not found: run the cluster stage first")
    return pd.read_parquet(questions_file), pd.read_parquet(pairs_file)


def require_exported_encoder(paths: ProjectPaths) -> Path:
    """models/encoder.onnx, written by the export stage."""
    if not paths.encoder_onnx.is_file():
        raise MissingInputError(f"{paths.encoder_onnx} not found: run the export stage first")
    return paths.encoder_onnx


def load_bm25(paths: ProjectPaths):
    """models/index/bm25.npz, written by the index stage when index.lexical.enabled."""
    from qpr.retrieval.bm25 import BM25Index

    path = paths.models_dir / BM25_FILE
    if not path.is_file():
        raise MissingInputError(
            f"{path} not found: index.lexical.enabled is true but the index stage ran without "
            "it; run the index stage again"
        )
    return BM25Index.load(path)


def load_query_encoder(paths: ProjectPaths, *, threads: int):
    """(ONNX Runtime session, tokenizer, max_len) of the encoder queries go through: the
    query student's or the int8 one when the bundle has it (`qpr.artifacts.
    served_query_encoder`), else models/encoder.onnx."""
    from qpr.artifacts import served_query_encoder
    from qpr.retrieval.encoders import load_session, onnx_max_len
    from qpr.text import load_tokenizer

    session = load_session(served_query_encoder(paths.models_dir), threads=threads)
    return session, load_tokenizer(paths.vocab), onnx_max_len(session)


def load_reranker(paths: ProjectPaths, *, threads: int):
    """The rerank stage's cross-encoder (models/rerank/); None when it trained none."""
    from qpr.artifacts import RERANK_MODEL_FILE
    from qpr.retrieval.reranker import Reranker

    if not (paths.models_dir / RERANK_MODEL_FILE).is_file():
        return None
    return Reranker.load(paths.models_dir, threads=threads)


def load_index_bundle(paths: ProjectPaths, *, nprobe: int, ef_search: int | None = None):
    """(faiss index searched at nprobe / ef_search, IdMap, questions frame) as the index
    stage wrote them."""
    from qpr.retrieval.dense import IdMap, load_index

    index_path = paths.models_dir / INDEX_FILE
    if not index_path.is_file():
        raise MissingInputError(f"{index_path} not found: run the index stage first")
    index = load_index(index_path, nprobe=nprobe, ef_search=ef_search)
    ids = IdMap.load(paths.models_dir / IDS_FILE)
    questions = pd.read_parquet(paths.models_dir / QUESTIONS_FILE)
    return index, ids, questions


def load_trained_encoder(checkpoint: Path):
    """models/encoder.pt → (encoder in eval mode, max_len)."""
    import torch

    from qpr.model import build_encoder

    if not checkpoint.is_file():
        raise MissingInputError(f"{checkpoint} not found: run the train stage first")
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    encoder = build_encoder(state["encoder"]["name"], **state["encoder"]["config"])
    encoder.load_state_dict(state["model"])
    return encoder.eval(), int(state["max_len"])

"""What one stage reads of another's outputs, in one place: a stage imports this module,
never another stage. Each reader fails with MissingInputError naming the stage to run.
File names come from `qpr.artifacts` (through `qpr.paths`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from qpr.artifacts import BM25_FILE, COMPANION_FILE, IDS_FILE, INDEX_FILE, QUESTIONS_FILE
from qpr.errors import QPRError
from qpr.paths import ProjectPaths


class MissingInputError(QPRError, FileNotFoundError):
    """A stage's input does not exist yet: an earlier stage has not run."""


def _require(path: Path, stage: str) -> Path:
    if not path.is_file():
        raise MissingInputError(f"{path} not found: run the {stage} stage first")
    return path


def read_cluster_outputs(paths: ProjectPaths) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(questions, pairs) written by the cluster stage."""
    for file in (paths.cluster_questions, paths.cluster_pairs):
        _require(file, "cluster")
    return pd.read_parquet(paths.cluster_questions), pd.read_parquet(paths.cluster_pairs)


def read_clusters(paths: ProjectPaths, columns: list[str] | None = None) -> pd.DataFrame:
    """The cluster stage's table of clusters (`columns` of it, or all)."""
    return pd.read_parquet(_require(paths.clusters, "cluster"), columns=columns)


def load_vocab(paths: ProjectPaths):
    """models/vocab.json, the tokenizer the train stage wrote (`qpr.text.load_tokenizer`)."""
    from qpr.text import load_tokenizer

    return load_tokenizer(_require(paths.vocab, "train"))


def require_exported_encoder(paths: ProjectPaths) -> Path:
    """models/encoder.onnx, written by the export stage."""
    return _require(paths.encoder_onnx, "export")


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


def load_dense_index(paths: ProjectPaths, *, nprobe: int, ef_search: int | None = None):
    """The FAISS index the index stage wrote, searched at nprobe / ef_search."""
    from qpr.retrieval.dense import load_index

    index_path = _require(paths.models_dir / INDEX_FILE, "index")
    return load_index(index_path, nprobe=nprobe, ef_search=ef_search)


def read_indexed_questions(paths: ProjectPaths, columns: list[str] | None = None) -> pd.DataFrame:
    """The index stage's question table, row for row with the index (`columns`, or all)."""
    return pd.read_parquet(_require(paths.models_dir / QUESTIONS_FILE, "index"), columns=columns)


def load_served(paths: ProjectPaths, settings):
    """(`qpr.evaluation.measure.Served`, the index's question table): what the service
    would search with, as the index, student and rerank stages left it. The index at
    params' depth (index.nprobe / index.ef_search); queries through the encoder the service
    runs (the query student's or the int8 one when the bundle has it); BM25 when
    index.lexical.enabled; the re-ranker when rerank.enabled and the rerank stage trained
    one."""
    from qpr.artifacts import RERANK_MODEL_FILE, served_query_encoder
    from qpr.evaluation.measure import Served
    from qpr.retrieval.dense import IdMap
    from qpr.retrieval.encoders import load_session, onnx_max_len
    from qpr.retrieval.reranker import Reranker

    require_exported_encoder(paths)
    cfg, threads = settings.index, settings.index.threads
    index = load_dense_index(paths, nprobe=cfg.nprobe, ef_search=cfg.ef_search)
    ids = IdMap.load(paths.models_dir / IDS_FILE)
    session = load_session(served_query_encoder(paths.models_dir), threads=threads)
    bm25 = load_bm25(paths) if cfg.lexical.enabled else None
    rerank = settings.rerank.enabled and (paths.models_dir / RERANK_MODEL_FILE).is_file()
    reranker = Reranker.load(paths.models_dir, threads=threads) if rerank else None
    questions = read_indexed_questions(paths)
    texts = questions["text"].tolist()
    vocab, max_len = load_vocab(paths), onnx_max_len(session)
    companion = load_companion(paths, cfg.companion) if bm25 is not None else None
    served = Served(index, ids, texts, session, vocab, max_len, bm25, reranker, companion)
    return served, questions


def load_companion(paths: ProjectPaths, name: str | None):
    """`qpr.retrieval.companion.Companion` `name` over the index's rows (its vectors as
    the index stage wrote them), or None when params name none."""
    from qpr.retrieval.companion import Companion

    if name is None:
        return None
    return Companion.load(_require(paths.models_dir / COMPANION_FILE, "index"), name)


def read_evaluate_metrics(paths: ProjectPaths) -> dict[str, Any]:
    """metrics/evaluate.json: the evaluate stage's measures without their wall-clock
    figures (what DVC tracks)."""
    path = _require(paths.stage_metrics("evaluate"), "evaluate")
    return json.loads(path.read_text(encoding="utf-8"))


def load_trained_encoder(checkpoint: Path):
    """models/encoder.pt → (encoder in eval mode, max_len)."""
    import torch

    from qpr.model import build_encoder

    _require(checkpoint, "train")
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    encoder = build_encoder(state["encoder"]["name"], **state["encoder"]["config"])
    encoder.load_state_dict(state["model"])
    return encoder.eval(), int(state["max_len"])

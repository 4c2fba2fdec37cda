"""The index stage: every index question encoded with ONNX Runtime → a FAISS index.

Writes models/index/{index.faiss, index.ids.npy, questions.parquet}: the index, the
row → question_id map and the questions for display; with index.lexical.enabled also
bm25.npz, the BM25 weights of the same rows (qpr.retrieval.bm25), fused with the dense ranking.
Gate: one vector per question, all finite and non-zero, and sampled questions retrieve
themselves first.

With index.query_encoder int8 (a transformer) it also writes query_encoder.onnx: the
encoder with int8 matrix products (qpr.model.quantize), which the evaluate stage and the service
encode queries with, against the float32 vectors here. Gated too: the sampled questions'
int8 and float32 vectors at cosine >= index.query_cosine_floor for 99 % of them (one
outlier among 2,000 packaged-MiniLM questions was at 0.9797, the 1st percentile 0.990),
and their int8 query vectors retrieving them first as often as self_check_min asks.

The vectors are kept in artifacts/index/<key>.npy, the key a digest of the ONNX file, the
tokenizer file and the questions: a run that changes only the index's settings (factory,
nprobe, BM25) reuses them instead of encoding every question again (minutes for a
transformer on Quora). One encoding is kept.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from qpr.config import Settings
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import MissingInputError, read_cluster_outputs
from qpr.quality.checks import Check, require
from qpr.text import load_tokenizer

if TYPE_CHECKING:
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

INDEX_FILE = "index.faiss"
QUESTIONS_FILE = "questions.parquet"
BM25_FILE = "bm25.npz"
QUERY_ENCODER_FILE = "query_encoder.onnx"  # only with index.query_encoder int8
CHUNK = 20_000  # questions per progress line


def onnx_max_len(session) -> int:
    """max_len the encoder was trained with, from the ONNX metadata the export stage wrote."""
    return int(session.get_modelmeta().custom_metadata_map["max_len"])


def encode_corpus(
    session,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: list[str],
    *,
    batch_size: int,
    log: Callable[[str], None] = print,
) -> np.ndarray:
    """float32 [N, D] vectors, encoded in chunks so a person sees progress on large corpora."""
    from qpr.retrieval.encoders import encode

    max_len = onnx_max_len(session)
    parts: list[np.ndarray] = []
    started = time.perf_counter()
    for start in range(0, len(texts), CHUNK):
        parts.append(
            encode(
                session,
                vocab,
                texts[start : start + CHUNK],
                batch_size=batch_size,
                max_len=max_len,
            )
        )
        done = min(start + CHUNK, len(texts))
        rate = done / max(time.perf_counter() - started, 1e-9)
        log(f"encoded {done:,} / {len(texts):,} questions ({rate:,.0f}/s)")
    return np.concatenate(parts) if parts else np.empty((0, 0), np.float32)


def corpus_key(encoder_onnx: Path, vocab: Path, texts: list[str]) -> str:
    """Digest of what decides the index vectors: encoder, tokenizer and questions."""
    h = hashlib.sha256()
    for path in (encoder_onnx, vocab):
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\x1e")
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()[:32]


def cached_vectors(cache_dir: Path, key: str) -> tuple[np.ndarray, dict] | None:
    """(vectors, how they were made) of an earlier encoding with this key, else None."""
    vectors_file, info_file = cache_dir / f"{key}.npy", cache_dir / f"{key}.json"
    if not (vectors_file.is_file() and info_file.is_file()):
        return None
    return np.load(vectors_file), json.loads(info_file.read_text(encoding="utf-8"))


def cache_vectors(cache_dir: Path, key: str, vectors: np.ndarray, info: dict) -> None:
    """Keep this encoding (and no other): written to a temporary name, then renamed."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for old in cache_dir.iterdir():
        if old.stem != key:
            old.unlink()
    tmp = cache_dir / f".{key}.npy.tmp"
    with tmp.open("wb") as f:
        np.save(f, vectors)
    tmp.replace(cache_dir / f"{key}.npy")
    (cache_dir / f"{key}.json").write_text(json.dumps(info), encoding="utf-8")


def run_index(
    settings: Settings, paths: ProjectPaths, *, log: Callable[[str], None] = print
) -> dict[str, float | int | str]:
    """The whole stage; the index directory is swapped in only after the gate passed."""
    from qpr.retrieval.dense import (
        IdMap,
        build_index,
        ef_search_of,
        nlist_of,
        save_index,
        self_check_rows,
        self_retrieval_rate,
    )
    from qpr.retrieval.encoders import load_session

    if not paths.encoder_onnx.is_file():
        raise MissingInputError(f"{paths.encoder_onnx} not found: run the export stage first")
    questions, _ = read_cluster_outputs(paths)
    vocab = load_tokenizer(paths.vocab)
    cfg = settings.index
    session = load_session(paths.encoder_onnx, threads=cfg.threads)

    texts = questions["text"].tolist()
    key = corpus_key(paths.encoder_onnx, paths.vocab, texts)
    cached = cached_vectors(paths.index_cache_dir, key)
    if cached is not None:
        vectors, made = cached
        encode_seconds = float(made["encode_seconds"])
        log(
            f"vectors of the {len(texts):,} questions reused from "
            f"{paths.index_cache_dir / key}.npy (same encoder, tokenizer and questions; "
            f"encoded in {encode_seconds:.1f} s)"
        )
    else:
        started = time.perf_counter()
        vectors = encode_corpus(session, vocab, texts, batch_size=cfg.encode_batch_size, log=log)
        encode_seconds = time.perf_counter() - started
        cache_vectors(paths.index_cache_dir, key, vectors, {"encode_seconds": encode_seconds})
    norms = np.linalg.norm(vectors, axis=1)
    finite = bool(np.isfinite(vectors).all())

    started = time.perf_counter()
    index = build_index(
        vectors if finite else np.nan_to_num(vectors),
        cfg.factory,
        nprobe=cfg.nprobe,
        seed=settings.seed,
        use_gpu=cfg.use_gpu,
        ef_search=cfg.ef_search,
        ef_construction=cfg.ef_construction,
        refine_k_factor=cfg.refine_k_factor,
        log=log,
    )
    build_seconds = time.perf_counter() - started
    self_rate = self_retrieval_rate(
        index, vectors, sample=min(cfg.self_check_sample, len(vectors)), seed=settings.seed
    )
    staging = paths.index_dir.with_name(paths.index_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    checks = [
        Check("vectors_equal_questions", index.ntotal, "==", len(questions)),
        Check("all_vectors_finite", float(finite), "==", 1.0),
        Check(
            "min_vector_norm",
            float(norms.min()) if len(norms) else 0.0,
            ">",
            0.0,
            "a zero vector matches everything equally",
        ),
        Check(
            "self_retrieval_rate",
            self_rate,
            ">=",
            cfg.self_check_min,
            f"{min(cfg.self_check_sample, len(vectors))} sampled questions",
        ),
    ]
    query_metrics: dict[str, float] = {}
    try:  # a failure leaves no half-written staging folder behind
        if cfg.query_encoder == "int8":
            rows = self_check_rows(len(texts), cfg.self_check_sample, settings.seed)
            query_vectors, query_metrics = int8_query_encoder(
                paths.encoder_onnx,
                staging / QUERY_ENCODER_FILE,
                vocab,
                [texts[r] for r in rows],
                vectors[rows],
                threads=cfg.threads,
                batch_size=cfg.encode_batch_size,
                log=log,
            )
            query_metrics["query_self_retrieval_rate"] = self_retrieval_rate(
                index, vectors, cfg.self_check_sample, settings.seed, queries=query_vectors
            )
            sampled = f"{len(rows)} sampled questions, int8 query against float32 index vectors"
            checks += [
                Check(
                    "query_cosine_p1",
                    query_metrics["query_cosine_p1"],
                    ">=",
                    cfg.query_cosine_floor,
                    sampled,
                ),
                Check(
                    "query_self_retrieval_rate",
                    query_metrics["query_self_retrieval_rate"],
                    ">=",
                    cfg.self_check_min,
                    sampled,
                ),
            ]
        require("index", checks, paths.gate_reports("index"))
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise

    index_path = save_index(index, staging / INDEX_FILE)
    IdMap(questions["question_id"].to_numpy(np.int64)).save(IdMap.path_for(index_path))
    questions[["question_id", "text", "cluster_id"]].to_parquet(
        staging / QUESTIONS_FILE, index=False
    )
    lexical_seconds = 0.0
    if cfg.lexical.enabled:
        from qpr.retrieval.bm25 import BM25Index, describe_bm25

        started = time.perf_counter()
        bm25 = BM25Index.build(
            questions["text"].tolist(),
            k1=cfg.lexical.k1,
            b=cfg.lexical.b,
            stemmer=cfg.lexical.stemmer,
        )
        bm25.save(staging / BM25_FILE)
        lexical_seconds = time.perf_counter() - started
        log(
            f"BM25 ({describe_bm25(bm25.settings)}): {len(bm25.terms):,} terms, "
            f"{bm25.rows.size:,} postings ({lexical_seconds:.1f} s)"
        )
    shutil.rmtree(paths.index_dir, ignore_errors=True)
    staging.rename(paths.index_dir)

    described = nlist_of(index)
    metrics = {
        "questions": len(questions),
        "dim": int(vectors.shape[1]),
        "nlist": int(described) if described is not None else 0,
        "nprobe": cfg.nprobe,
        "ef_search": ef_search_of(index) or 0,
        # A reused encoding reports what the encoding it reuses cost.
        "encode_seconds": encode_seconds,
        "questions_per_s": len(questions) / max(encode_seconds, 1e-9),
        "vectors_reused": int(cached is not None),
        "build_seconds": build_seconds,
        "lexical_seconds": lexical_seconds,
        "self_retrieval_rate": self_rate,
        "query_encoder": cfg.query_encoder,
        **query_metrics,
        "index_bytes": sum(
            f.stat().st_size for f in paths.index_dir.iterdir() if f.name != QUERY_ENCODER_FILE
        ),
    }
    log(
        f"indexed {len(questions):,} questions (dim {metrics['dim']}, nlist {metrics['nlist']}) "
        f"at {metrics['questions_per_s']:,.0f} questions/s; build {build_seconds:.1f} s; "
        f"self-retrieval {self_rate:.3f}"
    )
    return metrics


def int8_query_encoder(
    encoder_onnx: Path,
    target: Path,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: list[str],
    reference: np.ndarray,
    *,
    threads: int,
    batch_size: int,
    log: Callable[[str], None] = print,
) -> tuple[np.ndarray, dict[str, float]]:
    """Quantise the encoder into `target` (qpr.model.quantize) and encode `texts` with it:
    (their int8 vectors float32 [N, D], {"query_cosine_min", "_p1" (1st percentile),
    "_median" against `reference` (their float32 vectors), "query_encoder_bytes",
    "quantize_seconds"})."""
    from qpr.model.quantize import quantize_query_encoder, row_cosines
    from qpr.retrieval.encoders import load_session

    started = time.perf_counter()
    quantize_query_encoder(encoder_onnx, target)
    seconds = time.perf_counter() - started
    session = load_session(target, threads=threads)
    vectors = encode_corpus(session, vocab, texts, batch_size=batch_size, log=lambda _: None)
    cosines = row_cosines(reference, vectors)
    size = target.stat().st_size
    log(
        f"int8 query encoder: {size / 1e6:.1f} MB against {encoder_onnx.stat().st_size / 1e6:.1f}"
        f" MB ({seconds:.1f} s); cosine with the float32 vectors of {len(texts)} sampled "
        f"questions: min {cosines.min():.4f}, 1st percentile {np.percentile(cosines, 1):.4f}, "
        f"median {np.median(cosines):.4f}"
    )
    return vectors, {
        "query_cosine_min": float(cosines.min()),
        "query_cosine_p1": float(np.percentile(cosines, 1)),
        "query_cosine_median": float(np.median(cosines)),
        "query_encoder_bytes": size,
        "quantize_seconds": seconds,
    }


def query_encoder_path(encoder_onnx: Path, index_dir: Path) -> Path:
    """The encoder queries go through: the index's int8 query encoder when the index stage
    wrote one (index.query_encoder int8), else the exported encoder itself."""
    quantized = index_dir / QUERY_ENCODER_FILE
    return quantized if quantized.is_file() else encoder_onnx


def load_index_bundle(index_dir: Path, *, nprobe: int, ef_search: int | None = None):
    """(faiss index, IdMap, questions frame) as the index stage wrote them."""
    from qpr.retrieval.dense import IdMap, load_index

    index_path = index_dir / INDEX_FILE
    if not index_path.is_file():
        raise MissingInputError(f"{index_path} not found: run the index stage first")
    index = load_index(index_path, nprobe=nprobe, ef_search=ef_search)
    ids = IdMap.load(IdMap.path_for(index_path))
    questions = pd.read_parquet(index_dir / QUESTIONS_FILE)
    return index, ids, questions

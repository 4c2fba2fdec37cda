"""The index stage: every index question encoded with ONNX Runtime → a FAISS index.

Writes models/index/{index.faiss, index.ids.npy, questions.parquet}: the index, the
row → question_id map and the questions for display (with each one's answer_id,
`with_answer_ids`); with index.lexical.enabled also
bm25.npz, the BM25 weights of the same rows (qpr.retrieval.bm25), fused with the dense
ranking. Gate: one vector per question, all finite and non-zero, and sampled questions
retrieve themselves first.

With index.query_encoder int8 (a transformer) it also writes query_encoder.onnx: the
encoder with int8 matrix products (qpr.model.quantize), which the evaluate stage and the
service encode queries with, against the float32 vectors here. Gated too: the sampled
questions' int8 and float32 vectors at cosine >= index.query_cosine_floor for 99 % of them
(one outlier among 2,000 packaged-MiniLM questions was at 0.9797, the 1st percentile
0.990), and their int8 query vectors retrieving them first as often as self_check_min asks.

Encoding and BM25 counting run in shards of index.shard_rows questions, one task a shard on
the engine params.yaml names (`qpr.retrieval.indexer`; Ray through `flows/engine.py`): the
same files whichever engine ran them. A killed run resumes at the first shard not done.

The vector shards are kept in artifacts/index/vectors/, a `qpr.io.VectorCache` keyed by a
digest of the ONNX file, the tokenizer file, the kernel and the shard's questions: a run
that changes only the index's settings (factory, nprobe, BM25) reuses them instead of
encoding every question again (minutes for a transformer on Quora). One encoding is kept,
each shard's info recording what the whole encoding cost. FAISS is trained on a
sample by one task and filled by one task a shard, on the same engine, then assembled in
row order into the file the one-process build writes (`qpr.retrieval.faiss_shards`), so
no step holds every vector in memory.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.artifacts import (
    ANSWER_ID,
    BM25_FILE,
    COMPANION_FILE,
    INDEX_FILE,
    QUERY_ENCODER_FILE,
    QUESTIONS_FILE,
)
from qpr.config import IndexSettings, Settings
from qpr.deltas import format as deltas
from qpr.deltas.lock import writer_lock
from qpr.io import replace_dir
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import (
    MissingInputError,
    load_vocab,
    read_cluster_outputs,
    read_clusters,
    require_exported_encoder,
)
from qpr.quality.checks import Check, require
from qpr.retrieval.indexer import Indexer, LexicalConfig
from qpr.tasks import Mapper, local_map

if TYPE_CHECKING:
    from qpr.retrieval.dense import VectorShards
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer


def run_index(
    settings: Settings,
    paths: ProjectPaths,
    *,
    engine: Mapper = local_map,
    log: Callable[[str], None] = print,
) -> dict[str, float | int | str]:
    """The whole stage; the index directory is swapped in only after the gate passed.
    engine: runs the shard tasks (`qpr.retrieval.indexer.local_map`, or Ray's).
    The models folder's writer lock (`qpr.deltas.lock`) is held throughout: from reading
    the deltas it absorbs to the swap, no add, drop or compaction changes them."""
    with writer_lock(paths.models_dir):
        return _run_index(settings, paths, engine, log)


def _run_index(
    settings: Settings, paths: ProjectPaths, engine: Mapper, log: Callable[[str], None]
) -> dict[str, float | int | str]:
    from qpr.retrieval.dense import ef_search_of, nlist_of, self_retrieval_rate

    require_exported_encoder(paths)
    questions, _ = read_cluster_outputs(paths)
    questions = with_answer_ids(questions, paths, settings.data.source)
    clustered = len(questions)
    # The deltas' questions and tombstones (qpr.deltas): a full build absorbs them.
    questions, absorbed = deltas.for_full_build(paths.models_dir, questions)
    columns = bundle_columns(questions, settings.data.filter_fields)
    vocab = load_vocab(paths)
    cfg = settings.index
    texts = questions["text"].tolist()
    indexer = _indexer(settings, paths, engine)
    shards = _question_shards(paths, texts, cfg.shard_rows)
    vectors, encode_seconds, reused = _question_vectors(indexer, shards, log)
    finite, min_norm = _vector_stats(vectors)  # one pass: a NaN fails the gate, not the build
    started = time.perf_counter()
    index = indexer.faiss_index(vectors, log=log) if finite else None
    build_seconds = time.perf_counter() - started
    sample = min(cfg.self_check_sample, len(vectors))
    self_rate = (
        self_retrieval_rate(index, vectors, sample=sample, seed=settings.seed) if index else 0.0
    )
    staging = paths.index_dir.with_name(paths.index_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    checks = _index_checks(
        index.ntotal if index else 0, finite, min_norm, self_rate, cfg, questions=len(questions)
    )
    query_metrics: dict[str, float] = {}
    try:  # a failure leaves no half-written staging folder behind
        if cfg.query_encoder == "int8" and index is not None:
            query_metrics, int8_checks = _int8_queries(
                settings, paths, staging, vocab, texts, vectors, index, log
            )
            checks += int8_checks
        require("index", checks, paths.gate_reports("index"))
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    assert index is not None  # the gate passed: the vectors were finite

    lexical_seconds = _write_index_files(staging, index, questions[columns], indexer, shards, log)
    companion_seconds = _write_companion(staging, cfg.companion, texts, log)
    deltas.write_absorbed(staging, absorbed)
    deltas.ensure_manifest(paths.models_dir)  # the stage's persisted output must exist
    replace_dir(staging, paths.index_dir)
    shutil.rmtree(paths.index_cache_dir / "shards", ignore_errors=True)
    shutil.rmtree(paths.index_cache_dir / "counts", ignore_errors=True)
    shutil.rmtree(paths.index_cache_dir / "faiss", ignore_errors=True)

    described = nlist_of(index)
    metrics = {
        "questions": len(questions),
        "questions_clustered": clustered,
        "deltas_version": absorbed,
        "dim": int(vectors.dim),
        "nlist": int(described) if described is not None else 0,
        "nprobe": cfg.nprobe,
        "ef_search": ef_search_of(index) or 0,
        # A reused encoding reports what the encoding it reuses cost.
        "encode_seconds": encode_seconds,
        "questions_per_s": len(questions) / max(encode_seconds, 1e-9),
        "vectors_reused": int(reused),
        "build_seconds": build_seconds,
        "lexical_seconds": lexical_seconds,
        "companion_seconds": companion_seconds,
        "self_retrieval_rate": self_rate,
        "query_encoder": cfg.query_encoder,
        **query_metrics,
        "index_bytes": sum(
            f.stat().st_size for f in paths.index_dir.iterdir() if f.name != QUERY_ENCODER_FILE.name
        ),
    }
    log(
        f"indexed {len(questions):,} questions (dim {metrics['dim']}, nlist {metrics['nlist']}) "
        f"at {metrics['questions_per_s']:,.0f} questions/s; build {build_seconds:.1f} s; "
        f"self-retrieval {self_rate:.3f}"
    )
    return metrics


def with_answer_ids(questions: pd.DataFrame, paths: ProjectPaths, source: str) -> pd.DataFrame:
    """`questions` with the answer of each one's cluster (str, None when unknown), which
    the bundle hands out with every hit, so the service needs no other file.

    Logs: the cluster stage's clusters table keeps each cluster's logged answer_id as its
    source_key. Quora pairs have no answers: a cluster's id is its smallest question id
    (`qpr.data.clustering.components`), and that is its answer id; a question in no
    cluster (-1) answers itself.
    """
    if source == "quora":
        own = questions["question_id"].to_numpy(np.int64)
        cluster = questions["cluster_id"].to_numpy(np.int64)
        answers = np.where(cluster >= 0, cluster, own).astype(str).tolist()
        return questions.assign(**{ANSWER_ID: answers})
    clusters = read_clusters(paths, columns=["cluster_id", "source_key"])
    answer_of = dict(
        zip(clusters["cluster_id"].tolist(), clusters["source_key"].tolist(), strict=True)
    )
    answers = [answer_of.get(c) for c in questions["cluster_id"].tolist()]
    return questions.assign(**{ANSWER_ID: pd.Series(answers, index=questions.index, dtype=object)})


def bundle_columns(questions: pd.DataFrame, filter_fields: Sequence[str]) -> list[str]:
    """The question table's columns in the bundle: id, text, cluster, answer, and the
    metadata fields searches filter on (`qpr.retrieval.selection`), which the cluster stage
    kept from the logs. MissingInputError when it did not keep one of them."""
    missing = [f for f in filter_fields if f not in questions.columns]
    if missing:
        raise MissingInputError(
            f"data.filter_fields names {', '.join(missing)}, but the cluster stage's questions "
            "have no such column: run the cluster stage again (logs with that column)"
        )
    return ["question_id", "text", "cluster_id", ANSWER_ID, *filter_fields]


def _indexer(settings: Settings, paths: ProjectPaths, engine: Mapper) -> Indexer:
    from qpr.retrieval.dense import IndexConfig

    cfg = settings.index
    return Indexer(
        config=IndexConfig.from_settings(cfg),
        encoder=paths.encoder_onnx,
        vocab=paths.vocab,
        work_dir=paths.index_cache_dir,
        lexical=LexicalConfig(
            cfg.lexical.enabled,
            cfg.lexical.k1,
            cfg.lexical.b,
            cfg.lexical.stemmer,
            cfg.lexical.analyzer,
            cfg.lexical.ngram,
        ),
        engine=engine,
        seed=settings.seed,
        fold=cfg.batch_encoder == "folded",
        threads=cfg.threads,
        batch_size=cfg.encode_batch_size,
    )


def _question_shards(paths: ProjectPaths, texts: list[str], shard_rows: int) -> list[Path]:
    """The index questions as Parquet shards of `shard_rows` (column "question"): what the
    shard tasks read, on this machine or a cluster's."""
    out = paths.index_cache_dir / "shards"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shards = []
    for number, start in enumerate(range(0, max(len(texts), 1), shard_rows)):
        path = out / f"questions-{number:05d}.parquet"
        pd.DataFrame({"question": texts[start : start + shard_rows]}).to_parquet(path)
        shards.append(path)
    return shards


def _question_vectors(
    indexer: Indexer, shards: list[Path], log: Callable[[str], None]
) -> tuple[VectorShards, float, bool]:
    """(the vector shards of the questions, the seconds their encoding took, whether they
    were all there already: same encoder, tokenizer, kernel and questions). One encoding
    is kept in the indexer's VectorCache (artifacts/index/vectors/): any other is removed."""
    from qpr.retrieval.dense import VectorShards

    cache, keys = indexer.vectors, indexer.vector_keys(shards)
    encoding = "+".join(keys)  # a shard's info names the whole encoding it belongs to
    infos = [cache.info(key) if cache.has(key) else {} for key in keys]
    if all(info.get("encoding") == encoding for info in infos):
        seconds = float(infos[0]["encode_seconds"])
        files = [cache.path(key) for key in keys]
        log(
            f"vectors of the {len(VectorShards(files)):,} questions reused from "
            f"{cache.directory} (same encoder, tokenizer and questions; encoded in "
            f"{seconds:.1f} s)"
        )
        return VectorShards(files), seconds, True
    started = time.perf_counter()
    files = indexer.encode(shards, log=log)
    seconds = time.perf_counter() - started
    cache.keep(keys)
    for key in keys:
        cache.describe(key, {"encoding": encoding, "encode_seconds": seconds})
    vectors = VectorShards(files)
    rate = len(vectors) / max(seconds, 1e-9)
    log(f"encoded {len(vectors):,} questions in {seconds:.1f} s ({rate:,.0f}/s)")
    return vectors, seconds, False


def _vector_stats(vectors: VectorShards) -> tuple[bool, float]:
    """(every value finite, the smallest row norm), one shard in memory at a time."""
    finite, smallest = True, np.inf
    for chunk in vectors.chunks():
        finite = finite and bool(np.isfinite(chunk).all())
        if chunk.size:
            smallest = min(smallest, float(np.linalg.norm(np.nan_to_num(chunk), axis=1).min()))
    return finite, float(smallest) if np.isfinite(smallest) else 0.0


def _index_checks(
    ntotal: int,
    finite: bool,
    min_norm: float,
    self_rate: float,
    cfg: IndexSettings,
    *,
    questions: int,
) -> list[Check]:
    """The gate on the index: one finite, non-zero vector per question, and sampled
    questions retrieving themselves first."""
    return [
        Check("vectors_equal_questions", ntotal, "==", questions),
        Check("all_vectors_finite", float(finite), "==", 1.0),
        Check("min_vector_norm", min_norm, ">", 0.0, "a zero vector matches everything equally"),
        Check(
            "self_retrieval_rate",
            self_rate,
            ">=",
            cfg.self_check_min,
            f"{min(cfg.self_check_sample, questions)} sampled questions",
        ),
    ]


def _int8_queries(
    settings: Settings,
    paths: ProjectPaths,
    staging: Path,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: list[str],
    vectors: VectorShards,
    index: Any,
    log: Callable[[str], None],
) -> tuple[dict[str, float], list[Check]]:
    """The int8 query encoder written into `staging`, its measures on the self-check
    sample of `texts` (against their float32 `vectors` in `index`) and their checks."""
    from qpr.retrieval.dense import self_check_rows, self_retrieval_rate

    cfg = settings.index
    rows = self_check_rows(len(texts), cfg.self_check_sample, settings.seed)
    query_vectors, query_metrics = int8_query_encoder(
        paths.encoder_onnx,
        staging / QUERY_ENCODER_FILE.name,
        vocab,
        [texts[r] for r in rows],
        vectors.rows(rows),
        threads=cfg.threads,
        log=log,
    )
    query_metrics["query_self_retrieval_rate"] = self_retrieval_rate(
        index, vectors, cfg.self_check_sample, settings.seed, queries=query_vectors
    )
    sampled = f"{len(rows)} sampled questions, int8 query against float32 index vectors"
    return query_metrics, [
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


def _write_companion(
    staging: Path, companion: str | None, texts: list[str], log: Callable[[str], None]
) -> float:
    """index.companion's vectors of the questions (row order) into `staging`
    (`qpr.retrieval.companion`; the evaluate stage chooses its weight); the seconds taken."""
    if companion is None:
        return 0.0
    from qpr.retrieval.companion import load_encoder

    started = time.perf_counter()
    vectors = load_encoder(companion).documents(texts)
    np.save(staging / COMPANION_FILE.name, vectors)
    seconds = time.perf_counter() - started
    log(f"companion {companion}: {len(texts):,} questions, {vectors.shape[1]}-d ({seconds:.1f} s)")
    return seconds


def _write_index_files(
    staging: Path,
    index: Any,
    questions: pd.DataFrame,
    indexer: Indexer,
    shards: list[Path],
    log: Callable[[str], None],
) -> float:
    """The index, its id map, the questions (their bundle columns) and
    (index.lexical.enabled) BM25 into `staging`; returns the seconds BM25 took to build."""
    from qpr.retrieval.dense import IdMap, save_index

    index_path = save_index(index, staging / INDEX_FILE.name)
    IdMap(questions["question_id"].to_numpy(np.int64)).save(IdMap.path_for(index_path))
    questions.to_parquet(staging / QUESTIONS_FILE.name, index=False)
    if not indexer.lexical.enabled:
        return 0.0
    from qpr.retrieval.bm25 import describe_bm25

    started = time.perf_counter()
    bm25 = indexer.bm25(shards, log=log)
    bm25.save(staging / BM25_FILE.name)
    lexical_seconds = time.perf_counter() - started
    log(
        f"BM25 ({describe_bm25(bm25.settings)}): {len(bm25.terms):,} terms, "
        f"{bm25.rows.size:,} postings ({lexical_seconds:.1f} s)"
    )
    return lexical_seconds


def int8_query_encoder(
    encoder_onnx: Path,
    target: Path,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: list[str],
    reference: np.ndarray,
    *,
    threads: int,
    log: Callable[[str], None] = print,
) -> tuple[np.ndarray, dict[str, float]]:
    """Quantise the encoder into `target` (qpr.model.quantize) and encode `texts` with it,
    one question a call as it serves them:
    (their int8 vectors float32 [N, D], {"query_cosine_min", "_p1" (1st percentile),
    "_median" against `reference` (their float32 vectors), "query_encoder_bytes",
    "quantize_seconds"})."""
    from qpr.model.quantize import quantize_query_encoder
    from qpr.retrieval.encoders import load_session, onnx_max_len, query_vectors, row_cosines

    started = time.perf_counter()
    quantize_query_encoder(encoder_onnx, target)
    seconds = time.perf_counter() - started
    session = load_session(target, threads=threads)
    vectors = query_vectors(session, vocab, texts, max_len=onnx_max_len(session))
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

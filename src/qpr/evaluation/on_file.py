"""Evaluate a trained model bundle on another data set, without retraining.

Any Quora-format pairs file or QA-log file (CSV / JSON Lines / Parquet, one file or a
folder) is turned into paraphrase clusters by the cluster stage's own code (the same
reading, raw-log and clean-log gates, cleaning, answer clustering and coherence filter for
logs; the transitive closure of the duplicate pairs for Quora), then evaluated with the
evaluate stage's protocol:

- queries: every question of a kept cluster (``split="all"``), or only those of the test
  split the cluster stage would cut from this file with these params (``split="test"``);
  as in the stage, a normalised text repeated under several question ids is a query once,
  and a cluster left with fewer than two questions is not evaluated; optionally at most
  ``max_queries`` of them, a sample seeded by params' seed (`cap_queries`: the index and
  the relevant documents stay whole);
- relevant documents: the other questions of the query's cluster;
- index: every question of the file, encoded by the bundle's encoder and tokenizer (the
  index stage's encoding code); optionally the bundle's own indexed questions are added
  as distractors (see `merge_model_questions` for duplicates). The FAISS index is exact
  (``Flat``) up to `EXACT_MAX_QUESTIONS` questions, so the measures are the encoder's and
  not those of an approximate search; above that, or on request, it is params'
  ``index.factory`` with ``index.nprobe`` / ``index.ef_search``, which is what the index
  stage builds and the service searches (IVF lists shrink to fit a small file);
- each query excluded from its own results, top k, trec_eval measures (`qpr.evaluation.trec`);
- three systems on those queries: **served**, the bundle as the service searches it over
  the same questions (`qpr.evaluation.served`: params' index.factory at the bundle's
  depth, its BM25 fusion and re-ranker, its no-answer threshold), **encoder** alone (the
  index above) and **BM25 alone** (the served BM25 settings); the bundle's threshold on
  each first hit's distance gives the answered share, P@1 among answered and, over the
  file's questions with no paraphrase, the false-answer rate.

Library code: no Prefect or MLflow here; progress goes to the ``log`` callable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from qpr.artifacts import ENCODER_FILE, QUESTIONS_FILE, VOCAB_FILE
from qpr.config import Settings
from qpr.data.ingest import coherence_threshold, load_source
from qpr.data.loaders import LOG_SUFFIXES, QUORA_COLUMNS, DropReport
from qpr.data.splits import apply_splits, assign_splits, filter_clusters, shrink_small_clusters
from qpr.errors import QPRError
from qpr.evaluation import served as served_mod
from qpr.evaluation.baselines import run_baselines
from qpr.evaluation.calibrate import Calibration, calibrate, halves
from qpr.evaluation.queries import QuerySet, SearchTask, SystemResult, query_set, score_system
from qpr.evaluation.threshold import top1_correct
from qpr.evaluation.trec import MEASURE_LABELS, format_table
from qpr.io import write_text_atomic

__all__ = [
    "BASELINES",
    "EXACT_MAX_QUESTIONS",
    "FORMATS",
    "EvaluateFileConfig",
    "EvaluateFileError",
    "FileClusters",
    "FileEvaluation",
    "cap_queries",
    "clusters_from_file",
    "detect_format",
    "evaluate_file",
    "evaluation_clusters",
    "merge_model_questions",
    "save_calibrated",
    "write_report",
]

Format = Literal["quora", "logs"]
Split = Literal["all", "test"]
FORMATS: tuple[str, ...] = ("quora", "logs")
BASELINES: tuple[str, ...] = ("bm25", "jaccard")
# The split label query_set reads; with split="all" every kept cluster carries it.
_EVALUATED = "test"
# Up to this many index questions the default index is exact. On Quora (115,862 queries
# over 134,091 questions, 2 shared cores) exact search and scoring took 160-210 s, while
# HNSW32,Flat took 150 s to build and 273 s to search and score, and lost a third of the
# default bundle's P@1 (0.220 against 0.328): with a model trained on other data the graph
# search misses many true neighbours.
EXACT_MAX_QUESTIONS = 200_000
# Bundle questions get negative document ids: the file's ids are >= 0 (Quora qids, or the
# 63-bit stable ids of logs), and a Quora-trained bundle reuses small qids for other texts.
_FIRST_MODEL_ID = -1
_NO_ANSWER_KEYS = ("answered_share", "precision_at_1", "false_answer_rate")
SYSTEM_LABELS = {"served": "served", "encoder": "encoder alone", "bm25_alone": "BM25 alone"}
REPORT_COLUMNS = {
    "system": "system",
    **MEASURE_LABELS,
    "answered_share": "answered",
    "precision_at_1": "P@1 answered",
    "false_answer_rate": "false answers",
    "p50_ms": "p50 ms",
}


class EvaluateFileError(QPRError, ValueError):
    """The data or the options cannot give an evaluation; the message says why."""


@dataclass(frozen=True)
class FileClusters:
    """What the cluster stage's code makes of one file, ready to query.

    questions: question_id, text, norm_key, cluster_id, split (every question of the file,
        in the cluster stage's order; split is "test" for the evaluated questions).
    """

    questions: pd.DataFrame
    queries: QuerySet
    counts: dict[str, int]
    drops: DropReport


@dataclass(frozen=True)
class FileEvaluation:
    """The measures of every system on one file, and what they were measured on.

    summary: what results.json holds (counts, measures per system, index, timings).
    queries: the queries and their qrels (ids of the file's questions, as strings).
    systems: per system its run (query id → ranked document ids; a document of the
        model's own index has a negative id) and per-query measures.
    """

    summary: dict[str, Any]
    queries: QuerySet
    systems: dict[str, SystemResult]


@dataclass(frozen=True)
class EvaluateFileConfig:
    """What to evaluate and how (`qpr evaluate FILE` builds one from its options);
    params give the rest.

    data: a Quora pairs file, a QA-log file, or a folder of log files.
    gate_reports: where the log gates write their reports.
    models_dir: the trained bundle.
    fmt: "quora", "logs", or "auto" (`detect_format`).
    split: "all": every question of a kept cluster is a query; "test": only those of the
        test split the cluster stage would cut from this file with these params.
    k: results kept per query (None: evaluate.k).
    with_model_index: the bundle's own questions join the index as distractors
        (`merge_model_questions`).
    baselines: lexical baselines on the same queries and index (`BASELINES`).
    exact: the "encoder alone" row's index. True: an exhaustive Flat index (no
        approximate-search loss); False: params' index.factory; None: exact up to
        EXACT_MAX_QUESTIONS index questions, else index.factory. The served row always
        searches params' index.factory at the bundle's depth.
    source: where models_dir came from when it is a download (a ``models:/`` URI),
        reported instead of the temporary folder.
    max_queries: at most this many queries (`cap_queries`, seeded by params' seed);
        None: every query. For large files on few cores: the index stays the whole file.
    calibrate: choose a "no answer" threshold on a seeded half of the file's clusters and
        check it on the other half (`qpr.evaluation.calibrate`); in summary["calibration"].
    save_calibrated: a new folder: the bundle copied there with the calibrated threshold
        (`save_calibrated`); implies calibrate.
    """

    data: Path
    gate_reports: Path
    models_dir: Path = Path("models")
    fmt: Literal["auto", "quora", "logs"] = "auto"
    split: Split = "all"
    k: int | None = None
    with_model_index: bool = False
    baselines: Sequence[str] = ()
    exact: bool | None = None
    source: str | None = None
    max_queries: int | None = None
    calibrate: bool = False
    save_calibrated: Path | None = None


def detect_format(path: Path) -> Format:
    """The format of a data path, "quora" or "logs", from its kind, suffix and header.

    A folder is logs; a ``.tsv`` file, or any file whose tab-separated header holds every
    Quora column, is Quora; a ``.csv`` / ``.jsonl`` / ``.json`` / ``.parquet`` file is logs.
    """
    path = Path(path)
    if not path.exists():
        raise EvaluateFileError(f"data not found: {path}")
    if path.is_dir():
        return "logs"
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return "quora"
    if suffix != ".parquet":
        with path.open("rb") as handle:
            header = handle.readline().decode("utf-8", errors="replace").strip()
        columns = {c.strip().strip('"') for c in header.split("\t")}
        if set(QUORA_COLUMNS) <= columns:
            return "quora"
    if suffix in LOG_SUFFIXES:
        return "logs"
    raise EvaluateFileError(
        f"cannot tell the format of {path} (suffix {suffix or 'none'!r}): pass --format quora "
        f"(tab separated, columns {', '.join(QUORA_COLUMNS)}) or --format logs "
        f"({', '.join(LOG_SUFFIXES)} with timestamp, question, answer_id)"
    )


def _settings_for(settings: Settings, path: Path, fmt: Format) -> Settings:
    data = settings.data.model_copy(update={"source": fmt, "path": Path(path)})
    return settings.model_copy(update={"data": data})


def evaluation_clusters(
    questions: pd.DataFrame,
    clusters: pd.DataFrame,
    *,
    split: Split,
    seed: int,
    ratios: dict[str, float],
    min_size: int = 2,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mark the evaluated questions with split "test", with the cluster stage's functions.

    clusters must carry the ``kept`` column of `filter_clusters`. split="test" cuts the
    kept clusters as the cluster stage does (same seed, same ratios, so the same test
    clusters); split="all" evaluates every kept cluster. Then, as in the stage, a
    normalised text repeated under several question ids is evaluated once, and a cluster
    left with fewer than ``min_size`` evaluated questions is dropped (its questions stay in
    the index with split "none").
    """
    if split == "test":
        clusters = assign_splits(clusters, ratios, seed=seed)
    else:
        clusters = clusters.assign(split=np.where(clusters["kept"], _EVALUATED, "dropped"))
    questions, _ = apply_splits(questions, clusters)
    questions, clusters, _ = shrink_small_clusters(questions, clusters, min_size=min_size)
    return questions, clusters


def clusters_from_file(
    path: Path,
    fmt: Format,
    settings: Settings,
    *,
    split: Split = "all",
    report_dir: Path,
    log: Callable[[str], None] = print,
) -> FileClusters:
    """Read, gate, clean and cluster one data path as the cluster stage would for
    data.source = ``fmt``; the evaluated questions and their qrels.

    Raises DataFormatError (unusable file), GateFailed (a logs batch with too many bad
    rows: the raw-log gate's message; its report goes to ``report_dir``), or
    EvaluateFileError when no cluster of size >= 2 is left to query.
    """
    if fmt not in FORMATS:
        raise EvaluateFileError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not Path(path).exists():
        raise EvaluateFileError(f"data not found: {path}")
    report_dir.mkdir(parents=True, exist_ok=True)
    # The cluster stage's one code path from a file to clusters (reading, both log gates,
    # cleaning): this evaluation is on the clusters the stage would make.
    file_settings = _settings_for(settings, path, fmt)
    questions, clusters, counts, drops = load_source(file_settings, report_dir, log)
    threshold = coherence_threshold(file_settings)
    clusters = filter_clusters(
        clusters,
        coherence_threshold=threshold,
        min_size=settings.cluster.min_cluster_size,
    )
    questions, clusters = evaluation_clusters(
        questions,
        clusters,
        split=split,
        seed=settings.seed,
        ratios=settings.cluster.split.model_dump(),
        min_size=settings.cluster.min_cluster_size,
    )
    queries = query_set(questions, _EVALUATED)
    evaluated = clusters[clusters["split"] == _EVALUATED]
    result_counts = {
        "rows_read": drops.rows_in,
        "rows_dropped": drops.rows_dropped,
        "questions": len(questions),
        "clusters_size_2_plus": int((clusters["size"] >= 2).sum()),
        "clusters_dropped_incoherent": int((clusters["drop_reason"] == "incoherent").sum()),
        "clusters": len(evaluated),
        "queries": len(queries.query_ids),
        **{key: int(value) for key, value in counts.items() if key != "questions"},
    }
    if not len(queries.query_ids):
        kept = int(clusters["kept"].sum())
        if split == "test" and kept:
            where, why = "in its test split", f"{kept:,} kept clusters, none cut to test"
        elif fmt == "quora":
            where, why = "in it", "no two questions are marked duplicates of each other"
        else:
            where = "in it"
            why = (
                "no answer has two distinct questions, or every such cluster is incoherent "
                f"(coherence < {threshold})"
            )
        raise EvaluateFileError(
            f"{path}: no cluster of size >= 2 {where}, so nothing to query "
            f"({len(questions):,} questions; {why})"
        )
    log(
        f"{result_counts['clusters']:,} clusters to evaluate "
        f"({result_counts['clusters_dropped_incoherent']:,} dropped as incoherent), "
        f"{result_counts['queries']:,} queries, {len(questions):,} questions"
    )
    return FileClusters(questions=questions, queries=queries, counts=result_counts, drops=drops)


def cap_queries(
    clustered: FileClusters,
    max_queries: int | None,
    seed: int,
    *,
    log: Callable[[str], None] = print,
) -> FileClusters:
    """At most ``max_queries`` of the queries: a sample drawn with ``seed``, kept in their
    order, each with its whole qrels. The questions (the index) are unchanged. counts
    gain "queries_before_cap"; "queries" is the number kept."""
    queries = clustered.queries
    total = len(queries.query_ids)
    if max_queries is None or total <= max_queries:
        return clustered
    keep = np.sort(np.random.default_rng(seed).choice(total, max_queries, replace=False))
    ids = queries.query_ids[keep]
    sampled = QuerySet(
        split=queries.split,
        query_ids=ids,
        texts=[queries.texts[i] for i in keep.tolist()],
        qrels={str(q): queries.qrels[str(q)] for q in ids},
    )
    counts = {**clustered.counts, "queries": max_queries, "queries_before_cap": total}
    log(f"queries: a seeded sample of {max_queries:,} of {total:,} (seed {seed})")
    return replace(clustered, queries=sampled, counts=counts)


def merge_model_questions(
    file_questions: pd.DataFrame, model_questions: pd.DataFrame
) -> tuple[pd.DataFrame, int]:
    """The index corpus: the file's questions, then the bundle's indexed questions.

    file_questions: question_id, text, norm_key (the file's ids, >= 0).
    model_questions: text (the bundle's index/questions.parquet).

    A bundle question whose normalised text is one of the file's questions IS that
    question: it is not added a second time (so a query never finds a copy of itself, and
    a paraphrase is found once). Every other bundle question is added as a distractor
    with a fresh negative id: it belongs to no cluster of the file, so it is never
    relevant (even when it is a paraphrase the file does not label, as in logs of the
    same assistant the bundle was trained on). Returns (corpus with columns question_id,
    text; the number of bundle questions left out as copies).
    """
    from qpr.text.normalize import normalize

    known = set(file_questions["norm_key"])
    keys = model_questions["text"].map(normalize)
    copy = keys.isin(known) | keys.duplicated()
    added = model_questions.loc[~copy.to_numpy(), "text"].tolist()
    corpus = pd.concat(
        [
            file_questions[["question_id", "text"]],
            pd.DataFrame(
                {
                    "question_id": np.arange(
                        _FIRST_MODEL_ID, _FIRST_MODEL_ID - len(added), -1, dtype=np.int64
                    ),
                    "text": added,
                }
            ),
        ],
        ignore_index=True,
    )
    return corpus.astype({"question_id": "int64"}), int(copy.sum())


def _encoder(models_dir: Path, threads: int) -> tuple[Any, Any]:
    """(ONNX session, tokenizer) of a bundle, loaded as the index stage loads them.

    The one place this module loads the tokenizer: `qpr.text.load_tokenizer` reads
    whichever kind vocab.json holds (the CNN's hashed vocabulary or a word-piece one).
    """
    from qpr.retrieval.encoders import load_session
    from qpr.text import load_tokenizer

    models_dir = Path(models_dir)
    return load_session(models_dir / ENCODER_FILE, threads=threads), load_tokenizer(
        models_dir / VOCAB_FILE
    )


def _search_with_progress(
    index: Any,
    vectors: np.ndarray,
    query_rows: np.ndarray,
    k: int,
    log: Callable[[str], None],
    chunk: int = 20_000,
) -> tuple[np.ndarray, np.ndarray]:
    """The evaluate stage's dense search (each query row excluded), in chunks of queries
    with a progress line each: an exact search of 100k queries takes minutes."""
    from qpr.retrieval.dense import search

    parts: list[tuple[np.ndarray, np.ndarray]] = []
    started = time.perf_counter()
    for lo in range(0, len(query_rows), chunk):
        rows = query_rows[lo : lo + chunk]
        parts.append(search(index, vectors[rows], k, exclude=rows))
        done = lo + len(rows)
        rate = done / max(time.perf_counter() - started, 1e-9)
        log(f"searched {done:,} / {len(query_rows):,} queries, top {k} ({rate:,.0f}/s)")
    return np.concatenate([d for d, _ in parts]), np.concatenate([r for _, r in parts])


def _parse_baselines(baselines: Sequence[str]) -> list[str]:
    chosen = [b.strip().lower() for b in baselines if b and b.strip()]
    unknown = sorted(set(chosen) - set(BASELINES))
    if unknown:
        raise EvaluateFileError(
            f"unknown baseline(s) {', '.join(unknown)}; choose from {', '.join(BASELINES)}"
        )
    return list(dict.fromkeys(chosen))


def evaluate_file(
    config: EvaluateFileConfig, settings: Settings, *, log: Callable[[str], None] = print
) -> FileEvaluation:
    """Evaluate the bundle in ``config.models_dir`` on ``config.data``; see the module
    docstring.

    settings: params (cluster, quality, index, evaluate and seed are read; data.* is
        replaced by ``config.data`` and its format).

    Raises EvaluateFileError, DataFormatError, GateFailed, or BundleError (a bundle
    missing files or whose files do not belong together), each with a message to act on.
    """
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.dense import IdMap
    from qpr.retrieval.encoders import encode_corpus

    started = time.perf_counter()
    k, fmt, baselines = _checked(config, settings)
    # The bundle first: a broken one should fail before minutes of clustering. Its checks
    # (every file present, tokenizer and encoder from one run, index width) cover the
    # files loaded again below for bulk encoding.
    bundle = Bundle.load(config.models_dir)
    session, tokenizer = _encoder(config.models_dir, settings.index.threads)
    log(f"model bundle {config.models_dir}: {bundle.size:,} indexed questions, dim {bundle.dim}")

    clustered = clusters_from_file(
        config.data, fmt, settings, split=config.split, report_dir=config.gate_reports, log=log
    )
    clustered = cap_queries(clustered, config.max_queries, settings.seed, log=log)
    cluster_seconds = time.perf_counter() - started
    corpus, duplicates = _corpus(config, clustered.questions, bundle.size, log)

    texts = corpus["text"].tolist()
    log(f"encoding {len(texts):,} questions with {Path(config.models_dir) / ENCODER_FILE}")
    encode_started = time.perf_counter()
    vectors = encode_corpus(
        session, tokenizer, texts, batch_size=settings.index.encode_batch_size, log=log
    )
    encode_seconds = time.perf_counter() - encode_started
    index_started = time.perf_counter()
    index, index_summary = _build_index(settings, vectors, config.exact, log)
    index_seconds = time.perf_counter() - index_started

    ids = IdMap(corpus["question_id"].to_numpy(np.int64))
    queries = clustered.queries
    task = SearchTask(texts, ids.qids, queries, ids.to_rows(queries.query_ids), k)
    served = _served_systems(
        bundle, settings, (index, vectors), corpus, clustered.questions, task, log
    )
    systems = served.systems
    calibration = _calibrated(config, served, clustered.questions, task, settings, log)
    for baseline in baselines:
        log(f"baseline {baseline}: {len(task.query_rows):,} queries over {len(corpus):,} questions")
        systems.update(
            run_baselines([baseline], task, settings, tokenizer, max_len=bundle.max_len, log=log)
        )

    summary: dict[str, Any] = {
        "data": str(config.data),
        "format": fmt,
        "split": config.split,
        "k": k,
        "models_dir": config.source or str(config.models_dir),
        "bundle_fingerprint": bundle.fingerprint,
        "with_model_index": config.with_model_index,
        "max_queries": config.max_queries,
        "index": index_summary,
        "served_index": served.index,
        "no_answer": served.no_answer,
        "calibration": None if calibration is None else calibration.as_json(),
        "counts": {
            **clustered.counts,
            "model_index_questions": bundle.size if config.with_model_index else 0,
            "model_index_added": bundle.size - duplicates if config.with_model_index else 0,
            "model_index_duplicates": duplicates,
            "index_size": int(index.ntotal),
        },
        "systems": {
            name: {
                **result.summary,
                **served.no_answer["systems"].get(name, {}),
                "p50_ms": served.p50_ms.get(name),
                "seconds": result.seconds,
            }
            for name, result in systems.items()
        },
        "seconds": {
            "clusters": cluster_seconds,
            "encode": encode_seconds,
            "questions_per_s": len(texts) / max(encode_seconds, 1e-9),
            "index": index_seconds,
            "total": time.perf_counter() - started,
        },
    }
    return FileEvaluation(summary=summary, queries=queries, systems=systems)


def _checked(config: EvaluateFileConfig, settings: Settings) -> tuple[int, Format, list[str]]:
    """(k, the data's format, the baselines asked for), or EvaluateFileError."""
    k = settings.evaluate.k if config.k is None else config.k
    if k < 1:
        raise EvaluateFileError(f"k must be >= 1, got {k}")
    if config.split not in ("all", "test"):
        raise EvaluateFileError(f"unknown split {config.split!r}; expected all or test")
    if config.max_queries is not None and config.max_queries < 1:
        raise EvaluateFileError(f"max_queries must be >= 1, got {config.max_queries}")
    baselines = _parse_baselines(config.baselines)
    data = Path(config.data)
    fmt: Format = detect_format(data) if config.fmt == "auto" else config.fmt  # type: ignore[assignment]
    if fmt not in FORMATS:
        raise EvaluateFileError(f"unknown format {config.fmt!r}; expected auto, quora or logs")
    return k, fmt, baselines


def _corpus(
    config: EvaluateFileConfig,
    file_questions: pd.DataFrame,
    bundle_size: int,
    log: Callable[[str], None],
) -> tuple[pd.DataFrame, int]:
    """(the index corpus: question_id, text; the bundle questions left out as copies)."""
    corpus = file_questions[["question_id", "text"]]
    if not config.with_model_index:
        return corpus, 0
    model_questions = pd.read_parquet(Path(config.models_dir) / QUESTIONS_FILE, columns=["text"])
    corpus, duplicates = merge_model_questions(file_questions, model_questions)
    log(
        f"model index: {bundle_size - duplicates:,} of its {bundle_size:,} questions added "
        f"as distractors ({duplicates:,} left out: the text of a question already in)"
    )
    return corpus, duplicates


def _build_index(
    settings: Settings, vectors: np.ndarray, exact: bool | None, log: Callable[[str], None]
) -> tuple[Any, dict[str, Any]]:
    """(the FAISS index of `vectors`, what it is: results.json's "index"). Exact (Flat)
    when asked, or by default up to EXACT_MAX_QUESTIONS; else params' index."""
    from qpr.retrieval.dense import IndexConfig, build_index, ef_search_of, fit_factory

    if exact is None:
        exact = len(vectors) <= EXACT_MAX_QUESTIONS
    factory = "Flat" if exact else settings.index.factory
    index = build_index(
        vectors,
        IndexConfig.from_settings(settings.index, factory=factory),
        seed=settings.seed,
        log=log,
    )
    fitted, _ = fit_factory(factory, *vectors.shape)  # what build_index built, as a string
    return index, {
        "factory": fitted,
        "requested_factory": factory,
        "nprobe": settings.index.nprobe if "IVF" in fitted else None,
        "ef_search": ef_search_of(index),
    }


def _model_system(
    index: Any, vectors: np.ndarray, task: SearchTask, log: Callable[[str], None]
) -> SystemResult:
    """The bundle's encoder: each query's vector searched, itself excluded, scored."""
    started = time.perf_counter()
    distances, rows = _search_with_progress(index, vectors, task.query_rows, task.k, log)
    result = score_system(
        "encoder",
        task.queries,
        rows,
        distances,
        task.row_to_qid,
        higher_is_better=False,
        seconds=time.perf_counter() - started,
    )
    log(
        f"encoder alone: success@1 {result.summary['success_1']:.4f} over "
        f"{len(task.queries.query_ids):,} queries"
    )
    return result


@dataclass(frozen=True)
class _Served:
    """The three systems measured as served (`_served_systems`) and around them."""

    systems: dict[str, SystemResult]
    index: dict[str, Any]
    no_answer: dict[str, Any]
    p50_ms: dict[str, float | None]
    bundle: Any  # the bundle serving the file's questions
    alone: QuerySet  # the file's questions with no paraphrase
    alone_top1: np.ndarray  # float64 [U] their served first hits' distances


def _served_systems(
    bundle: Any,
    settings: Settings,
    dense: tuple[Any, np.ndarray],
    corpus: pd.DataFrame,
    file_questions: pd.DataFrame,
    task: SearchTask,
    log: Callable[[str], None],
) -> _Served:
    """served (`qpr.evaluation.served`), encoder alone (the exact index unless asked
    otherwise) and BM25 alone, on the same queries and questions; with the bundle's
    threshold applied to each first hit's distance, and p50 latencies."""
    from qpr.evaluation.no_answer import row_clusters
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.bundle import IndexedQuestions

    index, vectors = dense
    qids = corpus["question_id"].to_numpy(np.int64)
    corpus = corpus.assign(cluster_id=row_clusters(qids, file_questions))
    bm25 = BM25Index.build(corpus["text"].tolist(), **served_mod.bm25_settings(bundle, settings))
    served, served_index = served_mod.served_bundle(bundle, settings, vectors, corpus, bm25, log)
    systems = {
        "served": served_mod.served_system(served, task, log),
        "encoder": _model_system(index, vectors, task, log),
        "bm25_alone": served_mod.lexical_system(bm25, task, log),
    }
    alone = served_mod.singleton_queries(file_questions, settings.seed)
    no_answer, alone_top1 = _no_answer(
        bundle.search_config.threshold, systems, alone, served, dense, task, log
    )
    encoder = bundle.with_questions(
        IndexedQuestions(index, task.row_to_qid, task.index_texts, np.full(len(vectors), -1)),
        dense_only=True,
    )
    texts, k = task.queries.texts, task.k + 1
    p50 = {
        "served": served_mod.median_ms(lambda q: served.search(q, k), texts),
        "encoder": served_mod.median_ms(lambda q: encoder.search(q, k), texts),
        "bm25_alone": served_mod.median_ms(lambda q: bm25.search(q, k), texts),
    }
    return _Served(systems, served_index, no_answer, p50, served, alone, alone_top1)


def _no_answer(
    threshold: float | None,
    systems: dict[str, SystemResult],
    alone: QuerySet,
    served: Any,
    dense: tuple[Any, np.ndarray],
    task: SearchTask,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], np.ndarray]:
    """The bundle's threshold on each system with distances: answered share and P@1
    among answered over the queries, false-answer rate over the file's questions with no
    paraphrase (`served.singleton_queries`; None when it has none). With the served
    first hits' distances of those questions (float64 [U])."""
    from qpr.evaluation.threshold import outcome
    from qpr.retrieval.dense import IdMap, search

    index, vectors = dense
    rows = IdMap(np.asarray(task.row_to_qid, np.int64)).to_rows(alone.query_ids)
    if len(rows):
        log(f"no answer: {len(rows):,} questions with no paraphrase in the file")
        encoder_top1 = search(index, vectors[rows], 1, exclude=rows)[0][:, 0]
        served_top1 = served_mod.served_top1(served, alone.texts, alone.query_ids, log)
    else:
        encoder_top1 = served_top1 = np.zeros(0)
    unanswerable = {"served": served_top1, "encoder": encoder_top1}
    measured = {
        name: outcome(threshold, systems[name], unanswerable[name]) for name in unanswerable
    }
    return {
        "threshold": threshold,
        "no_paraphrase_questions": len(rows),
        "systems": {
            name: {key: values[key] for key in _NO_ANSWER_KEYS} for name, values in measured.items()
        },
    }, served_top1


def save_calibrated(models_dir: Path, out: Path, calibration: Calibration, data_name: str) -> Path:
    """Copy the bundle in `models_dir` to the new folder `out` with the calibrated
    threshold in its search.json (chosen_on names the file); returns `out`.

    Files are hard-linked where the file system allows (search.json is replaced, never
    written through a link), else copied. The copy is built beside `out` and renamed into
    place, so `out` is whole or absent. EvaluateFileError when `out` already exists: a
    bundle is never merged into another folder.
    """
    import os
    import shutil
    import tempfile

    from qpr.artifacts import SearchConfig

    out = Path(out)
    if out.exists():
        raise EvaluateFileError(f"{out} exists: name a new folder for the calibrated bundle")
    out.parent.mkdir(parents=True, exist_ok=True)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    building = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        staged = building / "bundle"
        # Hidden folders are the service's caches (.registry-cache), not the bundle.
        shutil.copytree(
            models_dir, staged, copy_function=link_or_copy, ignore=shutil.ignore_patterns(".*")
        )
        config = replace(
            SearchConfig.read(models_dir),
            threshold=calibration.threshold,
            chosen_on=f"calibration on {data_name}",
            target_precision=calibration.target_precision,
            val_answered_share=calibration.calibration["answered_share"],
        )
        config.write(staged)
        staged.rename(out)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return out


def _calibrated(
    config: EvaluateFileConfig,
    served: _Served,
    questions: pd.DataFrame,
    task: SearchTask,
    settings: Settings,
    log: Callable[[str], None],
) -> Calibration | None:
    """The calibration config asks for (None: none), its bundle saved when asked."""
    if not (config.calibrate or config.save_calibrated is not None):
        return None
    calibration = _calibration(served, questions, task, settings, log)
    if config.save_calibrated is not None:
        saved = save_calibrated(
            config.models_dir, config.save_calibrated, calibration, Path(config.data).name
        )
        log(f"calibrated bundle (threshold {calibration.threshold}) written to {saved}")
    return calibration


def _calibration(
    served: _Served,
    questions: pd.DataFrame,
    task: SearchTask,
    settings: Settings,
    log: Callable[[str], None],
) -> Calibration:
    """A threshold chosen on half the file's clusters, checked on the other half
    (`qpr.evaluation.calibrate`), by the evaluate stage's rule and params."""
    from qpr.evaluation.no_answer import query_clusters

    queries = task.queries
    clusters = query_clusters(queries, questions)
    depth = int(pd.Series(clusters).value_counts().max()) + 1 if clusters.size else 1
    log(f"calibration: {len(clusters):,} queries searched without their cluster, top {depth}")
    held = served_mod.served_top1_without_cluster(served.bundle, queries, clusters, depth, log)
    # The questions with no paraphrase are split in halves by their own seeded draw.
    alone_half = np.random.default_rng(settings.seed + 1).random(len(served.alone_top1)) < 0.5
    unanswerable = np.concatenate([held, served.alone_top1])
    in_half = np.concatenate([halves(clusters, settings.seed), alone_half])
    return calibrate(
        served.systems["served"].top1,
        top1_correct(served.systems["served"]),
        clusters,
        (unanswerable, in_half),
        bundle_threshold=served.bundle.search_config.threshold,
        target_precision=settings.evaluate.target_precision,
        max_false_answer_rate=settings.evaluate.max_false_answer_rate,
        seed=settings.seed,
    )


def write_report(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """results.json (everything in ``summary``) and results.md (the table) in out_dir.

    Both hold counts, measures and timings only, never question text, so they can be
    shared when the data's licence forbids sharing the questions.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = write_text_atomic(out_dir / "results.json", json.dumps(summary, indent=2) + "\n")
    counts = summary["counts"]
    rows = [
        {"system": SYSTEM_LABELS.get(name, name), **values}
        for name, values in summary["systems"].items()
    ]
    extra = (
        f", {counts['model_index_added']:,} of them from the model's own index"
        if summary["with_model_index"]
        else ""
    )
    sampled = (
        f" (a seeded sample of its {counts['queries_before_cap']:,})"
        if "queries_before_cap" in counts
        else ""
    )
    md_path = write_text_atomic(
        out_dir / "results.md",
        f"# {summary['data']} ({summary['format']}, split {summary['split']})\n\n"
        f"Model bundle `{summary['models_dir']}` "
        f"(fingerprint {summary['bundle_fingerprint'][:12]}). "
        f"{counts['queries']:,} queries{sampled} from {counts['clusters']:,} clusters; index of "
        f"{counts['index_size']:,} questions{extra} ({summary['index']['factory']}"
        + (f", nprobe {summary['index']['nprobe']}" if summary["index"]["nprobe"] else "")
        + (f", efSearch {summary['index']['ef_search']}" if summary["index"]["ef_search"] else "")
        + f"); top {summary['k']}, each query excluded from its own results. "
        "P@N = success@N (a paraphrase among the first N); MRR = reciprocal rank.\n\n"
        + _served_note(summary)
        + format_table(rows, REPORT_COLUMNS, floatfmt=".4f")
        + f"\nTotal {summary['seconds']['total']:.1f} s.\n",
    )
    return json_path, md_path


def _grams(bm25: dict[str, Any]) -> str:
    """'character 3-grams, ' for a chars BM25's settings, '' for words."""
    return f"character {bm25['ngram']}-grams, " if bm25.get("analyzer") == "chars" else ""


def _served_note(summary: dict[str, Any]) -> str:
    """What the served row is: the bundle's fusion, depth, re-ranker and threshold."""
    served, no_answer = summary["served_index"], summary["no_answer"]
    fusion = served["fusion"]
    how = (
        f"fused with BM25 at dense weight {fusion['dense_weight']:g} "
        f"({_grams(served['bm25'])}{served['bm25']['stemmer'] or 'no'} stemmer, "
        f"k1 {served['bm25']['k1']:g}, "
        f"b {served['bm25']['b']:g})"
        if fusion
        else "dense ranking alone"
    )
    depth = ", ".join(
        f"{key} {served[key]}" for key in ("nprobe", "ef_search") if served[key] is not None
    )
    rerank = f", top {served['rerank_top']} re-ranked" if served["rerank_top"] else ""
    threshold = no_answer["threshold"]
    limit = f"threshold {threshold:.4g}" if threshold is not None else "no threshold"
    false = (
        f"false answers over {no_answer['no_paraphrase_questions']:,} questions of the file "
        "with no paraphrase"
        if no_answer["no_paraphrase_questions"]
        else "false answers not measurable (every question of the file has a paraphrase)"
    )
    return (
        f"served: the bundle's search over the file's questions ({served['factory']}"
        f"{', ' + depth if depth else ''}), {how}{rerank}, {limit}, through "
        "Bundle.search_batch. Answered, P@1 answered and false answers: that threshold on "
        f"the first hit's distance; {false}. p50 ms: one query a call, "
        f"{served_mod.TIMED_QUERIES} queries.\n\n"
    )

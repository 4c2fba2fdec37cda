"""Clusters from QA logs in shards, with bounded memory, on any engine.

The cluster stage's log path as phases of small tasks over files, run by a
`qpr.tasks.Mapper` (this process, or Ray through flows/engine.py). Memory holds one group of
log files, one range of questions or one bucket of clusters at a time, plus a few numbers a
cluster for the splits (measured against N in docs/results/cluster_scale.md).

1. **clean**, a task a group of log files (about `GROUP_BYTES`): read, raw-log gate, clean,
   clean-log gate, and the group's counts (`qpr.data.clustering.log_counts`) sorted by
   normalised text, with a sample of its texts.
2. **merge**, a task a range of normalised texts (about `cluster.shard_rows` questions;
   bounds from the samples): every group's counts in the range summed, and each distinct
   question's text and cluster (`questions_from_counts`). Written in text order, and in one
   part for each cluster bucket (a range of cluster ids).
3. **clusters**, a task a bucket: each cluster's size and coherence.
4. **splits and pairs**, in the driver: the clusters filtered and split (`qpr.data.splits`).
   Then one pass over the buckets in cluster order draws the positive pairs with one
   generator, as the in-memory stage does, and one pass over the ranges writes the
   questions in text order. Each piece is gated before it is written.

The outputs equal the in-memory stage's (`qpr.data.dataset.build_clusters`, tested) with
one exception: cleaning drops a repeated row (same time, question and answer) only within
a group of files, so a row logged in two groups counts twice.

Task files are named by a digest of their inputs and written atomically. A retried task
writes the same bytes, and a killed stage resumes at the first task not done.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from qpr.artifacts import CLUSTER_PAIRS_FILE, CLUSTER_QUESTIONS_FILE, CLUSTERS_FILE
from qpr.config import QualitySettings, Settings
from qpr.data.clustering import cluster_frame, log_counts, questions_from_counts, tag_counts
from qpr.data.dataset import cluster_metrics
from qpr.data.ingest import coherence_threshold
from qpr.data.loaders import DropReport, clean_logs, log_files, read_log_file
from qpr.data.splits import (
    NO_SPLIT,
    assign_splits,
    filter_clusters,
    positive_pairs,
    require_enough_clusters,
)
from qpr.io import atomic_path, digest, write_json_atomic
from qpr.quality.data_gates import (
    gate_clean_logs,
    gate_cluster_piece,
    gate_cluster_totals,
    gate_raw_logs,
)
from qpr.tasks import Mapper, local_map

__all__ = ["GROUP_BYTES", "ShardedClusters", "cluster_logs", "file_groups"]

FORMAT = "qpr-cluster-shards/1"
# Log files are cleaned and gated in groups of about this many bytes: the embedded logs'
# daily files make one group (one gate, as a batch), a scale corpus' shards one each.
GROUP_BYTES = 16 * 1024**2
SAMPLES = 1024  # normalised texts a group samples to set the ranges' bounds
ROW_GROUP = 65_536  # counts are read back by range: row groups let Parquet skip the rest
Log = Callable[[str], None]


# ---------------------------------------------------------------- tasks


@dataclass(frozen=True)
class CleanTask:
    """Read, gate and clean a group of log files; count its questions into `out`.*"""

    files: tuple[Path, ...]
    quality: QualitySettings
    report_dir: Path
    part: str  # names the gate reports; "" for a single group (raw_logs.json, ...)
    out: Path
    fields: tuple[str, ...] = ()  # metadata columns counted too (data.filter_fields)


@dataclass(frozen=True)
class MergeTask:
    """The distinct questions whose normalised text is in [lo, hi) (None: unbounded)."""

    counts: tuple[Path, ...]
    lo: str | None
    hi: str | None
    bucket_bits: int
    out: Path
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterTask:
    """Size, coherence and answer of each cluster of one bucket."""

    parts: tuple[Path, ...]
    out: Path


def _write_parquet(frame: pd.DataFrame, path: Path) -> Path:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP)
    return path


def clean_group(task: CleanTask) -> dict:
    """Run one CleanTask (skipped when done): its drop report, distinct texts and sample."""
    done = task.out.with_suffix(".json")
    if done.is_file():
        return json.loads(done.read_text())
    quality = task.quality
    raw = pd.concat([read_log_file(f) for f in task.files], ignore_index=True, sort=False)
    gate_raw_logs(raw, quality, task.report_dir, part=task.part)
    clean, drops = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    del raw
    gate_clean_logs(clean, quality, task.report_dir, part=task.part)
    forms, votes = log_counts(clean)
    _write_parquet(forms, task.out.with_suffix(".forms.parquet"))
    _write_parquet(votes, task.out.with_suffix(".votes.parquet"))
    if task.fields:
        _write_parquet(tag_counts(clean, task.fields), task.out.with_suffix(".tags.parquet"))
    keys = votes["norm_key"].drop_duplicates().to_numpy()
    step = max(1, len(keys) // SAMPLES)
    summary = {
        "rows_in": drops.rows_in,
        "rows_out": drops.rows_out,
        "dropped": dict(drops.dropped),
        "examples": drops.examples,
        "distinct": len(keys),
        "sample": [str(k) for k in keys[::step]],
    }
    write_json_atomic(done, summary)
    return summary


def _read_range(task: MergeTask, kind: str) -> pd.DataFrame:
    """Every group's `kind` counts (forms, votes or tags) in the task's range. The files are in
    text order, so Parquet reads only the row groups that can hold the range."""
    bounds = [("norm_key", ">=", task.lo)] if task.lo is not None else []
    bounds += [("norm_key", "<", task.hi)] if task.hi is not None else []
    tables = [
        pq.read_table(c.with_suffix(f".{kind}.parquet"), filters=bounds or None)
        for c in task.counts
    ]
    return pa.concat_tables(tables).to_pandas()


def bucket_of(cluster_ids: np.ndarray, bits: int) -> np.ndarray:
    """int64 [n] → the bucket of each (non-negative, 63-bit) cluster id: its top `bits` bits,
    so bucket order is cluster-id order."""
    return (np.asarray(cluster_ids, dtype=np.int64) >> (63 - bits)).astype(np.int64)


def merge_range(task: MergeTask) -> dict:
    """Run one MergeTask (skipped when done): the range's questions in text order
    (`out`.parquet) and one part a cluster bucket (`out`.cNNNN.parquet)."""
    done = task.out.with_suffix(".json")
    if done.is_file():
        return json.loads(done.read_text())
    tags = _read_range(task, "tags") if task.fields else None
    questions, counts = questions_from_counts(
        _read_range(task, "forms"), _read_range(task, "votes"), tags, task.fields
    )
    _write_parquet(questions, task.out.with_suffix(".parquet"))
    buckets = bucket_of(questions["cluster_id"].to_numpy(), task.bucket_bits)
    parts = questions.drop(columns="norm_key")
    for bucket in np.unique(buckets):
        _write_parquet(parts[buckets == bucket], task.out.with_suffix(f".c{bucket:04d}.parquet"))
    summary = {**counts, "buckets": [int(b) for b in np.unique(buckets)]}
    write_json_atomic(done, summary)
    return summary


def cluster_bucket(task: ClusterTask) -> Path:
    """Run one ClusterTask (skipped when done): cluster_id, source_key, size, coherence."""
    if task.out.is_file():
        return task.out
    questions = pd.concat([pd.read_parquet(p) for p in task.parts], ignore_index=True)
    source_of = dict(zip(questions["cluster_id"], questions["answer_id"], strict=True))
    return _write_parquet(cluster_frame(questions, source_of), task.out)


# ---------------------------------------------------------------- the stage


@dataclass
class ShardedClusters:
    """What `cluster_logs` wrote: the clusters with their splits (small: one row a
    cluster, no text), the stage's metrics and the drop report."""

    clusters: pd.DataFrame
    metrics: dict[str, float | int]
    drops: DropReport
    seconds: dict[str, float]


def file_groups(files: Sequence[Path], group_bytes: int | None = None) -> list[tuple[Path, ...]]:
    """Consecutive files, a group holding at most `group_bytes` (default GROUP_BYTES)
    unless one file alone is larger."""
    limit = group_bytes or GROUP_BYTES
    groups: list[list[Path]] = []
    size = 0
    for file in files:
        grows = file.stat().st_size
        if not groups or size + grows > limit:
            groups.append([])
            size = 0
        groups[-1].append(file)
        size += grows
    return [tuple(g) for g in groups]


def _bounds(summaries: Sequence[dict], ranges: int) -> list[str]:
    """At most ranges - 1 increasing texts cutting the pooled samples into equal parts.
    Each is a question's text, so no range is empty."""
    pooled = sorted({k for s in summaries for k in s["sample"]})
    return sorted({pooled[i * len(pooled) // ranges] for i in range(1, ranges)} if pooled else ())


def _merge_drops(summaries: Sequence[dict]) -> DropReport:
    report = DropReport()
    for s in summaries:
        report.rows_in += s["rows_in"]
        report.rows_out += s["rows_out"]
        report.dropped.update(s["dropped"])
        for reason, examples in s["examples"].items():
            kept = report.examples.setdefault(reason, [])
            kept.extend(examples[: 3 - len(kept)])
    return report


def cluster_logs(
    settings: Settings,
    out_dir: Path,
    *,
    work_dir: Path,
    report_dir: Path,
    engine: Mapper = local_map,
    log: Log = print,
) -> ShardedClusters:
    """The cluster stage over the logs at data.path: questions, clusters and pairs .parquet
    written into `out_dir` (a staging folder the caller swaps in). Raises GateFailed when a
    gate fails; finished tasks stay in `work_dir` for the next run."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    groups = file_groups(log_files(settings.data.path))
    quality, fields = settings.quality, settings.data.filter_fields
    cleans = [
        CleanTask(
            group,
            quality,
            report_dir,
            part=group[0].stem if len(groups) > 1 else "",
            out=work_dir / "counts" / digest(FORMAT, *group, quality.model_dump_json(), *fields),
            fields=fields,
        )
        for group in groups
    ]
    log(f"cluster: cleaning {sum(map(len, groups)):,} log files in {len(groups)} group(s)")
    summaries = engine(clean_group, cleans)
    drops = _merge_drops(summaries)
    log(f"read {drops.rows_in:,} log rows from {settings.data.path}; {drops.summary()}")
    seconds["clean"] = time.perf_counter() - started

    started = time.perf_counter()
    distinct = sum(s["distinct"] for s in summaries)
    bits = max(0, math.ceil(math.log2(max(1.0, distinct / settings.cluster.shard_rows))))
    edges = [None, *_bounds(summaries, 2**bits), None]
    counts, names = tuple(c.out for c in cleans), [c.out.name for c in cleans]
    merges = [
        MergeTask(
            counts,
            lo,
            hi,
            bits,
            work_dir / "ranges" / digest(*names, repr(lo), repr(hi), bits, *fields),
            fields,
        )
        for lo, hi in itertools.pairwise(edges)
    ]
    log(f"cluster: {len(merges)} text range(s), {2**bits} cluster bucket(s)")
    merged = engine(merge_range, merges)
    seconds["merge"] = time.perf_counter() - started

    started = time.perf_counter()
    buckets = []
    for bucket in range(2**bits):
        holding = [m for m, s in zip(merges, merged, strict=True) if bucket in s["buckets"]]
        parts = tuple(m.out.with_suffix(f".c{bucket:04d}.parquet") for m in holding)
        if parts:
            out = work_dir / "clusters" / f"{digest(*(p.name for p in parts))}.parquet"
            buckets.append(ClusterTask(parts, out))
    engine(cluster_bucket, buckets)
    seconds["clusters"] = time.perf_counter() - started

    started = time.perf_counter()
    clusters = _split_clusters(settings, [b.out for b in buckets])
    log(f"cluster: writing {len(clusters):,} clusters, gated piece by piece")
    per_split = _write_outputs(settings, out_dir, clusters, merges, buckets, report_dir)
    gate_cluster_totals(
        clusters,
        {name: sorted(splits) for name, splits in per_split.items()},
        settings,
        coherence_threshold(settings),
        report_dir,
    )
    seconds["write"] = time.perf_counter() - started
    metrics: dict[str, float | int] = {
        **drops.as_metrics(),
        "questions": sum(m["questions"] for m in merged),
        "answers": len(clusters),
        "questions_multi_answer": sum(m["questions_multi_answer"] for m in merged),
    }
    # A normalised text is one question here, so no text can be in two splits.
    metrics.update(
        cluster_metrics(clusters, per_split["questions"], per_split["pairs"], leaked=0, shrunk=0)
    )
    return ShardedClusters(clusters, metrics, drops, seconds)


def _split_clusters(settings: Settings, files: Sequence[Path]) -> pd.DataFrame:
    """Every cluster's size, coherence, kept / drop reason and split, in cluster-id order."""
    columns = ["cluster_id", "size", "coherence"]
    frames = [pd.read_parquet(f, columns=columns) for f in files]
    clusters = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    params = settings.cluster
    threshold = coherence_threshold(settings)
    clusters = filter_clusters(
        clusters, coherence_threshold=threshold, min_size=params.min_cluster_size
    )
    ratios = params.split.model_dump()
    require_enough_clusters(
        clusters,
        ratios,
        tolerance=settings.quality.split_ratio_tolerance,
        min_size=params.min_cluster_size,
        source=settings.data.path,
    )
    return assign_splits(clusters, ratios, seed=settings.seed)


class _Writer:
    """Appends frames to one Parquet file, the schema set by the first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: pq.ParquetWriter | None = None

    def write(self, frame: pd.DataFrame) -> None:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table.cast(self.writer.schema))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _write_outputs(
    settings: Settings,
    out_dir: Path,
    clusters: pd.DataFrame,
    merges: Sequence[MergeTask],
    buckets: Sequence[ClusterTask],
    report_dir: Path,
) -> dict[str, Counter]:
    """pairs, clusters and questions .parquet, piece by piece, each piece gated; how many
    questions and pairs each split got."""
    ids = clusters["cluster_id"].to_numpy()
    split_of = np.where(clusters["split"] == "dropped", NO_SPLIT, clusters["split"])
    pieces = report_dir / "pieces"
    counts: dict[str, Counter] = {"questions": Counter(), "pairs": Counter()}
    rng = np.random.default_rng(settings.seed)  # one generator over the clusters in order
    pairs_out, clusters_out = (
        _Writer(out_dir / CLUSTER_PAIRS_FILE),
        _Writer(out_dir / CLUSTERS_FILE),
    )
    done = 0
    for i, bucket in enumerate(buckets):
        parts = [pd.read_parquet(p, columns=["question_id", "cluster_id"]) for p in bucket.parts]
        questions = pd.concat(parts, ignore_index=True)
        questions["split"] = split_of[np.searchsorted(ids, questions["cluster_id"].to_numpy())]
        pairs = positive_pairs(
            questions, max_per_cluster=settings.cluster.max_pairs_per_cluster, seed=rng
        )
        gate_cluster_piece({"pairs": pairs}, settings, pieces, f"pairs-{i:04d}")
        pairs_out.write(pairs)
        counts["pairs"].update(pairs["split"].value_counts().to_dict())
        described = pd.read_parquet(bucket.out)
        rows = clusters.iloc[done : done + len(described)]
        done += len(described)
        clusters_out.write(
            described.assign(**{c: rows[c].to_numpy() for c in ("kept", "drop_reason", "split")})
        )
    pairs_out.close()
    clusters_out.close()

    questions_out = _Writer(out_dir / CLUSTER_QUESTIONS_FILE)
    for i, merge in enumerate(merges):
        questions = pd.read_parquet(merge.out.with_suffix(".parquet")).drop(columns="answer_id")
        questions["split"] = split_of[np.searchsorted(ids, questions["cluster_id"].to_numpy())]
        gate_cluster_piece({"questions": questions}, settings, pieces, f"questions-{i:04d}")
        questions_out.write(questions)
        counts["questions"].update(questions["split"].value_counts().to_dict())
    questions_out.close()
    return counts

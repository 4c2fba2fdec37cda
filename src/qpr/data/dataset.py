"""The cluster stage's data set, in memory (Quora pairs; logs go in shards through
`qpr.data.sharded`, whose output equals this one's): a source's raw clusters filtered by coherence
and size, split 80:10:10 by cluster, leakage between splits removed, positive pairs drawn,
gated, and the counts that describe it.

Frames (what the stage writes, see `qpr.pipeline.cluster`):

- questions  question_id, text, norm_key, cluster_id, split (train/val/test/none);
             every row is an index question
- clusters   cluster_id, source_key, size, coherence, kept, drop_reason, split
- pairs      q1_id, q2_id, cluster_id, split (positive pairs, q1_id < q2_id)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from qpr.config import Settings
from qpr.data.ingest import coherence_threshold, load_source
from qpr.data.loaders import DropReport
from qpr.data.splits import (
    SPLITS,
    apply_splits,
    assign_splits,
    filter_clusters,
    positive_pairs,
    require_enough_clusters,
    shrink_small_clusters,
)
from qpr.quality.data_gates import gate_clusters


def build_clusters(
    settings: Settings, report_dir: Path, log: Callable[[str], None] = print
) -> tuple[dict[str, pd.DataFrame], dict[str, float | int], DropReport]:
    """Everything the stage computes, in memory: frames, metrics and the drop report.
    Raises GateFailed (reports in `report_dir`) when a data gate fails."""
    questions, clusters, counts, drops = load_source(settings, report_dir, log)

    params = settings.cluster
    threshold = coherence_threshold(settings)
    clusters = filter_clusters(
        clusters, coherence_threshold=threshold, min_size=params.min_cluster_size
    )
    require_enough_clusters(
        clusters,
        params.split.model_dump(),
        tolerance=settings.quality.split_ratio_tolerance,
        min_size=params.min_cluster_size,
        source=settings.data.path,
    )
    clusters = assign_splits(clusters, params.split.model_dump(), seed=settings.seed)
    questions, leaked = apply_splits(questions, clusters)
    questions, clusters, shrunk = shrink_small_clusters(
        questions, clusters, min_size=params.min_cluster_size
    )
    pairs = positive_pairs(
        questions, max_per_cluster=params.max_pairs_per_cluster, seed=settings.seed
    )
    frames = {"questions": questions, "clusters": clusters, "pairs": pairs}
    gate_clusters(frames, settings, threshold, report_dir)

    metrics: dict[str, float | int] = {**drops.as_metrics(), **counts}
    metrics.update(
        cluster_metrics(
            clusters,
            questions["split"].value_counts().to_dict(),
            pairs["split"].value_counts().to_dict(),
            leaked=leaked,
            shrunk=shrunk,
        )
    )
    return frames, metrics, drops


def cluster_metrics(
    clusters: pd.DataFrame,
    questions_per_split: Mapping[str, int],
    pairs_per_split: Mapping[str, int],
    *,
    leaked: int,
    shrunk: int,
) -> dict[str, float | int]:
    """Counts of the built data set: clusters kept and dropped (and why), leakage removed,
    the index size, the median coherence kept, clusters / questions / pairs per split.
    `questions_per_split` counts every question, "none" included."""
    kept = clusters[clusters["kept"]]
    dropped = clusters[~clusters["kept"]]
    metrics: dict[str, float | int] = {
        "clusters_total": len(clusters),
        "clusters_kept": len(kept),
        "clusters_dropped_incoherent": int((dropped["drop_reason"] == "incoherent").sum()),
        "clusters_dropped_too_small": int(
            dropped["drop_reason"].isin(["too_small", "too_small_after_leakage"]).sum()
        ),
        "questions_leakage_removed": leaked,
        "clusters_shrunk_by_leakage": shrunk,
        "index_size": int(sum(questions_per_split.values())),
        "coherence_median_kept": float(kept["coherence"].median()) if len(kept) else 0.0,
    }
    for split in SPLITS:
        metrics[f"clusters_{split}"] = int((kept["split"] == split).sum())
        metrics[f"questions_{split}"] = int(questions_per_split.get(split, 0))
        metrics[f"pairs_{split}"] = int(pairs_per_split.get(split, 0))
    return metrics

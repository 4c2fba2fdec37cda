"""The cluster stage: raw data → gated paraphrase clusters, splits, pairs and index questions.

Outputs (in `out_dir`, replaced atomically only after every gate passed, so a failed run
leaves the previous outputs untouched and writes nothing downstream can pick up):

- questions.parquet  question_id, text, norm_key, cluster_id, split (train/val/test/none);
                     every row is an index question
- clusters.parquet   cluster_id, source_key, size, coherence, kept, drop_reason, split
- pairs.parquet      q1_id, q2_id, cluster_id, split (positive pairs, q1_id < q2_id)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qpr.config import QualitySettings, Settings
from qpr.data.clustering import clusters_from_logs, clusters_from_pairs
from qpr.data.loaders import DropReport, clean_logs, read_logs, read_quora
from qpr.data.splits import (
    SPLITS,
    apply_splits,
    assign_splits,
    filter_clusters,
    positive_pairs,
    shrink_small_clusters,
)
from qpr.quality.gate import gate
from qpr.quality.suites import (
    CLUSTER_ROW_IDS,
    clean_log_expectations,
    cluster_expectations,
    cluster_gate_frames,
    raw_log_expectations,
)

OUTPUT_FILES: tuple[str, ...] = ("questions.parquet", "clusters.parquet", "pairs.parquet")


@dataclass(frozen=True)
class ClusterResult:
    out_dir: Path
    metrics: dict[str, float | int]
    gate_reports: Path
    drop_report: DropReport


def gate_raw_logs(raw: pd.DataFrame, quality: QualitySettings, report_dir: Path | None):
    """The raw-log gate: a batch with more bad rows than the tolerance stops here."""
    return gate(
        "raw_logs",
        {"logs": raw},
        {
            "logs": raw_log_expectations(
                min_chars=quality.min_question_chars,
                max_chars=quality.max_question_chars,
                max_bad_fraction=quality.max_drop_fraction,
            )
        },
        report_dir,
    )


def _load_logs(settings: Settings, report_dir: Path, log: Callable[[str], None]):
    quality = settings.quality
    raw = read_logs(settings.data.path)
    log(f"read {len(raw):,} log rows from {settings.data.path}")
    gate_raw_logs(raw, quality, report_dir)
    clean, drops = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    log(drops.summary())
    gate(
        "clean_logs",
        {"logs": clean},
        {
            "logs": clean_log_expectations(
                min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
            )
        },
        report_dir,
    )
    questions, clusters, counts = clusters_from_logs(clean)
    return questions, clusters, counts, drops


def _load_quora(settings: Settings, log: Callable[[str], None]):
    pairs, drops = read_quora(settings.data.path)
    log(f"read {len(pairs):,} Quora pairs from {settings.data.path}; {drops.summary()}")
    questions, clusters, counts = clusters_from_pairs(pairs)
    return questions, clusters, counts, drops


def coherence_threshold(settings: Settings) -> float:
    """The coherence filter is for clusters mined from logs, where a generic answer gathers
    unrelated questions (paper section 4.1.1). Quora clusters come from human duplicate
    labels, and the paper's Quora protocol keeps them all (section 4.1.2)."""
    return settings.cluster.coherence_threshold if settings.data.source == "logs" else 0.0


def build_clusters(
    settings: Settings, report_dir: Path, log: Callable[[str], None] = print
) -> tuple[dict[str, pd.DataFrame], dict[str, float | int], DropReport]:
    """Everything the stage computes, in memory: frames, metrics and the drop report."""
    if settings.data.source == "logs":
        questions, clusters, counts, drops = _load_logs(settings, report_dir, log)
    else:
        questions, clusters, counts, drops = _load_quora(settings, log)

    params = settings.cluster
    threshold = coherence_threshold(settings)
    clusters = filter_clusters(
        clusters, coherence_threshold=threshold, min_size=params.min_cluster_size
    )
    clusters = assign_splits(clusters, params.split.model_dump(), seed=settings.seed)
    questions, leaked = apply_splits(questions, clusters)
    questions, clusters, shrunk = shrink_small_clusters(
        questions, clusters, min_size=params.min_cluster_size
    )
    pairs = positive_pairs(
        questions, max_per_cluster=params.max_pairs_per_cluster, seed=settings.seed
    )
    kept = clusters[clusters["kept"]]
    frames = {"questions": questions, "clusters": clusters, "pairs": pairs}

    gate(
        "clusters",
        cluster_gate_frames(clusters, questions, pairs, params.split.model_dump()),
        cluster_expectations(
            coherence_threshold=threshold,
            tolerance=settings.quality.split_ratio_tolerance,
            ratios=params.split.model_dump(),
            min_size=params.min_cluster_size,
        ),
        report_dir,
        row_ids=CLUSTER_ROW_IDS,
    )

    metrics: dict[str, float | int] = {**drops.as_metrics(), **counts}
    dropped = clusters[~clusters["kept"]]
    metrics.update(
        {
            "clusters_total": len(clusters),
            "clusters_kept": len(kept),
            "clusters_dropped_incoherent": int((dropped["drop_reason"] == "incoherent").sum()),
            "clusters_dropped_too_small": int(
                dropped["drop_reason"].isin(["too_small", "too_small_after_leakage"]).sum()
            ),
            "questions_leakage_removed": leaked,
            "clusters_shrunk_by_leakage": shrunk,
            "index_size": len(questions),
            "coherence_median_kept": float(kept["coherence"].median()) if len(kept) else 0.0,
        }
    )
    for split in SPLITS:
        metrics[f"clusters_{split}"] = int((kept["split"] == split).sum())
        metrics[f"questions_{split}"] = int((questions["split"] == split).sum())
        metrics[f"pairs_{split}"] = int((pairs["split"] == split).sum())
    return frames, metrics, drops


def plot_coherence(clusters: pd.DataFrame, threshold: float, path: Path) -> Path:
    """Histogram of cluster coherence with the drop threshold: what the filter removed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.linspace(0.0, 1.0, 51)
    ax.hist(clusters["coherence"], bins=bins, color="#4c72b0", alpha=0.85, label="clusters")
    ax.axvline(threshold, color="#c44e52", linestyle="--", label=f"threshold c = {threshold}")
    dropped = int((clusters["drop_reason"] == "incoherent").sum())
    ax.set_title(f"Cluster coherence ({len(clusters):,} clusters, {dropped:,} incoherent dropped)")
    ax.set_xlabel("coherence c (paper eq. 4-5)")
    ax.set_ylabel("clusters")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(frames: dict[str, pd.DataFrame], out_dir: Path) -> Path:
    """Write to a sibling temp directory, then swap it in: readers never see half a stage."""
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, frame in frames.items():
        frame.to_parquet(staging / f"{name}.parquet", index=False)
    previous = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(previous, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(previous)
    staging.rename(out_dir)
    shutil.rmtree(previous, ignore_errors=True)
    return out_dir


def run_cluster(
    settings: Settings,
    *,
    out_dir: Path,
    report_dir: Path,
    plot_path: Path | None = None,
    log: Callable[[str], None] = print,
) -> ClusterResult:
    """The whole stage. Raises GateFailed (nothing written) when a gate fails."""
    report_dir.mkdir(parents=True, exist_ok=True)
    frames, metrics, drops = build_clusters(settings, report_dir, log)
    if plot_path is not None:
        plot_coherence(frames["clusters"], coherence_threshold(settings), plot_path)
    write_outputs(frames, out_dir)
    log(
        f"clusters kept {metrics['clusters_kept']:,} of {metrics['clusters_total']:,} "
        f"(incoherent dropped {metrics['clusters_dropped_incoherent']:,}); pairs "
        + " / ".join(f"{s} {metrics[f'pairs_{s}']:,}" for s in SPLITS)
        + f"; index {metrics['index_size']:,} questions"
    )
    return ClusterResult(
        out_dir=out_dir, metrics=metrics, gate_reports=report_dir, drop_report=drops
    )

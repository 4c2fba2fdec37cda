"""The cluster stage: raw data → gated paraphrase clusters, splits, pairs and index questions
(QA logs in shards on the engine by `qpr.data.sharded`; Quora pairs in memory by
`qpr.data.dataset.build_clusters`).

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

from qpr.artifacts import CLUSTER_PAIRS_FILE, CLUSTER_QUESTIONS_FILE, CLUSTERS_FILE
from qpr.config import Settings
from qpr.data.dataset import build_clusters
from qpr.data.ingest import coherence_threshold
from qpr.data.loaders import DropReport
from qpr.data.sharded import cluster_logs
from qpr.data.splits import SPLITS
from qpr.io import replace_dir
from qpr.tasks import Mapper, local_map


@dataclass(frozen=True)
class ClusterResult:
    out_dir: Path
    metrics: dict[str, float | int]
    gate_reports: Path
    drop_report: DropReport


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


def _staging(out_dir: Path) -> Path:
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _swap_in(staging: Path, out_dir: Path) -> Path:
    """Readers never see half a stage: the old outputs go only once the new are whole."""
    return replace_dir(staging, out_dir)


# The file of each table `build_clusters` makes.
_FILES = {
    "questions": CLUSTER_QUESTIONS_FILE,
    "pairs": CLUSTER_PAIRS_FILE,
    "clusters": CLUSTERS_FILE,
}


def write_outputs(frames: dict[str, pd.DataFrame], out_dir: Path) -> Path:
    """Write to a sibling temp directory, then swap it in."""
    staging = _staging(Path(out_dir))
    for name, frame in frames.items():
        frame.to_parquet(staging / _FILES[name], index=False)
    return _swap_in(staging, Path(out_dir))


def run_cluster(
    settings: Settings,
    *,
    out_dir: Path,
    report_dir: Path,
    work_dir: Path | None = None,
    plot_path: Path | None = None,
    engine: Mapper = local_map,
    log: Callable[[str], None] = print,
) -> ClusterResult:
    """The whole stage. Raises GateFailed (nothing written) when a gate fails.

    Logs are clustered in shards on `engine` (`qpr.data.sharded`; finished tasks kept in
    `work_dir`, default beside `out_dir`, until the stage succeeds); Quora pairs in memory.
    """
    out_dir = Path(out_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    if settings.data.source == "logs":
        work_dir = work_dir or out_dir.with_name(out_dir.name + "-shards")
        staging = _staging(out_dir)
        try:
            built = cluster_logs(settings, staging, work_dir=work_dir, report_dir=report_dir,
                                 engine=engine, log=log)  # fmt: skip
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        clusters, metrics, drops = built.clusters, built.metrics, built.drops
        metrics.update({f"{phase}_seconds": s for phase, s in built.seconds.items()})
        _swap_in(staging, out_dir)
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        frames, metrics, drops = build_clusters(settings, report_dir, log)
        clusters = frames["clusters"]
        write_outputs(frames, out_dir)
    if plot_path is not None:
        plot_coherence(clusters, coherence_threshold(settings), plot_path)
    log(
        f"clusters kept {metrics['clusters_kept']:,} of {metrics['clusters_total']:,} "
        f"(incoherent dropped {metrics['clusters_dropped_incoherent']:,}); pairs "
        + " / ".join(f"{s} {metrics[f'pairs_{s}']:,}" for s in SPLITS)
        + f"; index {metrics['index_size']:,} questions"
    )
    return ClusterResult(
        out_dir=out_dir, metrics=metrics, gate_reports=report_dir, drop_report=drops
    )

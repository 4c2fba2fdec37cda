"""The data gates of the cluster stage, with the bounds params set: raw logs, clean logs,
clusters. A raw batch with more bad rows than `quality.max_drop_fraction` stops at the
first; the last guards coherence, cluster sizes, leakage between splits, split ratios and
the positive pairs. Each writes its report into `report_dir` and raises GateFailed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from qpr.config import QualitySettings, Settings
from qpr.quality.gate import GateResult, gate
from qpr.quality.suites import (
    CLUSTER_ROW_IDS,
    clean_log_expectations,
    cluster_expectations,
    cluster_gate_frames,
    raw_log_expectations,
)


def gate_raw_logs(
    raw: pd.DataFrame, quality: QualitySettings, report_dir: Path | None
) -> GateResult:
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


def gate_clean_logs(
    clean: pd.DataFrame, quality: QualitySettings, report_dir: Path | None
) -> GateResult:
    """The clean-log gate: after cleaning, every row must pass."""
    return gate(
        "clean_logs",
        {"logs": clean},
        {
            "logs": clean_log_expectations(
                min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
            )
        },
        report_dir,
    )


def gate_clusters(
    frames: Mapping[str, pd.DataFrame],
    settings: Settings,
    coherence_threshold: float,
    report_dir: Path | None,
) -> GateResult:
    """The cluster gate on the stage's frames (questions, clusters, pairs)."""
    params = settings.cluster
    return gate(
        "clusters",
        cluster_gate_frames(
            frames["clusters"], frames["questions"], frames["pairs"], params.split.model_dump()
        ),
        cluster_expectations(
            coherence_threshold=coherence_threshold,
            tolerance=settings.quality.split_ratio_tolerance,
            ratios=params.split.model_dump(),
            min_size=params.min_cluster_size,
        ),
        report_dir,
        row_ids=CLUSTER_ROW_IDS,
    )

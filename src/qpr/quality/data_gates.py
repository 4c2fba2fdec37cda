"""The data gates of the cluster stage, with the bounds params set: raw logs, clean logs,
clusters. A raw batch with more bad rows than it may drop (`tolerated_fraction`: the
larger of `quality.max_drop_fraction` and `quality.max_drop_rows` rows) stops at the
first; the last guards coherence, cluster sizes, leakage between splits, split ratios and
the positive pairs. Each writes its report into `report_dir` and raises GateFailed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    split_questions_frame,
    split_share_frame,
    table_level,
)


def tolerated_fraction(rows: int, fraction: float, floor_rows: int) -> float:
    """The share of `rows` the raw gate lets the cleaner drop: up to max(floor_rows,
    fraction × rows) rows. The floor keeps one bad row from condemning a six-row file."""
    if rows <= 0:
        return fraction
    allowed = max(float(floor_rows), fraction * rows)
    # A hair more, so that exactly `allowed` bad rows pass despite float rounding in GX.
    return min(1.0, allowed / rows + 1e-9)


def gate_raw_logs(
    raw: pd.DataFrame, quality: QualitySettings, report_dir: Path | None, *, part: str = ""
) -> GateResult:
    """The raw-log gate: a batch with more bad rows than the tolerance stops here.
    `part` names one batch of several (the report is then raw_logs.PART)."""
    return gate(
        _named("raw_logs", part),
        {"logs": raw},
        {
            "logs": raw_log_expectations(
                min_chars=quality.min_question_chars,
                max_chars=quality.max_question_chars,
                max_bad_fraction=tolerated_fraction(
                    len(raw), quality.max_drop_fraction, quality.max_drop_rows
                ),
            )
        },
        report_dir,
    )


def gate_clean_logs(
    clean: pd.DataFrame, quality: QualitySettings, report_dir: Path | None, *, part: str = ""
) -> GateResult:
    """The clean-log gate: after cleaning, every row must pass."""
    return gate(
        _named("clean_logs", part),
        {"logs": clean},
        {
            "logs": clean_log_expectations(
                min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
            )
        },
        report_dir,
    )


def _named(gate_name: str, part: str) -> str:
    return f"{gate_name}.{part}" if part else gate_name


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


# The sharded cluster stage (`qpr.data.sharded`) gates its output piece by piece, then the
# whole: a piece gets every row-level expectation of its frame; the whole set gets the
# clusters, the splits' shares and the table-level ones (rows at all, every split in pairs),
# checked on one row per split present. Together they check what `gate_clusters` checks.


def _cluster_suites(settings: Settings, coherence_threshold: float) -> dict[str, list]:
    params = settings.cluster
    return cluster_expectations(
        coherence_threshold=coherence_threshold,
        tolerance=settings.quality.split_ratio_tolerance,
        ratios=params.split.model_dump(),
        min_size=params.min_cluster_size,
    )


def gate_cluster_piece(
    frames: Mapping[str, pd.DataFrame], settings: Settings, report_dir: Path | None, name: str
) -> GateResult:
    """One piece of the cluster stage's output: {"questions": ...} or {"pairs": ...}."""
    suites = _cluster_suites(settings, 0.0)
    if "questions" in frames:
        frames = {**frames, "split_questions": split_questions_frame(frames["questions"])}
    checks = {frame: table_level(suites[frame])[0] for frame in frames}
    return gate(f"clusters.{name}", frames, checks, report_dir, row_ids=CLUSTER_ROW_IDS)


def gate_cluster_totals(
    clusters: pd.DataFrame,
    splits: Mapping[str, Sequence[str]],
    settings: Settings,
    coherence_threshold: float,
    report_dir: Path | None,
) -> GateResult:
    """The whole output of the sharded cluster stage: every cluster (no text), and the
    splits its questions and pairs are in (`splits`: "questions" / "pairs" → splits)."""
    suites = _cluster_suites(settings, coherence_threshold)
    kept = clusters[clusters["kept"].astype(bool)].reset_index(drop=True)
    frames = {
        "clusters": kept,
        "split_shares": split_share_frame(clusters, settings.cluster.split.model_dump()),
        **{frame: pd.DataFrame({"split": sorted(splits[frame])}) for frame in splits},
    }
    checks = {
        "clusters": suites["clusters"],
        "split_shares": suites["split_shares"],
        **{frame: table_level(suites[frame])[1] for frame in splits},
    }
    return gate("clusters", frames, checks, report_dir, row_ids=CLUSTER_ROW_IDS)

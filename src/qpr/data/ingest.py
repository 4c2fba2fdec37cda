"""From a data source to raw paraphrase clusters, as params describe it (`data.source`,
`data.path`): QA logs are read, gated, cleaned and grouped by answer; Quora pairs are read
and closed transitively. The one code path from a file to clusters, shared by the cluster
stage and `qpr evaluate FILE`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from qpr.config import Settings
from qpr.data.clustering import clusters_from_logs, clusters_from_pairs
from qpr.data.loaders import DropReport, clean_logs, read_logs, read_quora
from qpr.quality.data_gates import gate_clean_logs, gate_raw_logs

# (questions, clusters, counts, what cleaning dropped): see qpr.data.clustering
SourceClusters = tuple[pd.DataFrame, pd.DataFrame, dict[str, int], DropReport]


def load_logs(settings: Settings, report_dir: Path, log: Callable[[str], None]) -> SourceClusters:
    """QA logs at data.path: read, raw-log gate, cleaning, clean-log gate, one cluster per
    answer. The gates write their reports into `report_dir` and raise GateFailed."""
    quality = settings.quality
    raw = read_logs(settings.data.path)
    log(f"read {len(raw):,} log rows from {settings.data.path}")
    gate_raw_logs(raw, quality, report_dir)
    clean, drops = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    log(drops.summary())
    gate_clean_logs(clean, quality, report_dir)
    questions, clusters, counts = clusters_from_logs(clean, settings.data.filter_fields)
    return questions, clusters, counts, drops


def load_quora(settings: Settings, log: Callable[[str], None]) -> SourceClusters:
    """Quora pairs at data.path: read, then the transitive closure of the duplicates."""
    pairs, drops = read_quora(settings.data.path)
    log(f"read {len(pairs):,} Quora pairs from {settings.data.path}; {drops.summary()}")
    questions, clusters, counts = clusters_from_pairs(pairs)
    return questions, clusters, counts, drops


def load_source(settings: Settings, report_dir: Path, log: Callable[[str], None]) -> SourceClusters:
    """The raw clusters of data.source: `load_logs` or `load_quora`."""
    if settings.data.source == "logs":
        return load_logs(settings, report_dir, log)
    return load_quora(settings, log)


def source_questions(settings: Settings) -> list[str]:
    """Every question of data.source as asked, repeats kept (a log's popular questions
    weigh as their traffic did), read and cleaned as the cluster stage reads them, without
    its gates. The monitor's picture of the training traffic (`qpr.monitor.report`)."""
    quality = settings.quality
    if settings.data.source == "logs":
        clean, _ = clean_logs(
            read_logs(settings.data.path),
            min_chars=quality.min_question_chars,
            max_chars=quality.max_question_chars,
        )
        return clean["question"].tolist()
    pairs, _ = read_quora(settings.data.path)
    return pairs["question1"].tolist() + pairs["question2"].tolist()


def coherence_threshold(settings: Settings) -> float:
    """The coherence filter is for clusters mined from logs, where a generic answer gathers
    unrelated questions (paper section 4.1.1). Quora clusters come from human duplicate
    labels, and the paper's Quora protocol keeps them all (section 4.1.2)."""
    return settings.cluster.coherence_threshold if settings.data.source == "logs" else 0.0

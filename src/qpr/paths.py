"""Where each stage reads and writes, relative to the project root (dvc.yaml uses the same).
File names come from `qpr.artifacts`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qpr.artifacts import (
    CLUSTER_PAIRS_FILE,
    CLUSTER_QUESTIONS_FILE,
    CLUSTERS_FILE,
    ENCODER_CHECKPOINT_FILE,
    ENCODER_FILE,
    INDEX_DIR,
    METRICS_FILE,
    SEARCH_FILE,
    VOCAB_FILE,
    stage_metrics_file,
)


@dataclass(frozen=True)
class ProjectPaths:
    root: Path

    @property
    def params(self) -> Path:
        return self.root / "params.yaml"

    @property
    def cluster_dir(self) -> Path:
        return self.root / "artifacts" / "cluster"

    @property
    def cluster_questions(self) -> Path:
        return self.cluster_dir / CLUSTER_QUESTIONS_FILE

    @property
    def cluster_pairs(self) -> Path:
        return self.cluster_dir / CLUSTER_PAIRS_FILE

    @property
    def clusters(self) -> Path:
        return self.cluster_dir / CLUSTERS_FILE

    @property
    def cluster_cache_dir(self) -> Path:
        """The cluster stage's finished tasks (a killed stage resumes from them)."""
        return self.root / "artifacts" / "cluster-shards"

    @property
    def train_dir(self) -> Path:
        """Checkpoints (kept between runs so a killed training resumes)."""
        return self.root / "artifacts" / "train"

    @property
    def index_cache_dir(self) -> Path:
        """The last encoding of the index questions (kept between runs, so an index rebuilt
        with other settings and the same encoder does not encode again)."""
        return self.root / "artifacts" / "index"

    @property
    def student_train_dir(self) -> Path:
        """The query student's checkpoints (kept between runs so a killed training resumes)."""
        return self.root / "artifacts" / "student"

    @property
    def rerank_train_dir(self) -> Path:
        """The re-ranker's checkpoints (kept between runs so a killed training resumes)."""
        return self.root / "artifacts" / "rerank"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def vocab(self) -> Path:
        return self.models_dir / VOCAB_FILE

    @property
    def encoder_checkpoint(self) -> Path:
        return self.models_dir / ENCODER_CHECKPOINT_FILE

    @property
    def encoder_onnx(self) -> Path:
        return self.models_dir / ENCODER_FILE

    @property
    def index_dir(self) -> Path:
        return self.models_dir / INDEX_DIR

    @property
    def search_config(self) -> Path:
        """How the service searches the bundle (qpr.artifacts.SearchConfig)."""
        return self.models_dir / SEARCH_FILE

    @property
    def evaluation_dir(self) -> Path:
        """TREC qrels and run files, threshold table."""
        return self.reports_dir / "evaluate"

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    @property
    def evaluation_metrics(self) -> Path:
        """The evaluate stage's measures with their timings (outside DVC)."""
        return self.root / METRICS_FILE

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    def gate_reports(self, stage: str) -> Path:
        return self.reports_dir / "gates" / stage

    def stage_metrics(self, stage: str) -> Path:
        """The stage's metrics without wall-clock figures (a DVC output)."""
        return self.metrics_dir / stage_metrics_file(stage)

    def stage_timings(self, stage: str) -> Path:
        """The stage's wall-clock figures: outside DVC, they differ on every run."""
        return self.metrics_dir / "timings" / stage_metrics_file(stage)

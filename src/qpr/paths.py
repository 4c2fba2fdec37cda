"""Where each stage reads and writes, relative to the project root (dvc.yaml uses the same)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    def gate_reports(self, stage: str) -> Path:
        return self.reports_dir / "gates" / stage

    def stage_metrics(self, stage: str) -> Path:
        return self.metrics_dir / f"{stage}.json"

"""Numeric gates on models (not data frames): training health, ONNX parity, index sanity,
the quality floor. Same contract as the Great Expectations gates: a JSON report is always
written, and a failure raises GateFailed naming each failed check with its measured value."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from qpr.io import write_text_atomic
from qpr.quality.gate import GateFailed


@dataclass(frozen=True)
class Check:
    """One measured value and its bound, e.g. Check("parity", 3e-7, "<", 1e-4)."""

    name: str
    value: float
    op: str  # one of "<", "<=", ">", ">=", "=="
    bound: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        if not math.isfinite(self.value):
            return False
        return {
            "<": self.value < self.bound,
            "<=": self.value <= self.bound,
            ">": self.value > self.bound,
            ">=": self.value >= self.bound,
            "==": self.value == self.bound,
        }[self.op]


def require(gate_name: str, checks: Sequence[Check], report_dir: Path | None) -> list[Check]:
    """Raise GateFailed unless every check passes; write `<report_dir>/<gate_name>.json`."""
    report_path = None
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        report_path = report_dir / f"{gate_name}.json"
        payload = {
            "gate": gate_name,
            "success": all(c.passed for c in checks),
            "checks": [{**asdict(c), "passed": c.passed} for c in checks],
        }
        write_text_atomic(report_path, json.dumps(payload, indent=2, default=str) + "\n")
    failed = [c for c in checks if not c.passed]
    if failed:
        lines = [
            f"  - {c.name}: measured {c.value:.6g}, required {c.op} {c.bound:.6g}"
            + (f" ({c.detail})" if c.detail else "")
            for c in failed
        ]
        where = f"\n  full report: {report_path}" if report_path else ""
        raise GateFailed(
            f"gate '{gate_name}' failed: {len(failed)} of {len(checks)} checks\n"
            + "\n".join(lines)
            + where,
            gate_name=gate_name,
            failures=[asdict(c) for c in failed],
            report_path=report_path,
        )
    return list(checks)

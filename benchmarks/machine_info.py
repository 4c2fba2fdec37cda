"""What every benchmark records about the machine it ran on, in one place."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def _first_field(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _git(root: Path, *args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def describe(root: Path, versions: dict[str, str], **extra: Any) -> dict[str, Any]:
    """CPU model, cores, memory, platform, package versions and the code's git commit."""
    memory = _first_field("/proc/meminfo", "MemTotal")
    # The benchmarks' own result files do not make the code "dirty": a run beside another
    # run's fresh outputs still measures the commit.
    status = _git(root, "status", "--porcelain", "--", ".", ":(exclude)docs/results")
    return {
        "cpu_model": _first_field("/proc/cpuinfo", "model name") or "unknown",
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "git_commit": _git(root, "rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        **extra,
    }

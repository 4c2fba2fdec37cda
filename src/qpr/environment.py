"""The process environment every entry point shares (CLI, flows, tests, Makefile), and
the pinned math of the pipeline's stages (`pin_math`).

Prefect and MLflow read their settings from environment variables at import time, so
`apply()` must run before either is imported. Values already set by the caller win:
team mode is just `MLFLOW_TRACKING_URI` / `PREFECT_API_URL` pointing at servers.

Quiet by default: a run prints the stages' progress, warnings and errors. `QPR_LOG_LEVEL`
(INFO, DEBUG) brings back the frameworks' own lines, as `qpr --verbose` does.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

QUIET_DEFAULTS: dict[str, str] = {
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_UI_ENABLED": "false",
    "PREFECT_UI_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
    "GIT_PYTHON_REFRESH": "quiet",
}


LOG_LEVEL_VARIABLE = "QPR_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Where `qpr ui` serves the Prefect and MLflow UIs on this machine.
UI_HOST = "127.0.0.1"
PREFECT_UI_PORT = 4200
MLFLOW_UI_PORT = 5000

# Libraries that set their own logger to INFO or DEBUG when imported, whatever the root
# logger says (bm25s: "Building index from tokens"; GX: a line per temporary docs dir).
CHATTY_LOGGERS = ("bm25s", "great_expectations.data_context.types.base")
# Prefect's run loggers carry the stages' progress; of the engine's own lines on them only
# these add nothing to it (a failed state is logged at ERROR and stays).
ENGINE_CHATTER = ("Finished in state Completed",)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` (default: cwd) holding params.yaml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "params.yaml").is_file():
            return candidate
    return here


# `dvc exp run --temp` and the queue run each experiment in a copy of the project under
# .dvc/tmp/exps/; its runs, registry versions and Prefect home belong to the project itself.
EXPERIMENT_COPY = (".dvc", "tmp", "exps")


def state_root(root: Path) -> Path:
    """The project that keeps the local state (MLflow store, Prefect home) for `root`:
    `root` itself, or the project above it when `root` is a DVC experiment's copy."""
    parts = root.parts
    for at in range(len(parts) - len(EXPERIMENT_COPY), 0, -1):
        if parts[at : at + len(EXPERIMENT_COPY)] == EXPERIMENT_COPY:
            return Path(*parts[:at])
    return root


def local_defaults(root: Path) -> dict[str, str]:
    """Absolute local locations, so DVC experiment temp dirs do not scatter state."""
    root = state_root(root)
    local = {
        "PREFECT_HOME": str(root / ".prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "QPR_MLFLOW_ARTIFACTS": (root / "mlruns").as_uri(),
    }
    if not os.environ.get("PREFECT_API_URL"):
        # Runs go to a temporary API server over this home's database; their "View at"
        # links then point at `qpr ui`, which serves that database, not at the dead server.
        local["PREFECT_UI_URL"] = f"http://{UI_HOST}:{PREFECT_UI_PORT}"
    return local


def log_level() -> str | None:
    """The level QPR_LOG_LEVEL names (upper case), or None: quiet (also for a name that
    is not a level, rather than a stack trace from every framework's logging setup)."""
    level = os.environ.get(LOG_LEVEL_VARIABLE, "").strip().upper()
    return level if level in LEVELS else None


def logging_defaults(level: str | None) -> dict[str, str]:
    """The frameworks' logging variables for `level` (None: quiet, the default)."""
    if level is None:
        return {
            # The "prefect" logger carries the temporary server's banner; the run loggers
            # under it carry the stages' progress, which stays at INFO.
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
            "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
            "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
            "MLFLOW_LOGGING_LEVEL": "WARNING",
            # A bar redrawn into a log is one long line (the register stage downloads).
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        }
    return {
        "PREFECT_LOGGING_LEVEL": level,
        "PREFECT_SERVER_LOGGING_LEVEL": level if level == "DEBUG" else "WARNING",
        "MLFLOW_LOGGING_LEVEL": level,
    }


def set_log_level(level: str) -> None:
    """Ask for `level` here and in every process started from here (`qpr --verbose`):
    it overrides the quiet defaults that `apply()` may already have set."""
    if level.upper() not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    os.environ[LOG_LEVEL_VARIABLE] = level.upper()
    for key in logging_defaults(None):
        os.environ.pop(key, None)
    os.environ.update(logging_defaults(level.upper()))


class _Drop(logging.Filter):
    """Drops a logger's records below `below`; with `prefixes`, only those that start so."""

    def __init__(self, below: int, prefixes: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.below = below
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.below:
            return True
        return bool(self.prefixes) and not str(record.msg).startswith(self.prefixes)


def quiet_loggers() -> None:
    """Hold the chatty libraries to QPR_LOG_LEVEL (default WARNING) and, when quiet, drop
    Prefect's "Finished in state Completed()". Filters, not levels: those libraries set
    their own level when imported, which may be after this runs."""
    level = log_level()
    below = getattr(logging, level or "WARNING")
    wanted = {name: _Drop(below) for name in CHATTY_LOGGERS}
    for name in RUN_LOGGERS:
        wanted[name] = _Drop(logging.WARNING, ENGINE_CHATTER) if level is None else None
    for name, new in wanted.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _Drop)]:
            logger.removeFilter(old)
        if new is not None:
            logger.addFilter(new)


def apply(root: Path | None = None) -> dict[str, str]:
    """Set every default that is not already set; return the values now in force."""
    root = project_root(root)
    wanted = {**QUIET_DEFAULTS, **local_defaults(root), **logging_defaults(log_level())}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


# Same outputs on any x86-64 CPU (docs/pipeline.md: Same results on another CPU). The math
# libraries pick their code by the CPU they find: PyTorch's kernels by instruction set,
# Intel MKL by instruction set and vendor, NumPy's loops and OpenBLAS by instruction set
# and core type. Each path rounds and orders its sums its own way, so another CPU trained
# another model. These variables are read when each library loads, so `pin_math()` runs
# before numpy or torch is imported. Forced, not defaulted: a caller's other value would
# change the model. oneDNN and NNPACK are switched off in torch itself (training.embed).
NATIVE_MATH_VARIABLE = "QPR_NATIVE_MATH"
PINNED_MATH: dict[str, str] = {
    # PyTorch's own kernels: the plain build every x86-64 CPU runs, no AVX2 / AVX-512.
    "ATEN_CPU_CAPABILITY": "default",
    # MKL (torch's BLAS): its SSE2 branch without approximate reciprocals, documented to
    # give the same results on Intel and AMD CPUs, for a fixed thread count (the params').
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
    # oneDNN is not used by pinned torch; anything that still reaches it gets SSE4.1 code.
    "DNNL_MAX_CPU_ISA": "SSE41",
    # NumPy's SIMD loops (sorts, exp, ...): its baseline build on every CPU.
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
}
# OpenBLAS (NumPy's, FAISS's) on its Haswell kernels (AVX2 + FMA), what it picks on this
# project's AMD EPYC. Only where the CPU has both: elsewhere they would stop the process.
OPENBLAS_PIN = ("OPENBLAS_CORETYPE", "Haswell")
OPENBLAS_NEEDS = frozenset({"avx2", "fma"})


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def native_math() -> bool:
    """True when QPR_NATIVE_MATH asks for each CPU's fastest code (CPU-dependent results)."""
    return os.environ.get(NATIVE_MATH_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def pinned_math() -> dict[str, str]:
    """The variables `pin_math()` sets on this CPU."""
    wanted = dict(PINNED_MATH)
    if OPENBLAS_NEEDS.issubset(_cpu_flags()):
        wanted[OPENBLAS_PIN[0]] = OPENBLAS_PIN[1]
    return wanted


def math_pinned() -> bool:
    """True when this process runs the pinned math (its variables are in force)."""
    return all(os.environ.get(key) == value for key, value in PINNED_MATH.items())


def pin_math() -> None:
    """Force the pinned math variables, unless QPR_NATIVE_MATH is set. Numpy and torch
    read them when they load: calling this after either is imported is a mistake."""
    if native_math():
        return
    late = sorted(name for name in ("numpy", "torch") if name in sys.modules)
    if late:
        raise RuntimeError(f"pin_math() must run before {' and '.join(late)} is imported")
    os.environ.update(pinned_math())


def math_summary() -> str:
    """One line for a stage's log: the math in force in this process."""
    if native_math():
        return f"math: native to this CPU ({NATIVE_MATH_VARIABLE}=1): results depend on the CPU"
    if not math_pinned():
        return "math: not pinned: results may depend on the CPU"
    # The variables' values are in docs/pipeline.md; the names say which libraries.
    names = ", ".join(sorted({key.split("_")[0] for key in pinned_math()}))
    return f"math: pinned, the same results on any x86-64 CPU ({names})"

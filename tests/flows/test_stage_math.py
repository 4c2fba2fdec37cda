"""`python -m flows.stage NAME`, as dvc.yaml runs it, pins the math before anything loads
numpy or torch, whatever the caller's environment holds, and its log says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qpr import environment


def test_a_stage_run_as_a_program_pins_the_math(prefect_harness, tiny_params_file: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        # what an AVX2 machine's libraries, or a user's shell, would pick
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AUTO",
    }
    env.pop(environment.NATIVE_MATH_VARIABLE, None)
    done = subprocess.run(
        [sys.executable, "-m", "flows.stage", "train", "--params", str(tiny_params_file)],
        cwd=tiny_params_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    # Nothing clustered there: the stage stops with one line, after saying what math it ran.
    assert done.returncode == 1, output[-3000:]
    # "pinned" only when every variable holds its pinned value (environment.math_pinned):
    # the caller's avx2 and AUTO were overridden.
    assert "math: pinned" in output, output[-3000:]
    assert "math: not pinned" not in output

"""Same outputs on any x86-64 CPU (qpr.environment.pin_math).

This machine stands in for the CPUs we do not have: each setting below is what another
CPU would make PyTorch, MKL, oneDNN, OpenBLAS and NumPy pick (as far as this CPU accepts
it). The tiny CNN's train stage and its evaluate stage, run in a real process under each
of them with the math pinned first as `python -m flows.stage` pins it, must write
byte-identical files. With QPR_NATIVE_MATH=1 the same settings change them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qpr import environment
from tests.conftest import REPO_ROOT, run_stages, tiny_overrides

# What the libraries would pick on other CPUs (or what a user's shell may hold). Only
# code paths every x86-64 CPU runs or that the library itself checks: OpenBLAS starts a
# forced core type without checking the CPU, so only the oldest one appears here.
OTHER_CPUS: dict[str, dict[str, str]] = {
    "plain": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "AUTO",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Prescott",
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    },
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_CBWR": "AVX512",
        "DNNL_MAX_CPU_ISA": "AVX512_CORE",
    },
}

# A stage run as `python -m flows.stage` runs it: the math pinned before anything imports
# numpy or torch (flows/__init__.py), then the stage function (without Prefect and MLflow,
# which add nothing to the math and half a minute to each run).
DRIVER = """
import json, sys
from pathlib import Path
from qpr import environment
environment.pin_math()
import torch
from qpr.config import load_settings
from qpr.paths import ProjectPaths
root, stage = Path(sys.argv[1]), sys.argv[2]
settings, paths = load_settings(root / "params.yaml"), ProjectPaths(root)
if stage == "train":
    from qpr.pipeline.train import run_train
    run_train(settings, paths, progress=False, log=lambda _: None)
else:
    from qpr.pipeline.evaluate import run_evaluate
    run_evaluate(settings, paths, log=lambda _: None)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability()}))
"""
# What each stage writes that DVC hashes (the evaluate stage's metrics hold timings).
OUTPUTS = {"train": ("models/encoder.pt",), "evaluate": ("models/search.json", "reports/evaluate")}


# Prints the pinned variables as the process sees them after pin_math().
PRINT_PINNED = """
import json, os
from qpr import environment
environment.pin_math()
print(json.dumps({key: os.environ.get(key) for key in environment.pinned_math()}))
"""


def _pinned_in_a_process(outer: dict[str, str]) -> dict[str, str | None]:
    env = {key: value for key, value in os.environ.items() if key not in environment.PINNED_MATH}
    env.pop(environment.NATIVE_MATH_VARIABLE, None)
    env.update({**outer, "PYTHONPATH": f"{REPO_ROOT / 'src'}:{REPO_ROOT}"})
    done = subprocess.run(
        [sys.executable, "-c", PRINT_PINNED],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def test_the_pin_overrides_what_the_caller_set() -> None:
    assert _pinned_in_a_process(OTHER_CPUS["avx512"]) == environment.pinned_math()


def test_native_math_leaves_the_callers_settings() -> None:
    outer = {**OTHER_CPUS["avx512"], environment.NATIVE_MATH_VARIABLE: "1"}
    seen = _pinned_in_a_process(outer)
    assert seen["ATEN_CPU_CAPABILITY"] == "avx512" and seen["MKL_CBWR"] == "AVX512"
    assert seen["NPY_DISABLE_CPU_FEATURES"] is None


def test_pinning_after_numpy_is_loaded_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy  # noqa: F401  (loaded: its OpenBLAS and SIMD loops are chosen already)

    monkeypatch.delenv(environment.NATIVE_MATH_VARIABLE, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    with pytest.raises(RuntimeError, match="before numpy"):
        environment.pin_math()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"  # nothing half-set


def test_openblas_is_pinned_only_where_the_cpu_runs_its_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(environment, "_cpu_flags", lambda: frozenset({"sse2", "avx2", "fma"}))
    assert environment.pinned_math()["OPENBLAS_CORETYPE"] == "Haswell"
    monkeypatch.setattr(environment, "_cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert "OPENBLAS_CORETYPE" not in environment.pinned_math()


def test_the_stage_log_line_says_which_math_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(environment.NATIVE_MATH_VARIABLE, raising=False)
    for key, value in environment.pinned_math().items():
        monkeypatch.setenv(key, value)
    line = environment.math_summary()
    assert line.startswith("math: pinned") and "MKL" in line and len(line) < 100
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert environment.math_summary().startswith("math: not pinned")
    monkeypatch.setenv(environment.NATIVE_MATH_VARIABLE, "1")
    assert "results depend on the CPU" in environment.math_summary()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny project of the paper's CNN run through the index stage (in this process)."""
    from qpr.config import load_settings

    root = tmp_path_factory.mktemp("cnn")
    tree = tiny_overrides(root, model={"encoder": "cnn"}, train={"threads": 2})
    (root / "params.yaml").write_text(yaml.safe_dump(tree), encoding="utf-8")
    run_stages(load_settings(root / "params.yaml"), root, until="index")
    return root


def _digests(root: Path, names: tuple[str, ...]) -> dict[str, str]:
    files = [f for name in names for f in sorted((root / name).rglob("*")) or [root / name]]
    return {str(f.relative_to(root)): _sha256(f) for f in files if f.is_file()}


def _run(project: Path, target: Path, stage: str, outer: dict[str, str]) -> dict:
    """`stage` in a copy of `project` in a fresh process under `outer`: the digests of
    what it wrote, torch's capability and how many oneDNN kernels ran."""
    shutil.copytree(project, target)
    params = target / "params.yaml"
    params.write_text(
        params.read_text(encoding="utf-8").replace(str(project), str(target)),
        encoding="utf-8",
    )
    if stage == "train":  # from scratch, not from the project's own checkpoints
        shutil.rmtree(target / "models")
        shutil.rmtree(target / "artifacts" / "train")
    env = {key: value for key, value in os.environ.items() if key not in environment.PINNED_MATH}
    env.pop(environment.NATIVE_MATH_VARIABLE, None)
    # oneDNN lists every kernel it runs: none may run where the math is pinned.
    env.update({**outer, "ONEDNN_VERBOSE": "1", "PYTHONPATH": f"{REPO_ROOT / 'src'}:{REPO_ROOT}"})
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(target), stage],
        cwd=target,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    return {
        **json.loads(lines[-1]),
        "onednn_runs": sum("onednn_verbose" in line and ",exec," in line for line in lines),
        "outputs": _digests(target, OUTPUTS[stage]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["train", "evaluate"])
def test_a_stage_writes_the_same_bytes_under_every_instruction_set(
    indexed: Path, tmp_path: Path, stage: str
) -> None:
    """train: torch, MKL, oneDNN; evaluate: NumPy's loops (BM25's ranking among them)."""
    runs = {
        name: _run(indexed, tmp_path / name, stage, outer) for name, outer in OTHER_CPUS.items()
    }
    assert {run["capability"] for run in runs.values()} == {"DEFAULT"}, runs
    assert all(run["onednn_runs"] == 0 for run in runs.values()), runs
    first = runs["plain"]["outputs"]
    differ = {
        name: sorted(f for f in first if run["outputs"].get(f) != first[f])
        for name, run in runs.items()
    }
    assert first and not any(differ.values()), differ


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["train", "evaluate"])
def test_native_math_writes_other_bytes_under_another_instruction_set(
    indexed: Path, tmp_path: Path, stage: str
) -> None:
    """The control: without the pin the same settings change the outputs, so the test
    above would see a setting that the pin failed to override."""
    native = {environment.NATIVE_MATH_VARIABLE: "1"}
    plain = _run(indexed, tmp_path / "plain", stage, {**OTHER_CPUS["plain"], **native})
    fast = _run(indexed, tmp_path / "fast", stage, {"MKL_CBWR": "AUTO", **native})
    if fast["capability"] in ("DEFAULT", "AVX2"):
        pytest.skip("this CPU has no AVX-512: the settings leave it fewer code paths")
    assert fast["onednn_runs"] > 0 or stage == "evaluate"
    assert plain["outputs"] != fast["outputs"]

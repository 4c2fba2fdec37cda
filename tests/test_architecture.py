"""The rules docs/architecture.md states, checked on the source (ast only: nothing imported).

Each rule names the files that break it, so a failure says where a line went wrong."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "qpr"
FLOWS = ROOT / "flows"

# artifacts.py (the bundle's file names and SearchConfig) imports only io and errors: paths.py
# names the bundle's files through it.
GROUND_FLOOR = (
    "config",
    "paths",
    "io",
    "errors",
    "environment",
    "artifacts",
    "tasks",
    "version",
)
FRAMEWORKS = ("prefect", "mlflow", "ray")
# MLflow's thin adapters: the registry and its pyfunc (and the registry state a retraining
# rollback puts back), and the service's source of registered bundles.
FRAMEWORK_ADAPTERS = {
    "qpr.ops.pyfunc",
    "qpr.ops.registry",
    "qpr.ops.registry_snapshot",
    "qpr.serve.sources",
}
MAX_LINES = 100
MAX_PARAMS = 8


def _modules(root: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


MODULES = {**_modules(SRC, "qpr"), **_modules(FLOWS, "flows")}


def _imports(path: Path) -> set[str]:
    """Every module named by an import anywhere in the file (function bodies too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _project_imports(path: Path) -> set[str]:
    return {name for name in _imports(path) if name in MODULES}


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_no_module_file_name_appears_twice() -> None:
    names = Counter(path.name for path in MODULES.values() if path.name != "__init__.py")
    assert not [name for name, count in names.items() if count > 1]


def test_the_ground_floor_imports_nothing_else_of_qpr() -> None:
    floor = {f"qpr.{name}" for name in GROUND_FLOOR}
    broken = {
        module: sorted(_project_imports(MODULES[module]) - floor)
        for module in floor
        if _project_imports(MODULES[module]) - floor
    }
    assert not broken


def test_the_library_never_imports_flows() -> None:
    broken = [
        m
        for m, path in MODULES.items()
        if m.startswith("qpr")
        and any(name == "flows" or name.startswith("flows.") for name in _imports(path))
    ]
    assert not broken


def test_frameworks_live_in_flows_and_thin_adapters() -> None:
    broken = {
        module: sorted(n for n in _imports(path) if n.split(".")[0] in FRAMEWORKS)
        for module, path in MODULES.items()
        if module.startswith("qpr") and module not in FRAMEWORK_ADAPTERS
    }
    assert not {m: names for m, names in broken.items() if names}


def test_a_stage_never_imports_another_stage() -> None:
    stages = {m for m in MODULES if m.startswith("qpr.pipeline.")}
    shared = {"qpr.pipeline.handoff"}
    broken = {
        module: sorted((_project_imports(MODULES[module]) & stages) - shared - {module})
        for module in stages
    }
    assert not {m: names for m, names in broken.items() if names}


def test_only_the_pipeline_flows_cli_and_tests_import_the_pipeline() -> None:
    allowed = ("qpr.pipeline", "flows", "qpr.cli")
    broken = [
        module
        for module, path in MODULES.items()
        if not module.startswith(allowed)
        and any(name.startswith("qpr.pipeline") for name in _project_imports(path))
    ]
    assert not broken


@pytest.mark.parametrize("package", ["qpr.retrieval", "qpr.serve", "qpr.artifacts", "qpr.deltas"])
def test_the_query_path_never_imports_torch(package: str) -> None:
    broken = [
        module
        for module, path in MODULES.items()
        if module.startswith(package)
        and any(n.split(".")[0] in ("torch", "transformers") for n in _imports(path))
    ]
    assert not broken


def test_no_function_is_longer_than_a_screenful() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for path in MODULES.values()
        for fn in _functions(path)
        if fn.end_lineno - fn.lineno + 1 > MAX_LINES
    ]
    assert not long


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = fn.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_public_function_takes_more_than_eight_parameters() -> None:
    wide = [
        f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name} ({_parameters(fn)} parameters)"
        for path in MODULES.values()
        for fn in _functions(path)
        if (not fn.name.startswith("_") or fn.name == "__init__") and _parameters(fn) > MAX_PARAMS
    ]
    assert not wide


# Test files about the repository as a whole (tools/ included), not one module of the
# package; test_leftovers.py and test_session_experiment.py test the suite's own helpers.
REPOSITORY_TESTS = {
    "test_architecture.py",
    "test_dvc.py",
    "test_hash_lock.py",
    "test_leftovers.py",
    "test_readme.py",
    "test_session_experiment.py",
}


def _package_of(test_dir: Path) -> str:
    parts = test_dir.relative_to(ROOT / "tests").parts
    return ".".join(parts) if parts[:1] == ("flows",) else ".".join(("qpr", *parts))


def test_tests_mirror_the_package() -> None:
    """tests/retrieval/test_fusion.py tests qpr/retrieval/fusion.py; a test file may add an
    aspect after the module's name (test_bundle_reload.py). flows/ is mirrored by tests/flows/."""
    stray = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in REPOSITORY_TESTS:
            continue
        package = _package_of(path.parent)
        names = {
            module[len(package) + 1 :].split(".")[0]
            for module in MODULES
            if module.startswith(package + ".")
        }
        if not any(path.stem == f"test_{n}" or path.stem.startswith(f"test_{n}_") for n in names):
            stray.append(str(path.relative_to(ROOT)))
    assert not stray

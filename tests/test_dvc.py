"""dvc.yaml tells the truth about code: each stage's deps cover the modules its command runs.

`dvc repro` reruns a stage only when one of its deps changes, so a module the stage imports
but no dep covers is an edit that silently leaves stale outputs behind. A dep on code the
stage no longer imports is the opposite lie: it reruns the stage for nothing.

Both are read from the source with `ast` (nothing is imported, so no torch): the closure of
what `python -m flows.stage NAME` imports, imports inside functions included, limited to this
repository's files (src/qpr/**, flows/**). Imports under `if TYPE_CHECKING:` never run and
are left out. A library module counts whole, but for shared glue with one function per
stage or input, where only what the stage reaches counts: in flows/stage.py its common part
and the stage's own `_NAME` (not the other stages'), in the flows modules it uses (tracking)
and in qpr/pipeline/handoff.py the top-level code and the functions the stage names,
followed through the names they use.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"qpr": REPO / "src" / "qpr", "flows": REPO / "flows"}
STAGE_MODULE = REPO / "flows" / "stage.py"
STAGE_COMMAND = re.compile(r"python -m flows\.stage (?P<name>\w+)")
CODE_DEP_ROOTS = ("src/", "flows/")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Library modules of one reader per stage input: only the readers a stage calls count (the
# train stage reads the clusters, not the BM25 index, so an edit to BM25 must not retrain).
SHARED_GLUE = {"qpr.pipeline.handoff"}


def module_path(name: str) -> Path | None:
    """The file that importing module `name` runs, or None (not ours, or a namespace package)."""
    top, *rest = name.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def is_module(name: str) -> bool:
    """Whether `name` is one of our modules or packages (namespace packages included)."""
    top, *rest = name.split(".")
    base = PACKAGES[top].joinpath(*rest) if top in PACKAGES else None
    return base is not None and (base.is_dir() or base.with_suffix(".py").is_file())


def is_empty(path: Path) -> bool:
    """An empty file runs nothing, and DVC warns about an empty dep: no dep needed."""
    return path.stat().st_size == 0


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def package_of(path: Path) -> str:
    """The dotted package that a file's relative imports start from."""
    for top, root in PACKAGES.items():
        if path.is_relative_to(root):
            return ".".join([top, *path.relative_to(root).parent.parts])
    raise ValueError(f"{path} is not in this repository's packages")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_nodes(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node under `nodes`, except the bodies of `if TYPE_CHECKING:`."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _with_parents(name: str) -> list[str]:
    """Importing a.b.c runs a, a.b and a.b.c."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _import_base(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    anchor = parts[: len(parts) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


def imports(nodes: Iterable[ast.AST], package: str) -> dict[str, set[str]]:
    """The modules the imports under `nodes` load, each with the names taken from it
    (`from m import a` takes a; `import m` or `from p import m` bind the module itself: *)."""
    found: dict[str, set[str]] = {}
    for node in runtime_nodes(nodes):
        if isinstance(node, ast.Import):
            for alias in node.names:
                for name in _with_parents(alias.name):
                    found.setdefault(name, set()).add("*")
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(node, package)
            for name in _with_parents(base):
                found.setdefault(name, set())
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if is_module(sub):
                    for name in _with_parents(sub):
                        found.setdefault(name, set())
                    found[sub].add(f"*{alias.asname or alias.name}")
                else:
                    found[base].add(alias.name)
    return found


def names_used(nodes: Iterable[ast.AST]) -> set[str]:
    return {n.id for n in runtime_nodes(nodes) if isinstance(n, ast.Name)}


def attributes_used(nodes: Iterable[ast.AST], alias: str) -> set[str]:
    """`alias.x` for every x the nodes use on a module bound to `alias`."""
    return {
        n.attr
        for n in runtime_nodes(nodes)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == alias
    }


def reachable(tree: ast.Module, wanted: set[str]) -> list[ast.stmt]:
    """A module's top-level code and the definitions reachable from it and from `wanted`."""
    definitions = {n.name: n for n in tree.body if isinstance(n, DEFINITIONS)}
    kept = [n for n in tree.body if not isinstance(n, DEFINITIONS)]
    pending = [*wanted, *names_used(kept)]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        kept.append(definitions[name])
        pending.extend(names_used([definitions[name]]))
    return kept


def stage_nodes(stage: str, all_stages: Iterable[str]) -> list[ast.stmt]:
    """flows/stage.py as stage `stage` runs it: all of it but the other stages' `_NAME`."""
    tree = ast.parse(STAGE_MODULE.read_text("utf-8"))
    others = {f"_{name}" for name in all_stages} - {f"_{stage}"}
    if not any(isinstance(n, ast.FunctionDef) and n.name == f"_{stage}" for n in tree.body):
        raise AssertionError(f"flows/stage.py has no function _{stage} for stage {stage!r}")
    return [n for n in tree.body if not (isinstance(n, DEFINITIONS) and n.name in others)]


def _flows_names(taken: set[str], nodes: list[ast.stmt]) -> set[str] | None:
    """What a flows module is used for: named functions, or None (used as a whole)."""
    wanted: set[str] = set()
    for name in taken:
        if not name.startswith("*"):
            wanted.add(name)
        elif name == "*":
            return None  # `import flows.x`: the dotted uses are not followed
        else:
            wanted |= attributes_used(nodes, name[1:])
    return wanted


def import_closure(stage: str, all_stages: Iterable[str]) -> dict[Path, Path]:
    """Every file of ours that `python -m flows.stage STAGE` may run, with its importer."""
    files: dict[Path, Path] = {STAGE_MODULE: STAGE_MODULE}
    nodes = stage_nodes(stage, all_stages)
    pending = [
        (name, taken, nodes, STAGE_MODULE) for name, taken in imports(nodes, "flows").items()
    ]
    pending.append(("flows", set(), [], STAGE_MODULE))  # `python -m flows.stage` runs flows/
    seen: set[tuple[str, frozenset[str] | None]] = set()
    while pending:
        name, taken, importer_nodes, importer = pending.pop()
        path = module_path(name)
        if path is None or path == STAGE_MODULE or is_empty(path):
            continue
        glue = name.startswith("flows.") or name in SHARED_GLUE
        wanted = _flows_names(taken, importer_nodes) if glue else None
        key = (name, frozenset(wanted) if wanted is not None else None)
        if key in seen:
            continue
        seen.add(key)
        files.setdefault(path, importer)
        tree = ast.parse(path.read_text("utf-8"))
        body = tree.body if wanted is None else reachable(tree, wanted)
        for found, names in imports(body, package_of(path)).items():
            pending.append((found, names, body, path))
    return files


def load_stages() -> dict[str, dict]:
    """The dvc.yaml stages whose command is `python -m flows.stage NAME`, by NAME."""
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text("utf-8"))
    stages = {}
    for key, stage in spec["stages"].items():
        match = STAGE_COMMAND.fullmatch(str(stage.get("cmd", "")).strip())
        if match:
            assert match["name"] == key, f"stage {key!r} runs flows.stage {match['name']}"
            stages[key] = stage
    return stages


def code_deps(stage: dict) -> list[str]:
    """The stage's deps on this repository's code (data, models and params aside)."""
    deps = [d if isinstance(d, str) else next(iter(d)) for d in stage.get("deps", [])]
    return [d.rstrip("/") for d in deps if d.startswith(CODE_DEP_ROOTS)]


def missing_deps(closure: dict[Path, Path], deps: list[str]) -> list[str]:
    """Each file the stage runs that no dep covers (a directory dep covers its files)."""
    return [
        f"{rel(path)} (imported by {rel(closure[path])})"
        for path in sorted(closure)
        if not any(rel(path) == dep or rel(path).startswith(dep + "/") for dep in deps)
    ]


def mostly_imported(directory: Path, imported: set[str]) -> bool:
    """A directory dep is fine when the stage imports at least half of its modules."""
    modules = [rel(p) for p in directory.rglob("*.py") if not is_empty(p)]
    return 2 * sum(m in imported for m in modules) >= len(modules)


def stale_deps(closure: dict[Path, Path], deps: list[str]) -> list[str]:
    """Each code dep the stage does not run, or a directory most of which it does not run."""
    imported = {rel(path) for path in closure}
    problems = []
    for dep in deps:
        target = REPO / dep
        if target.is_file() and is_empty(target):
            problems.append(f"{dep} (empty: it runs nothing, and DVC warns about it)")
        elif not target.is_dir():
            if dep not in imported:
                problems.append(f"{dep} (not imported by the stage)")
        elif not any(m.startswith(dep + "/") for m in imported):
            problems.append(f"{dep} (no module of it is imported by the stage)")
        elif not mostly_imported(target, imported):
            problems.append(f"{dep} (less than half of it is imported: name its files)")
    return problems


def suggested_deps(closure: dict[Path, Path]) -> list[str]:
    """The code deps that would be right: a package of src/qpr as one directory when the
    stage imports at least half of it (then its subpackage), else its files."""
    imported = {rel(path) for path in closure}
    deps = set()
    for path in closure:
        dep = rel(path)
        parts = path.relative_to(PACKAGES["qpr"]).parts if path.is_relative_to(REPO / "src") else ()
        for depth in range(1, len(parts)):
            directory = PACKAGES["qpr"].joinpath(*parts[:depth])
            if mostly_imported(directory, imported):
                dep = rel(directory)
                break
        deps.add(dep)
    return sorted(deps)


def _right_deps(closure: dict[Path, Path]) -> str:
    return "\ncode deps for the current layout:\n" + "\n".join(
        f"      - {dep}" for dep in suggested_deps(closure)
    )


STAGES = load_stages()


def test_every_flows_stage_command_is_checked() -> None:
    assert {"cluster", "train", "export", "index", "evaluate", "register"} <= set(STAGES)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_deps_cover_what_the_stage_imports(stage: str) -> None:
    closure = import_closure(stage, STAGES)
    assert REPO / "src" / "qpr" / "pipeline" / f"{stage}.py" in closure
    missing = missing_deps(closure, code_deps(STAGES[stage]))
    message = f"dvc.yaml stage {stage!r} misses deps on:\n  " + "\n  ".join(missing)
    assert not missing, message + _right_deps(closure)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_stale_code_deps(stage: str) -> None:
    closure = import_closure(stage, STAGES)
    stale = stale_deps(closure, code_deps(STAGES[stage]))
    message = f"dvc.yaml stage {stage!r} has stale deps:\n  " + "\n  ".join(stale)
    assert not stale, message + _right_deps(closure)


def test_closure_follows_lazy_imports_and_only_the_stage_own_function() -> None:
    train = {rel(p) for p in import_closure("train", STAGES)}
    assert "src/qpr/training/loop.py" in train  # imported inside run_train's helpers
    assert "src/qpr/pipeline/cluster.py" not in train  # _cluster's import, not _train's
    assert {"flows/__init__.py", "flows/tracking.py", "src/qpr/__init__.py"} <= train


def test_type_checking_imports_are_left_out() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import qpr.text.vocab\n"
    assert set(imports([ast.parse(source)], "qpr")) == {"typing"}


def test_flows_helpers_count_only_when_the_stage_names_them() -> None:
    source = "import os\ndef used():\n    import qpr.io\ndef unused():\n    import qpr.text\n"
    kept = reachable(ast.parse(source), {"used"})
    assert set(imports(kept, "flows")) == {"os", "qpr", "qpr.io"}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_suggested_deps_pass_both_checks(stage: str) -> None:
    closure = import_closure(stage, STAGES)
    right = suggested_deps(closure)
    assert missing_deps(closure, right) == [] and stale_deps(closure, right) == []


def test_a_missing_or_stale_dep_is_named() -> None:
    closure = import_closure("export", STAGES)
    right = suggested_deps(closure)
    without = [dep for dep in right if dep != "src/qpr/pipeline/export.py"]
    assert missing_deps(closure, without) == [
        "src/qpr/pipeline/export.py (imported by flows/stage.py)"
    ]
    stale = stale_deps(closure, [*right, "src/qpr/serve/app.py", "src/qpr/ops"])
    assert stale == [
        "src/qpr/serve/app.py (not imported by the stage)",
        "src/qpr/ops (no module of it is imported by the stage)",
    ]


def _paths(entries: list) -> list[str]:
    return [e if isinstance(e, str) else next(iter(e)) for e in entries]


def test_declared_metrics_are_the_cached_headline_files() -> None:
    """`dvc exp show` reads what dvc.yaml declares as metrics: the headline files that
    flows/stage.py writes, cached (so every experiment keeps its own)."""
    from flows.stage import STAGES as FLOW_STAGES

    for name, stage in STAGES.items():
        wanted = [f"metrics/headline/{name}.json"] if FLOW_STAGES[name].headline else []
        assert _paths(stage.get("metrics", [])) == wanted, name
        for entry in stage.get("metrics", []):
            assert isinstance(entry, str) or next(iter(entry.values())).get("cache", True)
    outs = {path for stage in STAGES.values() for path in _paths(stage.get("outs", []))}
    assert {f"metrics/{name}.json" for name in STAGES} <= outs
    assert "metrics.json" not in outs  # it holds wall-clock figures: not hashed


def test_headline_numbers_are_the_stage_metrics_unchanged() -> None:
    from flows.stage import EVALUATE_HEADLINE, TRAIN_HEADLINE, headline_numbers

    evaluation = {
        "success_1": 0.9171974522292994,
        "success_10": 0.970276008492569,
        "recip_rank": 0.9353899853806186,
        "P_10": 0.6815286624203821,
        "val": {"recip_rank": 0.9404559522766645},
        "query_ms": 0.24879283014893278,
    }
    assert headline_numbers(evaluation, EVALUATE_HEADLINE) == {
        "test_p1": 0.9171974522292994,
        "test_p10": 0.970276008492569,
        "test_mrr": 0.9353899853806186,
        "val_mrr": 0.9404559522766645,
    }
    assert headline_numbers({"epochs": 6, "best_epoch": 4}, TRAIN_HEADLINE) == {
        "train_epochs": 6,
        "best_epoch": 4,
    }
    assert headline_numbers({"val": None}, EVALUATE_HEADLINE) == {}  # never invented


def test_bytecode_is_not_hashed_into_directory_deps() -> None:
    """numba's cache and .pyc files land in __pycache__ beside the code on every run."""
    ignored = (REPO / ".dvcignore").read_text("utf-8").split()
    assert "__pycache__/" in ignored


def test_no_hashed_output_holds_a_wall_clock_figure(tmp_path: Path) -> None:
    """A stage writes its timings to metrics/timings/ (outside DVC), the rest to the
    metrics file DVC hashes, so a rerun leaves dvc.lock as it was."""
    from flows.stage import write_metrics
    from qpr.io import split_timings

    metrics = {"success_1": 0.9, "query_ms": 0.3, "baselines": {"bm25": {"seconds": 1.0}}}
    stable, timings = split_timings(metrics)
    assert stable == {"success_1": 0.9, "baselines": {"bm25": {}}}
    assert timings == {"query_ms": 0.3, "baselines": {"bm25": {"seconds": 1.0}}}
    written = write_metrics(tmp_path / "m.json", stable).read_text("utf-8")
    assert "seconds" not in written and "_ms" not in written
    outs = {path for stage in STAGES.values() for path in _paths(stage.get("outs", []))}
    assert not any(path.startswith(("metrics/timings", "artifacts/train")) for path in outs)

"""qpr.artifacts names every bundle and stage-output file: no other module of the library
or of flows/ spells one (ast only: nothing imported). `qpr.paths` builds paths from the
names, and a stage reads another's files through `qpr.pipeline.handoff`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "qpr"
FLOWS = ROOT / "flows"

# A file name with the suffix of a bundle or stage file (models, indexes, vectors, tables,
# checkpoints, JSON records), possibly in a folder. A bare suffix (".parquet") or the
# literal part of an f-string around a name ("{stage}.json") is not one.
FILE_NAME = re.compile(r"^\w[\w.-]*(/[\w.-]+)*\.(onnx|faiss|npy|npz|parquet|pt|json)$")

# Files that may spell names, with the reason. Keys: a path relative to src/qpr or the
# project root, or (path, name) for one name in it.
ALLOWED: dict[str | tuple[str, str], str] = {
    "artifacts.py": "the one place that names them",
    ("evaluation/baselines.py", "untrained.onnx"): "a temporary file, removed once measured",
    ("evaluation/on_file.py", "results.json"): "`qpr evaluate FILE`'s report, in a folder "
    "the user names: no stage reads it",
    ("flows/monitor.py", "position.json"): "the monitor's own state: the last line it read",
    ("flows/monitor.py", "report.json"): "a monitoring report, for people and dashboards: "
    "no stage reads it",
    ("monitor/status.py", "monitor.json"): "the monitor's verdict beside the query log, read "
    "back by the same module for the service",
    ("ops/harvest.py", "position.json"): "retraining's own state: the feedback lines taken",
    ("ops/cycle.py", "summary.json"): "a retraining run's record (qpr.ops), no stage reads it",
    ("ops/layout.py", "journal.json"): "retraining's own state, named in its layout",
    ("ops/layout.py", "active_run.json"): "retraining's own state, named in its layout",
    ("pipeline/student.py", "float32.onnx"): "a scratch file in the stage's staging "
    "folder, removed before the folder is swapped in",
    ("searcher.py", "questions.parquet"): "a temporary shard for the indexer",
    ("serve/sources.py", "qpr-kept.json"): "the service's note beside a kept registry "
    "version in its own cache",
    ("retrieval/companion.py", "l2_supercat_tokenizer_config.json"): "a file of a "
    "pretrained model package (the wordllama wheel's tokenizer)",
    ("text/pretrained.py", "config.json"): "a file of a pretrained model package",
    ("text/wordpiece.py", "tokenizer.json"): "a file of a pretrained model package",
    ("training/loop.py", "last.pt"): "a trainer's checkpoint, read back only by the trainer",
    ("training/loop.py", "best.pt"): "a trainer's checkpoint, read back only by the trainer",
}


def file_names(source: str) -> list[str]:
    """The string constants of `source` that are file names (docstrings left out)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and FILE_NAME.match(node.value)
    ]


def _spelled() -> dict[tuple[str, str], int]:
    """{(module path, name): how often} over src/qpr (paths relative to it) and flows/."""
    found: dict[tuple[str, str], int] = {}
    modules = [(p, p.relative_to(SRC)) for p in SRC.rglob("*.py")]
    modules += [(p, p.relative_to(ROOT)) for p in FLOWS.rglob("*.py")]
    for path, rel in modules:
        for name in file_names(path.read_text(encoding="utf-8")):
            key = (rel.as_posix(), name)
            found[key] = found.get(key, 0) + 1
    return found


def test_only_artifacts_spells_a_bundle_or_stage_file_name() -> None:
    stray = sorted(
        f"{module}: {name!r}"
        for module, name in _spelled()
        if module not in ALLOWED and (module, name) not in ALLOWED
    )
    assert not stray, "name these in qpr.artifacts (or allow them here, with a reason)"


def test_every_allowed_name_is_still_spelled() -> None:
    """An entry nothing needs any more goes (the allow-list only shrinks)."""
    spelled = _spelled()
    modules = {module for module, _ in spelled}

    def needed(key: str | tuple[str, str]) -> bool:
        return key in spelled if isinstance(key, tuple) else key in modules

    assert not [key for key in ALLOWED if not needed(key)]


def test_the_scan_finds_names_and_skips_suffixes_and_docstrings() -> None:
    source = '''
"""Writes index/index.faiss."""
A = "questions.parquet"
B = "index/bm25.npz"
C = f"{stage}.json"
D = ".parquet"
E = "*.json"


def f():
    """metrics.json"""
    return "metrics.json", "/openapi.json", "notes.txt"
'''
    assert sorted(file_names(source)) == ["index/bm25.npz", "metrics.json", "questions.parquet"]

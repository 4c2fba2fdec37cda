"""QPR: question paraphrase retrieval.

The library is importable without Prefect or MLflow running; flows/ wires it to them.
``from qpr import Searcher`` is the Python API (`qpr.searcher`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from qpr.version import __version__

if TYPE_CHECKING:
    from qpr.searcher import Searcher

__all__ = ["Searcher", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported on first use: Searcher pulls in FAISS and ONNX Runtime, which every CLI
    # command (and `import qpr`) would otherwise pay for at start-up. By name, because no
    # pipeline stage uses it: a static import here would make every stage's dvc deps
    # (tests/test_dvc.py follows imports) cover the searcher and the service.
    if name == "Searcher":
        return importlib.import_module("qpr.searcher").Searcher
    raise AttributeError(f"module 'qpr' has no attribute {name!r}")

"""QPR: question paraphrase retrieval.

The library is importable without Prefect or MLflow running; flows/ wires it to them.
``from qpr import Searcher`` is the Python API (`qpr.searcher`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qpr.searcher import Searcher

__version__ = "0.1.0"
__all__ = ["Searcher", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported on first use: Searcher pulls in FAISS and ONNX Runtime, which every CLI
    # command (and `import qpr`) would otherwise pay for at start-up.
    if name == "Searcher":
        from qpr.searcher import Searcher

        return Searcher
    raise AttributeError(f"module 'qpr' has no attribute {name!r}")

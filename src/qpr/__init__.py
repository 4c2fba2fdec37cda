"""QPR: question paraphrase retrieval.

The library is importable without Prefect or MLflow running; flows/ wires it to them.
"""

__version__ = "0.1.0"

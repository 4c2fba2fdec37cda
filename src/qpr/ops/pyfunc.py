"""The bundle as an MLflow pyfunc, logged as code: nothing in a model version is pickled.

A version's model directory holds the model code (a three-line file that imports
`QPRSearchModel` and hands an instance to ``mlflow.models.set_model``), a copy of the qpr
package (``code/qpr``, so it loads where qpr is not installed), the bundle's files under
``artifacts/bundle/`` and their sha256 digests under ``artifacts/manifest.json``. Loading
runs only the package's own source; a cloudpickled model (MLflow's default for a
``PythonModel`` instance) would run whatever bytes the store holds.

`QPRSearchModel.load_context` hashes every bundle file against the manifest before it
reads any of them and refuses the model (`ModelIntegrityError`) on any difference: a
changed, missing or extra file. `verify_artifacts` is the same check for code that
downloads the files itself (`qpr.ops.registry.download_bundle`).

`QPRSearchModel.predict` takes the service's filters as the inference param ``filters``: a
JSON object, ``{"locale": "en", "tenant": ["a", "b"]}`` (a string, since MLflow's param
schema has no free-form map). They are checked and applied as ``/search`` does
(`qpr.retrieval.selection`): an unknown field or a value that is not a string or a list of
strings raises `FilterError`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.models.model import ModelInfo
from mlflow.models.signature import ModelSignature
from mlflow.pyfunc import PythonModel, PythonModelContext
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

import qpr
from qpr.artifacts import MODEL_MANIFEST_FILE
from qpr.errors import QPRError
from qpr.retrieval.bundle import HIT_FIELDS, Bundle, SearchResult
from qpr.retrieval.selection import FilterError, Filters

__all__ = [
    "BUNDLE_ARTIFACT",
    "DEFAULT_K",
    "MANIFEST_ARTIFACT",
    "PREDICTION_COLUMNS",
    "ModelIntegrityError",
    "QPRSearchModel",
    "digests",
    "log_search_model",
    "parse_filters",
    "verify_artifacts",
    "verify_bundle",
]

BUNDLE_ARTIFACT = "bundle"  # the artifacts key and the directory name under artifacts/
MANIFEST_ARTIFACT = "manifest"  # artifacts/manifest.json: {relative path: sha256}
_CODE_FILE = "qpr_search_model.py"
DEFAULT_K = 10
_EXAMPLE_QUESTION = "how do i reset my password"
# query and rank, then a hit's fields as the CLI and the service name them, then answered.
PREDICTION_COLUMNS = ("query", "rank", *HIT_FIELDS, "answered")
_COLUMN_TYPES = {
    "query": ("str", "string"),
    "rank": ("int64", "long"),
    "answer_id": ("object", "string"),
    # Decimal strings, as in the service's JSON: `mlflow models serve` writes this frame as
    # JSON, where a 64-bit id as a number loses digits in JavaScript (qpr.ids).
    "question_id": ("str", "string"),
    "text": ("str", "string"),
    "cluster_id": ("str", "string"),
    "distance": ("float64", "double"),
    "score": ("float64", "double"),
    "answered": ("bool", "boolean"),
}

# The whole model as MLflow stores it: source, not a pickle. Written next to the staged
# bundle at log time (a module of the package would call set_model on every import).
_MODEL_CODE = '''"""QPR's search model, logged as code (qpr.ops.pyfunc)."""

import mlflow

from qpr.ops.pyfunc import QPRSearchModel

mlflow.models.set_model(QPRSearchModel())
'''

# The runtime the pyfunc needs; torch is not among them (the bundle never imports it).
# tokenizers reads a transformer bundle's word-piece vocab.json (transformers is not needed).
_RUNTIME_PACKAGES = (
    "mlflow",
    "numpy",
    "pandas",
    "pyarrow",
    "onnxruntime",
    "faiss-cpu",
    "tokenizers",
    "PyStemmer",  # a fused bundle's BM25 stems the questions
    "numba",  # and scores them with compiled kernels (qpr.retrieval.maxscore)
)
_CHUNK = 1 << 20


class ModelIntegrityError(QPRError, RuntimeError):
    """A model version's files are not the ones it was logged with; it is not loaded."""


# ---------------------------------------------------------------- checksums


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def digests(directory: str | Path) -> dict[str, str]:
    """{path relative to `directory` (POSIX): sha256} of every file under it."""
    root = Path(directory)
    return {
        path.relative_to(root).as_posix(): _sha256(path)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def verify_bundle(bundle_dir: str | Path, manifest: str | Path) -> None:
    """Raise `ModelIntegrityError` unless `bundle_dir` holds exactly the manifest's files,
    byte for byte."""
    try:
        expected = json.loads(Path(manifest).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelIntegrityError(f"cannot read the bundle manifest {manifest}: {exc}") from exc
    found = digests(bundle_dir)
    problems = [
        *(f"{rel}: missing" for rel in sorted(expected.keys() - found.keys())),
        *(f"{rel}: not in the manifest" for rel in sorted(found.keys() - expected.keys())),
        *(
            f"{rel}: sha256 {found[rel][:12]}… expected {expected[rel][:12]}…"
            for rel in sorted(expected.keys() & found.keys())
            if found[rel] != expected[rel]
        ),
    ]
    if problems:
        raise ModelIntegrityError(
            f"the model's bundle in {bundle_dir} does not match its manifest, refusing to "
            f"load it (tampered with or corrupted in the store): {'; '.join(problems)}"
        )


def verify_artifacts(artifacts_dir: str | Path) -> None:
    """`verify_bundle` on a downloaded model's ``artifacts/``; versions logged before the
    manifest existed (no manifest.json) pass unchecked."""
    root = Path(artifacts_dir)
    if (root / MODEL_MANIFEST_FILE).is_file():
        verify_bundle(root / BUNDLE_ARTIFACT, root / MODEL_MANIFEST_FILE)


# ---------------------------------------------------------------- the model


class QPRSearchModel(PythonModel):
    """The bundle as an MLflow pyfunc: questions in, top-k known paraphrases out.

    predict(model_input, params={"k": 10, "filters": '{"locale": "en"}'}): model_input is
    a question, a list/Series of questions, or a DataFrame with a "question" column (or a
    single column). The result is one row per (query, hit), columns `PREDICTION_COLUMNS`,
    rank 1 = closest; question_id and cluster_id are decimal strings, as in the service's
    JSON (`qpr.ids`); "answered" is the bundle's no-answer decision for the query (top-1
    distance within the stored threshold). An empty question raises ValueError (a whole
    batch fails, as the bundle does: a silently dropped row would misalign the caller's
    results). filters (`parse_filters`) apply to every question: only the matching
    questions are searched, as ``/search/batch`` does; a bad one raises `FilterError`.
    """

    def load_context(self, context: PythonModelContext) -> None:
        manifest = context.artifacts.get(MANIFEST_ARTIFACT)
        if manifest is None:
            raise ModelIntegrityError("the model has no bundle manifest: refusing to load it")
        verify_bundle(context.artifacts[BUNDLE_ARTIFACT], manifest)
        self._bundle = Bundle.load(context.artifacts[BUNDLE_ARTIFACT])
        config = context.model_config or {}
        self._k = int(config.get("k", DEFAULT_K))

    def predict(
        self,
        context: PythonModelContext | None,
        model_input: pd.DataFrame,  # via pyfunc: the signature turns a list into a frame
        params: dict[str, Any] | None = None,
    ) -> pd.DataFrame:
        params = params or {}
        k = int(params.get("k") or self._k)
        filters = parse_filters(params.get("filters"), self._bundle.filter_fields)
        return _frame(self._bundle.search_batch(_questions(model_input), k=k, filters=filters))


def _frame(results: Iterable[SearchResult]) -> pd.DataFrame:
    """Search results as predict returns them: one row per (query, hit), each hit's fields
    as the service's JSON has them (`Hit.as_dict`: ids as decimal strings)."""
    rows = [
        (r.query, rank, *(hit[name] for name in HIT_FIELDS), r.answered)
        for r in results
        for rank, hit in enumerate((h.as_dict() for h in r.hits), 1)
    ]
    frame = pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))
    return frame.astype({name: kind for name, (kind, _) in _COLUMN_TYPES.items()})


def parse_filters(value: str | Filters | None, known: Iterable[str] = ()) -> Filters | None:
    """The ``filters`` inference param → {field: value or [values]}, None for none.

    value: a JSON object (what the param schema carries: ``'{"locale": ["en", "de"]}'``),
    an already decoded mapping (a direct call of `QPRSearchModel.predict`), or None / ""
    / "{}" for no filters. FilterError (a ValueError; it lists `known`, the bundle's
    filter fields) for text that is not a JSON object; the fields and values are checked
    by the search itself (`qpr.retrieval.selection.normalised`), as the service does.
    """
    known = tuple(known)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise FilterError(
                f'filters must be a JSON object such as {{"locale": "en"}}: {exc}', known
            ) from None
    if not isinstance(value, Mapping):
        raise FilterError(
            'filters must be a JSON object, {"field": "value"} or {"field": ["v1", "v2"]}, '
            f"got {type(value).__name__}",
            known,
        )
    return dict(value) or None


def _questions(model_input: Any) -> list[str]:
    """Whatever pyfunc callers send (list, Series, DataFrame, array, one str) → list[str]."""
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, pd.DataFrame):
        if "question" in model_input.columns:
            column = model_input["question"]
        elif model_input.shape[1] == 1:
            column = model_input.iloc[:, 0]
        else:
            raise ValueError(
                f"expected a 'question' column, got columns {list(model_input.columns)}"
            )
        return [str(q) for q in column.tolist()]
    if isinstance(model_input, pd.Series | np.ndarray):
        return [str(q) for q in np.asarray(model_input).ravel().tolist()]
    if isinstance(model_input, Iterable):
        return [q if isinstance(q, str) else str(q) for q in model_input]
    raise TypeError(f"expected questions, got {type(model_input).__name__}")


# ---------------------------------------------------------------- logging


def log_search_model(
    staged: Path, *, name: str, k: int = DEFAULT_K, metadata: Mapping[str, Any] | None = None
) -> ModelInfo:
    """Log the staged bundle directory into the active MLflow run as model `name`: the
    model as code, the qpr package beside it, the bundle and its manifest as artifacts."""
    with tempfile.TemporaryDirectory(prefix="qpr-pyfunc-") as tmp:
        work = Path(tmp)
        manifest = work / MODEL_MANIFEST_FILE
        manifest.write_text(json.dumps(digests(staged), indent=1, sort_keys=True), "utf-8")
        code_file = work / _CODE_FILE
        code_file.write_text(_MODEL_CODE, encoding="utf-8")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(code_file),
            artifacts={BUNDLE_ARTIFACT: str(staged), MANIFEST_ARTIFACT: str(manifest)},
            code_paths=[str(_stage_code(work / "code"))],
            pip_requirements=_pip_requirements(),
            signature=_signature(),
            input_example=[_EXAMPLE_QUESTION],
            model_config={"k": int(k)},
            metadata={**(metadata or {}), "qpr_manifest_sha256": _sha256(manifest)},
        )


def _stage_code(target: Path) -> Path:
    """A clean copy of the qpr package, so the pyfunc loads where qpr is not installed."""
    source = Path(qpr.__file__).resolve().parent
    shutil.copytree(source, target / "qpr", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target / "qpr"


def _signature() -> ModelSignature:
    return ModelSignature(
        # Unnamed: a list or Series of questions is accepted as is; a named "question"
        # column would make MLflow reject a plain list before predict sees it.
        inputs=Schema([ColSpec("string")]),
        outputs=Schema([ColSpec(_COLUMN_TYPES[name][1], name) for name in PREDICTION_COLUMNS]),
        # filters: a JSON object (MLflow params have no free-form map type); "" = none.
        params=ParamSchema([ParamSpec("k", "long", DEFAULT_K), ParamSpec("filters", "string", "")]),
    )


def _pip_requirements() -> list[str]:
    """The serving runtime pinned to what built the model (no inference: it costs 5-15 s)."""
    pins = []
    for package in _RUNTIME_PACKAGES:
        try:
            pins.append(f"{package}=={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            if package == "faiss-cpu":  # a GPU install: same module, other wheel
                try:
                    pins.append(f"faiss-gpu=={importlib.metadata.version('faiss-gpu')}")
                    continue
                except importlib.metadata.PackageNotFoundError:
                    pass
            pins.append(package)
    return pins

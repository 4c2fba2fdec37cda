"""The bundle as an MLflow pyfunc, logged as code: nothing in a model version is pickled.

A version's model directory holds the model code (a short file that imports
`QPRSearchModel` and hands an instance to ``mlflow.models.set_model``), the files a version
is made of under ``artifacts/``: the bundle (``artifacts/bundle/``) and a copy of the qpr
package (``artifacts/code/qpr``, so it loads where qpr is not installed), and
``artifacts/manifest.json``: every one of those files with its sha256 and the version that
stores it (`qpr.ops.version_files`). A version stores only the files no earlier version of
its registered model stores: a published delta stores the delta, and references its base.
Loading runs only the package's own source; a cloudpickled model (MLflow's default for a
``PythonModel`` instance) would run whatever bytes the store holds.

Where qpr is not imported yet, the model code puts the logged package together first
(fetching what other versions store, checked against the manifest) and imports it from
there, as MLflow's ``code/`` folder did for versions registered before: those (a flat
manifest, every bundle file stored, the package under ``code/qpr``) load as they did.

`QPRSearchModel.load_context` puts the bundle together the same way (into a temporary
folder when a file comes from another version), hashes every file against the manifest
before it reads any of them, and refuses the model (`ModelIntegrityError`) on any
difference: a changed, missing or extra file, each named with the version that stores it.
`download_version_bundle` is the same for code that downloads the files itself
(`qpr.ops.registry.download_bundle`, the service's registry source); a file whose version
cannot be read (deleted) is `StoredFileUnavailable`.

`QPRSearchModel.predict` takes the service's filters as the inference param ``filters``: a
JSON object, ``{"locale": "en", "tenant": ["a", "b"]}`` (a string, since MLflow's param
schema has no free-form map). They are checked and applied as ``/search`` does
(`qpr.retrieval.selection`): an unknown field or a value that is not a string or a list of
strings raises `FilterError`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
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
from qpr.ops import version_files
from qpr.ops.version_files import BUNDLE, CODE, FetchError, Manifest, VersionFilesError
from qpr.retrieval.bundle import HIT_FIELDS, Bundle, SearchResult
from qpr.retrieval.selection import FilterError, Filters

__all__ = [
    "BUNDLE_ARTIFACT",
    "DEFAULT_K",
    "MANIFEST_ARTIFACT",
    "PREDICTION_COLUMNS",
    "ModelIntegrityError",
    "QPRSearchModel",
    "StoredFileUnavailable",
    "assembled_bundle",
    "digests",
    "download_version_bundle",
    "log_search_model",
    "parse_filters",
    "read_version_manifest",
    "verify_artifacts",
    "verify_bundle",
]

BUNDLE_ARTIFACT = BUNDLE  # the artifacts key and the directory name under artifacts/
CODE_ARTIFACT = CODE  # artifacts/code/qpr: the package, as far as this version stores it
MANIFEST_ARTIFACT = "manifest"  # artifacts/manifest.json (qpr.ops.version_files)
_CODE_FILE = "qpr_search_model.py"
# qpr.ops.version_files, copied beside the model code (MLflow's code/ folder): it puts the
# package together before any of qpr can be imported.
_FILES_MODULE = "qpr_version_files"
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
# MLflow runs it at log time too, where qpr is imported already: nothing is fetched then.
_MODEL_CODE = '''"""QPR's search model, logged as code (qpr.ops.pyfunc)."""

import importlib.util
import sys
from pathlib import Path

import mlflow

if "qpr" not in sys.modules:
    # The qpr package this version was logged with, put together from the versions that
    # store its files and checked against the manifest; it wins over an installed qpr.
    _here = Path(__file__).resolve().parent
    _spec = importlib.util.spec_from_file_location(
        "@FILES@", _here / "code" / "@FILES@.py"
    )
    _files = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _files
    _spec.loader.exec_module(_files)
    _manifest = _here / "artifacts" / "@MANIFEST@"
    _code = _files.code_dir(_here, _manifest, mlflow.artifacts.download_artifacts)
    sys.path.insert(0, str(_code))

from qpr.ops.pyfunc import QPRSearchModel

mlflow.models.set_model(QPRSearchModel())
'''.replace("@FILES@", _FILES_MODULE).replace("@MANIFEST@", MODEL_MANIFEST_FILE.as_posix())

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


class ModelIntegrityError(QPRError, RuntimeError):
    """A model version's files are not the ones it was logged with; it is not loaded."""


class StoredFileUnavailable(QPRError, RuntimeError):
    """A file a version references cannot be read from the version that stores it (that
    version was deleted, or the store cannot be reached); the version is not loaded."""


# ---------------------------------------------------------------- checksums


def digests(directory: str | Path) -> dict[str, str]:
    """{path relative to `directory` (POSIX): sha256} of every file under it."""
    root = Path(directory)
    return {
        path.relative_to(root).as_posix(): version_files.sha256_of(path)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def read_version_manifest(path: str | Path) -> Manifest:
    """A version's manifest (either format); ModelIntegrityError when it cannot be read."""
    try:
        return version_files.read_manifest(path)
    except VersionFilesError as exc:
        raise ModelIntegrityError(str(exc)) from exc


def verify_bundle(bundle_dir: str | Path, manifest: str | Path) -> None:
    """Raise `ModelIntegrityError` unless `bundle_dir` holds exactly the manifest's bundle
    files, byte for byte (each problem named, with the version that stores the file)."""
    with _integrity():
        version_files.verify(Path(bundle_dir), read_version_manifest(manifest), BUNDLE)


def verify_artifacts(artifacts_dir: str | Path) -> None:
    """`verify_bundle` on a downloaded model's ``artifacts/`` (after the files it references
    were put in: `download_version_bundle`); versions logged before the manifest existed
    (no manifest.json) pass unchecked."""
    root = Path(artifacts_dir)
    if (root / MODEL_MANIFEST_FILE).is_file():
        verify_bundle(root / BUNDLE_ARTIFACT, root / MODEL_MANIFEST_FILE)


@contextmanager
def _integrity() -> Iterator[None]:
    """version_files' errors as this module's: a file that cannot be fetched, or files
    that differ from the manifest."""
    try:
        yield
    except FetchError as exc:
        raise StoredFileUnavailable(str(exc)) from exc
    except VersionFilesError as exc:
        raise ModelIntegrityError(f"refusing to load the model: {exc}") from exc


@contextmanager
def assembled_bundle(manifest_path: str | Path, own: str | Path | None) -> Iterator[Path]:
    """The bundle folder of a version: `own` (the bundle files it stores) when it stores
    every one, else a temporary folder (removed on exit) with its own files and the others
    fetched from the versions that store them (through the process's MLflow registry).
    Checked against the manifest either way."""
    manifest = read_version_manifest(manifest_path)
    own_dir = Path(manifest_path).parent / BUNDLE if own is None else Path(own)
    if not manifest.references(BUNDLE):
        with _integrity():
            version_files.verify(own_dir, manifest, BUNDLE)
        yield own_dir
        return
    fetch = version_files.registry_fetch(str(manifest.model), mlflow.artifacts.download_artifacts)
    with tempfile.TemporaryDirectory(prefix="qpr-bundle-") as tmp, _integrity():
        yield version_files.fill(Path(tmp), manifest, BUNDLE, fetch=fetch, own=own_dir)


def download_version_bundle(
    client: mlflow.MlflowClient,
    name: str,
    version: int | str,
    dst: Path,
    *,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
) -> Path:
    """Download version `version` of `name` into `dst` and return its bundle folder
    (``dst/artifacts/bundle``), whole: the files it references fetched from the versions
    that store them, every file checked against the manifest. Only the bundle and the
    manifest are downloaded, never the package copy. ModelIntegrityError for files that
    differ or a version with no bundle; StoredFileUnavailable when a referenced version
    cannot be read; MLflow's own errors when the version itself cannot be."""
    location = client.get_model_version_download_uri(name, str(version)).rstrip("/")
    download = functools.partial(
        mlflow.artifacts.download_artifacts, tracking_uri=tracking_uri, registry_uri=registry_uri
    )
    listed = mlflow.artifacts.list_artifacts(
        artifact_uri=f"{location}/artifacts", tracking_uri=tracking_uri
    )
    names = {Path(info.path).name for info in listed}
    artifacts = Path(dst) / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    bundle, manifest = artifacts / BUNDLE_ARTIFACT, artifacts / MODEL_MANIFEST_FILE
    for wanted, target in ((MODEL_MANIFEST_FILE.name, manifest), (BUNDLE_ARTIFACT, bundle)):
        if wanted in names:
            # Into a scratch folder first: where MLflow puts a download depends on the URI.
            with tempfile.TemporaryDirectory(prefix=".qpr-download-", dir=artifacts) as tmp:
                local = download(artifact_uri=f"{location}/artifacts/{wanted}", dst_path=tmp)
                if target.is_dir():  # an earlier download into the same folder
                    shutil.rmtree(target)
                Path(local).replace(target)
    bundle.mkdir(exist_ok=True)  # a version that stores no bundle file of its own
    if not manifest.is_file():
        if BUNDLE_ARTIFACT not in names:
            raise ModelIntegrityError(
                f"models:/{name}/{version} has no artifacts/{BUNDLE_ARTIFACT}/ folder (found: "
                f"{', '.join(sorted(names)) or 'nothing'}): not a QPR bundle"
            )
        return bundle  # logged before manifests existed: as it is
    parsed = read_version_manifest(manifest)
    fetch = version_files.registry_fetch(
        str(parsed.model or name), download, client.get_model_version_download_uri
    )
    with _integrity():
        return version_files.fill(bundle, parsed, BUNDLE, fetch=fetch)


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
        # A version that stores every bundle file is read where it lies; one that takes
        # some from earlier versions is put together in a temporary folder first.
        with assembled_bundle(manifest, context.artifacts.get(BUNDLE_ARTIFACT)) as folder:
            self._bundle = Bundle.load(folder)
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
    staged: Path,
    *,
    name: str,
    k: int = DEFAULT_K,
    metadata: Mapping[str, Any] | None = None,
    known: Mapping[str, tuple[int, str]] | None = None,
    model: str | None = None,
) -> ModelInfo:
    """Log the staged bundle directory into the active MLflow run as model `name`: the
    model as code, the qpr package beside it, the bundle and its manifest as artifacts.

    known: {sha256: (version, path under artifacts/)} of the files earlier versions of the
    registered model `model` store; a file found there is referenced, not stored again.
    None (or no `model`): the version stores every file itself."""
    with tempfile.TemporaryDirectory(prefix="qpr-pyfunc-") as tmp:
        work = Path(tmp)
        folders = {BUNDLE_ARTIFACT: Path(staged), CODE_ARTIFACT: _stage_code(work / "code")}
        parsed = version_files.manifest_of(folders, (known or {}) if model else {}, model=model)
        manifest = work / MODEL_MANIFEST_FILE
        manifest.write_text(json.dumps(parsed.as_json(), indent=1, sort_keys=True), "utf-8")
        stored = version_files.stored_folders(parsed, folders, work / "stored")
        code_file = work / _CODE_FILE
        code_file.write_text(_MODEL_CODE, encoding="utf-8")
        files_module = work / f"{_FILES_MODULE}.py"
        shutil.copy2(version_files.__file__, files_module)
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(code_file),
            artifacts={
                **{key: str(folder) for key, folder in stored.items()},
                MANIFEST_ARTIFACT: str(manifest),
            },
            code_paths=[str(files_module)],
            pip_requirements=_pip_requirements(),
            signature=_signature(),
            input_example=[_EXAMPLE_QUESTION],
            model_config={"k": int(k)},
            metadata={
                **(metadata or {}),
                "qpr_manifest_sha256": version_files.sha256_of(manifest),
            },
        )


def _stage_code(target: Path) -> Path:
    """A clean copy of the qpr package, so the pyfunc loads where qpr is not installed."""
    source = Path(qpr.__file__).resolve().parent
    shutil.copytree(source, target / "qpr", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


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

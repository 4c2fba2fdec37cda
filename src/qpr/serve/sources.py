"""Where the service's model bundles come from.

A source answers two questions: *which model should be served now* (`poll`, cheap: it
runs every few seconds) and *give me its files* (`materialize`, expensive: only when the
answer changed). The reloader (`qpr.serve.reload`) drives both.

- `LocalSource`: a ``models/`` directory as the pipeline writes it. The cheap check is a
  stat signature (inode, size, mtime of the bundle's files, `qpr.artifacts`): the pipeline
  replaces files by rename, so any rewrite changes it. Content identity is then the bundle
  fingerprint (sha256 of the files), computed by `Bundle.load`. Meant for development and for images
  that bake a bundle in; while a `dvc repro` rewrites the directory stage by stage, the
  intermediate mixes are refused by the load checks and the canaries (see docs/serving.md).
- `RegistrySource`: the MLflow registry's alias (default ``champion``) of a registered
  model, only a version with the committed mark (``qpr.committed``). The cheap check is
  the version number the alias points at; the files are the
  version's ``artifacts/bundle/`` folder, downloaded into a temporary directory that is
  deleted once the bundle is in memory.

Neither imports torch; `RegistrySource` imports MLflow only when it is constructed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qpr.artifacts import LEGACY_SEARCH_FILE, OPTIONAL_FILES, REQUIRED_FILES
from qpr.errors import QPRError
from qpr.retrieval.bundle import BundleError

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = [
    "BUNDLE_SUBDIR",
    "BundleSource",
    "Candidate",
    "LocalSource",
    "RegistrySource",
    "SourceError",
]

log = logging.getLogger("qpr.serve")

# Inside a registered model version's artifacts (the registry's contract).
BUNDLE_SUBDIR = Path("artifacts") / "bundle"
# Version tags the project's registry (qpr.ops.registry) writes; optional here: a version
# without them is served all the same, only without the integrity check / commit.
TAG_FINGERPRINT = "qpr.bundle_fingerprint"
TAG_GIT_COMMIT = "qpr.git_commit"
# Required: set only after the run that registered the version committed. A version
# without it (a crashed run's orphan) is never served, whatever alias points at it.
TAG_COMMITTED = "qpr.committed"
# The files whose stat signature tells a local bundle changed (all that Bundle.load may
# read: an older bundle's search config is its threshold.json).
_WATCHED = (*REQUIRED_FILES, LEGACY_SEARCH_FILE, *OPTIONAL_FILES)


class SourceError(QPRError, RuntimeError):
    """The source cannot say which model to serve right now (registry unreachable, alias
    not set yet). Transient: the reloader keeps the current model and asks again later."""


@dataclass(frozen=True)
class Candidate:
    """The model a source wants served.

    token: changes whenever the model may have changed; equal tokens mean "nothing new".
    name, version, alias: what /version and the metrics report.
    details: extra facts for /version (run id, training git commit), best effort.
    expected_fingerprint: the `Bundle.fingerprint` the source promises, when it records
        one; a loaded bundle that differs (a corrupt or partial download) is refused.
    """

    token: str
    name: str
    version: str | None
    alias: str | None
    details: Mapping[str, str] = field(default_factory=dict)
    expected_fingerprint: str | None = None


class BundleSource(Protocol):
    """What the reloader needs from a source (see the module docstring)."""

    @property
    def description(self) -> str:
        """One line for logs and /version, e.g. ``local:/srv/models``."""
        ...

    def poll(self) -> Candidate:
        """The model to serve now. Cheap. SourceError when the source cannot tell."""
        ...

    def materialize(self, candidate: Candidate) -> contextlib.AbstractContextManager[Path]:
        """A context manager yielding a directory with the candidate's bundle files; the
        directory may disappear when the context exits (the bundle is in memory by then)."""
        ...


class LocalSource:
    """A models/ directory on disk (see the module docstring)."""

    def __init__(self, models_dir: str | os.PathLike[str]) -> None:
        self.models_dir = Path(models_dir).resolve()

    @property
    def description(self) -> str:
        return f"local:{self.models_dir}"

    def poll(self) -> Candidate:
        parts = []
        for rel in _WATCHED:
            try:
                st = os.stat(self.models_dir / rel)
            except OSError:
                parts.append(f"{rel.as_posix()}:missing")
                continue
            parts.append(f"{rel.as_posix()}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
        return Candidate(token="|".join(parts), name="local", version=None, alias=None, details={})

    @contextlib.contextmanager
    def materialize(self, candidate: Candidate) -> Iterator[Path]:
        # Loaded in place: Bundle.load stats the files before and after reading them and
        # refuses a directory that changed underneath it.
        yield self.models_dir


class RegistrySource:
    """The MLflow registered model ``name`` at ``alias`` (see the module docstring).

    tracking_uri / registry_uri: None = MLflow's defaults (``MLFLOW_TRACKING_URI`` etc.).
    download_root: where versions are downloaded (a fresh temporary folder each time,
    removed after loading); None = the system temp dir.
    """

    def __init__(
        self,
        name: str,
        alias: str = "champion",
        *,
        tracking_uri: str | None = None,
        registry_uri: str | None = None,
        download_root: str | os.PathLike[str] | None = None,
        client: MlflowClient | None = None,
    ) -> None:
        if not name:
            raise ValueError("a registered model name is required")
        # MLflow draws a progress bar per download on stderr: noise in a service log.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        from mlflow import MlflowClient

        self.name = name
        self.alias = alias
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.download_root = None if download_root is None else Path(download_root)
        self._client = client or MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
        # run id → its git commit: looked up once per run, not at every poll
        self._commits: dict[str, str | None] = {}

    @property
    def description(self) -> str:
        return f"mlflow:models:/{self.name}@{self.alias}"

    def poll(self) -> Candidate:
        from mlflow.exceptions import MlflowException

        try:
            mv = self._client.get_model_version_by_alias(self.name, self.alias)
        except MlflowException as exc:
            # No such model/alias yet, or the tracking server is down: both transient
            # from the service's point of view (keep serving, ask again later).
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SourceError(f"{self.description}: {first}") from exc
        except OSError as exc:  # connection refused, DNS, ... from a remote server
            raise SourceError(f"{self.description}: {exc}") from exc
        tags = dict(mv.tags or {})
        if not tags.get(TAG_COMMITTED):
            # Transient for the reloader: it keeps the current model and asks again.
            raise SourceError(
                f"{self.description}: version {mv.version} has no {TAG_COMMITTED} mark "
                "(its run never committed): not served"
            )
        details = {"run_id": mv.run_id or ""}
        # The training commit: the version's own tag when the registry wrote one, else the
        # run's MLflow tag (looked up once per run, not at every poll).
        commit = tags.get(TAG_GIT_COMMIT)
        if commit in (None, "", "unknown") and mv.run_id:
            if mv.run_id not in self._commits:
                self._commits = {mv.run_id: self._run_commit(mv.run_id)}
            commit = self._commits[mv.run_id]
        details["git_commit"] = commit or ""
        return Candidate(
            token=f"{self.name}/{mv.version}",
            name=self.name,
            version=str(mv.version),
            alias=self.alias,
            details={k: v for k, v in details.items() if v and v != "unknown"},
            expected_fingerprint=tags.get(TAG_FINGERPRINT) or None,
        )

    def _run_commit(self, run_id: str) -> str | None:
        """The training run's git commit tag, when the run recorded one (best effort)."""
        try:
            run = self._client.get_run(run_id)
        except Exception as exc:  # informational only: never block a reload on it
            log.debug("cannot read run %s: %s", run_id, exc)
            return None
        return run.data.tags.get("mlflow.source.git.commit")

    @contextlib.contextmanager
    def materialize(self, candidate: Candidate) -> Iterator[Path]:
        from mlflow.artifacts import download_artifacts

        if self.download_root is not None:
            self.download_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="qpr-serve-", dir=self.download_root))
        try:
            # By version number, not by alias: the alias may move between poll and
            # download, and the files must be those of the version we report. The
            # version's storage location is resolved with this source's client because
            # MLflow resolves "models:/" URIs against the process-wide registry URI only.
            uri = f"models:/{self.name}/{candidate.version}"
            location = self._client.get_model_version_download_uri(
                self.name, str(candidate.version)
            )
            local = Path(
                download_artifacts(
                    artifact_uri=location,
                    dst_path=str(tmp),
                    tracking_uri=self.tracking_uri,
                    registry_uri=self.registry_uri,
                )
            )
            bundle = local / BUNDLE_SUBDIR
            if not bundle.is_dir():
                found = sorted(p.relative_to(local).as_posix() for p in local.rglob("*"))[:10]
                raise BundleError(
                    f"{uri} has no {BUNDLE_SUBDIR.as_posix()}/ folder (found: "
                    f"{', '.join(found) or 'nothing'}): not a QPR bundle"
                )
            yield bundle
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

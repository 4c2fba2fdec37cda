"""Where the service's model bundles come from.

A source answers two questions: *which model should be served now* (`poll`, cheap: it
runs every few seconds) and *give me its files* (`materialize`, expensive: only when the
answer changed). The reloader (`qpr.serve.reload`) drives both.

- `LocalSource`: a ``models/`` directory as the pipeline writes it, or a symlink to one
  (resolved at every poll: pointing it at another bundle directory is a deploy). The
  cheap check is the resolved path and a stat signature (inode, size, mtime of the
  bundle's files, `qpr.artifacts`, and of each file of the deltas a load adds): the
  pipeline replaces files by rename, so any rewrite changes it, and so does a delta file
  changed or restored in place. A local folder is checked at the poll interval even
  while it fails (``backoff`` False): a check is a few stats. Content identity is then
  the bundle fingerprint (sha256 of the files), computed by `Bundle.load`. Meant for
  development and for images that bake a bundle in; while a `dvc repro` rewrites the
  directory stage by stage, the intermediate mixes are refused by the load checks and the
  canaries (see docs/serving.md).
- `RegistrySource`: the MLflow registry's alias (default ``champion``) of a registered
  model, only a version with the committed mark (``qpr.committed``). The cheap check is
  the version number the alias points at; the files are the
  version's ``artifacts/bundle/`` folder, downloaded into a temporary directory that is
  deleted once the bundle is in memory. A version that takes files from earlier versions
  gets them from those, and every file is checked against the version's manifest
  (`qpr.ops.pyfunc.download_version_bundle`). Each version that passed its checks is kept in a
  local cache (``keep``); when the registry cannot be reached and nothing serves yet (a
  start during an outage), the newest kept version serves (``fallback``). Every registry
  call makes one quick attempt (MLflow's own retries would hold it for minutes): the
  reloader retries with its own backoff (``backoff`` True).

Neither imports torch; `RegistrySource` imports MLflow only when it is constructed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qpr.artifacts import (
    ABSORBED_FILE,
    DELTAS_MANIFEST_FILE,
    LEGACY_SEARCH_FILE,
    OPTIONAL_FILES,
    REQUIRED_FILES,
    TAG_COMMITTED,
    TAG_FINGERPRINT,
    TAG_GIT_COMMIT,
)
from qpr.deltas.format import DeltaError, delta_files
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
# Version tags (qpr.artifacts): the fingerprint and git commit are optional here (a version
# without them is served, only without the integrity check); TAG_COMMITTED is required (a
# crashed run's orphan is never served, whatever alias points at it).
# The files whose stat signature tells a local bundle changed (all that Bundle.load may
# read: an older bundle's search config is its threshold.json). The deltas' manifest is
# renamed into place last, after their folders: its signature tells a new delta or
# tombstone arrived. A delta's own files are watched too (`LocalSource.poll`): one
# corrupted or restored in place changes what a load serves.
_WATCHED = (
    *REQUIRED_FILES,
    LEGACY_SEARCH_FILE,
    *OPTIONAL_FILES,
    ABSORBED_FILE,
    DELTAS_MANIFEST_FILE,
)
# Every registry call (poll, run lookup, download) is one quick try: MLflow's default (7
# retries, backoff factor 2, 120 s timeout) held a start in a registry outage for
# minutes. The timeout bounds each read, so a registry that accepts and never answers
# holds a check for 10 s; the reloader retries. Variables the operator set win.
_QUICK_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
# Registry versions kept in the cache: the serving one and the one before.
_KEEP_VERSIONS = 2
_KEPT_FILE = "qpr-kept.json"


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
    """What the reloader needs from a source (see the module docstring). Optional too:
    ``backoff`` (False: checked at the poll interval while failing; default True),
    ``fallback()`` and ``keep(candidate, path)`` (`qpr.serve.reload`)."""

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

    # Checked at the poll interval while it fails, not backed off (`Reloader.next_wait`).
    backoff = False

    def __init__(self, models_dir: str | os.PathLike[str]) -> None:
        # Absolute but not resolved: a symlink is followed anew at every poll.
        self.models_dir = Path(os.path.abspath(models_dir))

    @property
    def description(self) -> str:
        return f"local:{self.models_dir}"

    def poll(self) -> Candidate:
        real = self.models_dir.resolve()
        parts = [str(real)]
        for rel in (*_WATCHED, *_delta_parts(real)):
            try:
                st = os.stat(real / rel)
            except OSError:
                parts.append(f"{rel.as_posix()}:missing")
                continue
            parts.append(f"{rel.as_posix()}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
        details = {} if real == self.models_dir else {"resolved_dir": str(real)}
        return Candidate(
            token="|".join(parts), name="local", version=None, alias=None, details=details
        )

    @contextlib.contextmanager
    def materialize(self, candidate: Candidate) -> Iterator[Path]:
        # The directory the poll resolved, not the link again: a flip between poll and
        # load must not mix two bundles. Loaded in place: Bundle.load stats the files
        # before and after reading them and refuses a directory that changed underneath.
        yield Path(candidate.details.get("resolved_dir", self.models_dir))


def _delta_parts(root: Path) -> list[Path]:
    """The files of the deltas a load of `root` adds, relative to it (the manifest read
    once more); none when the manifest cannot be read (its own stat is watched)."""
    try:
        files = delta_files(root)
    except (DeltaError, OSError):
        return []
    return [rel for rel in files if rel not in (ABSORBED_FILE, DELTAS_MANIFEST_FILE)]


class RegistrySource:
    """The MLflow registered model ``name`` at ``alias`` (see the module docstring).

    tracking_uri / registry_uri: None = MLflow's defaults (``MLFLOW_TRACKING_URI`` etc.).
    download_root: where versions are downloaded (a fresh temporary folder each time,
    removed after loading); None = the system temp dir.
    cache_dir: where versions that served are kept (``<cache_dir>/<name>/<version>``);
    None = keep nothing.
    """

    def __init__(
        self,
        name: str,
        alias: str = "champion",
        *,
        tracking_uri: str | None = None,
        registry_uri: str | None = None,
        download_root: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
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
        self.cache_dir = None if cache_dir is None else Path(cache_dir) / name
        self._client = client or MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
        # run id → its git commit: looked up once per run, not at every poll
        self._commits: dict[str, str | None] = {}

    # A remote registry that fails is retried with backoff (`Reloader.next_wait`).
    backoff = True

    @property
    def description(self) -> str:
        return f"mlflow:models:/{self.name}@{self.alias}"

    def poll(self) -> Candidate:
        from mlflow.exceptions import MlflowException

        try:
            with _quick_http():
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
            with _quick_http():
                run = self._client.get_run(run_id)
        except Exception as exc:  # informational only: never block a reload on it
            log.debug("cannot read run %s: %s", run_id, exc)
            return None
        return run.data.tags.get("mlflow.source.git.commit")

    def keep(self, candidate: Candidate, path: Path) -> None:
        """Copy a bundle that passed its checks into the cache (old versions pruned)."""
        if self.cache_dir is None or candidate.details.get("kept") or candidate.version is None:
            return
        final = self.cache_dir / candidate.version
        if final.is_dir():
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # Copied beside, then renamed: a crash mid-copy leaves no half bundle to start from.
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=self.cache_dir))
        try:
            shutil.copytree(path, partial / "bundle")
            record = {
                "name": candidate.name,
                "version": candidate.version,
                "alias": candidate.alias,
                "details": dict(candidate.details),
                "expected_fingerprint": candidate.expected_fingerprint,
                "kept_at": time.time(),
            }
            (partial / _KEPT_FILE).write_text(json.dumps(record))
            partial.rename(final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        for old in self._kept()[_KEEP_VERSIONS:]:
            shutil.rmtree(old, ignore_errors=True)

    def _kept(self) -> list[Path]:
        """Kept version folders, newest version first."""
        if self.cache_dir is None or not self.cache_dir.is_dir():
            return []
        # ".partial-*": a copy cut short (the process stopped mid-keep) is no version.
        found = [
            p
            for p in self.cache_dir.iterdir()
            if not p.name.startswith(".") and (p / _KEPT_FILE).is_file()
        ]
        return sorted(found, key=lambda p: (len(p.name), p.name), reverse=True)

    def fallback(self) -> Candidate | None:
        """The newest kept version, to serve while the registry cannot be reached."""
        for folder in self._kept():
            try:
                record = json.loads((folder / _KEPT_FILE).read_text())
            except (OSError, ValueError):
                continue
            details = {str(k): str(v) for k, v in (record.get("details") or {}).items()}
            return Candidate(
                token=f"kept:{self.name}/{folder.name}",
                name=self.name,
                version=folder.name,
                alias=record.get("alias"),
                details={**details, "kept": str(folder)},
                expected_fingerprint=record.get("expected_fingerprint"),
            )
        return None

    @contextlib.contextmanager
    def materialize(self, candidate: Candidate) -> Iterator[Path]:
        kept = candidate.details.get("kept")
        if kept:
            yield Path(kept) / "bundle"
            return
        if self.download_root is not None:
            self.download_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="qpr-serve-", dir=self.download_root))
        try:
            yield self._download(candidate, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _download(self, candidate: Candidate, tmp: Path) -> Path:
        """The candidate's bundle folder, downloaded into `tmp`: BundleError for files
        that differ from the version's manifest or a version with no bundle."""
        from qpr.ops.pyfunc import (
            ModelIntegrityError,
            StoredFileUnavailable,
            download_version_bundle,
        )

        # By version number, not by alias: the alias may move between poll and download,
        # and the files must be those of the version we report. The version's storage
        # location is resolved with this source's client because MLflow resolves
        # "models:/" URIs against the process-wide registry URI only. Files the version
        # takes from earlier versions are fetched from those; every file is checked.
        try:
            with _quick_http():
                return download_version_bundle(
                    self._client,
                    self.name,
                    str(candidate.version),
                    tmp,
                    tracking_uri=self.tracking_uri,
                    registry_uri=self.registry_uri,
                )
        except ModelIntegrityError as exc:  # files that differ, or no bundle: not this one
            raise BundleError(f"models:/{self.name}/{candidate.version}: {exc}") from exc
        except StoredFileUnavailable as exc:  # retried by the reloader, then refused
            raise SourceError(f"models:/{self.name}/{candidate.version}: {exc}") from exc


@contextlib.contextmanager
def _quick_http() -> Iterator[None]:
    """MLflow's HTTP retries and timeout lowered for one call (only where unset)."""
    added = {k: v for k, v in _QUICK_HTTP.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)

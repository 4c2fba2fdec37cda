"""The files of a registry version: which it stores, which it takes from earlier versions,
and how a download puts them back together and checks them.

A version's ``artifacts/manifest.json`` (format 2) lists every file the version is made
of, relative to its ``artifacts/`` folder: the bundle (``bundle/...``) and the qpr package
that loads it (``code/...``). Each entry has its sha256, its size and the version that
stores it: ``null`` for the version itself, else the number of an earlier version of the
same registered model (and ``path`` when that version stores it under another name).
A version stores only the files no earlier version stores, so a delta version holds its
delta and references its base; an experiment that changes search.json stores search.json.

Versions registered before (format 1) hold a flat ``{bundle path: sha256}`` and store every
bundle file themselves: `read_manifest` reads both.

Standard library only, and no import of qpr: the file is copied beside every version's
model (``code/qpr_version_files.py``), so a pyfunc load where qpr is not installed can
fetch the qpr package it needs before anything of qpr is imported. The MLflow calls are
handed in (`registry_fetch`), so the module itself never imports MLflow.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BUNDLE",
    "CODE",
    "FORMAT",
    "Entry",
    "FetchError",
    "Manifest",
    "VersionFilesError",
    "code_dir",
    "fill",
    "manifest_of",
    "read_manifest",
    "registry_fetch",
    "sha256_of",
    "stored_folders",
    "verify",
]

FORMAT = 2
BUNDLE = "bundle"  # the bundle's folder under a version's artifacts/
CODE = "code"  # the qpr package's folder under a version's artifacts/
_CHUNK = 1 << 20

# fetch(holder version, its path relative to artifacts/, target file): put that file there.
Fetch = Callable[[int, str, Path], None]


class VersionFilesError(RuntimeError):
    """A version's files are not the ones its manifest names: changed, missing or extra."""


class FetchError(VersionFilesError):
    """A file a version references could not be read from the version that stores it."""


@dataclass(frozen=True)
class Entry:
    """One file of a version: its digest and size, and where it is stored (version None:
    the version itself; path None: under the same name)."""

    sha256: str
    size: int | None = None
    version: int | None = None
    path: str | None = None

    def holder(self, model: str | None) -> str:
        """Which version stores it, in words."""
        if self.version is None:
            return "stored by this version"
        return f"stored by version {self.version} of {model!r}"


@dataclass(frozen=True)
class Manifest:
    """A version's files, relative to its artifacts/ folder; `model` names the registered
    model the referenced versions belong to."""

    files: dict[str, Entry]
    model: str | None = None
    format: int = FORMAT

    def part(self, folder: str) -> dict[str, Entry]:
        """The entries under `folder`/, relative to it."""
        prefix = f"{folder}/"
        return {k[len(prefix) :]: e for k, e in self.files.items() if k.startswith(prefix)}

    def references(self, folder: str) -> bool:
        """Whether a file under `folder`/ is stored by another version."""
        return any(e.version is not None for e in self.part(folder).values())

    def stored_bytes(self) -> int:
        """What the version itself stores (sizes as recorded)."""
        return sum(e.size or 0 for e in self.files.values() if e.version is None)

    def as_json(self) -> dict[str, Any]:
        files = {}
        for rel, entry in sorted(self.files.items()):
            item: dict[str, Any] = {
                "sha256": entry.sha256,
                "size": entry.size,
                "version": entry.version,
            }
            if entry.path is not None:
                item["path"] = entry.path
            files[rel] = item
        return {"format": self.format, "model": self.model, "files": files}


def sha256_of(path: str | os.PathLike[str]) -> str:
    """sha256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """A version's manifest, either format; VersionFilesError when it cannot be read."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("format") == FORMAT:
            files = {
                str(rel): Entry(
                    sha256=str(item["sha256"]),
                    size=None if item.get("size") is None else int(item["size"]),
                    version=None if item.get("version") is None else int(item["version"]),
                    path=item.get("path"),
                )
                for rel, item in data["files"].items()
            }
            return Manifest(files=files, model=data.get("model"))
        if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
            # format 1: {bundle path: sha256}, every file stored by the version itself
            files = {f"{BUNDLE}/{rel}": Entry(sha256=sha) for rel, sha in data.items()}
            return Manifest(files=files, format=1)
        raise ValueError(f"not a manifest: {str(data)[:80]}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise VersionFilesError(f"cannot read the version manifest {path}: {exc}") from exc


def manifest_of(
    folders: Mapping[str, Path], known: Mapping[str, tuple[int, str]], *, model: str | None
) -> Manifest:
    """The manifest of the files in each of `folders` ({"bundle": its folder, "code": ...}):
    a file whose sha256 is in `known` ({sha256: (version, path)}: what earlier versions of
    `model` store) is referenced there, every other one is stored by this version."""
    files: dict[str, Entry] = {}
    for folder, base in folders.items():
        for path in sorted(p for p in Path(base).rglob("*") if p.is_file()):
            rel = f"{folder}/{path.relative_to(base).as_posix()}"
            sha = sha256_of(path)
            version, stored_as = known.get(sha, (None, None))
            files[rel] = Entry(
                sha256=sha,
                size=path.stat().st_size,
                version=version,
                path=stored_as if version is not None and stored_as != rel else None,
            )
    return Manifest(files=files, model=model)


def stored_folders(
    manifest: Manifest, folders: Mapping[str, Path], target: Path
) -> dict[str, Path]:
    """The files the version itself stores, linked from `folders` into `target`/<folder>/:
    {folder: its folder under target} for each folder that stores a file."""
    out: dict[str, Path] = {}
    for folder, base in folders.items():
        for rel, entry in manifest.part(folder).items():
            if entry.version is None:
                _link(Path(base) / rel, target / folder / rel)
                out[folder] = target / folder
    return out


def fill(
    target: Path,
    manifest: Manifest,
    folder: str,
    *,
    fetch: Fetch | None,
    own: Path | None = None,
) -> Path:
    """Put every file of `folder` (bundle or code) into `target`: the version's own files
    from `own` (hard-linked, else copied) unless already there, the others fetched from
    the versions that store them. Then `verify`. Returns `target`."""
    for rel, entry in manifest.part(folder).items():
        path = target / rel
        if path.exists():
            continue
        if entry.version is None:
            if own is not None and (own / rel).is_file():
                _link(own / rel, path)
            continue  # missing: verify names it
        if fetch is None:
            raise FetchError(f"{rel}: {entry.holder(manifest.model)}, and nothing fetches it")
        try:
            fetch(entry.version, entry.path or f"{folder}/{rel}", path)
        except FetchError as exc:
            raise FetchError(f"{rel}: {exc}") from exc
    verify(target, manifest, folder)
    return target


def verify(target: Path, manifest: Manifest, folder: str) -> None:
    """VersionFilesError unless `target` holds exactly the manifest's files of `folder`,
    byte for byte; each problem names the file and the version that stores it."""
    expected = manifest.part(folder)
    found = {p.relative_to(target).as_posix(): p for p in sorted(target.rglob("*")) if p.is_file()}
    problems = [
        f"{rel}: missing ({expected[rel].holder(manifest.model)})"
        for rel in sorted(expected.keys() - found.keys())
    ]
    problems += [f"{rel}: not in the manifest" for rel in sorted(found.keys() - expected.keys())]
    for rel in sorted(expected.keys() & found.keys()):
        entry, digest = expected[rel], sha256_of(found[rel])
        if digest != entry.sha256:
            problems.append(
                f"{rel}: sha256 {digest[:12]}… expected {entry.sha256[:12]}… "
                f"({entry.holder(manifest.model)})"
            )
    if problems:
        raise VersionFilesError(
            f"the files in {target} do not match the version's manifest (tampered with or "
            f"corrupted in the store): {'; '.join(problems)}"
        )


def registry_fetch(
    model: str,
    download: Callable[..., str],
    locate: Callable[[str, str], str] | None = None,
) -> Fetch:
    """A `Fetch` over an MLflow registry. `download`: ``mlflow.artifacts.download_artifacts``
    (or a partial of it with the store's URIs); `locate`: a client's
    ``get_model_version_download_uri`` (None: ``models:/<model>/<version>`` URIs, resolved
    against the process's registry)."""

    def fetch(version: int, path: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".qpr-fetch-", dir=target.parent) as tmp:
            try:
                root = locate(model, str(version)) if locate else f"models:/{model}/{version}"
                local = download(artifact_uri=f"{root.rstrip('/')}/artifacts/{path}", dst_path=tmp)
            # Whatever the store raised (no such version, no such file, no connection): the
            # caller hears which file of which version could not be read.
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise FetchError(
                    f"stored by version {version} of {model!r}, which cannot be read "
                    f"(deleted?): {first}"
                ) from exc
            os.replace(local, target)

    return fetch


def code_dir(model_dir: Path, manifest_path: Path, download: Callable[..., str]) -> Path:
    """The folder to put on sys.path for the qpr package a version was logged with: its
    own ``artifacts/code`` when it stores every file, else a temporary folder (removed at
    exit) with its files and those fetched from the versions that store them. Checked
    against the manifest either way: this is code that will run."""
    manifest = read_manifest(manifest_path)
    own = model_dir / "artifacts" / CODE
    if not manifest.references(CODE):
        verify(own, manifest, CODE)
        return own
    root = Path(tempfile.mkdtemp(prefix="qpr-code-"))
    atexit.register(shutil.rmtree, root, True)
    fetch = registry_fetch(str(manifest.model), download)
    return fill(root, manifest, CODE, fetch=fetch, own=own)


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(source, target)

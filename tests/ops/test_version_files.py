"""What a registry version stores and how its files are put back together, on plain
folders: each "version" is a folder of stored files, and the fetch reads from them as the
registry's would (qpr.ops.version_files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpr.ops.version_files import (
    BUNDLE,
    CODE,
    FetchError,
    VersionFilesError,
    code_dir,
    fill,
    manifest_of,
    read_manifest,
    registry_fetch,
    stored_folders,
    verify,
)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _store(versions: dict[int, Path]):
    """A fetch from {version: its artifacts folder}, as the registry's would be."""

    def fetch(version: int, path: str, target: Path) -> None:
        if version not in versions:
            raise FetchError(f"stored by version {version}, which cannot be read (deleted?)")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((versions[version] / path).read_bytes())

    return fetch


BASE = {"vocab.json": "vocab", "index/index.faiss": "index", "search.json": "search 1"}


@pytest.fixture
def two_versions(tmp_path: Path):
    """Version 1 stores BASE; version 2 changes search.json and adds a delta."""
    v1 = _write(tmp_path / "v1" / BUNDLE, BASE)
    first = manifest_of({BUNDLE: v1}, {}, model="m")
    known = {e.sha256: (1, rel) for rel, e in first.files.items()}
    v2 = _write(tmp_path / "v2-staged", {**BASE, "search.json": "search 2", "deltas/0001/a": "d"})
    second = manifest_of({BUNDLE: v2}, known, model="m")
    stored = stored_folders(second, {BUNDLE: v2}, tmp_path / "v2")
    return {1: tmp_path / "v1", 2: tmp_path / "v2"}, second, stored, v2


def test_a_version_stores_only_the_files_no_earlier_version_stores(two_versions) -> None:
    _, manifest, stored, _ = two_versions
    assert {rel: e.version for rel, e in manifest.part(BUNDLE).items()} == {
        "vocab.json": 1,
        "index/index.faiss": 1,
        "search.json": None,
        "deltas/0001/a": None,
    }
    assert _tree(stored[BUNDLE]) == {"deltas/0001/a": b"d", "search.json": b"search 2"}
    assert manifest.stored_bytes() == len("search 2") + len("d")
    assert manifest.references(BUNDLE) and not manifest.references(CODE)


def test_put_together_the_files_equal_the_staged_bundle(two_versions, tmp_path: Path) -> None:
    folders, manifest, stored, staged = two_versions
    out = fill(tmp_path / "out", manifest, BUNDLE, fetch=_store(folders), own=stored[BUNDLE])
    assert _tree(out) == _tree(staged)


def test_a_file_is_referenced_by_content_even_under_another_name(tmp_path: Path) -> None:
    v1 = _write(tmp_path / "v1" / BUNDLE, {"old/name.bin": "same bytes"})
    known = {
        e.sha256: (1, rel) for rel, e in manifest_of({BUNDLE: v1}, {}, model="m").files.items()
    }
    staged = _write(tmp_path / "staged", {"new/name.bin": "same bytes"})
    manifest = manifest_of({BUNDLE: staged}, known, model="m")
    entry = manifest.part(BUNDLE)["new/name.bin"]
    assert (entry.version, entry.path) == (1, "bundle/old/name.bin")
    out = fill(tmp_path / "out", manifest, BUNDLE, fetch=_store({1: tmp_path / "v1"}))
    assert (out / "new" / "name.bin").read_text() == "same bytes"


def test_a_changed_file_is_named_with_the_version_that_stores_it(two_versions, tmp_path) -> None:
    folders, manifest, stored, _ = two_versions
    (folders[1] / BUNDLE / "index" / "index.faiss").write_text("tampered", encoding="utf-8")
    with pytest.raises(VersionFilesError) as caught:
        fill(tmp_path / "out", manifest, BUNDLE, fetch=_store(folders), own=stored[BUNDLE])
    message = str(caught.value)
    assert "index/index.faiss: sha256" in message and "stored by version 1 of 'm'" in message


def test_missing_and_extra_files_are_named(two_versions, tmp_path: Path) -> None:
    folders, manifest, stored, _ = two_versions
    out = fill(tmp_path / "out", manifest, BUNDLE, fetch=_store(folders), own=stored[BUNDLE])
    (out / "search.json").unlink()
    (out / "extra.py").write_text("import os", encoding="utf-8")
    with pytest.raises(VersionFilesError) as caught:
        verify(out, manifest, BUNDLE)
    assert "search.json: missing (stored by this version)" in str(caught.value)
    assert "extra.py: not in the manifest" in str(caught.value)


def test_a_deleted_holder_is_a_fetch_error_naming_file_and_version(two_versions, tmp_path) -> None:
    folders, manifest, stored, _ = two_versions
    with pytest.raises(FetchError, match=r"index/index.faiss: stored by version 1.*deleted"):
        fill(tmp_path / "out", manifest, BUNDLE, fetch=_store({2: folders[2]}), own=stored[BUNDLE])


def test_the_registry_fetch_names_the_version_it_could_not_read(tmp_path: Path) -> None:
    def download(artifact_uri: str, dst_path: str) -> str:
        raise RuntimeError("RESOURCE_DOES_NOT_EXIST: Model Version (name=m, version=1) not found")

    fetch = registry_fetch("m", download)
    with pytest.raises(FetchError, match=r"version 1 of 'm', which cannot be read.*not found"):
        fetch(1, "bundle/vocab.json", tmp_path / "vocab.json")

    def found(artifact_uri: str, dst_path: str) -> str:
        assert artifact_uri == "models:/m/3/artifacts/bundle/vocab.json"
        return str(_write(Path(dst_path), {"vocab.json": "v"}) / "vocab.json")

    registry_fetch("m", found)(3, "bundle/vocab.json", tmp_path / "x" / "vocab.json")
    assert (tmp_path / "x" / "vocab.json").read_text() == "v"
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["vocab.json"]  # no scratch left


def test_a_manifest_of_before_is_every_bundle_file_stored_by_its_version(tmp_path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"vocab.json": "a" * 64, "index/index.faiss": "b" * 64}))
    manifest = read_manifest(path)
    assert manifest.format == 1 and not manifest.references(BUNDLE)
    assert manifest.part(BUNDLE)["index/index.faiss"].sha256 == "b" * 64
    path.write_text("[1, 2]")
    with pytest.raises(VersionFilesError, match="cannot read"):
        read_manifest(path)


def test_code_a_version_stores_is_used_where_it_lies_and_checked(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    code = _write(model_dir / "artifacts" / CODE, {"qpr/__init__.py": "x = 1"})
    manifest = manifest_of({CODE: code}, {}, model="m")
    manifest_path = model_dir / "artifacts" / "manifest.json"
    manifest_path.write_text(json.dumps(manifest.as_json()), encoding="utf-8")

    def no_download(**_: object) -> str:
        raise AssertionError("nothing to fetch")

    assert code_dir(model_dir, manifest_path, no_download) == code
    (code / "qpr" / "__init__.py").write_text("import os; os.system('x')", encoding="utf-8")
    with pytest.raises(VersionFilesError, match=r"qpr/__init__.py: sha256"):
        code_dir(model_dir, manifest_path, no_download)

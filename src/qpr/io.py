"""Files the project writes and keys it computes, in one place.

- Atomic writes: a reader, or a crash, sees the old file or the new one, never half of one.
  Everything goes through a synced temp file in the same directory and `os.replace`.
- Digests: sha256 of files and of text sequences, the keys of every cache.
- `VectorCache`: float32 matrices on disk, keyed by a digest of what made them (the
  encoder's files, the tokenizer, the texts). The index stage, hard-negative mining and
  the teacher prior keep their vectors in one each.

Imports nothing else of `qpr`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

PathLike = str | os.PathLike[str]


def fsync_dir(path: PathLike) -> None:
    """Make a rename inside `path` durable (a rename is durable once its directory is)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temp path beside `path` to write to; renamed onto `path` when the block ends
    without error, removed otherwise. For writers that want a file name (FAISS, ONNX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: PathLike, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call `write(handle)` on a temp file beside `path`, fsync it, rename it onto `path`."""
    path = Path(path)
    with atomic_path(path) as tmp, tmp.open("wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def write_bytes_atomic(path: PathLike, data: bytes) -> Path:
    return write_atomic(path, lambda handle: handle.write(data))


def write_text_atomic(path: PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def json_text(payload: Any) -> str:
    """The project's JSON files: sorted keys, indent 2, a final newline (stable bytes)."""
    return json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"


def write_json_atomic(path: PathLike, payload: Any) -> Path:
    return write_text_atomic(path, json_text(payload))


def save_numpy_atomic(path: PathLike, array: np.ndarray) -> Path:
    return write_atomic(path, lambda handle: np.save(handle, array))


def file_sha256(path: PathLike) -> str:
    """sha256 hex digest of a file's bytes, read in blocks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def texts_digest(texts: Iterable[str]) -> str:
    """sha256 of the texts in order (a separator byte after each)."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def digest(*parts: object) -> str:
    """One key from several parts: a Path counts by its file's bytes, a str or a number by
    its text, a list or tuple of str by texts_digest. 32 hex characters."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(file_sha256(part).encode())
        elif isinstance(part, list | tuple):
            h.update(texts_digest(part).encode())
        else:
            h.update(str(part).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()[:32]


class VectorCache:
    """float32 [N, D] matrices in `directory`, one `KEY.npy` (+ `KEY.json`: how they were
    made) per key. `keep_one` drops every other key when a new one is stored, for a cache
    that only ever needs its latest entry (the index stage's last encoding)."""

    def __init__(self, directory: PathLike, *, keep_one: bool = False) -> None:
        self.directory = Path(directory)
        self.keep_one = keep_one

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.npy"

    def get(self, key: str, *, mmap: bool = False) -> tuple[np.ndarray, dict[str, Any]] | None:
        """(vectors, info) stored under `key`, else None."""
        vectors = self.path(key)
        if not vectors.is_file():
            return None
        info_file = vectors.with_suffix(".json")
        info = json.loads(info_file.read_text("utf-8")) if info_file.is_file() else {}
        return np.load(vectors, mmap_mode="r" if mmap else None), info

    def put(self, key: str, vectors: np.ndarray, info: Mapping[str, Any] | None = None) -> Path:
        """Store `vectors` under `key` (atomically; the info file first, so a stored matrix
        always has its info)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.keep_one:
            for old in self.directory.iterdir():
                if old.is_file() and old.stem != key and not old.name.startswith("."):
                    old.unlink()
        if info is not None:
            write_json_atomic(self.path(key).with_suffix(".json"), dict(info))
        return save_numpy_atomic(self.path(key), np.asarray(vectors))

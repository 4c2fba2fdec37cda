"""Files the project writes and keys it computes, in one place.

- Atomic writes: a reader, or a crash, sees the old file or the new one, never half of one.
  Everything goes through a synced temp file in the same directory and `os.replace`.
- Directory swaps: `replace_dir` puts a finished folder in place of the old one; a kill
  at any step leaves the old folder or the new one (`recover_dir` puts an old one back).
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
import shutil
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


def _read_umask() -> int:
    # Read once at import: os.umask can only be read by setting it, which would race with
    # files other threads create.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temp path beside `path` to write to; renamed onto `path` when the block ends
    without error, removed otherwise. For writers that want a file name (FAISS, ONNX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    # mkstemp makes the file 0600; give it the mode a plain open() would (0666 less the
    # umask), so a service running as another user can still read what the pipeline wrote.
    os.fchmod(fd, 0o666 & ~_UMASK)
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


def _aside(final: Path) -> Path:
    """Where `replace_dir` keeps the old folder while the new one moves in."""
    return final.with_name(f".{final.name}.old")


def _trash(final: Path) -> Path:
    """Where the old folder goes once the new one is in: removed, never restored."""
    return final.with_name(f".{final.name}.trash")


def recover_dir(final: PathLike) -> Path:
    """Undo what a killed `replace_dir` left: the old folder renamed back when `final` is
    missing and the old one was moved aside, and the old one's remains removed once the
    new one is in. Returns `final` (which may not exist: there was nothing to swap)."""
    final = Path(final)
    aside = _aside(final)
    if aside.is_dir():
        if final.exists():  # killed after the new folder moved in: the old one is done
            os.replace(aside, _trash(final))
        else:  # killed between the two renames: the old folder is the only whole one
            os.replace(aside, final)
        fsync_dir(final.parent)
    shutil.rmtree(_trash(final), ignore_errors=True)
    return final


def replace_dir(new: PathLike, final: PathLike) -> Path:
    """Put the finished folder `new` where `final` is, by renames on one file system: the
    old folder moved aside, `new` renamed to `final`, the old one removed. A kill at any
    step leaves `final` old and whole or new and whole, or `final` missing and the old
    folder aside, which the next call (or `recover_dir`) renames back. `new` must be on
    `final`'s file system (a rename cannot cross them): beside it, usually. Returns `final`."""
    new, final = Path(new), Path(final)
    if not new.is_dir():
        raise FileNotFoundError(f"{new} is not a folder: nothing to put in place of {final}")
    recover_dir(final)
    if final.exists():
        os.replace(final, _aside(final))
        fsync_dir(final.parent)
    os.replace(new, final)
    fsync_dir(final.parent)
    # Renamed to the trash before removal: a half-removed folder never looks like an
    # old one to put back.
    if _aside(final).is_dir():
        os.replace(_aside(final), _trash(final))
    shutil.rmtree(_trash(final), ignore_errors=True)
    return final


def file_sha256(path: PathLike) -> str:
    """sha256 hex digest of a file's bytes, read in blocks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def text_sha256(text: str) -> str:
    """sha256 hex digest of one text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def json_sha256(payload: Any) -> str:
    """sha256 of a JSON value in canonical form (sorted keys, no spaces, UTF-8 as is): the
    checksum a tokenizer file carries, equal however the file was indented."""
    return text_sha256(
        json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    )


def texts_digest(texts: Iterable[str]) -> str:
    """sha256 of the texts in order (a separator byte after each)."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def module_parts(module: Any) -> list[object]:
    """A torch module's weights as `digest` parts: each state-dict entry's name, then its
    values (numpy, on the CPU). Two modules give the same parts when their weights match
    bit for bit."""
    return [
        part
        for name, tensor in module.state_dict().items()
        for part in (name, tensor.detach().cpu().contiguous().numpy())
    ]


def digest(*parts: object) -> str:
    """One key from several parts: a Path counts by its file's bytes, a str or a number by
    its text, a list or tuple of str by texts_digest, a numpy array by its bytes. 32 hex
    characters."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(file_sha256(part).encode())
        elif isinstance(part, list | tuple):
            h.update(texts_digest(part).encode())
        elif isinstance(part, np.ndarray):
            h.update(np.ascontiguousarray(part).data)
        else:
            h.update(str(part).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()[:32]


# Keys of wall-clock figures. They differ on every run, so a file DVC hashes must not hold
# them: dvc.lock would change on every `dvc repro` and a fresh clone's `make run` would leave
# `git status` dirty. They go to metrics/timings/ (and MLflow), which DVC does not track.
TIMING_SUFFIXES = ("seconds", "_per_s", "_ms")


def split_timings(metrics: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the metrics without wall-clock figures, the wall-clock figures), nesting kept."""
    stable: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            inner_stable, inner_timings = split_timings(value)
            stable[key] = inner_stable
            if inner_timings:
                timings[key] = inner_timings
        elif is_timing(key):
            timings[key] = value
        else:
            stable[key] = value
    return stable, timings


def join_timings(stable: Mapping[str, Any], timings: Mapping[str, Any]) -> dict[str, Any]:
    """split_timings undone: the metrics with their wall-clock figures put back."""
    joined = dict(stable)
    for key, value in timings.items():
        inner = joined.get(key, {})
        joined[key] = join_timings(inner, value) if isinstance(value, Mapping) else value
    return joined


def is_timing(key: str) -> bool:
    """Whether a metric or column name holds a wall-clock figure."""
    return key.endswith(TIMING_SUFFIXES)


class VectorCache:
    """float32 [N, D] matrices in `directory`, one `KEY.npy` (+ `KEY.json`: how they were
    made) per key. `keep_one` drops every other key when a new one is stored, for a cache
    that only ever needs its latest entry (hard-negative mining's last encoding); `keep`
    drops all but a set of keys (the index stage's last encoding, one key a shard)."""

    def __init__(self, directory: PathLike, *, keep_one: bool = False) -> None:
        self.directory = Path(directory)
        self.keep_one = keep_one

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.npy"

    def has(self, key: str) -> bool:
        """Whether vectors are stored under `key`."""
        return self.path(key).is_file()

    def info(self, key: str) -> dict[str, Any]:
        """How the vectors under `key` were made ({} when nothing says)."""
        info_file = self.path(key).with_suffix(".json")
        return json.loads(info_file.read_text("utf-8")) if info_file.is_file() else {}

    def get(self, key: str, *, mmap: bool = False) -> tuple[np.ndarray, dict[str, Any]] | None:
        """(vectors, info) stored under `key`, else None."""
        if not self.has(key):
            return None
        return np.load(self.path(key), mmap_mode="r" if mmap else None), self.info(key)

    def put(self, key: str, vectors: np.ndarray, info: Mapping[str, Any] | None = None) -> Path:
        """Store `vectors` under `key` (atomically; the info file first, so a stored matrix
        always has its info)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.keep_one:
            self.keep([key])
        if info is not None:
            self.describe(key, info)
        return save_numpy_atomic(self.path(key), np.asarray(vectors))

    def describe(self, key: str, info: Mapping[str, Any]) -> Path:
        """Record how the vectors under `key` were made (atomically; replaces the info)."""
        return write_json_atomic(self.path(key).with_suffix(".json"), dict(info))

    def keep(self, keys: Iterable[str]) -> None:
        """Remove the vectors and info of every key but `keys` (temp files left alone)."""
        wanted = set(keys)
        if not self.directory.is_dir():
            return
        for old in self.directory.iterdir():
            if old.is_file() and old.stem not in wanted and not old.name.startswith("."):
                old.unlink()

"""The deltas on disk: the manifest, a delta folder's files, and what a load or a full
build makes of them (the layout: `qpr.deltas`; the file names: `qpr.artifacts`).

What the bundle loader (`qpr.retrieval.bundle`) and the index stage need, and nothing
above it: no framework, no torch, no import of the bundle or of ops/.

The manifest is written in one place only, `manifest_update`: every add, delete, drop and
compaction runs inside it.

A delta that fails its check (a file missing, altered or unreadable, rows that disagree,
vectors of another width or not finite) fails alone: a load serves the main index and the
other deltas without it, and names it (`Parts.failed`, `check_deltas`). Writers other
than `drop` refuse to build on it (`require_sound`).

Arrays: float32 vectors [N, D], int64 question ids [N], bool dead mask [N].
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pandas as pd

from qpr.artifacts import (
    ABSORBED_FILE,
    ANSWER_ID,
    DELTA_BM25_FILE,
    DELTA_FILES,
    DELTA_IDS_FILE,
    DELTA_QUESTIONS_FILE,
    DELTA_VECTORS_FILE,
    DELTAS_DIR,
    DELTAS_MANIFEST_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
)
from qpr.deltas.lock import holds_lock, writer_lock
from qpr.io import file_sha256, fsync_dir, json_sha256, replace_dir, write_json_atomic
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.dense import stored_dim

__all__ = [
    "FORMAT",
    "QUESTION_COLUMNS",
    "DeltaError",
    "Manifest",
    "Parts",
    "absorbed_version",
    "check_deltas",
    "dead_rows",
    "delta_dir",
    "delta_files",
    "delta_sha256",
    "ensure_manifest",
    "for_full_build",
    "live_questions",
    "load_parts",
    "main_questions",
    "manifest_update",
    "merge_bm25",
    "read_manifest",
    "require_sound",
    "write_absorbed",
    "write_delta",
]

FORMAT = "qpr-deltas/1"
# A delta's question table: these columns, in this order.
QUESTION_COLUMNS = ["question_id", "text", "cluster_id", ANSWER_ID]


class DeltaError(ValueError):
    """A delta or the manifest is unreadable or does not belong to this bundle."""


@dataclass
class Manifest:
    """deltas.json. deltas: [{"number", "version", "rows", "sha256", "sources", "tokens",
    "unknown_tokens", "unknown_terms"}], tombstones: [[question_id, version]], dropped:
    the entries `drop_delta` removed (with "dropped_at_version" and "reason"), whose
    sources are never added again."""

    version: int = 0
    deltas: list[dict[str, Any]] = field(default_factory=list)
    tombstones: list[list[int]] = field(default_factory=list)
    main_avgdl: dict[str, Any] | None = None
    dropped: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "deltas": self.deltas,
            "tombstones": self.tombstones,
            "main_avgdl": self.main_avgdl,
            "dropped": self.dropped,
        }

    def pending(self, absorbed: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
        """The deltas and tombstones newer than what the main index holds (`absorbed`)."""
        return (
            [d for d in self.deltas if int(d["version"]) > absorbed],
            [t for t in self.tombstones if int(t[1]) > absorbed],
        )

    @property
    def sha256(self) -> str:
        """What /version and the registry can quote: changes with every add and delete."""
        return json_sha256(self.as_dict())


def read_manifest(models_dir: str | os.PathLike[str]) -> Manifest:
    """The manifest, or an empty one (no deltas yet). DeltaError for an unreadable one."""
    path = Path(models_dir) / DELTAS_MANIFEST_FILE
    if not path.is_file():
        return Manifest()
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT:
            raise DeltaError(f"{path}: format {raw.get('format')!r}, expected {FORMAT!r}")
        manifest = Manifest(
            int(raw["version"]),
            list(raw["deltas"]),
            list(raw["tombstones"]),
            raw["main_avgdl"],
            list(raw.get("dropped", [])),
        )
        _check_entries(manifest)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DeltaError(f"{path}: not a readable deltas manifest ({exc})") from exc
    return manifest


def _check_entries(manifest: Manifest) -> None:
    """KeyError, TypeError or ValueError unless every delta entry has the integer number,
    version and rows and the sha256 a load reads, and every tombstone is [id, version]:
    a manifest edited by hand fails here, once, not in each reader."""
    for delta in manifest.deltas:
        if not isinstance(delta["sha256"], str):
            raise TypeError(f"delta {delta.get('number')!r}: sha256 is not a string")
        for key in ("number", "version", "rows"):
            int(delta[key])
    for stone in manifest.tombstones:
        if len(stone) != 2:
            raise ValueError(f"tombstone {stone!r} is not [question_id, version]")
        for value in stone:
            int(value)


@contextmanager
def manifest_update(
    models_dir: str | os.PathLike[str], *, create: bool = False, wait: float | None = None
) -> Iterator[Manifest]:
    """The one way a bundle's deltas change: the manifest as it is now, for the block to
    change in place. When the block ends without an error and the manifest changed (or,
    with `create`, there is none yet), the new one is written atomically: the commit
    point. An error in the block writes nothing, so the served state stays as it was.

    Every add, delete, drop and compaction runs inside one, and so does the first build's
    empty manifest. The block holds the models folder's writer lock (`qpr.deltas.lock`)
    from the read to the write: WriterBusy when another writer holds it past `wait`
    seconds (None: QPR_WRITER_WAIT_SECONDS, default 60)."""
    root = Path(models_dir)
    path = root / DELTAS_MANIFEST_FILE
    with writer_lock(root, wait=wait):
        manifest = read_manifest(root)
        before = manifest.sha256
        yield manifest
        if manifest.sha256 != before or (create and not path.is_file()):
            write_json_atomic(path, manifest.as_dict())  # the commit point


def ensure_manifest(models_dir: str | os.PathLike[str]) -> Path:
    """The manifest's path; an empty manifest is written when there is none (the index
    stage's DVC output must exist, and an empty one hashes the same on every machine)."""
    path = Path(models_dir) / DELTAS_MANIFEST_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with manifest_update(models_dir, create=True):
            pass
    return path


def absorbed_version(models_dir: str | os.PathLike[str]) -> int:
    """The manifest version the main index already holds (0 without index/absorbed.json)."""
    path = Path(models_dir) / ABSORBED_FILE
    if not path.is_file():
        return 0
    try:
        return int(json.loads(path.read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DeltaError(f"{path}: unreadable ({exc})") from exc


def write_absorbed(index_dir: Path, version: int) -> None:
    """Record in a (staged) main index folder the manifest version its questions hold."""
    write_json_atomic(Path(index_dir) / ABSORBED_FILE.name, {"version": int(version)})


def delta_dir(number: int) -> Path:
    """Delta `number`'s folder, relative to the models directory."""
    return DELTAS_DIR / f"{number:04d}"


def delta_files(models_dir: Path) -> list[Path]:
    """index/absorbed.json, the manifest and every file of the deltas a load reads,
    relative to `models_dir` (only what exists): what the fingerprint hashes and the
    registry stores. Absorbed deltas are left out: the main index holds their questions."""
    root = Path(models_dir)
    out = [ABSORBED_FILE] if (root / ABSORBED_FILE).is_file() else []
    if not (root / DELTAS_MANIFEST_FILE).is_file():
        return out
    pending, _ = read_manifest(root).pending(absorbed_version(root))
    out.append(DELTAS_MANIFEST_FILE)
    for delta in pending:
        files = [delta_dir(int(delta["number"])) / name for name in DELTA_FILES]
        # A missing file fails that delta's check (`load_parts`), not the listing.
        out += [rel for rel in files if (root / rel).is_file()]
    return out


def delta_sha256(folder: Path) -> str:
    """sha256 over one delta folder's files: what its manifest entry records."""
    return json_sha256({name.as_posix(): file_sha256(folder / name) for name in DELTA_FILES})


def write_delta(
    root: Path,
    number: int,
    vectors: np.ndarray,
    frame: pd.DataFrame,
    postings: dict[str, np.ndarray],
) -> Path:
    """deltas/<number>/ written in a hidden temporary folder, fsynced, then renamed.
    vectors float32 [n, D]; frame: QUESTION_COLUMNS in row order; postings: term, row,
    weight (`qpr.deltas.add.delta_postings`). Only under the writer lock (inside
    `manifest_update`): RuntimeError otherwise."""
    if not holds_lock(root):
        raise RuntimeError(f"write_delta without the writer lock of {root}")
    parent = root / DELTAS_DIR
    parent.mkdir(parents=True, exist_ok=True)
    # What a killed add left behind. Safe to remove: every writer holds the lock, so no
    # other writer has a temporary folder here now.
    for stale in parent.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    target = root / delta_dir(number)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))
    flat = faiss.IndexFlatL2(vectors.shape[1])
    flat.add(vectors)
    faiss.write_index(flat, str(tmp / DELTA_VECTORS_FILE))
    np.save(tmp / DELTA_IDS_FILE, frame["question_id"].to_numpy(np.int64))
    frame.to_parquet(tmp / DELTA_QUESTIONS_FILE, index=False)
    np.savez(tmp / DELTA_BM25_FILE, **postings)
    for name in DELTA_FILES:
        with open(tmp / name, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(tmp)
    # An earlier add may have renamed a folder there and died before its manifest: the
    # manifest never named it, so it is replaced.
    return replace_dir(tmp, target)


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class Parts:
    """Main + deltas as one set of rows (main rows first, then each delta's).
    dead: bool [N], rows hidden by a tombstone; qids of dead rows are replaced by unique
    negative ids (-2 - row) so that an id map of the live ones stays one-to-one.
    failed: {delta number: why it failed its check}, the deltas left out."""

    index: faiss.Index
    qids: np.ndarray
    texts: list[str]
    cluster_ids: np.ndarray
    answer_ids: list[str | None] | None
    bm25: BM25Index | None
    dead: np.ndarray
    manifest_sha256: str | None
    failed: dict[int, str] = field(default_factory=dict)


def load_parts(
    models_dir: Path,
    index: faiss.Index,
    qids: np.ndarray,
    texts: list[str],
    cluster_ids: np.ndarray,
    answer_ids: list[str | None] | None,
    bm25: BM25Index | None,
) -> Parts:
    """The main parts extended by the manifest's deltas (the index in place: it must be a
    private, freshly loaded copy). A delta that fails its check (`check_deltas`) is left
    out with the tombstones its add wrote, as `drop` would lift them, and named in
    `Parts.failed`. DeltaError for an unreadable manifest, or an id live twice."""
    root = Path(models_dir)
    manifest = read_manifest(root)
    pending, tombstones = manifest.pending(absorbed_version(root))
    qids = np.asarray(qids, np.int64)
    versions = [np.zeros(qids.size, np.int64)]
    all_qids, all_clusters = [qids], [np.asarray(cluster_ids, np.int64)]
    texts, answers = list(texts), list(answer_ids or [None] * qids.size)
    postings, failed = [], {}
    for delta in pending:
        try:
            vectors, frame, weights = _read_delta(root, delta, index.d)
        except DeltaError as exc:
            failed[int(delta["number"])] = str(exc)
            continue
        index.add(vectors)
        versions.append(np.full(len(frame), int(delta["version"]), np.int64))
        all_qids.append(frame["question_id"].to_numpy(np.int64))
        all_clusters.append(frame["cluster_id"].to_numpy(np.int64))
        texts += frame["text"].tolist()
        # A question list has no answers: pandas reads its nulls back as NaN.
        answers += [a if isinstance(a, str) else None for a in frame[ANSWER_ID].tolist()]
        postings.append({**weights, "docs": np.int64(len(frame))})
    # One version is one add: the tombstones at a failed delta's version are its own.
    left_out = {int(d["version"]) for d in pending if int(d["number"]) in failed}
    applied = [t for t in tombstones if int(t[1]) not in left_out]
    merged_qids = np.concatenate(all_qids)
    dead = dead_rows(merged_qids, np.concatenate(versions), applied)
    if bm25 is not None and postings:
        bm25 = merge_bm25(bm25, postings)
    shown = np.where(dead, -2 - np.arange(merged_qids.size, dtype=np.int64), merged_qids)
    if np.unique(shown[~dead]).size != int((~dead).sum()):
        raise DeltaError(f"{root / DELTAS_MANIFEST_FILE}: a question id is live twice")
    return Parts(
        index,
        shown,
        texts,
        np.concatenate(all_clusters),
        answers if answer_ids is not None or postings else answer_ids,
        bm25,
        dead,
        manifest.sha256 if pending or tombstones else None,
        failed,
    )


def check_deltas(models_dir: str | os.PathLike[str]) -> dict[int, str]:
    """{delta number: why it fails its check} over the deltas a load adds (those the main
    index does not hold yet); empty when all pass. The check is the one a load makes: every
    file present and as the manifest's sha256 records, readable, of the main index's width
    (read from its header), rows agreeing with the manifest and each other, vectors finite.
    DeltaError for an unreadable manifest."""
    root = Path(models_dir)
    pending, _ = read_manifest(root).pending(absorbed_version(root))
    dim = stored_dim(root / INDEX_FILE) if pending else None
    failed = {}
    for delta in pending:
        try:
            _read_delta(root, delta, dim)
        except DeltaError as exc:
            failed[int(delta["number"])] = str(exc)
    return failed


def require_sound(models_dir: str | os.PathLike[str]) -> None:
    """DeltaError, one line naming each delta that fails its check and how to remove it,
    unless all pass (`check_deltas`). Every writer but `drop` calls it before it writes:
    an add on top of a broken delta would hide the breakage behind a newer version."""
    failed = check_deltas(models_dir)
    if not failed:
        return
    numbers = sorted(failed)
    reasons = "; ".join(failed[n] for n in numbers)
    drops = " and ".join(f"`qpr index drop {n}`" for n in numbers)
    if len(numbers) == 1:
        which, fix = f"delta {numbers[0]} fails its check", f"remove it with {drops}"
    else:
        which = f"deltas {', '.join(map(str, numbers))} fail their check"
        fix = f"remove them with {drops}"
    raise DeltaError(
        f"{which} ({reasons}): nothing written; {fix} (or restore the files), then try again"
    )


def dead_rows(
    qids: np.ndarray, versions: np.ndarray, tombstones: Sequence[Sequence[int]]
) -> np.ndarray:
    """bool [N]: row r is dead when a tombstone (qids[r], v) has v > versions[r].
    qids int64 [N], versions int64 [N] (0: the main index)."""
    dead = np.zeros(qids.size, bool)
    if not len(tombstones):
        return dead
    stones = np.asarray(tombstones, np.int64).reshape(-1, 2)
    # The newest tombstone of each id decides: it is the largest version.
    order = np.lexsort((stones[:, 1], stones[:, 0]))
    ids, last = stones[order, 0], stones[order, 1]
    newest = np.r_[ids[1:] != ids[:-1], True]
    ids, last = ids[newest], last[newest]
    pos = np.clip(np.searchsorted(ids, qids), 0, ids.size - 1)
    return (ids[pos] == qids) & (last[pos] > versions)


def _read_delta(
    root: Path, delta: dict[str, Any], dim: int | None
) -> tuple[np.ndarray, pd.DataFrame, dict[str, np.ndarray]]:
    """(vectors float32 [n, D], questions in row order, BM25 postings) of one delta, or
    DeltaError saying why it fails its check (its folder named relative to `root`).
    dim: the main index's width; None: not checked."""
    rel = delta_dir(int(delta["number"])).as_posix()
    folder = root / rel
    missing = [name.as_posix() for name in DELTA_FILES if not (folder / name).is_file()]
    if missing:
        raise DeltaError(f"{rel}: {', '.join(missing)} missing")
    try:
        altered = delta_sha256(folder) != delta["sha256"]
    except OSError as exc:
        raise DeltaError(f"{rel}: unreadable ({exc.strerror or exc})") from exc
    if altered:
        raise DeltaError(f"{rel}: its files differ from the sha256 the manifest records")
    try:
        flat = faiss.read_index(str(folder / DELTA_VECTORS_FILE))
        vectors = flat.reconstruct_n(0, flat.ntotal) if flat.ntotal else np.zeros((0, flat.d))
        ids = np.load(folder / DELTA_IDS_FILE, allow_pickle=False).astype(np.int64)
        frame = pd.read_parquet(folder / DELTA_QUESTIONS_FILE)
        with np.load(folder / DELTA_BM25_FILE, allow_pickle=False) as data:
            weights = {name: data[name] for name in ("term", "row", "weight")}
    except Exception as exc:  # each reader has its own errors (faiss, arrow, zipfile)
        said = " ".join(str(exc).split())  # one line: it is shown in a table and a log
        raise DeltaError(f"{rel}: unreadable ({type(exc).__name__}: {said})") from exc
    absent = [c for c in QUESTION_COLUMNS if c not in frame.columns]
    if absent:
        raise DeltaError(f"{rel}: {DELTA_QUESTIONS_FILE} has no column {', '.join(absent)}")
    if dim is not None and flat.d != dim:
        raise DeltaError(f"{rel}: {flat.d}-d vectors, the main index holds {dim}-d")
    counts = {len(ids), len(frame), int(flat.ntotal)}
    if counts != {int(delta["rows"])}:
        raise DeltaError(
            f"{rel}: its files hold {sorted(counts)} questions, the manifest records "
            f"{delta['rows']}"
        )
    if not np.array_equal(frame["question_id"].to_numpy(np.int64), ids):
        raise DeltaError(f"{rel}: {DELTA_QUESTIONS_FILE} is not in the order of {DELTA_IDS_FILE}")
    if not np.isfinite(vectors).all():
        raise DeltaError(f"{rel}: {DELTA_VECTORS_FILE} holds non-finite vectors")
    return np.ascontiguousarray(vectors, np.float32), frame, weights


def merge_bm25(main: BM25Index, deltas: Sequence[dict[str, np.ndarray]]) -> BM25Index:
    """The main BM25 index with the deltas' postings appended (rows after main's, delta
    by delta). Each delta's postings: term int32 [nnz] (main term ids), row int32 [nnz]
    (local), weight float32 [nnz]; docs: its number of questions."""
    vocabulary = len(main.terms)
    terms = [np.repeat(np.arange(vocabulary, dtype=np.int64), np.diff(main.indptr))]
    rows, weights, offset = [main.rows.astype(np.int64)], [main.weights], main.num_docs
    for part in deltas:
        terms.append(part["term"].astype(np.int64))
        rows.append(part["row"].astype(np.int64) + offset)
        weights.append(part["weight"].astype(np.float32))
        offset += int(part["docs"])
    term = np.concatenate(terms)
    # Rows ascend within main and within each delta, deltas after main: a stable sort by
    # term keeps every posting list ascending by row.
    order = np.argsort(term, kind="stable")
    indptr = np.zeros(vocabulary + 1, np.int64)
    np.cumsum(np.bincount(term, minlength=vocabulary), out=indptr[1:])
    return BM25Index(
        main.terms,
        indptr,
        np.concatenate(rows)[order].astype(np.int32),
        np.concatenate(weights)[order],
        offset,
        main.k1,
        main.b,
        main.stemmer,
        main.analyzer,
        main.ngram,
    )


# ---------------------------------------------------------------- the questions served


def live_questions(models_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Every question a search can return now: the main index's and the deltas', less the
    tombstoned rows. Columns question_id int64, text, cluster_id int64, answer_id, version
    int64 (0: main), in row order."""
    root = Path(models_dir)
    pending, tombstones = read_manifest(root).pending(absorbed_version(root))
    return _live(main_questions(root), root, pending, tombstones)


def _live(
    main: pd.DataFrame,
    root: Path,
    entries: Sequence[dict[str, Any]],
    tombstones: Sequence[Sequence[int]],
) -> pd.DataFrame:
    """`main` (version 0) and the `entries`' questions, less the rows `tombstones` hide."""
    frames = [main.assign(version=0)]
    for delta in entries:
        folder = root / delta_dir(int(delta["number"]))
        try:
            frame = pd.read_parquet(folder / DELTA_QUESTIONS_FILE)
        except (OSError, ValueError) as exc:
            raise DeltaError(f"{folder}: unreadable delta ({exc})") from exc
        frames.append(frame.assign(version=int(delta["version"])))
    both = pd.concat(frames, ignore_index=True)
    dead = dead_rows(
        both["question_id"].to_numpy(np.int64), both["version"].to_numpy(np.int64), tombstones
    )
    return both[~dead].reset_index(drop=True)


def for_full_build(models_dir: Path, questions: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """What a full build indexes: the cluster stage's `questions` (question_id, text, any
    other columns) and every delta's, absorbed or not, less the tombstoned rows; an id in
    both keeps the cluster stage's row. Returns them and the manifest version they hold
    (0 and `questions` unchanged without a manifest)."""
    root = Path(models_dir)
    if not (root / DELTAS_MANIFEST_FILE).is_file():
        return questions, 0
    manifest = read_manifest(root)
    if not manifest.deltas and not manifest.tombstones:
        return questions, manifest.version
    live = _live(questions, root, manifest.deltas, manifest.tombstones)
    live = live.drop_duplicates("question_id", keep="first").drop(columns="version")
    return live.reset_index(drop=True), manifest.version


def main_questions(root: Path) -> pd.DataFrame:
    """The main index's questions in row order (the parquet may be in any order):
    QUESTION_COLUMNS and the string metadata a search filters on."""
    ids = np.load(root / IDS_FILE, allow_pickle=False).astype(np.int64)
    table = pd.read_parquet(root / QUESTIONS_FILE).set_index("question_id")
    frame = table.loc[ids].reset_index()
    if ANSWER_ID not in frame.columns:
        frame[ANSWER_ID] = None
    frame["cluster_id"] = frame["cluster_id"].fillna(-1).astype(np.int64)
    # The metadata a search filters on (`qpr.retrieval.selection`) survives compaction.
    metadata = [
        c
        for c in frame.columns
        if c not in QUESTION_COLUMNS and pd.api.types.is_string_dtype(frame[c])
    ]
    return frame[[*QUESTION_COLUMNS, *metadata]]

"""Fresh questions without retraining: index deltas, tombstones and their compaction.

A bundle's main index (models/index/) is written by the index stage. Beside it, in a
folder of its own (the index stage's persisted DVC output, so `dvc repro` never wipes it):

    deltas/deltas.json           the manifest: version counter, each delta, the tombstones
    deltas/<NNNN>/               one delta: vectors.faiss (exact Flat), ids.npy,
                                 questions.parquet, bm25.npz
    index/absorbed.json          the manifest version the main index already holds

The manifest is the single commit point. A delta is written to a temporary folder,
fsynced, renamed to deltas/<NNNN>, and only then named in a new manifest (written
atomically). A crash before that rename or that manifest leaves the served state as it was:
a folder the manifest does not name is never read (and is removed by the next `add`).

Versions: every `add`, `delete` and `drop` raises the counter by one. A delta carries the
version it was added at (the main index is version 0). A tombstone (question id, version v)
hides that id's rows in every part older than v. So a changed answer is one `add` of the
same id: its delta writes the tombstone that hides the old row. A deleted id comes back
only when a later delta adds it again.

Absorption: a full build (the index stage) and `compact` index the live questions of the
main set and of every delta, and record the manifest version they hold (absorbed.json).
Loading skips the deltas and tombstones at or below it. The manifest keeps them: the next
full build starts again from the cluster stage's questions and needs them once more.

BM25: a delta's weights use the main index's statistics (N, each term's df, the mean
length avgdl), frozen at the main build. Its words unknown to the main vocabulary score
nothing until compaction; each delta records how many of its word tokens that drops
(`unknown_tokens` / `tokens`). Compaction recomputes every statistic over all questions.

Loading (`load_parts`): the delta vectors are added to the loaded, in-memory copy of the
main index and the delta postings appended to the main BM25 postings, so one search sees
every row (the files on disk never change). Tombstoned rows are a row mask applied inside
the dense search and BM25, as a filter is (`Bundle`).

Arrays: float32 vectors [N, D], int64 question ids [N], bool dead mask [N].
No framework code: the CLI and flows/refresh.py call these functions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pandas as pd

from qpr.artifacts import (
    ANSWER_ID,
    BM25_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_DIR,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
)
from qpr.io import file_sha256, fsync_dir, json_sha256, write_json_atomic
from qpr.retrieval.bm25 import BM25Index, count_terms

__all__ = [
    "ABSORBED_FILE",
    "DELTAS_DIR",
    "MANIFEST_FILE",
    "DeltaError",
    "Manifest",
    "absorbed_version",
    "add_questions",
    "delete_questions",
    "delta_files",
    "drop_delta",
    "ensure_manifest",
    "for_full_build",
    "live_questions",
    "load_parts",
    "read_manifest",
]

DELTAS_DIR = Path("deltas")
MANIFEST_FILE = DELTAS_DIR / "deltas.json"
ABSORBED_FILE = INDEX_DIR / "absorbed.json"
FORMAT = "qpr-deltas/1"
_VECTORS = "vectors.faiss"
_IDS = "ids.npy"
_QUESTIONS = "questions.parquet"
_QUESTION_COLUMNS = ["question_id", "text", "cluster_id", ANSWER_ID]
_BM25 = "bm25.npz"
DELTA_FILES = (_VECTORS, _IDS, _QUESTIONS, _BM25)


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


def read_manifest(models_dir: Path) -> Manifest:
    """The manifest, or an empty one (no deltas yet). DeltaError for an unreadable one."""
    path = Path(models_dir) / MANIFEST_FILE
    if not path.is_file():
        return Manifest()
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT:
            raise DeltaError(f"{path}: format {raw.get('format')!r}, expected {FORMAT!r}")
        return Manifest(
            int(raw["version"]),
            list(raw["deltas"]),
            list(raw["tombstones"]),
            raw["main_avgdl"],
            list(raw.get("dropped", [])),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DeltaError(f"{path}: not a readable deltas manifest ({exc})") from exc


def ensure_manifest(models_dir: Path) -> Path:
    """The manifest's path; an empty manifest is written when there is none (the index
    stage's DVC output must exist, and an empty one hashes the same on every machine)."""
    path = Path(models_dir) / MANIFEST_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, Manifest().as_dict())
    return path


def absorbed_version(models_dir: Path) -> int:
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
    return DELTAS_DIR / f"{number:04d}"


def delta_files(models_dir: Path) -> list[Path]:
    """index/absorbed.json, the manifest and every file of the deltas a load reads,
    relative to `models_dir` (only what exists): what the fingerprint hashes and the
    registry stores. Absorbed deltas are left out: the main index holds their questions."""
    root = Path(models_dir)
    out = [ABSORBED_FILE] if (root / ABSORBED_FILE).is_file() else []
    if not (root / MANIFEST_FILE).is_file():
        return out
    pending, _ = read_manifest(root).pending(absorbed_version(root))
    out.append(MANIFEST_FILE)
    for delta in pending:
        out += [delta_dir(int(delta["number"])) / name for name in DELTA_FILES]
    return out


def _delta_sha256(folder: Path) -> str:
    return json_sha256({name: file_sha256(folder / name) for name in DELTA_FILES})


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class Parts:
    """Main + deltas as one set of rows (main rows first, then each delta's).
    dead: bool [N], rows hidden by a tombstone; qids of dead rows are replaced by unique
    negative ids (-2 - row) so that an id map of the live ones stays one-to-one."""

    index: faiss.Index
    qids: np.ndarray
    texts: list[str]
    cluster_ids: np.ndarray
    answer_ids: list[str | None] | None
    bm25: BM25Index | None
    dead: np.ndarray
    manifest_sha256: str | None


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
    private, freshly loaded copy). DeltaError for a delta that is missing, altered
    (sha256), of another width or whose files disagree."""
    root = Path(models_dir)
    manifest = read_manifest(root)
    pending, tombstones = manifest.pending(absorbed_version(root))
    qids = np.asarray(qids, np.int64)
    versions = [np.zeros(qids.size, np.int64)]
    all_qids, all_clusters = [qids], [np.asarray(cluster_ids, np.int64)]
    texts, answers = list(texts), list(answer_ids or [None] * qids.size)
    postings = []
    for delta in pending:
        folder = root / delta_dir(int(delta["number"]))
        vectors, frame, weights = _read_delta(folder, delta, index.d)
        index.add(vectors)
        versions.append(np.full(len(frame), int(delta["version"]), np.int64))
        all_qids.append(frame["question_id"].to_numpy(np.int64))
        all_clusters.append(frame["cluster_id"].to_numpy(np.int64))
        texts += frame["text"].tolist()
        # A question list has no answers: pandas reads its nulls back as NaN.
        answers += [a if isinstance(a, str) else None for a in frame[ANSWER_ID].tolist()]
        postings.append({**weights, "docs": np.int64(len(frame))})
    merged_qids = np.concatenate(all_qids)
    dead = dead_rows(merged_qids, np.concatenate(versions), tombstones)
    if bm25 is not None and postings:
        bm25 = merge_bm25(bm25, postings)
    shown = np.where(dead, -2 - np.arange(merged_qids.size, dtype=np.int64), merged_qids)
    if np.unique(shown[~dead]).size != int((~dead).sum()):
        raise DeltaError(f"{root / MANIFEST_FILE}: a question id is live twice")
    return Parts(
        index,
        shown,
        texts,
        np.concatenate(all_clusters),
        answers if answer_ids is not None or postings else answer_ids,
        bm25,
        dead,
        manifest.sha256 if pending or tombstones else None,
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
    folder: Path, delta: dict[str, Any], dim: int
) -> tuple[np.ndarray, pd.DataFrame, dict[str, np.ndarray]]:
    """(vectors float32 [n, D], questions in row order, BM25 postings) of one delta."""
    try:
        if _delta_sha256(folder) != delta["sha256"]:
            raise DeltaError(f"{folder}: files differ from the sha256 the manifest records")
        flat = faiss.read_index(str(folder / _VECTORS))
        vectors = flat.reconstruct_n(0, flat.ntotal) if flat.ntotal else np.zeros((0, dim))
        ids = np.load(folder / _IDS, allow_pickle=False).astype(np.int64)
        frame = pd.read_parquet(folder / _QUESTIONS)
        with np.load(folder / _BM25, allow_pickle=False) as data:
            weights = {name: data[name] for name in ("term", "row", "weight")}
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise DeltaError(f"{folder}: unreadable delta ({exc})") from exc
    if flat.d != dim:
        raise DeltaError(f"{folder}: {flat.d}-d vectors, the main index holds {dim}-d")
    if not (len(ids) == len(frame) == flat.ntotal == int(delta["rows"])):
        raise DeltaError(f"{folder}: its files disagree on the number of questions")
    if not np.array_equal(frame["question_id"].to_numpy(np.int64), ids):
        raise DeltaError(f"{folder}: questions.parquet is not in the order of ids.npy")
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
    )


# ---------------------------------------------------------------- writing


def live_questions(models_dir: Path) -> pd.DataFrame:
    """Every question a search can return now: the main index's and the deltas', less the
    tombstoned rows. Columns question_id int64, text, cluster_id int64, answer_id, version
    int64 (0: main), in row order."""
    root = Path(models_dir)
    pending, tombstones = read_manifest(root).pending(absorbed_version(root))
    return _live(_main_questions(root), root, pending, tombstones)


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
            frame = pd.read_parquet(folder / _QUESTIONS)
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
    if not (root / MANIFEST_FILE).is_file():
        return questions, 0
    manifest = read_manifest(root)
    if not manifest.deltas and not manifest.tombstones:
        return questions, manifest.version
    live = _live(questions, root, manifest.deltas, manifest.tombstones)
    live = live.drop_duplicates("question_id", keep="first").drop(columns="version")
    return live.reset_index(drop=True), manifest.version


def _main_questions(root: Path) -> pd.DataFrame:
    """The main index's questions in row order (the parquet may be in any order)."""
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
        if c not in _QUESTION_COLUMNS and pd.api.types.is_string_dtype(frame[c])
    ]
    return frame[[*_QUESTION_COLUMNS, *metadata]]


def delta_postings(
    main: BM25Index, texts: Sequence[str], avgdl: float
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """BM25 postings of `texts` with the main index's statistics (N, df, avgdl): term
    int32 [nnz] (main term ids), row int32 [nnz], weight float32 [nnz], sorted by (term,
    row); and {"tokens", "unknown_tokens", "unknown_terms"}: the words main does not know,
    which score nothing until compaction."""
    counts = count_terms(texts, stemmer=main.stemmer)
    mapped = np.asarray([main.terms.get(word, -1) for word in counts.terms], np.int64)
    term = mapped[counts.term] if counts.term.size else np.zeros(0, np.int64)
    known = term >= 0
    stats = {
        "tokens": int(counts.tf.sum()),
        "unknown_tokens": int(counts.tf[~known].sum()),
        "unknown_terms": int((mapped < 0).sum()),
    }
    term, row, tf = term[known], counts.row[known].astype(np.int64), counts.tf[known]
    df = np.diff(main.indptr)[term].astype(np.float64)
    idf = np.log1p((main.num_docs - df + 0.5) / (df + 0.5))
    tf = tf.astype(np.float64)
    norm = main.k1 * (1.0 - main.b + main.b * counts.lengths[row] / max(avgdl, 1e-9))
    order = np.lexsort((row, term))
    arrays = {
        "term": term[order].astype(np.int32),
        "row": row[order].astype(np.int32),
        "weight": (idf * tf / (tf + norm))[order].astype(np.float32),
    }
    return arrays, stats


def _encode(root: Path, texts: list[str], batch_size: int, threads: int) -> np.ndarray:
    """float32 [n, D]: the texts through the bundle's document encoder (encoder.onnx), as
    the index stage encodes its questions."""
    from qpr.retrieval.encoders import encode_corpus, load_session
    from qpr.text import load_tokenizer

    session = load_session(root / ENCODER_FILE, threads=threads)
    vocab = load_tokenizer(root / VOCAB_FILE)
    vectors = encode_corpus(session, vocab, texts, batch_size=batch_size, log=lambda _: None)
    if not np.isfinite(vectors).all() or not (np.linalg.norm(vectors, axis=1) > 0).all():
        raise DeltaError("the encoder gave a non-finite or zero vector: delta refused")
    return np.ascontiguousarray(vectors, np.float32)


def add_questions(
    models_dir: str | os.PathLike[str],
    questions: pd.DataFrame,
    *,
    batch_size: int = 256,
    threads: int = 1,
    sources: Sequence[str] = (),
) -> dict[str, Any]:
    """Make `questions` (question_id int64, text, cluster_id int64, answer_id) searchable
    as one new delta. An id the bundle already serves is replaced (its older row gets a
    tombstone). Returns the delta's manifest entry. The served state changes only when
    the new manifest is renamed into place: a failure before leaves it as it was.
    sources: what the questions came from (files' sha256), recorded in the manifest."""
    root = Path(models_dir)
    manifest = read_manifest(root)
    frame = _checked_questions(questions)
    version = manifest.version + 1
    # A dropped delta's number is never given again: logs and notes may name it.
    number = 1 + max((int(d["number"]) for d in manifest.deltas + manifest.dropped), default=0)
    vectors = _encode(root, frame["text"].tolist(), batch_size, threads)
    bm25_path = root / BM25_FILE
    postings: dict[str, np.ndarray] = {
        "term": np.zeros(0, np.int32),
        "row": np.zeros(0, np.int32),
        "weight": np.zeros(0, np.float32),
    }
    stats = {"tokens": 0, "unknown_tokens": 0, "unknown_terms": 0}
    if bm25_path.is_file():
        main = BM25Index.load(bm25_path)
        postings, stats = delta_postings(
            main, frame["text"].tolist(), _main_avgdl(root, manifest, main)
        )
    folder = _write_delta(root, number, vectors, frame, postings)
    replaced = set(live_questions(root)["question_id"].tolist()) & set(
        frame["question_id"].tolist()
    )
    entry = {
        "number": number,
        "version": version,
        "rows": len(frame),
        "sha256": _delta_sha256(folder),
        "sources": list(sources),
        **stats,
    }
    manifest.version = version
    manifest.deltas.append(entry)
    manifest.tombstones += [[int(q), version] for q in sorted(replaced)]
    write_json_atomic(root / MANIFEST_FILE, manifest.as_dict())  # the commit point
    return {**entry, "replaced": len(replaced), "manifest_sha256": manifest.sha256}


def _main_avgdl(root: Path, manifest: Manifest, main: BM25Index) -> float:
    """The main index's mean question length in BM25 words, computed once per main index
    (keyed by its id map's sha256: a full build or a compaction makes a new one)."""
    key = file_sha256(root / IDS_FILE)
    cached = manifest.main_avgdl
    if isinstance(cached, dict) and cached.get("ids_sha256") == key:
        return float(cached["avgdl"])
    texts = _main_questions(root)["text"].tolist()
    avgdl = float(count_terms(texts, stemmer=main.stemmer).lengths.mean())
    manifest.main_avgdl = {"ids_sha256": key, "avgdl": avgdl}
    return avgdl


def _checked_questions(questions: pd.DataFrame) -> pd.DataFrame:
    """The four columns with their dtypes; ValueError for repeated ids or empty texts."""
    frame = questions.reset_index(drop=True)
    if ANSWER_ID not in frame.columns:
        frame = frame.assign(**{ANSWER_ID: None})
    frame = pd.DataFrame(
        {
            "question_id": frame["question_id"].to_numpy(np.int64),
            "text": frame["text"].astype(str).tolist(),
            "cluster_id": frame["cluster_id"].fillna(-1).to_numpy(np.int64),
            ANSWER_ID: pd.Series(
                [None if pd.isna(a) else str(a) for a in frame[ANSWER_ID]], dtype=object
            ),
        }
    )
    if frame.empty:
        raise ValueError("no questions to add")
    if frame["question_id"].duplicated().any():
        raise ValueError("repeated question ids in one delta")
    if (frame["text"].str.strip() == "").any():
        raise ValueError("empty question text")
    return frame


def _write_delta(
    root: Path,
    number: int,
    vectors: np.ndarray,
    frame: pd.DataFrame,
    postings: dict[str, np.ndarray],
) -> Path:
    """deltas/<number>/ written in a hidden temporary folder, fsynced, then renamed."""
    parent = root / DELTAS_DIR
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(".tmp-*"):  # what a killed add left behind
        shutil.rmtree(stale, ignore_errors=True)
    target = root / delta_dir(number)
    if target.exists():  # an earlier add renamed it but died before its manifest
        shutil.rmtree(target)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))
    flat = faiss.IndexFlatL2(vectors.shape[1])
    flat.add(vectors)
    faiss.write_index(flat, str(tmp / _VECTORS))
    np.save(tmp / _IDS, frame["question_id"].to_numpy(np.int64))
    frame.to_parquet(tmp / _QUESTIONS, index=False)
    np.savez(tmp / _BM25, **postings)
    for name in DELTA_FILES:
        with open(tmp / name, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(tmp)
    tmp.rename(target)
    fsync_dir(parent)
    return target


def delete_questions(models_dir: str | os.PathLike[str], question_ids: Sequence[int]) -> dict:
    """Tombstone the served questions among `question_ids` (one new version). Returns
    {"deleted": ids tombstoned, "unknown": ids the bundle does not serve, "version"}."""
    root = Path(models_dir)
    manifest = read_manifest(root)
    wanted = sorted({int(q) for q in question_ids})
    live = set(live_questions(root)["question_id"].tolist())
    deleted = [q for q in wanted if q in live]
    unknown = [q for q in wanted if q not in live]
    if deleted:
        manifest.version += 1
        manifest.tombstones += [[q, manifest.version] for q in deleted]
        write_json_atomic(root / MANIFEST_FILE, manifest.as_dict())
    return {"deleted": deleted, "unknown": unknown, "version": manifest.version}


def drop_delta(
    models_dir: str | os.PathLike[str], number: int, *, reason: str = ""
) -> dict[str, Any]:
    """Undo one `add`: delta `number` leaves the manifest with the tombstones it wrote (the
    rows it replaced come back), and its files go. Its sources are remembered, so a
    schedule does not add the same file again. DeltaError for an unknown delta or one the
    main index already holds (delete its questions instead). Returns {"dropped",
    "questions", "tombstones_lifted", "version"}."""
    root = Path(models_dir)
    manifest = read_manifest(root)
    entry = next((d for d in manifest.deltas if int(d["number"]) == int(number)), None)
    if entry is None:
        known = ", ".join(str(d["number"]) for d in manifest.deltas) or "none"
        raise DeltaError(f"no delta {number} in {root / MANIFEST_FILE} (deltas: {known})")
    version = int(entry["version"])
    if version <= absorbed_version(root):
        raise DeltaError(
            f"delta {number} is in the main index since its last build ({ABSORBED_FILE}): "
            "delete its questions instead (qpr index delete)"
        )
    lifted = [t for t in manifest.tombstones if int(t[1]) == version]
    manifest.deltas.remove(entry)
    manifest.tombstones = [t for t in manifest.tombstones if int(t[1]) != version]
    manifest.version += 1
    manifest.dropped.append({**entry, "dropped_at_version": manifest.version, "reason": reason})
    write_json_atomic(root / MANIFEST_FILE, manifest.as_dict())  # the commit point
    shutil.rmtree(root / delta_dir(int(number)), ignore_errors=True)
    return {
        "dropped": int(number),
        "questions": int(entry["rows"]),
        "tombstones_lifted": len(lifted),
        "version": manifest.version,
    }


def compact(
    models_dir: str | os.PathLike[str],
    build: Callable[[np.ndarray], faiss.Index],
    *,
    batch_size: int = 256,
    threads: int = 1,
) -> dict[str, Any]:
    """Merge the deltas into a new main index: the live questions encoded again and
    indexed by `build` (vectors float32 [N, D] → a filled index: the index stage's
    factory), BM25 recomputed over all of them (every statistic exact again), and the
    manifest version they hold recorded (index/absorbed.json: loads skip those deltas).
    The new index/ is swapped in by rename; other files there (the int8 query encoder)
    are kept. Returns {"questions", "deltas_merged", "tombstones_applied", "version"}."""
    from qpr.retrieval.dense import IdMap, save_index

    root = Path(models_dir)
    manifest = read_manifest(root)
    pending, tombstones = manifest.pending(absorbed_version(root))
    live = live_questions(root)
    vectors = _encode(root, live["text"].tolist(), batch_size, threads)
    index_dir = root / INDEX_DIR
    staging = index_dir.with_name(index_dir.name + ".compact-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_index(build(vectors), staging / INDEX_FILE.name)
    IdMap(live["question_id"].to_numpy(np.int64)).save(staging / IDS_FILE.name)
    kept = live.drop(columns="version")
    for column in kept.columns.difference(_QUESTION_COLUMNS):
        # A delta's question has no metadata: null, which no filter matches.
        kept[column] = kept[column].astype(object).where(kept[column].notna(), None)
    kept.to_parquet(staging / QUESTIONS_FILE.name, index=False)
    if (root / BM25_FILE).is_file():
        main = BM25Index.load(root / BM25_FILE)
        BM25Index.build(live["text"].tolist(), k1=main.k1, b=main.b, stemmer=main.stemmer).save(
            staging / BM25_FILE.name
        )
    write_absorbed(staging, manifest.version)
    rewritten = {INDEX_FILE.name, IDS_FILE.name, QUESTIONS_FILE.name, BM25_FILE.name}
    rewritten.add(ABSORBED_FILE.name)
    for other in index_dir.iterdir():
        if other.is_file() and other.name not in rewritten:
            shutil.copy2(other, staging / other.name)
    old = index_dir.with_name(index_dir.name + ".compact-old")
    shutil.rmtree(old, ignore_errors=True)
    index_dir.rename(old)
    staging.rename(index_dir)
    fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    return {
        "questions": len(live),
        "deltas_merged": len(pending),
        "tombstones_applied": len(tombstones),
        "version": manifest.version,
    }

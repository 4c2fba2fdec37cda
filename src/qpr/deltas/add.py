"""Changing a served bundle's questions without retraining: what `qpr index add | delete |
drop | compact` and flows/refresh.py run (the layout and its rules: `qpr.deltas`).

A file to add is either QA logs (it has a timestamp column: the raw-log gate, then the
cleaning of the cluster stage) or a question list (.txt one question a line, or CSV /
JSONL / Parquet with a "question" or "text" column and optional question_id, answer_id).
Questions the bundle already serves with the same text are skipped; a listed question_id
the bundle serves is replaced (a changed answer). Other new questions get the id the
cluster stage would give them (`stable_id` of the normalised text): a full build that
later finds them in the logs indexes them once.

Every change runs inside `qpr.deltas.format.manifest_update`, whose write is its commit
point, and under the models folder's writer lock (`qpr.deltas.lock`): two writers at once
take turns, and one that waits too long stops with WriterBusy.

Add, delete and compact first check the deltas a load adds (`qpr.deltas.format.require_sound`):
on a delta that fails its check they write nothing and say to drop it. `drop` is the repair,
so it does not check.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pandas as pd

from qpr.artifacts import (
    ABSORBED_FILE,
    ANSWER_ID,
    BM25_FILE,
    COMPANION_FILE,
    DELTA_QUESTIONS_FILE,
    DELTAS_MANIFEST_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_DIR,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
)
from qpr.config import QualitySettings
from qpr.data.clustering import stable_id
from qpr.data.loaders import DataFormatError, clean_logs, read_log_file
from qpr.deltas.format import (
    QUESTION_COLUMNS,
    DeltaError,
    Manifest,
    absorbed_version,
    delta_dir,
    delta_sha256,
    live_questions,
    main_questions,
    manifest_update,
    read_manifest,
    require_sound,
    write_absorbed,
    write_delta,
)
from qpr.deltas.lock import writer_lock
from qpr.ids import parse_id
from qpr.io import file_sha256, replace_dir
from qpr.retrieval.bm25 import BM25Index, count_terms
from qpr.text.normalize import normalize

__all__ = [
    "add_files",
    "add_questions",
    "compact",
    "delete_questions",
    "delta_postings",
    "drop_delta",
    "new_questions",
    "read_ids",
    "read_questions",
    "reencode_deltas",
]


# ---------------------------------------------------------------- files in


def read_questions(path: Path, quality: QualitySettings, report_dir: Path | None) -> pd.DataFrame:
    """The file's questions: question_id (int64, -1: none given), text, answer_id.
    GateFailed when a log file fails the raw-log gate; DataFormatError for other files
    without a question column."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        frame = pd.DataFrame({"text": [line for line in lines if line]})
    else:
        frame = _table(path)
        if "timestamp" in frame.columns:
            return _from_logs(path, quality, report_dir)
        column = "question" if "question" in frame.columns else "text"
        if column not in frame.columns:
            raise DataFormatError(f"{path}: no question or text column")
        frame = frame.rename(columns={column: "text"})
    if "question_id" not in frame.columns:
        frame["question_id"] = -1
    if ANSWER_ID not in frame.columns:
        frame[ANSWER_ID] = None
    frame["text"] = frame["text"].astype(str).str.split().str.join(" ")
    lengths = frame["text"].str.len()
    keep = (lengths >= quality.min_question_chars) & (lengths <= quality.max_question_chars)
    frame = frame[keep].drop_duplicates("text")
    frame["question_id"] = np.asarray([_given_id(v, path) for v in frame["question_id"]], np.int64)
    return frame[["question_id", "text", ANSWER_ID]].reset_index(drop=True)


def _given_id(value: object, path: Path) -> int:
    """A listed question_id: a decimal string or an integer; -1 when none is given. Not
    through pandas' numbers, whose float64 would round ids above 2^53 (`qpr.ids`)."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return -1
    elif value is None or pd.isna(value):  # NaN, pd.NA: a row without one
        return -1
    try:
        return parse_id(value)
    except ValueError as exc:
        raise DataFormatError(f"{path}: question_id: {exc}") from None


def _table(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix in (".jsonl", ".json"):
        return pd.read_json(path, lines=True, dtype=False)
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _from_logs(path: Path, quality: QualitySettings, report_dir: Path | None) -> pd.DataFrame:
    """Each distinct clean question of a log file with its last logged answer."""
    from qpr.quality.data_gates import gate_raw_logs

    raw = read_log_file(path)
    gate_raw_logs(raw, quality, report_dir, part=path.stem)
    clean, _ = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    last = clean.sort_values("timestamp_utc").drop_duplicates("question", keep="last")
    return pd.DataFrame(
        {
            "question_id": np.full(len(last), -1, np.int64),
            "text": last["question"].tolist(),
            ANSWER_ID: last["answer_id"].tolist(),
        }
    )


def new_questions(models_dir: Path, questions: pd.DataFrame) -> pd.DataFrame:
    """The questions to add: those whose given id the bundle serves (a replacement), and
    the others whose text and id it does not serve. Without a given id, a question's id is
    the cluster stage's (`stable_id` of its normalised text), so two spellings of one
    question are added once. cluster_id -1 (no paraphrase cluster is known before the next
    training)."""
    live = live_questions(models_dir)
    served_ids = set(live["question_id"].tolist())
    served_texts = set(live["text"].tolist())
    keys = questions["text"].map(normalize)
    ids = questions["question_id"].to_numpy(np.int64).copy()
    given = ids >= 0
    ids[~given] = [stable_id(k) for k in keys[~given]]
    served = np.isin(ids, list(served_ids))
    replaces = given & served
    fresh = ~questions["text"].isin(served_texts).to_numpy() & ~served & (keys != "").to_numpy()
    frame = questions.assign(question_id=ids)[replaces | fresh]
    frame = frame.drop_duplicates("question_id", keep="last")
    return frame.assign(cluster_id=np.int64(-1)).reset_index(drop=True)


def add_files(
    models_dir: Path,
    files: Sequence[Path],
    quality: QualitySettings,
    *,
    report_dir: Path | None = None,
    batch_size: int = 256,
    threads: int = 1,
    wait: float | None = None,
) -> dict[str, Any]:
    """Every file's new questions as one delta (none when nothing is new). Returns
    {"files", "questions_read", "added", "replaced", "delta"}; files already indexed
    (same sha256, recorded in the manifest) are skipped. Holds the writer lock from the
    first read of the manifest (`qpr.deltas.lock`; `wait`: how long to wait for it).
    DeltaError, nothing written, for an unreadable manifest or a delta that fails its
    check (`require_sound`)."""
    with writer_lock(models_dir, wait=wait):
        return _add_files(models_dir, files, quality, report_dir, batch_size, threads)


def _add_files(
    models_dir: Path,
    files: Sequence[Path],
    quality: QualitySettings,
    report_dir: Path | None,
    batch_size: int,
    threads: int,
) -> dict[str, Any]:
    # Under the lock: what is new is decided on the manifest the delta is added to.
    manifest = read_manifest(models_dir)
    require_sound(models_dir)
    # A dropped delta's files stay out: the schedule would offer them again.
    seen = {s for d in manifest.deltas + manifest.dropped for s in d.get("sources", [])}
    todo = [(Path(f), file_sha256(f)) for f in files]
    todo = [(f, sha) for f, sha in todo if sha not in seen]
    frames = [read_questions(f, quality, report_dir) for f, _ in todo]
    read = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    out: dict[str, Any] = {"files": len(todo), "questions_read": len(read), "added": 0}
    if read.empty:
        return out | {"replaced": 0, "delta": None}
    frame = new_questions(models_dir, read.drop_duplicates("text", keep="last"))
    if frame.empty:
        return out | {"replaced": 0, "delta": None}
    entry = add_questions(
        models_dir,
        frame,
        batch_size=batch_size,
        threads=threads,
        sources=[sha for _, sha in todo],
    )
    return out | {"added": len(frame), "replaced": entry["replaced"], "delta": entry}


def read_ids(values: Sequence[int | str], file: Path | None) -> list[int]:
    """Question ids given one by one and / or in a file (one a line, or an .npy); decimal
    strings or integers (`qpr.ids.parse_id`: ValueError for anything else)."""
    ids = [parse_id(v) for v in values]
    if file is not None:
        if Path(file).suffix == ".npy":
            ids += np.load(file, allow_pickle=False).astype(np.int64).tolist()
        else:
            ids += [parse_id(word) for word in Path(file).read_text().split()]
    return ids


# ---------------------------------------------------------------- a new delta


def delta_postings(
    main: BM25Index, texts: Sequence[str], avgdl: float
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """BM25 postings of `texts` with the main index's statistics (N, df, avgdl): term
    int32 [nnz] (main term ids), row int32 [nnz], weight float32 [nnz], sorted by (term,
    row); and {"tokens", "unknown_tokens", "unknown_terms"}: the words main does not know,
    which score nothing until compaction."""
    counts = count_terms(texts, stemmer=main.stemmer, analyzer=main.analyzer, ngram=main.ngram)
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
    wait: float | None = None,
) -> dict[str, Any]:
    """Make `questions` (question_id int64, text, cluster_id int64, answer_id) searchable
    as one new delta. An id the bundle already serves is replaced (its older row gets a
    tombstone). Returns the delta's manifest entry. The served state changes only when
    the new manifest is renamed into place: a failure before leaves it as it was.
    sources: what the questions came from (files' sha256), recorded in the manifest.
    wait: how long to wait for the writer lock (`qpr.deltas.lock`). DeltaError, nothing
    written, for an unreadable manifest or a delta that fails its check."""
    root = Path(models_dir)
    with manifest_update(root, wait=wait) as manifest:
        require_sound(root)
        frame = _checked_questions(questions)
        version = manifest.version + 1
        # A dropped delta's number is never given again: logs and notes may name it.
        number = 1 + max((int(d["number"]) for d in manifest.deltas + manifest.dropped), default=0)
        vectors = _encode(root, frame["text"].tolist(), batch_size, threads)
        postings, stats = _postings(root, manifest, frame["text"].tolist())
        folder = write_delta(root, number, vectors, frame, postings)
        replaced = set(live_questions(root)["question_id"].tolist()) & set(
            frame["question_id"].tolist()
        )
        entry = {
            "number": number,
            "version": version,
            "rows": len(frame),
            "sha256": delta_sha256(folder),
            "sources": list(sources),
            **stats,
        }
        manifest.version = version
        manifest.deltas.append(entry)
        manifest.tombstones += [[int(q), version] for q in sorted(replaced)]
    return {**entry, "replaced": len(replaced), "manifest_sha256": manifest.sha256}


def _postings(
    root: Path, manifest: Manifest, texts: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """`delta_postings` of `texts`, or empty postings when the bundle has no BM25."""
    bm25_path = root / BM25_FILE
    if not bm25_path.is_file():
        empty = {
            "term": np.zeros(0, np.int32),
            "row": np.zeros(0, np.int32),
            "weight": np.zeros(0, np.float32),
        }
        return empty, {"tokens": 0, "unknown_tokens": 0, "unknown_terms": 0}
    main = BM25Index.load(bm25_path)
    return delta_postings(main, texts, _main_avgdl(root, manifest, main))


def _main_avgdl(root: Path, manifest: Manifest, main: BM25Index) -> float:
    """The main index's mean question length in BM25 words, computed once per main index
    (keyed by its id map's sha256: a full build or a compaction makes a new one)."""
    key = file_sha256(root / IDS_FILE)
    cached = manifest.main_avgdl
    if isinstance(cached, dict) and cached.get("ids_sha256") == key:
        return float(cached["avgdl"])
    texts = main_questions(root)["text"].tolist()
    counts = count_terms(texts, stemmer=main.stemmer, analyzer=main.analyzer, ngram=main.ngram)
    avgdl = float(counts.lengths.mean())
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


def reencode_deltas(
    models_dir: str | os.PathLike[str],
    since: int | None,
    *,
    batch_size: int = 256,
    threads: int = 1,
    wait: float | None = None,
) -> dict[str, Any]:
    """Encode again, with the bundle's present base, the deltas added after manifest
    version `since` (None: every delta the main index does not hold): their vectors and
    BM25 postings are rewritten, their number, version, rows and tombstones kept. After a
    retraining's rollback (`qpr.ops.carry`): an add made while the cycle ran may have been
    encoded by the model the rollback removed. A delta whose files are not as its manifest
    entry records is left as it is (it fails alone; `drop` removes it). Returns
    {"reencoded": numbers, "left": {number: why}}."""
    root = Path(models_dir)
    with manifest_update(root, wait=wait) as manifest:
        floor = max(absorbed_version(root), -1 if since is None else int(since))
        todo, left = [], {}
        for entry in [d for d in manifest.deltas if int(d["version"]) > floor]:
            folder = root / delta_dir(int(entry["number"]))
            try:
                intact = delta_sha256(folder) == entry["sha256"]
            except OSError as err:
                left[int(entry["number"])] = f"unreadable: {err}"
                continue
            if not intact:
                left[int(entry["number"])] = "its files are not as its manifest entry records"
                continue
            frame = pd.read_parquet(folder / DELTA_QUESTIONS_FILE)[QUESTION_COLUMNS]
            vectors = _encode(root, frame["text"].tolist(), batch_size, threads)
            todo.append((entry, frame, vectors, *_postings(root, manifest, frame["text"].tolist())))
        # Every delta encoded before the first folder is replaced: an encoding error
        # changes nothing. The folders then go before the manifest that names them.
        for entry, frame, vectors, postings, stats in todo:
            folder = write_delta(root, int(entry["number"]), vectors, frame, postings)
            entry.update(sha256=delta_sha256(folder), **stats)
    return {"reencoded": [int(e["number"]) for e, *_ in todo], "left": left}


# ---------------------------------------------------------------- undoing and merging


def delete_questions(
    models_dir: str | os.PathLike[str],
    question_ids: Sequence[int | str],
    *,
    wait: float | None = None,
) -> dict:
    """Tombstone the served questions among `question_ids` (ints or decimal strings, as the
    service writes them; ValueError for others) in one new version. Returns
    {"deleted": ids tombstoned, "unknown": ids the bundle does not serve, "version"}.
    wait: how long to wait for the writer lock (`qpr.deltas.lock`). DeltaError, nothing
    written, on a delta that fails its check."""
    root = Path(models_dir)
    with manifest_update(root, wait=wait) as manifest:
        require_sound(root)
        wanted = sorted({parse_id(q) for q in question_ids})
        live = set(live_questions(root)["question_id"].tolist())
        deleted = [q for q in wanted if q in live]
        unknown = [q for q in wanted if q not in live]
        if deleted:
            manifest.version += 1
            manifest.tombstones += [[q, manifest.version] for q in deleted]
    return {"deleted": deleted, "unknown": unknown, "version": manifest.version}


def drop_delta(
    models_dir: str | os.PathLike[str],
    number: int,
    *,
    reason: str = "",
    wait: float | None = None,
) -> dict[str, Any]:
    """Undo one `add`: delta `number` leaves the manifest with the tombstones it wrote (the
    rows it replaced come back), and its files go. Its sources are remembered, so a
    schedule does not add the same file again. DeltaError for an unknown delta or one the
    main index already holds (delete its questions instead). Returns {"dropped",
    "questions", "tombstones_lifted", "version"}. wait: how long to wait for the writer
    lock (`qpr.deltas.lock`), held until the files are gone."""
    root = Path(models_dir)
    with writer_lock(root, wait=wait):
        entry, lifted, version = _drop_entry(root, number, reason)
        shutil.rmtree(root / delta_dir(int(number)), ignore_errors=True)
    return {
        "dropped": int(number),
        "questions": int(entry["rows"]),
        "tombstones_lifted": len(lifted),
        "version": version,
    }


def _drop_entry(
    root: Path, number: int, reason: str
) -> tuple[dict[str, Any], list[list[int]], int]:
    """Delta `number` out of the manifest: (its entry, the tombstones lifted, the new
    manifest version)."""
    with manifest_update(root) as manifest:
        entry = next((d for d in manifest.deltas if int(d["number"]) == int(number)), None)
        if entry is None:
            known = ", ".join(str(d["number"]) for d in manifest.deltas) or "none"
            raise DeltaError(
                f"no delta {number} in {root / DELTAS_MANIFEST_FILE} (deltas: {known})"
            )
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
    return entry, lifted, manifest.version


def compact(
    models_dir: str | os.PathLike[str],
    build: Callable[[np.ndarray], faiss.Index],
    *,
    batch_size: int = 256,
    threads: int = 1,
    wait: float | None = None,
) -> dict[str, Any]:
    """Merge the deltas into a new main index: the live questions encoded again and
    indexed by `build` (vectors float32 [N, D] → a filled index: the index stage's
    factory), BM25 recomputed over all of them (every statistic exact again), and the
    manifest version they hold recorded (index/absorbed.json: loads skip those deltas).
    The new index/ is swapped in by rename; other files there (the int8 query encoder)
    are kept. The manifest itself is unchanged. Returns {"questions", "deltas_merged",
    "tombstones_applied", "version"}. The writer lock is held from the read to the swap
    (`wait`: how long to wait for it). DeltaError, nothing written, on a delta that fails
    its check: compaction would otherwise absorb its questions unchecked."""
    root = Path(models_dir)
    with manifest_update(root, wait=wait) as manifest:
        require_sound(root)
        pending, tombstones = manifest.pending(absorbed_version(root))
        live = live_questions(root)
        vectors = _encode(root, live["text"].tolist(), batch_size, threads)
        _swap_index(root, _staged_index(root, live, build(vectors), manifest.version))
    return {
        "questions": len(live),
        "deltas_merged": len(pending),
        "tombstones_applied": len(tombstones),
        "version": manifest.version,
    }


def _staged_index(root: Path, live: pd.DataFrame, index: faiss.Index, version: int) -> Path:
    """A new index/ folder beside the served one, holding the `live` questions: `index`,
    their id map, table and BM25, absorbed.json (`version`), and the other files the
    served index/ holds (the int8 query encoder)."""
    from qpr.retrieval.dense import IdMap, save_index

    index_dir = root / INDEX_DIR
    staging = index_dir.with_name(index_dir.name + ".compact-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_index(index, staging / INDEX_FILE.name)
    IdMap(live["question_id"].to_numpy(np.int64)).save(staging / IDS_FILE.name)
    kept = live.drop(columns="version")
    for column in kept.columns.difference(QUESTION_COLUMNS):
        # A delta's question has no metadata: null, which no filter matches.
        kept[column] = kept[column].astype(object).where(kept[column].notna(), None)
    kept.to_parquet(staging / QUESTIONS_FILE.name, index=False)
    if (root / BM25_FILE).is_file():
        main = BM25Index.load(root / BM25_FILE)
        BM25Index.build(live["text"].tolist(), **main.settings).save(staging / BM25_FILE.name)
    write_absorbed(staging, version)
    rewritten = {INDEX_FILE.name, IDS_FILE.name, QUESTIONS_FILE.name, BM25_FILE.name}
    rewritten |= {ABSORBED_FILE.name, COMPANION_FILE.name}
    if (root / COMPANION_FILE).is_file():
        _compact_companion(root, live["text"].tolist(), staging)
    for other in index_dir.iterdir():
        if other.is_file() and other.name not in rewritten:
            shutil.copy2(other, staging / other.name)
    return staging


def _compact_companion(root: Path, texts: list[str], staging: Path) -> None:
    """The companion's vectors of the live questions, when the search config mixes one in.
    The old file is never copied: its rows were the old index's. A companion the config
    does not use is left out; the next full build writes it again."""
    from qpr.artifacts import SearchConfig
    from qpr.retrieval.companion import load_encoder

    name = SearchConfig.read(root).companion
    if name is not None:
        np.save(staging / COMPANION_FILE.name, load_encoder(name).documents(texts))


def _swap_index(root: Path, staging: Path) -> None:
    """`staging` put in place of index/ by `qpr.io.replace_dir` (crash-safe)."""
    replace_dir(staging, root / INDEX_DIR)

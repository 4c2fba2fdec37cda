"""A bundle's files loaded and cross-checked: what `qpr.retrieval.bundle.Bundle` searches.

`load_bundle_parts` reads the ``models/`` directory the pipeline writes (its files and
``search.json`` are defined once, in `qpr.artifacts`) and refuses a directory whose files
do not belong together (`BundleError` naming the file): a vocabulary other than the one
the encoder was trained with, an index built by another encoder width, an id map or
question table of another index, a query encoder of another ``encoder.onnx``. Such a mix
would not fail later, it would return plausible but wrong neighbours, so it fails here.

Which encoder queries go through is what ``search.json`` declares (``query_encoder``: kind
and files); a declared file that is missing is refused. Older bundles are read through
`qpr.artifacts.migrate`, the one place that knows their formats; their question tables
may lack answer ids (hits then carry none, logged). Deltas (`qpr.deltas`) are
appended to the loaded index and BM25; the fingerprint hashes every file loaded. A delta
that fails its check fails alone: the bundle loads without it and names it
(`BundleParts.failed_deltas`, logged).

No torch: numpy, onnxruntime, faiss and pyarrow (and tokenizers for word pieces).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq

from qpr.artifacts import (
    ANSWER_ID,
    BM25_FILE,
    COMPANION_FILE,
    DELTAS_MANIFEST_FILE,
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    INPUT_NAME,
    MAX_LEN_KEY,
    OUTPUT_NAME,
    PROBE_COSINE_FLOOR,
    PROBE_QUESTIONS,
    QUANTIZED_FROM,
    QUERY_ENCODER_FILE,
    QUESTIONS_FILE,
    REQUIRED_FILES,
    RERANK_CONFIG_FILE,
    RERANK_FILES,
    SEARCH_FILE,
    STUDENT_FILE,
    STUDENT_OF,
    VOCAB_FILE,
    VOCAB_SHA256_KEY,
    QueryEncoderEntry,
    SearchConfig,
    SearchConfigError,
    search_config_file,
)
from qpr.deltas.format import DeltaError, delta_files, load_parts
from qpr.errors import QPRError
from qpr.io import file_sha256, text_sha256
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.companion import Companion
from qpr.retrieval.dense import IdMap, load_index
from qpr.retrieval.encoders import embedding_dim, load_session, probe_cosine
from qpr.retrieval.folded import FoldedCNN, checked_fold
from qpr.retrieval.reranker import Reranker, RerankerError
from qpr.retrieval.selection import FieldValues
from qpr.text import load_tokenizer
from qpr.text.vocab import Vocabulary, VocabularyError

if TYPE_CHECKING:
    from qpr.text.wordpiece import WordPieceTokenizer

__all__ = ["BundleError", "BundleParts", "IndexedQuestions", "QueryEncoder", "load_bundle_parts"]

log = logging.getLogger(__name__)


class BundleError(QPRError, RuntimeError):
    """A models directory is incomplete or its files do not belong together."""


@dataclass(frozen=True)
class QueryEncoder:
    """What turns a question into a vector: the tokenizer and the encoder that queries go
    through (search.json's ``query_encoder``), checked to belong together.

    path: the ONNX file queries go through; int8: it is the quantised query encoder;
    student: it is a query student trained into encoder.onnx's space (an asymmetric
    bundle: the index holds encoder.onnx's vectors).
    folded: the CNN's lookup tables that replace the ONNX session, when loaded with them.
    """

    vocab: Vocabulary | WordPieceTokenizer
    session: ort.InferenceSession
    max_len: int
    dim: int
    path: Path
    int8: bool = False
    folded: FoldedCNN | None = None
    student: bool = False


@dataclass(frozen=True)
class IndexedQuestions:
    """What a query is searched against: the FAISS index, each row's question (id, text,
    cluster id, answer id), and the rows' BM25 weights when the bundle fuses BM25 in.
    answer_ids None: the bundle predates answer ids (`Hit.answer_id` is then None).
    fields: the metadata a search may filter on, by name, over the rows (answer_id and
    the question table's other string columns)."""

    index: faiss.Index
    qids: np.ndarray
    texts: list[str]
    cluster_ids: np.ndarray
    bm25: BM25Index | None = None
    answer_ids: list[str | None] | None = None
    fields: Mapping[str, FieldValues] | None = None
    # bool [N]: rows a tombstone hides (`qpr.deltas`); None: none is hidden
    dead: np.ndarray | None = None


@dataclass(frozen=True)
class BundleParts:
    """A bundle's files, loaded and checked together (`load_bundle_parts`): what a `Bundle`
    is built from. root: the models directory; config: its search config, in the current
    format (`qpr.artifacts.migrate`); fingerprint: sha256 over the files loaded (see
    `Bundle.fingerprint`); reranker: None unless the config re-ranks; failed_deltas:
    {delta number: why it failed its check}, the deltas left out (`qpr.deltas.format`);
    companion: None unless the config mixes one in, over every row (deltas' included)."""

    root: Path
    encoder: QueryEncoder
    questions: IndexedQuestions
    config: SearchConfig
    fingerprint: str
    reranker: Reranker | None = None
    failed_deltas: Mapping[int, str] = field(default_factory=dict)
    companion: Companion | None = None


def load_bundle_parts(
    models_dir: str | os.PathLike[str],
    *,
    threads: int = 1,
    nprobe: int | None = None,
    ef_search: int | None = None,
    fold_encoder: bool = False,
) -> BundleParts:
    """The bundle in ``models_dir``, loaded and cross-checked (arguments: `Bundle.load`).

    Raises BundleError (naming the file) when a file is missing or unreadable, or the
    files do not belong together; ValueError for a bad argument.
    """
    _check_arguments(threads, nprobe, ef_search)
    root = Path(models_dir)
    paths, config = _bundle_files(root)
    paths |= _rerank_files(root, config)
    paths |= _companion_files(root, config)
    paths |= _delta_paths(root)
    # The files are stat'ed before and after loading: the pipeline replaces them by
    # rename, and a bundle assembled from files of two different runs must not start.
    before = _signatures(paths.values())
    digests = {rel: file_sha256(path) for rel, path in paths.items()}
    encoder = _load_encoder(paths, _declared(config), digests[ENCODER_FILE], threads)
    served_nprobe, served_ef_search = config.depth()
    index = _load_index(
        paths[INDEX_FILE],
        encoder,
        nprobe=served_nprobe if nprobe is None else nprobe,
        ef_search=served_ef_search if ef_search is None else ef_search,
    )
    questions, failed_deltas = _with_deltas(root, _load_questions(paths, index, config))
    reranker = _load_reranker(root, config, threads)
    companion = _load_companion(root, config, questions.texts)
    if fold_encoder and not encoder.int8:
        encoder = replace(
            encoder, folded=checked_fold(encoder.path, encoder.session, encoder.max_len)
        )
    if _signatures(paths.values()) != before:
        raise BundleError(f"files in {root} changed while loading; load again")
    return BundleParts(
        root, encoder, questions, config, _fingerprint(digests), reranker, failed_deltas, companion
    )


# ---------------------------------------------------------------- loading helpers


def _check_arguments(threads: int, nprobe: int | None, ef_search: int | None) -> None:
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if nprobe is not None and nprobe < 1:
        raise ValueError(f"nprobe must be >= 1, got {nprobe}")
    if ef_search is not None and ef_search < 1:
        raise ValueError(f"ef_search must be >= 1, got {ef_search}")


def _bundle_files(root: Path) -> tuple[dict[Path, Path], SearchConfig]:
    """({relative path: path} of every file the bundle is loaded from, in fingerprint
    order; its search config), or BundleError naming what is missing or unreadable."""
    config_file = search_config_file(root)
    required = [
        config_file.relative_to(root) if rel == SEARCH_FILE else rel for rel in REQUIRED_FILES
    ]
    paths = {rel: root / rel for rel in required}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise BundleError(f"incomplete model bundle in {root}: missing {', '.join(missing)}")
    try:
        config = SearchConfig.read(root)
    except SearchConfigError as exc:
        raise BundleError(str(exc)) from exc
    if config.fused:
        paths[BM25_FILE] = root / BM25_FILE
        if not paths[BM25_FILE].is_file():
            raise BundleError(f"{config_file} fuses BM25 in, but {paths[BM25_FILE]} is missing")
    declared = _declared(config)
    for rel in declared.files:
        if not (root / rel).is_file():
            raise BundleError(
                f"{config_file} declares the {declared.kind} query encoder {rel.as_posix()}, "
                f"but {root / rel} is missing"
            )
    # Every query encoder present counts in the fingerprint, served or not: registered
    # versions recorded their fingerprint so.
    for optional in (QUERY_ENCODER_FILE, STUDENT_FILE):
        if optional in declared.files or (root / optional).is_file():
            paths[optional] = root / optional
    return paths, config


def _declared(config: SearchConfig) -> QueryEncoderEntry:
    """The query encoder the config declares (`SearchConfig.read` always sets one)."""
    if config.query_encoder is None:
        raise BundleError("the search config declares no query_encoder")
    return config.query_encoder


def _rerank_files(root: Path, config: SearchConfig) -> dict[Path, Path]:
    """The re-ranker's files when the config re-ranks (hashed into the fingerprint), or
    BundleError naming the missing folder."""
    if config.rerank_top is None:
        return {}
    if not (root / RERANK_CONFIG_FILE).is_file():
        raise BundleError(
            f"{search_config_file(root)} re-ranks the top {config.rerank_top}, but "
            f"{root / RERANK_CONFIG_FILE} is missing (the rerank stage writes it)"
        )
    return {rel: root / rel for rel in RERANK_FILES if (root / rel).is_file()}


def _companion_files(root: Path, config: SearchConfig) -> dict[Path, Path]:
    """The companion's vectors when the config mixes one in (hashed into the
    fingerprint), or BundleError naming the missing file."""
    if config.companion is None:
        return {}
    path = root / COMPANION_FILE
    if not path.is_file():
        raise BundleError(
            f"{search_config_file(root)} mixes in the {config.companion} companion, but "
            f"{path} is missing (the index stage writes it with index.companion)"
        )
    return {COMPANION_FILE: path}


def _load_companion(root: Path, config: SearchConfig, texts: list[str]) -> Companion | None:
    """The companion over every row: the index stage's vectors, a delta's rows encoded
    now (a few questions: 0.02 ms each). BundleError when it cannot be loaded or holds
    more rows than the index."""
    if config.companion is None:
        return None
    path = root / COMPANION_FILE
    try:
        return Companion.load(path, config.companion, texts)
    except (OSError, ValueError) as exc:  # CompanionError is a ValueError
        raise BundleError(f"{path}: {exc}") from exc


def _delta_paths(root: Path) -> dict[Path, Path]:
    """The deltas' files (`qpr.deltas`), hashed into the fingerprint."""
    try:
        return {rel: root / rel for rel in delta_files(root)}
    except DeltaError as exc:
        raise BundleError(str(exc)) from exc


def _with_deltas(
    root: Path, questions: IndexedQuestions
) -> tuple[IndexedQuestions, dict[int, str]]:
    """`questions` with the manifest's deltas appended and its tombstones as the dead
    mask, and {number: reason} of the deltas that failed their check and were left out
    (each logged). BundleError for an unreadable manifest (the reloader then keeps the
    state it serves: without it, deleted questions would come back)."""
    if not (root / DELTAS_MANIFEST_FILE).is_file():
        return questions, {}
    try:
        parts = load_parts(
            root,
            questions.index,
            questions.qids,
            questions.texts,
            questions.cluster_ids,
            questions.answer_ids,
            questions.bm25,
        )
    except DeltaError as exc:
        raise BundleError(str(exc)) from exc
    for number, reason in sorted(parts.failed.items()):
        log.warning(
            "delta %d of %s fails its check and is left out (%s); the main index and the "
            "other deltas serve: `qpr index drop %d` removes it",
            number,
            root,
            reason,
            number,
        )
    extended = IndexedQuestions(
        parts.index,
        parts.qids,
        parts.texts,
        parts.cluster_ids,
        parts.bm25,
        parts.answer_ids,
        _extended_fields(questions.fields, parts.answer_ids, int(parts.index.ntotal)),
        parts.dead,
    )
    return extended, parts.failed


def _extended_fields(
    fields: Mapping[str, FieldValues] | None, answer_ids: list[str | None] | None, n: int
) -> dict[str, FieldValues]:
    """The main index's filter fields over all `n` rows, the deltas' appended: their
    answer ids, and null (no filter matches it) for metadata a delta does not keep."""
    out: dict[str, FieldValues] = {}
    for name, main in (fields or {}).items():
        if name == ANSWER_ID and answer_ids is not None:
            out[name] = FieldValues.of(answer_ids)
            continue
        codes = np.full(n, -1, np.int32)
        codes[: main.codes.size] = main.codes
        out[name] = FieldValues(main.values, codes)
    return out


def _load_reranker(root: Path, config: SearchConfig, threads: int) -> Reranker | None:
    if config.rerank_top is None:
        return None
    try:
        return Reranker.load(root, threads=threads)
    except RerankerError as exc:
        raise BundleError(str(exc)) from exc


def _load_encoder(
    paths: Mapping[Path, Path], declared: QueryEncoderEntry, encoder_sha256: str, threads: int
) -> QueryEncoder:
    """The tokenizer and the query encoder search.json declares, checked against each
    other: the encoder was exported with this vocabulary and truncates where the tokenizer
    does."""
    vocab_path = paths[VOCAB_FILE]
    try:
        vocab = load_tokenizer(vocab_path)
    except VocabularyError as exc:
        raise BundleError(str(exc)) from exc
    path = paths[declared.files[0]]
    student = declared.kind == "student"
    int8 = declared.kind == "onnx-int8"
    if student:
        session, metadata, dim = _student_encoder(
            path, paths[ENCODER_FILE], encoder_sha256, vocab, threads
        )
    elif int8:  # quantised from encoder.onnx, its metadata copied: open it alone
        session, metadata, dim = _query_encoder(path, paths[ENCODER_FILE], encoder_sha256, threads)
    else:
        session, metadata, dim = _open_encoder(path, threads, "encoder")
    stored_sha = metadata.get(VOCAB_SHA256_KEY)
    if stored_sha is None:
        raise BundleError(f"{path}: metadata has no {VOCAB_SHA256_KEY} (not a pipeline export)")
    if stored_sha != vocab.checksum:
        raise BundleError(
            f"{path} was trained with vocabulary {stored_sha[:12]}…, but "
            f"{vocab_path} is {vocab.checksum[:12]}…: the two files come from different runs"
        )
    max_len = _parse_max_len(metadata.get(MAX_LEN_KEY), path)
    # A word-piece tokenizer truncates to its own max_len keeping [SEP]; a different
    # encoder max_len would cut [SEP] off long questions here.
    vocab_max_len = getattr(vocab, "max_len", None)
    if vocab_max_len is not None and vocab_max_len != max_len:
        raise BundleError(
            f"{vocab_path} truncates to {vocab_max_len} word pieces but {path} was "
            f"exported with max_len {max_len}"
        )
    return QueryEncoder(vocab, session, max_len, dim, path, int8=int8, student=student)


def _load_index(
    path: Path, encoder: QueryEncoder, *, nprobe: int | None, ef_search: int | None
) -> faiss.Index:
    """The FAISS index searched at the given depth (None: the file's own), checked to be
    an L2 index of the encoder's width."""
    try:
        # nprobe / efSearch: False inside for indexes without lists / a graph
        index = load_index(path, nprobe=nprobe, ef_search=ef_search)
    except RuntimeError as exc:
        raise BundleError(f"cannot read FAISS index {path}: {exc}") from exc
    if index.metric_type != faiss.METRIC_L2:
        raise BundleError(
            f"{path}: metric type {index.metric_type}, expected L2 "
            "(distances and the threshold are squared euclidean distances)"
        )
    if index.d != encoder.dim:
        raise BundleError(
            f"{path} holds {index.d}-dimensional vectors but {encoder.path} outputs "
            f"{encoder.dim} dimensions: the index was built by another encoder"
        )
    return index


def _load_questions(
    paths: Mapping[Path, Path], index: faiss.Index, config: SearchConfig
) -> IndexedQuestions:
    """Each index row's question id, text and cluster id, and BM25 when fused, checked
    to describe the same rows as the index."""
    ids_path, index_path = paths[IDS_FILE], paths[INDEX_FILE]
    try:
        id_map = IdMap.load(ids_path)
    except (OSError, ValueError) as exc:
        raise BundleError(f"cannot read id map {ids_path}: {exc}") from exc
    if len(id_map) != index.ntotal:
        raise BundleError(
            f"{ids_path} maps {len(id_map)} rows but {index_path} holds {index.ntotal} vectors"
        )
    texts, cluster_ids, answer_ids, fields = _read_questions(
        paths[QUESTIONS_FILE], id_map, index.ntotal
    )
    bm25 = None
    if config.fused:
        try:
            bm25 = BM25Index.load(paths[BM25_FILE])
        except ValueError as exc:
            raise BundleError(str(exc)) from exc
        if bm25.num_docs != index.ntotal:
            raise BundleError(
                f"{paths[BM25_FILE]} weighs {bm25.num_docs} questions but {index_path} "
                f"holds {index.ntotal}: they come from different index runs"
            )
    return IndexedQuestions(index, id_map.qids, texts, cluster_ids, bm25, answer_ids, fields)


def _open_encoder(
    path: Path, threads: int, what: str
) -> tuple[ort.InferenceSession, dict[str, str], int]:
    """(session, metadata_props, output dimension) of an ONNX encoder, or BundleError."""
    try:
        session = load_session(path, threads=threads)
        metadata = dict(session.get_modelmeta().custom_metadata_map)
        dim = embedding_dim(session)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise BundleError(f"cannot load ONNX {what} {path}: {exc}") from exc
    _check_io(session, path)
    return session, metadata, dim


def _query_encoder(
    path: Path, encoder_path: Path, encoder_sha256: str, threads: int
) -> tuple[ort.InferenceSession, dict[str, str], int]:
    """`_open_encoder` for the int8 query encoder, once its metadata shows it was quantised
    from `encoder_path` (whose sha256 is given): then it carries that file's metadata."""
    session, metadata, dim = _open_encoder(path, threads, "query encoder")
    if metadata.get(QUANTIZED_FROM) != encoder_sha256:
        raise BundleError(
            f"{path} was not quantised from {encoder_path}: the two files come from "
            "different runs (run the index stage again)"
        )
    return session, metadata, dim


def _student_encoder(
    path: Path,
    encoder_path: Path,
    encoder_sha256: str,
    vocab: Vocabulary | WordPieceTokenizer,
    threads: int,
) -> tuple[ort.InferenceSession, dict[str, str], int]:
    """`_open_encoder` for a query student, once it shows it belongs to `encoder_path`:
    trained against that file (sha256), of its width, and its vectors of its probe
    questions within the recorded cosine of encoder_path's."""
    session, metadata, dim = _open_encoder(path, threads, "query student")
    if metadata.get(STUDENT_OF) != encoder_sha256:
        raise BundleError(
            f"{path} was trained for another document encoder than {encoder_path} "
            f"({str(metadata.get(STUDENT_OF))[:12]}… against {encoder_sha256[:12]}…): "
            "run the student stage again"
        )
    documents, _, document_dim = _open_encoder(encoder_path, 1, "encoder")
    if document_dim != dim:
        raise BundleError(
            f"{path} outputs {dim} dimensions but {encoder_path} outputs {document_dim}: "
            "queries and documents would live in different spaces"
        )
    try:
        probes = json.loads(metadata[PROBE_QUESTIONS])
        floor = float(metadata[PROBE_COSINE_FLOOR])
        max_len = int(metadata[MAX_LEN_KEY])
    except (KeyError, ValueError, TypeError) as exc:
        raise BundleError(f"{path}: no readable probe in its metadata ({exc})") from exc
    cosine = probe_cosine(session, documents, vocab, probes, max_len=max_len)
    if not cosine >= floor:
        raise BundleError(
            f"{path} encodes its {len(probes)} probe questions at mean cosine {cosine:.3f} "
            f"to {encoder_path}'s vectors, below its floor {floor:.3f}: not a student of it"
        )
    return session, metadata, dim


def _signatures(paths: Iterable[Path]) -> list[tuple[int, int, int]]:
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return out


def _fingerprint(digests: dict[Path, str]) -> str:
    return text_sha256("".join(f"{rel.as_posix()}\t{digest}\n" for rel, digest in digests.items()))


def _check_io(session: ort.InferenceSession, path: Path) -> None:
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if inputs != [INPUT_NAME] or OUTPUT_NAME not in outputs:
        raise BundleError(
            f"{path}: inputs {inputs} / outputs {outputs}, expected input {INPUT_NAME!r} "
            f"and output {OUTPUT_NAME!r}"
        )


def _parse_max_len(value: str | None, path: Path) -> int:
    if value is None:
        raise BundleError(f"{path}: metadata has no max_len (not a pipeline export)")
    try:
        max_len = int(value)
    except ValueError:
        raise BundleError(f"{path}: metadata max_len is {value!r}, expected an integer") from None
    if max_len < 1:
        raise BundleError(f"{path}: metadata max_len is {max_len}, expected >= 1")
    return max_len


def _read_questions(
    path: Path, id_map: IdMap, ntotal: int
) -> tuple[list[str], np.ndarray, list[str | None] | None, dict[str, FieldValues]]:
    """Texts, cluster ids, answer ids and the filterable fields aligned to index rows (the
    parquet may be in any order); answer ids None for a table written before the index
    stage kept them. Fields: answer_id and every other string column."""
    columns = ["question_id", "text", "cluster_id"]
    try:
        schema = pq.read_schema(path)
        if ANSWER_ID in schema.names and not _is_text(schema.field(ANSWER_ID).type):
            raise BundleError(
                f"{path}: {ANSWER_ID} must be strings, got {schema.field(ANSWER_ID).type}"
            )
        extra = [f.name for f in schema if f.name not in columns and _is_text(f.type)]
        table = pq.read_table(path, columns=columns + extra)
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise BundleError(f"cannot read questions {path}: {exc}") from exc
    if table.num_rows != ntotal:
        raise BundleError(
            f"{path} has {table.num_rows} questions but the index holds {ntotal} vectors"
        )
    for name in ("question_id", "text"):
        if table.column(name).null_count:
            raise BundleError(f"{path}: column {name} has {table.column(name).null_count} nulls")
    types = {name: table.schema.field(name).type for name in table.column_names}
    if not (pa.types.is_integer(types["question_id"]) and pa.types.is_integer(types["cluster_id"])):
        raise BundleError(f"{path}: question_id and cluster_id must be integers, got {types}")
    if not (pa.types.is_string(types["text"]) or pa.types.is_large_string(types["text"])):
        raise BundleError(f"{path}: text must be strings, got {types['text']}")

    qids = table.column("question_id").to_numpy().astype(np.int64, copy=False)
    rows = id_map.to_rows(qids)
    if (rows < 0).any():
        absent = qids[rows < 0][:5].tolist()
        raise BundleError(f"{path}: question ids {absent} are not in the index id map")
    # Equal counts + every id found + unique ids in the id map: a bijection, unless the
    # parquet repeats an id (then some index row would have no text).
    if np.unique(rows).size != rows.size:
        raise BundleError(f"{path}: repeated question ids")
    texts_in = table.column("text").to_pylist()
    clusters_in = table.column("cluster_id").fill_null(-1).to_numpy().astype(np.int64)
    texts: list[str] = [""] * ntotal
    for row, text in zip(rows.tolist(), texts_in, strict=True):
        texts[row] = text
    cluster_ids = np.empty(ntotal, dtype=np.int64)
    cluster_ids[rows] = clusters_in
    answer_ids = _answer_ids(path, table, rows, ntotal)
    fields = {name: FieldValues.of(_aligned(table, name, rows, ntotal)) for name in extra}
    return texts, cluster_ids, answer_ids, fields


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)


def _aligned(table: pa.Table, name: str, rows: np.ndarray, ntotal: int) -> list[str | None]:
    """Column `name` (strings or nulls) in index row order."""
    out: list[str | None] = [None] * ntotal
    for row, value in zip(rows.tolist(), table.column(name).to_pylist(), strict=True):
        out[row] = value
    return out


def _answer_ids(
    path: Path, table: pa.Table, rows: np.ndarray, ntotal: int
) -> list[str | None] | None:
    """The answer_id column aligned to index rows; None (logged) when the table has none."""
    if ANSWER_ID not in table.column_names:
        # Older bundles still serve; their hits say plainly that no answer id is known.
        log.warning(
            "%s has no %s column (written before the index stage kept answer ids): hits "
            "carry answer_id null; run the index stage again to fill it",
            path,
            ANSWER_ID,
        )
        return None
    return _aligned(table, ANSWER_ID, rows, ntotal)

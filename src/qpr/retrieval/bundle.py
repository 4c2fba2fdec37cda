"""The trained model as the search command and the search service load it: no torch.

A bundle is the ``models/`` directory the pipeline writes; its files and its search
config are defined once, in `qpr.artifacts` (vocabulary, encoder, FAISS index, id map,
question table, ``search.json``, and optionally BM25 weights and an int8 query encoder).

`Bundle.load` refuses a directory whose files do not belong together (`BundleError` naming
the file): a vocabulary other than the one the encoder was trained with, an index built by
another encoder width, an id map or question table of another index. Such a mix would not
fail later, it would return plausible but wrong neighbours, so it must fail here.

Query path per batch of questions: the tokenizer's ``encode`` → one ONNX Runtime call (or,
loaded with ``fold_encoder``, the CNN's lookup tables, `qpr.retrieval.folded`) → one FAISS
search; with fusion also BM25 over the question's words (on a worker thread, started before
the encoder runs, so it overlaps encoding and the FAISS search on a second core), the two
candidate lists fused (`qpr.retrieval.fusion`) and the distances of the kept rows computed
from the stored vectors. Dependencies are numpy, onnxruntime, faiss, pyarrow and (for a
transformer bundle) tokenizers; torch and transformers are never imported (a service image
need not ship them, and importing torch costs seconds and ~0.5 GB).

Distances are FAISS's L2 distances, i.e. *squared* euclidean distances between embeddings
(smaller = closer), in the same units as the threshold the evaluate stage picks.

Deltas (`qpr.retrieval.deltas`): questions added since the main index was built, in
``deltas/``, are appended to the loaded index and BM25 at load; tombstoned rows are a row
mask applied inside the dense search and BM25, as a filter is (no over-fetch).

A loaded bundle is immutable; `search` may be called from several threads at once
(ONNX Runtime sessions and FAISS CPU searches are safe for concurrent reads).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq

from qpr.artifacts import (
    ANSWER_ID,
    BM25_FILE,
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
    SearchConfig,
    SearchConfigError,
    search_config_file,
)
from qpr.deltas.format import DeltaError, delta_files, load_parts
from qpr.errors import QPRError
from qpr.io import file_sha256, text_sha256
from qpr.retrieval.bm25 import BM25Index, lexical_search
from qpr.retrieval.dense import (
    IdMap,
    RowDistances,
    distances_to,
    ef_search_of,
    load_index,
    search,
)
from qpr.retrieval.encoders import embedding_dim, load_session, probe_cosine
from qpr.retrieval.folded import FoldedCNN, checked_fold
from qpr.retrieval.fusion import (
    candidate_union,
    fuse,
    fuse_union,
    fuse_union_one,
    scaled_at,
    values_at,
)
from qpr.retrieval.reranker import Reranker, RerankerError
from qpr.retrieval.selection import FieldValues, Filters, allowed_rows, both, normalised
from qpr.text import load_tokenizer
from qpr.text.vocab import Vocabulary, VocabularyError, pad_sequences

if TYPE_CHECKING:
    from qpr.text.wordpiece import WordPieceTokenizer

__all__ = [
    "HIT_FIELDS",
    "Bundle",
    "BundleError",
    "Explanation",
    "Hit",
    "IndexedQuestions",
    "QueryEncoder",
    "SearchResult",
]

# Questions encoded per ONNX call in search_batch: large enough to amortise the call,
# small enough that padding to the longest question of a chunk stays cheap.
_ENCODE_CHUNK = 256
_CACHED_MASKS = 64  # filters whose row masks a bundle keeps (N bools each)
log = logging.getLogger(__name__)


class BundleError(QPRError, RuntimeError):
    """A models directory is incomplete or its files do not belong together."""


@dataclass(frozen=True)
class Explanation:
    """A hit's first-stage score taken apart (``explain=True``).

    dense_distance: the hit's L2 distance to the query (`Hit.distance`).
    dense_scaled: the dense side before weighting. Fused: minus the distance, min-max scaled
        over the query's dense candidates to [0, 1]. Dense-only bundle: 1 / (1 + distance).
    bm25_score: the hit's BM25 score for the query; None in a bundle without BM25.
    bm25_scaled: the BM25 side before weighting: min-max scaled over the query's BM25
        candidates, 0 when BM25 did not return the hit; None without BM25.
    matched_words: the query's words whose stems the hit shares, as the query wrote them
        (lower-cased), in query order.
    dense_weight: α; 1.0 for a dense-only bundle.
    fused_score: α·dense_scaled + (1 - α)·bm25_scaled, the first stage's score. Re-ranking
        reorders hits but keeps this score.
    """

    dense_distance: float
    dense_scaled: float
    bm25_score: float | None
    bm25_scaled: float | None
    matched_words: tuple[str, ...]
    dense_weight: float
    fused_score: float

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (what ``explain`` holds in the service's and the CLI's hits)."""
        return {
            "dense_distance": self.dense_distance,
            "dense_scaled": self.dense_scaled,
            "bm25_score": self.bm25_score,
            "bm25_scaled": self.bm25_scaled,
            "matched_words": list(self.matched_words),
            "dense_weight": self.dense_weight,
            "fused_score": self.fused_score,
        }


# A hit's fields as every interface names them: the CLI's --json, the service's JSON and
# the MLflow pyfunc's columns (one set of names, so a client can switch between them).
HIT_FIELDS = ("answer_id", "question_id", "text", "cluster_id", "distance", "score")


@dataclass(frozen=True)
class Hit:
    """One indexed question found for a query.

    answer_id: the answer of the hit's paraphrase cluster. Logs: the logged answer_id.
        Quora pairs, which have no answers: the smallest question id of the cluster (of
        the question itself when it is in no cluster). None: the bundle predates answer
        ids (its questions table has no answer_id column).
    distance: FAISS L2 distance = squared euclidean distance between the two embeddings,
        >= 0, smaller = closer; the unit of the "no answer" threshold.
    score: what the hits are ranked by, higher first. Dense ranking: 1 / (1 + distance),
        in (0, 1], monotone in distance. Fused with BM25: α·dense + (1 - α)·BM25 after
        per-query min-max scaling, in [0, 1] (qpr.retrieval.fusion.fuse); the distance then
        need not grow with the rank. Neither is a calibrated probability.
    explain: the parts of the score, only when the search asked for them.
    """

    question_id: int
    text: str
    cluster_id: int  # -1: the question belongs to no paraphrase cluster
    distance: float
    score: float
    answer_id: str | None = None
    explain: Explanation | None = None

    def as_dict(self) -> dict[str, Any]:
        """`HIT_FIELDS`, plus ``explain`` when the search asked for it."""
        out: dict[str, Any] = {name: getattr(self, name) for name in HIT_FIELDS}
        if self.explain is not None:
            out["explain"] = self.explain.as_dict()
        return out


@dataclass(frozen=True)
class SearchResult:
    """Hits in rank order (closest first); answered = top-1 distance <= the threshold."""

    query: str
    hits: list[Hit]
    answered: bool


@dataclass(frozen=True)
class QueryEncoder:
    """What turns a question into a vector: the tokenizer and the encoder that queries go
    through (`qpr.artifacts.served_query_encoder`), checked to belong together.

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
    # bool [N]: rows a tombstone hides (`qpr.retrieval.deltas`); None: none is hidden
    dead: np.ndarray | None = None


class Bundle:
    """Encoder + vocabulary + index + questions + search config, loaded and checked together.

    Build one with `Bundle.load`; the constructor takes already-validated parts.
    """

    def __init__(
        self,
        *,
        models_dir: Path,
        encoder: QueryEncoder,
        questions: IndexedQuestions,
        config: SearchConfig,
        fingerprint: str,
        reranker: Reranker | None = None,
    ) -> None:
        self._models_dir = models_dir
        self._encoder = encoder
        self._reranker = reranker
        self._config = config
        self._fingerprint = fingerprint
        # Unpacked once: the search path reads plain attributes.
        self._vocab = encoder.vocab
        self._session = encoder.session
        self._max_len = encoder.max_len
        self._folded = encoder.folded
        self._int8_queries = encoder.int8
        self._student = encoder.student
        self._index = questions.index
        self._qids = questions.qids
        self._texts = questions.texts
        self._cluster_ids = questions.cluster_ids
        self._answer_ids = questions.answer_ids or [None] * len(questions.qids)
        self._id_map = IdMap(questions.qids)  # hit → row, for explain
        self._bm25 = questions.bm25
        self._fields = dict(questions.fields or {})
        # A service sees the same few filters (a tenant, a locale) again and again.
        self._masks = functools.lru_cache(maxsize=_CACHED_MASKS)(self._mask)
        dead = questions.dead if questions.dead is not None and questions.dead.any() else None
        self._dead_count = 0 if dead is None else int(dead.sum())
        # Tombstones are one more mask: applied inside the dense search and BM25 like a
        # filter, so a search needs no over-fetch and stays exact.
        self._live_rows = None if dead is None else ~dead
        if self._live_rows is not None:
            self._live_rows.flags.writeable = False
        self._threshold = config.threshold
        self._row_distances = RowDistances(questions.index)

    def with_questions(self, questions: IndexedQuestions, *, dense_only: bool = False) -> Bundle:
        """This bundle searching other questions: the same query encoder, search config
        (threshold, fusion, depth) and re-ranker over `questions` (their index and, when the
        config fuses, their BM25).

        dense_only: the dense ranking alone (no BM25, no re-ranking), same threshold.
        What `qpr evaluate --data` serves a file's questions with. The fingerprint stays
        this bundle's: it names the model, not the questions it searches.
        """
        config = self._config
        if dense_only:
            fused_only = ("dense_weight", "lexical_candidates", "dense_candidates", "rerank_top")
            depth = ("fused_nprobe", "fused_ef_search")
            config = replace(config, **dict.fromkeys(fused_only + depth))
        if config.fused and questions.bm25 is None:
            raise ValueError("this bundle fuses BM25 in: the questions need their BM25")
        if questions.index.d != self.dim:
            raise ValueError(f"{questions.index.d}-d index, the encoder gives {self.dim}")
        return Bundle(
            models_dir=self._models_dir,
            encoder=self._encoder,
            questions=questions,
            config=config,
            fingerprint=self._fingerprint,
            reranker=None if dense_only else self._reranker,
        )

    @property
    def filter_fields(self) -> tuple[str, ...]:
        """The metadata fields a search may filter on (sorted)."""
        return tuple(sorted(self._fields))

    def allowed(self, filters: Filters | None) -> np.ndarray | None:
        """bool [ntotal]: the rows matching `filters` (`qpr.retrieval.selection`) that no
        tombstone hides; None when there are neither filters nor tombstones. FilterError
        (a ValueError) names an unknown field and the known ones."""
        if not filters:
            return self._live_rows
        wanted = normalised(filters, list(self._fields))
        return self._masks(tuple(sorted((f, tuple(sorted(v))) for f, v in wanted.items())))

    def _mask(self, filters: tuple[tuple[str, tuple[str, ...]], ...]) -> np.ndarray:
        mask = both(
            allowed_rows(self._fields, dict(filters), int(self._index.ntotal)), self._live_rows
        )
        mask.flags.writeable = False  # shared by every search with these filters
        return mask

    @property
    def bm25(self) -> BM25Index | None:
        """The BM25 weights fused in (their `settings`: k1, b, stemmer); None: dense only."""
        return self._bm25

    # -- loading --------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        models_dir: str | os.PathLike[str],
        *,
        threads: int = 1,
        nprobe: int | None = None,
        ef_search: int | None = None,
        fold_encoder: bool = False,
    ) -> Bundle:
        """Load and cross-check the bundle in ``models_dir``.

        threads: ONNX Runtime intra-op threads. 1 is best for one question at a time (a
            thread pool costs more to wake than a single small CNN call takes); raise it
            for large search_batch calls. FAISS's OpenMP threads are left as the
            calling thread has them (libgomp keeps the limit per thread; the service
            sets it in each of its threads, `qpr.serve.openmp`).
        nprobe: inverted lists visited per query for an IVF index; None: the search
            config's (`qpr.artifacts.SearchConfig`, which documents the precedence), else
            the value stored in the index file. Ignored for indexes without inverted lists.
        ef_search: candidates kept per query for an HNSW index; None as for nprobe.
            Ignored for other indexes.
        fold_encoder: encode with the CNN's embedding folded into its convolution
            (`qpr.retrieval.folded`: 8x less time a question, w·V·C float32 more memory,
            0.7-1.0 s more to load for Quora's vocabulary), once the folded tables reproduced
            the ONNX model on probe questions. Other encoders, or a mismatch (logged),
            keep ONNX Runtime; `encoder_kernel` says which one encodes.

        A bundle with ``index/query_encoder.onnx`` encodes queries with it (int8, what its
        evaluation measured); it must have been quantised from this ``encoder.onnx``.
        A bundle with ``student/query_encoder.onnx`` encodes queries with that query
        student; it must have been trained against this ``encoder.onnx`` (its sha256), and
        its vectors of its probe questions must lie near encoder.onnx's.
        A search config with ``rerank_top`` loads the cross-encoder of ``rerank/``
        (`qpr.retrieval.reranker`); its files then count in the fingerprint.

        Raises BundleError (naming the file) when a file is missing or unreadable, or the
        files do not belong together; ValueError for a bad argument.
        """
        _check_arguments(threads, nprobe, ef_search)
        root = Path(models_dir)
        paths, config = _bundle_files(root)
        paths |= _rerank_files(root, config)
        paths |= _delta_paths(root)
        # The files are stat'ed before and after loading: the pipeline replaces them by
        # rename, and a bundle assembled from files of two different runs must not start.
        before = _signatures(paths.values())
        digests = {rel: file_sha256(path) for rel, path in paths.items()}
        encoder = _load_encoder(paths, digests[ENCODER_FILE], threads)
        served_nprobe, served_ef_search = config.depth()
        index = _load_index(
            paths[INDEX_FILE],
            encoder,
            nprobe=served_nprobe if nprobe is None else nprobe,
            ef_search=served_ef_search if ef_search is None else ef_search,
        )
        questions = _with_deltas(root, _load_questions(paths, index, config))
        reranker = _load_reranker(root, config, threads)
        if fold_encoder and not encoder.int8:
            encoder = replace(
                encoder, folded=checked_fold(encoder.path, encoder.session, encoder.max_len)
            )
        if _signatures(paths.values()) != before:
            raise BundleError(f"files in {root} changed while loading; load again")
        return cls(
            models_dir=root,
            encoder=encoder,
            questions=questions,
            config=config,
            fingerprint=_fingerprint(digests),
            reranker=reranker,
        )

    # -- properties -----------------------------------------------------------------------

    @property
    def models_dir(self) -> Path:
        return self._models_dir

    @property
    def dim(self) -> int:
        """D: the embedding width (encoder output = index dimension)."""
        return int(self._index.d)

    @property
    def size(self) -> int:
        """Number of questions a search can return (the deltas' included, the tombstoned
        ones not)."""
        return int(self._index.ntotal) - self._dead_count

    @property
    def threshold(self) -> float | None:
        """The stored "no answer" distance threshold; None when the pipeline chose none."""
        return self._threshold

    @property
    def max_len(self) -> int:
        """Tokens per question the encoder was trained with; longer questions are cut."""
        return self._max_len

    @property
    def nprobe(self) -> int | None:
        """Inverted lists probed per query; None for an index without them."""
        try:
            return int(faiss.extract_index_ivf(self._index).nprobe)
        except RuntimeError:  # not an IVF index
            return None

    @property
    def ef_search(self) -> int | None:
        """HNSW candidates kept per query; None for an index without a graph."""
        return ef_search_of(self._index)

    @property
    def fusion(self) -> dict[str, float] | None:
        """{"dense_weight": α, "candidates": C, "dense_candidates": Cd, "nprobe": n or
        "ef_search": e} when BM25 is fused in (the last two absent from bundles written
        before candidates were scored exactly); None: dense only."""
        return self._config.fusion

    @property
    def search_config(self) -> SearchConfig:
        """How this bundle is searched (search.json, or an older bundle's threshold.json)."""
        return self._config

    @property
    def encoder_kernel(self) -> str:
        """ "folded" (the CNN's lookup tables, `qpr.retrieval.folded`), "onnx-int8" (ONNX
        Runtime, the int8 query encoder, `qpr.model.quantize`) or "onnx" (ONNX Runtime)."""
        if self._folded is not None:
            return "folded"
        return "onnx-int8" if self._int8_queries else "onnx"

    @property
    def asymmetric(self) -> bool:
        """True when queries go through a query student (student/query_encoder.onnx) and
        the index holds the document encoder's (encoder.onnx's) vectors."""
        return self._student

    @property
    def fingerprint(self) -> str:
        """sha256 over the bundle's files (six, `qpr.artifacts.REQUIRED_FILES`; one more with
        BM25, one more with an int8 query encoder, those of ``rerank/`` when it re-ranks,
        the deltas' manifest and files when it has some, `qpr.retrieval.deltas`): each
        file's path and sha256, in a fixed order. An added delta or a tombstone changes it.

        Identifies the bundle: equal fingerprints mean byte-identical models, so a service
        can report which model answered and a cache can key on it.
        """
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"Bundle({str(self._models_dir)!r}, size={self.size}, dim={self.dim}, "
            f"threshold={self._threshold}, fingerprint={self._fingerprint[:12]})"
        )

    # -- search ---------------------------------------------------------------------------

    def search(
        self,
        question: str,
        k: int = 10,
        *,
        threshold: float | None = None,
        explain: bool = False,
        filters: Filters | None = None,
    ) -> SearchResult:
        """The k indexed questions closest to ``question``, closest first.

        k is clipped to the index size. threshold: None uses the bundle's (answered = any
        hit when the bundle has none); pass math.inf to answer every query with a hit.
        explain: each hit carries its `Explanation` (the parts of its score).
        filters: {field: value or [values]} on the questions' metadata (`filter_fields`):
        only matching questions are searched, by the dense search and BM25 alike, so the
        hits are those of a bundle of the matching questions alone (BM25 keeping the whole
        collection's weights). No match: no hits. FilterError for an unknown field.
        ValueError for an empty question or one with no words after normalisation.
        """
        return self.search_batch(
            [question], k, threshold=threshold, explain=explain, filters=filters
        )[0]

    def search_batch(
        self,
        questions: Sequence[str],
        k: int = 10,
        *,
        threshold: float | None = None,
        explain: bool = False,
        filters: Filters | None = None,
    ) -> list[SearchResult]:
        """`search` for many questions: one encoder call (ONNX: per 256 questions), one FAISS
        search. filters: as in `search`, the same for every question.

        Results are those of `search` on each question (the encoder is padding-invariant,
        so batching changes speed, not vectors). ValueError names the first bad question.
        With a re-ranker (``rerank_top`` N) the first stage finds max(k, N) hits, the
        cross-encoder re-orders the first N of each, and the first k are kept.
        explain: each hit carries its `Explanation`; it searches each question's
        candidates again, so it costs about one more search a question.
        """
        allowed = self.allowed(filters)
        if self._reranker is None or self._config.rerank_top is None:
            results = self._first_stage(questions, k, threshold, allowed)
            first_k = k
        else:
            if k < 1:
                raise ValueError(f"k must be >= 1, got {k}")
            top = self._config.rerank_top
            first_k = max(k, top)
            limit = self._threshold if threshold is None else float(threshold)
            results = [
                _reranked(result, self._reranker.rerank(result.query, result.hits, top)[:k], limit)
                for result in self._first_stage(questions, first_k, threshold, allowed)
            ]
        if explain:
            results = [
                self._explained(result, min(first_k, self.size), allowed) for result in results
            ]
        return results

    def _first_stage(
        self,
        questions: Sequence[str],
        k: int,
        threshold: float | None,
        allowed: np.ndarray | None = None,
    ) -> list[SearchResult]:
        """The dense (or fused) search of `search_batch`, before any re-ranking, over the
        rows `allowed` lets through (bool [size]; None: all)."""
        if isinstance(questions, str):
            # A str is a Sequence[str] of characters: almost certainly a caller's mistake.
            raise TypeError("search_batch takes a sequence of questions, not one string")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        limit = self._threshold if threshold is None else float(threshold)
        if limit is not None and math.isnan(limit):
            raise ValueError("threshold must be a number, got NaN")
        if not questions:
            return []
        sequences = [self._tokens(q, i, len(questions)) for i, q in enumerate(questions)]
        k = min(k, self.size)
        if allowed is not None and not allowed.any():  # nothing matches: no hits, no search
            return [SearchResult(query=q, hits=[], answered=False) for q in questions]
        if self._bm25 is not None:
            lexical_candidates = self._config.lexical_candidates
            assert lexical_candidates is not None  # a fused config has them
            candidates = min(max(k, lexical_candidates), self.size)
            if len(questions) == 1 and self._config.dense_candidates is not None:
                return [
                    self._fused_one(questions[0], sequences[0], (candidates, k), limit, allowed)
                ]
            lexical = _lexical_pool().submit(
                lexical_search, self._bm25, questions, candidates, allowed=allowed
            )
            vectors = self._embed(sequences)
            distances, rows, scores = self._fused(vectors, lexical, candidates, k, allowed)
            return [
                self._result(q, d, r, limit, s)
                for q, d, r, s in zip(
                    questions, distances.tolist(), rows.tolist(), scores.tolist(), strict=True
                )
            ]
        vectors = self._embed(sequences)
        distances, rows = search(self._index, vectors, k, allowed=allowed)
        return [
            self._result(q, d, r, limit)
            for q, d, r in zip(questions, distances.tolist(), rows.tolist(), strict=True)
        ]

    # -- internals ------------------------------------------------------------------------

    def _tokens(self, question: str, position: int, count: int) -> list[int]:
        where = "" if count == 1 else f" (question {position})"
        if not isinstance(question, str):
            raise TypeError(f"a question must be a str, got {type(question).__name__}{where}")
        if not question.strip():
            raise ValueError(f"empty question{where}: nothing to search for")
        ids = self._vocab.encode(question)
        if not ids:
            # Only punctuation/symbols: the encoder would see padding alone, and its vector
            # (the same for every such input) has no meaningful neighbours.
            raise ValueError(f"question {question!r}{where} has no words after normalisation")
        return ids[: self._max_len]

    def _embed(self, sequences: list[list[int]]) -> np.ndarray:
        """float32 [N, D] in input order (the folded CNN, else one ONNX call when N <= 256)."""
        if self._folded is not None:
            return self._folded.encode(sequences)
        if len(sequences) == 1:  # the single-question path: no sorting, no scatter
            token_ids = np.asarray(sequences, dtype=np.int64)
            return self._session.run([OUTPUT_NAME], {INPUT_NAME: token_ids})[0]
        out = np.empty((len(sequences), self.dim), dtype=np.float32)
        # Length-sorted chunks: each is padded only to its own longest question.
        order = np.argsort([len(s) for s in sequences], kind="stable")
        for start in range(0, len(order), _ENCODE_CHUNK):
            idx = order[start : start + _ENCODE_CHUNK]
            token_ids, _ = pad_sequences([sequences[i] for i in idx], max_len=self._max_len)
            out[idx] = self._session.run([OUTPUT_NAME], {INPUT_NAME: token_ids})[0]
        return out

    def _fused(
        self,
        vectors: np.ndarray,
        lexical: Future[tuple[np.ndarray, np.ndarray]],
        candidates: int,
        k: int,
        allowed: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(distances, rows, fused scores) [Q, k] of dense + BM25 candidates fused; the
        BM25 candidates come from `lexical`, a search already running (over the same
        `allowed` rows: the union then holds allowed rows only)."""
        config = self._config
        assert config.dense_weight is not None
        weight = config.dense_weight
        if config.dense_candidates is None:  # bundles evaluated before exact scoring
            dense_distances, dense_rows = search(self._index, vectors, candidates, allowed=allowed)
            lexical_scores, lexical_rows = lexical.result()
            scores, rows = fuse(
                -dense_distances, dense_rows, lexical_scores, lexical_rows, weight, k
            )
            return distances_to(self._index, vectors, rows), rows, scores
        # Every candidate of both retrievers scored by its exact distance, as evaluated.
        wanted = min(max(k, config.dense_candidates), self.size)
        _, dense_rows = search(self._index, vectors, wanted, allowed=allowed)
        lexical_scores, lexical_rows = lexical.result()
        union = candidate_union(dense_rows, lexical_rows)
        distances = distances_to(self._index, vectors, union)
        scores, rows = fuse_union(-distances, union, lexical_scores, lexical_rows, weight, k)
        return values_at(union, distances, rows), rows, scores

    def _fused_one(
        self,
        question: str,
        tokens: list[int],
        depth: tuple[int, int],
        limit: float | None,
        allowed: np.ndarray | None,
    ) -> SearchResult:
        """One question fused (the service's path): `_fused`'s ranking with less around
        it. The union's distances come from `RowDistances` (the stored vectors looked up
        once per bundle) and the kept hits' distances are read at the slots the fusion
        returns instead of being searched for again. BM25 reads the question's words on
        the worker thread too: the request thread goes straight to the encoder.
        depth: (BM25 candidates, k)."""
        config = self._config
        candidates, k = depth
        assert self._bm25 is not None and config.dense_candidates is not None
        lexical = _lexical_pool().submit(self._bm25.search, question, candidates, allowed=allowed)
        vector = self._embed([tokens])
        wanted = min(max(k, config.dense_candidates), self.size)
        _, dense_rows = search(self._index, vector, wanted, allowed=allowed)
        lexical_scores, lexical_rows = lexical.result()
        union = candidate_union(dense_rows, lexical_rows[None])[0]
        union = union[union >= 0]
        distances = self._row_distances(vector, union)
        weight = config.dense_weight
        assert weight is not None
        scores, slots = fuse_union_one(-distances, union, lexical_scores, lexical_rows, weight, k)
        return self._result(
            question, distances[slots].tolist(), union[slots].tolist(), limit, scores.tolist()
        )

    def _explained(
        self, result: SearchResult, k: int, allowed: np.ndarray | None = None
    ) -> SearchResult:
        """`result` with each hit's `Explanation`: the query's candidates found again as
        the first stage found them with `k`, and each side's scaled share read for the hits."""
        if not result.hits:
            return result
        hits = result.hits
        if self._bm25 is None:
            parts = [Explanation(h.distance, h.score, None, None, (), 1.0, h.score) for h in hits]
            return replace(
                result, hits=[replace(h, explain=e) for h, e in zip(hits, parts, strict=True)]
            )
        config = self._config
        weight, lexical_candidates = config.dense_weight, config.lexical_candidates
        assert weight is not None and lexical_candidates is not None  # a fused config
        rows = self._id_map.to_rows(np.asarray([h.question_id for h in hits], np.int64))
        vector = self._embed([self._tokens(result.query, 0, 1)])
        candidates = min(max(k, lexical_candidates), self.size)
        lexical_scores, lexical_rows = self._bm25.search(result.query, candidates, allowed=allowed)
        if config.dense_candidates is None:  # bundles evaluated before exact scoring
            dense_distances, dense_rows = search(self._index, vector, candidates, allowed=allowed)
            dense_rows, dense_sims = dense_rows[0], -dense_distances[0]
        else:
            _, dense_rows = search(
                self._index,
                vector,
                min(max(k, config.dense_candidates), self.size),
                allowed=allowed,
            )
            union = candidate_union(dense_rows, lexical_rows[None])[0]
            dense_rows = union[union >= 0]
            dense_sims = -self._row_distances(vector, dense_rows)
        dense = scaled_at(dense_sims, dense_rows, rows).tolist()
        lexical = scaled_at(lexical_scores, lexical_rows, rows).tolist()
        explained = []
        for i, (hit, row) in enumerate(zip(hits, rows.tolist(), strict=True)):
            bm25_score, words = self._bm25.matches(result.query, row)
            part = Explanation(
                hit.distance, dense[i], bm25_score, lexical[i], words, weight, hit.score
            )
            explained.append(replace(hit, explain=part))
        return replace(result, hits=explained)

    def _result(
        self,
        query: str,
        distances: list[float],
        rows: list[int],
        limit: float | None,
        scores: list[float] | None = None,
    ) -> SearchResult:
        hits = [
            Hit(
                question_id=int(self._qids[row]),
                text=self._texts[row],
                cluster_id=int(self._cluster_ids[row]),
                answer_id=self._answer_ids[row],
                # FAISS's float arithmetic can give -1e-7 for an identical vector.
                distance=max(distance, 0.0),
                score=1.0 / (1.0 + max(distance, 0.0)) if scores is None else scores[i],
            )
            for i, (distance, row) in enumerate(zip(distances, rows, strict=True))
            if row >= 0  # -1: an IVF search probed too few lists to fill k
        ]
        answered = bool(hits) and (limit is None or hits[0].distance <= limit)
        return SearchResult(query=query, hits=hits, answered=answered)


def _reranked(result: SearchResult, hits: list[Hit], limit: float | None) -> SearchResult:
    """`result` with re-ranked hits; answered judges the new first hit's distance."""
    answered = bool(hits) and (limit is None or hits[0].distance <= limit)
    return SearchResult(query=result.query, hits=hits, answered=answered)


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
    for optional in (QUERY_ENCODER_FILE, STUDENT_FILE):
        if (root / optional).is_file():
            paths[optional] = root / optional
    return paths, config


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


def _delta_paths(root: Path) -> dict[Path, Path]:
    """The deltas' files (`qpr.retrieval.deltas`), hashed into the fingerprint."""
    try:
        return {rel: root / rel for rel in delta_files(root)}
    except DeltaError as exc:
        raise BundleError(str(exc)) from exc


def _with_deltas(root: Path, questions: IndexedQuestions) -> IndexedQuestions:
    """`questions` with the manifest's deltas appended and its tombstones as the dead
    mask; BundleError for a broken delta (the reloader then keeps the state it serves)."""
    if not (root / DELTAS_MANIFEST_FILE).is_file():
        return questions
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
    return IndexedQuestions(
        parts.index,
        parts.qids,
        parts.texts,
        parts.cluster_ids,
        parts.bm25,
        parts.answer_ids,
        _extended_fields(questions.fields, parts.answer_ids, int(parts.index.ntotal)),
        parts.dead,
    )


def _extended_fields(
    fields: Mapping[str, FieldValues] | None, answer_ids: list[str | None] | None, n: int
) -> dict[str, FieldValues]:
    """The main index's filter fields over all `n` rows, the deltas' appended: their
    answer ids, and null (no filter matches it) for metadata a delta does not keep."""
    out: dict[str, FieldValues] = {}
    for name, field in (fields or {}).items():
        if name == ANSWER_ID and answer_ids is not None:
            out[name] = FieldValues.of(answer_ids)
            continue
        codes = np.full(n, -1, np.int32)
        codes[: field.codes.size] = field.codes
        out[name] = FieldValues(field.values, codes)
    return out


def _load_reranker(root: Path, config: SearchConfig, threads: int) -> Reranker | None:
    if config.rerank_top is None:
        return None
    try:
        return Reranker.load(root, threads=threads)
    except RerankerError as exc:
        raise BundleError(str(exc)) from exc


def _load_encoder(paths: Mapping[Path, Path], encoder_sha256: str, threads: int) -> QueryEncoder:
    """The tokenizer and the encoder queries go through, checked against each other: the
    encoder was exported with this vocabulary and truncates where the tokenizer does."""
    vocab_path = paths[VOCAB_FILE]
    try:
        vocab = load_tokenizer(vocab_path)
    except VocabularyError as exc:
        raise BundleError(str(exc)) from exc
    student = STUDENT_FILE in paths
    int8 = QUERY_ENCODER_FILE in paths and not student
    if student:
        path = paths[STUDENT_FILE]
        session, metadata, dim = _student_encoder(
            path, paths[ENCODER_FILE], encoder_sha256, vocab, threads
        )
    elif int8:  # quantised from encoder.onnx, its metadata copied: open it alone
        path = paths[QUERY_ENCODER_FILE]
        session, metadata, dim = _query_encoder(path, paths[ENCODER_FILE], encoder_sha256, threads)
    else:
        path = paths[ENCODER_FILE]
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
    import json

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


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _lexical_pool() -> ThreadPoolExecutor:
    """One pool per process for the BM25 half of fused searches, shared by every bundle
    (a reloaded bundle leaves no threads behind), one worker per core."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = max(1, os.cpu_count() or 1)
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qpr-bm25")
        return _POOL


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

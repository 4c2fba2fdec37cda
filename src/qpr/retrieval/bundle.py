"""The trained model as the search command and the search service load it: no torch.

A bundle is the ``models/`` directory the pipeline writes; its files and its search
config are defined once, in `qpr.artifacts` (vocabulary, encoder, FAISS index, id map,
question table, ``search.json``, and optionally BM25 weights and an int8 query encoder).

`Bundle.load` refuses a directory whose files do not belong together (`BundleError` naming
the file): a vocabulary other than the one the encoder was trained with, an index built by
another encoder width, an id map or question table of another index. Such a mix would not
fail later, it would return plausible but wrong neighbours, so it must fail here.

Query path per batch of questions: with search.json's ``spelling``, unknown words put back
to the indexed questions' words one edit away (`qpr.text.spelling`) → the tokenizer's
``encode`` → one ONNX Runtime call (or,
loaded with ``fold_encoder``, a CNN's or static student's tables, `qpr.retrieval.folded`) →
one FAISS search; with fusion also BM25 over the question's words (on a worker thread,
started before the encoder runs, so it overlaps encoding and the FAISS search on a second
core), the two candidate lists fused (`qpr.retrieval.fusion`) and the distances of the kept
rows computed from the stored vectors. Dependencies are numpy, onnxruntime, faiss, pyarrow
and (for a transformer bundle) tokenizers; torch and transformers are never imported (a
service image need not ship them, and importing torch costs seconds and ~0.5 GB).

Distances are FAISS's L2 distances, i.e. *squared* euclidean distances between embeddings
(smaller = closer), in the same units as the threshold the evaluate stage picks.

Deltas (`qpr.deltas`): questions added since the main index was built, in
``deltas/``, are appended to the loaded index and BM25 at load; tombstoned rows are a row
mask applied inside the dense search and BM25, as a filter is (no over-fetch). A delta
that fails its check is left out and named (`Bundle.failed_deltas`).

A loaded bundle is immutable; `search` may be called from several threads at once
(ONNX Runtime sessions and FAISS CPU searches are safe for concurrent reads).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from qpr.artifacts import SearchConfig
from qpr.ids import with_id_texts
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.companion import Companion
from qpr.retrieval.dense import IdMap, ef_search_of
from qpr.retrieval.encoders import embed_sequences
from qpr.retrieval.hybrid import HybridSearch, Ranking, answered
from qpr.retrieval.loading import BundleError, IndexedQuestions, QueryEncoder, load_bundle_parts
from qpr.retrieval.reranker import Reranker
from qpr.retrieval.selection import Filters, allowed_rows, both, normalised
from qpr.text.spelling import Speller

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

_CACHED_MASKS = 64  # filters whose row masks a bundle keeps (N bools each)


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
# There the ids are decimal strings (`Hit.as_dict`, `qpr.ids`).
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
        per-query min-max scaling, in [0, 1] (qpr.retrieval.hybrid.fuse); the distance then
        need not grow with the rank; the top hit of any query, gibberish included, then
        scores about 1. Neither is a calibrated probability: distance and `answered` judge
        how good a match is.
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
        """The hit as every client-facing JSON carries it: `HIT_FIELDS`, question_id and
        cluster_id as decimal strings (64-bit ids lose digits as JSON numbers: `qpr.ids`),
        plus ``explain`` when the search asked for it. The attributes keep the int ids."""
        out: dict[str, Any] = with_id_texts({name: getattr(self, name) for name in HIT_FIELDS})
        if self.explain is not None:
            out["explain"] = self.explain.as_dict()
        return out


@dataclass(frozen=True)
class SearchResult:
    """Hits in rank order (closest first); answered = top-1 distance <= the threshold and,
    in a bundle with answer ids, the top hit has one (a question listed without an answer
    is found, but answers nothing)."""

    query: str
    hits: list[Hit]
    answered: bool


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
        failed_deltas: Mapping[int, str] | None = None,
        companion: Companion | None = None,
    ) -> None:
        self._models_dir = models_dir
        self._companion = companion
        self._failed_deltas = dict(failed_deltas or {})
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
        # Built from the questions served, so added questions' words are known at once and
        # a deleted question's words are not (a typo'd query must not be put back to them).
        self._speller = _speller(questions) if config.spelling else None
        self._cluster_ids = questions.cluster_ids
        self._answer_ids = questions.answer_ids or [None] * len(questions.qids)
        # Rows a search may answer with: every row of a bundle that predates answer ids,
        # else those with an answer (a question list added without answer ids has none).
        self._answerable = (
            None
            if questions.answer_ids is None
            else np.array([a is not None for a in questions.answer_ids], bool)
        )
        self._id_map = IdMap(questions.qids)  # hit → row, for explain
        self._bm25 = questions.bm25
        self._fields = dict(questions.fields or {})
        dead = questions.dead if questions.dead is not None and questions.dead.any() else None
        self._dead_count = 0 if dead is None else int(dead.sum())
        # Tombstones are one more mask: applied inside the dense search and BM25 like a
        # filter, so a search needs no over-fetch and stays exact.
        self._live_rows = None if dead is None else ~dead
        if self._live_rows is not None:
            self._live_rows.flags.writeable = False
        # A service sees the same few filters (a tenant, a locale) again and again. The
        # cache holds what a mask needs, not the bundle: a cache of a bound method made a
        # reference cycle, so a bundle swapped out waited for a full garbage collection
        # (RSS grew by about a bundle a hot swap; benchmarks/swap_memory.py).
        self._masks = functools.lru_cache(maxsize=_CACHED_MASKS)(
            functools.partial(_mask, self._fields, self._live_rows, int(questions.index.ntotal))
        )
        self._threshold = config.threshold
        self._ranker = HybridSearch(
            questions.index,
            config,
            bm25=questions.bm25,
            texts=questions.texts,
            reranker=reranker,
            size=self.size,
            companion=companion if config.companion_weight else None,
        )

    def with_questions(self, questions: IndexedQuestions, *, dense_only: bool = False) -> Bundle:
        """This bundle searching other questions: the same query encoder, search config
        (threshold, fusion, depth) and re-ranker over `questions` (their index and, when the
        config fuses, their BM25).

        dense_only: the dense ranking alone (no BM25, no re-ranking), same threshold.
        What `qpr evaluate FILE` serves a file's questions with. The fingerprint stays
        this bundle's: it names the model, not the questions it searches.
        """
        config = self._config
        if dense_only:
            fused_only = ("dense_weight", "lexical_candidates", "dense_candidates", "rerank_top")
            depth = ("fused_nprobe", "fused_ef_search", "companion", "companion_weight")
            config = replace(config, **dict.fromkeys(fused_only + depth))
        companion = None
        if self._companion is not None and config.companion_weight:
            # its vectors of the other questions: a static encoder, fast (3.3 s for
            # Quora's 134k questions in the index stage, 2 cores)
            encoder = self._companion.encoder
            companion = Companion(encoder, encoder.documents(questions.texts))
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
            failed_deltas=self._failed_deltas,
            companion=companion,
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
            for large search_batch calls. FAISS runs a one-question search on one
            OpenMP thread and a batch on the calling thread's limit, which is put back
            after either (`qpr.retrieval.dense.faiss_threads`; the service sets it in
            each of its threads, `qpr.serve.openmp`).
        nprobe: inverted lists visited per query for an IVF index; None: the search
            config's (`qpr.artifacts.SearchConfig`, which documents the precedence), else
            the value stored in the index file. Ignored for indexes without inverted lists.
        ef_search: candidates kept per query for an HNSW index; None as for nprobe.
            Ignored for other indexes.
        fold_encoder: encode with the CNN's embedding folded into its convolution
            (`qpr.retrieval.folded`: 8x less time a question, w·V·C float32 more memory,
            0.7-1.0 s more to load for Quora's vocabulary), or a static query student's
            projection folded into its table (7x less), once the folded tables reproduced
            the ONNX model on probe questions. Other encoders, or a mismatch (logged),
            keep ONNX Runtime; `encoder_kernel` says which one encodes.

        Queries go through the encoder search.json declares (``query_encoder``; older
        bundles: the one their files say, `qpr.artifacts.migrate`). The int8
        ``index/query_encoder.onnx`` must have been quantised from this ``encoder.onnx``.
        A query student (``student/query_encoder.onnx``) must have been trained against
        this ``encoder.onnx`` (its sha256), and its vectors of its probe questions must lie
        near encoder.onnx's. The checks live in `qpr.retrieval.loading`.
        A search config with ``rerank_top`` loads the cross-encoder of ``rerank/``
        (`qpr.retrieval.reranker`); its files then count in the fingerprint.

        Raises BundleError (naming the file) when a file is missing or unreadable, or the
        files do not belong together; ValueError for a bad argument.
        """
        # The arguments are checked there (ValueError) before any file is read.
        parts = load_bundle_parts(
            models_dir,
            threads=threads,
            nprobe=nprobe,
            ef_search=ef_search,
            fold_encoder=fold_encoder,
        )
        return cls(
            models_dir=parts.root,
            encoder=parts.encoder,
            questions=parts.questions,
            config=parts.config,
            fingerprint=parts.fingerprint,
            reranker=parts.reranker,
            failed_deltas=parts.failed_deltas,
            companion=parts.companion,
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
        """ "folded" (a CNN's or a static student's tables, `qpr.retrieval.folded`),
        "onnx-int8" (ONNX Runtime, the int8 query encoder, `qpr.model.quantize`) or "onnx"
        (ONNX Runtime)."""
        if self._folded is not None:
            return "folded"
        return "onnx-int8" if self._int8_queries else "onnx"

    @property
    def asymmetric(self) -> bool:
        """True when queries go through a query student (student/query_encoder.onnx) and
        the index holds the document encoder's (encoder.onnx's) vectors."""
        return self._student

    @property
    def failed_deltas(self) -> dict[int, str]:
        """{delta number: why it failed its check}: the deltas left out of this load
        (`qpr.deltas.format`); empty when every delta serves."""
        return dict(self._failed_deltas)

    @property
    def fingerprint(self) -> str:
        """sha256 over the bundle's files (six, `qpr.artifacts.REQUIRED_FILES`; one more with
        BM25, one more with an int8 query encoder, those of ``rerank/`` when it re-ranks,
        the deltas' manifest and files when it has some, `qpr.deltas`): each
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
        exclude: Sequence[int] | None = None,
    ) -> list[SearchResult]:
        """`search` for many questions: one encoder call (ONNX: per 256 questions), one FAISS
        search, then the served ranking (`qpr.retrieval.hybrid.HybridSearch.rank`).
        filters: as in `search`, the same for every question.

        Results are those of `search` on each question (the encoder is padding-invariant,
        so batching changes speed, not vectors). ValueError names the first bad question.
        With a re-ranker (``rerank_top`` N) the first stage finds max(k, N) hits, the
        cross-encoder re-orders the first N of each, and the first k are kept.
        explain: each hit carries its `Explanation`; it searches each question's
        candidates again, so it costs about one more search a question.
        exclude: one question id per question, left out of that question's candidates as
        if it were not indexed (an evaluation's "itself excluded"); -1: none.
        """
        allowed = self.allowed(filters)
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
        texts = self._corrected(questions)
        sequences = [self._tokens(q, i, len(texts)) for i, q in enumerate(texts)]
        rows = None if exclude is None else self._excluded_rows(exclude, len(questions))
        if allowed is not None and not allowed.any():  # nothing matches: no hits, no search
            return [SearchResult(query=q, hits=[], answered=False) for q in questions]
        ranking = self._ranker.rank(
            texts, lambda: self._embed(sequences), k, allowed=allowed, exclude=rows
        )
        served = answered(ranking, limit)
        if self._answerable is not None and ranking.rows.shape[1]:
            top = ranking.rows[:, 0]
            served &= self._answerable[np.maximum(top, 0)] & (top >= 0)
        results = [
            SearchResult(query=q, hits=self._hits(ranking, i), answered=bool(served[i]))
            for i, q in enumerate(questions)
        ]
        if explain:
            depth = self._ranker.depth(k)
            results = [
                self._explained(result, depth, allowed, text)
                for result, text in zip(results, texts, strict=True)
            ]
        return results

    def embed(self, questions: Sequence[str], batch: int = 256) -> np.ndarray:
        """float32 [N, D]: the vectors a search looks up for `questions` (the query encoder,
        the student where the bundle has one), in input order. ValueError names the first
        question with no words."""
        if isinstance(questions, str):
            raise TypeError("embed takes a sequence of questions, not one string")
        texts = self._corrected(questions)
        sequences = [self._tokens(q, i, len(texts)) for i, q in enumerate(texts)]
        parts = [self._embed(sequences[s : s + batch]) for s in range(0, len(sequences), batch)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)

    def document_neighbours(
        self, questions: Sequence[str], k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(distances float32 [N, k], question ids int64 [N, k]; -1: none) of `questions`
        encoded by the document encoder and looked up in the dense index alone, the
        deleted questions left out. An indexed question comes back at distance ~0 when the
        index was built by that encoder: the service's canary check. Neither BM25 nor the
        fusion weights take part (with BM25 weighing most, a shorter question sharing the
        words can rank first). A bundle whose queries go through a student loads the
        document encoder (encoder.onnx; the student lands near, never on, a question);
        another encodes as it serves (`embed`: its folded kernel when it has one)."""
        from qpr.artifacts import ENCODER_FILE
        from qpr.retrieval.dense import search
        from qpr.retrieval.encoders import encode, load_session

        if self.asymmetric:
            session = load_session(self._models_dir / ENCODER_FILE)
            vectors = encode(session, self._vocab, list(questions), max_len=self._max_len)
        else:
            vectors = self.embed(questions)
        distances, rows = search(
            self._index, vectors, min(k, int(self._index.ntotal)), allowed=self._live_rows
        )
        qids = np.asarray(self._qids, np.int64)
        return distances, np.where(rows >= 0, qids[np.maximum(rows, 0)], -1)

    # -- internals ------------------------------------------------------------------------

    def _excluded_rows(self, exclude: Sequence[int], count: int) -> np.ndarray:
        ids = np.asarray(exclude, np.int64)
        if ids.shape != (count,):
            raise ValueError(f"exclude needs one question id per question, got {ids.shape}")
        return self._id_map.to_rows(ids)

    def _corrected(self, questions: Sequence[str]) -> list[str]:
        """The texts searched for `questions`: their unknown words spelled as the indexed
        questions spell them when the config says `spelling`. Non-strings pass through, for
        `_tokens` to name."""
        if self._speller is None:
            return list(questions)
        return [self._speller.correct(q) if isinstance(q, str) else q for q in questions]

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
        return embed_sequences(self._session, sequences, max_len=self._max_len, dim=self.dim)

    def _explained(
        self, result: SearchResult, k: int, allowed: np.ndarray | None, text: str
    ) -> SearchResult:
        """`result` with each hit's `Explanation`: the query's candidates (`text`, the query
        as searched) found again as the first stage found them with `k`, and each side's
        scaled share read for the hits."""
        if not result.hits:
            return result
        hits = result.hits
        if self._bm25 is None:
            parts = [Explanation(h.distance, h.score, None, None, (), 1.0, h.score) for h in hits]
            return replace(
                result, hits=[replace(h, explain=e) for h, e in zip(hits, parts, strict=True)]
            )
        weight = self._config.dense_weight
        assert weight is not None  # a fused config
        rows = self._id_map.to_rows(np.asarray([h.question_id for h in hits], np.int64))
        vector = self._embed([self._tokens(text, 0, 1)])
        dense, lexical = self._ranker.shares(text, vector, rows, k, allowed)
        explained = []
        for hit, row, dense_share, lexical_share in zip(
            hits, rows.tolist(), dense.tolist(), lexical.tolist(), strict=True
        ):
            bm25_score, words = self._bm25.matches(text, row)
            part = Explanation(
                hit.distance, dense_share, bm25_score, lexical_share, words, weight, hit.score
            )
            explained.append(replace(hit, explain=part))
        return replace(result, hits=explained)

    def _hits(self, ranking: Ranking, i: int) -> list[Hit]:
        """Query i's hits: its found rows (-1: an IVF search probed too few lists to fill
        k) with their questions, distances and scores."""
        scores = None if ranking.scores is None else ranking.scores[i].tolist()
        hits = []
        for slot, (row, distance) in enumerate(
            zip(ranking.rows[i].tolist(), ranking.distances[i].tolist(), strict=True)
        ):
            if row < 0:
                continue
            distance = max(distance, 0.0)  # FAISS can give -1e-7 for an identical vector
            hits.append(
                Hit(
                    question_id=int(self._qids[row]),
                    text=self._texts[row],
                    cluster_id=int(self._cluster_ids[row]),
                    answer_id=self._answer_ids[row],
                    distance=distance,
                    score=1.0 / (1.0 + distance) if scores is None else scores[slot],
                )
            )
        return hits


def _speller(questions: IndexedQuestions) -> Speller:
    """A speller of the questions no tombstone hides."""
    dead = questions.dead
    if dead is None or not dead.any():
        return Speller.from_texts(questions.texts)
    return Speller.from_texts(t for t, gone in zip(questions.texts, dead, strict=True) if not gone)


def _mask(
    fields: Mapping[str, Any],
    live_rows: np.ndarray | None,
    ntotal: int,
    filters: tuple[tuple[str, tuple[str, ...]], ...],
) -> np.ndarray:
    """bool [ntotal]: the rows matching `filters` that no tombstone hides (read-only)."""
    mask = both(allowed_rows(fields, dict(filters), ntotal), live_rows)
    mask.flags.writeable = False  # shared by every search with these filters
    return mask

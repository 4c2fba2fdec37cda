"""BM25 beside the dense index, and the fusion of the two rankings.

BM25 (Lucene variant, as bm25s computes it; k1 and b from index.lexical)

    idf(t)    = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    w(d, t)   = idf(t) · tf(t, d) / (tf(t, d) + k1 · (1 - b + b · |d| / avgdl))
    score(q, d) = Σ_{t ∈ q} w(d, t)        (each query token counts, repeats included)

is precomputed per (document, term) into a term-major sparse matrix, so one query costs at
most the length of its terms' posting lists, not the corpus size, and MaxScore pruning skips
most of the long lists of common words ("how", "what") while keeping the top k exact.
Words: `tokenize` (the lexical baselines' own tokens, English stop words removed), optionally
reduced to their Snowball stems (PyStemmer: "losing" and "loses" → "lose"), recorded in the
index file so that questions are stemmed the same way at search time.

Fusion (`fuse`): each side's top candidates, scores min-max normalised per query to [0, 1]
(a candidate missing from one side gets 0 there), combined as α·dense + (1 - α)·lexical.
α is chosen on the validation split by the evaluate stage; α = 1 is the dense ranking.

Arrays: float32 scores, int64 rows (-1 = empty slot); small functions, no framework code.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qpr.maxscore import fuse_one, top_k, union_one

FORMAT = "qpr-bm25/1"

# Posting lists shorter than this are added in full: skipping them saves less than the
# pruning check costs.
WORTH_PRUNING = 2048

# bm25s's default token pattern: words of 2+ word characters, lower-cased.
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


@functools.cache
def _english_stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def _stopword_set(stopwords: str | Iterable[str] | None) -> frozenset[str]:
    if stopwords is None:
        return frozenset()
    if isinstance(stopwords, str):
        if stopwords not in ("en", "english"):
            raise ValueError(f"only 'en' or an explicit word list, got {stopwords!r}")
        return _english_stopwords()
    return frozenset(stopwords)


_STEMMERS = threading.local()


def check_stemmer(name: str | None) -> str | None:
    """``name`` when it is None or one of PyStemmer's Snowball algorithms, else ValueError."""
    if name is None:
        return None
    import Stemmer

    if name not in Stemmer.algorithms():
        raise ValueError(
            f"unknown stemmer {name!r}; Snowball has {', '.join(Stemmer.algorithms())}"
        )
    return name


def _stem_words(name: str) -> Callable[[list[str]], list[str]]:
    """The stemWords of a Snowball stemmer of this thread: a PyStemmer object (and its
    cache) must not be shared between threads, and the service searches on several."""
    stemmers = _STEMMERS.__dict__
    if name not in stemmers:
        import Stemmer

        stemmers[name] = Stemmer.Stemmer(check_stemmer(name)).stemWords
    return stemmers[name]


def describe_bm25(settings: Mapping[str, Any]) -> str:
    """'english stems, k1 0.9, b 0.75' or 'words as written, k1 1.5, b 0.75' for a
    BM25Index.settings-like mapping; a missing key means BM25Index's default (files and
    benchmark rows written before stemming recorded none)."""
    stemmer = settings.get("stemmer")
    words = f"{stemmer} stems" if stemmer else "words as written"
    return f"{words}, k1 {settings.get('k1', 1.5):g}, b {settings.get('b', 0.75):g}"


def tokenize(
    texts: Iterable[str],
    stopwords: str | Iterable[str] | None = "en",
    stemmer: str | None = None,
) -> list[list[str]]:
    """Lower-cased words of 2+ characters, stop words removed (bm25s's tokenisation, and
    its English list by default), so both baselines see the same words; with ``stemmer``
    (a Snowball algorithm, e.g. "english") each kept word becomes its stem, as bm25s does
    with a PyStemmer stemmer (stop words are removed before stemming)."""
    stop = _stopword_set(stopwords)
    words = [[w for w in _TOKEN.findall(str(t).lower()) if w not in stop] for t in texts]
    if stemmer is None:
        return words
    stem = _stem_words(stemmer)
    return [stem(w) for w in words]


@dataclass(frozen=True)
class BM25Index:
    """Term-major BM25 weights of N documents: term t's postings are
    rows[indptr[t]:indptr[t+1]] (int32, ascending) with weights[...] (float32)."""

    terms: dict[str, int]
    indptr: np.ndarray  # int64 [V + 1]
    rows: np.ndarray  # int32 [nnz]
    weights: np.ndarray  # float32 [nnz]
    num_docs: int
    k1: float = 1.5
    b: float = 0.75
    stemmer: str | None = None  # Snowball algorithm applied to document and query words

    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        stemmer: str | None = None,
    ) -> BM25Index:
        if k1 < 0 or not 0.0 <= b <= 1.0:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1 {k1}, b {b}")
        docs = tokenize(texts, stemmer=check_stemmer(stemmer))
        terms: dict[str, int] = {}
        doc_of, term_of = [], []
        for row, words in enumerate(docs):
            for word in words:
                doc_of.append(row)
                term_of.append(terms.setdefault(word, len(terms)))
        n = len(docs)
        lengths = np.fromiter((len(w) for w in docs), np.float64, n)
        avgdl = float(lengths.mean()) if n and lengths.sum() > 0 else 1.0
        if not term_of:
            return cls(
                terms,
                np.zeros(1, np.int64),
                np.zeros(0, np.int32),
                np.zeros(0, np.float32),
                n,
                k1,
                b,
                stemmer,
            )
        # (term, doc) pairs with their counts: sort once, run-length encode.
        key = np.asarray(term_of, np.int64) * max(n, 1) + np.asarray(doc_of, np.int64)
        key, tf = np.unique(key, return_counts=True)
        term, row = key // max(n, 1), key % max(n, 1)
        df = np.bincount(term, minlength=len(terms)).astype(np.float64)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        norm = k1 * (1.0 - b + b * lengths[row] / avgdl)
        weights = idf[term] * tf / (tf + norm)
        indptr = np.zeros(len(terms) + 1, np.int64)
        np.cumsum(np.bincount(term, minlength=len(terms)), out=indptr[1:])
        return cls(
            terms, indptr, row.astype(np.int32), weights.astype(np.float32), n, k1, b, stemmer
        )

    @property
    def settings(self) -> dict[str, Any]:
        """What decides the weights and the words: stemmer, k1, b (see `describe_bm25`)."""
        return {"stemmer": self.stemmer, "k1": self.k1, "b": self.b}

    def query_terms(self, text: str) -> np.ndarray:
        """int64 term ids of the question's known words (unknown words score nothing)."""
        words = tokenize([text], stemmer=self.stemmer)[0]
        ids = [self.terms[w] for w in words if w in self.terms]
        return np.asarray(ids, np.int64)

    @functools.cached_property
    def by_document(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The weights document-major: (indptr int64 [N + 1], terms int32 [nnz], weights
        float32 [nnz]), document d's terms ascending in terms[indptr[d]:indptr[d+1]]."""
        term_of = np.repeat(np.arange(len(self.terms), dtype=np.int32), np.diff(self.indptr))
        order = np.argsort(self.rows, kind="stable")
        indptr = np.zeros(self.num_docs + 1, np.int64)
        np.cumsum(np.bincount(self.rows, minlength=self.num_docs), out=indptr[1:])
        return indptr, term_of[order], self.weights[order]

    @functools.cached_property
    def upper_bounds(self) -> np.ndarray:
        """float32 [V]: each term's largest weight, the most it can add to any score."""
        out = np.zeros(len(self.terms), np.float32)
        filled = np.flatnonzero(np.diff(self.indptr) > 0)
        if filled.size:
            out[filled] = np.maximum.reduceat(self.weights, self.indptr[filled])
        return out

    def search(
        self, text: str, k: int, *, exclude_row: int = -1, worth_pruning: int = WORTH_PRUNING
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32 [k], rows int64 [k]) best first, ties by row; documents sharing
        no word with the question are not results ((-inf, -1) slots).

        Exact top k with MaxScore pruning (`qpr.maxscore.top_k`, compiled, GIL released):
        once the top k is out of reach of the terms left, the long posting lists of common
        words are not read; the few documents that can still reach it take those terms'
        weights from `by_document` (built on first use: another copy of the weights, 7 MB
        for Quora's 134k questions). worth_pruning: the shortest list worth a pruning check
        before it (tests lower it on small corpora)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out_s = np.full(k, -np.inf, np.float32)
        out_r = np.full(k, -1, np.int64)
        counts = Counter(self.query_terms(text).tolist())
        if not counts:
            return out_s, out_r
        terms = np.fromiter(counts.keys(), np.int64, len(counts))
        repeats = np.fromiter(counts.values(), np.int64, len(counts))
        bounds = self.upper_bounds[terms].astype(np.float64) * repeats
        order = np.argsort(-bounds, kind="stable")
        # left[j]: the most the terms j, j+1, ... can still add to one document's score.
        left = np.append(np.cumsum(bounds[order][::-1])[::-1], 0.0)
        doc_indptr, doc_terms, doc_weights = self.by_document
        scores, rows, _pruned_at = top_k(
            self.indptr,
            self.rows,
            self.weights,
            doc_indptr,
            doc_terms,
            doc_weights,
            terms[order],
            repeats[order].astype(np.float32),
            left,
            k,
            exclude_row,
            worth_pruning,
            *_scratch(self.num_docs, len(self.terms)),
        )
        out_s[: scores.size] = scores
        out_r[: rows.size] = rows
        return out_s, out_r

    # -- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """One .npz (arrays + a JSON header with the terms), written atomically."""
        path = Path(path)
        header = {
            "format": FORMAT,
            "num_docs": self.num_docs,
            "k1": self.k1,
            "b": self.b,
            "stemmer": self.stemmer,
            "terms": sorted(self.terms, key=self.terms.__getitem__),
        }
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                header=np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8),
                indptr=self.indptr,
                rows=self.rows,
                weights=self.weights,
            )
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BM25Index:
        """ValueError (naming the file) for a file that is not a BM25 index of this format."""
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["header"]).decode("utf-8"))
                indptr, rows, weights = data["indptr"], data["rows"], data["weights"]
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable BM25 index ({exc})") from exc
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
        terms = {t: i for i, t in enumerate(header["terms"])}
        if (
            indptr.shape != (len(terms) + 1,)
            or rows.shape != weights.shape
            or (indptr[-1] != rows.shape[0])
        ):
            raise ValueError(f"{path}: inconsistent BM25 arrays")
        try:
            stemmer = check_stemmer(header.get("stemmer"))  # absent in unstemmed older files
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        return cls(
            terms,
            indptr,
            rows,
            weights,
            int(header["num_docs"]),
            header["k1"],
            header["b"],
            stemmer,
        )


_SCRATCH = threading.local()


def _scratch(num_docs: int, num_terms: int) -> tuple[np.ndarray, ...]:
    """This thread's work arrays for `qpr.maxscore.top_k` (acc, state, touched, position;
    top_k leaves them as it found them, so they are allocated once per thread and size)."""
    arrays = getattr(_SCRATCH, "arrays", None)
    if arrays is None or arrays[0].size != num_docs or arrays[3].size != num_terms:
        arrays = (
            np.zeros(num_docs, np.float32),
            np.zeros(num_docs, np.uint8),
            np.zeros(num_docs, np.int32),
            np.full(num_terms, -1, np.int32),
        )
        _SCRATCH.arrays = arrays
    return arrays


def lexical_search(
    bm25: BM25Index,
    texts: Sequence[str],
    k: int,
    *,
    exclude_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """BM25Index.search for each text: (scores float32 [Q, k], rows int64 [Q, k]).
    exclude_rows: int64 [Q], the row left out of query i's results (-1: none)."""
    q = len(texts)
    exclude = np.full(q, -1, np.int64) if exclude_rows is None else np.asarray(exclude_rows)
    if exclude.shape != (q,):
        raise ValueError(f"exclude_rows must be int64 [{q}], got {exclude.shape}")
    scores = np.full((q, k), -np.inf, np.float32)
    rows = np.full((q, k), -1, np.int64)
    for i, text in enumerate(texts):
        scores[i], rows[i] = bm25.search(text, k, exclude_row=int(exclude[i]))
    return scores, rows


def candidate_union(dense_rows: np.ndarray, lexical_rows: np.ndarray) -> np.ndarray:
    """Each query's distinct candidates from both retrievers: int64 [Q, Cd + Cl], ascending,
    -1 (empty) slots last. dense_rows int64 [Q, Cd], lexical_rows int64 [Q, Cl].

    Every row of the union is then scored by its exact distance (`qpr.index.distances_to`),
    so a BM25 candidate the approximate index did not return still gets its dense share
    in `fuse`, and the dense side only has to add the few candidates BM25 missed.
    """
    dense_rows = np.asarray(dense_rows, np.int64)
    lexical_rows = np.asarray(lexical_rows, np.int64)
    if dense_rows.ndim != 2 or lexical_rows.ndim != 2 or len(dense_rows) != len(lexical_rows):
        raise ValueError(
            f"dense_rows and lexical_rows must be [Q, C] with the same Q, got "
            f"{dense_rows.shape} and {lexical_rows.shape}"
        )
    if len(dense_rows) == 1:  # one question (the service): compiled
        return union_one(dense_rows[0], lexical_rows[0])[None]
    empty = np.iinfo(np.int64).max  # sorts after every row
    both = np.concatenate([dense_rows, lexical_rows], axis=1)
    both = np.sort(np.where(both >= 0, both, empty), axis=1)
    repeated = np.zeros(both.shape, bool)
    repeated[:, 1:] = both[:, 1:] == both[:, :-1]
    both[repeated] = empty
    both.sort(axis=1)
    return np.where(both == empty, -1, both)


def values_at(rows: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """values float [Q, C] of rows int64 [Q, C] (-1 = empty) looked up for wanted int64
    [Q, k]: float32 [Q, k], inf for -1; the first occurrence when a row repeats.
    ValueError when a wanted row is not among its query's rows."""
    rows = np.asarray(rows, np.int64)
    wanted = np.asarray(wanted, np.int64)
    q = rows.shape[0]
    width = int(max(rows.max(initial=0), wanted.max(initial=0))) + 2
    offsets = np.arange(q, dtype=np.int64)[:, None] * width
    keys = (np.where(rows >= 0, rows, width - 1) + offsets).ravel()
    order = np.argsort(keys, kind="stable")
    found = wanted >= 0
    targets = (wanted + offsets)[found]
    slots = np.searchsorted(keys[order], targets)
    if slots.size and (slots.max() >= keys.size or not (keys[order][slots] == targets).all()):
        raise ValueError("a wanted row is not among its query's rows")
    out = np.full(wanted.shape, np.inf, np.float32)
    out[found] = np.asarray(values, np.float32).ravel()[order[slots]]
    return out


def _unit_range(scores: np.ndarray) -> np.ndarray:
    """Per row min-max to [0, 1] over the finite entries; a constant row becomes 1."""
    finite = np.isfinite(scores)
    lo = np.where(finite, scores, np.inf).min(axis=1, keepdims=True)
    hi = np.where(finite, scores, -np.inf).max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    out = np.where(finite, (scores - lo) / span, 0.0)
    return np.where(finite & (hi == lo), 1.0, out).astype(np.float32)


def fuse(
    dense_sims: np.ndarray,
    dense_rows: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_weight: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Fused (scores float32 [Q, k], rows int64 [Q, k]), best first, ties by row.

    dense_sims: float [Q, C] higher = closer (e.g. minus the L2 distance), rows int64 [Q, C]:
    the dense search's own candidates, or (the served fusion) every candidate of
    `candidate_union` with its exact distance; lexical_scores / lexical_rows likewise (BM25).
    -1 rows are empty slots. A row missing from one side gets 0 from that side.
    dense_weight α in [0, 1]: α·dense + (1 - α)·lexical after per-query min-max scaling.
    """
    if not 0.0 <= dense_weight <= 1.0:
        raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
    dense_rows = np.asarray(dense_rows, np.int64)
    lexical_rows = np.asarray(lexical_rows, np.int64)
    q = dense_rows.shape[0]
    if lexical_rows.shape[0] != q:
        raise ValueError(f"{q} dense rows but {lexical_rows.shape[0]} lexical rows")
    d_scaled = _unit_range(np.where(dense_rows >= 0, dense_sims, -np.inf))
    l_scaled = _unit_range(np.where(lexical_rows >= 0, lexical_scores, -np.inf))
    out_s = np.full((q, k), -np.inf, np.float32)
    out_r = np.full((q, k), -1, np.int64)
    for i in range(q):
        rows = np.concatenate([dense_rows[i], lexical_rows[i]])
        parts = np.concatenate([dense_weight * d_scaled[i], (1.0 - dense_weight) * l_scaled[i]])
        keep = rows >= 0
        rows, parts = rows[keep], parts[keep]
        if rows.size == 0:
            continue
        cand, inverse = np.unique(rows, return_inverse=True)
        score = np.bincount(inverse, weights=parts).astype(np.float32)
        order = np.lexsort((cand, -score))[:k]
        out_s[i, : order.size] = score[order]
        out_r[i, : order.size] = cand[order]
    return out_s, out_r


def fuse_union(
    dense_sims: np.ndarray,
    union_rows: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_weight: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`fuse` for candidates from `candidate_union`, every one with its dense similarity:
    the same (scores, rows), computed for all queries at once (no per-query loop). One
    question alone goes faster through `fuse_union_one` (compiled).

    union_rows int64 [Q, U]: ascending per query, -1 slots last, holding every row of
    lexical_rows (what `candidate_union` returns); dense_sims float [Q, U] for them.
    """
    if not 0.0 <= dense_weight <= 1.0:
        raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
    union_rows = np.asarray(union_rows, np.int64)
    lexical_rows = np.asarray(lexical_rows, np.int64)
    q, u = union_rows.shape
    if lexical_rows.shape[0] != q:
        raise ValueError(f"{q} union rows but {lexical_rows.shape[0]} lexical rows")
    valid = union_rows >= 0
    dense = _unit_range(np.where(valid, dense_sims, -np.inf))
    lexical_found = lexical_rows >= 0
    lexical = _unit_range(np.where(lexical_found, lexical_scores, -np.inf))
    # Each lexical row's slot in its query's union: one search over keys made globally
    # ascending by a per-query offset (empty slots take the largest key of their query).
    width = int(max(union_rows.max(initial=0), lexical_rows.max(initial=0))) + 2
    offsets = np.arange(q, dtype=np.int64)[:, None] * width
    keys = (np.where(valid, union_rows, width - 1) + offsets).ravel()
    wanted = (lexical_rows + offsets)[lexical_found]
    slots = np.searchsorted(keys, wanted)
    if slots.size and (slots.max() >= keys.size or not (keys[slots] == wanted).all()):
        raise ValueError(_NOT_A_UNION)
    lexical_share = np.zeros(q * u, np.float32)
    lexical_share[slots] = lexical[lexical_found]
    score = np.float32(dense_weight) * dense + np.float32(1.0 - dense_weight) * (
        lexical_share.reshape(q, u)
    )
    score = np.where(valid, score, -np.inf).astype(np.float32)
    order = np.lexsort((np.where(valid, union_rows, width), -score), axis=-1)[:, :k]
    out_s = np.full((q, k), -np.inf, np.float32)
    out_r = np.full((q, k), -1, np.int64)
    taken = np.take_along_axis(score, order, axis=1)
    out_s[:, : order.shape[1]] = taken
    out_r[:, : order.shape[1]] = np.where(
        np.isfinite(taken), np.take_along_axis(union_rows, order, axis=1), -1
    )
    return out_s, out_r


_NOT_A_UNION = "union_rows must hold every lexical row (use candidate_union)"


def fuse_union_one(
    sims: np.ndarray,
    union: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_weight: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`fuse_union` for one question, 1-D arrays in: (scores float32 [<= k], slots int64
    [<= k]) best first, each slot indexing `union`, so the caller reads each kept row's
    own values (its distance) without searching for them. The same float32 arithmetic.

    sims float [U] for union int64 [U] (ascending, -1 slots last, holding every lexical
    row); lexical_scores float [C], lexical_rows int64 [C] (-1 = empty).
    """
    if not 0.0 <= dense_weight <= 1.0:
        raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
    scores, slots = fuse_one(
        np.ascontiguousarray(sims, np.float32),
        np.ascontiguousarray(union, np.int64),
        np.ascontiguousarray(lexical_scores, np.float32),
        np.ascontiguousarray(lexical_rows, np.int64),
        np.float32(dense_weight),
        np.float32(1.0 - dense_weight),
        k,
    )
    if slots.size and slots[0] < 0:
        raise ValueError(_NOT_A_UNION)
    return scores, slots

"""BM25 beside the dense index (the fusion of the two rankings is `qpr.retrieval.fusion`).

BM25 (Lucene variant, as bm25s computes it; k1 and b from index.lexical)

    idf(t)    = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    w(d, t)   = idf(t) · tf(t, d) / (tf(t, d) + k1 · (1 - b + b · |d| / avgdl))
    score(q, d) = Σ_{t ∈ q} w(d, t)        (each query token counts, repeats included)

is precomputed per (document, term) into a term-major sparse matrix, so one query costs at
most the length of its terms' posting lists, not the corpus size. MaxScore pruning then
searches the long lists of common words ("how", "what") only for documents that can still
make the top k, so the top k stays exact.
Words: `tokenize` (the lexical baselines' own tokens, English stop words removed), optionally
reduced to their Snowball stems (PyStemmer: "losing" and "loses" → "lose"), recorded in the
index file so that questions are stemmed the same way at search time. With the "chars"
analyzer (index.lexical.analyzer) the terms are the character n-grams of those words
(`qpr.text.words.char_grams`): a typo'd word still shares most of its grams. The analyzer
is recorded in the index file too; a file without one is read as "words".

Arrays: float32 scores, int64 rows (-1 = empty slot); small functions, no framework code.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qpr.config import check_stemmer
from qpr.io import write_atomic
from qpr.retrieval.maxscore import (
    Postings,
    Query,
    scan_top_k,
    scores_at,
    thread_scratch,
    top_k,
)
from qpr.text.words import analyze, char_grams, check_analyzer, tokenize

FORMAT = "qpr-bm25/1"
COUNTS_FORMAT = "qpr-bm25-counts/1"

# Posting lists shorter than this are always read in full (MaxScore's essential lists):
# searching them would save less than the checks cost.
WORTH_PRUNING = 2048
# A filter allowing at most this many documents has them scored from their own rows
# (`scan_top_k`): MaxScore would walk every list past all the others, pruning late.
EXACT_SCAN_DOCS = 2048


def describe_bm25(settings: Mapping[str, Any]) -> str:
    """'english stems, k1 0.9, b 0.75', 'words as written, k1 1.5, b 0.75' or 'character
    3-grams of words as written, k1 1.2, b 0.75' for a BM25Index.settings-like mapping; a
    missing key means BM25Index's default (files and benchmark rows written before stemming
    or analyzers recorded none)."""
    stemmer = settings.get("stemmer")
    words = f"{stemmer} stems" if stemmer else "words as written"
    if settings.get("analyzer", "words") == "chars":
        words = f"character {settings.get('ngram', 3)}-grams of {words}"
    return f"{words}, k1 {settings.get('k1', 1.5):g}, b {settings.get('b', 0.75):g}"


def _save_npz(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """One .npz of `arrays` and a JSON `header`, written atomically."""
    encoded = np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8)
    return write_atomic(path, lambda handle: np.savez(handle, header=encoded, **arrays))


@dataclass(frozen=True)
class TermCounts:
    """One shard's term counts, the part of BM25 that needs no collection statistics: each
    document's words counted (shards are counted apart, on any engine, then merged by
    `BM25Index.from_counts`). Entries sorted by (term, row); rows local to the shard."""

    terms: list[str]  # local term id → word, in order of first appearance
    term: np.ndarray  # int32 [nnz]
    row: np.ndarray  # int32 [nnz]
    tf: np.ndarray  # int32 [nnz]
    lengths: np.ndarray  # int32 [num_docs]: words a document has, repeats included
    stemmer: str | None
    analyzer: str = "words"  # or "chars": the words' character n-grams are the terms
    ngram: int = 3  # chars only: characters per gram

    @property
    def num_docs(self) -> int:
        return int(self.lengths.size)

    def save(self, path: str | os.PathLike[str]) -> Path:
        header = {
            "format": COUNTS_FORMAT,
            "terms": self.terms,
            "stemmer": self.stemmer,
            "analyzer": self.analyzer,
            "ngram": self.ngram,
        }
        arrays = {"term": self.term, "row": self.row, "tf": self.tf, "lengths": self.lengths}
        return _save_npz(Path(path), header, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TermCounts:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            if header.get("format") != COUNTS_FORMAT:
                raise ValueError(f"{path}: not term counts of format {COUNTS_FORMAT!r}")
            return cls(
                header["terms"],
                data["term"],
                data["row"],
                data["tf"],
                data["lengths"],
                header["stemmer"],
                header.get("analyzer", "words"),
                int(header.get("ngram", 3)),
            )


def count_terms(
    texts: Sequence[str],
    *,
    stemmer: str | None = None,
    analyzer: str = "words",
    ngram: int = 3,
) -> TermCounts:
    """The BM25 terms of each text (`qpr.text.words.analyze`: words or their grams), counted."""
    analyzer, ngram = check_analyzer(analyzer, ngram)
    docs = analyze(texts, stemmer=check_stemmer(stemmer), analyzer=analyzer, ngram=ngram)
    terms: dict[str, int] = {}
    doc_of, term_of = [], []
    for row, words in enumerate(docs):
        for word in words:
            doc_of.append(row)
            term_of.append(terms.setdefault(word, len(terms)))
    n = len(docs)
    lengths = np.fromiter((len(w) for w in docs), np.int32, n)
    # (term, doc) pairs with their counts: sort once, run-length encode.
    key = np.asarray(term_of, np.int64) * max(n, 1) + np.asarray(doc_of, np.int64)
    key, tf = np.unique(key, return_counts=True)
    return TermCounts(
        list(terms),
        (key // max(n, 1)).astype(np.int32),
        (key % max(n, 1)).astype(np.int32),
        tf.astype(np.int32),
        lengths,
        stemmer,
        analyzer,
        ngram,
    )


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
    analyzer: str = "words"  # "chars": the terms are the words' character n-grams
    ngram: int = 3  # chars only: characters per gram

    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        stemmer: str | None = None,
        analyzer: str = "words",
        ngram: int = 3,
    ) -> BM25Index:
        counts = count_terms(texts, stemmer=stemmer, analyzer=analyzer, ngram=ngram)
        return cls.from_counts([counts], k1=k1, b=b)

    @classmethod
    def from_counts(
        cls, parts: Sequence[TermCounts], *, k1: float = 1.5, b: float = 0.75
    ) -> BM25Index:
        """The index of the shards' documents one after the other, with the collection's
        statistics (N, df, avgdl) taken over all of them: the same arrays as `build` over
        the concatenated texts. Term ids follow first appearance, shard by shard."""
        if k1 < 0 or not 0.0 <= b <= 1.0:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1 {k1}, b {b}")
        stemmers = {part.stemmer for part in parts}
        if len(stemmers) > 1:
            raise ValueError(
                f"shards were counted with different stemmers: {sorted(map(str, stemmers))}"
            )
        stemmer = stemmers.pop() if stemmers else None
        analyzers = {(part.analyzer, part.ngram) for part in parts}
        if len(analyzers) > 1:
            raise ValueError(
                f"shards were counted with different analyzers: {sorted(map(str, analyzers))}"
            )
        analyzer, ngram = analyzers.pop() if analyzers else ("words", 3)
        terms: dict[str, int] = {}
        term_parts, row_parts, tf_parts, offset = [], [], [], 0
        for part in parts:
            local = np.asarray([terms.setdefault(t, len(terms)) for t in part.terms], np.int32)
            term_parts.append(local[part.term] if part.term.size else part.term)
            row_parts.append(part.row.astype(np.int64) + offset)
            tf_parts.append(part.tf)
            offset += part.num_docs
        n = offset
        lengths = (
            np.concatenate([part.lengths for part in parts]).astype(np.float64)
            if parts
            else np.zeros(0, np.float64)
        )
        avgdl = float(lengths.mean()) if n and lengths.sum() > 0 else 1.0
        term = np.concatenate(term_parts) if term_parts else np.zeros(0, np.int32)
        if not term.size:
            return cls(
                terms,
                np.zeros(len(terms) + 1, np.int64),
                np.zeros(0, np.int32),
                np.zeros(0, np.float32),
                n,
                k1,
                b,
                stemmer,
                analyzer,
                ngram,
            )
        # Each shard is sorted by (term, row) and shards hold ascending rows: a stable sort
        # by term alone gives the global (term, row) order.
        order = np.argsort(term, kind="stable")
        term = term[order]
        row = np.concatenate(row_parts)[order]
        tf = np.concatenate(tf_parts)[order].astype(np.float64)
        del order
        counts = np.bincount(term, minlength=len(terms))
        df = counts.astype(np.float64)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        norm = k1 * (1.0 - b + b * lengths[row] / avgdl)
        weights = idf[term] * tf / (tf + norm)
        indptr = np.zeros(len(terms) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        weights = weights.astype(np.float32)
        return cls(terms, indptr, row.astype(np.int32), weights, n, k1, b, stemmer, analyzer, ngram)

    @property
    def settings(self) -> dict[str, Any]:
        """What decides the weights and the terms: stemmer, k1, b, and with the chars
        analyzer analyzer and ngram (absent for words, so the words' records are unchanged;
        see `describe_bm25`)."""
        out: dict[str, Any] = {"stemmer": self.stemmer, "k1": self.k1, "b": self.b}
        if self.analyzer != "words":
            out.update(analyzer=self.analyzer, ngram=self.ngram)
        return out

    def analyze(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's terms as this index reads them (its stemmer, analyzer and ngram)."""
        return analyze(texts, stemmer=self.stemmer, analyzer=self.analyzer, ngram=self.ngram)

    def query_terms(self, text: str) -> np.ndarray:
        """int64 term ids of the question's known terms (unknown terms score nothing)."""
        words = self.analyze([text])[0]
        ids = [self.terms[w] for w in words if w in self.terms]
        return np.asarray(ids, np.int64)

    def matches(self, text: str, row: int) -> tuple[float, tuple[str, ...]]:
        """(document `row`'s BM25 score for the question, the question's words it shares).
        The words are the question's own (lower-cased), not their stems: a user sees
        "losing" matched, not "lose". Each once, in question order."""
        words = tokenize([text])[0]
        # Stemming maps word to stem one for one, so the two lists align.
        stems = tokenize([text], stemmer=self.stemmer)[0]
        indptr, terms, weights = self.by_document
        start, end = int(indptr[row]), int(indptr[row + 1])
        weight_of = dict(zip(terms[start:end].tolist(), weights[start:end].tolist(), strict=True))
        score, matched = 0.0, []
        for word, stem in zip(words, stems, strict=True):
            # chars: a word matches when one of its grams does; each gram's weight counts.
            terms = [stem] if self.analyzer == "words" else char_grams([stem], self.ngram)
            found = [weight_of.get(self.terms.get(term, -1)) for term in terms]
            found = [weight for weight in found if weight is not None]
            if not found:
                continue
            score += sum(found)  # repeats count, as in `search`
            if word not in matched:
                matched.append(word)
        return score, tuple(matched)

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

    @functools.cached_property
    def postings(self) -> Postings:
        """The weights both ways, as `qpr.retrieval.maxscore.top_k` reads them."""
        return Postings(self.indptr, self.rows, self.weights, *self.by_document)

    def search(
        self,
        text: str,
        k: int,
        *,
        exclude_row: int = -1,
        allowed: np.ndarray | None = None,
        worth_pruning: int = WORTH_PRUNING,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32 [k], rows int64 [k]) best first, ties by row; documents sharing
        no word with the question are not results ((-inf, -1) slots).

        Exact top k by document-at-a-time MaxScore (`qpr.retrieval.maxscore.top_k`,
        compiled, GIL released), so that common words' long lists are not read in full.
        `by_document` scores a few seed documents first, so that pruning starts at once.
        It is built on first use: another copy of the weights, 7 MB for Quora's 134k
        questions. worth_pruning: lists shorter than this are always read in full; tests
        lower it on small corpora. allowed: bool [N], the documents that may be returned
        (None: all); the others are never scored. The weights keep the whole collection's
        statistics (N, df, avgdl), so an allowed document scores what it scores unfiltered."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if allowed is not None:
            allowed = np.asarray(allowed)
            if allowed.dtype != np.bool_ or allowed.shape != (self.num_docs,):
                raise ValueError(f"allowed must be bool [{self.num_docs}], got {allowed.shape}")
        out_s = np.full(k, -np.inf, np.float32)
        out_r = np.full(k, -1, np.int64)
        counts = Counter(self.query_terms(text).tolist())
        if not counts:
            return out_s, out_r
        docs = None if allowed is None else np.flatnonzero(allowed)
        if docs is not None and docs.size <= EXACT_SCAN_DOCS:
            scores, rows = scan_top_k(
                self.postings,
                Query.of(counts, self.upper_bounds),
                k,
                docs,
                thread_scratch(self.num_docs, len(self.terms)),
                exclude_row=exclude_row,
            )
            out_s[: scores.size], out_r[: rows.size] = scores, rows
            return out_s, out_r
        scores, rows, _pruned_at = top_k(
            self.postings,
            Query.of(counts, self.upper_bounds),
            k,
            thread_scratch(self.num_docs, len(self.terms)),
            exclude_row=exclude_row,
            allowed=allowed,
            worth_pruning=worth_pruning,
        )
        out_s[: scores.size] = scores
        out_r[: rows.size] = rows
        return out_s, out_r

    def scores_at(self, text: str, rows: np.ndarray) -> np.ndarray:
        """float32 [R]: the question's BM25 score of each of rows int64 [R], as `search`
        scores it (bit for bit); 0 for a row sharing no word, -inf at -1 slots. The served
        fusion does not read it: a row BM25's top k left out gets 0 there, since scoring
        the whole union was measured and not taken (docs/pipeline.md, Hybrid search)."""
        rows = np.asarray(rows, np.int64)
        if rows.ndim != 1:
            raise ValueError(f"rows must be int64 [R], got {rows.shape}")
        if rows.size and rows.max() >= self.num_docs:
            raise ValueError(f"row {int(rows.max())} is past the {self.num_docs} documents")
        counts = Counter(self.query_terms(text).tolist())
        if not counts:
            return np.where(rows >= 0, 0.0, -np.inf).astype(np.float32)
        return scores_at(
            self.postings,
            Query.of(counts, self.upper_bounds),
            rows,
            thread_scratch(self.num_docs, len(self.terms)),
        )

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
        if self.analyzer != "words":  # a words index's file stays as it was before analyzers
            header.update(analyzer=self.analyzer, ngram=self.ngram)
        arrays = {"indptr": self.indptr, "rows": self.rows, "weights": self.weights}
        return _save_npz(path, header, arrays)

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
            # absent in files written before analyzers, all of words
            analyzer, ngram = check_analyzer(
                header.get("analyzer", "words"), header.get("ngram", 3)
            )
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
            analyzer,
            ngram,
        )


def lexical_search(
    bm25: BM25Index,
    texts: Sequence[str],
    k: int,
    *,
    exclude_rows: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """BM25Index.search for each text: (scores float32 [Q, k], rows int64 [Q, k]).
    exclude_rows: int64 [Q], the row left out of query i's results (-1: none).
    allowed: bool [N], the only documents any query may return (None: all)."""
    q = len(texts)
    exclude = np.full(q, -1, np.int64) if exclude_rows is None else np.asarray(exclude_rows)
    if exclude.shape != (q,):
        raise ValueError(f"exclude_rows must be int64 [{q}], got {exclude.shape}")
    scores = np.full((q, k), -np.inf, np.float32)
    rows = np.full((q, k), -1, np.int64)
    for i, text in enumerate(texts):
        scores[i], rows[i] = bm25.search(text, k, exclude_row=int(exclude[i]), allowed=allowed)
    return scores, rows

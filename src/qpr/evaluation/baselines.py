"""Baselines, on the same queries and index questions as the system they are compared
with (seed 004: honest baselines): BM25 (bm25s, Lucene variant), bag-of-words Jaccard, and
the untrained encoder (seed 001: what training earned).

Searches return ``(scores [Q, k], rows int64 [Q, k])``, a row of -1 is "nothing found";
the lexical ones return similarities (higher = better), the encoder L2 distances.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qpr.config import Settings
from qpr.evaluation.queries import SearchTask, SystemResult, score_system
from qpr.retrieval.dense import drop_excluded, search
from qpr.text.words import tokenize

if TYPE_CHECKING:
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

# ---------------------------------------------------------------- lexical


def _rank_candidates(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k of one query's candidates by (score desc, row asc): ties break the same way
    every run. Pads with (-inf, -1)."""
    if scores.size > k:
        cut = np.argpartition(-scores, k - 1)[:k]
        # keep everything tied with the k-th score, so the row tie-break is honest
        kth = scores[cut].min()
        cut = np.flatnonzero(scores >= kth)
        scores, rows = scores[cut], rows[cut]
    order = np.lexsort((rows, -scores))[:k]
    out_s = np.full(k, -np.inf, dtype=np.float32)
    out_r = np.full(k, -1, dtype=np.int64)
    out_s[: order.size] = scores[order]
    out_r[: order.size] = rows[order]
    return out_s, out_r


def _check_exclude(exclude_rows: np.ndarray | None, q: int) -> np.ndarray:
    if exclude_rows is None:
        return np.full(q, -1, dtype=np.int64)
    exclude_rows = np.asarray(exclude_rows, dtype=np.int64)
    if exclude_rows.shape != (q,):
        raise ValueError(f"exclude_rows must be int64 [{q}], got {exclude_rows.shape}")
    return exclude_rows


def bm25_search(
    index_texts: Sequence[str],
    query_texts: Sequence[str],
    k: int,
    *,
    exclude_rows: np.ndarray | None = None,
    stopwords: str | Iterable[str] | None = "en",
    n_threads: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """BM25 (bm25s, Lucene variant, k1 1.5, b 0.75) over the index questions.

    index_texts : N texts (row r = index_texts[r]); query_texts : Q texts.
    exclude_rows : int64 [Q] row to leave out of query i's results (-1: none).
    n_threads : bm25s worker processes (0 = in this process).

    Returns ``(scores float32 [Q, k], rows int64 [Q, k])``, HIGHER score = better, ties by
    row. A document sharing no word with the query (score 0) is not a result: such slots
    are (-inf, -1), as are slots beyond a query's matches.
    """
    import bm25s  # heavy-ish import (scipy); only the baselines need it

    q = len(query_texts)
    exclude = _check_exclude(exclude_rows, q)
    retriever = bm25s.BM25()
    retriever.index(tokenize(index_texts, stopwords), show_progress=False)
    n = len(index_texts)
    ask = min(k + 1, n)
    # bm25s cuts at k exactly; ask for a few more so score ties at the cut are re-ranked
    # by row below, the same way jaccard_search does it.
    ask_wide = min(ask + 8, n)
    docs, scores = retriever.retrieve(
        tokenize(query_texts, stopwords), k=ask_wide, show_progress=False, n_threads=n_threads
    )
    out_s = np.full((q, k + 1), -np.inf, dtype=np.float32)
    out_r = np.full((q, k + 1), -1, dtype=np.int64)
    for i in range(q):
        s, r = scores[i].astype(np.float32), docs[i].astype(np.int64)
        matched = s > 0
        out_s[i, :ask], out_r[i, :ask] = _rank_candidates(s[matched], r[matched], ask)
    return drop_excluded(out_s, out_r, exclude, k)


def jaccard_search(
    index_texts: Sequence[str],
    query_texts: Sequence[str],
    k: int,
    *,
    exclude_rows: np.ndarray | None = None,
    stopwords: str | Iterable[str] | None = "en",
) -> tuple[np.ndarray, np.ndarray]:
    """Bag-of-words Jaccard |q ∩ d| / |q ∪ d| over word SETS (same tokens as BM25).

    Uses an inverted index (word → rows), so each query only touches documents sharing a
    word with it: 11.6k queries × 134k questions take seconds, and no [N, Q] matrix exists.
    Query words absent from the index still count in |q ∪ d|.

    Returns ``(scores float32 [Q, k], rows int64 [Q, k])``, HIGHER = better, ties by row;
    (-inf, -1) where fewer than k documents share a word with the query.
    """
    q = len(query_texts)
    exclude = _check_exclude(exclude_rows, q)
    vocab: dict[str, int] = {}
    doc_words: list[np.ndarray] = []
    for words in tokenize(index_texts, stopwords):
        ids = {vocab.setdefault(w, len(vocab)) for w in words}
        doc_words.append(np.fromiter(ids, dtype=np.int64, count=len(ids)))
    sizes = np.array([w.size for w in doc_words], dtype=np.int64)
    # CSR postings: rows holding word t are postings[indptr[t]:indptr[t + 1]], ascending.
    words_flat = np.concatenate(doc_words) if doc_words else np.zeros(0, np.int64)
    rows_flat = np.repeat(np.arange(len(doc_words), dtype=np.int64), sizes)
    order = np.argsort(words_flat, kind="stable")
    postings = rows_flat[order]
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(np.bincount(words_flat, minlength=len(vocab)), out=indptr[1:])

    out_s = np.full((q, k), -np.inf, dtype=np.float32)
    out_r = np.full((q, k), -1, dtype=np.int64)
    for i, words in enumerate(tokenize(query_texts, stopwords)):
        unique = set(words)
        known = [vocab[w] for w in unique if w in vocab]
        if not known:
            continue
        hits = np.concatenate([postings[indptr[t] : indptr[t + 1]] for t in known])
        rows, inter = np.unique(hits, return_counts=True)
        keep = rows != exclude[i]
        rows, inter = rows[keep], inter[keep]
        if rows.size == 0:
            continue
        score = inter / (len(unique) + sizes[rows] - inter)
        out_s[i], out_r[i] = _rank_candidates(score.astype(np.float32), rows, k)
    return out_s, out_r


# ---------------------------------------------------------------- the untrained encoder


def untrained_description(settings: Settings) -> str:
    """What the "untrained" baseline is for model.encoder (said beside its numbers)."""
    if settings.model.encoder == "transformer":
        transformer = settings.model.transformer
        what = f"{transformer.package} as packaged: pretrained, not fine-tuned"
        if transformer.projection_dim:
            what += f" (projection to {transformer.projection_dim} at its seeded initial weights)"
        return what
    return "the same CNN with its seeded random initial weights"


def untrained_encoder_search(
    settings: Settings,
    vocab: Vocabulary | WordPieceTokenizer,
    task: SearchTask,
    *,
    max_len: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Seed 001's first baseline: the same encoder before training, exact search. Shows how
    much of the result training earned. For the CNN that is its random initial weights; for
    the transformer the pretrained model as packaged (not fine-tuned), a projection at its
    seeded initial weights (see untrained_description)."""
    from qpr.retrieval.dense import IndexConfig, build_index
    from qpr.training.build import build_encoder_and_loss
    from qpr.training.embed import encode_texts, torch_math

    encoder, _ = build_encoder_and_loss(settings, vocab.size)
    index_texts, queries = task.index_texts, task.queries
    if settings.model.encoder == "transformer":
        # ONNX Runtime encodes the transformer about twice as fast as torch on CPU (the
        # whole index is encoded again here); the CNN's torch path is fast enough.
        import tempfile

        from qpr.model.onnx import export_onnx
        from qpr.retrieval.encoders import encode, load_session

        with tempfile.TemporaryDirectory(prefix="qpr-untrained-") as tmp:
            path = export_onnx(encoder, Path(tmp) / "untrained.onnx", opset=settings.export.opset)
            session = load_session(path, threads=settings.index.threads)
            batch = settings.index.encode_batch_size
            index_vectors = encode(session, vocab, index_texts, batch_size=batch, max_len=max_len)
            query_vectors = encode(session, vocab, queries.texts, batch_size=batch, max_len=max_len)
    else:
        # train.threads, as training: a sum split over another core count rounds otherwise.
        with torch_math(settings.train.threads):
            index_vectors = encode_texts(encoder, vocab, index_texts, max_len=max_len)
            query_vectors = encode_texts(encoder, vocab, queries.texts, max_len=max_len)
    flat = build_index(
        index_vectors, IndexConfig("Flat", nprobe=1), seed=settings.seed, log=lambda _: None
    )
    return search(flat, query_vectors, task.k, exclude=task.query_rows)


# ---------------------------------------------------------------- all of them


def run_baselines(
    names: Sequence[str],
    task: SearchTask,
    settings: Settings,
    vocab: Vocabulary | WordPieceTokenizer,
    *,
    max_len: int,
    log: Callable[[str], None],
) -> dict[str, SystemResult]:
    """Each baseline of `names` (bm25, jaccard, untrained: evaluate.baselines) on `task`,
    scored as the system is. `settings`, `vocab` and `max_len` build the untrained encoder
    (params, its tokenizer, tokens per question)."""
    results: dict[str, SystemResult] = {}
    for baseline in names:
        started = time.perf_counter()
        if baseline == "bm25":
            scores, rows = bm25_search(
                task.index_texts, task.queries.texts, task.k, exclude_rows=task.query_rows
            )
        elif baseline == "jaccard":
            scores, rows = jaccard_search(
                task.index_texts, task.queries.texts, task.k, exclude_rows=task.query_rows
            )
        else:
            scores, rows = untrained_encoder_search(settings, vocab, task, max_len=max_len)
        results[baseline] = score_system(
            baseline,
            task.queries,
            rows,
            scores,
            task.row_to_qid,
            higher_is_better=baseline in ("bm25", "jaccard"),
            seconds=time.perf_counter() - started,
        )
        what = f" [{untrained_description(settings)}]" if baseline == "untrained" else ""
        log(
            f"baseline {baseline}{what}: success@1 "
            f"{results[baseline].summary['success_1']:.4f} ({results[baseline].seconds:.1f} s)"
        )
    return results

"""Evaluation: TREC files, trec_eval measures, lexical baselines, the "no answer" threshold.

Shapes and conventions:

- qrels : ``dict[qid, dict[docid, relevance int]]``; run : ``dict[qid, list[(docid, score)]]``
  in rank order, higher score = better. Ids are question ids as strings; never text, so
  TREC files can be shared without the (licensed) question text.
- searches return ``(scores [Q, k], rows int64 [Q, k])``; a row of -1 is "nothing found".
  For FAISS L2 the scores are distances (lower = better) and `run_from_search` negates
  them; the lexical baselines here return similarities (higher = better).
- Measures are trec_eval's own code (pytrec_eval): success_1 / success_10 are the paper's
  P@1 / P@10 ("at least one paraphrase in the first N"), recip_rank is MRR. P_1 equals
  success_1; P_10 is the classic precision (relevant share of the first 10) and differs.

Library code: no Prefect or MLflow here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytrec_eval

from qpr.retrieval.dense import drop_excluded
from qpr.text.words import tokenize

__all__ = [
    "MEASURES",
    "MEASURE_LABELS",
    "TREC_MEASURE_SPEC",
    "bm25_search",
    "format_table",
    "jaccard_search",
    "pick_threshold",
    "plot_threshold_curve",
    "qrels_from_clusters",
    "read_qrels",
    "read_run",
    "run_from_search",
    "threshold_curve",
    "tokenize",
    "trec_measures",
    "write_qrels",
    "write_run",
]

Qrels = dict[str, dict[str, int]]
Run = dict[str, list[tuple[str, float]]]

# pytrec_eval measure names → the keys it reports (trec_eval "success.1" → "success_1").
TREC_MEASURE_SPEC = frozenset(
    {"success.1,10", "recip_rank", "P.1,10", "map", "ndcg_cut.10", "recall.20"}
)
# trec_eval measure → its column heading in every results table, in table order.
MEASURE_LABELS = {
    "success_1": "P@1",
    "success_10": "P@10",
    "recip_rank": "MRR",
    "map": "MAP",
    "ndcg_cut_10": "nDCG@10",
    "recall_20": "R@20",
}
MEASURES = (
    "success_1",
    "success_10",
    "recip_rank",
    "P_1",
    "P_10",
    "map",
    "ndcg_cut_10",
    "recall_20",
)


# ---------------------------------------------------------------- TREC files


def _check_token(value: str, what: str) -> str:
    value = str(value)
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{what} {value!r} is empty or contains whitespace (TREC columns)")
    return value


def write_qrels(path: str | os.PathLike[str], qrels: Mapping[str, Mapping[str, int]]) -> Path:
    """Write ``qid 0 docid rel`` lines (trec_eval's qrels format), queries in given order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for qid, docs in qrels.items():
            q = _check_token(qid, "qid")
            for docid, rel in docs.items():
                f.write(f"{q} 0 {_check_token(docid, 'docid')} {int(rel)}\n")
    return path


def write_run(
    path: str | os.PathLike[str],
    run: Mapping[str, Sequence[tuple[str, float]]],
    tag: str,
) -> Path:
    """Write ``qid Q0 docid rank score tag`` lines (rank from 1, list order).

    Scores must be non-increasing down each list (higher = better, as trec_eval sorts by
    score): a ValueError here usually means distances were written instead of -distance.
    Scores are written with ``repr`` so `read_run` gets the same floats back.
    """
    tag = _check_token(tag, "run tag")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            q = _check_token(qid, "qid")
            previous = math.inf
            for rank, (docid, score) in enumerate(docs, start=1):
                score = float(score)
                if score > previous:
                    raise ValueError(
                        f"run for query {q}: score rises at rank {rank} "
                        f"({previous!r} → {score!r}); scores must be higher = better"
                    )
                previous = score
                f.write(f"{q} Q0 {_check_token(docid, 'docid')} {rank} {score!r} {tag}\n")
    return path


def read_qrels(path: str | os.PathLike[str]) -> Qrels:
    """Read a qrels file back (queries and documents in file order)."""
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise ValueError(f"{path}:{number}: expected 'qid 0 docid rel', got {line!r}")
            qid, _, docid, rel = parts
            qrels.setdefault(qid, {})[docid] = int(rel)
    return qrels


def read_run(path: str | os.PathLike[str]) -> Run:
    """Read a run file back: per query, (docid, score) sorted by the rank column."""
    ranked: dict[str, list[tuple[int, str, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ValueError(
                    f"{path}:{number}: expected 'qid Q0 docid rank score tag', got {line!r}"
                )
            qid, _, docid, rank, score, _tag = parts
            ranked.setdefault(qid, []).append((int(rank), docid, float(score)))
    return {
        qid: [(docid, score) for _, docid, score in sorted(rows, key=lambda r: r[0])]
        for qid, rows in ranked.items()
    }


# ---------------------------------------------------------------- qrels and runs


def qrels_from_clusters(
    query_ids: Iterable[int],
    cluster_of: Mapping[int, int],
    members: Mapping[int, Sequence[int]],
    *,
    drop_singletons: bool = False,
) -> Qrels:
    """Relevant documents of a query = the other questions of its cluster (relevance 1).

    query_ids : question ids used as queries; cluster_of : question id → cluster id;
    members : cluster id → its question ids (the query itself may be among them).

    A query alone in its cluster has no right answer and cannot be scored: ValueError,
    unless ``drop_singletons=True`` leaves it out (compare ``len(qrels)`` to the queries).
    """
    qrels: Qrels = {}
    alone = []
    for q in query_ids:
        q = int(q)
        others = {str(int(m)): 1 for m in members[cluster_of[q]] if int(m) != q}
        if not others:
            alone.append(q)
            continue
        qrels[str(q)] = others
    if alone and not drop_singletons:
        raise ValueError(
            f"{len(alone)} queries have no other question in their cluster "
            f"(first: {alone[:5]}); pass drop_singletons=True to leave them out"
        )
    return qrels


def run_from_search(
    query_ids: Sequence[int] | np.ndarray,
    rows: np.ndarray,
    distances: np.ndarray,
    row_to_qid: np.ndarray,
    *,
    higher_is_better: bool = False,
) -> Run:
    """Turn search output into a run.

    query_ids : int [Q] question ids of the queries, aligned with rows.
    rows : int64 [Q, k] index rows in rank order (-1 = nothing: skipped).
    distances : float [Q, k]. Lower = better unless ``higher_is_better`` (inner-product
        FAISS indexes, the BM25/Jaccard baselines); the run score is -distance or the
        similarity itself, so that higher is always better in the run.
    row_to_qid : int64 [N] question id of each index row (``IdMap.qids``).

    Every query gets a key, possibly with an empty list; rank order is kept.
    """
    rows = np.asarray(rows)
    distances = np.asarray(distances, dtype=np.float64)
    if rows.shape != distances.shape or rows.ndim != 2 or rows.shape[0] != len(query_ids):
        raise ValueError(
            f"rows {rows.shape} and distances {distances.shape} must both be [{len(query_ids)}, k]"
        )
    row_to_qid = np.asarray(row_to_qid, dtype=np.int64)
    scores = distances if higher_is_better else -distances
    run: Run = {}
    for q, q_rows, q_scores in zip(query_ids, rows, scores, strict=True):
        found = q_rows >= 0
        docs = row_to_qid[q_rows[found]]
        run[str(int(q))] = [
            (str(int(d)), float(s)) for d, s in zip(docs, q_scores[found], strict=True)
        ]
    return run


def trec_measures(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Sequence[tuple[str, float]]],
    *,
    keep_order: bool = True,
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """trec_eval measures (`MEASURES`) per query and their mean over ALL qrels queries.

    pytrec_eval silently drops a query that is in the qrels but absent from the run; here
    such a query (and one whose list is empty) scores 0 on every measure and counts in
    the mean. Run queries that are not in the qrels are ignored (trec_eval does the same).

    keep_order : True evaluates the lists in the order given (pytrec_eval gets
        rank-derived scores). trec_eval itself re-sorts by score and breaks ties by docid
        in *descending* string order, which would reshuffle tied results (frequent with
        Jaccard, or exact-duplicate vectors); False reproduces trec_eval on the raw scores.

    Returns ``(per_query, summary)``: per_query[qid][measure]; summary[measure] plus
    ``num_queries`` (= len(qrels)). An empty qrels gives NaN means and num_queries 0.
    """
    graded = {str(q): {str(d): int(r) for d, r in docs.items()} for q, docs in qrels.items()}
    scored: dict[str, dict[str, float]] = {}
    for qid in graded:
        docs = run.get(qid) or []
        ranked: dict[str, float] = {}
        for position, (docid, score) in enumerate(docs):
            docid = str(docid)
            if docid in ranked:  # a document counts once, at its best rank
                continue
            ranked[docid] = float(len(docs) - position) if keep_order else float(score)
        if ranked:
            scored[qid] = ranked
    evaluated = pytrec_eval.RelevanceEvaluator(graded, set(TREC_MEASURE_SPEC)).evaluate(scored)
    zero = dict.fromkeys(MEASURES, 0.0)
    per_query = {qid: {m: float(evaluated.get(qid, zero)[m]) for m in MEASURES} for qid in graded}
    n = len(per_query)
    summary = {
        m: (math.fsum(v[m] for v in per_query.values()) / n if n else math.nan) for m in MEASURES
    }
    summary["num_queries"] = n
    return per_query, summary


# ---------------------------------------------------------------- lexical baselines


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


# ---------------------------------------------------------------- "no answer" threshold


def threshold_curve(
    top1_distances: np.ndarray,
    top1_correct: np.ndarray,
    *,
    points: int = 101,
    higher_is_better: bool = False,
) -> pd.DataFrame:
    """Precision of the top answer against the share of queries answered.

    top1_distances : float32 [Q] rank-1 distance per query (non-finite = nothing found:
        never answered, still in the denominator of answered_share).
    top1_correct : bool [Q] rank-1 result is a paraphrase (per_query success_1 == 1).
    points : thresholds are the `points` quantiles (0, 1/(points-1), ..., 1) of the finite
        distances, taken as observed values (method "lower"), duplicates removed; so
        answered_share steps evenly and the last threshold answers every finite query.
    higher_is_better : for similarities (IP, BM25): answer when score >= threshold.

    A query is answered when distance <= threshold. Returns a DataFrame with columns
    threshold, answered_share (answered / Q), answered, precision_at_1 (correct answered /
    answered), one row per threshold, in order of growing answered_share.
    """
    d = np.asarray(top1_distances, dtype=np.float64)
    ok = np.asarray(top1_correct, dtype=bool)
    if d.shape != ok.shape or d.ndim != 1:
        raise ValueError(f"need two [Q] arrays, got {d.shape} and {ok.shape}")
    if points < 2:
        raise ValueError("points must be >= 2")
    finite = np.isfinite(d)
    columns = ["threshold", "answered_share", "answered", "precision_at_1"]
    if not finite.any():
        return pd.DataFrame(columns=columns)
    # Work in "lower = more confident" space; flip back for the reported thresholds.
    key = -d if higher_is_better else d
    levels = np.unique(np.quantile(key[finite], np.linspace(0, 1, points), method="lower"))
    answered = (key[None, :] <= levels[:, None]) & finite[None, :]
    n_answered = answered.sum(axis=1)
    n_correct = (answered & ok[None, :]).sum(axis=1)
    return pd.DataFrame(
        {
            "threshold": -levels if higher_is_better else levels,
            "answered_share": n_answered / d.size,
            "answered": n_answered,
            "precision_at_1": n_correct / n_answered,
        }
    )


def pick_threshold(curve: pd.DataFrame, target_precision: float) -> float | None:
    """The threshold answering the most queries while precision_at_1 >= target.

    "Largest" in the answering sense: the highest distance threshold (the lowest one for
    a curve built with higher_is_better, which lists thresholds in decreasing order).
    Precision is not monotone in the threshold, so this is the last qualifying row of the
    curve, not the first crossing. None when no threshold reaches the target.
    """
    ok = curve[curve["precision_at_1"] >= target_precision]
    if ok.empty:
        return None
    return float(ok["threshold"].iloc[-1])


def plot_threshold_curve(
    curve: pd.DataFrame,
    path: str | os.PathLike[str],
    chosen: float | None = None,
    *,
    title: str = "No-answer threshold: precision@1 vs share answered",
) -> Path:
    """PNG of precision_at_1 against answered_share; ``chosen`` (a threshold of the curve,
    e.g. from `pick_threshold`) is marked. Uses the Agg canvas directly: no pyplot state,
    no display needed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(curve["answered_share"], curve["precision_at_1"], marker=".", lw=1)
    if chosen is not None and not curve.empty:
        at = int(np.argmin(np.abs(curve["threshold"].to_numpy() - chosen)))
        share, precision = curve["answered_share"].iloc[at], curve["precision_at_1"].iloc[at]
        ax.scatter([share], [precision], color="tab:red", zorder=3)
        ax.annotate(
            f"threshold {chosen:.4g}\nanswered {share:.1%}, P@1 {precision:.3f}",
            (share, precision),
            textcoords="offset points",
            xytext=(-10, -30),
            ha="right",
        )
    ax.set_xlabel("share of queries answered")
    ax.set_ylabel("precision@1 among answered")
    ax.set_xlim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


# ---------------------------------------------------------------- reporting


def format_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] | Mapping[str, str],
    *,
    floatfmt: str = ".3f",
) -> str:
    """A Markdown table: one line per dict in ``rows``, cells in ``columns`` order.

    columns : keys, or {key: header}. Floats use ``floatfmt``; ints get thousands
    separators; numeric columns are right-aligned; a missing key is an empty cell;
    ``|`` in text is escaped.
    """
    headers = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}

    def cell(value: object) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, (int, np.integer)):
            return f"{int(value):,}"
        if isinstance(value, (float, np.floating)):
            return "" if math.isnan(value) else format(float(value), floatfmt)
        return str(value).replace("|", "\\|")

    def numeric(key: str) -> bool:
        values = [r.get(key) for r in rows if r.get(key) is not None]
        return bool(values) and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            for v in values
        )

    lines = [
        "| " + " | ".join(str(h) for h in headers.values()) + " |",
        "|" + "|".join("---:" if numeric(k) else "---" for k in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(r.get(k)) for k in headers) + " |" for r in rows]
    return "\n".join(lines) + "\n"

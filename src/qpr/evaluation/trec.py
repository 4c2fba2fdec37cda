"""TREC files and trec_eval measures: qrels and runs, reading and writing them, scoring a
run, and the Markdown tables every results page uses.

Shapes and conventions:

- qrels : ``dict[qid, dict[docid, relevance int]]``; run : ``dict[qid, list[(docid, score)]]``
  in rank order, higher score = better. Ids are question ids as strings; never text, so
  TREC files can be shared without the (licensed) question text.
- searches return ``(scores [Q, k], rows int64 [Q, k])``; a row of -1 is "nothing found".
  For FAISS L2 the scores are distances (lower = better) and `run_from_search` negates
  them; the lexical baselines (`qpr.evaluation.baselines`) return similarities (higher =
  better).
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
import pytrec_eval

__all__ = [
    "MEASURES",
    "MEASURE_LABELS",
    "TREC_MEASURE_SPEC",
    "Qrels",
    "Run",
    "format_table",
    "qrels_from_clusters",
    "read_qrels",
    "read_run",
    "run_from_search",
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

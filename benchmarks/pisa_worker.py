#!/usr/bin/env python
"""PISA's BM25 behind a pipe, for `benchmarks/bm25_engines.py --pisa-python`.

PISA (C++, block-max indexes) comes from the `pyterrier-pisa` wheel, which needs pandas,
numpy and PyTerrier releases the project does not pin. So it runs in an interpreter of its
own (a virtual environment with `pip install pyterrier-pisa`), started by the benchmark,
and answers one JSON object a line on stdin with one on stdout. It times each query
itself, around the compiled `retrieve` call alone, so the pipe costs nothing measured.

Requests:
- {"build": DIR, "docs": FILE, "k1", "b"}: index FILE (one document a line, its words
  joined by spaces, line = row) in DIR, unless DIR already holds it; answers the build
  seconds, documents and PISA's version.
- {"queries": [{word: count}, ...]}: the queries, as our analyzer cuts them.
- {"time": [i, ...], "k", "algorithm"}: each query's milliseconds for its top k.
- {"top": [i, ...], "k"}: each query's top-k scores and rows.

No qpr import: this file runs beside the project, not in it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path


def build(where: Path, docs: Path, k1: float, b: float) -> tuple[object, dict]:
    import pyterrier_pisa as pisa

    index = pisa.PisaIndex(str(where), stemmer="none", stops="none", threads=1)
    started = time.perf_counter()
    if not index.built():

        def documents():
            with docs.open(encoding="utf-8") as lines:
                for row, line in enumerate(lines):
                    yield {"docno": str(row), "text": line.rstrip("\n")}

        index.index(documents())
    inverted = time.perf_counter() - started
    # BM25's block maxima and the compressed index are written on first use, here.
    retriever = index.bm25(k1=k1, b=b, num_results=10, threads=1)
    info = {
        "build_s": time.perf_counter() - started,  # 0-ish when DIR already held them
        "invert_s": inverted,
        "documents": index.num_docs(),
        "version": version("pyterrier-pisa"),
    }
    return retriever, info


def main() -> None:
    # PISA prints progress on fd 1: answers go to a copy of it, fd 1 goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import numpy as np
    from pyterrier_pisa import _pisathon

    retriever = None
    queries: list[dict[str, float]] = []
    buffers: dict[int, tuple] = {}

    def run(i: int, k: int, algorithm: str) -> int:
        if k not in buffers:
            buffers[k] = (
                np.empty(k, np.int32),
                np.empty(k, dtype=object),
                np.empty(k, np.int32),
                np.empty(k, np.float32),
            )
        qidx, docnos, ranks, scores = buffers[k]
        return _pisathon.retrieve(
            retriever._ctxt,
            algorithm,
            [(0, queries[i])],
            k=k,
            threads=1,
            query_weighted=1,  # a word asked twice weighs twice, as in ours
            pretokenised=True,
            result_qidxs=qidx,
            result_docnos=docnos,
            result_ranks=ranks,
            result_scores=scores,
        )

    for line in sys.stdin:
        request = json.loads(line)
        if "build" in request:
            retriever, answer = build(
                Path(request["build"]), Path(request["docs"]), request["k1"], request["b"]
            )
        elif "queries" in request:
            queries = [{w: float(c) for w, c in q.items()} for q in request["queries"]]
            answer = {"queries": len(queries)}
        elif "time" in request:
            k, algorithm = request["k"], request["algorithm"]
            ms = []
            for i in request["time"]:
                started = time.perf_counter()
                run(i, k, algorithm)
                ms.append((time.perf_counter() - started) * 1e3)
            answer = {"ms": ms}
        elif "top" in request:
            k, tops = request["k"], []
            for i in request["top"]:
                size = run(i, k, request.get("algorithm", "maxscore"))
                _, docnos, _, scores = buffers[k]
                tops.append({"rows": [int(d) for d in docnos[:size]],
                             "scores": [float(s) for s in scores[:size]]})  # fmt: skip
            answer = {"tops": tops}
        else:
            answer = {"error": f"unknown request {sorted(request)}"}
        print(json.dumps(answer), file=answers, flush=True)


if __name__ == "__main__":
    main()

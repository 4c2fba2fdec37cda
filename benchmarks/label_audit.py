"""The label audit: how far a system's Quora P@1 is from the data's own ceiling.

Two steps, a person (or a reviewer) judging in between:

    # 1. sample: the test queries whose top-1 is not a labelled paraphrase, from the run
    #    file the evaluate stage wrote (what it measured)
    python benchmarks/label_audit.py sample --run ROW/reports/evaluate/test.model.run \\
        --clusters WORK/cluster --out /tmp/audit/cases.jsonl
    # 2. judge each case in judgements.csv (question_id,label,why), then report
    python benchmarks/label_audit.py report --cases /tmp/audit/cases.jsonl \\
        --judgements benchmarks/label_audit/judgements.csv

Labels: `paraphrase` (the top-1 asks the same thing: an unlabelled true paraphrase, i.e.
label noise), `near` (a near miss: same topic, a different or narrower question),
`error` (a real error). The protocol is the Quora benchmark's: every test-cluster question
is a query, itself excluded; a hit is right when it is in the query's cluster. The cases
file holds question texts: it stays out of git (no data in git); the judgements file
holds ids and labels only.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LABELS = ("paraphrase", "near", "error")


def sample(run: Path, clusters: Path, out: Path, size: int, seed: int) -> None:
    """The queries of a TREC run file (what the evaluate stage measured, e.g.
    reports/evaluate/test.model.run) whose rank-1 document is not in their cluster."""
    import pandas as pd

    questions = pd.read_parquet(clusters / "questions.parquet")
    text = questions.set_index("question_id")["text"]
    cluster = questions.set_index("question_id")["cluster_id"]
    members = questions[questions["cluster_id"] >= 0].groupby("cluster_id")["text"].apply(list)
    top1: dict[int, int] = {}
    for line in run.read_text().splitlines():
        qid, _, doc, rank, *_ = line.split()
        if rank == "1":
            top1[int(qid)] = int(doc)
    wrong = sorted(q for q, d in top1.items() if cluster[d] != cluster[q])
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(wrong), size=min(size, len(wrong)), replace=False))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i in picked:
            q = wrong[i]
            paraphrases = [t for t in members[cluster[q]] if t != text[q]]
            case = {
                "question_id": q,
                "query": text[q],
                "top1_id": top1[q],
                "top1": text[top1[q]],
                "labelled_paraphrases": paraphrases[:5],
            }
            f.write(json.dumps(case, ensure_ascii=False) + "\n")
    meta = {"run": str(run), "queries": len(top1), "wrong_top1": len(wrong)}
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{len(wrong):,} of {len(top1):,} test queries wrong at top-1; {len(picked)} sampled")


def report(cases_path: Path, judgements_path: Path, out: Path) -> None:
    cases = [json.loads(line) for line in cases_path.read_text(encoding="utf-8").splitlines()]
    meta = json.loads(cases_path.with_suffix(".meta.json").read_text())
    with judgements_path.open(encoding="utf-8") as f:
        judged = {int(r["question_id"]): r for r in csv.DictReader(f)}
    missing = [c["question_id"] for c in cases if c["question_id"] not in judged]
    if missing:
        raise SystemExit(f"{len(missing)} cases not judged, e.g. {missing[:5]}")
    bad = {r["label"] for r in judged.values()} - set(LABELS)
    if bad:
        raise SystemExit(f"unknown labels {sorted(bad)}; use {LABELS}")
    counts = {
        label: sum(judged[c["question_id"]]["label"] == label for c in cases) for label in LABELS
    }
    n, queries, wrong = len(cases), meta["queries"], meta["wrong_top1"]
    p1 = 1 - wrong / queries
    noise = counts["paraphrase"] / n
    summary = {
        "run": meta["run"],
        "queries": queries,
        "wrong_top1": wrong,
        "p1": p1,
        "audited": n,
        "counts": counts,
        "label_noise_share": noise,
        # Wrong answers judged paraphrases, extrapolated to every wrong answer.
        "p1_if_noise_counted_right": p1 + noise * wrong / queries,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "label_audit.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--run", type=Path, required=True, help="a TREC run file (test split)")
    s.add_argument("--clusters", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--size", type=int, default=200)
    s.add_argument("--seed", type=int, default=13)
    r = sub.add_parser("report")
    r.add_argument("--cases", type=Path, required=True)
    r.add_argument("--judgements", type=Path, required=True)
    r.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    args = parser.parse_args()
    if args.step == "sample":
        sample(args.run, args.clusters, args.out, args.size, args.seed)
    else:
        report(args.cases, args.judgements, args.out)


if __name__ == "__main__":
    main()

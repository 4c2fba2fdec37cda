"""Does the monitor flag a planted shift, and how often does it cry wolf?

The served bundle (the project's models/) and its training traffic (params.yaml's data)
give the reference, as `flows/monitor.py` builds it. Windows of live questions are then
measured by `qpr.monitor.report.measure` with the monitor's default thresholds:

- null windows: fresh days of the embedded generator (the training traffic's own
  distribution, other days than the training logs), each a new sample: every alarm on
  one is a false alarm;
- planted shifts: the same windows with a share of their questions replaced by Quora
  questions (another domain, another topic), at 100 %, 30 % and 10 %.

Each window's questions are searched as the service searches (k 10), so the rank-1
distance and the "no answer" rate are the served ones.

    python benchmarks/monitor_drift.py --nulls 60 --shifted 10 --window 600
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

REPO = Path(__file__).resolve().parents[1]
NAME = "monitor_drift"
QUORA = REPO.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
SHARES = (1.0, 0.3, 0.1)


def window_frame(bundle: Any, questions: list[str]) -> pd.DataFrame:
    """Query-log lines for `questions` searched as served (one batch: same results)."""
    results = bundle.search_batch(questions, 10)
    return pd.DataFrame(
        {
            "timestamp": "2027-01-01T00:00:00Z",
            "question": questions,
            "answered": [r.answered for r in results],
            "distances": [[h.distance for h in r.hits] for r in results],
            "latency_ms": 1.0,
        }
    )


def fresh_day(settings: Any, day: int, size: int) -> list[str]:
    from qpr.data.synth import generate_day

    synth = settings.data.synth
    rows = generate_day(
        dt.date(2027, 1, 1) + dt.timedelta(days=day),
        seed=synth.seed,
        rows=synth.rows_per_day,
        intents=synth.intents,
    )
    usable = [r["question"] for r in rows if str(r["question"] or "").strip()]
    return usable[:size]


def quora_questions() -> list[str] | None:
    if not QUORA.is_file():
        return None
    frame = pd.read_csv(QUORA, sep="\t", usecols=["question1"], dtype=str).dropna()
    texts = frame["question1"].str.strip()
    return texts[texts.str.len().between(10, 300)].tolist()


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "src"))
    from qpr.config import load_settings
    from qpr.data.ingest import source_questions
    from qpr.monitor.report import measure, reference_sample
    from qpr.retrieval.bundle import Bundle

    settings = load_settings(REPO / "params.yaml")
    cfg = settings.monitor.model_copy(update={"max_questions": args.window})
    bundle = Bundle.load(args.models)
    reference = reference_sample(
        source_questions(settings), bundle, cfg.reference_questions, settings.seed
    )
    no_feedback = pd.DataFrame({"outcome": []})
    rows: list[dict[str, Any]] = []
    quora = quora_questions()
    rng = np.random.default_rng(args.seed)
    for i in range(args.nulls):
        questions = fresh_day(settings, i, args.window)
        report = measure(
            window_frame(bundle, questions), no_feedback, bundle, reference, cfg, seed=i
        )
        rows.append({"kind": "null", "share": 0.0, **_summary(report)})
        print(f"null {i}: {report['alarms']}", flush=True)
    for share in SHARES if quora else ():
        for i in range(args.shifted):
            questions = fresh_day(settings, 1000 + i, args.window)
            n = round(share * len(questions))
            planted = [quora[j] for j in rng.choice(len(quora), n, replace=False)]
            mixed = planted + questions[n:]
            report = measure(
                window_frame(bundle, mixed), no_feedback, bundle, reference, cfg, seed=i
            )
            rows.append({"kind": "quora", "share": share, **_summary(report)})
            print(f"quora {share:.0%} {i}: {report['alarms']}", flush=True)
    return {
        "rows": rows,
        "window": args.window,
        "quora": quora is not None,
        "reference": len(reference.questions),
    }


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    values = {name: m["value"] for name, m in report["measures"].items()}
    return {"alarms": report["alarms"], "values": values}


def table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kind and share: windows, alarm rate of each drift measure and of any alarm."""
    frame = pd.DataFrame(result["rows"])
    measures = ("embedding_auc", "unseen_words", "length_ks", "top1_distance", "no_answer_rate")
    out = []
    for (kind, share), group in frame.groupby(["kind", "share"], sort=False):
        row = {"kind": kind, "share": share, "windows": len(group)}
        for name in measures:
            row[name] = float(group["alarms"].map(lambda a, n=name: n in a).mean())
            row[f"{name}_mean"] = float(group["values"].map(lambda v, n=name: v[n]).mean())
        row["any"] = float(group["alarms"].map(bool).mean())
        out.append(row)
    return out


def report(result: dict[str, Any]) -> str:
    machine, load = result["machine"], result["machine"]["load_average"]
    lines = [
        "# The monitor: planted shifts and false alarms",
        "",
        f"`benchmarks/monitor_drift.py`: bundle `{result['models']}` (the product default on "
        f"the embedded logs), reference: {result['reference']} of its training questions; "
        f"windows of {result['window']} questions, the monitor's default thresholds "
        f"(params.yaml `monitor`). Machine: {machine['cpu_model']}, "
        f"{machine['cpus_usable']} cores; {result['date']}. Load average before "
        f"{load['before']}, after {load['after']}.",
        "",
        "Share of windows that raised each alarm (mean value in brackets):",
        "",
        "| live questions | windows | embedding_auc | unseen_words | length_ks | top1_distance "
        "| no_answer_rate | any alarm |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["table"]:
        what = (
            "fresh days of the training traffic (null)"
            if row["kind"] == "null"
            else f"{row['share']:.0%} Quora questions"
        )
        cells = [
            f"{row[n]:.0%} ({row[f'{n}_mean']:.3f})"
            for n in (
                "embedding_auc",
                "unseen_words",
                "length_ks",
                "top1_distance",
                "no_answer_rate",
            )
        ]
        lines.append(f"| {what} | {row['windows']} | {' | '.join(cells)} | {row['any']:.0%} |")
    from scipy.stats import beta

    null = next(r for r in result["table"] if r["kind"] == "null")
    alarms = round(null["any"] * null["windows"])
    upper = float(beta.ppf(0.975, alarms + 1, null["windows"] - alarms))  # Clopper-Pearson
    lines += [
        "",
        f"False alarms: {alarms} of {null['windows']} null windows raised any alarm "
        f"(95 % upper bound on the rate: {upper:.1%}).",
        "A row's rate is the share of windows, each a new sample, so it is the chance that "
        "one hourly report of that traffic raises the alarm.",
    ]
    if not result["quora"]:
        lines.append("The Quora file was not present: no planted-shift rows.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--nulls", type=int, default=60)
    parser.add_argument("--shifted", type=int, default=10)
    parser.add_argument("--window", type=int, default=600)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / NAME)
    args = parser.parse_args()
    import sklearn

    load_before = [round(x, 2) for x in os.getloadavg()]
    result = run(args)
    result["table"] = table(result)
    result["models"] = str(
        args.models.relative_to(REPO) if args.models.is_relative_to(REPO) else args.models
    )
    result["date"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    load = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    result["machine"] = describe(REPO, {"scikit-learn": sklearn.__version__}, load_average=load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()

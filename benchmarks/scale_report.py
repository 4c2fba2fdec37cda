"""docs/results/scale.{json,md,png} from the rows `benchmarks/scale.py` measured."""

# ruff: noqa: E501  (Markdown table rows read better whole than split over lines)

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Row = dict[str, Any]


def _service_gb(r: Row) -> float:
    """The HTTP service's RSS once ready, else the in-process bundle's."""
    http = r.get("http") or {}
    return http.get("server_rss_after_gb") or r["serve"]["rss_serving_gb"]


# (label, unit, getter) of each cost plotted against N and fitted as c·N^k
COSTS: tuple[tuple[str, str, Callable[[Row], float]], ...] = (
    ("encode", "s", lambda r: r["build"]["seconds"]["encode"]),
    ("FAISS train + add", "s", lambda r: r["build"]["seconds"]["faiss"]),
    ("BM25 build", "s", lambda r: r["build"]["seconds"].get("bm25", 0.0)),
    ("index build, whole", "s", lambda r: r["build"]["wall_s"]),
    ("build peak RSS", "GB", lambda r: r["build"]["peak_rss_gb"]),
    ("bundle on disk", "GB", lambda r: sum(r["build"]["bytes"].values()) / 1e9),
    ("service load", "s", lambda r: r["serve"]["load_s"]),
    ("service RSS", "GB", _service_gb),
    ("fused p50", "ms", lambda r: r["serve"]["fused_p50_ms"]),
    ("fused p99", "ms", lambda r: r["serve"]["fused_p99_ms"]),
    ("dense p50", "ms", lambda r: r["serve"]["dense_p50_ms"]),
    ("BM25 p50 (ours)", "ms", lambda r: (r.get("lexical") or {}).get("ours", {}).get("p50_ms", 0)),
)


def exponent(ns: list[int], values: list[float]) -> tuple[float, float] | None:
    """(k, c) of the least-squares fit v = c·N^k in log-log; None below two positive points."""
    pairs = [(n, v) for n, v in zip(ns, values, strict=True) if v > 0]
    if len(pairs) < 2:
        return None
    x, y = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    k, c = np.polyfit(x, y, 1)
    return float(k), float(np.exp(c))


def report(out: Path, rows: list[Row], factory: Any, *, machine: str, engine: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: (r["size"] != "quora", r["questions"]))
    synthetic = [r for r in rows if r["size"] != "quora"]
    ns = [r["questions"] for r in synthetic]
    fits = {label: exponent(ns, [get(r) for r in synthetic]) for label, _, get in COSTS}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    payload = {"measured": stamp, "machine": machine, "engine": engine, "rows": rows,
               "factory_choice": factory,
               "exponents": {k: (v[0] if v else None) for k, v in fits.items()}}  # fmt: skip
    (out / "scale.json").write_text(json.dumps(payload, indent=1))
    _plot(out / "scale.png", rows, fits)
    (out / "scale.md").write_text(_markdown(payload | {"out": out.resolve()}, fits))


def _plot(path: Path, rows: list[Row], fits: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(16, 11))
    for ax, (label, unit, get) in zip(axes.flat, COSTS, strict=False):
        for kind, marker in (("synthetic", "o-"), ("quora", "s")):
            picked = [r for r in rows if (r["size"] == "quora") == (kind == "quora")]
            if picked:
                xs, ys = [r["questions"] for r in picked], [get(r) for r in picked]
                ax.plot(xs, ys, marker, label=kind)
        fit = fits.get(label)
        title = label
        if fit is not None:
            k, c = fit
            xs = np.geomspace(1e5, 1e8, 20)
            ax.plot(xs, c * xs**k, ":", color="grey", label="fit, to 100M")
            title += f"  (∝ N^{k:.2f})"
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("questions")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(COSTS) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _by_size(rows: list[Row]) -> dict[str, Row]:
    return {r["size"]: r for r in rows}


def _targets(rows: list[Row]) -> list[str]:
    """The issue's targets against the measured figures: met or missed, by how much."""
    by = _by_size(rows)
    lines = ["| target | measured | |", "|---|---:|---|"]

    def add(text: str, value: float | None, limit: float, unit: str, higher: bool = False) -> None:
        if value is None:
            lines.append(f"| {text} | not measured | |")
            return
        met = value >= limit if higher else value <= limit
        lines.append(f"| {text} | {value:.3g} {unit} | {'met' if met else 'MISSED'} |")

    ten, one = by.get("10M"), by.get("1M")
    if ten:
        b = ten["build"]["seconds"]
        add(
            "10M: encode + FAISS + BM25 ≤ 60 min",
            (b["encode"] + b["faiss"] + b.get("bm25", 0)) / 60,
            60,
            "min",
        )
        add("10M: peak RSS of the build ≤ 16 GB", ten["build"]["peak_rss_gb"], 16, "GB")
        add("10M: service RSS ≤ 8 GB", _service_gb(ten), 8, "GB")
        add("10M: fused p50 ≤ 2 ms (in process)", ten["serve"]["fused_p50_ms"], 2, "ms")
        add("10M: fused p99 ≤ 10 ms (in process)", ten["serve"]["fused_p99_ms"], 10, "ms")
        add(
            "10M: served recall@20 ≥ 0.98",
            ten["serve"]["served_recall_at_20"],
            0.98,
            "",
            higher=True,
        )
    else:
        lines.append("| 10M targets | not measured yet | |")
    if one:
        add("1M: fused p50 ≤ 1 ms (in process)", one["serve"]["fused_p50_ms"], 1, "ms")
    return lines  # fmt: skip


def _main_table(rows: list[Row]) -> list[str]:
    lines = [
        "| N | factory | nprobe | encode s | FAISS s | BM25 s | build s | build RSS GB | disk GB | load s | service GB | fused p50 ms | fused p99 ms | dense p50 ms | served recall@20 | dense recall@20 | P@1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in rows:
        b, s = r["build"], r["serve"]
        sec = b["seconds"]
        fresh = "" if b.get("fresh", True) else " (resumed)"
        lines.append(
            f"| {r['size']} ({r['questions']:,}) | `{b['factory']}` | {s['nprobe']} "
            f"| {sec['encode']:.0f}{fresh} | {sec['faiss']:.0f} | {sec.get('bm25', 0):.0f} "
            f"| {b['wall_s']:.0f} | {b['peak_rss_gb']:.1f} | {sum(b['bytes'].values()) / 1e9:.2f} "
            f"| {s['load_s']:.1f} | {_service_gb(r):.1f} | {s['fused_p50_ms']:.2f} "
            f"| {s['fused_p99_ms']:.2f} | {s['dense_p50_ms']:.2f} | {s['served_recall_at_20']:.3f} "
            f"| {s.get('dense_recall_at_20', float('nan')):.3f} | {s['fused_p1']:.3f} |"
        )
    return lines


def _realism(rows: list[Row]) -> list[str]:
    by = _by_size(rows)
    quora, synth = by.get("quora"), by.get("134k")
    if not (quora and synth and quora.get("lexical") and synth.get("lexical")):
        return ["Not measured yet."]
    keys = [("terms", "distinct stemmed terms", "{:,.0f}"),
            ("postings_per_question", "BM25 postings a question", "{:.2f}"),
            ("df_rank_1", "questions holding the most common term", "{:.1%}"),
            ("df_rank_10", "... the 10th", "{:.2%}"),
            ("df_rank_100", "... the 100th", "{:.2%}"),
            ("df_rank_1000", "... the 1000th", "{:.3%}"),
            ("postings_in_lists_over_1pct", "postings in lists over 1 % of N", "{:.1%}")]  # fmt: skip
    lines = ["| | Quora | synthetic |", "|---|---:|---:|"]
    for key, text, fmt in keys:
        q, s = quora["lexical"]["shape"][key], synth["lexical"]["shape"][key]
        lines.append(f"| {text} | {fmt.format(q)} | {fmt.format(s)} |")
    for text, get in (
        ("BM25 top k p50 ms", lambda r: r["lexical"]["ours"]["p50_ms"]),
        ("BM25 top k p99 ms", lambda r: r["lexical"]["ours"]["p99_ms"]),
        ("nprobe for served recall@20 0.98", lambda r: r["serve"]["nprobe"]),
        ("served recall@20 at that nprobe", lambda r: r["serve"]["served_recall_at_20"]),
        ("dense recall@20 at that nprobe", lambda r: r["serve"].get("dense_recall_at_20", 0)),
        ("fused p50 ms", lambda r: r["serve"]["fused_p50_ms"]),
    ):
        lines.append(f"| {text} | {get(quora):.3g} | {get(synth):.3g} |")
    return lines


def _lexical(rows: list[Row]) -> list[str]:
    lines = ["| N | ours p50 ms | ours p99 ms | bm25s p50 ms | bm25s p99 ms | ours / bm25s p50 | same top-10 scores |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lx = r.get("lexical")
        if not lx:
            continue
        lines.append(
            f"| {r['size']} | {lx['ours']['p50_ms']:.2f} | {lx['ours']['p99_ms']:.2f} "
            f"| {lx['bm25s']['p50_ms']:.2f} | {lx['bm25s']['p99_ms']:.2f} "
            f"| {lx['ratio_p50_ours_to_bm25s']:.2f} | {lx['same_top10_share']:.0%} |"
        )
    return lines


def _http(rows: list[Row]) -> list[str]:
    lines = ["| N | ready s | server RSS GB | p50 ms (1 client) | p99 ms | requests/s at 1 | at 4 | at 16 | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        h = r.get("http")
        if not h:
            continue
        c = [h[f"c{n}"] for n in (1, 4, 16)]
        errors = sum(x.get("errors", 0) for x in c)
        lines.append(
            f"| {r['size']} | {h['ready_s']:.1f} | {h['server_rss_after_gb']:.2f} "
            f"| {c[0].get('p50_ms', float('nan')):.2f} | {c[0].get('p99_ms', float('nan')):.2f} "
            f"| {c[0]['requests_per_s']:.0f} | {c[1]['requests_per_s']:.0f} "
            f"| {c[2]['requests_per_s']:.0f} | {errors} |"
        )
    return lines


def _beyond(fits: dict[str, Any]) -> list[str]:
    lines = ["| cost | k | at 10M | at 30M | at 100M |", "|---|---:|---:|---:|---:|"]
    for label, unit, _ in COSTS:
        fit = fits.get(label)
        if fit is None:
            continue
        k, c = fit
        cells = " | ".join(f"{c * n**k:.3g} {unit}" for n in (1e7, 3e7, 1e8))
        lines.append(f"| {label} | {k:.2f} | {cells} |")
    return lines


def _cluster_page(p: dict[str, Any]) -> str:
    """The cluster stage's results page, relative to this page's folder."""
    page = Path(__file__).resolve().parents[1] / "docs" / "results" / "cluster_scale.md"
    return os.path.relpath(page, p["out"])


def _markdown(p: dict[str, Any], fits: dict[str, Any]) -> str:
    rows = p["rows"]
    lines = [
        "# How cost grows with the corpus",
        "",
        f"Measured {p['measured']} by `benchmarks/scale.py` (engine {p['engine']}) on {p['machine']}.",
        "The machine was shared with other work during parts of the run: figures are one run each.",
        "Synthetic rows are `qpr.data.scale` corpora; quora is its 134,091 distinct questions.",
        "1,000 questions are queries (Quora: held out of the index; synthetic: new paraphrases).",
        "Queries go one at a time, in process, on 1 thread; BM25 beside on a second.",
        "The encoders: the paper's CNN at 128 dimensions, served folded, trained on each corpus",
        "for two epochs (runs before 2026-11-28: for 240 s, so a slower host trained less).",
        "Served recall: the fused top 20 against the same fusion over an exact dense search.",
        "",
        "## Targets",
        "",
        *_targets(rows),
        "",
        "## Every size",
        "",
        *_main_table(rows),
        "",
        "![cost against N, log-log, with the fit](scale.png)",
        "",
        "## Synthetic against Quora, at Quora's size",
        "",
        *_realism(rows),
        "",
        "## BM25: our MaxScore kernel against bm25s",
        "",
        "bm25s (numba backend) is given our weight matrix, so both score the same numbers;",
        "top k as the fused search takes it (100 before 2026-11-28, then 50; each row's",
        "`k` in the JSON), query blocks alternated side by side.",
        "",
        *_lexical(rows),
        "",
        "## Over HTTP (`qpr serve`, 1 search thread)",
        "",
        *_http(rows),
        "",
        "## The cluster stage",
        "",
        f"Measured on its own, in memory and in shards on each engine: [cluster_scale.md]({_cluster_page(p)}).",
        "",
        "## Beyond one machine: the fits, extrapolated",
        "",
        "c·N^k fitted over the synthetic rows; past 10M an extrapolation, not a measurement.",
        "",
        *_beyond(fits),
    ]  # fmt: skip
    choice = p.get("factory_choice")
    if choice:
        lines += ["", "## The dense index, chosen at 1M", "",
                  "Compare these with each other: other work shared the machine while they ran.", "",
                  "| factory | bytes a vector | nprobe | served recall@20 | dense p50 ms | fused p50 ms | fused p99 ms | build s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for c in choice["rows"]:
            lines.append(
                f"| `{c['factory']}` | {c['bytes_per_vector']:.0f} | {c['nprobe']} "
                f"| {c['served_recall_at_20']:.3f} | {c['dense_p50_ms']:.2f} "
                f"| {c['fused_p50_ms']:.2f} | {c['fused_p99_ms']:.2f} | {c['build_s']:.0f} |"
            )
        best = choice["rows"][choice["index"]]["template"]
        lines += ["", f"Chosen: `{best}`, the fastest fused p50 at served recall@20 ≥ 0.98 "
                  "whose 10M index fits 4 GB."]  # fmt: skip
    lines.append("")
    return "\n".join(lines)

"""docs/results/scale.{json,md,png} from the rows `benchmarks/scale.py` measured."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

# (label, unit, getter) of each cost plotted against N and fitted as c·N^k
COSTS = (
    ("encode", "s", lambda r: r["build"]["seconds"]["encode"]),
    ("FAISS train + add", "s", lambda r: r["build"]["seconds"]["faiss"]),
    ("BM25 build", "s", lambda r: r["build"]["seconds"].get("bm25", 0.0)),
    ("index build, whole", "s", lambda r: r["build"]["wall_s"]),
    ("build peak RSS", "GB", lambda r: r["build"]["peak_rss_gb"]),
    ("bundle on disk", "GB", lambda r: sum(r["build"]["bytes"].values()) / 1e9),
    ("service load", "s", lambda r: r["serve"]["load_s"]),
    ("service RSS", "GB", lambda r: r["serve"]["rss_serving_gb"]),
    ("fused p50", "ms", lambda r: r["serve"]["fused_p50_ms"]),
    ("fused p99", "ms", lambda r: r["serve"]["fused_p99_ms"]),
    ("dense p50", "ms", lambda r: r["serve"]["dense_p50_ms"]),
)  # fmt: skip


def exponent(ns: list[int], values: list[float]) -> float | None:
    """k of the least-squares fit log v = k·log N + c; None below two positive points."""
    pairs = [(n, v) for n, v in zip(ns, values, strict=True) if v > 0]
    if len(pairs) < 2:
        return None
    x, y = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    return float(np.polyfit(x, y, 1)[0])


def report(
    out: Path, rows: list[dict[str, Any]], factory: Any, *, machine: str, engine: str
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    synthetic = [r for r in rows if r["size"] != "quora"]
    ns = [r["questions"] for r in synthetic]
    fits = {label: exponent(ns, [get(r) for r in synthetic]) for label, _, get in COSTS}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    payload = {"measured": stamp, "machine": machine, "engine": engine, "rows": rows,
               "factory_choice": factory, "exponents": fits}  # fmt: skip
    (out / "scale.json").write_text(json.dumps(payload, indent=1))
    _plot(out / "scale.png", rows, fits)
    (out / "scale.md").write_text(_markdown(payload))


def _plot(path: Path, rows: list[dict[str, Any]], fits: dict[str, float | None]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(16, 11))
    for ax, (label, unit, get) in zip(axes.flat, COSTS, strict=False):
        for kind, marker in (("synthetic", "o-"), ("quora", "s")):
            picked = [r for r in rows if (r["size"] == "quora") == (kind == "quora")]
            if picked:
                ax.plot(
                    [r["questions"] for r in picked], [get(r) for r in picked], marker, label=kind
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        k = fits.get(label)
        ax.set_title(f"{label}" + (f"  (∝ N^{k:.2f})" if k is not None else ""))
        ax.set_xlabel("questions")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(COSTS) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _markdown(p: dict[str, Any]) -> str:
    rows = p["rows"]
    lines = [
        "# How cost grows with the corpus",
        "",
        f"Measured {p['measured']} by `benchmarks/scale.py` (engine {p['engine']}) on {p['machine']}.",
        "Synthetic rows: `qpr.data.scale` corpora; the quora row: its 134k distinct questions,",
        "1,000 held out as queries. Queries go one at a time, in process, 1 thread.",
        "",
        "| N | factory | nprobe | encode s | FAISS s | BM25 s | build s | build RSS GB | disk GB | load s | service GB | fused p50 ms | fused p99 ms | dense p50 ms | recall@20 | P@1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in rows:
        b, s = r["build"], r["serve"]
        sec = b["seconds"]
        lines.append(
            f"| {r['size']} ({r['questions']:,}) | `{b['factory']}` | {s['nprobe']} | {sec['encode']:.0f} "
            f"| {sec['faiss']:.0f} | {sec.get('bm25', 0):.0f} | {b['wall_s']:.0f} "
            f"| {b['peak_rss_gb']:.1f} | {sum(b['bytes'].values()) / 1e9:.2f} | {s['load_s']:.1f} "
            f"| {s['rss_serving_gb']:.1f} | {s['fused_p50_ms']:.2f} | {s['fused_p99_ms']:.2f} "
            f"| {s['dense_p50_ms']:.2f} | {s['served_recall_at_20']:.3f} | {s['fused_p1']:.3f} |"
        )
    lines += ["", "Growth exponent k of each cost ∝ N^k, fitted over the synthetic rows:", ""]
    lines += [
        f"- {label}: " + (f"{k:.2f}" if k is not None else "n/a")
        for label, k in p["exponents"].items()
    ]
    choice = p.get("factory_choice")
    if choice:
        lines += ["", "## The dense index, chosen at 1M", "",
                  "| factory | bytes a vector | nprobe | recall@20 | dense p50 ms | fused p50 ms | fused p99 ms | build s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for c in choice["rows"]:
            lines.append(
                f"| `{c['factory']}` | {c['bytes_per_vector']:.0f} | {c['nprobe']} | {c['served_recall_at_20']:.3f} "
                f"| {c['dense_p50_ms']:.2f} | {c['fused_p50_ms']:.2f} | {c['fused_p99_ms']:.2f} | {c['build_s']:.0f} |"
            )
        lines += [
            "",
            f"Chosen: the fastest fused p50 at served recall@20 >= 0.98 whose 10M index fits 4 GB: `{choice['rows'][choice['index']]['template']}`.",
        ]
    lines += ["", "![cost against N](scale.png)", ""]
    return "\n".join(lines)

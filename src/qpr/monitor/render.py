"""A monitoring report for people: one PNG of four panels and one HTML page.

The JSON report (`qpr.monitor.report.measure`) carries every number the plot shows, so a
machine never parses the page. The page embeds the plot (base64), so it is one file to
open or mail.
"""

from __future__ import annotations

import base64
import html
import itertools
from pathlib import Path
from typing import Any

__all__ = ["write_html", "write_plot"]


def _bars(ax: Any, histogram: dict[str, list], title: str, xlabel: str) -> None:
    edges = histogram["edges"]
    centres = [(a + b) / 2 for a, b in itertools.pairwise(edges)]
    width = (edges[1] - edges[0]) * 0.45 if len(edges) > 1 else 0.4
    ax.bar([c - width / 2 for c in centres], histogram["reference"], width, label="training")
    ax.bar([c + width / 2 for c in centres], histogram["live"], width, label="live")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of questions")
    ax.legend()


def write_plot(report: dict[str, Any], path: Path) -> Path:
    """report.png: words per question and rank-1 distance (training against live),
    questions and "no answer" per hour, search p50 per hour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    histograms = report["histograms"]
    if histograms:
        _bars(axes[0, 0], histograms["words_per_question"], "Question length", "words")
        _bars(axes[0, 1], histograms["top1_distance"], "Nearest known question", "distance")
    else:
        for ax in axes[0]:
            ax.text(0.5, 0.5, "drift waits for more questions", ha="center", va="center")
            ax.set_axis_off()
    hours = report["hourly"]
    x = list(range(len(hours)))
    labels = [h["hour"][5:13].replace("T", " ") + "h" for h in hours]
    volume = axes[1, 0]
    volume.bar(x, [h["questions"] for h in hours], color="#bbbbbb", label="questions")
    volume.set_ylabel("questions per hour")
    rate = volume.twinx()
    rate.plot(x, [h["no_answer_rate"] for h in hours], color="C3", marker="o", label="no answer")
    rate.set_ylim(0, 1)
    rate.set_ylabel('share "no answer"')
    volume.set_title("Traffic")
    latency = axes[1, 1]
    latency.plot(x, [h["latency_p50_ms"] for h in hours], marker="o")
    latency.set_ylabel("search p50 (ms)")
    latency.set_title("Latency")
    for ax in (volume, latency):
        step = max(1, len(x) // 8)
        ax.set_xticks(x[::step], labels[::step], rotation=30, ha="right", fontsize=8)
    alarms = ", ".join(report["alarms"]) or "none"
    fig.suptitle(f"QPR monitor - alarms: {alarms}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))


def write_html(report: dict[str, Any], plot: Path, path: Path) -> Path:
    """report.html: the alarms, a row per measure, the plot inline."""
    rows = "".join(
        f"<tr class={'alarm' if m['alarm'] else 'ok'}><td>{html.escape(name)}</td>"
        f"<td>{_value(m['value'])}</td><td>{_value(m['threshold'])}</td>"
        f"<td>{'ALARM' if m['alarm'] else 'ok'}</td></tr>"
        for name, m in report["measures"].items()
    )
    service, window = report["service"], report["window"]
    waiting = (
        ""
        if report["drift_measured"]
        else f"<p>Drift waits for {report['waiting_for']} more questions.</p>"
    )
    image = base64.b64encode(plot.read_bytes()).decode("ascii")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>QPR monitor</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}
td,th{{padding:.2em .8em;text-align:left}}.alarm{{background:#fdd}}.ok{{background:#efe}}</style>
</head><body><h1>QPR monitor</h1>
<p>{service["questions"]} questions from {_value(window["first"])} to {_value(window["last"])}.
Alarms: <b>{html.escape(", ".join(report["alarms"]) or "none")}</b>.</p>{waiting}
<table><tr><th>measure</th><th>value</th><th>threshold</th><th></th></tr>{rows}</table>
<img alt="monitor plots" style="max-width:100%" src="data:image/png;base64,{image}">
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path

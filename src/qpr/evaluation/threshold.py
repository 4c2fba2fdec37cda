"""The "no answer" threshold (seed 002): answer only when the rank-1 question is close
enough. The precision of the top answer is measured against the share of queries
answered on the validation split; the threshold that answers the most queries at the
target precision is chosen there and reported on test.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from qpr.evaluation.queries import SystemResult
from qpr.evaluation.trec import format_table
from qpr.io import write_text_atomic


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


def threshold_report(
    val: SystemResult, test: SystemResult, target: float, out_dir: Path, plot: Path
) -> tuple[float | None, dict[str, float | None], pd.DataFrame]:
    """Choose the no-answer threshold on val (the largest one whose answered queries reach
    P@1 `target`); measure what it gives on test. Writes threshold.md into `out_dir` and
    the validation curve to `plot`. Returns (threshold or None, summary, validation curve)."""

    def correct(result: SystemResult) -> np.ndarray:
        return np.array([result.per_query[q]["success_1"] > 0 for q in result.per_query])

    val_curve = threshold_curve(val.top1, correct(val))
    chosen = pick_threshold(val_curve, target)
    plot_threshold_curve(val_curve, plot, chosen)
    test_correct = correct(test)
    summary: dict[str, float | None] = {
        "value": chosen,
        "target_precision": target,
        "val_answered_share": None,
        "test_answered_share": None,
        "test_precision_at_1": None,
    }
    if chosen is not None:
        answered_val = val.top1 <= chosen
        answered = test.top1 <= chosen
        summary["val_answered_share"] = float(answered_val.mean())
        summary["test_answered_share"] = float(answered.mean())
        summary["test_precision_at_1"] = (
            float(test_correct[answered].mean()) if answered.any() else None
        )
    table = val_curve.iloc[:: max(1, len(val_curve) // 10)]
    write_text_atomic(
        out_dir / "threshold.md",
        "# No-answer threshold (validation split)\n\n"
        + format_table(
            table.to_dict("records"),
            ["threshold", "answered_share", "answered", "precision_at_1"],
        )
        + f"\n\nChosen for P@1 ≥ {target}: {chosen}\n",
    )
    return chosen, summary, val_curve

"""The "no answer" threshold (seed 002): answer only when the rank-1 question is close
enough. The precision of the top answer is measured against the share of queries
answered on the validation split, and so is the share of queries with no paraphrase
that get an answer anyway (false answers; `qpr.evaluation.no_answer` builds those
queries). The threshold that answers the most queries at the target precision, within
the bound on false answers, is chosen there and reported on test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qpr.evaluation.no_answer import Unanswerable
from qpr.evaluation.queries import SystemResult
from qpr.evaluation.trec import format_table
from qpr.io import write_text_atomic

# Past these the chosen threshold is flagged (log, metrics, report): it refuses most
# answerable questions, or answers too many that have no paraphrase.
WARN_ANSWERED_BELOW = 0.5
WARN_FALSE_ANSWERS_ABOVE = 0.2


def threshold_curve(
    top1_distances: np.ndarray,
    top1_correct: np.ndarray,
    *,
    points: int = 101,
    higher_is_better: bool = False,
    unanswerable: np.ndarray | None = None,
) -> pd.DataFrame:
    """Precision of the top answer, and false answers, against the share answered.

    top1_distances : float32 [Q] rank-1 distance per answerable query (non-finite =
        nothing found: never answered, still in the denominator of answered_share).
    top1_correct : bool [Q] rank-1 result is a paraphrase (per_query success_1 == 1).
    points : thresholds are the `points` quantiles (0, 1/(points-1), ..., 1) of the finite
        distances (answerable and unanswerable together), taken as observed values
        (method "lower"), duplicates removed; the last threshold answers every finite query.
    higher_is_better : for similarities (IP, BM25): answer when score >= threshold.
    unanswerable : float [U] rank-1 distances of queries with no paraphrase in the index
        (`qpr.evaluation.no_answer`); None: false answers are not measured (NaN).

    A query is answered when distance <= threshold. Returns a DataFrame with columns
    threshold, answered_share (answered / Q), answered, precision_at_1 (correct answered /
    answered), false_answers (unanswerable answered), false_answer_rate (false_answers /
    U), one row per threshold, in order of growing answered_share.
    """
    d = np.asarray(top1_distances, dtype=np.float64)
    ok = np.asarray(top1_correct, dtype=bool)
    if d.shape != ok.shape or d.ndim != 1:
        raise ValueError(f"need two [Q] arrays, got {d.shape} and {ok.shape}")
    if points < 2:
        raise ValueError("points must be >= 2")
    u = np.empty(0) if unanswerable is None else np.asarray(unanswerable, np.float64).ravel()
    columns = [*CURVE_COLUMNS]
    # Work in "lower = more confident" space; flip back for the reported thresholds.
    key, u_key = (-d, -u) if higher_is_better else (d, u)
    pool = np.concatenate([key, u_key])
    pool = pool[np.isfinite(pool)]
    if not pool.size:
        return pd.DataFrame(columns=columns)
    levels = np.unique(np.quantile(pool, np.linspace(0, 1, points), method="lower"))
    answered = (key[None, :] <= levels[:, None]) & np.isfinite(key)[None, :]
    n_answered = answered.sum(axis=1)
    n_correct = (answered & ok[None, :]).sum(axis=1)
    false = ((u_key[None, :] <= levels[:, None]) & np.isfinite(u_key)[None, :]).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = n_correct / n_answered
        false_rate = false / u.size if unanswerable is not None else np.full(levels.size, np.nan)
    return pd.DataFrame(
        {
            "threshold": -levels if higher_is_better else levels,
            "answered_share": n_answered / max(d.size, 1),
            "answered": n_answered,
            "precision_at_1": precision,
            "false_answers": false,
            "false_answer_rate": false_rate,
        }
    )


CURVE_COLUMNS = (
    "threshold",
    "answered_share",
    "answered",
    "precision_at_1",
    "false_answers",
    "false_answer_rate",
)


def pick_threshold(
    curve: pd.DataFrame, target_precision: float, max_false_answer_rate: float | None = None
) -> float | None:
    """The threshold answering the most queries while precision_at_1 >= target (and,
    given `max_false_answer_rate`, false_answer_rate <= it).

    "Largest" in the answering sense: the highest distance threshold (the lowest one for
    a curve built with higher_is_better, which lists thresholds in decreasing order).
    Precision is not monotone in the threshold, so this is the last qualifying row of the
    curve, not the first crossing. None when no threshold qualifies.
    """
    ok = curve["precision_at_1"] >= target_precision
    if max_false_answer_rate is not None:
        # NaN (nothing measured) passes: warnings_for says the bound was never tested.
        ok &= curve["false_answer_rate"].fillna(0.0) <= max_false_answer_rate
    if not ok.any():
        return None
    return float(curve.loc[ok, "threshold"].iloc[-1])


@dataclass(frozen=True)
class Choice:
    """The threshold chosen on validation and the rule that chose it."""

    threshold: float | None
    rule: str  # "target": precision and bound met; "bound": only the bound; "strictest"
    meets_target: bool


def choose_threshold(
    curve: pd.DataFrame, target_precision: float, max_false_answer_rate: float
) -> Choice:
    """The threshold the service gets. First choice: the most answering one with P@1 >=
    target among answered and false answers within the bound. When none qualifies, a
    wrong answer is taken as worse than a refusal: the most answering one within the
    bound alone; when even the strictest threshold breaks the bound, the strictest."""
    both = pick_threshold(curve, target_precision, max_false_answer_rate)
    if both is not None:
        return Choice(both, "target", True)
    within = curve[curve["false_answer_rate"].fillna(0.0) <= max_false_answer_rate]
    if not within.empty:
        return Choice(float(within["threshold"].iloc[-1]), "bound", False)
    if curve.empty:
        return Choice(None, "none", False)
    return Choice(float(curve["threshold"].iloc[0]), "strictest", False)


def outcome(
    threshold: float | None,
    result: SystemResult,
    unanswerable: np.ndarray,
    answerable: np.ndarray | None = None,
) -> dict[str, float | None]:
    """What `threshold` gives on one split: answered_share and precision_at_1 over the
    answerable queries (bool [Q] mask `answerable`; None: all), false_answer_rate over
    the `unanswerable` rank-1 distances (float [U]). None threshold: every query with a
    hit is answered (what the service does without one)."""
    keep = np.ones(result.top1.shape, bool) if answerable is None else answerable
    return outcome_of(threshold, result.top1[keep], top1_correct(result)[keep], unanswerable)


def outcome_of(
    threshold: float | None, top1: np.ndarray, correct: np.ndarray, unanswerable: np.ndarray
) -> dict[str, float | None]:
    """`outcome` over arrays: answered share and P@1 among answered of the answerable
    rank-1 distances `top1` (float [Q], with bool [Q] `correct`), and the share of the
    unanswerable rank-1 distances (float [U]) answered. None: every hit is answered."""
    limit = np.inf if threshold is None else threshold
    top1 = np.asarray(top1, np.float64)
    answered = np.isfinite(top1) & (top1 <= limit)
    u = np.asarray(unanswerable, np.float64)
    false = np.isfinite(u) & (u <= limit)
    return {
        "answered_share": float(answered.mean()) if answered.size else None,
        "precision_at_1": float(correct[answered].mean()) if answered.any() else None,
        "false_answer_rate": float(false.mean()) if u.size else None,
        "answerable": int(top1.size),
        "unanswerable": int(u.size),
    }


def warnings_for(summary: dict) -> list[str]:
    """Loud complaints about the chosen threshold's test figures (empty when none)."""
    out: list[str] = []
    share, false = summary.get("test_answered_share"), summary.get("test_false_answer_rate")
    if not summary.get("meets_target"):
        out.append(
            f"no threshold reaches P@1 {summary['target_precision']} among answered within "
            f"{summary['max_false_answer_rate']:.0%} false answers on validation "
            f"(chosen by rule {summary['rule']!r})"
        )
    for split in ("val", "test"):
        if not summary.get(f"{split}_unanswerable"):
            out.append(f"no {split} query without a paraphrase: false answers not measured")
    if share is not None and share < WARN_ANSWERED_BELOW:
        out.append(f"answers only {share:.1%} of the answerable test queries")
    if false is not None and false > WARN_FALSE_ANSWERS_ABOVE:
        out.append(f"falsely answers {false:.1%} of the test queries with no paraphrase")
    return out


def top1_correct(result: SystemResult) -> np.ndarray:
    """bool [Q] rank-1 is a paraphrase, in query order."""
    return np.array([result.per_query[q]["success_1"] > 0 for q in result.per_query], bool)


def plot_threshold_curve(
    curve: pd.DataFrame,
    path: str | os.PathLike[str],
    chosen: float | None = None,
    *,
    title: str = "No-answer threshold (validation)",
) -> Path:
    """PNG of precision_at_1 among answered, and the false-answer rate on queries with no
    paraphrase (when measured), against answered_share; ``chosen`` (a threshold of the
    curve) is marked. Uses the Agg canvas directly: no pyplot state, no display needed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(curve["answered_share"], curve["precision_at_1"], marker=".", lw=1, label="P@1")
    measured = "false_answer_rate" in curve and curve["false_answer_rate"].notna().any()
    if measured:
        ax.plot(
            curve["answered_share"],
            curve["false_answer_rate"],
            marker=".",
            lw=1,
            color="tab:orange",
            label="false answers (no-paraphrase queries)",
        )
    if chosen is not None and not curve.empty:
        at = int(np.argmin(np.abs(curve["threshold"].to_numpy() - chosen)))
        share, precision = curve["answered_share"].iloc[at], curve["precision_at_1"].iloc[at]
        ax.axvline(share, color="tab:red", ls="--", lw=1)
        ax.scatter([share], [precision], color="tab:red", zorder=3)
        false = f", false {curve['false_answer_rate'].iloc[at]:.1%}" if measured else ""
        ax.annotate(
            f"threshold {chosen:.4g}\nanswered {share:.1%}, P@1 {precision:.3f}{false}",
            (share, precision),
            textcoords="offset points",
            xytext=(-10, -40),
            ha="right" if share > 0.5 else "left",
        )
    ax.set_xlabel("share of answerable queries answered")
    ax.set_ylabel("rate")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def threshold_report(
    val: SystemResult,
    test: SystemResult,
    out_dir: Path,
    plot: Path,
    *,
    target: float,
    max_false_answer_rate: float,
    no_paraphrase: dict[str, Unanswerable],
) -> tuple[float | None, dict, pd.DataFrame]:
    """Choose the no-answer threshold on val (`choose_threshold` over the answerable
    queries and the held-out ones of `no_paraphrase["val"]`); measure what it gives on
    test. Writes threshold.md into `out_dir` and the validation curve to `plot`. Returns
    (threshold or None, summary, validation curve); summary["warnings"] lists what is
    wrong with it (`warnings_for`)."""
    results = {"val": val, "test": test}
    answerable = {split: ~no_paraphrase[split].held_out for split in results}
    val_ok = answerable["val"]
    val_curve = threshold_curve(
        val.top1[val_ok], top1_correct(val)[val_ok], unanswerable=no_paraphrase["val"].distances
    )
    choice = choose_threshold(val_curve, target, max_false_answer_rate)
    plot_threshold_curve(val_curve, plot, choice.threshold)
    summary: dict = {
        "value": choice.threshold,
        "target_precision": target,
        "max_false_answer_rate": max_false_answer_rate,
        "rule": choice.rule,
        "meets_target": choice.meets_target,
    }
    for split, result in results.items():
        got = outcome(choice.threshold, result, no_paraphrase[split].distances, answerable[split])
        summary.update({f"{split}_{key}": value for key, value in got.items()})
    summary["warnings"] = warnings_for(summary)
    summary["warning"] = int(bool(summary["warnings"]))
    write_text_atomic(out_dir / "threshold.md", threshold_markdown(val_curve, summary))
    return choice.threshold, summary, val_curve


def threshold_markdown(curve: pd.DataFrame, summary: dict) -> str:
    """threshold.md: the choice, its test figures, any warning, the validation curve."""
    table = curve.iloc[:: max(1, len(curve) // 12)]
    lines = [
        "# No-answer threshold",
        "",
        f"Chosen on validation: **{summary['value']}** (rule `{summary['rule']}`: P@1 ≥ "
        f"{summary['target_precision']} among answered, false answers ≤ "
        f"{summary['max_false_answer_rate']:.0%} of the queries with no paraphrase).",
        "",
    ]
    if summary["warnings"]:
        lines += ["## WARNING", "", *[f"- {w}" for w in summary["warnings"]], ""]
    rows = [
        {"split": split, **{key: summary.get(f"{split}_{key}") for key in _OUTCOME}}
        for split in ("val", "test")
    ]
    lines += [
        "## What it gives",
        "",
        format_table(rows, ["split", *_OUTCOME]),
        "",
        "answered_share and precision_at_1: over the answerable queries; "
        "false_answer_rate: over the held-out queries (own cluster removed from the index).",
        "",
        "## Validation curve",
        "",
        format_table(table.to_dict("records"), list(CURVE_COLUMNS)),
        "",
    ]
    return "\n".join(lines)


_OUTCOME = ("answered_share", "precision_at_1", "false_answer_rate", "answerable", "unanswerable")

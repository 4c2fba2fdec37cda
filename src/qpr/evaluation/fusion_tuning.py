"""Fusion tuning: how the served search mixes the dense ranking with BM25, chosen on the
validation split.

- `choose_dense_weight`: the fusion weight α (and the companion's w) chosen on validation
  P@1, over an exact dense search (α is the model's, not the index's), by a rule
  (`choose_setting`): the best, or the setting that leans least on the trained model
  among those within one paired standard error of it (`lean_choice`);
- `choose_served_depth`: then the shallowest IVF / HNSW search whose fused top k keeps the
  target recall of that exact ranking.

Both work on the served ranking's own steps (`qpr.retrieval.hybrid`: `Candidates` found
once, `fuse` at each α), so what is tuned here is what the service serves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from qpr.evaluation.queries import QuerySet, score_system
from qpr.retrieval.hybrid import Candidates, fuse


def val_hits(
    candidates: Candidates,
    dense_weight: float,
    queries: QuerySet,
    row_to_qid: np.ndarray,
    k: int,
    companion_weight: float = 0.0,
) -> np.ndarray:
    """float64 [Q] (queries' order): 1 where the candidates fused at α = dense_weight, the
    companion mixed in at companion_weight, rank a paraphrase first (ties as the service
    breaks them: by row), else 0."""
    ranking = fuse(candidates, dense_weight, k, companion_weight)
    result = score_system(
        "model", queries, ranking.rows, ranking.scores, row_to_qid, higher_is_better=True, seconds=0
    )
    per_query = result.per_query
    return np.array(
        [per_query.get(str(q), {}).get("success_1", 0.0) for q in queries.query_ids], np.float64
    )


def trained_share(dense_weight: float, companion_weight: float) -> float:
    """How much of the fused score the trained query encoder holds: α, less the share of
    the dense term the packaged companion takes (BM25 and the companion learn nothing
    from the training split)."""
    return dense_weight * (1.0 - companion_weight)


def paired_error(hits: np.ndarray, best: np.ndarray) -> float:
    """The standard error of mean(hits - best), two float64 [Q] success@1 vectors on the
    same queries: the settings are judged on the same Q queries, so their difference is
    known far better than either P@1 alone."""
    diff = hits - best
    return float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0


def within_reach(hits: np.ndarray, best: np.ndarray) -> bool:
    """Whether a setting's success@1 (float64 [Q]) is within one paired standard error
    of the best's, on the same queries."""
    return bool(hits.mean() >= best.mean() - paired_error(hits, best))


Setting = tuple[float, float]  # (companion weight w, dense weight α)


def best_setting(hits: dict[Setting, np.ndarray]) -> Setting:
    """(w, α) with the best P@1. hits: per (w, α), float64 [Q] success@1 on the same
    queries. Ties go to the smaller w (0 leaves the companion out), then the larger α."""
    return max(hits, key=lambda wa: (hits[wa].mean(), -wa[0], wa[1]))


def near_best(hits: dict[Setting, np.ndarray]) -> list[Setting]:
    """The settings of `hits` within one paired standard error of the best (the best
    included): these queries cannot tell them from it."""
    best = hits[best_setting(hits)]
    return [wa for wa, h in hits.items() if within_reach(h, best)]


def lean_choice(hits: dict[Setting, np.ndarray]) -> Setting:
    """(w, α) by the one-standard-error rule (Hastie, Tibshirani and Friedman, §7.10).
    hits: per (w, α), float64 [Q] success@1 on the same queries.

    Validation is in domain: it rewards the trained encoder for what it learnt of this
    domain's wording, which another domain does not share. A setting whose P@1 is within
    one paired standard error (`paired_error`) of the best cannot be told from it on these
    queries, so the one that leans least on the trained encoder (`trained_share`) is kept;
    ties go to the better P@1, then the smaller w, then the larger α."""
    return min(
        near_best(hits),
        key=lambda wa: (trained_share(wa[1], wa[0]), -hits[wa].mean(), wa[0], -wa[1]),
    )


# index.lexical.rule: how the served (w, α) is chosen from validation hits.
RULES: dict[str, Callable[[dict[Setting, np.ndarray]], Setting]] = {
    "best": best_setting,
    "one_se": lean_choice,
}


def choose_setting(hits: dict[Setting, np.ndarray], rule: str) -> Setting:
    """(w, α) chosen from per-setting validation hits by `rule` (one of RULES)."""
    if rule not in RULES:
        raise ValueError(f"unknown fusion rule {rule!r}: {' or '.join(RULES)}")
    return RULES[rule](hits)


def choose_dense_weight(
    val: Candidates,
    weights: Sequence[float],
    queries: QuerySet,
    row_to_qid: np.ndarray,
    k: int,
    plot: Path,
    companion_weights: Sequence[float] = (0.0,),
    rule: str = "best",
) -> dict:
    """The α of `weights` (and w of `companion_weights`) served, chosen on validation
    success@1 by `rule` (`choose_setting`: "best" or "one_se"); the curve at the chosen w
    is plotted, the α within one paired standard error of the best marked. val: the
    validation queries' candidates from an exact dense search.

    Returns "dense_weight", "val_success_1" (the α curve at the chosen w), "rule",
    "best" (the best setting and its P@1), "standard_error" (the served setting's paired
    error against the best: 0 when the best is served) and "near_best" (the settings
    within one paired error of the best); with a companion also "companion_weight" and
    each w's best P@1 ("val_success_1_by_companion")."""
    hits = {
        (float(w), float(a)): val_hits(val, a, queries, row_to_qid, k, w)
        for w in sorted(set(companion_weights))
        for a in sorted(set(weights))
    }
    grid = {wa: float(h.mean()) for wa, h in hits.items()}
    best = best_setting(hits)
    chosen_w, chosen_a = choose_setting(hits, rule)
    near = near_best(hits)
    by_weight = {str(a): p1 for (w, a), p1 in grid.items() if w == chosen_w}
    plot_fusion_curve(by_weight, chosen_a, plot, [str(a) for w, a in near if w == chosen_w])
    out = {
        "dense_weight": chosen_a,
        "val_success_1": by_weight,
        "chosen_on": "val",
        "rule": rule,
        "best": {"dense_weight": best[1], "companion_weight": best[0], "val_success_1": grid[best]},
        "standard_error": paired_error(hits[(chosen_w, chosen_a)], hits[best]),
        "near_best": [{"dense_weight": a, "companion_weight": w} for w, a in near],
    }
    if set(companion_weights) != {0.0}:
        out["companion_weight"] = chosen_w
        out["val_success_1_by_companion"] = {
            str(w): max(p1 for (w2, _), p1 in grid.items() if w2 == w)
            for w in sorted(set(companion_weights))
        }
    return out


# How deep a fused search may go, tried from the shallowest up: inverted lists probed
# (IVF, qpr.retrieval.dense.set_nprobe) or graph candidates kept (HNSW,
# qpr.retrieval.dense.set_ef_search).
# Steps of about 1.5x: a search's cost grows with its depth, so doubling would often
# serve up to twice the lists the target needs.
SERVED_DEPTHS = {
    "nprobe": (
        *(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768),
        *(1024, 1536, 2048, 3072, 4096, 6144, 8192),
    ),
    "ef_search": (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024),
}


def choose_served_depth(
    index,
    exact: Candidates,
    served: Callable[[], Candidates],
    dense_weight: float,
    k: int,
    target: float,
    log: Callable[[str], None] = print,
    companion_weight: float = 0.0,
) -> dict:
    """The shallowest search (fewest IVF lists, or fewest HNSW candidates kept) whose
    fused top k keeps `target` of the top k fused from an exact dense search.

    exact: the validation candidates found over the index's exact twin
    (`qpr.retrieval.dense.exact_twin`); served(): the same queries' candidates found over
    `index` at the depth it is set to now (`HybridSearch.candidates`).

    A fused ranking takes only a few candidates from the index and scores every candidate
    exactly, so it needs a far shallower search than the dense ranking alone. Depths are
    tried from SERVED_DEPTHS below the index's own, then its own; the first to reach the
    target is chosen (the index's own when none does: `reached` is False), and the index is
    left set to it. Returns {"nprobe", "ef_search" (the one chosen, the other None),
    "recall", "target", "reached", "by_nprobe" / "by_ef_search" (recall per depth tried)};
    a Flat index gets its recall measured as it stands, both depths None.
    """
    import faiss

    from qpr.retrieval.dense import (
        ef_search_of,
        nlist_of,
        recall_against,
        set_ef_search,
        set_nprobe,
    )

    reference = fuse(exact, dense_weight, k, companion_weight).rows

    def served_recall() -> float:
        return recall_against(fuse(served(), dense_weight, k, companion_weight).rows, reference)

    out: dict = {"nprobe": None, "ef_search": None, "by_nprobe": {}, "by_ef_search": {}}
    if nlist_of(index) is not None:
        knob, own, set_depth = "nprobe", int(faiss.extract_index_ivf(index).nprobe), set_nprobe
    elif ef_search_of(index) is not None:
        knob, own, set_depth = "ef_search", int(ef_search_of(index)), set_ef_search
    else:
        recall = served_recall()
        return {**out, "recall": recall, "target": target, "reached": recall >= target}
    tried: dict[str, float] = {}
    chosen = own
    for depth in [d for d in SERVED_DEPTHS[knob] if d < own] + [own]:
        set_depth(index, depth)
        tried[str(depth)] = served_recall()
        log(f"served recall@{k} of the fusion at {knob} {depth}: {tried[str(depth)]:.4f}")
        if tried[str(depth)] >= target:
            chosen = depth
            break
    set_depth(index, chosen)
    recall = tried[str(chosen)]
    return {
        **out,
        knob: chosen,
        f"by_{knob}": tried,
        "recall": recall,
        "target": target,
        "reached": recall >= target,
    }


def plot_fusion_curve(
    by_weight: dict[str, float],
    chosen: float | None,
    path: Path,
    near: Sequence[str] | None = None,
) -> Path:
    """Validation P@1 against α; near: the α (keys of by_weight) within one paired
    standard error of the best, drawn filled. Without fusion (empty by_weight) a figure
    that says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    if by_weight and chosen is not None:
        ax.plot([float(w) for w in by_weight], list(by_weight.values()), marker="o")
        ax.axvline(chosen, color="grey", linestyle="--", label=f"chosen α = {chosen:g}")
        if near:
            ax.plot(
                [float(w) for w in near],
                [by_weight[w] for w in near],
                "o",
                color="tab:orange",
                label="within 1 paired SE of the best",
            )
        ax.legend()
    else:
        ax.text(
            0.5,
            0.5,
            "index.lexical.enabled is false:\nthe dense ranking alone is served",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel("dense weight α (0 = BM25 alone, 1 = dense alone)")
    ax.set_ylabel("validation P@1")
    ax.set_title("Fusion of the dense ranking with BM25")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

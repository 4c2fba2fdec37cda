"""One monitoring report: live questions from the query log against the questions the
model was trained on, and the service's health as the log records it.

`measure` takes the query and feedback lines of a window (`qpr.querylog`) and the served
bundle, and returns a JSON-ready dict. The reference is a seeded sample of the training data's
questions, as asked (`reference_sample`). It reads and writes no file: the monitor flow
(flows/monitor.py) does.

Every measure is ``{"value", "threshold", "alarm", "detail"}``.

Alarms, each a threshold of `monitor.*` in params.yaml:

==================  ======================================================================
``embedding_auc``   a classifier tells live questions from training ones (drift.py)
``unseen_words``    live questions use words the training questions never use
``length_ks``       live questions are longer or shorter
``top1_distance``   the nearest known question is farther away than for training ones
``no_answer_rate``  the service says "no answer" too often
``acceptance``      people reject the answers (once enough verdicts came in)
``latency_p99``     the search itself got slow
==================  ======================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.config import MonitorSettings
from qpr.monitor.drift import DriftResult, embedding_drift, ks_drift, vocabulary_drift
from qpr.text.words import tokenize

if TYPE_CHECKING:
    from qpr.retrieval.bundle import Bundle

__all__ = ["ALARMS", "Reference", "measure", "reference_sample"]

ALARMS = (
    "embedding_auc",
    "unseen_words",
    "length_ks",
    "top1_distance",
    "no_answer_rate",
    "acceptance",
    "latency_p99",
)


@dataclass(frozen=True)
class Reference:
    """What live questions are compared with: a sample of the training traffic, its
    vectors and its rank-1 distances, searched as the service searches."""

    questions: list[str]
    vectors: np.ndarray  # float32 [R, D]
    top1: np.ndarray  # float64 [R]; inf: no hit


def reference_sample(training: Sequence[str], bundle: Bundle, size: int, seed: int) -> Reference:
    """A seeded sample of at most `size` of `training` (the training data's questions as
    asked, repeats kept: `qpr.data.ingest.source_questions`), embedded and searched by
    `bundle`.

    Why the traffic and not the index: the index holds each question once, traffic repeats
    the popular ones. Against the index, a fresh day of the embedded logs' own traffic
    looked drifted (classifier AUC 0.58-0.66); against the traffic it did not (0.46-0.54)."""
    usable = [q for q in training if q and q.strip()]
    if not usable:
        raise ValueError("no training questions to compare live questions with")
    if len(usable) > size:
        rows = np.sort(np.random.default_rng(seed).choice(len(usable), size, replace=False))
        usable = [usable[i] for i in rows.tolist()]
    results = bundle.search_batch(usable, 1, threshold=math.inf)
    top1 = np.array([r.hits[0].distance if r.hits else np.inf for r in results], np.float64)
    return Reference(usable, bundle.embed(usable), top1)


def _top1(frame: pd.DataFrame) -> np.ndarray:
    """float [N]: each logged question's nearest distance (inf: no hit)."""
    return np.array(
        [
            d[0] if isinstance(d, list | np.ndarray) and len(d) else np.inf
            for d in frame["distances"]
        ],
        np.float64,
    )


def _service(
    frame: pd.DataFrame, feedback: pd.DataFrame, settings: MonitorSettings
) -> dict[str, Any]:
    """No-answer rate, feedback and latency over the whole window."""
    verdicts = feedback["outcome"].dropna()
    taken, rejected = int((verdicts == "taken").sum()), int((verdicts == "rejected").sum())
    latency = frame["latency_ms"].dropna().to_numpy(np.float64)
    return {
        "questions": len(frame),
        "no_answer_rate": float(1.0 - frame["answered"].astype(bool).mean())
        if len(frame)
        else None,
        "feedback": {
            "taken": taken,
            "rejected": rejected,
            "acceptance": taken / (taken + rejected) if taken + rejected else None,
            "decides": taken + rejected >= settings.min_feedback,
        },
        "latency_ms": {
            "p50": float(np.percentile(latency, 50)) if latency.size else None,
            "p99": float(np.percentile(latency, 99)) if latency.size else None,
        },
    }


def _threshold_alarms(service: dict[str, Any], settings: MonitorSettings) -> dict[str, dict]:
    feedback, latency = service["feedback"], service["latency_ms"]
    checks = {
        "no_answer_rate": (service["no_answer_rate"], settings.max_no_answer_rate, "over"),
        "acceptance": (
            feedback["acceptance"] if feedback["decides"] else None,
            settings.min_acceptance,
            "under",
        ),
        "latency_p99": (latency["p99"], settings.max_p99_ms, "over"),
    }
    out = {}
    for name, (value, limit, side) in checks.items():
        tripped = value is not None and (value > limit if side == "over" else value < limit)
        out[name] = {"value": value, "threshold": limit, "alarm": bool(tripped), "detail": {}}
    return out


def measure(
    live: pd.DataFrame,
    feedback: pd.DataFrame,
    bundle: Bundle,
    reference: Reference,
    settings: MonitorSettings,
    *,
    seed: int,
) -> dict[str, Any]:
    """The report for `live` (query-log lines of `qpr.querylog.read_queries`, oldest first;
    the newest `settings.max_questions` are read) and `feedback` (the feedback lines that
    came in over the same window, `read_feedback`): drift against `reference`, the
    service's figures, the alarms. `bundle` embeds the live questions as the search does.
    With fewer than `settings.min_questions` lines it measures the service alone and says
    that drift waits for more questions."""
    live = live.tail(settings.max_questions)
    service = _service(live, feedback, settings)
    measures: dict[str, dict[str, Any]] = _threshold_alarms(service, settings)
    enough = len(live) >= settings.min_questions
    histograms: dict[str, Any] = {}
    if enough:
        for result in _drift(live, bundle, reference, settings, seed):
            entry = result.as_json()
            entry["alarm"] = entry.pop("drifted")
            measures[entry.pop("measure")] = entry
        histograms = _histograms(live, reference)
    return {
        "window": _window(live),
        "service": service,
        "hourly": _hourly(live),
        "histograms": histograms,
        "drift_measured": enough,
        "waiting_for": 0 if enough else settings.min_questions - len(live),
        "measures": {name: measures[name] for name in ALARMS if name in measures},
        "alarms": [name for name in ALARMS if measures.get(name, {}).get("alarm")],
    }


def _drift(
    live: pd.DataFrame,
    bundle: Bundle,
    reference: Reference,
    settings: MonitorSettings,
    seed: int,
) -> list[DriftResult]:
    """The four drift measures of the live questions against `reference` (module
    docstring)."""
    questions = live["question"].astype(str).tolist()
    ks = {"alpha": settings.length_alpha, "min_statistic": settings.length_min_statistic}
    # Content words for the vocabulary (BM25's reading); every word for the length.
    live_words, ref_words = tokenize(questions), tokenize(reference.questions)
    return [
        embedding_drift(
            reference.vectors,
            bundle.embed(questions),
            seed=seed,
            min_auc=settings.embedding_min_auc,
            z=settings.embedding_z,
        ),
        vocabulary_drift(ref_words, live_words, seed=seed, max_increase=settings.max_unseen_words),
        ks_drift(
            "length_ks",
            _words_per_question(reference.questions),
            _words_per_question(questions),
            **ks,
        ),
        # The nearest known question got farther: questions the index does not cover.
        ks_drift(
            "top1_distance",
            _finite(reference.top1),
            _finite(_top1(live)),
            larger_only=True,
            **ks,
        ),
    ]


def _words_per_question(questions: Sequence[str]) -> np.ndarray:
    return np.array([len(w) for w in tokenize(questions, stopwords=None)], np.float64)


def _histogram(reference: np.ndarray, live: np.ndarray, bins: int = 20) -> dict[str, list]:
    """Shares of each side per bin, over the bins of both sides' range (for the plot)."""
    both = np.concatenate([reference, live])
    edges = np.histogram_bin_edges(both, bins=bins) if both.size else np.array([0.0, 1.0])
    share = [np.histogram(side, edges)[0] / max(side.size, 1) for side in (reference, live)]
    return {"edges": edges.tolist(), "reference": share[0].tolist(), "live": share[1].tolist()}


def _histograms(live: pd.DataFrame, reference: Reference) -> dict[str, Any]:
    questions = live["question"].astype(str).tolist()
    return {
        "words_per_question": _histogram(
            _words_per_question(reference.questions), _words_per_question(questions)
        ),
        "top1_distance": _histogram(_finite(reference.top1), _finite(_top1(live))),
    }


def _hourly(live: pd.DataFrame) -> list[dict[str, Any]]:
    """Questions, no-answer rate and search p50 per hour of the window (for the plot)."""
    if live.empty:
        return []
    frame = pd.DataFrame(
        {
            "hour": pd.to_datetime(live["timestamp"], utc=True).dt.floor("h"),
            "unanswered": ~live["answered"].astype(bool),
            "latency_ms": live["latency_ms"].astype(float),
        }
    )
    grouped = frame.groupby("hour")
    return [
        {
            "hour": hour.isoformat(),
            "questions": len(rows),
            "no_answer_rate": float(rows["unanswered"].mean()),
            "latency_p50_ms": float(rows["latency_ms"].median()),
        }
        for hour, rows in grouped
    ]


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, np.float64)
    return values[np.isfinite(values)]


def _window(live: pd.DataFrame) -> dict[str, Any]:
    if live.empty:
        return {"first": None, "last": None}
    stamps = pd.to_datetime(live["timestamp"], utc=True)
    return {"first": stamps.min().isoformat(), "last": stamps.max().isoformat()}

"""The promotion policy: which registered version serves, decided on plain data.

Pure functions over numbers, metrics dicts and `VersionInfo` records (a version's number,
aliases and tags): no MLflow, no files. The MLflow adapter `qpr.ops.registry` reads and
writes the registry and asks this module what to do; the register stage and the
retraining cycle ask it too. So the one decision that can replace a serving model is
tested on hand-worked cases (tests/ops/test_promotion.py) without a registry.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from qpr.artifacts import TAG_COMMITTED
from qpr.errors import QPRError

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "EVENT_PREFIX",
    "PREVIOUS_CHAMPION",
    "TAG_DATA_SOURCE",
    "TAG_MEASURES",
    "RegistryError",
    "ShadowRequirement",
    "VersionInfo",
    "data_source_mismatch",
    "decide_promotion",
    "events",
    "is_committed",
    "judge",
    "last_event",
    "metric_value",
    "promotion_refusal",
]

# The registry's aliases (never the deprecated stages): what each version is to the service.
CHAMPION = "champion"
CHALLENGER = "challenger"
PREVIOUS_CHAMPION = "previous-champion"

# The version tags the policy reads (`qpr.ops.registry` writes them with the others).
TAG_MEASURES = "qpr.measures"  # JSON: every numeric test/val measure (no baselines)
TAG_DATA_SOURCE = "qpr.data_source"  # data.source it was trained on: like with like only
# The append-only history: one tag per promotion, rollback or kept challenger (JSON: seq,
# action, actor, reason, at, the other version involved), qpr.event.001, .002, ...
EVENT_PREFIX = "qpr.event."


class RegistryError(QPRError, RuntimeError):
    """A registry operation cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class VersionInfo:
    """One registered model version, as `qpr model list` shows it.

    metric / value: the measure the version was judged by at registration (e.g.
    ``val.recip_rank``) and its value; None for a version registered by other means.
    tags: the version's few tags. What registration recorded beside them (the measures,
    the base fingerprint, the deltas...) is in the version's details file, read through
    `load_details` only when `tag` asks for a key the tags lack; versions registered
    before that file hold every one as a tag, so `tag` finds them there.
    """

    name: str
    version: int
    aliases: tuple[str, ...]
    metric: str | None
    value: float | None
    created: datetime
    run_id: str | None
    tags: dict[str, str] = field(default_factory=dict)
    load_details: Callable[[], Mapping[str, str]] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def is_champion(self) -> bool:
        return CHAMPION in self.aliases

    @functools.cached_property
    def details(self) -> dict[str, str]:
        """The registration record beside the tags ({} when there is none), read once."""
        return dict(self.load_details()) if self.load_details is not None else {}

    def tag(self, key: str, default: str | None = None) -> str | None:
        """A tag of the version, else the value registration recorded in its details."""
        if key in self.tags:
            return self.tags[key]
        return self.details.get(key, default)

    @property
    def measures(self) -> dict[str, float]:
        """Every numeric test/val measure recorded at registration (dotted keys)."""
        try:
            raw = json.loads(self.tag(TAG_MEASURES) or "{}")
        except json.JSONDecodeError:
            return {}
        return {k: float(v) for k, v in raw.items() if isinstance(v, int | float)}

    def measure(self, key: str) -> float | None:
        """The version's value of a dotted measure, None when it was not recorded."""
        if self.metric == key and self.value is not None:
            return self.value
        return self.measures.get(key)


@dataclass(frozen=True)
class ShadowRequirement:
    """What ``registry.min_shadow_agreement`` and ``registry.min_shadow_accuracy`` ask of the
    shadow check (`record`: `qpr.ops.shadow`'s figures); None: not asked.

    agreement: the share of the last logged questions both models answer alike;
    accuracy: the challenger's share right on the questions with feedback. A requirement
    that is set but cannot be checked (no query log, no lines, no feedback) refuses: a
    promotion someone asked to be checked is never made unchecked. `judge` exempts only a
    first champion, which has nothing to be compared with.
    """

    record: Mapping[str, Any]
    min_agreement: float | None = None
    min_accuracy: float | None = None

    def refusal(self) -> str | None:
        """Why the shadow figures forbid a promotion, or None when they allow it."""
        record = self.record
        asked = (
            ("registry.min_shadow_agreement", self.min_agreement, "agreement"),
            ("registry.min_shadow_accuracy", self.min_accuracy, "challenger_accuracy"),
        )
        for key, floor, figure in asked:
            if floor is None:
                continue
            if not record.get("measured"):
                why = record.get("why", "no record")
                return f"{key} {floor:g} is set but the shadow check was not measured ({why})"
            value = record.get(figure)
            if value is None:
                return f"{key} {floor:g} is set but no logged question has feedback"
            if value >= floor - 1e-12:
                continue
            if figure == "agreement":
                what = f"agreement {value:.3f} ({record['agreed']} of {record['questions']})"
            else:
                what = f"accuracy {value:.3f} ({record['challenger_right']} of "
                what += f"{record['feedback']} verdicts)"
            return f"shadow {what} is below {key} {floor:g}"
        return None


def decide_promotion(
    challenger: float, champion: float | None, *, margin: float, floor: float
) -> tuple[bool, str]:
    """Should the challenger replace the champion? (promote, the reason in words).

    The rule, higher measure = better:
    - never below the quality floor, not even the first model (a registry with no
      champion is better than one whose champion is known to be bad);
    - no champion yet: the challenger is promoted when it passes the floor;
    - otherwise only when challenger >= champion + margin. The margin keeps evaluation
      noise from flipping the champion back and forth between equivalent models.

    A difference of 1e-12 is ignored so that a challenger exactly ``margin`` better is not
    rejected by float rounding. NaN never wins.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if math.isnan(challenger):
        return False, "challenger measure is NaN: not promoted"
    if challenger < floor:
        return False, f"challenger {challenger:.4f} is below the quality floor {floor:.4f}"
    if champion is None or math.isnan(champion):
        # Read after the promotion (make run's summary): "no champion yet" would mislead.
        before = "first champion (none before)" if champion is None else "champion unmeasured"
        return True, f"{before}: challenger {challenger:.4f} passes the floor {floor:.4f}"
    needed = champion + margin
    if challenger >= needed - 1e-12:
        return True, (
            f"challenger {challenger:.4f} beats champion {champion:.4f} by "
            f"{challenger - champion:+.4f} (margin {margin:.4f})"
        )
    if challenger > champion:
        return False, (
            f"challenger {challenger:.4f} beats champion {champion:.4f} by only "
            f"{challenger - champion:+.4f}, less than the margin {margin:.4f}: champion kept"
        )
    return False, (
        f"challenger {challenger:.4f} is not better than champion {champion:.4f}: champion kept"
    )


def judge(
    challenger: VersionInfo,
    value: float,
    champion: VersionInfo | None,
    *,
    metric: str,
    margin: float,
    floor: float,
    champion_value: float | None = None,
    shadow: ShadowRequirement | None = None,
) -> tuple[bool, str]:
    """Should this registered version, measured `value`, become champion? (promote, the
    reason in words).

    decide_promotion's rule, after the cases it cannot see: the version is already the
    champion, it was rolled back by a person, it was trained on another data source, or
    the champion has no measure to compare. `champion_value`: the champion measured as
    `value` was (re-scored on the same queries); None takes the champion's recorded one.
    `shadow`: what the shadow check must show before a champion is replaced; it refuses
    a promotion the measure alone would make (a first champion is exempt).
    """
    if champion is not None and champion.version == challenger.version:
        return False, f"version {challenger.version} is already the champion"
    rolled_back = last_event(challenger, "rolled_back")
    if rolled_back is not None:
        who, why = rolled_back.get("actor"), rolled_back.get("reason")
        return False, (
            f"version {challenger.version} was rolled back by {who} ({why}): "
            "promote it by hand if wanted"
        )
    mismatch = data_source_mismatch(challenger, champion)
    if mismatch:
        return False, (
            f"{mismatch}: refused (promote by hand: qpr model promote {challenger.version} "
            "--force --reason ...)"
        )
    if champion_value is None and champion is not None:
        champion_value = champion.measure(metric)
    if champion is not None and champion_value is None:
        return False, (
            f"champion version {champion.version} has no {metric} recorded, so the two "
            "cannot be compared: promote by hand (qpr model promote)"
        )
    promoted, reason = decide_promotion(value, champion_value, margin=margin, floor=floor)
    refusal = shadow.refusal() if promoted and shadow and champion is not None else None
    if refusal:
        return False, (
            f"{refusal}, though by the measure alone {reason} "
            f"(promote by hand: qpr model promote {challenger.version})"
        )
    return promoted, reason


def metric_value(metrics: Mapping[str, Any], key: str) -> float:
    """The number at a dotted key of metrics.json (``val.recip_rank``); RegistryError if none."""
    node: Any = metrics
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise RegistryError(f"metrics have no {key!r} (registry.metric): missing {part!r}")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise RegistryError(f"metrics {key!r} is {node!r}, not a number")
    return float(node)


def is_committed(info: VersionInfo) -> bool:
    """Whether the version carries the committed mark (see `TAG_COMMITTED`)."""
    return bool(info.tags.get(TAG_COMMITTED))


def promotion_refusal(target: VersionInfo, current: VersionInfo | None) -> str | None:
    """Why `target` must not replace `current` without --force, or None: it lacks the
    committed mark (an orphan of a crashed run, or registered before the mark existed), or
    it was trained on another data source than the champion (their measures differ in kind)."""
    if not is_committed(target):
        return (
            f"version {target.version} has no committed mark ({TAG_COMMITTED}): the run that "
            "registered it never committed"
        )
    return data_source_mismatch(target, current)


def data_source_mismatch(target: VersionInfo, current: VersionInfo | None) -> str | None:
    """Why `target` and `current` cannot be compared, or None: trained on different data
    sources (``qpr.data_source``; a version without the tag is taken as comparable)."""
    ours = target.tags.get(TAG_DATA_SOURCE)
    theirs = current.tags.get(TAG_DATA_SOURCE) if current is not None else None
    if current is not None and ours and theirs and ours != theirs:
        return (
            f"version {target.version} was trained on data source {ours!r}, champion version "
            f"{current.version} on {theirs!r}: their measures are not comparable"
        )
    return None


def events(info: VersionInfo) -> list[dict[str, Any]]:
    """The version's promotion/rollback history, oldest first."""
    out = []
    for key, value in info.tags.items():
        if key.startswith(EVENT_PREFIX):
            try:
                out.append(json.loads(value))
            except json.JSONDecodeError:
                continue
    return sorted(out, key=lambda e: e.get("seq", 0))


def last_event(info: VersionInfo, action: str) -> dict[str, Any] | None:
    """The version's latest event of `action` ("promoted", "rolled_back", ...), or None.
    A version whose history predates the event tags has only the latest-action tags
    (``qpr.<action>_by/_at/_reason``): they are read as its one event."""
    found = [event for event in events(info) if event.get("action") == action]
    if found:
        return found[-1]
    if f"qpr.{action}_at" not in info.tags:
        return None
    return {
        "action": action,
        "actor": info.tags.get(f"qpr.{action}_by"),
        "at": info.tags.get(f"qpr.{action}_at"),
        "reason": info.tags.get(f"qpr.{action}_reason"),
    }

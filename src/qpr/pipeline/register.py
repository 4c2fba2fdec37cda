"""The register stage: the evaluated bundle becomes a registry version (alias challenger)
and replaces the champion only when it is better by the margin.

Why a stage of its own: registering is the one step with an effect outside the project
(the shared registry), so it runs only after every gate passed, judges the model by a
validation measure (never test: test stays an unbiased report), and records its decision
both in metrics/register.json (for `dvc metrics`) and as tags on the version (for people).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from qpr.config import Settings
from qpr.ops import registry
from qpr.paths import ProjectPaths

ACTOR = "register-flow"


def _versions(name: str) -> list[registry.VersionInfo]:
    try:
        return registry.list_versions(name)
    except registry.RegistryError:  # no such model yet: the first registration creates it
        return []


def run_register(
    settings: Settings,
    paths: ProjectPaths,
    *,
    provenance: Callable[[Mapping[str, Any]], Mapping[str, str]] = lambda _: {},
    actor: str = ACTOR,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Register models/ + the evaluate stage's metrics, decide, promote or keep the champion.

    `provenance(metrics)` gives tags for the version (the evaluate run's commit and data
    hash: the flow finds them in MLflow). Returns what
    metrics/register.json holds: the version, promoted (0/1), the challenger and champion
    measures (champion: null when there was none), the reason in words.
    """
    cfg = settings.registry
    # metrics/evaluate.json: metrics.json without its wall-clock figures (what DVC tracks).
    metrics_path = paths.stage_metrics("evaluate")
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{metrics_path} not found: run the evaluate stage first")
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    challenger_value = registry.metric_value(metrics, cfg.metric)

    before = {v.version for v in _versions(cfg.name)}
    version = registry.register_bundle(
        paths.models_dir, metrics, name=cfg.name, metric=cfg.metric, tags=dict(provenance(metrics))
    )
    new = version.version not in before
    log(
        f"{'registered' if new else 'same bundle already registered as'} "
        f"{registry.describe(version)}"
    )

    current = registry.champion(cfg.name)
    champion_value = current.measure(cfg.metric) if current is not None else None
    promoted, reason = registry.judge(
        version,
        challenger_value,
        current,
        metric=cfg.metric,
        margin=cfg.margin,
        floor=cfg.min_metric,
    )
    if promoted:
        registry.promote(cfg.name, version.version, reason=reason, actor=actor)
        log(f"promoted version {version.version} to champion: {reason}")
    else:
        if new:  # a rerun on an already judged bundle records nothing: it changed nothing
            registry.keep_challenger(cfg.name, version.version, reason=reason, actor=actor)
        log(f"champion kept: {reason}")
    return {
        "name": cfg.name,
        "metric": cfg.metric,
        "version": version.version,
        "new_version": int(new),
        "promoted": int(promoted),
        "challenger": challenger_value,
        "champion": champion_value,
        "champion_version": current.version if current is not None else None,
        "margin": cfg.margin,
        "floor": cfg.min_metric,
        "reason": reason,
    }

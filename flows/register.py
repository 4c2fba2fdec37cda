"""Prefect flow for the register stage: the evaluated bundle becomes a registry version
(alias challenger) and replaces the champion only when it is better by the margin.

Why a stage of its own: registering is the one step with an effect outside the project
(the shared registry), so it runs only after every gate passed, judges the model by a
validation measure (never test: test stays an unbiased report), and records its decision
both in metrics/register.json (for `dvc metrics`) and as tags on the version (for people).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import mlflow
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows.common import main, run_stage, settings_and_paths
from qpr import registry
from qpr.config import Settings
from qpr.paths import ProjectPaths

ACTOR = "register-flow"


def find_evaluate_run(experiment: str, metrics: Mapping[str, Any]) -> mlflow.entities.Run | None:
    """The finished evaluate run that logged these very metrics (newest first), if any.

    Matching on the measures rather than taking the newest run keeps a stale or a
    concurrent evaluate run from lending its commit and data hash to this model.
    """
    wanted = {
        key: value
        for key, value in (
            ("success_1", metrics.get("success_1")),
            ("recip_rank", metrics.get("recip_rank")),
            ("val.success_1", (metrics.get("val") or {}).get("success_1")),
        )
        if isinstance(value, int | float)
    }
    try:
        runs = mlflow.search_runs(
            experiment_names=[experiment],
            filter_string="tags.`qpr.stage` = 'evaluate' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=20,
            output_format="list",
        )
    except mlflow.exceptions.MlflowException:
        return None
    for run in runs:
        logged = run.data.metrics
        if wanted and all(
            key in logged and math.isclose(logged[key], value, rel_tol=0, abs_tol=1e-9)
            for key, value in wanted.items()
        ):
            return run
    return None


def register_model(
    settings: Settings,
    paths: ProjectPaths,
    *,
    actor: str = ACTOR,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Register models/ + metrics.json, decide, promote or keep the champion.

    Returns what metrics/register.json holds: the version, promoted (0/1), the challenger
    and champion measures (champion: null when there was none), the reason in words.
    """
    cfg = settings.registry
    metrics_path = paths.root / "metrics.json"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{metrics_path} not found: run the evaluate stage first")
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    challenger_value = registry.metric_value(metrics, cfg.metric)

    tags: dict[str, str] = {}
    evaluated = find_evaluate_run(settings.mlflow.experiment, metrics)
    if evaluated is not None:
        run_tags = evaluated.data.tags
        tags["qpr.evaluate_run_id"] = evaluated.info.run_id
        for source, target in (
            ("mlflow.source.git.commit", registry.TAG_GIT_COMMIT),
            ("qpr.data_hash", registry.TAG_DATA_HASH),
        ):
            if source in run_tags:
                tags[target] = run_tags[source]

    before = {v.version for v in _versions(cfg.name)}
    version = registry.register_bundle(
        paths.models_dir, metrics, name=cfg.name, metric=cfg.metric, tags=tags
    )
    new = version.version not in before
    log(
        f"{'registered' if new else 'same bundle already registered as'} "
        f"{registry.describe(version)}"
    )

    current = registry.champion(cfg.name)
    champion_value = current.measure(cfg.metric) if current is not None else None
    promoted = False
    if current is not None and current.version == version.version:
        reason = f"version {version.version} is already the champion"
    elif "qpr.rolled_back_at" in version.tags:
        who, why = (
            version.tags.get("qpr.rolled_back_by"),
            version.tags.get("qpr.rolled_back_reason"),
        )
        reason = (
            f"version {version.version} was rolled back by {who} ({why}): "
            "promote it by hand if wanted"
        )
    elif current is not None and champion_value is None:
        reason = (
            f"champion version {current.version} has no {cfg.metric} recorded, so the two "
            "cannot be compared: promote by hand (qpr model promote)"
        )
    else:
        promoted, reason = registry.decide_promotion(
            challenger_value, champion_value, margin=cfg.margin, floor=cfg.min_metric
        )

    if promoted:
        registry.promote(cfg.name, version.version, reason=reason, actor=actor)
        log(f"promoted version {version.version} to champion: {reason}")
    else:
        if new:  # a rerun on an already judged bundle records nothing: it changed nothing
            registry.keep_challenger(cfg.name, version.version, reason=reason, actor=actor)
        log(f"champion kept: {reason}")

    mlflow.set_tags(
        {
            "qpr.registered_model": cfg.name,
            "qpr.registered_version": str(version.version),
            "qpr.promoted": str(promoted).lower(),
        }
    )
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


def _versions(name: str) -> list[registry.VersionInfo]:
    try:
        return registry.list_versions(name)
    except registry.RegistryError:  # no such model yet: the first registration creates it
        return []


@task(name="register", cache_policy=NO_CACHE)
def register_task(settings: Settings, paths: ProjectPaths, actor: str) -> dict[str, Any]:
    return register_model(settings, paths, actor=actor, log=get_run_logger().info)


@flow(name="register", log_prints=True)
def register_flow(params: str | None = None, actor: str = ACTOR) -> dict[str, Any]:
    """Register the evaluated bundle (alias challenger); promote it to champion only if it
    beats the champion's validation measure by registry.margin (the first model: if it
    passes registry.min_metric). Writes metrics/register.json."""
    settings, paths = settings_and_paths(params)
    return run_stage(
        "register",
        settings,
        paths,
        lambda: register_task(settings, paths, actor),
        metrics_file=paths.stage_metrics("register"),
    )


if __name__ == "__main__":
    try:
        main(register_flow)
    except registry.RegistryError as err:
        print(f"\nERROR: {err}", file=sys.stderr)
        raise SystemExit(1) from None

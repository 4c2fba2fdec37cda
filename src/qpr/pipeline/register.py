"""The register stage: the evaluated bundle becomes a registry version, and the decision
whether it replaces the champion.

Why a stage of its own: registering is the one step with an effect outside the project
(the shared registry), so it runs only after every gate passed, judges the model by a
validation measure (never test: test stays an unbiased report), and records its decision
both in metrics/register.json (for `dvc metrics`) and as tags on the version (for people).

Like with like: before judging, challenger and champion are both scored on the
challenger's validation queries over the same corpus by one protocol
(`qpr.evaluation.rescore`), and those two numbers are compared; a champion trained on
another data source is never compared at all.

Inside a retraining cycle (`cycle_run`, set from ``QPR_RETRAIN_RUN``) the stage registers
and decides but moves no alias and sets no committed mark: the cycle does both after its
commit point, so a run killed here leaves only an unmarked version nobody serves. Run on
its own (`dvc repro`, `make run`) the stage is the last step, so it marks and promotes.
Inside a DVC experiment (`dvc exp run`, which sets DVC_EXP_NAME) it registers and judges
but never promotes: trying a setting must not change what the service answers with. The
decision is recorded; `qpr model promote N` carries it out when a person wants it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from qpr.config import Settings
from qpr.errors import QPRError
from qpr.ops import promotion, registry
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import read_evaluate_metrics
from qpr.redact import redact_tree

ACTOR = "register-flow"
RETRAIN_RUN_ENV = registry.RETRAIN_RUN_ENV
DVC_EXPERIMENT_ENV = "DVC_EXP_NAME"  # set by `dvc exp run` for its stages

# (challenger, champion) measured alike, or None when that cannot be done
Rescore = Callable[[registry.VersionInfo], "tuple[float, float] | None"]


def _versions(name: str) -> list[registry.VersionInfo]:
    try:
        return registry.list_versions(name)
    except registry.RegistryError:  # no such model yet: the first registration creates it
        return []


def rescore_on_validation(settings: Settings, paths: ProjectPaths) -> Rescore:
    """The default `Rescore`: both bundles' encoders scored by one protocol
    (`qpr.evaluation.rescore`) on the cluster stage's queries of the metric's split
    (``val.recip_rank`` → val, recip_rank), over the challenger's indexed questions."""

    def rescore_pair(champion: registry.VersionInfo) -> tuple[float, float] | None:
        from qpr.evaluation.queries import query_set
        from qpr.evaluation.rescore import rescore
        from qpr.pipeline.handoff import read_cluster_outputs, read_indexed_questions

        split, _, measure = settings.registry.metric.rpartition(".")
        if not split or not measure:
            return None
        queries = query_set(read_cluster_outputs(paths)[0], split)
        if len(queries.query_ids) == 0:
            return None
        # One corpus for both: the questions the challenger indexes (the current data).
        corpus = read_indexed_questions(paths, columns=["question_id", "text"])
        ours = rescore(paths.models_dir, corpus, queries)[measure]
        with tempfile.TemporaryDirectory(prefix="qpr-champion-") as tmp:
            alias = registry.CHAMPION
            bundle = registry.download_bundle(settings.registry.name, alias, Path(tmp))
            theirs = rescore(bundle, corpus, queries)[measure]
        return float(ours), float(theirs)

    return rescore_pair


def run_register(
    settings: Settings,
    paths: ProjectPaths,
    *,
    provenance: Callable[[Mapping[str, Any]], Mapping[str, str]] = lambda _: {},
    actor: str = ACTOR,
    log: Callable[[str], None] = print,
    cycle_run: str | None = None,
    rescore: Rescore | None = None,
    experiment: str | None = None,
) -> dict[str, Any]:
    """Register models/ + the evaluate stage's metrics, decide, and (on its own) promote
    or keep the champion.

    `provenance(metrics)` gives tags for the version (the evaluate run's commit and data
    hash: the flow finds them in MLflow). `rescore` measures challenger and champion
    alike (default `rescore_on_validation`). Returns what metrics/register.json holds: the
    version, promoted (0/1: the decision; `deferred` 1 when the cycle carries it out), the
    measures compared (champion: null when there was none), the reason in words. With
    `experiment` (a DVC experiment's name) nothing is promoted: `promoted` is 0 and
    `experiment_would_promote` says what the decision was.
    """
    cfg = settings.registry
    metrics = read_evaluate_metrics(paths)
    challenger_value = promotion.metric_value(metrics, cfg.metric)

    tags = redact_tree({**provenance(metrics), registry.TAG_DATA_SOURCE: settings.data.source})
    if cycle_run:
        tags[registry.TAG_RETRAIN_RUN] = cycle_run
    before = {v.version for v in _versions(cfg.name)}
    version = registry.register_bundle(
        paths.models_dir,
        metrics,
        name=cfg.name,
        metric=cfg.metric,
        tags=tags,
    )
    new = version.version not in before
    log(
        f"{'registered' if new else 'same bundle already registered as'} "
        f"{registry.describe(version)}"
    )
    if not cycle_run:  # on its own the stage is the last step: everything has committed
        registry.mark_committed(cfg.name, version.version, by=f"{actor} (register stage)")

    current = registry.champion(cfg.name)
    rescore = rescore or rescore_on_validation(settings, paths)
    compared = _compare(version, challenger_value, current, rescore, cfg.metric)
    promoted, reason = promotion.judge(
        version,
        compared["challenger"],
        current,
        metric=cfg.metric,
        margin=cfg.margin,
        floor=cfg.min_metric,
        champion_value=compared["champion"],
    )
    if compared["note"]:
        reason = f"{reason} ({compared['note']})"
    would_promote = promoted
    if experiment and promoted:
        promoted = False
        reason = (
            f"experiment {experiment!r} would promote it ({reason}); experiments never move "
            f"the champion: `qpr model promote {version.version}` to do it"
        )
    if cycle_run:
        log(f"decision for version {version.version}, carried out after the commit: {reason}")
    elif promoted:
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
        "deferred": int(bool(cycle_run)),
        "challenger": compared["challenger"],
        "challenger_recorded": challenger_value,
        "champion": compared["champion"],
        "champion_version": current.version if current is not None else None,
        "compared": compared["how"],
        "margin": cfg.margin,
        "floor": cfg.min_metric,
        "reason": reason,
        **({"experiment_would_promote": int(would_promote)} if experiment else {}),
    }


def _compare(
    version: registry.VersionInfo,
    recorded: float,
    current: registry.VersionInfo | None,
    rescore: Rescore,
    metric: str,
) -> dict[str, Any]:
    """The two numbers the decision compares, and how they were measured."""
    same = {"challenger": recorded, "champion": None, "how": "recorded", "note": ""}
    if current is None or current.version == version.version:
        return same
    if promotion.data_source_mismatch(version, current):
        return {**same, "how": "not compared (other data source)"}
    try:
        pair = rescore(current)
    except (OSError, ValueError, KeyError, QPRError) as err:
        pair, why = None, f"{type(err).__name__}: {err}"
    else:
        why = "no queries of the metric's split"
    if pair is None:
        note = f"WARNING: champion not re-scored ({why}); its recorded measure is compared"
        return {**same, "champion": current.measure(metric), "note": note}
    return {"challenger": pair[0], "champion": pair[1], "how": "re-scored alike", "note": ""}

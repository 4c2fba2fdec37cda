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

The shadow check, before the decision: with a champion and a query log, both models
answer the last logged questions as served (`shadow_check`, figures by `qpr.ops.shadow`).
The figures are recorded on the new version and in metrics/register.json, and
``registry.min_shadow_agreement`` / ``min_shadow_accuracy`` can hold the champion.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qpr.artifacts import TAG_FINGERPRINT
from qpr.config import Settings
from qpr.errors import QPRError
from qpr.ops import promotion, registry, shadow
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import read_evaluate_metrics
from qpr.querylog.log_reader import read_joined
from qpr.redact import redact, redact_tree
from qpr.retrieval.bundle import Bundle

ACTOR = "register-flow"
RETRAIN_RUN_ENV = registry.RETRAIN_RUN_ENV
DVC_EXPERIMENT_ENV = "DVC_EXP_NAME"  # set by `dvc exp run` for its stages

# (challenger, champion) measured alike, or None when that cannot be done
Rescore = Callable[[registry.VersionInfo], "tuple[float, float] | None"]
# Questions searched at once by the shadow check.
_SHADOW_BATCH = 256


def _versions(name: str) -> list[registry.VersionInfo]:
    try:
        return registry.list_versions(name)
    except registry.RegistryError:  # no such model yet: the first registration creates it
        return []


class ChampionFiles:
    """The champion's bundle, downloaded when first asked and kept for the stage's run:
    re-scoring and the shadow check both read it (a large bundle is fetched once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tmp = tempfile.TemporaryDirectory(prefix="qpr-champion-")
        self._bundle: Path | None = None

    def __call__(self) -> Path:
        if self._bundle is None:
            target = Path(self._tmp.name)
            self._bundle = registry.download_bundle(self.name, registry.CHAMPION, target)
        return self._bundle

    def __enter__(self) -> ChampionFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()


def rescore_on_validation(
    settings: Settings, paths: ProjectPaths, champion_files: Callable[[], Path] | None = None
) -> Rescore:
    """The default `Rescore`: both bundles' encoders scored by one protocol
    (`qpr.evaluation.rescore`) on the cluster stage's queries of the metric's split
    (``val.recip_rank`` → val, recip_rank), over the challenger's indexed questions.
    `champion_files` gives the champion's bundle folder (default: downloaded here)."""

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
        with ChampionFiles(settings.registry.name) as download:
            theirs = rescore((champion_files or download)(), corpus, queries)[measure]
        return float(ours), float(theirs)

    return rescore_pair


def shadow_check(
    settings: Settings,
    paths: ProjectPaths,
    champion: registry.VersionInfo | None,
    champion_files: Callable[[], Path],
) -> dict[str, Any]:
    """The shadow figures (`qpr.ops.shadow.shadow_record`): the challenger (models/) and
    the champion (`champion_files()`) answer the last ``registry.shadow_questions`` lines
    of the query log (params ``query_log``). Not measured, with why: no log folder, no
    query lines, no champion, a champion of another data source or the same bundle, or
    a bundle that fails to load or search. The reasons name the folder as params give it,
    so a run without a log writes the same record on every machine."""
    named = settings.query_log.as_posix()
    folder = settings.query_log
    folder = folder if folder.is_absolute() else paths.root / folder
    if not folder.is_dir():
        return shadow.not_measured(f"no query log at {named}")
    lines = shadow.latest_questions(read_joined(folder), settings.registry.shadow_questions)
    if lines.empty:
        return shadow.not_measured(f"no query lines in {named}")
    if champion is None:
        return shadow.not_measured("no champion")
    source = champion.tags.get(registry.TAG_DATA_SOURCE)
    if source and source != settings.data.source:
        return shadow.not_measured(f"champion trained on data source {source!r}")
    questions = [str(q) for q in lines["question"]]
    try:
        ours = Bundle.load(paths.models_dir)
        if ours.fingerprint == champion.tag(TAG_FINGERPRINT):
            return shadow.not_measured(f"the challenger is champion version {champion.version}")
        challenger_answers, refused = _served_answers(ours, questions)
        champion_answers, refused_too = _served_answers(Bundle.load(champion_files()), questions)
    except (OSError, QPRError) as err:
        # The one free text of the record: an error may quote a registry URI's credentials.
        return shadow.not_measured(f"failed: {type(err).__name__}: {redact(str(err))[:300]}")
    kept = [i for i in range(len(questions)) if i not in refused | refused_too]
    right, rejected = shadow.feedback_targets(lines)
    return shadow.shadow_record(
        [challenger_answers[i] for i in kept],
        [champion_answers[i] for i in kept],
        [right[i] for i in kept],
        [rejected[i] for i in kept],
        skipped=len(questions) - len(kept),
        champion_version=champion.version,
    )


def _served_answers(bundle: Bundle, questions: Sequence[str]) -> tuple[list[str | None], set[int]]:
    """Each question's served answer (`shadow.served_answer`) from `bundle` searched as the
    service searches, and the positions it refused (ValueError: no words left to it)."""
    answers: list[str | None] = []
    refused: set[int] = set()
    for start in range(0, len(questions), _SHADOW_BATCH):
        part = questions[start : start + _SHADOW_BATCH]
        try:
            found = [shadow.served_answer(r) for r in bundle.search_batch(part, shadow.SHADOW_K)]
        except ValueError:  # one refused question refuses its batch: one by one instead
            found = []
            for offset, question in enumerate(part):
                try:
                    found.append(shadow.served_answer(bundle.search(question, shadow.SHADOW_K)))
                except ValueError:
                    refused.add(start + offset)
                    found.append(None)
        answers.extend(found)
    return answers, refused


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
    measures compared (champion: null when there was none), the reason in words, the
    shadow figures (`shadow_check`; ``measured`` false with ``why``). With
    `experiment` (a DVC experiment's name) nothing is promoted: `promoted` is 0 and
    `experiment_would_promote` says what the decision was.
    """
    cfg = settings.registry
    metrics = read_evaluate_metrics(paths)
    challenger_value = promotion.metric_value(metrics, cfg.metric)
    before = {v.version for v in _versions(cfg.name)}
    # Read before registering (which moves no champion): the shadow figures go on the version.
    current = registry.champion(cfg.name) if before else None
    with ChampionFiles(cfg.name) as champion_files:
        figures = shadow_check(settings, paths, current, champion_files)
        log(shadow.describe(figures))
        given = {**provenance(metrics), registry.TAG_DATA_SOURCE: settings.data.source}
        tags = {**redact_tree(given), **shadow.shadow_tags(figures)}
        if cycle_run:
            tags[registry.TAG_RETRAIN_RUN] = cycle_run
        version = registry.register_bundle(
            paths.models_dir, metrics, name=cfg.name, metric=cfg.metric, tags=tags
        )
        new = version.version not in before
        log(
            f"{'registered' if new else 'same bundle already registered as'} "
            f"{registry.describe(version)}"
        )
        if not cycle_run:  # on its own the stage is the last step: everything has committed
            registry.mark_committed(cfg.name, version.version, by=f"{actor} (register stage)")
        rescore = rescore or rescore_on_validation(settings, paths, champion_files)
        compared = _compare(version, challenger_value, current, rescore, cfg.metric)
    promoted, reason = promotion.judge(
        version,
        compared["challenger"],
        current,
        metric=cfg.metric,
        margin=cfg.margin,
        floor=cfg.min_metric,
        champion_value=compared["champion"],
        shadow=promotion.ShadowRequirement(
            figures, cfg.min_shadow_agreement, cfg.min_shadow_accuracy
        ),
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
        "shadow": figures,
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

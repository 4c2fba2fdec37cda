"""The register stage's shadow check on a real MLflow store (tests/conftest.py: a sqlite
file per session) with two real tiny bundles and a query log the real `QueryLog` wrote.

The champion answers only the questions it indexes (threshold 1e-6); the challenger, same
questions with another encoder, answers everything (threshold 1e9). On the indexed
questions both answer alike; on unseen ones the champion says "no answer" and the
challenger answers: agreement 4 of 8. Feedback: one answer taken (both right), and one
unseen question whose right answer a person named, the challenger's (only it is right).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpr.artifacts import SearchConfig
from qpr.config import settings_from_dict
from qpr.ops import registry, shadow
from qpr.paths import ProjectPaths
from qpr.pipeline.register import run_register
from qpr.querylog import QueryLog
from qpr.querylog.log_writer import LogLimits
from qpr.retrieval.bundle import Bundle
from tests.serve.test_app import QIDS, QUESTIONS, build_bundle
from tests.session_experiment import session_experiment

pytestmark = pytest.mark.slow

EXPERIMENT = "qpr-register-shadow-tests"
METRICS = {"success_1": 0.5, "recip_rank": 0.6, "val": {"recip_rank": 0.7}}
INDEXED = QUESTIONS[:4]
UNSEEN = [
    "where can i buy a kite for my nephew",
    "which train goes to the airport at night",
    "is it going to snow in april",
    "who painted the ceiling of that chapel",
]


@pytest.fixture
def experiment() -> Iterator[str]:
    with session_experiment(EXPERIMENT) as experiment_id:
        yield experiment_id


def _champion(tmp: Path, name: str) -> Bundle:
    """The champion: registered, committed and promoted; its bundle."""
    models = build_bundle(tmp / "champion", QUESTIONS, QIDS, seed=0)
    info = registry.register_bundle(
        models, METRICS, name=name, tags={registry.TAG_DATA_SOURCE: "logs"}
    )
    registry.mark_committed(name, info.version, by="tests")
    registry.promote(name, info.version, reason="first", actor="tests")
    return Bundle.load(models)


def _project(tmp: Path) -> ProjectPaths:
    """models/ (the challenger) and the evaluate stage's metrics."""
    paths = ProjectPaths(tmp / "project")
    build_bundle(paths.models_dir, QUESTIONS, QIDS, seed=1)
    SearchConfig(threshold=1e9, target_precision=0.9).write(paths.models_dir)
    paths.stage_metrics("evaluate").parent.mkdir(parents=True, exist_ok=True)
    paths.stage_metrics("evaluate").write_text(json.dumps(METRICS))
    return paths


def _serve(folder: Path, champion: Bundle, challenger: Bundle) -> None:
    """The champion serves one batch of the eight questions; two verdicts come back."""
    questions = INDEXED + UNSEEN
    results = champion.search_batch(questions, 10)
    assert [r.answered for r in results] == [True] * 4 + [False] * 4
    named = shadow.served_answer(challenger.search(UNSEEN[0], 10))
    with QueryLog(folder, LogLimits(flush_seconds=0.05)) as log:
        model = {"name": "qpr", "version": 1, "fingerprint": champion.fingerprint}
        log.queries(
            "req-1",
            results,
            endpoint="/search/batch",
            model=model,
            k=10,
            threshold=None,
            latency_ms=1.0,
        )
        log.feedback("req-1", "taken", position=0)
        log.feedback("req-1", "rejected", position=4, answer_id=named)


def _settings(name: str, **registry_params: object):
    return settings_from_dict(
        {
            "query_log": "logs/service",
            "data": {"source": "logs"},
            "registry": {"name": name, "margin": 0.01, "min_metric": 0.1, **registry_params},
        }
    )


def _served_project(tmp: Path, name: str) -> ProjectPaths:
    """A champion in the registry, a challenger in models/, the champion's query log."""
    champion = _champion(tmp, name)
    paths = _project(tmp)
    _serve(paths.root / "logs" / "service", champion, Bundle.load(paths.models_dir))
    return paths


def test_the_shadow_figures_are_on_the_new_version_and_can_hold_the_champion(
    tmp_path: Path, experiment: str
) -> None:
    name = "qpr-shadow-held"
    paths = _served_project(tmp_path, name)
    said: list[str] = []

    result = run_register(
        _settings(name, min_shadow_agreement=0.9),
        paths,
        rescore=lambda current: (0.80, 0.50),  # the measure alone would promote it
        log=said.append,
    )

    figures = result["shadow"]
    assert figures["measured"] and figures["champion_version"] == 1
    assert (figures["questions"], figures["agreed"], figures["agreement"]) == (8, 4, 0.5)
    assert (figures["challenger_answered"], figures["champion_answered"]) == (8, 4)
    right = (figures["challenger_right"], figures["champion_right"])
    assert figures["feedback"] == 2 and right == (2, 1)
    assert (figures["challenger_accuracy"], figures["champion_accuracy"]) == (1.0, 0.5)
    # Refused by the shadow requirement, with the reason; the champion still serves.
    assert result["promoted"] == 0
    refused = "shadow agreement 0.500 (4 of 8) is below registry.min_shadow_agreement 0.9"
    assert refused in result["reason"]
    assert registry.champion(name).version == 1
    # On the version: two readable tags, and the whole record in its details file.
    version = registry.get_version(name, result["version"])
    assert version.tags[shadow.TAG_SHADOW_AGREEMENT] == (
        "0.500 (4 of 8 questions, champion version 1)"
    )
    assert version.tags[shadow.TAG_SHADOW_ACCURACY] == (
        "challenger 1.000, champion 0.500 (2 verdicts)"
    )
    assert json.loads(version.tag(shadow.TAG_SHADOW)) == figures
    assert shadow.describe(figures) in said


def test_without_a_requirement_the_figures_are_recorded_and_the_measure_decides(
    tmp_path: Path, experiment: str
) -> None:
    name = "qpr-shadow-recorded"
    paths = _served_project(tmp_path, name)

    result = run_register(
        _settings(name, shadow_questions=3), paths, rescore=lambda c: (0.8, 0.5), log=print
    )

    assert result["promoted"] == 1, result["reason"]
    # The last three questions only: unseen ones, answered by the challenger alone.
    assert (result["shadow"]["questions"], result["shadow"]["agreed"]) == (3, 0)
    assert result["shadow"]["feedback"] == 0
    version = registry.get_version(name, result["version"])
    assert version.tags[shadow.TAG_SHADOW_ACCURACY] == "no feedback on these questions"
    # Run again on the bundle now serving: nothing to compare it with.
    again = run_register(_settings(name), paths, rescore=lambda c: None, log=print)
    assert again["shadow"] == {
        "measured": False,
        "why": f"the challenger is champion version {result['version']}",
    }

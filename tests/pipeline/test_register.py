"""The register stage's decision, on an in-memory registry: like with like, never across
data sources, and no alias moved by a stage run inside a retraining cycle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpr.config import settings_from_dict
from qpr.ops import promotion, registry
from qpr.paths import ProjectPaths
from qpr.pipeline.register import run_register
from tests.ops.fake_registry import FakeRegistry

NAME = "qpr-register-decision"


def _settings(source: str = "logs"):
    return settings_from_dict(
        {
            "data": {"source": source},
            "registry": {"name": NAME, "margin": 0.01, "min_metric": 0.1},
        }
    )


@pytest.fixture
def paths(tmp_path: Path) -> ProjectPaths:
    paths = ProjectPaths(tmp_path)
    metrics = {"recip_rank": 0.5, "val": {"recip_rank": 0.70}}
    paths.stage_metrics("evaluate").parent.mkdir(parents=True, exist_ok=True)
    paths.stage_metrics("evaluate").write_text(json.dumps(metrics))
    return paths


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRegistry:
    return FakeRegistry().install(monkeypatch)


def _champion(fake: FakeRegistry, value: float, source: str = "logs") -> int:
    return fake.add(
        {
            registry.TAG_METRIC: "val.recip_rank",
            registry.TAG_METRIC_VALUE: repr(value),
            registry.TAG_COMMITTED: "earlier",
            registry.TAG_DATA_SOURCE: source,
        },
        alias=registry.CHAMPION,
    )


def _register(paths, **kwargs):
    kwargs.setdefault("rescore", lambda champion: None)
    return run_register(kwargs.pop("settings", _settings()), paths, log=lambda _: None, **kwargs)


def test_inside_a_cycle_the_stage_moves_no_alias_and_marks_nothing(fake, paths):
    old = _champion(fake, 0.40)

    result = _register(paths, cycle_run="20261015T030000Z")

    new = result["version"]
    assert result["promoted"] == 1 and result["deferred"] == 1  # decided, not done
    assert fake.aliases == {registry.CHAMPION: old}
    assert not fake.versions[new].get(registry.TAG_COMMITTED)
    assert fake.versions[new][registry.TAG_RETRAIN_RUN] == "20261015T030000Z"


def test_on_its_own_the_stage_marks_the_version_committed_before_promoting(fake, paths):
    result = _register(paths)

    new = result["version"]
    assert fake.calls.index(("committed", new)) < fake.calls.index(("alias champion", new))
    assert fake.aliases[registry.CHAMPION] == new


def test_an_experiment_registers_but_never_moves_the_champion(fake, paths):
    old = _champion(fake, 0.40)

    result = _register(paths, experiment="bushy-flan")

    new = result["version"]
    assert result["promoted"] == 0 and result["experiment_would_promote"] == 1
    assert fake.aliases[registry.CHAMPION] == old  # the service's model is unchanged
    assert f"qpr model promote {new}" in result["reason"] and "bushy-flan" in result["reason"]


def test_the_champion_is_re_scored_on_the_challengers_queries(fake, paths):
    # Recorded on another split it looked unbeatable (0.90); on the challenger's validation
    # queries, measured the same way, it scores 0.60 against the challenger's 0.72.
    _champion(fake, 0.90)
    asked = []

    def rescore(champion):
        asked.append(champion.version)
        return 0.72, 0.60

    result = _register(paths, rescore=rescore)

    assert asked == [1]
    assert result["promoted"] == 1, result["reason"]
    assert (result["challenger"], result["champion"]) == (0.72, 0.60)
    assert result["compared"] == "re-scored alike"


def test_without_a_re_score_the_decision_says_so(fake, paths):
    _champion(fake, 0.40)
    result = _register(paths, rescore=lambda champion: None)
    assert "WARNING: champion not re-scored" in result["reason"]


def test_a_challenger_trained_on_another_data_source_is_refused(fake, paths):
    champion = _champion(fake, 0.10, source="logs")

    result = _register(paths, settings=_settings("quora"), rescore=pytest.fail)

    assert result["promoted"] == 0
    assert "data source 'quora'" in result["reason"] and "--force" in result["reason"]
    assert fake.aliases[registry.CHAMPION] == champion
    with pytest.raises(registry.RegistryError, match="not comparable"):
        fake.promote(NAME, result["version"], reason="try", actor="tests")
    fake.promote(NAME, result["version"], reason="quora from now on", actor="tests", force=True)
    assert fake.aliases[registry.CHAMPION] == result["version"]


def test_an_uncommitted_version_is_refused_promotion():
    info = registry.VersionInfo(NAME, 3, (), None, None, None, None, {})  # type: ignore[arg-type]
    assert "no committed mark" in (promotion.promotion_refusal(info, None) or "")


def _log_one_question(folder: Path) -> None:
    """One served question in a query log written by the real writer."""
    from qpr.querylog import QueryLog
    from qpr.querylog.log_writer import LogLimits
    from qpr.retrieval.bundle import Hit, SearchResult

    hit = Hit(question_id=7, text="reset my laptop", cluster_id=1, distance=0.0, score=1.0)
    result = SearchResult(query="how do i reset my laptop", hits=[hit], answered=True)
    model = {"name": NAME, "version": 1, "fingerprint": "f"}
    with QueryLog(folder, LogLimits(flush_seconds=0.05)) as log:
        log.queries(
            "r1", [result], endpoint="/search", model=model, k=1, threshold=None, latency_ms=1
        )


def test_without_a_query_log_the_shadow_entry_is_the_same_everywhere(fake, tmp_path):
    """`make run` has no query log: metrics/register.json (a DVC output) must not vary."""
    records = []
    for root in (tmp_path / "a", tmp_path / "b"):
        paths = ProjectPaths(root)
        paths.stage_metrics("evaluate").parent.mkdir(parents=True)
        paths.stage_metrics("evaluate").write_text(json.dumps({"val": {"recip_rank": 0.7}}))
        records.append(_register(paths)["shadow"])
    assert records[0] == records[1] == {"measured": False, "why": "no query log at logs/service"}
    assert json.loads(fake.versions[1]["qpr.shadow"]) == records[0]  # why, on the version


def test_the_shadow_check_says_why_it_measured_nothing(fake, paths):
    folder = paths.root / "logs" / "service"
    folder.mkdir(parents=True)
    assert _register(paths)["shadow"]["why"] == "no query lines in logs/service"
    _log_one_question(folder)
    fake.aliases.clear()  # the run above promoted its version: none now
    assert _register(paths)["shadow"]["why"] == "no champion"
    _champion(fake, 0.40, source="quora")
    assert _register(paths)["shadow"]["why"] == "champion trained on data source 'quora'"


def test_a_shadow_requirement_that_cannot_be_checked_keeps_the_champion(fake, paths):
    old = _champion(fake, 0.40)
    settings = settings_from_dict(
        {"registry": {"name": NAME, "margin": 0.01, "min_metric": 0.1, "min_shadow_accuracy": 0.5}}
    )

    result = _register(paths, settings=settings, rescore=lambda champion: (0.72, 0.40))

    assert result["promoted"] == 0 and fake.aliases[registry.CHAMPION] == old
    assert (
        "registry.min_shadow_accuracy 0.5 is set but the shadow check was not measured"
        in (result["reason"])
    )

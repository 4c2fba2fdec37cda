"""The loop closed, end to end: the service answers questions wrongly, people say which
answer was right, `qpr retrain` (retrain_flow) harvests that feedback through the raw-log
gate into data/, `dvc repro` trains and registers, and the new model answers those
questions with the answers people named. Bare rejections never reach data/.

The served model is the tiny pipeline's (run in-process on the project's own logs), the
registry's champion; the cycle's `dvc repro` then trains the next one from scratch on the
logs plus the feedback, and its register stage shadows the champion on the logged
questions before it decides (the figures land on the new version).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from qpr.artifacts import QUESTIONS_FILE
from qpr.config import settings_from_dict
from qpr.ops.harvest import read_rejections
from qpr.retrieval.bundle import Bundle
from qpr.serve.app import create_app
from qpr.serve.settings import ServeSettings
from qpr.serve.sources import LocalSource
from tests.conftest import run_stages, tiny_overrides
from tests.flows.test_retrain import _day, retrain_project

pytestmark = pytest.mark.slow

NAME = "qpr-feedback-test"
EXPERIMENT = "qpr-feedback-tests"
# Questions of words the logs never had: the served model cannot know their answers.
NEW = [
    "zorbic flange tuning for my quaffle",
    "wimble sprocket noise at dawn",
    "how to glarn a frobnitz",
    "plinth vorpal spackle sold where",
]


def _served_model(tmp_path: Path) -> Path:
    """The model in service: the tiny pipeline on the same synthetic logs as the project,
    registered and promoted, so the cycle's register stage has a champion to shadow."""
    from qpr.ops.registry import mark_committed, promote, register_bundle

    root = tmp_path / "serving"
    metrics = run_stages(settings_from_dict(tiny_overrides(root)), root)
    version = register_bundle(root / "models", metrics, name=NAME)
    mark_committed(NAME, version.version, by="tests")  # as a finished pipeline run does
    promote(NAME, version.version, reason="the model in service", actor="tests")
    return root / "models"


def _ask(client: TestClient, question: str) -> tuple[str, str | None]:
    response = client.post("/search", json={"question": question})
    assert response.status_code == 200, response.text
    hits = response.json()["hits"]
    return response.headers["x-request-id"], hits[0]["answer_id"] if hits else None


def _serve_and_judge(models: Path, log_dir: Path) -> dict[str, str]:
    """The service answers NEW; a person names the right answer for three of them (one
    asked twice, judged the same way twice) and rejects the fourth bare. Returns the
    right answer per question: an answer the data knows, never the one served."""
    answers = sorted(set(pd.read_parquet(models / QUESTIONS_FILE)["answer_id"].dropna()))
    settings = ServeSettings(poll_seconds=0, startup_wait=60, query_log=str(log_dir))
    right: dict[str, str] = {}
    with TestClient(create_app(LocalSource(models), settings)) as client:
        for i, question in enumerate(NEW):
            request_id, served = _ask(client, question)
            right[question] = next(a for a in answers[7 * i :] if a != served)
            verdict = {"request_id": request_id, "answer_id": right[question]}
            if i == 0:
                verdict["outcome"] = "taken"  # took another answer of the list
            elif i == 1:
                verdict["outcome"] = "rejected"  # rejected the top one, named the right one
            elif i == 2:
                verdict["outcome"] = "taken"
                again, _ = _ask(client, question)  # asked again, the same verdict again
                sent = client.post("/feedback", json={**verdict, "request_id": again})
                assert sent.json()["logged"] is True
            else:
                verdict = {"request_id": request_id, "outcome": "rejected"}  # bare
                del right[question]
            assert client.post("/feedback", json=verdict).json()["logged"] is True
    return right


def _data_rows(project: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted((project / "data" / "logs").glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


def test_feedback_through_retraining_answers_the_fed_back_questions(
    prefect_harness, tmp_path: Path
) -> None:
    from flows.retrain import retrain_flow

    project = retrain_project(tmp_path / "project", NAME, EXPERIMENT)
    right = _serve_and_judge(_served_model(tmp_path), project / "logs" / "service")
    rejected = NEW[3]
    day4 = _day(project, 4)  # the day's logs arrive too: on 3 days the train gate says no

    summary = retrain_flow(params=str(project / "params.yaml"))

    assert summary["outcome"] == "retrained", summary
    harvested = summary["harvest"]
    assert (harvested["feedback_lines"], harvested["questions"]) == (5, 4)
    assert (harvested["rows"], harvested["rejections"]) == (3, 2)
    assert summary["files_valid"] == [day4.name, Path(harvested["file"]).name]  # the gate
    assert summary["merge"]["rows_added"] == 400 + 3

    # The shadow check: the new version and the champion answered the logged questions.
    from qpr.ops.registry import get_version

    new = get_version(NAME, summary["register"]["version"])
    shadow = json.loads(new.tag("qpr.shadow"))
    assert shadow["measured"] and shadow["questions"] == 5 and shadow["champion_version"] == 1
    # The champion never knew the fed-back answers; the new model learnt them.
    assert shadow["challenger_accuracy"] > shadow["champion_accuracy"]
    assert new.tag("qpr.shadow_agreement").startswith(f"{shadow['agreement']:.3f}")

    fed = [r for r in _data_rows(project) if r.get("source") == "service-feedback"]
    assert sorted((r["question"], r["answer_id"]) for r in fed) == sorted(right.items())
    assert rejected not in {r["question"] for r in _data_rows(project)}
    cases = read_rejections(project / ".retrain").set_index("question")
    assert sorted(cases.index) == sorted([NEW[1], rejected])
    assert cases.loc[NEW[1], "right_answer_id"] == right[NEW[1]]

    bundle = Bundle.load(project / "models")
    indexed = pd.read_parquet(project / "models" / QUESTIONS_FILE).set_index("text")
    for question, answer in right.items():
        assert indexed.loc[question, "answer_id"] == answer
        top = bundle.search(question, k=3).hits[0]
        assert (top.text, top.answer_id) == (question, answer)

    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    (run,) = [r for r in runs if r.info.run_name == f"retrain {summary['run']}"]
    assert run.data.metrics["harvested_rows"] == 3
    assert run.data.metrics["harvested_rejections"] == 2

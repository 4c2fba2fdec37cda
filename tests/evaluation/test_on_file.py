"""`qpr evaluate FILE`: a trained bundle evaluated on files it was not trained on.

The bundle is trained once for the module by the stages themselves (cluster → train →
export → index → evaluate, no Prefect) on three tiny days of synthetic logs. It is then
evaluated on a crafted Quora-format file and a crafted log file whose clusters are counted
by hand, and on a fresh synthetic day that shares most questions with its training data.
"""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from qpr.artifacts import QUESTIONS_FILE
from qpr.cli import app
from qpr.config import Settings, settings_from_dict
from qpr.data.synth import write_day
from qpr.evaluation.on_file import (
    EXACT_MAX_QUESTIONS,
    EvaluateFileConfig,
    FileEvaluation,
    evaluate_file,
    write_report,
)
from qpr.retrieval.bundle import Bundle
from qpr.text.normalize import normalize
from tests.conftest import run_stages, tiny_overrides

pytestmark = pytest.mark.slow
runner = CliRunner()
MEASURES = ("success_1", "success_10", "recip_rank", "P_10", "map", "ndcg_cut_10", "recall_20")


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, Path]:
    """(settings, project root) with a trained bundle in root/models and root/params.yaml."""

    root = tmp_path_factory.mktemp("evaluate-file-project")
    settings = settings_from_dict(tiny_overrides(root))
    (root / "params.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    run_stages(settings, root)
    return settings, root


# Clusters by hand: {1, 2, 3} and {4, 5} and {8, 9}; 6 and 7 are in no duplicate pair;
# the last row has no valid label and is dropped. 9 questions, 7 queries.
QUORA_ROWS = [
    (0, 1, 2, "How do I reset my printer?", "What is the best way to reset a printer?", "1"),
    (1, 2, 3, "What is the best way to reset a printer?", "printer reset: how to do it", "1"),
    (2, 4, 5, "How tall is the Eiffel tower?", "What is the height of the Eiffel tower?", "1"),
    (3, 6, 7, "How do I cook rice?", "What is the capital of France?", "0"),
    (4, 8, 9, "Where can I buy a kite?", "Where to buy kites near me?", "1"),
    (5, 1, 6, "How do I reset my printer?", "How do I cook rice?", "0"),
    (6, 10, 11, "Is this labelled?", "No, it is not", "maybe"),
]
QUORA_CLUSTERS = {"1": {"2", "3"}, "2": {"1", "3"}, "3": {"1", "2"}, "4": {"5"}, "5": {"4"}}
QUORA_CLUSTERS |= {"8": {"9"}, "9": {"8"}}


def _write_quora(path: Path, rows: list[tuple]) -> Path:
    frame = pd.DataFrame(
        rows, columns=["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    )
    frame.to_csv(path, sep="\t", index=False)
    return path


# Log clusters by hand: reset-printer (3 questions) and tokyo-time (2) are evaluated;
# eiffel (1 question) is too small; "ans-yes" gathers 12 unrelated questions
# (coherence 1/12 < 0.1): incoherent. 18 questions, 5 queries.
UNRELATED = [
    "is the sky blue",
    "can dogs swim",
    "do fish sleep",
    "will it snow",
    "are cats cute",
    "should i nap",
    "did rome fall",
    "was pluto demoted",
    "could pigs fly",
    "would owls hoot",
    "have bees knees",
    "does ice melt",
]
LOG_QUESTIONS = [
    ("how do i reset my printer", "ans-printer"),
    ("reset the printer please", "ans-printer"),
    ("printer reset steps", "ans-printer"),
    ("what time is it in tokyo", "ans-tokyo"),
    ("tokyo time now", "ans-tokyo"),
    ("how tall is the eiffel tower", "ans-eiffel"),
    *[(q, "ans-yes") for q in UNRELATED],
]


def _write_log_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    pd.DataFrame(
        {
            "timestamp": [f"2026-11-01T10:{i:02d}:00Z" for i in range(len(rows))],
            "question": [q for q, _ in rows],
            "answer_id": [a for _, a in rows],
        }
    ).to_csv(path, index=False)
    return path


def _evaluate(project, data: Path, tmp_path: Path, **options) -> FileEvaluation:
    settings, root = project
    config = EvaluateFileConfig(
        data=data, models_dir=root / "models", gate_reports=tmp_path / "gates", **options
    )
    return evaluate_file(config, settings, log=_quiet)


def _check_measures(result: FileEvaluation) -> None:
    for name, values in result.summary["systems"].items():
        for measure in MEASURES:
            assert 0.0 <= values[measure] <= 1.0, (name, measure, values[measure])


def _check_self_exclusion(result: FileEvaluation, k: int) -> None:
    for name, system in result.systems.items():
        for qid, docs in system.run.items():
            found = [doc for doc, _ in docs]
            assert qid not in found, f"{name}: query {qid} found itself"
            assert len(found) <= k


def test_quora_file(project, tmp_path: Path) -> None:
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    result = _evaluate(project, data, tmp_path, baselines=["bm25", "jaccard"], k=5)
    counts = result.summary["counts"]
    assert result.summary["format"] == "quora"
    assert (counts["questions"], counts["clusters"], counts["queries"]) == (9, 3, 7)
    assert counts["index_size"] == 9 and counts["rows_dropped"] == 1
    assert {q: set(docs) for q, docs in result.queries.qrels.items()} == QUORA_CLUSTERS
    assert set(result.systems) == {"served", "encoder", "bm25_alone", "bm25", "jaccard"}
    assert all(s["num_queries"] == 7 for s in result.summary["systems"].values())
    _check_measures(result)
    _check_self_exclusion(result, k=5)
    # 9 questions, the query left out: every dense query gets the other 8 (k = 5 of them).
    assert all(len(docs) == 5 for docs in result.systems["encoder"].run.values())


def test_max_queries_samples_the_queries_not_the_index(project, tmp_path: Path) -> None:
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    capped = _evaluate(project, data, tmp_path, max_queries=3)
    counts = capped.summary["counts"]
    assert (counts["queries"], counts["queries_before_cap"], counts["index_size"]) == (3, 7, 9)
    assert all(s["num_queries"] == 3 for s in capped.summary["systems"].values())
    qrels = {q: set(docs) for q, docs in capped.queries.qrels.items()}
    assert qrels == {q: QUORA_CLUSTERS[q] for q in qrels}  # whole clusters stay relevant
    _check_self_exclusion(capped, k=capped.summary["k"])
    _, md_path = write_report(capped.summary, tmp_path / "out")
    assert "3 queries (a seeded sample of its 7)" in md_path.read_text()


def test_index_is_exact_unless_asked_for_the_params_index(project, tmp_path: Path) -> None:
    settings, _ = project
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    exact = _evaluate(project, data, tmp_path)
    approximate = _evaluate(project, data, tmp_path, exact=False)
    assert exact.summary["index"]["factory"] == "Flat"
    assert approximate.summary["index"]["requested_factory"] == settings.index.factory
    assert approximate.summary["counts"] == exact.summary["counts"]
    _check_measures(approximate)


def test_model_index_adds_the_bundle_as_distractors(project, tmp_path: Path) -> None:
    _, root = project
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    alone = _evaluate(project, data, tmp_path)
    joined = _evaluate(project, data, tmp_path, with_model_index=True)
    size = Bundle.load(root / "models").size
    counts = joined.summary["counts"]
    # No crafted Quora question is in the synthetic training logs: all of the bundle is added.
    assert counts["model_index_duplicates"] == 0
    assert counts["index_size"] == alone.summary["counts"]["index_size"] + size
    assert counts["queries"] == alone.summary["counts"]["queries"] == 7
    assert joined.queries.qrels == alone.queries.qrels  # distractors are never relevant
    distractors = [d for docs in joined.systems["encoder"].run.values() for d, _ in docs]
    assert any(int(d) < 0 for d in distractors)  # and they do compete
    _check_measures(joined)
    _check_self_exclusion(joined, k=joined.summary["k"])


def test_log_file(project, tmp_path: Path) -> None:
    data = _write_log_csv(tmp_path / "day.csv", LOG_QUESTIONS)
    result = _evaluate(project, data, tmp_path, baselines=["bm25"])
    counts = result.summary["counts"]
    assert result.summary["format"] == "logs"
    assert (counts["questions"], counts["clusters"], counts["queries"]) == (18, 2, 5)
    assert counts["clusters_dropped_incoherent"] == 1
    sizes = sorted(len(docs) + 1 for docs in result.queries.qrels.values())
    assert sizes == [2, 2, 3, 3, 3]
    _check_measures(result)
    _check_self_exclusion(result, k=result.summary["k"])


def test_fresh_synthetic_day_with_the_model_index(project, tmp_path: Path) -> None:
    settings, root = project
    synth = settings.data.synth
    data = write_day(
        tmp_path / "fresh", date(2026, 10, 20), seed=synth.seed, rows=400, intents=synth.intents
    )
    alone = _evaluate(project, data, tmp_path)
    joined = _evaluate(project, data, tmp_path, with_model_index=True, split="all")
    assert alone.summary["counts"]["queries"] > 0
    _check_measures(joined)
    _check_self_exclusion(joined, k=joined.summary["k"])
    # The same generator wrote the training days: many questions are the same text. Each is
    # indexed once, so no query finds a copy of itself.
    model_texts = pd.read_parquet(root / "models" / QUESTIONS_FILE)["text"].map(normalize)
    file_keys = set(pd.read_json(data, lines=True)["question"].map(normalize)) - {""}
    copies = int(model_texts.isin(file_keys).sum())
    counts = joined.summary["counts"]
    assert copies > 0 and counts["model_index_duplicates"] == copies
    size = Bundle.load(root / "models").size
    assert counts["index_size"] == alone.summary["counts"]["index_size"] + size - copies
    # Queries, relevance and what is relevant do not change with the distractors.
    assert joined.queries.qrels == alone.queries.qrels


def test_cli_writes_json_and_markdown(project, tmp_path: Path) -> None:
    _, root = project
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    out = tmp_path / "report"
    result = runner.invoke(
        app,
        [
            "evaluate",
            str(data),
            "--params",
            str(root / "params.yaml"),
            "--models-dir",
            str(root / "models"),
            "--baselines",
            "bm25,jaccard",
            "--with-model-index",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["systems"]) == {"served", "encoder", "bm25_alone", "bm25", "jaccard"}
    assert summary["counts"]["queries"] == 7 and summary["with_model_index"] is True
    assert {"total", "encode", "index"} <= set(summary["seconds"])
    table = (out / "results.md").read_text()
    assert "| system | P@1 | P@10 | MRR |" in table and "| bm25 |" in table
    assert "P@1" in result.output and "7 queries" in result.output
    # The help states the size up to which the index is exact: the library's constant.
    assert f"{EXACT_MAX_QUESTIONS:,}" in runner.invoke(app, ["evaluate", "--help"]).output
    # Results carry ids and numbers only, never the questions.
    assert "printer" not in (out / "results.json").read_text() + table


def _cli(root: Path, *args: str, models: Path | None = None) -> tuple[int, str]:
    """(exit code, output with the console's line wrapping undone)."""
    models = root / "models" if models is None else models
    command = ["evaluate", "--params", str(root / "params.yaml"), "--models-dir", str(models)]
    result = runner.invoke(app, [*command, *args])
    return result.exit_code, " ".join(result.output.split())


def test_cli_errors(project, tmp_path: Path) -> None:
    _, root = project
    out = ["--out", str(tmp_path / "out")]

    code, said = _cli(root, str(tmp_path / "nowhere.tsv"), *out)
    assert code == 1 and f"data not found: {tmp_path / 'nowhere.tsv'}" in said

    code, said = _cli(root, str(tmp_path), "--format", "xml", *out)
    assert code == 2 and "Invalid value for '--format'" in said

    (tmp_path / "notes.txt").write_text("just some text\n")
    code, said = _cli(root, str(tmp_path / "notes.txt"), *out)
    assert code == 1 and "cannot tell the format" in said and "--format quora" in said

    no_pairs = _write_quora(tmp_path / "none.tsv", [r for r in QUORA_ROWS if r[5] == "0"])
    code, said = _cli(root, str(no_pairs), *out)
    assert code == 1 and "no cluster of size >= 2" in said

    broken = Path(shutil.copytree(root / "models", tmp_path / "broken"))
    (broken / "encoder.onnx").unlink()
    ok = _write_quora(tmp_path / "ok.tsv", QUORA_ROWS)
    code, said = _cli(root, str(ok), *out, models=broken)
    assert code == 1 and "incomplete model bundle" in said and "encoder.onnx" in said

    # Half the rows with an answer id the gate refuses: the raw-log gate stops the batch.
    bad_rows = [(q, "!bad id" if i % 2 else a) for i, (q, a) in enumerate(LOG_QUESTIONS)]
    code, said = _cli(root, str(_write_log_csv(tmp_path / "bad.csv", bad_rows)), *out)
    assert code == 1 and "raw_logs" in said and "answer_id" in said
    assert (tmp_path / "out" / "gates" / "raw_logs.json").is_file()

    code, said = _cli(root, "--with-model-index")
    assert code == 1 and "--models-dir, --with-model-index are for qpr evaluate FILE only" in said


def _served_top1(searcher, questions: pd.DataFrame, query_ids, k: int) -> dict[str, tuple]:
    """{query id: (first hit id or None, first hit distance)}: each query searched as one
    request, its own question left out of the search."""
    text_of = dict(zip(questions["question_id"], questions["text"], strict=True))
    out = {}
    for qid in query_ids:
        hits = searcher.bundle.search_batch([text_of[qid]], k, exclude=[int(qid)])[0].hits
        out[str(qid)] = (str(hits[0].question_id), hits[0].distance) if hits else (None, None)
    return out


def test_served_row_is_what_the_bundle_serves(project, tmp_path: Path) -> None:
    from qpr import Searcher
    from qpr.evaluation.on_file import clusters_from_file

    settings, root = project
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    result = _evaluate(project, data, tmp_path, k=5)
    assert list(result.systems) == ["served", "encoder", "bm25_alone"]
    _check_measures(result)
    _check_self_exclusion(result, k=5)
    # The same bundle built over the file's questions by the public API, searched one
    # question at a time as the service is: the same first hit for every query.
    questions = clusters_from_file(
        data, "quora", settings, report_dir=tmp_path / "gates", log=_quiet
    ).questions
    searcher = Searcher.build(
        questions=questions["text"].tolist(),
        answer_ids=[str(c) for c in questions["cluster_id"]],
        question_ids=questions["question_id"].tolist(),
        encoder=root / "models",
        out=tmp_path / "served",
    )
    expected = _served_top1(searcher, questions, result.queries.query_ids, 5)
    run = result.systems["served"].run
    assert {q: docs[0][0] for q, docs in run.items()} == {q: e[0] for q, e in expected.items()}
    served = result.summary["served_index"]
    assert served["fusion"] == Bundle.load(root / "models").search_config.fusion
    assert served["threshold"] == searcher.bundle.search_config.threshold
    systems = result.summary["systems"]
    assert {"answered_share", "precision_at_1", "p50_ms"} <= set(systems["served"])
    assert systems["bm25_alone"].get("answered_share") is None  # BM25 has no distance
    # 6 and 7 are in no duplicate pair: questions with no paraphrase, for false answers.
    assert result.summary["no_answer"]["no_paraphrase_questions"] == 2


@pytest.mark.parametrize(("threshold", "answered"), [(0.0, 0.0), (1e9, 1.0)])
def test_served_row_applies_the_bundle_threshold(
    project, tmp_path: Path, threshold: float, answered: float
) -> None:
    from dataclasses import replace

    from qpr.artifacts import SearchConfig

    _, root = project
    models = Path(shutil.copytree(root / "models", tmp_path / "models"))
    replace(SearchConfig.read(models), threshold=threshold).write(models)
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    config = EvaluateFileConfig(data=data, models_dir=models, gate_reports=tmp_path / "gates")
    result = evaluate_file(config, project[0], log=_quiet)
    served = result.summary["systems"]["served"]
    assert served["answered_share"] == answered
    # Both questions with no paraphrase find something: answered when everything is.
    assert served["false_answer_rate"] == answered
    if answered:
        assert served["precision_at_1"] == served["success_1"]
    else:
        assert served["precision_at_1"] is None
    assert f"threshold {threshold:.4g}" in (
        Path(write_report(result.summary, tmp_path / "report")[1]).read_text()
    )


@pytest.mark.slow
def test_cli_evaluates_a_registered_model(project, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from qpr.serve.sources import TAG_COMMITTED

    _, root = project
    client = MlflowClient()  # the tests' own store (conftest's isolated_tracking)
    experiment = client.create_experiment("eval", artifact_location=(tmp_path / "art").as_uri())
    client.create_registered_model("qpr-eval")
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(root / "models"), "model/artifacts/bundle")
    client.set_terminated(run.info.run_id)
    version = client.create_model_version(
        "qpr-eval",
        source=f"{run.info.artifact_uri}/model",
        run_id=run.info.run_id,
        tags={TAG_COMMITTED: "test"},  # a registry-following reader serves committed only
    )
    client.set_registered_model_alias("qpr-eval", "champion", str(version.version))
    data = _write_quora(tmp_path / "pairs.tsv", QUORA_ROWS)
    params = ["evaluate", str(data), "--params", str(root / "params.yaml")]
    local = runner.invoke(
        app, [*params, "--models-dir", str(root / "models"), "--out", str(tmp_path / "local")]
    )
    assert local.exit_code == 0, local.output
    ref = "models:/qpr-eval@champion"
    remote = runner.invoke(app, [*params, "--model", ref, "--out", str(tmp_path / "remote")])
    assert remote.exit_code == 0, remote.output
    summaries = [
        json.loads((tmp_path / d / "results.json").read_text()) for d in ("local", "remote")
    ]
    assert summaries[1]["models_dir"] == ref
    assert summaries[1]["bundle_fingerprint"] == summaries[0]["bundle_fingerprint"]
    for name in ("served", "encoder", "bm25_alone"):
        assert (
            summaries[1]["systems"][name]["success_1"] == summaries[0]["systems"][name]["success_1"]
        )
    assert ref in (tmp_path / "remote" / "results.md").read_text()


def test_calibration_chooses_a_threshold_for_the_file_and_saves_a_bundle(
    project, tmp_path: Path
) -> None:
    """A bundle whose threshold refuses everything (a threshold from another domain) gets
    one chosen on half the file's clusters; the saved copy serves with it."""
    from dataclasses import replace

    from qpr.artifacts import SEARCH_FILE, SearchConfig
    from qpr.evaluation.calibrate import Calibration
    from qpr.evaluation.on_file import EvaluateFileError, save_calibrated

    settings, root = project
    models = Path(shutil.copytree(root / "models", tmp_path / "models"))
    replace(SearchConfig.read(models), threshold=0.0).write(models)
    before = (models / SEARCH_FILE).read_bytes()
    synth = settings.data.synth
    data = write_day(
        tmp_path / "day", date(2026, 10, 21), seed=synth.seed + 1, rows=400, intents=synth.intents
    )
    saved = tmp_path / "calibrated"
    config = EvaluateFileConfig(
        data=data, models_dir=models, gate_reports=tmp_path / "gates", save_calibrated=saved
    )
    result = evaluate_file(config, settings, log=_quiet)
    calibration = result.summary["calibration"]
    bundle, mine = calibration["check"]["bundle"], calibration["check"]["calibrated"]
    assert bundle["answered_share"] == 0.0
    chose = calibration["calibration"]
    assert calibration["threshold"] > 0.0 and mine["answered_share"] > 0.0
    if calibration["rule"] == "target":  # met on the half that chose it, by the rule
        assert chose["precision_at_1"] >= settings.evaluate.target_precision
        assert chose["false_answer_rate"] <= settings.evaluate.max_false_answer_rate
    # Each query searched again without its cluster: as many unanswerable searches.
    assert mine["unanswerable"] >= mine["answerable"] > 0
    assert chose["answerable"] + mine["answerable"] == result.summary["counts"]["queries"]
    # The copy serves with the new threshold; the original bundle is untouched.
    assert (models / SEARCH_FILE).read_bytes() == before
    copy = Bundle.load(saved)
    assert copy.search_config.threshold == calibration["threshold"]
    assert copy.search_config.chosen_on == f"calibration on {data.name}"
    assert copy.fingerprint != Bundle.load(models).fingerprint
    with pytest.raises(EvaluateFileError, match="exists"):
        save_calibrated(models, saved, Calibration(**calibration), "again")


def test_cli_calibrate_prints_both_thresholds(project, tmp_path: Path) -> None:
    _, root = project
    data = _write_log_csv(tmp_path / "day.csv", LOG_QUESTIONS)
    code, output = _cli(root, str(data), "--calibrate", "--out", str(tmp_path / "r"))
    assert code == 0, output
    assert "calibrated threshold" in output
    assert "bundle's " in output and "calibrated " in output and "false answers" in output
    summary = json.loads((tmp_path / "r" / "results.json").read_text())
    assert summary["calibration"]["calibration"]["clusters"] == 1  # of the file's two

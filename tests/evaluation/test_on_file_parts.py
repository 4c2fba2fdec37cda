"""The pure parts of `qpr evaluate FILE`: format detection, the evaluated clusters, the
query cap, the model-index merge and the baseline list, on hand-made inputs with
hand-computed answers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from qpr.data.loaders import DropReport
from qpr.data.splits import filter_clusters
from qpr.evaluation.on_file import (
    EvaluateFileError,
    FileClusters,
    _parse_baselines,
    cap_queries,
    detect_format,
    evaluation_clusters,
    merge_model_questions,
)
from qpr.evaluation.queries import query_set

QUORA_HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"


def test_detect_format(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "pairs.tsv").write_text("anything\n")
    (tmp_path / "pairs.txt").write_text(QUORA_HEADER)
    (tmp_path / "pairs.csv").write_text(QUORA_HEADER)  # tab-separated despite its name
    (tmp_path / "day.csv").write_text("timestamp,question,answer_id\n")
    (tmp_path / "day.jsonl").write_text("{}\n")
    (tmp_path / "day.parquet").write_bytes(b"PAR1")
    assert detect_format(tmp_path / "logs") == "logs"
    assert detect_format(tmp_path / "pairs.tsv") == "quora"
    assert detect_format(tmp_path / "pairs.txt") == "quora"
    assert detect_format(tmp_path / "pairs.csv") == "quora"
    assert detect_format(tmp_path / "day.csv") == "logs"
    assert detect_format(tmp_path / "day.jsonl") == "logs"
    assert detect_format(tmp_path / "day.parquet") == "logs"


def test_detect_format_errors(tmp_path: Path) -> None:
    with pytest.raises(EvaluateFileError, match="data not found"):
        detect_format(tmp_path / "missing.tsv")
    (tmp_path / "notes.txt").write_text("just text\n")
    with pytest.raises(EvaluateFileError, match="--format quora"):
        detect_format(tmp_path / "notes.txt")


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cluster 1: qids 1, 2, 3 with 2 and 3 the same text; cluster 2: qids 4, 5 with one
    text; cluster 3: qids 6, 7; qid 8 in no cluster; cluster 4 (qids 9, 10) incoherent."""
    rows = [
        (1, "a", 1),
        (2, "b", 1),
        (3, "b", 1),
        (4, "c", 2),
        (5, "c", 2),
        (6, "d", 3),
        (7, "e", 3),
        (8, "f", -1),
        (9, "g", 4),
        (10, "h", 4),
    ]
    questions = pd.DataFrame(rows, columns=["question_id", "norm_key", "cluster_id"])
    questions["text"] = questions["norm_key"].str.upper()
    clusters = pd.DataFrame(
        {
            "cluster_id": [1, 2, 3, 4],
            "size": [3, 2, 2, 2],
            "coherence": [0.5, 1.0, 0.4, 0.05],
        }
    )
    return questions, filter_clusters(clusters, coherence_threshold=0.1, min_size=2)


def test_split_all_evaluates_every_kept_cluster_once_per_text() -> None:
    questions, clusters = _frames()
    marked, clusters = evaluation_clusters(
        questions, clusters, split="all", seed=0, ratios={"train": 0.8, "val": 0.1, "test": 0.1}
    )
    split = dict(zip(marked["question_id"], marked["split"], strict=True))
    # qid 3 repeats qid 2's text: one query; cluster 2 is one text twice: nothing to find;
    # cluster 4 is incoherent; qid 8 has no cluster.
    assert [q for q, s in split.items() if s == "test"] == [1, 2, 6, 7]
    assert split[3] == split[4] == split[5] == split[8] == split[9] == "none"
    evaluated = clusters.loc[clusters["split"] == "test", "cluster_id"].tolist()
    assert evaluated == [1, 3]
    reason = dict(zip(clusters["cluster_id"], clusters["drop_reason"], strict=True))
    assert reason[2] == "too_small_after_leakage" and reason[4] == "incoherent"


def test_split_test_takes_the_cluster_stage_cut() -> None:
    questions, clusters = _frames()
    # All weight on test: every kept cluster lands there, as with split="all".
    marked, _ = evaluation_clusters(
        questions, clusters, split="test", seed=0, ratios={"train": 0.0, "val": 0.0, "test": 1.0}
    )
    assert marked.loc[marked["split"] == "test", "question_id"].tolist() == [1, 2, 6, 7]
    # All weight on train: nothing is evaluated.
    marked, _ = evaluation_clusters(
        questions, clusters, split="test", seed=0, ratios={"train": 1.0, "val": 0.0, "test": 0.0}
    )
    assert not (marked["split"] == "test").any()


def _clustered(n_clusters: int) -> FileClusters:
    """n_clusters clusters of two questions each, every question a query."""
    ids = list(range(2 * n_clusters))
    questions = pd.DataFrame(
        {
            "question_id": ids,
            "text": [f"q{i}" for i in ids],
            "cluster_id": [i // 2 for i in ids],
            "split": "test",
        }
    )
    queries = query_set(questions, "test")
    counts = {"queries": len(ids), "questions": len(ids)}
    return FileClusters(questions, queries, counts, DropReport(rows_in=len(ids)))


def test_cap_queries_keeps_a_seeded_sample_with_whole_qrels() -> None:
    clustered = _clustered(50)
    capped = cap_queries(clustered, 10, seed=7, log=lambda _: None)
    ids = capped.queries.query_ids.tolist()
    assert len(ids) == 10 and ids == sorted(ids)  # in the file's order
    assert capped.counts == {"queries": 10, "questions": 100, "queries_before_cap": 100}
    # Each kept query keeps its paraphrase, sampled or not; the index is untouched.
    assert capped.queries.qrels == {str(q): {str(q ^ 1): 1} for q in ids}
    assert capped.queries.texts == [f"q{q}" for q in ids]
    assert capped.questions is clustered.questions
    assert cap_queries(clustered, 10, seed=7, log=lambda _: None).queries.query_ids.tolist() == ids
    assert cap_queries(clustered, 10, seed=8, log=lambda _: None).queries.query_ids.tolist() != ids


def test_cap_queries_at_or_above_the_count_changes_nothing() -> None:
    clustered = _clustered(3)
    assert cap_queries(clustered, None, seed=7) is clustered
    assert cap_queries(clustered, 6, seed=7) is clustered


def test_merge_model_questions_skips_copies_and_gives_negative_ids() -> None:
    file_questions = pd.DataFrame(
        {"question_id": [10, 11], "text": ["How do I X?", "Y"], "norm_key": ["how do i x", "y"]}
    )
    model = pd.DataFrame({"text": ["how do I x", "Z!", "z", "W"]})
    corpus, copies = merge_model_questions(file_questions, model)
    # "how do I x" is file question 10; "z" repeats "Z!" inside the model index.
    assert copies == 2
    assert corpus["question_id"].tolist() == [10, 11, -1, -2]
    assert corpus["text"].tolist() == ["How do I X?", "Y", "Z!", "W"]
    assert str(corpus["question_id"].dtype) == "int64"


def test_merge_with_nothing_in_common_adds_everything() -> None:
    file_questions = pd.DataFrame({"question_id": [1], "text": ["a"], "norm_key": ["a"]})
    corpus, copies = merge_model_questions(file_questions, pd.DataFrame({"text": ["b", "c"]}))
    assert copies == 0 and len(corpus) == 3


def test_parse_baselines() -> None:
    assert _parse_baselines(["bm25", " Jaccard", "", "bm25"]) == ["bm25", "jaccard"]
    assert _parse_baselines([""]) == []
    with pytest.raises(EvaluateFileError, match="unknown baseline"):
        _parse_baselines(["bm25", "untrained"])

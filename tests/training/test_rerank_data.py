"""Re-ranker groups: the paraphrase first, BM25 negatives of other clusters, and never a
validation or test question among a training group's negatives."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from qpr.training.rerank_data import GroupSpec, RerankGroups, rerank_groups

VERBS = ("install", "reset", "update", "clean", "sell", "paint")
OBJECTS = ("printer", "garden", "bicycle", "laptop")
TEMPLATES = ("how do i {v} my {o}", "what is the best way to {v} a {o}", "{o}: how to {v} it")


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, pairs = [], []
    for cid, (verb, obj) in enumerate(itertools.product(VERBS, OBJECTS)):
        split = ("train", "train", "val", "test")[cid % 4]
        ids = [cid * 10 + t for t in range(len(TEMPLATES))]
        for qid, template in zip(ids, TEMPLATES, strict=True):
            rows.append((qid, template.format(v=verb, o=obj), cid, split))
        pairs += [(ids[0], ids[1], cid, split), (ids[0], ids[2], cid, split)]
    rows.append((999, "how do i install a printer driver", -1, "none"))
    questions = pd.DataFrame(rows, columns=["question_id", "text", "cluster_id", "split"])
    return questions, pd.DataFrame(pairs, columns=["q1_id", "q2_id", "cluster_id", "split"])


def test_training_groups_hold_the_paraphrase_then_eligible_negatives() -> None:
    questions, pairs = _frames()
    groups = rerank_groups(questions, pairs, GroupSpec(negatives=3, window=5), log=lambda _: None)
    assert len(groups) == (pairs["split"] == "train").sum() and groups.group_size == 4
    info = questions.set_index("text")
    for query, candidates in zip(groups.queries, groups.candidates, strict=True):
        cluster = info.loc[query, "cluster_id"]
        assert info.loc[candidates[0], "cluster_id"] == cluster  # the paraphrase
        assert candidates[0] != query
        for negative in candidates[1:]:
            assert info.loc[negative, "cluster_id"] != cluster
            assert info.loc[negative, "split"] in ("train", "none")
    # both directions of a pair are learnt
    firsts = set(questions.loc[questions["question_id"].isin(pairs["q1_id"]), "text"])
    assert any(q not in firsts for q in groups.queries)


def test_validation_groups_and_max_pairs() -> None:
    questions, pairs = _frames()
    spec = GroupSpec(split="val", negatives=2, window=5, max_pairs=4, seed=3)
    groups = rerank_groups(questions, pairs, spec, log=lambda _: None)
    assert len(groups) == 4 and groups.group_size == 3
    assert rerank_groups(questions, pairs, spec, log=lambda _: None) == groups  # seeded
    with pytest.raises(ValueError, match="no dropped pairs"):
        rerank_groups(questions, pairs, GroupSpec(split="dropped"), log=lambda _: None)


def test_groups_need_equal_sizes() -> None:
    with pytest.raises(ValueError, match="as many candidates"):
        RerankGroups(["a", "b"], [["x", "y"], ["z"]])

"""Re-ranker groups: the paraphrase first, BM25 negatives of other clusters, and never a
validation or test question among a training group's negatives."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from qpr.training.rerank_data import GroupSpec, RerankGroups, rerank_groups, teacher_filtered

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


def _verb_teacher(texts: list[str]) -> np.ndarray:
    """A stand-in teacher: questions of one verb are paraphrases (cosine 1), others not (0)."""
    return np.array([[float(v in t.split()) for v in VERBS] for t in texts], np.float32)


def _verb(text: str) -> str:
    return next(v for v in VERBS if v in text.split())


def test_a_teacher_keeps_likely_paraphrases_out_of_the_negatives() -> None:
    questions, pairs = _frames()
    spec = GroupSpec(negatives=2, window=5)
    plain = rerank_groups(questions, pairs, spec, log=lambda _: None)
    # BM25 ranks questions sharing the query's verb first, so some are drawn unfiltered
    pairs_drawn = zip(plain.queries, plain.candidates, strict=True)
    assert any(_verb(n) == _verb(q) for q, c in pairs_drawn for n in c[1:])
    filtered = rerank_groups(
        questions,
        pairs,
        GroupSpec(negatives=2, window=5, max_teacher_cosine=0.5),
        vectors_of=_verb_teacher,
        log=lambda _: None,
    )
    assert filtered.queries == plain.queries
    for query, candidates in zip(filtered.queries, filtered.candidates, strict=True):
        assert all(_verb(n) != _verb(query) for n in candidates[1:]), (query, candidates)
    with pytest.raises(ValueError, match="needs the teacher"):
        rerank_groups(questions, pairs, GroupSpec(max_teacher_cosine=0.5), log=lambda _: None)


def test_teacher_filtered_empties_the_near_slots_only() -> None:
    texts = np.array(["install a", "install b", "sell c", "paint d"])
    candidates = np.array([[0, 2, -1], [3, 1, 2]])
    out, dropped = teacher_filtered(
        candidates, ["install x", "paint y"], texts, _verb_teacher, ceiling=0.5
    )
    np.testing.assert_array_equal(out, [[-1, 2, -1], [-1, 1, 2]])
    assert dropped == 2
    empty = np.full((2, 3), -1)
    assert teacher_filtered(empty, ["a", "b"], texts, _verb_teacher, 0.5)[1] == 0
    with pytest.raises(ValueError, match="need candidates"):
        teacher_filtered(candidates, ["one query"], texts, _verb_teacher, ceiling=0.5)

import numpy as np
import pandas as pd
import pytest

from qpr.data.clustering import (
    NO_CLUSTER,
    UnionFind,
    clusters_from_logs,
    clusters_from_pairs,
    coherence,
    components,
    stable_id,
)


def test_coherence_hand_computed():
    # T1 = {how, tall, is, it}, T2 = {how, high, is, it}; S = {how, tall, high, is, it}, |S| = 5
    # c = (4/5 + 4/5) / 2 = 0.8
    assert coherence(["How tall is it?", "how high is it"]) == pytest.approx(0.8)


def test_coherence_of_unrelated_questions_is_low():
    # Three questions with disjoint tokens: each T has 2 of |S| = 6 → c = 1/3.
    assert coherence(["red apple", "blue sky", "green grass"]) == pytest.approx(2 / 6)
    # Identical questions: c = 1.
    assert coherence(["what time is it", "What time is it?"]) == pytest.approx(1.0)
    assert coherence([]) == 0.0


def test_union_find_chains_pairs_transitively():
    sets = UnionFind()
    for a, b in [(1, 2), (3, 4), (2, 3), (10, 11)]:
        sets.union(a, b)
    assert sets.find(1) == sets.find(4)
    assert sets.find(10) != sets.find(1)
    groups = sorted(sets.groups().values())
    assert groups == [[1, 2, 3, 4], [10, 11]]


def test_components_label_is_smallest_member():
    assert components([(5, 3), (3, 9)], items=[7]) == {3: 3, 5: 3, 9: 3, 7: 7}


def test_stable_id_is_stable_and_63_bit():
    assert stable_id("how tall is the eiffel tower") == stable_id("how tall is the eiffel tower")
    assert stable_id("a") != stable_id("b")
    assert 0 <= stable_id("anything") < 2**63


def test_clusters_from_pairs_closure_and_distractors():
    pairs = pd.DataFrame(
        {
            "id": [0, 1, 2, 3],
            "qid1": [1, 2, 5, 7],
            "qid2": [2, 3, 6, 8],
            "question1": ["a b", "b c", "x y", "lonely one"],
            "question2": ["b c", "c d", "y z", "lonely two"],
            "is_duplicate": [1, 1, 1, 0],
        }
    )
    questions, clusters, counts = clusters_from_pairs(pairs)
    cluster_of = dict(zip(questions["question_id"], questions["cluster_id"], strict=True))
    assert cluster_of[1] == cluster_of[2] == cluster_of[3]
    assert cluster_of[5] == cluster_of[6] != cluster_of[1]
    # 7 and 8 occur only in a non-duplicate pair: in the index, in no cluster.
    assert cluster_of[7] == cluster_of[8] == NO_CLUSTER
    assert len(questions) == 7 and counts["questions"] == 7
    assert sorted(clusters["size"]) == [2, 3]


def test_clusters_from_logs_majority_answer_and_surface_form():
    logs = pd.DataFrame(
        {
            "question": ["What time is it", "what time is it", "what time is it", "hi there"],
            "answer_id": ["ans-time", "ans-time", "ans-date", "ans-greet"],
        }
    )
    questions, clusters, counts = clusters_from_logs(logs)
    assert len(questions) == 2
    row = questions.set_index("norm_key").loc["what time is it"]
    assert row["text"] == "what time is it"  # the most frequent logged form
    assert counts["questions_multi_answer"] == 1
    time_cluster = clusters.set_index("source_key").loc["ans-time", "cluster_id"]
    assert row["cluster_id"] == time_cluster
    assert questions["question_id"].dtype == np.int64


def test_metadata_fields_take_each_questions_majority_value():
    from qpr.data.loaders import DataFormatError

    logs = pd.DataFrame(
        {
            "question": ["Reset my router", "reset my router?", "reset my router", "bake bread",
                         "bake bread", "fix the sink"],
            "answer_id": ["a", "a", "a", "b", "b", "c"],
            "locale": ["de", "en", "en", "fr", "de", None],
        }
    )  # fmt: skip
    questions, _, _ = clusters_from_logs(logs, ["locale"])
    locale = dict(zip(questions["text"], questions["locale"], strict=True))
    # 2 of 3 rows say en; a tie goes to the smaller value; never logged with one: None
    assert locale == {"Reset my router": "en", "bake bread": "de", "fix the sink": None}
    assert "locale" not in clusters_from_logs(logs)[0].columns
    with pytest.raises(DataFormatError, match="tenant"):
        clusters_from_logs(logs, ["tenant"])

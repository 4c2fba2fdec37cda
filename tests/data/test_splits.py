import pandas as pd
import pytest

from qpr.data.splits import (
    NO_SPLIT,
    TooFewClusters,
    apply_splits,
    assign_splits,
    filter_clusters,
    min_clusters,
    positive_pairs,
    require_enough_clusters,
    shrink_small_clusters,
    splits_fit,
)

RATIOS = {"train": 0.8, "val": 0.1, "test": 0.1}


def _clusters(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "cluster_id": range(n),
            "source_key": [f"c{i}" for i in range(n)],
            "size": [3] * n,
            "coherence": [0.5] * n,
        }
    )


def test_filter_marks_reasons():
    frame = pd.DataFrame(
        {"cluster_id": [1, 2, 3], "size": [5, 1, 4], "coherence": [0.4, 0.9, 0.05]}
    )
    out = filter_clusters(frame, coherence_threshold=0.1, min_size=2)
    assert out["kept"].tolist() == [True, False, False]
    assert out["drop_reason"].tolist() == ["", "too_small", "incoherent"]


def test_assign_splits_ratios_and_determinism():
    clusters = filter_clusters(_clusters(1000), coherence_threshold=0.1, min_size=2)
    first = assign_splits(clusters, RATIOS, seed=3)
    again = assign_splits(clusters.sample(frac=1, random_state=1), RATIOS, seed=3)
    assert first["split"].value_counts().to_dict() == {"train": 800, "val": 100, "test": 100}
    assert first.set_index("cluster_id")["split"].equals(again.set_index("cluster_id")["split"])
    other = assign_splits(clusters, RATIOS, seed=4)
    assert not first["split"].equals(other["split"])


def test_leakage_filter_removes_val_test_questions_seen_in_train():
    clusters = pd.DataFrame({"cluster_id": [1, 2], "split": ["train", "test"], "kept": True})
    questions = pd.DataFrame(
        {
            "question_id": [10, 11, 20, 21, 22],
            "text": ["a", "b", "A", "c", "d"],
            "norm_key": ["a", "b", "a", "c", "d"],
            "cluster_id": [1, 1, 2, 2, 2],
        }
    )
    out, removed = apply_splits(questions, clusters)
    assert removed == 1
    split = dict(zip(out["question_id"], out["split"], strict=True))
    assert split == {10: "train", 11: "train", 20: NO_SPLIT, 21: "test", 22: "test"}
    train_keys = set(out.loc[out["split"] == "train", "norm_key"])
    evaluated = out.loc[out["split"].isin(["val", "test"]), "norm_key"]
    assert not train_keys & set(evaluated)


def test_cluster_left_with_one_question_is_dropped():
    clusters = pd.DataFrame(
        {"cluster_id": [1, 2], "split": ["train", "val"], "kept": True, "drop_reason": ""}
    )
    questions = pd.DataFrame(
        {
            "question_id": [1, 2, 3, 4],
            "norm_key": ["a", "b", "a", "z"],
            "text": ["a", "b", "a", "z"],
            "cluster_id": [1, 1, 2, 2],
        }
    )
    questions, removed = apply_splits(questions, clusters)
    questions, clusters, shrunk = shrink_small_clusters(questions, clusters, min_size=2)
    assert (removed, shrunk) == (1, 1)
    assert clusters.set_index("cluster_id").loc[2, "drop_reason"] == "too_small_after_leakage"
    assert set(questions.loc[questions["cluster_id"] == 2, "split"]) == {NO_SPLIT}


@pytest.mark.parametrize("cap", [1, 3, 100])
def test_positive_pairs_canonical_capped_and_within_cluster(cap):
    questions = pd.DataFrame(
        {
            "question_id": [5, 3, 9, 1, 2, 7],
            "cluster_id": [1, 1, 1, 2, 2, 3],
            "split": ["train", "train", "train", "val", "val", NO_SPLIT],
        }
    )
    pairs = positive_pairs(questions, max_per_cluster=cap, seed=0)
    assert (pairs["q1_id"] < pairs["q2_id"]).all()
    assert pairs.groupby("cluster_id").size().max() <= cap
    assert 3 not in set(pairs["cluster_id"])  # questions in no split make no pairs
    if cap >= 3:
        assert len(pairs) == 3 + 1
    assert set(pairs.loc[pairs["cluster_id"] == 2, "split"]) == {"val"}


def test_min_clusters_is_the_count_from_which_every_split_fits():
    fitting = [n for n in range(1, 40) if splits_fit(n, RATIOS, 0.05)]
    # 8 clusters cut 6/1/1: train's share 0.75 is a hair over 0.05 from 0.8 in floats
    assert fitting[:5] == [9, 10, 11, 12, 14] and 13 not in fitting
    assert min_clusters(RATIOS, 0.05) == 14
    assert min_clusters({"train": 1.0, "val": 0.0, "test": 0.0}, 0.05) == 1
    # what assign_splits does with that many: every split has a cluster
    frame = filter_clusters(_clusters(14), coherence_threshold=0.1, min_size=2)
    assert set(assign_splits(frame, RATIOS, seed=0)["split"]) == set(RATIOS)


def test_too_few_clusters_say_what_is_missing_in_one_line():
    frame = filter_clusters(_clusters(10), coherence_threshold=0.1, min_size=2)
    frame.loc[frame.index[:2], "kept"] = False  # 8 kept, 24 questions
    with pytest.raises(TooFewClusters) as raised:
        require_enough_clusters(frame, RATIOS, tolerance=0.05, min_size=2, source="my-logs")
    message = str(raised.value)
    assert message.startswith("too little data to train on: my-logs holds 24 questions in 8")
    assert "80/10/10" in message and "at least 14 clusters of 2+ questions" in message
    assert "\n" not in message
    assert isinstance(raised.value, ValueError)
    kept = filter_clusters(_clusters(14), coherence_threshold=0.1, min_size=2)
    require_enough_clusters(kept, RATIOS, tolerance=0.05, min_size=2, source="my-logs")

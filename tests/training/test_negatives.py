"""Hard-negative mining (qpr.training.negatives) on hand-placed points."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.training.negatives import MiningConfig, mine_hard_negatives

# Points on a line, x = row index: the nearest rows of row r are r ± 1, r ± 2, ...
VECTORS = np.arange(8, dtype=np.float32).reshape(-1, 1)
CLUSTERS = np.array([0, 0, 1, 2, 3, 4, 5, 6])
EVERY = np.ones(8, dtype=bool)


def test_nearest_question_of_another_cluster() -> None:
    # Row 0's cluster holds rows 0 and 1: its nearest other-cluster row is 2.
    picked = mine_hard_negatives(
        VECTORS, np.array([0, 1, 5]), CLUSTERS, EVERY, MiningConfig(window=1)
    )
    assert picked.dtype == np.int64
    # Row 5: rows 4 and 6 tie at distance 1; topk breaks the tie by index.
    assert picked[0] == 2 and picked[1] == 2 and picked[2] in (4, 6)


def test_ineligible_rows_are_never_picked() -> None:
    eligible = EVERY.copy()
    eligible[2] = False
    picked = mine_hard_negatives(VECTORS, np.array([0]), CLUSTERS, eligible, MiningConfig(window=1))
    assert picked[0] == 3


def test_skip_and_window_bound_the_rank() -> None:
    # Row 0's other-cluster rows by distance: 2, 3, 4, 5, 6, 7 (ranks 1..6).
    anchors = np.zeros(200, dtype=np.int64)
    picked = mine_hard_negatives(
        VECTORS, anchors, CLUSTERS, EVERY, MiningConfig(skip=1, window=3, seed=5)
    )
    assert set(picked.tolist()) == {3, 4, 5}
    again = mine_hard_negatives(
        VECTORS, anchors, CLUSTERS, EVERY, MiningConfig(skip=1, window=3, seed=5)
    )
    assert np.array_equal(picked, again)
    other = mine_hard_negatives(
        VECTORS, anchors, CLUSTERS, EVERY, MiningConfig(skip=1, window=3, seed=6)
    )
    assert not np.array_equal(picked, other)
    # A window past the last candidate picks among those that exist.
    eligible = np.array([True, True, True, True, False, False, False, False])
    picked = mine_hard_negatives(VECTORS, anchors[:50], CLUSTERS, eligible, MiningConfig(window=5))
    assert set(picked.tolist()) <= {2, 3}


def test_bad_inputs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="skip"):
        mine_hard_negatives(VECTORS, np.array([0]), CLUSTERS, EVERY, MiningConfig(window=0))
    with pytest.raises(ValueError, match="anchors"):
        mine_hard_negatives(VECTORS, np.array([8]), CLUSTERS, EVERY)
    with pytest.raises(ValueError, match="eligible"):
        mine_hard_negatives(VECTORS, np.array([0]), CLUSTERS, EVERY[:3])
    with pytest.raises(ValueError, match="cluster_ids"):
        mine_hard_negatives(VECTORS, np.array([0]), CLUSTERS[:3], EVERY)
    lonely = np.zeros(8, dtype=np.int64)  # one cluster: no negative anywhere
    with pytest.raises(ValueError, match="another cluster"):
        mine_hard_negatives(VECTORS, np.array([0]), lonely, EVERY, MiningConfig(window=2))


def test_lexical_negatives_come_from_the_retrieved_window_of_other_clusters() -> None:
    from qpr.training.negatives import lexical_negatives

    cluster_ids = np.array([0, 0, 1, 2, 3, -1, 4, 5, 6, 7])
    eligible = np.array([True, True, True, False, True, True, True, True, True, True])
    # anchor 0 (cluster 0): row 1 shares its cluster, row 3 is a validation question
    candidates = np.array([[1, 3, 2, 5, 4, 6, -1, -1], [0, 2, 4, -1, -1, -1, -1, -1]])
    for seed in range(20):
        rows = lexical_negatives(
            candidates,
            np.array([0, 1]),
            cluster_ids,
            eligible,
            count=2,
            window=3,
            seed=seed,
        )
        assert rows.shape == (2, 2) and rows.dtype == np.int64
        assert set(rows[0]) <= {2, 5, 4}  # the first 3 usable ranks: not 1 (cluster), not 3
        assert len(set(rows[0])) == 2
        assert set(rows[1]) <= {0, 4} and len(set(rows[1])) == 2  # 2 is anchor 1's cluster


def test_lexical_negatives_fill_from_random_rows_when_too_few_are_retrieved() -> None:
    from qpr.training.negatives import lexical_negatives

    cluster_ids = np.arange(6)
    eligible = np.array([True, True, True, True, False, True])
    rows = lexical_negatives(
        np.array([[1, -1, -1]]), np.array([0]), cluster_ids, eligible, count=3, window=5, seed=0
    )
    assert rows[0, 0] == 1 and len(set(rows[0])) == 3
    assert not {0, 4} & set(rows[0].tolist())  # never the anchor's cluster, never ineligible
    with pytest.raises(ValueError, match="too few"):
        lexical_negatives(
            np.array([[-1]]), np.array([0]), cluster_ids, eligible, count=5, window=5, seed=0
        )

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

"""Pure helpers: row cosines (qpr.retrieval.encoders; the int8 query encoder's gate and the
student's probe) and the self-retrieval check with query vectors of their own
(qpr.retrieval.dense)."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.retrieval.dense import IndexConfig, build_index, self_check_rows, self_retrieval_rate
from qpr.retrieval.encoders import row_cosines


def test_row_cosines_hand_computed() -> None:
    reference = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 1.0], [0.0, 0.0]])
    approx = np.array([[2.0, 0.0], [4.0, 3.0], [-1.0, -1.0], [1.0, 0.0]])
    # (3·4 + 4·3) / (5·5) = 24/25; a zero row points nowhere: 0
    np.testing.assert_allclose(row_cosines(reference, approx), [1.0, 0.96, -1.0, 0.0])


def test_row_cosines_needs_two_arrays_of_one_shape() -> None:
    with pytest.raises(ValueError, match="one shape"):
        row_cosines(np.ones((3, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="one shape"):
        row_cosines(np.ones(3), np.ones(3))


def _flat(vectors: np.ndarray):
    config = IndexConfig("Flat", nprobe=1, use_gpu=False)
    return build_index(vectors, config, seed=0, log=lambda _: None)


def test_self_check_rows_are_the_rows_self_retrieval_samples() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    index = _flat(vectors)
    rows = self_check_rows(50, 10, seed=3)
    assert rows.shape == (10,) and (np.diff(rows) > 0).all()
    assert self_check_rows(50, 80, seed=3).tolist() == list(range(50))  # all, once each
    # the sampled rows' own vectors passed as queries: the stored-vector check, exactly
    assert self_retrieval_rate(index, vectors, 10, 3, queries=vectors[rows]) == 1.0
    # queries near their rows still find them; queries of other rows do not
    near = vectors[rows] + np.float32(1e-3)
    assert self_retrieval_rate(index, vectors, 10, 3, queries=near) == 1.0
    others = vectors[(rows + 1) % 50]
    assert self_retrieval_rate(index, vectors, 10, 3, queries=others) == 0.0


def test_self_retrieval_refuses_queries_of_another_count() -> None:
    vectors = np.eye(6, dtype=np.float32)
    with pytest.raises(ValueError, match="4 sampled rows but 3 query vectors"):
        self_retrieval_rate(_flat(vectors), vectors, 4, 0, queries=vectors[:3])
    with pytest.raises(ValueError, match="sample >= 1"):
        self_check_rows(6, 0, seed=0)

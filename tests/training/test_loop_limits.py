"""train_encoder's max_pairs (a seeded subset) and time_budget_s (a cut, then a clean end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qpr.model import CNNEncoder
from qpr.model.losses import build_loss
from qpr.training.checkpoint import TrainingStateError, load_checkpoint, seed_everything
from qpr.training.loop import TrainResult
from qpr.training.pairs import num_training_classes, select_training_pairs
from tests.paraphrases import train_tiny
from tests.training.kills import Killed, kill_after

# Far below one batch's time: the first epoch is cut after its first batch.
TINY_BUDGET_S = 1e-6


def _train(data, out_dir: Path, **kwargs: Any) -> TrainResult:
    seed_everything(0)
    return train_tiny(
        data,
        out_dir,
        encoder=CNNEncoder(data.vocab.size, embedding_dim=32, channels=32, output_dim=32),
        loss=build_loss("sdml"),
        **{"max_epochs": 3, **kwargs},
    )


def _metrics(history: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["epoch"], r["train_loss"], r["val_auc"], r["batches"]) for r in history]


# -- max_pairs -------------------------------------------------------------------------------


def test_pair_subset_is_seeded_sized_and_nested() -> None:
    a = select_training_pairs(1000, 100, seed=3)
    assert a.shape == (100,) and a.dtype == np.int64
    assert np.array_equal(a, np.unique(a)) and a.min() >= 0 and a.max() < 1000
    assert np.array_equal(a, select_training_pairs(1000, 100, seed=3))
    assert not np.array_equal(a, select_training_pairs(1000, 100, seed=4))
    # Larger subsets of one seed contain the smaller ones (learning curves stay comparable).
    assert np.isin(a, select_training_pairs(1000, 400, seed=3)).all()
    assert np.array_equal(select_training_pairs(50, None, seed=3), np.arange(50))
    assert np.array_equal(select_training_pairs(50, 80, seed=3), np.arange(50))
    with pytest.raises(ValueError, match="max_pairs"):
        select_training_pairs(50, 0, seed=3)
    clusters = np.repeat(np.arange(100), 10)
    subset = select_training_pairs(1000, 100, seed=3)
    assert num_training_classes(clusters, max_pairs=100, seed=3) == np.unique(clusters[subset]).size


def test_training_on_max_pairs_is_deterministic(tiny_paraphrases, tmp_path: Path) -> None:
    data = tiny_paraphrases
    first = _train(data, tmp_path / "a", max_pairs=64, max_epochs=2)
    second = _train(data, tmp_path / "b", max_pairs=64, max_epochs=2)
    assert first.counts["train_pairs"] == 64 and first.counts["train_classes"] <= 48
    # 64 pairs in batches of up to 32: every epoch sees exactly the subset.
    assert [r["pairs"] for r in first.history] == [64, 64]
    assert _metrics(first.history) == _metrics(second.history)
    a = load_checkpoint(first.last_checkpoint)
    b = load_checkpoint(second.last_checkpoint)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["fingerprint"]["max_pairs"] == 64
    # Another subset size is another run: refused, not continued.
    with pytest.raises(TrainingStateError, match="max_pairs"):
        _train(data, tmp_path / "a", max_pairs=65, max_epochs=2)
    with pytest.raises(TrainingStateError, match="max_pairs"):
        _train(data, tmp_path / "a", max_epochs=2)


# -- time_budget_s -----------------------------------------------------------------------------


def test_budget_cuts_the_epoch_and_resume_does_not_run_past_it(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    seen: list[dict[str, Any]] = []
    cut = _train(data, tmp_path, max_epochs=5, time_budget_s=TINY_BUDGET_S, on_epoch=seen.append)

    assert cut.stopped_by_budget and not cut.stopped_early
    assert cut.last_epoch == 1 and len(cut.history) == 1 and len(seen) == 1
    record = cut.history[0]
    assert record["cut_by_budget"] and record["batches"] == 1 < record["planned_batches"]
    assert record["pairs"] < cut.counts["train_pairs"]
    # The cut epoch was validated and saved like any other.
    assert np.isfinite(record["val_auc"]) and cut.best_epoch == 1
    last = load_checkpoint(cut.last_checkpoint)
    assert last["epoch"] == 1 and last["fingerprint"]["time_budget_s"] == TINY_BUDGET_S
    assert load_checkpoint(cut.best_checkpoint)["epoch"] == 1

    # Run again with the same settings: the budget is spent, nothing more is trained.
    again = _train(data, tmp_path, max_epochs=5, time_budget_s=TINY_BUDGET_S)
    assert again.resumed_from_epoch == 1 and again.stopped_by_budget
    assert again.history == cut.history
    # A different budget (or none) does not continue a cut epoch; it must start over.
    with pytest.raises(TrainingStateError, match="time_budget_s"):
        _train(data, tmp_path, max_epochs=5)
    fresh = _train(data, tmp_path, max_epochs=2, time_budget_s=3600.0, resume=False)
    assert not fresh.stopped_by_budget and fresh.last_epoch == 2
    assert not any(r["cut_by_budget"] for r in fresh.history)


def test_generous_budget_changes_nothing_and_survives_a_kill(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    plain = _train(data, tmp_path / "plain", max_epochs=3)
    straight = _train(data, tmp_path / "straight", max_epochs=3, time_budget_s=3600.0)
    assert not straight.stopped_by_budget
    assert _metrics(straight.history) == _metrics(plain.history)

    with pytest.raises(Killed):
        _train(
            data,
            tmp_path / "resumed",
            max_epochs=3,
            time_budget_s=3600.0,
            on_epoch=kill_after(1),
        )
    resumed = _train(data, tmp_path / "resumed", max_epochs=3, time_budget_s=3600.0)
    assert resumed.resumed_from_epoch == 1 and not resumed.stopped_by_budget
    assert _metrics(resumed.history) == _metrics(straight.history)


# -- progress inside an epoch ------------------------------------------------------------------


def test_progress_reports_inside_the_epoch_and_match_its_history(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    reports: list[dict[str, Any]] = []
    run = _train(
        data,
        tmp_path / "every",
        max_epochs=1,
        time_budget_s=3600.0,
        on_progress=reports.append,
        progress_every_s=0.0,
    )
    record = run.history[0]
    # Every batch reported once, in order, the last with the epoch's own totals.
    assert [r["batches"] for r in reports] == list(range(1, record["batches"] + 1))
    assert {r["epoch"] for r in reports} == {1}
    assert {r["planned_batches"] for r in reports} == {record["planned_batches"]}
    assert reports[-1]["pairs"] == record["pairs"]
    assert reports[-1]["train_loss"] == pytest.approx(record["train_loss"])
    budget_left = [r["budget_left_s"] for r in reports]
    assert all(0.0 < left < 3600.0 for left in budget_left)
    assert budget_left == sorted(budget_left, reverse=True)

    # Unbudgeted: no budget figure; a long interval: no report in a run this short.
    unbudgeted: list[dict[str, Any]] = []
    _train(
        data,
        tmp_path / "plain",
        max_epochs=1,
        on_progress=unbudgeted.append,
        progress_every_s=0.0,
    )
    assert unbudgeted and all(r["budget_left_s"] is None for r in unbudgeted)
    quiet: list[dict[str, Any]] = []
    _train(data, tmp_path / "quiet", max_epochs=1, on_progress=quiet.append)
    assert quiet == []

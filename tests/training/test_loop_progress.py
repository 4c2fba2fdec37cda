"""The train stage's in-epoch log line (qpr.training.loop.progress_line)."""

from __future__ import annotations

from qpr.training.loop import progress_line


def test_progress_line_with_and_without_a_budget() -> None:
    record = {
        "epoch": 2,
        "batches": 1234,
        "planned_batches": 9380,
        "pairs": 78976,
        "train_loss": 0.269831,
        "pairs_per_s": 20.49,
        "seconds": 3854.2,
        "budget_left_s": 1234.6,
    }
    assert progress_line(record) == (
        "epoch 2: 1,234 / 9,380 batches, loss 0.2698, 20 pairs/s, 1,235 s of the budget left"
    )
    assert progress_line({**record, "budget_left_s": None}) == (
        "epoch 2: 1,234 / 9,380 batches, loss 0.2698, 20 pairs/s"
    )

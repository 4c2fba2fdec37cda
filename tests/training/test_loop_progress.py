"""The stages' log lines of the one loop (qpr.training.loop.progress_line, epoch_line)."""

from __future__ import annotations

from qpr.training.loop import epoch_line, progress_line


def test_progress_line_with_and_without_a_budget() -> None:
    record = {
        "epoch": 2,
        "batches": 1234,
        "planned_batches": 9380,
        "unit": "pairs",
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
    student = {**record, "unit": "questions", "questions_per_s": 812.4, "budget_left_s": None}
    assert progress_line(student) == (
        "epoch 2: 1,234 / 9,380 batches, loss 0.2698, 812 questions/s"
    )


def test_epoch_line_names_every_validation_measure() -> None:
    record = {"epoch": 3, "train_loss": 0.5, "val_mrr": 0.81234, "val_cosine": 0.9, "pairs": 9}
    record["questions_per_s"] = 1234.5
    assert epoch_line(record, "questions") == (
        "epoch 3: loss 0.5000, val_mrr 0.8123, val_cosine 0.9000, 1234 questions/s"
    )

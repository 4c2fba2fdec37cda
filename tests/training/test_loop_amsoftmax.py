"""AM-Softmax trains the CNN on the tiny paraphrase set: cluster labels reach the loss, its
class vectors are checkpointed with it, and paraphrases end up closer than non-paraphrases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qpr.model import CNNEncoder
from qpr.model.losses import build_loss
from qpr.training.checkpoint import load_checkpoint, load_encoder, seed_everything
from qpr.training.embed import encode_texts
from qpr.training.loop import TrainResult
from qpr.training.pairs import num_training_classes
from tests.paraphrases import train_tiny
from tests.training.kills import Killed, kill_after

MAX_LEN = 16
DIM = 32


def _train(data, out_dir: Path, *, num_classes: int | None = None, **kwargs: Any) -> TrainResult:
    seed_everything(0)
    encoder = CNNEncoder(
        data.vocab.size, embedding_dim=DIM, channels=DIM, output_dim=DIM, normalize=True
    )
    if num_classes is None:
        num_classes = num_training_classes(
            data.train_clusters, max_pairs=kwargs.get("max_pairs"), seed=0
        )
    # The paper's m and s; the class vectors get their own seeded initial values too.
    loss = build_loss("amsoftmax", num_classes=num_classes, dim=DIM, margin=0.35, scale=30.0)
    return train_tiny(
        data,
        out_dir,
        encoder=encoder,
        loss=loss,
        **{"max_len": MAX_LEN, "max_epochs": 10, "patience": 20, **kwargs},
    )


def test_amsoftmax_training_separates_paraphrases(tiny_paraphrases, tmp_path: Path) -> None:
    data = tiny_paraphrases
    result = _train(data, tmp_path)

    assert result.counts == {"train_pairs": len(data.train_q1), "train_classes": 48}
    assert all(np.isfinite(r["train_loss"]) for r in result.history)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.best["val_mrr"] > result.initial["val_mrr"] + 0.5
    assert result.best["val_auc"] > 0.95

    # Validation clusters are unseen in training: the encoder, not the classifier, learned.
    best = load_encoder(result.best_checkpoint)
    emb = encode_texts(best, data.vocab, data.val.texts, max_len=MAX_LEN)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    pos, neg = data.val.positive_pairs, data.val.negative_pairs
    d_pos = ((emb[pos[:, 0]] - emb[pos[:, 1]]) ** 2).sum(axis=1)
    d_neg = ((emb[neg[:, 0]] - emb[neg[:, 1]]) ** 2).sum(axis=1)
    assert d_pos.mean() < 0.5 * d_neg.mean()

    # The class vectors are state of the run: in last.pt with the encoder.
    last = load_checkpoint(result.last_checkpoint)
    assert last["step"]["weight"].shape == (48, DIM)
    assert "AMSoftmaxLoss(num_classes=48" in last["fingerprint"]["loss"]


def test_killed_amsoftmax_run_resumes_to_the_same_weights(tiny_paraphrases, tmp_path: Path) -> None:
    data = tiny_paraphrases
    straight = _train(data, tmp_path / "straight", max_epochs=3)

    with pytest.raises(Killed):
        _train(data, tmp_path / "resumed", max_epochs=3, on_epoch=kill_after(1))
    # A fresh loss has fresh class vectors; resume must bring back the trained ones.
    resumed = _train(data, tmp_path / "resumed", max_epochs=3)
    assert resumed.resumed_from_epoch == 1
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in straight.history]
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["step"]["weight"], b["step"]["weight"])


def test_loss_with_the_wrong_class_count_is_refused(tiny_paraphrases, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="48 distinct clusters"):
        _train(tiny_paraphrases, tmp_path, num_classes=60)
    # With max_pairs the classes are those of the subset.
    subset = num_training_classes(tiny_paraphrases.train_clusters, max_pairs=40, seed=0)
    assert subset < 48
    result = _train(tiny_paraphrases, tmp_path / "subset", max_pairs=40, max_epochs=1)
    assert (result.counts["train_pairs"], result.counts["train_classes"]) == (40, subset)

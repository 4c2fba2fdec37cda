"""Checkpoints load with weights_only=True: a file that carries pickled code is refused by
every loader (training state, the stage's encoder.pt, a resumed run of any family)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from qpr.training.checkpoint import (
    CHECKPOINT_VERSION,
    TrainingStateError,
    check_resumable,
    load_checkpoint,
    save_checkpoint,
)


class _Payload:
    """What an attacker's checkpoint would carry: an object whose unpickling runs code."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


@pytest.fixture
def poisoned(tmp_path: Path) -> Path:
    path = tmp_path / "poisoned.pt"
    torch.save({"model": {}, "hook": _Payload(), "run_key": "x"}, path)
    return path


def test_plain_state_round_trips(tmp_path: Path) -> None:
    state = {"epoch": 2, "model": {"w": torch.ones(2)}, "metrics": {"loss": 0.5}, "tag": "a"}
    loaded = load_checkpoint(save_checkpoint(tmp_path / "last.pt", state))
    assert loaded["epoch"] == 2 and loaded["tag"] == "a"
    assert torch.equal(loaded["model"]["w"], torch.ones(2))


def test_a_pickled_callable_is_refused_by_load_checkpoint(poisoned: Path) -> None:
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(poisoned)


def test_a_pickled_callable_is_refused_by_the_stage_loader(poisoned: Path) -> None:
    from qpr.pipeline.handoff import load_trained_encoder

    with pytest.raises(pickle.UnpicklingError):
        load_trained_encoder(poisoned)


def test_a_pickled_callable_is_refused_by_a_resumed_run(
    poisoned: Path, tmp_path: Path, tiny_paraphrases
) -> None:
    """The one loop resumes every family from last.pt through load_checkpoint."""
    from qpr.model import CNNEncoder
    from qpr.model.losses import build_loss
    from tests.paraphrases import train_tiny

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    poisoned.rename(tmp_path / "run" / "checkpoints" / "last.pt")
    encoder = CNNEncoder(tiny_paraphrases.vocab.size, embedding_dim=8, channels=8, output_dim=8)
    with pytest.raises(pickle.UnpicklingError):
        train_tiny(tiny_paraphrases, tmp_path / "run", encoder=encoder, loss=build_loss("sdml"))


def test_a_checkpoint_of_other_settings_names_them_without_developer_advice(tmp_path):
    state = {"version": CHECKPOINT_VERSION, "fingerprint": {"lr": 0.001, "seed": 13}}
    check_resumable(tmp_path / "last.pt", state, {"lr": 0.001, "seed": 13})
    with pytest.raises(TrainingStateError) as refused:
        check_resumable(tmp_path / "last.pt", state, {"lr": 0.01, "seed": 13, "data": "x"})
    assert (
        str(refused.value)
        == f"{tmp_path / 'last.pt'} was written by a run with other settings: data, lr"
    )

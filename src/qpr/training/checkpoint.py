"""Checkpoints and random state: what lets a killed run resume to the same weights.

The one loop (qpr.training.loop) writes them for every model family:

- last.pt: model, optimizer, the family's own state, epoch, RNG states, history,
  early-stopping state, the run's config and its fingerprint; written after every epoch.
- best.pt: model and validation measures of the best epoch so far, the model's
  architecture and what the family adds (no optimizer: it is what gets exported).

Both go through qpr.io.write_atomic (a synced temp file renamed over the old one), best.pt
before last.pt, so a kill at any moment leaves a loadable and consistent pair.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qpr.errors import QPRError
from qpr.io import write_atomic
from qpr.model.factory import build_encoder

# 2: the data, teacher and negatives digests are qpr.io's (version 1's were hashlib's own).
# 3: one loop for every family; last.pt's "step" holds the family's state (2's "loss").
CHECKPOINT_VERSION = 3


class TrainingStateError(QPRError, RuntimeError):
    """last.pt belongs to a run with different settings; refuse to mix the two."""


def seed_everything(seed: int) -> None:
    """Seed python's random, numpy's global RNG and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The torch / numpy / random global states, as plain types a checkpoint can hold."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        # Plain lists: torch.load(weights_only=True) refuses numpy arrays.
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() saved."""
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np.asarray(np_state["key"], dtype=np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """torch.save `state` to `path` atomically (qpr.io.write_atomic)."""
    return write_atomic(path, partial(torch.save, state))


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load last.pt / best.pt safely (weights_only: plain types and tensors, no pickled code)."""
    return torch.load(Path(path), map_location="cpu", weights_only=True)


def load_encoder(path: str | os.PathLike[str]) -> nn.Module:
    """Rebuild the encoder stored in a checkpoint (eval mode), e.g. best.pt for export."""
    ckpt = load_checkpoint(path)
    encoder = build_encoder(ckpt["encoder"]["name"], **ckpt["encoder"]["config"])
    encoder.load_state_dict(ckpt["model"])
    return encoder.eval()


def encoder_info(encoder: nn.Module) -> dict[str, Any]:
    """{"name", "config"}: what build_encoder needs to rebuild this encoder."""
    info: dict[str, Any] = {"name": getattr(encoder, "name", type(encoder).__name__)}
    info["config"] = encoder.config() if hasattr(encoder, "config") else {}
    return info


def check_resumable(path: Path, state: dict[str, Any], fingerprint: dict[str, Any]) -> None:
    """Raise TrainingStateError unless last.pt's `state` was written by this code's format
    and a run with this fingerprint."""
    if state.get("version") != CHECKPOINT_VERSION:
        raise TrainingStateError(
            f"{path}: checkpoint version {state.get('version')}, this code writes "
            f"{CHECKPOINT_VERSION}"
        )
    if state["fingerprint"] != fingerprint:
        changed = sorted(
            k
            for k in {*fingerprint, *state["fingerprint"]}
            if state["fingerprint"].get(k) != fingerprint.get(k)
        )
        # Callers train afresh on it (qpr.training.loop.train_or_restart): no advice to give.
        raise TrainingStateError(
            f"{path} was written by a run with other settings: {', '.join(changed)}"
        )


def save_best(
    path: Path,
    epoch: int,
    model: nn.Module,
    metrics: Mapping[str, float],
    extras: Mapping[str, Any] | None = None,
) -> None:
    """best.pt: the epoch's weights and validation `metrics`, the model's architecture
    (encoder_info) and `extras` (the encoder's: the tokenizer's checksum and max_len)."""
    save_checkpoint(
        path,
        {
            "version": CHECKPOINT_VERSION,
            "epoch": epoch,
            "encoder": encoder_info(model),
            "model": model.state_dict(),
            "metrics": dict(metrics),
            **(extras or {}),
        },
    )

"""What one stage reads of another's outputs, in one place: a stage imports this module,
never another stage. Each reader fails with MissingInputError naming the stage to run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from qpr.errors import QPRError
from qpr.paths import ProjectPaths


class MissingInputError(QPRError, FileNotFoundError):
    """A stage's input does not exist yet: an earlier stage has not run."""


def read_cluster_outputs(paths: ProjectPaths) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(questions, pairs) written by the cluster stage."""
    questions_file = paths.cluster_dir / "questions.parquet"
    pairs_file = paths.cluster_dir / "pairs.parquet"
    for file in (questions_file, pairs_file):
        if not file.is_file():
            raise MissingInputError(f"{file} not found: run the cluster stage first")
    return pd.read_parquet(questions_file), pd.read_parquet(pairs_file)


def load_trained_encoder(checkpoint: Path):
    """models/encoder.pt → (encoder in eval mode, max_len)."""
    import torch

    from qpr.model import build_encoder

    if not checkpoint.is_file():
        raise MissingInputError(f"{checkpoint} not found: run the train stage first")
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    encoder = build_encoder(state["encoder"]["name"], **state["encoder"]["config"])
    encoder.load_state_dict(state["model"])
    return encoder.eval(), int(state["max_len"])

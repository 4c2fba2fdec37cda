"""Fixtures for the deltas tests: the bundle of factories.py, built once, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qpr.artifacts import ENCODER_FILE, VOCAB_FILE
from qpr.text.vocab import Vocabulary

from .factories import ALL, MAIN, MAIN_IDS, MAX_LEN, search_config, write_index


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from qpr.model import CNNEncoder
    from qpr.model.onnx import export_onnx

    models = tmp_path_factory.mktemp("models")
    vocab = Vocabulary.build(ALL, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=8)
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )
    write_index(models, MAIN, MAIN_IDS)
    search_config(True).write(models)
    return models


@pytest.fixture
def models(base_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base_dir, tmp_path / "models"))

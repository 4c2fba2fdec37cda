"""The export stage: the trained encoder → ONNX (dynamic batch and length), gated on
torch-vs-ONNX Runtime parity over real validation questions and on padding invariance.

The ONNX file carries what a consumer needs to use it correctly: the tokenizer's checksum
(a hashed vocabulary for the CNN, word pieces for the transformer), max_len and the encoder
name in its metadata. It is moved into place only after the gate passed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from qpr.artifacts import MAX_LEN_KEY, VOCAB_SHA256_KEY
from qpr.config import Settings
from qpr.io import atomic_path
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import load_trained_encoder, read_cluster_outputs
from qpr.quality.checks import Check, require
from qpr.text import load_tokenizer

if TYPE_CHECKING:
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer


def parity_batches(
    vocab: Vocabulary | WordPieceTokenizer, texts: list[str], *, max_len: int, seed: int
) -> list[np.ndarray]:
    """Real questions in batches of varied sizes (1 .. 64), each padded to its longest."""
    rng = np.random.default_rng(seed)
    batches: list[np.ndarray] = []
    start = 0
    sizes = [1, 2, 7, 16, 64]
    while start < len(texts):
        size = sizes[len(batches) % len(sizes)]
        ids, _ = vocab.encode_batch(texts[start : start + size], max_len=max_len)
        batches.append(ids)
        start += size
    rng.shuffle(batches)
    return batches


def run_export(
    settings: Settings, paths: ProjectPaths, *, log: Callable[[str], None] = print
) -> dict[str, float | int]:
    """The whole stage; raises GateFailed (and leaves no ONNX file) when parity fails."""
    from qpr.model.onnx import export_onnx, padding_invariance_check, parity_check
    from qpr.training.embed import torch_math

    encoder, max_len = load_trained_encoder(paths.encoder_checkpoint)
    vocab = load_tokenizer(paths.vocab)
    questions, _ = read_cluster_outputs(paths)
    val = questions[questions["split"] == "val"]["text"]
    sample = val.sample(
        n=min(settings.export.sample, len(val)), random_state=settings.seed
    ).tolist()

    # Written beside models/encoder.onnx and renamed onto it only when the gate passed.
    with atomic_path(paths.encoder_onnx) as staging:
        export_onnx(
            encoder,
            staging,
            opset=settings.export.opset,
            metadata={
                VOCAB_SHA256_KEY: vocab.checksum,
                MAX_LEN_KEY: str(max_len),
                "encoder": getattr(encoder, "name", type(encoder).__name__),
                "tokenizer": getattr(vocab, "kind", "vocabulary"),
            },
        )
        batches = parity_batches(vocab, sample, max_len=max_len, seed=settings.seed)
        # torch on train.threads, as in training: its sums depend on the thread count.
        with torch_math(settings.train.threads):
            parity = parity_check(encoder, staging, batches)
        padded, _ = vocab.encode_batch(sample[:64], max_len=max_len)
        padding = padding_invariance_check(staging, padded, extra=16)
        tolerance = settings.export.parity_tolerance
        require(
            "onnx_parity",
            [
                Check(
                    "max_abs_diff_torch_vs_onnx",
                    parity["max_abs_diff"],
                    "<",
                    tolerance,
                    f"{parity['rows']} validation questions in {parity['batches']} batches",
                ),
                Check("padding_invariance_max_abs_diff", padding, "<", tolerance),
            ],
            paths.gate_reports("export"),
        )
    metrics = {
        "parity_max_abs_diff": float(parity["max_abs_diff"]),
        "parity_mean_abs_diff": float(parity["mean_abs_diff"]),
        "parity_rows": int(parity["rows"]),
        "padding_max_abs_diff": float(padding),
        "onnx_bytes": paths.encoder_onnx.stat().st_size,
    }
    log(
        f"exported {paths.encoder_onnx} ({metrics['onnx_bytes'] / 1e6:.1f} MB); parity max "
        f"|torch - onnx| {metrics['parity_max_abs_diff']:.2e} on {metrics['parity_rows']} "
        f"questions, padding {metrics['padding_max_abs_diff']:.2e}"
    )
    return metrics

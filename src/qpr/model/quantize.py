"""int8 query encoders: an exported transformer with its matrix products quantised.

A query is encoded while a person waits; the indexed questions are encoded once, offline.
So the index keeps the float32 vectors of the exported encoder, and only the query side
runs with int8 weights (ONNX Runtime's dynamic quantisation: per-output-channel int8
weights, activations quantised per call, MatMul nodes only). On Quora with the fine-tuned
all-MiniLM-L6-v2 that made one question 2.7x faster to encode (4.43 → 1.63 ms p50, one
thread) while test P@1 moved from 0.8843 to 0.8826 (the index float32, exact search);
quantising the indexed vectors' side too cost 0.45 point (docs/models.md). The file
shrinks from 90.4 to 58.7 MB: the word-piece embedding table is a lookup, not a product,
and stays float32.

Per-tensor weights (MatMul or every op type) gave vectors at median cosine 0.969–0.970
with the float32 ones, against 0.9943 per channel; every op type per channel, uint8 or a
reduced range were as close but slower (2.12–2.90 ms against 1.63; docs/models.md).
The CNN is not quantised: its folded float32 encoder (`qpr.retrieval.folded`) is exact and
faster, and int8 made its ONNX encoder slower (docs/serving.md).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from qpr.artifacts import QUANTIZED_FROM
from qpr.io import atomic_path, file_sha256


class _DropPreprocessAdvice(logging.Filter):
    """ONNX Runtime's quantiser advises shape-inference pre-processing on the root logger
    at every call; that advice is for static (calibrated) quantisation of vision models."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def quantize_query_encoder(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Write `source` (a float32 ONNX encoder) to `target` with int8 MatMul weights.

    The metadata (vocab_sha256, max_len, ...) is kept and `qpr.artifacts.QUANTIZED_FROM`
    added. The file is written beside `target` and renamed into place (`qpr.io.atomic_path`),
    so a reader never sees half of it.
    Returns `target`.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, target = Path(source), Path(target)
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: nothing to quantise")
    with atomic_path(target) as tmp:
        advice = _DropPreprocessAdvice()
        logging.getLogger().addFilter(advice)
        try:
            quantize_dynamic(
                source,
                tmp,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8,
            )
        finally:
            logging.getLogger().removeFilter(advice)
        model = onnx.load(tmp)
        quantized = sum(node.op_type == "MatMulInteger" for node in model.graph.node)
        if quantized == 0:
            raise ValueError(f"{source} has no matrix product to quantise")
        props = {p.key: p.value for p in model.metadata_props}
        props[QUANTIZED_FROM] = file_sha256(source)
        onnx.helper.set_model_props(model, props)
        onnx.save(model, tmp)
    return target

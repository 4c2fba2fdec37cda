"""Encoder → ONNX and the checks that gate it.

The exported graph takes "token_ids" int64 [batch, length] (0 = padding) and returns
"embeddings" float32 [batch, D]; batch and length are dynamic.

Exporter: the legacy TorchScript one (dynamo=False) by default. For this encoder both
exporters keep the dynamic axes and match torch within ~1e-7, but the legacy one takes
~0.1 s instead of 1-4 s, is silent, and honours opset 17; the dynamo one (torch 2.13)
only implements opset >= 18 and fails to down-convert Pad for even windows, so with
dynamo=True the opset is raised to 18. It is there for encoders TorchScript cannot trace.
The transformer encoder (a 6-layer BERT) exports with the legacy exporter as well, with
both axes dynamic; its parity with torch is ~1e-7 too.

The ONNX Runtime path the index and the service use is `qpr.retrieval.encoders`; the
checks here compare it with torch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from qpr.artifacts import INPUT_NAME, OUTPUT_NAME
from qpr.io import atomic_path
from qpr.retrieval.encoders import load_session, run_session

if TYPE_CHECKING:
    from torch import nn


def export_onnx(
    encoder: nn.Module,
    path: str | os.PathLike[str],
    *,
    opset: int = 17,
    dynamo: bool = False,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Export `encoder` (on CPU, eval mode) to `path` and run onnx.checker on it.

    metadata: strings stored in the model's metadata_props (e.g. the vocabulary checksum,
    max_len, the training run id) so a deployed file says what it needs.
    The file is written next to `path` and renamed into place: never half a model.
    """
    import onnx
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = encoder.training
    device = next(encoder.parameters()).device
    encoder.eval().cpu()
    # A small non-padding example; its shape is irrelevant because both axes are dynamic.
    example = torch.tensor([[2, 3, 4, 5, 6, 7], [2, 3, 4, 0, 0, 0]], dtype=torch.int64)
    try:
        with atomic_path(path) as tmp:
            with warnings.catch_warnings():
                # The legacy exporter announces its own deprecation on every call.
                warnings.simplefilter("ignore", category=DeprecationWarning)
                # transformers' mask code branches on shapes (KV-cache padding, is_causal) that
                # are the same for every input of a bidirectional encoder without a cache, and
                # its mask indexing uses non-negative aranges; parity_check over batches of
                # other shapes is what proves the graph general.
                warnings.filterwarnings(
                    "ignore", category=torch.jit.TracerWarning, module=r"transformers(\.|$)"
                )
                warnings.filterwarnings(
                    "ignore", message="Exporting aten::index operator of advanced indexing"
                )
                if dynamo:
                    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
                    torch.onnx.export(
                        encoder,
                        (example,),
                        str(tmp),
                        input_names=[INPUT_NAME],
                        output_names=[OUTPUT_NAME],
                        opset_version=max(opset, 18),
                        dynamo=True,
                        external_data=False,
                        dynamic_shapes=({0: batch, 1: length},),
                    )
                else:
                    torch.onnx.export(
                        encoder,
                        (example,),
                        str(tmp),
                        input_names=[INPUT_NAME],
                        output_names=[OUTPUT_NAME],
                        opset_version=opset,
                        dynamo=False,
                        dynamic_axes={
                            INPUT_NAME: {0: "batch", 1: "length"},
                            OUTPUT_NAME: {0: "batch"},
                        },
                    )
            model = onnx.load(tmp)
            if metadata:
                for key, value in metadata.items():
                    entry = model.metadata_props.add()
                    entry.key, entry.value = str(key), str(value)
                onnx.save(model, tmp)
            onnx.checker.check_model(model, full_check=True)
    finally:
        encoder.to(device).train(was_training)
    return path


def parity_check(
    encoder: nn.Module,
    onnx_path: str | os.PathLike[str],
    token_batches: Iterable[np.ndarray],
    *,
    threads: int = 1,
) -> dict[str, Any]:
    """Compare torch and ONNX Runtime on the same padded id batches (int64 [B, L] each).

    Returns {"max_abs_diff", "mean_abs_diff", "max_rel_diff", "rows", "batches"}; the
    export gate requires max_abs_diff below 1e-4 on real questions.
    """
    import torch

    session = load_session(onnx_path, threads=threads)
    was_training = encoder.training
    encoder.eval()
    max_abs = max_rel = abs_sum = 0.0
    rows = batches = values = 0
    device = next(encoder.parameters()).device
    try:
        with torch.no_grad():
            for token_ids in token_batches:
                ids = np.ascontiguousarray(token_ids, dtype=np.int64)
                expected = encoder(torch.from_numpy(ids).to(device)).float().cpu().numpy()
                got = run_session(session, ids)
                diff = np.abs(expected.astype(np.float64) - got.astype(np.float64))
                scale = np.maximum(np.abs(expected).astype(np.float64), 1e-6)
                max_abs = max(max_abs, float(diff.max(initial=0.0)))
                max_rel = max(max_rel, float((diff / scale).max(initial=0.0)))
                abs_sum += float(diff.sum())
                values += diff.size
                rows += ids.shape[0]
                batches += 1
    finally:
        encoder.train(was_training)
    return {
        "max_abs_diff": max_abs,
        "mean_abs_diff": abs_sum / max(values, 1),
        "max_rel_diff": max_rel,
        "rows": rows,
        "batches": batches,
    }


def padding_invariance_check(
    onnx_path: str | os.PathLike[str] | ort.InferenceSession,
    token_ids: np.ndarray,
    extra: int = 16,
) -> float:
    """max |φ(ids) - φ(ids + `extra` padding columns)| through ONNX Runtime (0 when exact)."""
    session = (
        onnx_path
        if isinstance(onnx_path, ort.InferenceSession)
        else load_session(onnx_path, threads=1)
    )
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    padded = np.pad(ids, ((0, 0), (0, extra)))
    diff = np.abs(run_session(session, ids).astype(np.float64) - run_session(session, padded))
    return float(diff.max(initial=0.0))

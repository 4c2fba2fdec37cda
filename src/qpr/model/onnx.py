"""ONNX export for every model family: the graph, its parity with torch, the int8 verdict.

A family's graph is described by its `Signature`: the input names with an example of each
and the output name; batch and length are dynamic on every input, batch on the output.

- `ENCODER_SIGNATURE` (encoders and query students): "token_ids" int64 [batch, length]
  (0 = padding) → "embeddings" float32 [batch, D].
- `CROSS_ENCODER_SIGNATURE` (the re-ranker): "token_ids" and "token_type_ids" int64
  [batch, length] → "scores" float32 [batch] (`qpr.artifacts.RERANK_INPUT_NAMES` /
  `RERANK_OUTPUT_NAME`).

Exporter: the legacy TorchScript one (dynamo=False) by default. For the CNN both exporters
keep the dynamic axes and match torch within ~1e-7, but the legacy one takes ~0.1 s
instead of 1-4 s, is silent, and honours opset 17; the dynamo one (torch 2.13) only
implements opset >= 18 and fails to down-convert Pad for even windows, so with dynamo=True
the opset is raised to 18. It is there for models TorchScript cannot trace. BERT (the
transformer encoder, the cross-encoder) exports with the legacy exporter as well, with
both axes dynamic; its parity with torch is ~1e-7 too. The metadata (`qpr.artifacts` keys:
the tokenizer's checksum, max_len, ...) is stored in the file's metadata_props.

`parity_check` compares torch with ONNX Runtime (`qpr.retrieval.encoders.load_session`,
the path the index and the service use) on real inputs; each stage gates on it.

int8: `qpr.model.quantize` writes the int8 copy (ONNX Runtime's dynamic quantisation of
MatMul weights, per channel); it fits the cross-encoder's graph unchanged: the attention
and feed-forward products are MatMuls, the pooler and the head (2-D Gemms) stay float32.
A scorer is judged by the order it puts candidates in, not by its logits: `int8_verdict`
keeps the int8 copy when, over validation groups (a question with its candidates), it
picks the same top candidate as float32 in at least `min_top1_agreement` of the groups and
ranks the right one first no less often than float32 minus `max_accuracy_drop`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from qpr.artifacts import INPUT_NAME, OUTPUT_NAME, RERANK_INPUT_NAMES, RERANK_OUTPUT_NAME
from qpr.io import atomic_path
from qpr.retrieval.encoders import load_session, run_session

if TYPE_CHECKING:
    from torch import nn

Rows = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Signature:
    """A graph's inputs (names, an example int64 batch of each) and its output's name."""

    inputs: tuple[str, ...]
    examples: tuple[Rows, ...]
    output: str


# A small non-padding example and a padded row; the shapes do not matter (dynamic axes).
ENCODER_SIGNATURE = Signature(
    inputs=(INPUT_NAME,), examples=(((2, 3, 4, 5, 6, 7), (2, 3, 4, 0, 0, 0)),), output=OUTPUT_NAME
)
# [CLS] a [SEP] b [SEP] and a padded row.
CROSS_ENCODER_SIGNATURE = Signature(
    inputs=tuple(RERANK_INPUT_NAMES),
    examples=(
        ((101, 7, 8, 102, 9, 10, 102), (101, 7, 102, 9, 102, 0, 0)),
        ((0, 0, 0, 0, 1, 1, 1), (0, 0, 0, 1, 1, 0, 0)),
    ),
    output=RERANK_OUTPUT_NAME,
)


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike[str],
    signature: Signature = ENCODER_SIGNATURE,
    *,
    opset: int = 17,
    dynamo: bool = False,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Export `model` (on CPU, eval mode) to `path` and run onnx.checker on it.

    metadata: strings stored in the model's metadata_props (e.g. the vocabulary checksum,
    max_len, the training run id) so a deployed file says what it needs.
    The file is written next to `path` and renamed into place: never half a model.
    """
    import onnx
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    device = next(model.parameters()).device
    model.eval().cpu()
    examples = tuple(torch.tensor(rows, dtype=torch.int64) for rows in signature.examples)
    try:
        with atomic_path(path) as tmp:
            with warnings.catch_warnings():
                _quiet_exporter(torch)
                _export(model, examples, tmp, signature, opset=opset, dynamo=dynamo)
            graph = onnx.load(tmp)
            if metadata:
                for key, value in metadata.items():
                    entry = graph.metadata_props.add()
                    entry.key, entry.value = str(key), str(value)
                onnx.save(graph, tmp)
            onnx.checker.check_model(graph, full_check=True)
    finally:
        model.to(device).train(was_training)
    return path


def _quiet_exporter(torch: Any) -> None:
    # The legacy exporter announces its own deprecation on every call.
    warnings.simplefilter("ignore", category=DeprecationWarning)
    # transformers' mask code branches on shapes (KV-cache padding, is_causal) that are the
    # same for every input of a bidirectional encoder without a cache, and its mask indexing
    # uses non-negative aranges; parity_check over batches of other shapes is what proves
    # the graph general.
    warnings.filterwarnings(
        "ignore", category=torch.jit.TracerWarning, module=r"transformers(\.|$)"
    )
    warnings.filterwarnings("ignore", message="Exporting aten::index operator of advanced indexing")


def _export(
    model: nn.Module,
    examples: tuple[Any, ...],
    target: Path,
    signature: Signature,
    *,
    opset: int,
    dynamo: bool,
) -> None:
    import torch

    if dynamo:
        batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
        torch.onnx.export(
            model,
            examples,
            str(target),
            input_names=list(signature.inputs),
            output_names=[signature.output],
            opset_version=max(opset, 18),
            dynamo=True,
            external_data=False,
            dynamic_shapes=tuple({0: batch, 1: length} for _ in signature.inputs),
        )
        return
    axes = {name: {0: "batch", 1: "length"} for name in signature.inputs}
    torch.onnx.export(
        model,
        examples,
        str(target),
        input_names=list(signature.inputs),
        output_names=[signature.output],
        opset_version=opset,
        dynamo=False,
        dynamic_axes={**axes, signature.output: {0: "batch"}},
    )


def parity_check(
    model: nn.Module,
    onnx_path: str | os.PathLike[str],
    batches: Iterable[np.ndarray | tuple[np.ndarray, ...]],
    *,
    threads: int = 1,
) -> dict[str, Any]:
    """Compare torch and ONNX Runtime on the same batches: each one int64 [B, L] array per
    graph input, in the signature's order (a bare array for a one-input graph).

    Returns {"max_abs_diff", "mean_abs_diff", "max_rel_diff", "rows", "batches"}; the
    stages require max_abs_diff below their parity tolerance (1e-4) on real inputs.
    """
    import torch

    session = load_session(onnx_path, threads=threads)
    names = [i.name for i in session.get_inputs()]
    was_training = model.training
    model.eval()
    max_abs = max_rel = abs_sum = 0.0
    rows = count = values = 0
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in batches:
                arrays = [
                    np.ascontiguousarray(a, dtype=np.int64)
                    for a in (batch if isinstance(batch, tuple) else (batch,))
                ]
                tensors = [torch.from_numpy(a).to(device) for a in arrays]
                expected = model(*tensors).float().cpu().numpy()
                got = session.run(None, dict(zip(names, arrays, strict=True)))[0]
                diff = np.abs(expected.astype(np.float64) - got.astype(np.float64))
                scale = np.maximum(np.abs(expected).astype(np.float64), 1e-6)
                max_abs = max(max_abs, float(diff.max(initial=0.0)))
                max_rel = max(max_rel, float((diff / scale).max(initial=0.0)))
                abs_sum += float(diff.sum())
                values += diff.size
                rows += arrays[0].shape[0]
                count += 1
    finally:
        model.train(was_training)
    return {
        "max_abs_diff": max_abs,
        "mean_abs_diff": abs_sum / max(values, 1),
        "max_rel_diff": max_rel,
        "rows": rows,
        "batches": count,
    }


def padding_invariance_check(
    onnx_path: str | os.PathLike[str] | ort.InferenceSession,
    token_ids: np.ndarray,
    extra: int = 16,
) -> float:
    """max |φ(ids) - φ(ids + `extra` padding columns)| of an encoder's graph through ONNX
    Runtime (0 when exact)."""
    session = (
        onnx_path
        if isinstance(onnx_path, ort.InferenceSession)
        else load_session(onnx_path, threads=1)
    )
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    padded = np.pad(ids, ((0, 0), (0, extra)))
    diff = np.abs(run_session(session, ids).astype(np.float64) - run_session(session, padded))
    return float(diff.max(initial=0.0))


@dataclass(frozen=True)
class RankingAgreement:
    """How an approximate scorer ranks validation groups against a reference one.

    top1_agreement: share of groups where both put the same candidate first;
    reference_accuracy, accuracy: share of groups whose first candidate (the paraphrase)
    each scorer ranks first; groups: how many groups.
    """

    top1_agreement: float
    reference_accuracy: float
    accuracy: float
    groups: int


def ranking_agreement(reference: np.ndarray, approx: np.ndarray) -> RankingAgreement:
    """Agreement of two scorers over groups: float [G, C] scores of each group's C
    candidates, candidate 0 the right one (the query's paraphrase)."""
    reference, approx = np.asarray(reference), np.asarray(approx)
    if reference.ndim != 2 or reference.shape != approx.shape or reference.shape[1] < 1:
        raise ValueError(f"need two [G, C] arrays, got {reference.shape} and {approx.shape}")
    best_ref, best = reference.argmax(axis=1), approx.argmax(axis=1)
    return RankingAgreement(
        top1_agreement=float((best_ref == best).mean()) if len(best) else float("nan"),
        reference_accuracy=float((best_ref == 0).mean()) if len(best) else float("nan"),
        accuracy=float((best == 0).mean()) if len(best) else float("nan"),
        groups=int(reference.shape[0]),
    )


def int8_verdict(
    agreement: RankingAgreement, *, min_top1_agreement: float, max_accuracy_drop: float
) -> bool:
    """Keep the int8 copy: it picks float32's top candidate often enough and finds the
    right one nearly as often (see the module docstring)."""
    return (
        agreement.groups > 0
        and agreement.top1_agreement >= min_top1_agreement
        and agreement.accuracy >= agreement.reference_accuracy - max_accuracy_drop
    )

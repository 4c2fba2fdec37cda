"""Cross-encoder → ONNX, its parity with torch, and the int8 copy kept only when it ranks
as the float32 one does.

The graph takes "token_ids" and "token_type_ids" int64 [batch, length] (both axes dynamic)
and returns "scores" float32 [batch] (`qpr.artifacts.RERANK_INPUT_NAMES` /
`RERANK_OUTPUT_NAME`); its metadata holds max_len and the tokenizer's checksum. The legacy
TorchScript exporter handles BERT with dynamic axes, as for the bi-encoder
(`qpr.model.onnx`).

int8: `qpr.model.quantize` (ONNX Runtime's dynamic quantisation of MatMul weights, per
channel) fits this graph unchanged: the attention and feed-forward products are MatMuls;
the pooler and the head, 2-D Gemms, stay float32. A re-ranker is judged by the order it
puts candidates in, not by its logits, so the int8 copy is kept when, over validation
groups (a question with its candidates), it picks the same top candidate as float32 in at
least `min_top1_agreement` of the groups and ranks the paraphrase first no less often
than float32 minus `max_accuracy_drop` (`int8_verdict`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qpr.artifacts import RERANK_INPUT_NAMES, RERANK_OUTPUT_NAME
from qpr.io import atomic_path
from qpr.retrieval.encoders import load_session
from qpr.retrieval.reranker import score_pairs

if TYPE_CHECKING:
    from torch import nn


def export_cross_encoder(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, str],
    opset: int = 17,
) -> Path:
    """Export `model` (a `qpr.model.cross_encoder.CrossEncoder`, on CPU, eval mode) to
    `path` with onnx.checker run on it; written beside `path` and renamed into place."""
    import onnx
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval().cpu()
    # [CLS] a [SEP] b [SEP] and a padded row; the shapes do not matter (dynamic axes).
    ids = torch.tensor([[101, 7, 8, 102, 9, 10, 102], [101, 7, 102, 9, 102, 0, 0]])
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]])
    axes = {name: {0: "batch", 1: "length"} for name in RERANK_INPUT_NAMES}
    try:
        with atomic_path(path) as tmp:
            with warnings.catch_warnings():
                # The legacy exporter's deprecation notice and transformers' shape branches
                # (see qpr.model.onnx); parity over other shapes proves the graph general.
                warnings.simplefilter("ignore", category=DeprecationWarning)
                warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
                warnings.filterwarnings(
                    "ignore", message="Exporting aten::index operator of advanced indexing"
                )
                torch.onnx.export(
                    model,
                    (ids, types),
                    str(tmp),
                    input_names=list(RERANK_INPUT_NAMES),
                    output_names=[RERANK_OUTPUT_NAME],
                    opset_version=opset,
                    dynamo=False,
                    dynamic_axes={**axes, RERANK_OUTPUT_NAME: {0: "batch"}},
                )
            graph = onnx.load(tmp)
            onnx.helper.set_model_props(graph, {str(k): str(v) for k, v in metadata.items()})
            onnx.save(graph, tmp)
            onnx.checker.check_model(graph, full_check=True)
    finally:
        model.train(was_training)
    return path


def cross_parity_check(
    model: nn.Module,
    onnx_path: str | os.PathLike[str],
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
) -> dict[str, Any]:
    """max / mean |torch - ONNX Runtime| of the scores over (token_ids, token_type_ids)
    batches, and the rows and batches compared."""
    import torch

    session = load_session(onnx_path, threads=1)
    was_training = model.training
    model.eval()
    max_abs, total, rows, count = 0.0, 0.0, 0, 0
    try:
        with torch.no_grad():
            for ids, types in batches:
                expected = model(torch.from_numpy(ids), torch.from_numpy(types)).numpy()
                diff = np.abs(expected.astype(np.float64) - score_pairs(session, ids, types))
                max_abs = max(max_abs, float(diff.max(initial=0.0)))
                total += float(diff.sum())
                rows += ids.shape[0]
                count += 1
    finally:
        model.train(was_training)
    return {
        "max_abs_diff": max_abs,
        "mean_abs_diff": total / max(rows, 1),
        "rows": rows,
        "batches": count,
    }


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
    """Keep the int8 re-ranker: it picks float32's top candidate often enough and finds
    the paraphrase nearly as often (see the module docstring)."""
    return (
        agreement.groups > 0
        and agreement.top1_agreement >= min_top1_agreement
        and agreement.accuracy >= agreement.reference_accuracy - max_accuracy_drop
    )

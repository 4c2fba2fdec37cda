"""The exported CNN encoder with its embedding folded into its convolution: lookup tables.

A convolution over embedded tokens is linear in the embedding rows: at position t a window
of width w sums K_j · E[x_{t+j-p}] over its offsets j. The vocabulary is fixed, so
T_j = E · K_jᵀ (one [V, C] table per offset) can be computed once, and a question's
pre-activations become sums of table rows: w · L row reads for a question of L tokens,
instead of L · w · e_dim · C multiply-adds. The rest is the exported graph's: tanh, the
max over the question's tokens (taken before tanh, which is increasing), the projection.

For the default CNN (e_dim 300, window 5, 300 channels) that is 5.4 M multiply-adds less
per question: one Quora question, encoded right after a search, took 0.025-0.028 ms
against 0.197-0.211 ms through ONNX Runtime (p50 of 2,000, three runs). The tables cost
memory: w · V · C float32, 172 MB for Quora's 28,727-word vocabulary; a bundle took
0.7-1.0 s more to load.

The ONNX model stays the reference: `fold_cnn` reads its weights, and the bundle only
encodes with the tables after they reproduced the ONNX output (`matches`). Summed in
another order, the vectors differ from ONNX Runtime's by float rounding (on 1,263 Quora
questions at most 1.6e-6 of the largest value). Every row is summed in the same order
whatever the batch, so a batch encodes exactly as its questions one by one.

A static query student (`qpr.model.static`: the mean of word-piece vectors, then a linear
map) folds the same way, further: the mean commutes with the projection, so one table
T = E · Wᵀ [V, D] holds every piece's projected vector, and a question is the mean of its
rows plus the bias (`FoldedStatic`): a gather and a sum, no matrix product a query.

Arrays: token ids int64 (0 = padding: no contribution, not pooled, as in the graph),
tables float32 [w, V, C] (a static student's [V, D]), vectors float32 [N, D].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np
import onnx
from onnx import numpy_helper

from qpr.artifacts import INPUT_NAME, OUTPUT_NAME

log = logging.getLogger(__name__)

# Folded tables sum in another order than ONNX Runtime's convolution: they differ by
# rounding (relative ~1e-7 on the tests' encoders, 1.6e-6 on Quora's), not by 1e-4.
FOLDED_TOLERANCE = 1e-4

_CNN_NODES = {
    "Constant", "Equal", "Not", "Gather", "Unsqueeze", "Cast", "Mul", "Transpose", "Conv",
    "Slice", "Tanh", "Where", "ReduceMax", "Concat", "Gemm",
}  # fmt: skip
_NORMALIZE_NODES = {"ReduceL2", "Clip", "Expand", "Shape", "Div"}  # F.normalize's export
_STATIC_NODES = {
    "Constant", "Equal", "Not", "Gather", "Unsqueeze", "Cast", "Mul", "ReduceSum", "Clip",
    "Div", "Gemm", "Expand", "Shape",
}  # fmt: skip
_STATIC_WEIGHTS = {"embedding.weight", "projection.weight", "projection.bias"}


@numba.njit(nogil=True, cache=True)
def _pooled(
    ids: np.ndarray, lengths: np.ndarray, table: np.ndarray, bias: np.ndarray, shift: int
) -> np.ndarray:
    """float32 [N, C]: tanh of the max over each question's tokens of one convolution's
    pre-activations. ids int64 [N, L] (row i's first lengths[i] columns are its tokens),
    table float32 [w, V, C], bias float32 [C]; output t reads tokens t + j - shift."""
    n, width, vocab, channels = ids.shape[0], table.shape[0], table.shape[1], table.shape[2]
    for i in range(n):
        for t in range(lengths[i]):
            if ids[i, t] < 0 or ids[i, t] >= vocab:
                raise ValueError("token ids must be in [0, vocabulary size)")
    out = np.empty((n, channels), np.float32)
    h = np.empty(channels, np.float32)
    best = np.empty(channels, np.float32)
    for i in range(n):
        length = lengths[i]
        best[:] = -np.inf  # no token pooled: tanh(-inf) = -1, the graph's masked value
        for t in range(length):
            if ids[i, t] == 0:
                continue  # padding is masked out of the max
            h[:] = bias
            for j in range(width):
                s = t + j - shift
                if s < 0 or s >= length or ids[i, s] == 0:
                    continue
                row = table[j, ids[i, s]]
                for c in range(channels):
                    h[c] += row[c]
            for c in range(channels):
                if h[c] > best[c]:
                    best[c] = h[c]
        for c in range(channels):
            out[i, c] = np.tanh(best[c])
    return out


@numba.njit(nogil=True, cache=True)
def _unit(row: np.ndarray) -> None:
    """Divide a float32 row by its L2 norm (at least 1e-12), in place, summed in order."""
    norm = np.float32(0.0)
    for d in range(row.size):
        norm += row[d] * row[d]
    norm = max(np.sqrt(norm), np.float32(1e-12))
    for d in range(row.size):
        row[d] /= norm


@numba.njit(nogil=True, cache=True)
def _projected(
    h: np.ndarray, weight_t: np.ndarray, bias: np.ndarray, normalize: bool
) -> np.ndarray:
    """float32 [N, D] = h [N, C] · weight_t [C, D] + bias, every output summed over c in
    ascending order whatever N (a BLAS call picks other kernels for one row and for many,
    and rounds differently), then L2-normalised when asked. The inner loop runs over d,
    independent sums, so it vectorises without reordering any of them."""
    n, channels = h.shape
    dims = bias.size
    out = np.empty((n, dims), np.float32)
    for i in range(n):
        row = out[i]
        row[:] = bias
        for c in range(channels):
            x = h[i, c]
            w = weight_t[c]
            for d in range(dims):
                row[d] += w[d] * x
        if normalize:
            _unit(row)
    return out


@numba.njit(nogil=True, cache=True)
def _encoded(
    ids: np.ndarray,
    lengths: np.ndarray,
    table: np.ndarray,
    bias: np.ndarray,
    shift: int,
    weight_t: np.ndarray,
    projection_bias: np.ndarray,
    normalize: bool,
) -> np.ndarray:
    """`_pooled` then `_projected` for a CNN of one window (the default): one compiled
    call a question, the GIL released throughout."""
    pooled = _pooled(ids, lengths, table, bias, shift)
    return _projected(pooled, weight_t, projection_bias, normalize)


@numba.njit(nogil=True, cache=True)
def _mean_rows(
    ids: np.ndarray, lengths: np.ndarray, table: np.ndarray, bias: np.ndarray, normalize: bool
) -> np.ndarray:
    """float32 [N, D]: the mean of each question's table rows (padding left out, as the
    graph masks it) plus bias, L2-normalised when asked. Every row is summed in token
    order whatever N, so a batch encodes exactly as its questions one by one."""
    n, vocab, dims = ids.shape[0], table.shape[0], table.shape[1]
    for i in range(n):
        for t in range(lengths[i]):
            if ids[i, t] < 0 or ids[i, t] >= vocab:
                raise ValueError("token ids must be in [0, vocabulary size)")
    out = np.empty((n, dims), np.float32)
    for i in range(n):
        row = out[i]
        row[:] = 0.0
        count = 0
        for t in range(lengths[i]):
            token = ids[i, t]
            if token == 0:
                continue
            count += 1
            source = table[token]
            for d in range(dims):
                row[d] += source[d]
        scale = np.float32(1.0) / np.float32(max(count, 1))
        for d in range(dims):
            row[d] = row[d] * scale + bias[d]
        if normalize:
            _unit(row)
    return out


def _padded(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [N, L], lengths int64 [N]) of unpadded token-id lists."""
    if len(sequences) == 1:  # the service's path: no padding to build
        ids = np.asarray(sequences, dtype=np.int64).reshape(1, -1)
        return ids, np.full(1, ids.shape[1], np.int64)
    longest = max((len(s) for s in sequences), default=0)
    ids = np.zeros((len(sequences), max(longest, 1)), np.int64)
    for i, tokens in enumerate(sequences):
        ids[i, : len(tokens)] = tokens
    return ids, np.fromiter((len(s) for s in sequences), np.int64, len(sequences))


class _Folded:
    """What every folded encoder offers beside `encode`: its agreement with the graph."""

    def encode(self, sequences: list[list[int]]) -> np.ndarray:
        raise NotImplementedError

    def matches(self, reference: np.ndarray, sequences: list[list[int]]) -> float:
        """The largest |difference| between `encode(sequences)` and the reference vectors
        (float32 [N, D], the ONNX model's), relative to the largest |reference value|."""
        mine = self.encode(sequences)
        scale = max(float(np.abs(reference).max()), 1e-12)
        return float(np.abs(mine - reference).max()) / scale


@dataclass(frozen=True)
class FoldedStatic(_Folded):
    """A static query student as one table of projected word-piece vectors."""

    table: np.ndarray  # float32 [V, D]: embedding · projection weightᵀ
    bias: np.ndarray  # float32 [D]
    normalize: bool
    kind: str = "static"

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def encode(self, sequences: list[list[int]]) -> np.ndarray:
        """float32 [N, D] for N questions' token ids (unpadded; zeros are padding).
        ValueError for an id outside [0, vocab_size)."""
        ids, lengths = _padded(sequences)
        return _mean_rows(ids, lengths, self.table, self.bias, self.normalize)


@dataclass(frozen=True)
class FoldedCNN(_Folded):
    """The CNN encoder as lookup tables (one per convolution) and its projection."""

    tables: tuple[np.ndarray, ...]  # float32 [w, V, c] each
    biases: tuple[np.ndarray, ...]  # float32 [c] each
    shifts: tuple[int, ...]  # output t reads tokens t + j - shift
    projection_t: np.ndarray  # float32 [C, D]: the projection's weight, transposed
    projection_bias: np.ndarray  # float32 [D]
    normalize: bool
    kind: str = "cnn"

    @property
    def vocab_size(self) -> int:
        return int(self.tables[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tables)

    def encode(self, sequences: list[list[int]]) -> np.ndarray:
        """float32 [N, D] for N questions' token ids (unpadded; zeros are padding).
        ValueError for an id outside [0, vocab_size)."""
        ids, lengths = _padded(sequences)
        if len(self.tables) == 1:
            return _encoded(
                ids,
                lengths,
                self.tables[0],
                self.biases[0],
                self.shifts[0],
                self.projection_t,
                self.projection_bias,
                self.normalize,
            )
        pooled = [
            _pooled(ids, lengths, table, bias, shift)
            for table, bias, shift in zip(self.tables, self.biases, self.shifts, strict=True)
        ]
        h = np.concatenate(pooled, axis=1)  # one block of channels per window, in order
        return _projected(h, self.projection_t, self.projection_bias, self.normalize)


def fold_cnn(onnx_path: str | Path) -> FoldedCNN | None:
    """The folded encoder of a CNN exported by `qpr.model.onnx.export_onnx`; None for a graph
    that is not one (a transformer, or operators this folding does not know)."""
    model = onnx.load(str(onnx_path))
    metadata = {p.key: p.value for p in model.metadata_props}
    ops = {node.op_type for node in model.graph.node}
    if metadata.get("encoder", "cnn") != "cnn":  # files of early exports have no name
        return None
    normalize = "ReduceL2" in ops
    if not ops <= (_CNN_NODES | _NORMALIZE_NODES if normalize else _CNN_NODES):
        return None
    weights = {w.name: numpy_helper.to_array(w) for w in model.graph.initializer}
    try:
        embedding = weights["embedding.weight"].astype(np.float32)
        projection = weights["projection.weight"].astype(np.float32)
        projection_bias = weights["projection.bias"].astype(np.float32)
    except KeyError:
        return None
    tables, biases, shifts = [], [], []
    i = 0
    while f"convs.{i}.weight" in weights:
        kernel = weights[f"convs.{i}.weight"].astype(np.float32)  # [c, e_dim, w]
        width = kernel.shape[2]
        # "same" padding of w // 2; an even window's first output is dropped (qpr.model.cnn)
        shifts.append(width // 2 - (1 if width % 2 == 0 else 0))
        tables.append(np.stack([embedding @ kernel[:, :, j].T for j in range(width)]))
        biases.append(weights[f"convs.{i}.bias"].astype(np.float32))
        i += 1
    if not tables:
        return None
    return FoldedCNN(
        tables=tuple(np.ascontiguousarray(t, np.float32) for t in tables),
        biases=tuple(biases),
        shifts=tuple(shifts),
        projection_t=np.ascontiguousarray(projection.T),
        projection_bias=projection_bias,
        normalize=normalize,
    )


def fold_static(onnx_path: str | Path) -> FoldedStatic | None:
    """The folded encoder of a static student exported by `qpr.model.onnx.export_onnx`
    (`qpr.model.static`); None for a graph that is not one."""
    model = onnx.load(str(onnx_path))
    ops = {node.op_type for node in model.graph.node}
    weights = {w.name: numpy_helper.to_array(w) for w in model.graph.initializer}
    if not ops <= _STATIC_NODES | _NORMALIZE_NODES or set(weights) != _STATIC_WEIGHTS:
        return None
    embedding = weights["embedding.weight"].astype(np.float64)
    projection = weights["projection.weight"].astype(np.float64)
    # float64 product, one rounding to float32: the table is as exact as float32 allows.
    table = (embedding @ projection.T).astype(np.float32)
    table[0] = 0.0  # [PAD] is masked out by the graph; never summed here either
    return FoldedStatic(
        table=np.ascontiguousarray(table),
        bias=weights["projection.bias"].astype(np.float32),
        normalize="ReduceL2" in ops,
    )


def checked_fold(onnx_path: Path, session: Any, max_len: int) -> FoldedCNN | FoldedStatic | None:
    """The folded encoder (a CNN's tables, or a static student's one table) when the
    encoder is one of these and the tables reproduce the ONNX output
    (`session`, an ONNX Runtime session of `onnx_path`) on probe questions: random word ids
    of 1 .. max_len tokens, one with padding inside. None (logged) otherwise. The caller
    has matched the vocabulary with the one the encoder was exported with."""
    folded = fold_cnn(onnx_path) or fold_static(onnx_path)
    if folded is None:
        return None
    rng = np.random.default_rng(0)
    lengths = sorted({1, 2, 3, 7, max(1, max_len // 2), max_len})
    probes = [rng.integers(1, folded.vocab_size, n).tolist() for n in lengths]
    if max_len >= 3:
        probes.append([1, 0, 1])  # padding inside: masked as the graph masks it
    reference = np.vstack(
        [session.run([OUTPUT_NAME], {INPUT_NAME: np.asarray([p], np.int64)})[0] for p in probes]
    )
    error = folded.matches(reference, probes)
    if not error <= FOLDED_TOLERANCE:
        log.warning(
            "%s: the folded encoder is %.2g off the ONNX model (relative); encoding with "
            "ONNX Runtime",
            onnx_path,
            error,
        )
        return None
    log.info(
        "%s: encoding with the %s folded into lookup tables (%.0f MB)",
        onnx_path,
        "CNN" if folded.kind == "cnn" else "static student",
        folded.nbytes / 1e6,
    )
    return folded

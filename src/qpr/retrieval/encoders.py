"""Query-time ONNX encoding: an ONNX Runtime session with explicit threads and the bulk
encoding path of the index stage. numpy and onnxruntime only (no torch).

The graph takes "token_ids" int64 [batch, length] (0 = padding) and returns "embeddings"
float32 [batch, D] (`qpr.artifacts.INPUT_NAME` / `OUTPUT_NAME`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from qpr.artifacts import INPUT_NAME, MAX_LEN_KEY, OUTPUT_NAME, QUANTIZED_FROM
from qpr.text.vocab import pad_sequences

if TYPE_CHECKING:
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer


def load_session(
    path: str | os.PathLike[str], threads: int = 1, *, providers: Sequence[str] | None = None
) -> ort.InferenceSession:
    """An ONNX Runtime session with explicit threads.

    One intra-op thread is the right default for single-question queries (2-core box:
    p99 0.5 ms vs 8.4 ms with ORT's default pool); raise it for bulk index encoding.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(
        str(path), sess_options=options, providers=list(providers or ["CPUExecutionProvider"])
    )


def run_session(session: ort.InferenceSession, token_ids: np.ndarray) -> np.ndarray:
    """float32 [batch, D] embeddings of int64 [batch, length] token ids."""
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    return session.run([OUTPUT_NAME], {INPUT_NAME: ids})[0]


def onnx_max_len(session: ort.InferenceSession) -> int:
    """max_len the encoder was trained with, from the ONNX metadata the export stage wrote
    (`qpr.artifacts.MAX_LEN_KEY`)."""
    return int(session.get_modelmeta().custom_metadata_map[MAX_LEN_KEY])


def embedding_dim(session: ort.InferenceSession) -> int:
    """D of the "embeddings" output (static: the projection's width)."""
    dim = session.get_outputs()[0].shape[1]
    if not isinstance(dim, int):
        # A symbolic dim: ask the model with one padding-only row.
        return int(run_session(session, np.zeros((1, 1), dtype=np.int64)).shape[1])
    return dim


def encode(
    session: ort.InferenceSession,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 256,
    max_len: int = 64,
) -> np.ndarray:
    """float32 [N, D] vectors of `texts`, in input order.

    max_len must be the one the encoder was trained and evaluated with (best.pt stores it):
    longer questions are truncated to it, so another value gives other vectors for them.

    Batches are formed after sorting by token count so each is padded only to its own
    longest question (the encoder is padding-invariant, so this changes speed, not values).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sequences = [vocab.encode(t) for t in texts]
    out = np.empty((len(sequences), embedding_dim(session)), dtype=np.float32)
    if not sequences:
        return out
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    order = np.argsort(lengths, kind="stable")
    for start in range(0, order.shape[0], batch_size):
        idx = order[start : start + batch_size]
        token_ids, _ = pad_sequences([sequences[i] for i in idx], max_len=max_len)
        out[idx] = run_session(session, token_ids)
    return out


# Questions encoded per ONNX call by embed_sequences: large enough to amortise the call,
# small enough that padding to the longest question of a chunk stays cheap.
QUERY_CHUNK = 256


def batch_dependent(session: ort.InferenceSession) -> bool:
    """True for an encoder whose vectors depend on what else is in the batch: the int8
    copy (`qpr.model.quantize`). Dynamic quantisation scales the activations per call,
    over the whole padded batch, so a question's vector moves with its neighbours."""
    return QUANTIZED_FROM in session.get_modelmeta().custom_metadata_map


def embed_sequences(
    session: ort.InferenceSession, sequences: Sequence[Sequence[int]], *, max_len: int, dim: int
) -> np.ndarray:
    """float32 [N, D] query vectors of token-id sequences (already cut to max_len), in
    input order: what `Bundle.search` and the evaluate stage encode queries with.

    One sequence goes through unpadded; more go in length-sorted chunks of `QUERY_CHUNK`,
    each padded only to its own longest sequence. A `batch_dependent` encoder takes them
    one at a time instead, so a batch gets each question's vector as a lone query does:
    what is measured in batches is what one question is served."""
    if len(sequences) == 1:  # the single-question path: no sorting, no scatter
        return run_session(session, np.asarray(sequences, dtype=np.int64))
    out = np.empty((len(sequences), dim), dtype=np.float32)
    if batch_dependent(session):
        for row, sequence in enumerate(sequences):
            out[row] = run_session(session, np.asarray([sequence], dtype=np.int64))[0]
        return out
    order = np.argsort([len(s) for s in sequences], kind="stable")
    for start in range(0, len(order), QUERY_CHUNK):
        idx = order[start : start + QUERY_CHUNK]
        token_ids, _ = pad_sequences([list(sequences[i]) for i in idx], max_len=max_len)
        out[idx] = run_session(session, token_ids)
    return out


def query_vectors(
    session: ort.InferenceSession,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: Sequence[str],
    *,
    max_len: int,
) -> np.ndarray:
    """float32 [Q, D]: the texts as `Bundle.search` encodes them (the tokenizer's ids cut
    to max_len, then `embed_sequences`), for an evaluation of what is served."""
    sequences = [vocab.encode(text)[:max_len] for text in texts]
    if not sequences:
        return np.empty((0, embedding_dim(session)), np.float32)
    return embed_sequences(session, sequences, max_len=max_len, dim=embedding_dim(session))


CORPUS_CHUNK = 20_000  # questions per progress line of encode_corpus


def encode_corpus(
    session: ort.InferenceSession,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: list[str],
    *,
    batch_size: int,
    log: Callable[[str], None] = print,
) -> np.ndarray:
    """float32 [N, D] vectors of a whole corpus at the encoder's own max_len (its ONNX
    metadata), encoded in chunks so a person sees progress on large corpora."""
    max_len = onnx_max_len(session)
    parts: list[np.ndarray] = []
    started = time.perf_counter()
    for start in range(0, len(texts), CORPUS_CHUNK):
        parts.append(
            encode(
                session,
                vocab,
                texts[start : start + CORPUS_CHUNK],
                batch_size=batch_size,
                max_len=max_len,
            )
        )
        done = min(start + CORPUS_CHUNK, len(texts))
        rate = done / max(time.perf_counter() - started, 1e-9)
        log(f"encoded {done:,} / {len(texts):,} questions ({rate:,.0f}/s)")
    return np.concatenate(parts) if parts else np.empty((0, 0), np.float32)


def row_cosines(reference: np.ndarray, approx: np.ndarray) -> np.ndarray:
    """float64 [N]: cosine of each row of approx [N, D] with the same row of reference
    [N, D]. A zero row on either side gives 0 (it points nowhere)."""
    reference = np.asarray(reference, np.float64)
    approx = np.asarray(approx, np.float64)
    if reference.ndim != 2 or reference.shape != approx.shape:
        raise ValueError(
            f"need two [N, D] arrays of one shape, got {reference.shape} and {approx.shape}"
        )
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(approx, axis=1)
    dots = (reference * approx).sum(axis=1)
    return np.divide(dots, norms, out=np.zeros(len(dots)), where=norms > 0)


def probe_cosine(
    query_session: ort.InferenceSession,
    document_session: ort.InferenceSession,
    vocab: Vocabulary | WordPieceTokenizer,
    texts: Sequence[str],
    *,
    max_len: int,
) -> float:
    """Mean cosine between a query encoder's and a document encoder's vectors of the same
    questions: near 1 when the query encoder was trained into the document encoder's space
    (a query student), near 0 for an encoder of another space."""
    queries = encode(query_session, vocab, texts, max_len=max_len)
    documents = encode(document_session, vocab, texts, max_len=max_len)
    return float(np.mean(row_cosines(documents, queries)))

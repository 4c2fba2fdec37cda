"""The served re-ranker: a cross-encoder re-orders the first few hits of a search.

The first stage (dense + BM25, `qpr.retrieval.bundle`) finds candidates fast; the
cross-encoder (`qpr.model.cross_encoder`, exported to ONNX) reads the question and each
candidate together and scores the pair. Only the first `top` hits are scored, in one ONNX
Runtime call, and put in the order of their scores; the hits after them follow unchanged.
A hit is never added, dropped or altered: the re-ranker only moves hits within the head.

Files (`qpr.artifacts.RERANK_FILES`, a bundle's ``rerank/`` folder): ``config.json``,
``tokenizer.json`` (`qpr.text.wordpiece`'s format), ``model.onnx`` and, when int8 kept the
float32 ranking at export, ``model.int8.onnx``, which is then the one served.
numpy, onnxruntime and tokenizers only: the query path never imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort

from qpr.artifacts import (
    MAX_LEN_KEY,
    QUANTIZED_FROM,
    RERANK_CONFIG_FILE,
    RERANK_DIR,
    RERANK_INPUT_NAMES,
    RERANK_INT8_FILE,
    RERANK_MODEL_FILE,
    RERANK_OUTPUT_NAME,
    RERANK_TOKENIZER_FILE,
    VOCAB_SHA256_KEY,
)
from qpr.errors import QPRError
from qpr.io import file_sha256
from qpr.retrieval.encoders import batch_dependent, load_session
from qpr.text.vocab import VocabularyError
from qpr.text.wordpiece import WordPieceTokenizer

CONFIG_FORMAT = "qpr-reranker/1"
T = TypeVar("T")


class RerankerError(QPRError, RuntimeError):
    """A re-ranker folder is missing, incomplete, or its files do not belong together."""


def score_pairs(
    session: ort.InferenceSession, token_ids: np.ndarray, token_type_ids: np.ndarray
) -> np.ndarray:
    """float32 [B] logits of int64 [B, L] pair rows (`WordPieceTokenizer.encode_pairs`).

    An int8 copy (`batch_dependent`) scores each pair alone, cut to its own length: its
    activations are scaled per call, so a pair's score would move with the other pairs
    and their padding. The stage's gate, a benchmark and the service then agree."""
    token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    token_type_ids = np.ascontiguousarray(token_type_ids, dtype=np.int64)
    if not batch_dependent(session):
        return _run(session, token_ids, token_type_ids)
    # Padding (id 0) only trails a pair: its length is one past its last word piece.
    lengths = token_ids.shape[1] - np.argmax(token_ids[:, ::-1] != 0, axis=1)
    scores = [
        _run(session, token_ids[i : i + 1, :n], token_type_ids[i : i + 1, :n])
        for i, n in enumerate(lengths.tolist())
    ]
    return np.concatenate(scores) if scores else np.zeros(0, np.float32)


def _run(
    session: ort.InferenceSession, token_ids: np.ndarray, token_type_ids: np.ndarray
) -> np.ndarray:
    feeds = {
        RERANK_INPUT_NAMES[0]: np.ascontiguousarray(token_ids),
        RERANK_INPUT_NAMES[1]: np.ascontiguousarray(token_type_ids),
    }
    return session.run([RERANK_OUTPUT_NAME], feeds)[0]


def reranker_config(*, max_len: int, int8: bool, **extra: Any) -> dict[str, Any]:
    """The content of ``rerank/config.json`` for a trained re-ranker (extra: how it was
    trained, for people; the loader reads only format, enabled, max_len and int8)."""
    return {"format": CONFIG_FORMAT, "enabled": True, "max_len": max_len, "int8": int8, **extra}


def disabled_config() -> dict[str, Any]:
    """``rerank/config.json`` when no re-ranker was trained (rerank.enabled false)."""
    return {"format": CONFIG_FORMAT, "enabled": False}


@dataclass(frozen=True)
class Reranker:
    """A loaded cross-encoder: `rerank` re-orders a search's first hits.

    Build one with `Reranker.load`. Thread-safe (ONNX Runtime sessions allow concurrent
    runs).
    """

    session: ort.InferenceSession
    tokenizer: WordPieceTokenizer
    max_len: int
    path: Path
    int8: bool = False

    @classmethod
    def load(cls, models_dir: str | os.PathLike[str], *, threads: int = 1) -> Reranker:
        """The re-ranker of the bundle in `models_dir` (its ``rerank/`` folder): the int8
        model when the folder has one, else the float32 one. RerankerError naming the file
        when a file is missing or unreadable, or the files do not belong together."""
        root = Path(models_dir)
        config = _read_config(root / RERANK_CONFIG_FILE)
        try:
            tokenizer = WordPieceTokenizer.load(root / RERANK_TOKENIZER_FILE)
        except VocabularyError as exc:
            raise RerankerError(str(exc)) from exc
        model = root / RERANK_MODEL_FILE
        int8 = bool(config.get("int8"))
        path = root / RERANK_INT8_FILE if int8 else model
        session, metadata = _open(path, threads)
        if int8 and metadata.get(QUANTIZED_FROM) != _sha256(model):
            raise RerankerError(f"{path} was not quantised from {model}: export it again")
        if metadata.get(VOCAB_SHA256_KEY) != tokenizer.checksum:
            raise RerankerError(
                f"{path} was trained with tokenizer {str(metadata.get(VOCAB_SHA256_KEY))[:12]}…,"
                f" but {root / RERANK_TOKENIZER_FILE} is {tokenizer.checksum[:12]}…"
            )
        max_len = int(metadata.get(MAX_LEN_KEY, -1))
        if max_len != tokenizer.max_len or max_len != config.get("max_len"):
            raise RerankerError(
                f"{path}: max_len {max_len}, tokenizer {tokenizer.max_len}, "
                f"config {config.get('max_len')}: the files come from different runs"
            )
        return cls(session, tokenizer, max_len, path, int8)

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts)]: the logit of (query, text) for each text, one ONNX call."""
        if not texts:
            return np.zeros(0, np.float32)
        ids, types = self.tokenizer.encode_pairs(
            [query] * len(texts), list(texts), max_len=self.max_len
        )
        return score_pairs(self.session, ids, types)

    def rerank(
        self,
        query: str,
        hits: Sequence[T],
        top: int,
        *,
        text: Callable[[T], str] = lambda hit: hit.text,  # type: ignore[attr-defined]
    ) -> list[T]:
        """`hits` with the first `top` re-ordered by their cross-encoder score, highest
        first (ties keep the first stage's order), and the rest after them unchanged.
        The same objects, none added or dropped; `top` above len(hits) scores them all."""
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        head, tail = list(hits[:top]), list(hits[top:])
        if len(head) < 2:
            return [*head, *tail]
        order = np.argsort(-self.scores(query, [text(h) for h in head]), kind="stable")
        return [*(head[i] for i in order.tolist()), *tail]


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RerankerError(
            f"{path} not found: the bundle has no re-ranker ({RERANK_DIR}/ is written by "
            "the rerank stage)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RerankerError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict) or config.get("format") != CONFIG_FORMAT:
        raise RerankerError(f"{path} is not a {CONFIG_FORMAT} file")
    if not config.get("enabled"):
        raise RerankerError(
            f"{path}: no re-ranker was trained (rerank.enabled was false); "
            "set rerank.enabled: true, or leave rerank_top unset"
        )
    return config


def _open(path: Path, threads: int) -> tuple[ort.InferenceSession, dict[str, str]]:
    try:
        session = load_session(path, threads=threads)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NoSuchFile types
        raise RerankerError(f"cannot load ONNX re-ranker {path}: {exc}") from exc
    inputs = tuple(i.name for i in session.get_inputs())
    outputs = [o.name for o in session.get_outputs()]
    if inputs != RERANK_INPUT_NAMES or RERANK_OUTPUT_NAME not in outputs:
        raise RerankerError(
            f"{path}: inputs {list(inputs)} / outputs {outputs}, expected inputs "
            f"{list(RERANK_INPUT_NAMES)} and output {RERANK_OUTPUT_NAME!r}"
        )
    return session, dict(session.get_modelmeta().custom_metadata_map)


def _sha256(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError as exc:
        raise RerankerError(f"cannot read {path}: {exc}") from exc

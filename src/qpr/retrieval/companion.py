"""A second similarity for the fused search: a packaged static encoder beside the bundle's.

The served ranking scores each candidate by the bundle's dense distance and by BM25
(`qpr.retrieval.hybrid`). A companion adds a third, cheap score to the dense term: the
cosine of the question and the candidate under another encoder, one whose vectors are
sums of fixed token vectors. With weight w the dense term becomes

    (1 - w) · unit(-distance) + w · unit(companion cosine)

each min-max scaled over the query's candidates (`qpr.retrieval.fusion.unit_range`),
then fused with BM25 at α as before. The companion does not find candidates: it only
re-scores the union both retrievers found, so it adds no index search.

Why: two encoders trained on different data err on different questions. On Quora,
WordLlama's vectors beside the product default's static student raised validation P@1
from 0.857 to 0.870 (docs/models.md, "A companion encoder").

Companions (``index.companion``): ``wordllama``, the 256-d token vectors of the
``wordllama`` wheel (l2_supercat), read from the wheel's own files; nothing is
downloaded. A question's vector is the sum of its tokens' vectors, unit length: the
same for a question alone or in a batch, and on any CPU the same float32 bits up to
the last rounding of its norm (each sum adds rows in order).

Arrays: float32 query vectors [Q, D]; document vectors float16 [N, D] on file, float32
in memory; int64 rows (-1 = empty slot); no framework code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qpr.retrieval.fusion import unit_range

__all__ = ["COMPANIONS", "Companion", "StaticEncoder", "load_encoder", "mixed", "mixed_one"]

COMPANIONS = ("wordllama",)
# The wheel's files: the tokenizer (Llama 2's 32,000 tokens, as a `tokenizers` file) and
# the token vectors in the 256-dimension cut the wheel ships (trained so that the first
# dimensions stand alone: Matryoshka).
_WORDLLAMA_TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
_WORDLLAMA_WEIGHTS = Path("weights") / "l2_supercat_256.safetensors"
_BATCHED = 64  # texts from which `encode` tokenizes in one call


class CompanionError(ValueError):
    """A companion that cannot be loaded: an unknown name, or its package is missing."""


@dataclass(frozen=True)
class StaticEncoder:
    """Texts → unit float32 vectors [N, D]: the sum of each text's token vectors.

    tokenizer: a `tokenizers.Tokenizer` (no padding, no truncation, no special tokens);
    table: float32 [V, D] token vectors; name: what the bundle's config calls it."""

    name: str
    tokenizer: object
    table: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), D]: each text's unit vector, computed alone (so a batch
        gives each text the vector it gets by itself). A text with no tokens gets zeros."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string")
        out = np.zeros((len(texts), self.dim), np.float32)
        if not len(texts):
            return out
        if len(texts) < _BATCHED:  # a query or a few: no thread pool to start
            encoded = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        else:
            encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        for i, tokens in enumerate(encoded):
            ids = np.clip(np.asarray(tokens.ids, np.int64), 0, self.table.shape[0] - 1)
            if ids.size:
                # axis 0 of a C-ordered array: each dimension summed row after row, the
                # same order on every CPU (a sum along the last axis is SIMD-width ordered)
                out[i] = self.table[ids].sum(axis=0)
        norms = np.sqrt(np.square(out, dtype=np.float64).sum(axis=1)).astype(np.float32)
        return out / np.where(norms > 0, norms, 1.0)[:, None]

    def documents(self, texts: Sequence[str], batch: int = 4096) -> np.ndarray:
        """float16 [len(texts), D]: the vectors a bundle keeps for its questions."""
        parts = [
            self.encode(texts[s : s + batch]).astype(np.float16)
            for s in range(0, len(texts), batch)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float16)


def load_encoder(name: str) -> StaticEncoder:
    """The companion encoder `name` (one of COMPANIONS), from its installed package's own
    files. CompanionError for an unknown name or a package that is not installed."""
    if name != "wordllama":
        raise CompanionError(f"unknown companion {name!r}; known: {', '.join(COMPANIONS)}")
    import importlib.util

    # Only the wheel's files are read: the package itself is not imported.
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise CompanionError(
            "the wordllama companion needs the `wordllama` package (a dependency of qpr)"
        )
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    package = Path(next(iter(spec.submodule_search_locations)))
    tokenizer = Tokenizer.from_file(str(package / _WORDLLAMA_TOKENIZER))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    weights = load_file(str(package / _WORDLLAMA_WEIGHTS))
    (table,) = weights.values()
    return StaticEncoder(name, tokenizer, np.ascontiguousarray(table, np.float32))


@dataclass(frozen=True)
class Companion:
    """The companion of a served search: its encoder and its vectors of the index's rows
    (float16 [N, D] as stored, row order; held as float32, because converting a query's
    candidates from float16 took twice the rest of the companion's time). Its weight is
    the search config's ``companion_weight``."""

    encoder: StaticEncoder
    vectors: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "vectors", np.ascontiguousarray(self.vectors, np.float32))
        if self.vectors.ndim != 2 or self.vectors.shape[1] != self.encoder.dim:
            raise ValueError(
                f"companion vectors {self.vectors.shape}, the encoder gives {self.encoder.dim}"
            )

    @classmethod
    def load(cls, path: Path, name: str, texts: Sequence[str] | None = None) -> Companion:
        """The companion `name` with the vectors the index stage wrote at `path` (float16
        [N, D]), extended over `texts` (the rows' texts, a delta's after the index's; None:
        the file's rows only). OSError for an unreadable file; ValueError (CompanionError
        among them) for an unknown name, a missing package or vectors that do not fit."""
        companion = cls(load_encoder(name), np.load(path))
        return companion if texts is None else companion.extended(texts)

    @property
    def rows(self) -> int:
        return int(self.vectors.shape[0])

    def extended(self, texts: Sequence[str]) -> Companion:
        """This companion over `texts`, the rows' texts in row order: the rows it holds
        kept, the rows past them (a delta's questions) encoded now."""
        if len(texts) < self.rows:
            raise ValueError(f"{len(texts)} texts for {self.rows} companion rows")
        if len(texts) == self.rows:
            return self
        extra = self.encoder.documents(list(texts[self.rows :])).astype(np.float32)
        return Companion(self.encoder, np.concatenate([self.vectors, extra]))

    def similarities(self, texts: Sequence[str], union: np.ndarray) -> np.ndarray:
        """float32 [Q, U]: each query's cosine with each of its union's rows (int64 [Q, U]),
        -inf at empty (-1) slots."""
        return self.cosines(self.encoder.encode(texts), union)

    def cosines(self, queries: np.ndarray, union: np.ndarray) -> np.ndarray:
        """`similarities` from the queries' vectors (float32 [Q, D], `encoder.encode`), so
        that a search can encode its question while it waits for BM25."""
        union = np.asarray(union, np.int64)
        rows = self.vectors[np.maximum(union, 0)]
        cosines = np.matmul(rows, queries[:, :, None])[:, :, 0]
        return np.where(union >= 0, cosines, np.float32(-np.inf))


def mixed(dense_sims: np.ndarray, companion_sims: np.ndarray, weight: float) -> np.ndarray:
    """float32 [Q, U]: the dense term with a companion, (1 - w)·unit(dense) + w·unit
    (companion), each min-max scaled per query over its finite entries; -inf where the
    dense side has none (an empty slot). weight 0: dense_sims as given."""
    if weight == 0.0:
        return np.asarray(dense_sims, np.float32)
    dense_sims = np.asarray(dense_sims, np.float32)
    both = (np.float32(1.0 - weight) * unit_range(dense_sims)
            + np.float32(weight) * unit_range(np.asarray(companion_sims, np.float32)))  # fmt: skip
    return np.where(np.isfinite(dense_sims), both, -np.inf).astype(np.float32)


def mixed_one(dense_sims: np.ndarray, companion_sims: np.ndarray, weight: float) -> np.ndarray:
    """`mixed` for one question whose candidates are all there (float [U], every entry
    finite: the one-question path's union has no empty slot): the same float32 values,
    without the masks."""
    return np.float32(1.0 - weight) * _unit(dense_sims) + np.float32(weight) * _unit(companion_sims)


def _unit(x: np.ndarray) -> np.ndarray:
    """`unit_range` of one row of finite float32 values: the same arithmetic."""
    x = np.asarray(x, np.float32)
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo) if hi > lo else np.ones_like(x)

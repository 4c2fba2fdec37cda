"""Index a corpus in shards, with bounded memory, on any engine: encode → train → add → BM25.

A corpus is a list of Parquet files (a text column each); row r of the index is the r-th
question of the files read in order. The phases:

1. **encode**: one task a shard, its questions → float32 [n, D] in `<work>/vectors/` (a
   `qpr.io.VectorCache`, one key a shard);
2. **count**: one task a shard, its BM25 term counts → `<work>/counts/`;
3. **FAISS**: one task trains it on a sample drawn evenly from every vector shard, one task
   a shard adds that shard to a copy; the driver assembles the adds in row order into the
   file the one-process build writes (`qpr.retrieval.faiss_shards`; an HNSW graph is built
   in the driver, one shard in memory at a time, `qpr.retrieval.dense.build_index_from_shards`);
4. **BM25**: the counts merged, with the collection's statistics over every shard.

Tasks are functions of small frozen dataclasses that name files, run by a `Mapper`: the
local one here, or Ray's (`flows/engine.py`). A task writes its file atomically, under a
name that holds a digest of its inputs, and returns at once when the file is there: a
retried task (its worker killed) writes the same bytes, and a killed build resumes at the
first shard not yet done. Memory: one shard's vectors and texts, the index being filled,
and the merged BM25 arrays (measured against N in docs/results/scale.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow.parquet as pq

from qpr.io import VectorCache, file_sha256, text_sha256
from qpr.retrieval.bm25 import BM25Index, TermCounts, count_terms
from qpr.retrieval.dense import IndexConfig, VectorShards
from qpr.retrieval.faiss_shards import build_index_on_engine
from qpr.tasks import Mapper, local_map

# ---------------------------------------------------------------- tasks


@dataclass(frozen=True)
class EncodeTask:
    """Encode the `column` of one Parquet shard into `out` (float32 [n, D] .npy)."""

    shard: Path
    column: str
    encoder: Path  # encoder.onnx
    vocab: Path
    out: Path  # KEY.npy in a qpr.io.VectorCache's folder
    fold: bool = True  # a CNN encodes through its folded tables (qpr.retrieval.folded)
    threads: int = 1
    batch_size: int = 1024


@dataclass(frozen=True)
class CountTask:
    """Count the BM25 words of the `column` of one Parquet shard into `out` (.npz)."""

    shard: Path
    column: str
    stemmer: str | None
    out: Path
    analyzer: str = "words"
    ngram: int = 3


def read_texts(shard: Path, column: str) -> list[str]:
    """The shard's questions as str (a missing value is an empty question)."""
    values = pq.read_table(shard, columns=[column]).column(column).to_pylist()
    return ["" if v is None else str(v) for v in values]


@lru_cache(maxsize=2)
def _encoder(encoder: Path, vocab: Path, stamp: tuple[int, int], fold: bool) -> Any:
    """(tokenizer, ONNX session, max_len, folded CNN or None), once per worker process and
    encoder file (`stamp`: its size and mtime, so a replaced file is loaded again)."""
    from qpr.retrieval.encoders import load_session, onnx_max_len
    from qpr.retrieval.folded import checked_fold
    from qpr.text import load_tokenizer

    session = load_session(encoder, threads=1)
    max_len = onnx_max_len(session)
    folded = checked_fold(encoder, session, max_len) if fold else None
    return load_tokenizer(vocab), session, max_len, folded


def encode_shard(task: EncodeTask) -> Path:
    """Run one EncodeTask (skipped when its file exists); the path of the vectors."""
    if task.out.is_file():
        return task.out
    from qpr.retrieval.encoders import encode, load_session

    stat = task.encoder.stat()
    vocab, session, max_len, folded = _encoder(
        task.encoder, task.vocab, (stat.st_size, stat.st_mtime_ns), task.fold
    )
    texts = read_texts(task.shard, task.column)
    if folded is None:
        if task.threads > 1:
            session = load_session(task.encoder, threads=task.threads)
        vectors = encode(session, vocab, texts, batch_size=task.batch_size, max_len=max_len)
    else:
        vectors = _encode_folded(folded, vocab, texts, max_len, task.threads)
    return VectorCache(task.out.parent).put(task.out.stem, vectors)


def _encode_folded(folded: Any, vocab: Any, texts: list[str], max_len: int, threads: int) -> Any:
    """float32 [n, D]: the folded CNN over `threads` slices at once (it releases the GIL).
    A question encodes the same whatever its batch (qpr.retrieval.folded)."""
    sequences = [vocab.encode(t)[:max_len] for t in texts]
    step = 4096
    parts = [sequences[i : i + step] for i in range(0, len(sequences), step)]
    if not parts:
        return np.zeros((0, folded.projection_bias.size), np.float32)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        return np.concatenate(list(pool.map(folded.encode, parts)))


def count_shard(task: CountTask) -> Path:
    """Run one CountTask (skipped when its file exists); the path of the counts."""
    if not task.out.is_file():
        texts = read_texts(task.shard, task.column)
        counts = count_terms(texts, stemmer=task.stemmer, analyzer=task.analyzer, ngram=task.ngram)
        counts.save(task.out)
    return task.out


# ---------------------------------------------------------------- the facade


@dataclass(frozen=True)
class LexicalConfig:
    """BM25 beside the dense index (index.lexical in params.yaml)."""

    enabled: bool = True
    k1: float = 0.9
    b: float = 0.75
    stemmer: str | None = "english"
    analyzer: str = "words"  # or "chars": character n-grams of the words
    ngram: int = 3


@dataclass
class IndexBuild:
    """What `Indexer.index` made: the filled index, BM25 (or None), and its timings."""

    index: faiss.Index
    bm25: BM25Index | None
    rows: int
    seconds: dict[str, float]


@dataclass(frozen=True)
class Indexer:
    """Builds a FAISS index and BM25 over Parquet shards of questions (module docstring)."""

    config: IndexConfig
    encoder: Path
    vocab: Path
    work_dir: Path
    lexical: LexicalConfig = LexicalConfig()
    engine: Mapper = local_map
    seed: int = 13
    fold: bool = True
    threads: int = 2
    batch_size: int = 1024

    def index(
        self,
        shards: Sequence[Path],
        *,
        column: str = "question",
        log: Callable[[str], None] = print,
    ) -> IndexBuild:
        seconds: dict[str, float] = {}
        started = time.perf_counter()
        vectors = VectorShards(self.encode(shards, column=column, log=log))
        seconds["encode"] = time.perf_counter() - started
        started = time.perf_counter()
        index = self.faiss_index(vectors, log=log)
        seconds["faiss"] = time.perf_counter() - started
        bm25 = None
        if self.lexical.enabled:
            started = time.perf_counter()
            bm25 = self.bm25(shards, column=column, log=log)
            seconds["bm25"] = time.perf_counter() - started
        return IndexBuild(index, bm25, len(vectors), seconds)

    def faiss_index(
        self, vectors: VectorShards, *, log: Callable[[str], None] = print
    ) -> faiss.Index:
        """The FAISS index over `vectors`, trained and filled as tasks on the engine, their
        files in `<work>/faiss/` (`qpr.retrieval.faiss_shards.build_index_on_engine`)."""
        return build_index_on_engine(
            vectors,
            self.config,
            seed=self.seed,
            work_dir=self.work_dir / "faiss",
            engine=self.engine,
            log=log,
        )

    @property
    def vectors(self) -> VectorCache:
        """The cache the encode tasks store each shard's vectors in (`vector_keys`)."""
        return VectorCache(self.work_dir / "vectors")

    def vector_keys(self, shards: Sequence[Path], *, column: str = "question") -> list[str]:
        """Each shard's key in `vectors`: a digest of the encoder, the tokenizer, the
        kernel and the shard's content."""
        return [self._name(self._encoder_key, shard, column) for shard in shards]

    def vector_files(self, shards: Sequence[Path], *, column: str = "question") -> list[Path]:
        """Where each shard's vectors are (or will be) (`vectors`, `vector_keys`)."""
        return [self.vectors.path(key) for key in self.vector_keys(shards, column=column)]

    @cached_property
    def _encoder_key(self) -> str:
        """The encoder's part of a vector file's name, hashed once (the ONNX file is
        tens of MB, and `encode` names the files `vector_files` named)."""
        return text_sha256(file_sha256(self.encoder) + file_sha256(self.vocab) + str(self.fold))

    def encode(
        self,
        shards: Sequence[Path],
        *,
        column: str = "question",
        log: Callable[[str], None] = print,
    ) -> list[Path]:
        """The vector file of each shard (encoded now where missing)."""
        # Absolute paths: a worker on another node (or in another directory) reads them.
        tasks = [
            EncodeTask(
                shard.resolve(), column, self.encoder.resolve(), self.vocab.resolve(),
                out.resolve(), fold=self.fold, threads=self.threads, batch_size=self.batch_size,
            )
            for shard, out in zip(shards, self.vector_files(shards, column=column), strict=True)
        ]  # fmt: skip
        log(f"encode: {len(tasks)} shards")
        return self.engine(encode_shard, tasks)

    def bm25(
        self,
        shards: Sequence[Path],
        *,
        column: str = "question",
        log: Callable[[str], None] = print,
    ) -> BM25Index:
        """BM25 over every shard: counted per shard, merged with global statistics."""
        lexical = self.lexical
        terms = f"bm25 {lexical.stemmer}"
        if lexical.analyzer != "words":  # the words' cached counts keep their names
            terms += f" {lexical.analyzer} {lexical.ngram}"
        key = text_sha256(terms)
        tasks = [
            CountTask(
                shard.resolve(),
                column,
                lexical.stemmer,
                self._out("counts", key, shard, column, ".npz").resolve(),
                lexical.analyzer,
                lexical.ngram,
            )
            for shard in shards
        ]
        log(f"BM25: counting the words of {len(tasks)} shards")
        parts = [TermCounts.load(p) for p in self.engine(count_shard, tasks)]
        return BM25Index.from_counts(parts, k1=lexical.k1, b=lexical.b)

    def _out(self, kind: str, key: str, shard: Path, column: str, suffix: str) -> Path:
        """A task's file: named by its shard's content digest, so a changed shard is redone."""
        return self.work_dir / kind / f"{self._name(key, shard, column)}{suffix}"

    @staticmethod
    def _name(key: str, shard: Path, column: str) -> str:
        return f"{shard.stem}-{text_sha256(f'{key} {file_sha256(shard)} {column}')[:24]}"

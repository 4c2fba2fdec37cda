"""FAISS index: build, save, load, search, and the checks a gate runs on it.

Conventions (faiss' own, kept throughout):

- vectors and queries are ``float32 [N, D]`` / ``float32 [Q, D]``, C-contiguous;
- a *row* is the position of a vector in the matrix the index was built from
  (``int64``, ``0 <= row < N``); ``-1`` is FAISS's "nothing here" and stays ``-1``;
- search returns ``(distances float32 [Q, k], rows int64 [Q, k])`` in rank order.
  For ``metric="l2"`` a distance is a *squared* L2 distance (lower = closer); for
  ``metric="ip"`` it is an inner product (higher = closer): see `higher_is_better`.

Why rows and a separate `IdMap` instead of ``IndexIDMap`` / ``add_with_ids``: the row is
what the gate and the self-exclusion need (``vectors[row]``), Flat and HNSW indexes accept
custom ids only through a wrapper, and a plain ``int64`` ``.npy`` beside the index is
readable by anything (serving, notebooks) without loading FAISS.

Library code: no Prefect or MLflow here; progress goes to the ``log`` callable.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from qpr.config import IndexSettings
from qpr.io import atomic_path, save_numpy_atomic

__all__ = [
    "EXACT_SCAN_ROWS",
    "MIN_POINTS_PER_CENTROID",
    "IdMap",
    "IndexConfig",
    "RowSelector",
    "VectorShards",
    "build_index",
    "build_index_from_shards",
    "checked_finite",
    "drop_excluded",
    "ef_search_of",
    "exact_recall_at_k",
    "exact_twin",
    "finish_index",
    "fit_factory",
    "gpu_available",
    "higher_is_better",
    "load_index",
    "new_index",
    "nlist_of",
    "recall_against",
    "refine_k_factor_of",
    "save_index",
    "search",
    "self_retrieval_rate",
    "set_ef_search",
    "set_nprobe",
    "set_refine_k_factor",
    "stored_dim",
    "training_points",
    "training_sample",
    "use_per_query_scan",
]

# FAISS's k-means warns below 39 training points per centroid (ClusteringParameters
# min_points_per_centroid): with fewer, centroids are poorly placed and lists unbalanced.
MIN_POINTS_PER_CENTROID = 39

_METRICS = {"l2": faiss.METRIC_L2, "ip": faiss.METRIC_INNER_PRODUCT}

# `search` asks a refine index ("...,RFlat") for at least MIN_REFINED_K results (then keeps
# k) and re-ranks k_factor·min(k, REFINE_BASE_K) candidates exactly (see _refined_search).
MIN_REFINED_K = 10
REFINE_BASE_K = 20

# FAISS's IVF fast-scan kernel "search_implem_10" with a reservoir: see use_per_query_scan.
PER_QUERY_SCAN = 11

# A filtered `search` with at most this many allowed rows scores them all exactly: an IVF
# probe or an HNSW walk meets few of them, and 2,048 distances cost well under a millisecond.
EXACT_SCAN_ROWS = 2048

# "IVF2000" as a whole component: "IVF2000,Flat", "IVF2000_HNSW32,Flat", "OPQ16,IVF2000,PQ16".
_IVF = re.compile(r"(?<![A-Za-z0-9])IVF(\d+)(?=[_,(]|$)")
# "PQ16", "PQ16x8", "PQ16np" as a component (not "OPQ16_64", which is a transform).
_PQ = re.compile(r"(?:^|,)PQ(\d+)(?:x(\d+))?")


# ---------------------------------------------------------------- factory strings


def fit_factory(factory: str, n_train: int, d: int | None = None) -> tuple[str, str | None]:
    """Rewrite a factory string so that it can be trained on ``n_train`` vectors of
    dimension ``d``.

    Rules: an ``IVF{nlist}`` component with ``n_train < 39 * nlist`` becomes
    ``IVF{max(1, n_train // 39)}``: the largest nlist FAISS trains without its
    "too few training points" warning, so inverted lists stay as fine as the data allows
    (IVF2000 with 30,000 vectors → IVF769). A ``PQ{m}`` component whose m does not divide
    ``d`` (when given) becomes the largest divisor of d below m (PQ150 on 128-d vectors →
    PQ128), so one factory string serves every embedding size. Everything else is kept.

    Fewer vectors than FAISS's 39 a centroid for a PQ codebook of 2**nbits centroids (624
    for 4-bit codes, 9,984 for 8-bit; below that FAISS trains it badly and warns once per
    sub-quantizer): ``Flat``, exact search, which is what so small a corpus needs anyway.

    Returns ``(factory, note)``; ``note`` is a human sentence when something was changed,
    else None.
    """
    factory = ",".join(part.strip() for part in factory.split(","))
    if not factory:
        raise ValueError("empty FAISS factory string")
    if n_train < 1:
        raise ValueError("cannot build an index from 0 vectors")
    note = None
    match = _IVF.search(factory)
    if match:
        nlist = int(match.group(1))
        needed = MIN_POINTS_PER_CENTROID * nlist
        if nlist < 1:
            raise ValueError(f"{factory!r}: nlist must be at least 1")
        if n_train < needed:
            new_nlist = max(1, n_train // MIN_POINTS_PER_CENTROID)
            factory = f"{factory[: match.start(1)]}{new_nlist}{factory[match.end(1) :]}"
            note = (
                f"IVF{nlist} needs {needed:,} training vectors, have {n_train:,}: "
                f"using IVF{new_nlist}"
            )
    pq = _PQ.search(factory)
    if pq and d is not None and d % int(pq.group(1)) != 0:
        m = int(pq.group(1))
        fitted_m = max(q for q in range(1, min(m, d) + 1) if d % q == 0)
        factory = f"{factory[: pq.start(1)]}{fitted_m}{factory[pq.end(1) :]}"
        change = f"PQ{m} needs a dimension divisible by {m}, have {d}: using PQ{fitted_m}"
        note = change if note is None else f"{note}; {change}"
    for pq in _PQ.finditer(factory):
        nbits = int(pq.group(2) or 8)
        needed = MIN_POINTS_PER_CENTROID * 2**nbits
        if n_train < needed:
            # So few questions are searched exactly in no time: no codebook to train.
            return "Flat", (
                f"{factory}: a PQ codebook of 2**{nbits} centroids needs at least "
                f"{needed:,} training vectors, have {n_train:,}: using exact search (Flat)"
            )
    return factory, note


# ---------------------------------------------------------------- GPU / parameters


def gpu_available() -> bool:
    """True when this faiss build sees a CUDA device (faiss-cpu: always False)."""
    get = getattr(faiss, "get_num_gpus", None)
    try:
        return bool(get and get() > 0)
    except RuntimeError:  # a GPU build on a machine whose driver is missing
        return False


def _is_gpu_index(index: faiss.Index) -> bool:
    return type(index).__name__.startswith("GpuIndex") or (
        hasattr(faiss, "GpuIndex") and isinstance(index, faiss.GpuIndex)
    )


def _to_gpu(index: faiss.Index) -> faiss.Index:
    res = faiss.StandardGpuResources()
    gpu_index = faiss.index_cpu_to_gpu(res, 0, index)
    # The GPU index only borrows `res`: keep it alive as long as the index.
    refs = list(getattr(gpu_index, "referenced_objects", None) or [])
    gpu_index.referenced_objects = [*refs, res]
    return gpu_index


def _to_cpu(index: faiss.Index) -> faiss.Index:
    return faiss.index_gpu_to_cpu(index) if _is_gpu_index(index) else index


def higher_is_better(index: faiss.Index) -> bool:
    """True when the index's search "distances" are similarities (inner product)."""
    return index.metric_type == faiss.METRIC_INNER_PRODUCT


def set_nprobe(index: faiss.Index, nprobe: int) -> bool:
    """Set nprobe on an IVF index, also inside a pre-transform or on GPU.

    Returns False (and changes nothing) for indexes without inverted lists (Flat, HNSW),
    so callers can pass the params value unconditionally.
    """
    if nprobe < 1:
        raise ValueError(f"nprobe must be >= 1, got {nprobe}")
    space = (
        faiss.GpuParameterSpace()
        if _is_gpu_index(index) and hasattr(faiss, "GpuParameterSpace")
        else faiss.ParameterSpace()
    )
    try:
        space.set_index_parameter(index, "nprobe", nprobe)
    except RuntimeError:  # "could not set parameter nprobe": not an IVF index
        return False
    return True


def _hnsw(index: faiss.Index) -> faiss.IndexHNSW | None:
    """The HNSW graph index inside ``index`` (top level or behind a pre-transform), or None."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    return inner if isinstance(inner, faiss.IndexHNSW) else None


def set_ef_search(index: faiss.Index, ef_search: int) -> bool:
    """Set efSearch (candidates kept while walking the graph) on an HNSW index.

    The HNSW counterpart of nprobe: recall and query time both grow with it. Returns
    False (and changes nothing) for indexes without a top-level HNSW graph (Flat, IVF),
    so callers can pass the params value unconditionally.
    """
    if ef_search < 1:
        raise ValueError(f"ef_search must be >= 1, got {ef_search}")
    graph = _hnsw(index)
    if graph is None:
        return False
    graph.hnsw.efSearch = int(ef_search)
    return True


def nlist_of(index: faiss.Index) -> int | None:
    """The number of inverted lists of an IVF index (also wrapped); None for others."""
    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:  # Flat, HNSW: no inverted lists
        return None


def ef_search_of(index: faiss.Index) -> int | None:
    """The efSearch an HNSW index searches with (stored in its file); None for others."""
    graph = _hnsw(index)
    return int(graph.hnsw.efSearch) if graph is not None else None


def use_per_query_scan(index: faiss.Index) -> bool:
    """Make an IVF fast-scan index (``...x4fs`` codes) scan for one query at a time.

    FAISS's own choice (``implem`` 0) picks kernels that group the queries of a search by
    inverted list. On the 134k-question Quora index (``IVF1024,PQ150x4fs,RFlat``, nprobe
    192) the per-query kernel that keeps its results in a reservoir (``implem`` 11) was
    faster for every batch size tried, 1 to 2,048 queries on 1 or 2 threads: 0.29-0.30
    against 0.34-0.35 ms for one question's top 20 (160 candidates re-ranked), and for
    the codes' top 80 alone 0.158 against 0.178 ms a query in batches of 2,048 on one
    thread. It finds the same rows.
    Not stored in the index file: set it after reading one. Returns False (and changes
    nothing) for other indexes.
    """
    if _is_gpu_index(index):
        return False
    try:
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:  # no inverted lists
        return False
    if not isinstance(ivf, faiss.IndexIVFFastScan):
        return False
    ivf.implem = PER_QUERY_SCAN
    return True


def _refine(index: faiss.Index) -> faiss.IndexRefine | None:
    """The exact re-ranking wrapper (factory suffix ``,RFlat``) around ``index``, or None."""
    inner = faiss.downcast_index(index)
    return inner if isinstance(inner, faiss.IndexRefine) else None


def _flat_storage(index: faiss.Index) -> faiss.IndexFlat | None:
    """The IndexFlat holding ``index``'s exact vectors in row order (Flat itself, the
    re-ranking store of ``…,RFlat``, HNSW…,Flat's storage), or None."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexRefine):
        inner = faiss.downcast_index(inner.refine_index)
    elif isinstance(inner, faiss.IndexHNSW):
        inner = faiss.downcast_index(inner.storage)
    return inner if isinstance(inner, faiss.IndexFlat) and inner.ntotal == index.ntotal else None


def stored_vectors(index: faiss.Index) -> np.ndarray:
    """float32 [ntotal, D]: the exact vectors ``index`` holds, in row order (Flat, ``…,RFlat``,
    HNSW…,Flat, IVF…,Flat). ValueError for an index that keeps only compressed codes."""
    flat = _flat_storage(index)
    if flat is not None:
        return flat.reconstruct_n(0, flat.ntotal)
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if isinstance(faiss.downcast_index(ivf) if ivf is not None else None, faiss.IndexIVFFlat):
        ivf.make_direct_map()
        return index.reconstruct_n(0, index.ntotal)
    raise ValueError(
        f"{type(faiss.downcast_index(index)).__name__} keeps no exact vectors; use a factory "
        "with exact storage (…,RFlat, Flat, HNSW…,Flat, IVF…,Flat)"
    )


def set_refine_k_factor(index: faiss.Index, k_factor: float) -> bool:
    """Set how many candidates per wanted result an ``...,RFlat`` index re-ranks exactly.

    A compressed index (PQ fast-scan) returns k·k_factor candidates, whose exact distances
    then decide the k results: recall grows with it at little cost (a few hundred exact
    distances). Returns False (and changes nothing) for indexes without a refine step.
    """
    if k_factor < 1:
        raise ValueError(f"refine k_factor must be >= 1, got {k_factor}")
    refine = _refine(index)
    if refine is None:
        return False
    refine.k_factor = float(k_factor)
    return True


def refine_k_factor_of(index: faiss.Index) -> float | None:
    """The k_factor an ``...,RFlat`` index re-ranks with (stored in its file); else None."""
    refine = _refine(index)
    return float(refine.k_factor) if refine is not None else None


def seed_training(index: faiss.Index, seed: int) -> None:
    """Seed every k-means FAISS will run while training `index` (IVF and PQ codebooks).

    FAISS's default seed is already fixed (1234); setting it from params makes the
    seed part of the experiment rather than a library constant.
    """
    try:
        # downcast: extract_index_ivf returns the IndexIVF base, which hides `.pq`
        target = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:  # not IVF (Flat, PQ, HNSW) or a GPU index
        target = index
    if hasattr(target, "cp"):
        target.cp.seed = seed
    pq = getattr(target, "pq", None)
    if pq is not None:
        pq.cp.seed = seed


# ---------------------------------------------------------------- build / save / load


def _as_matrix(x: np.ndarray, name: str, d: int | None = None) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D float32 [n, d], got shape {x.shape}")
    if d is not None and x.shape[1] != d:
        raise ValueError(f"{name} have dimension {x.shape[1]}, the index has {d}")
    return x


@dataclass(frozen=True)
class IndexConfig:
    """How `build_index` builds an index.

    factory : a FAISS index_factory string ("IVF2000,Flat" as in the paper, "Flat",
        "IVF256,PQ32", "HNSW32", ...). IVF nlist is lowered when there are too few vectors
        to train it, see `fit_factory`; the change is logged.
    nprobe : inverted lists visited per query (ignored, with a log line, for non-IVF).
    metric : "l2" (squared euclidean, lower = closer) or "ip" (inner product, higher =
        closer; normalise the vectors first for cosine).
    use_gpu : None = on GPU when faiss sees one; True = ask for it (falls back to CPU with
        a log line on faiss-cpu); False = CPU.
    ef_search, ef_construction : for HNSW indexes (ignored otherwise): candidates kept per
        query, and per insertion while building. A graph built with a larger
        ef_construction reaches a given recall with a smaller (faster) ef_search.
    refine_k_factor : for ``...,RFlat`` indexes (ignored otherwise): candidates re-ranked
        with exact distances per wanted result, see `set_refine_k_factor`.
    """

    factory: str
    nprobe: int
    metric: str = "l2"
    use_gpu: bool | None = None
    ef_search: int = 256
    ef_construction: int = 200
    refine_k_factor: float = 8.0

    @classmethod
    def from_settings(cls, index: IndexSettings, *, factory: str | None = None) -> IndexConfig:
        """params.yaml's index section; `factory` replaces its factory (e.g. "Flat")."""
        return cls(
            factory or index.factory,
            nprobe=index.nprobe,
            use_gpu=index.use_gpu,
            ef_search=index.ef_search,
            ef_construction=index.ef_construction,
            refine_k_factor=index.refine_k_factor,
        )


class VectorShards:
    """Vectors stored as .npy shards (row r of the whole = the r-th row of the shards read
    in order), read one shard or a few rows at a time: what an index of millions is built
    from without all its vectors in memory."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        if not paths:
            raise ValueError("no vector shards")
        self.paths = [Path(p) for p in paths]
        shapes = [np.load(p, mmap_mode="r").shape for p in self.paths]
        dims = {shape[1] for shape in shapes if len(shape) == 2}
        if len(dims) != 1 or any(len(shape) != 2 for shape in shapes):
            raise ValueError(f"vector shards must be float32 [n, D] of one D, got {shapes}")
        self.dim = dims.pop()
        self.starts = np.cumsum([0] + [shape[0] for shape in shapes])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def chunks(self) -> Iterator[np.ndarray]:
        """Each shard, float32 [n, D], one in memory at a time."""
        for path in self.paths:
            yield np.ascontiguousarray(np.load(path), dtype=np.float32)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 [len(rows), D]: the vectors of `rows` (int64, any order)."""
        rows = np.asarray(rows, np.int64)
        out = np.empty((rows.size, self.dim), np.float32)
        shard = np.searchsorted(self.starts, rows, side="right") - 1
        for s in np.unique(shard):
            mine = shard == s
            part = np.load(self.paths[s], mmap_mode="r")
            out[mine] = part[rows[mine] - self.starts[s]]
        return out

    def sample(self, want: int, seed: int) -> np.ndarray:
        """float32 [min(want, N), D]: every row in order when want >= N, else rows drawn
        without replacement (seeded) and kept in row order."""
        n = len(self)
        if want >= n:
            return np.concatenate(list(self.chunks()))
        chosen = np.sort(np.random.default_rng(seed).choice(n, size=want, replace=False))
        return self.rows(chosen)


def build_index(
    vectors: np.ndarray,
    config: IndexConfig,
    *,
    seed: int,
    log: Callable[[str], None] = print,
) -> faiss.Index:
    """Train an index on ``vectors`` (float32 [N, D], finite) as ``config`` says and add
    them all (row r = ``vectors[r]``).

    seed : k-means seed for the coarse quantizer and PQ codebooks: same vectors, same
        seed → same index. HNSW vectors are added on one thread: FAISS's parallel insertion
        order, hence the graph, differs from run to run, and a pipeline stage must give the
        same index for the same inputs.
    log : where progress lines go.

    Returns the trained, filled index: a GPU index when built on GPU (`save_index`
    stores it as a CPU index), else a CPU index.
    """
    vectors = _as_matrix(vectors, "vectors")
    if vectors.shape[0] == 0:
        raise ValueError("cannot build an index from 0 vectors")
    if not np.isfinite(vectors).all():
        raise ValueError("vectors contain NaN or inf")
    n, d = vectors.shape
    return _built(config, n, d, lambda _nlist: vectors, lambda: iter([vectors]), seed, log)


def build_index_from_shards(
    shards: VectorShards,
    config: IndexConfig,
    *,
    seed: int,
    log: Callable[[str], None] = print,
) -> faiss.Index:
    """`build_index` over vectors in shards, one shard in memory at a time (plus the
    training sample, `training_sample`: every vector on corpora up to a few hundred
    thousand, then the same index as `build_index` over them all). Each shard is checked
    finite as it is added."""

    def checked() -> Iterator[np.ndarray]:
        for chunk in shards.chunks():
            yield checked_finite(chunk)

    return _built(
        config,
        len(shards),
        shards.dim,
        lambda nlist: training_sample(shards, nlist, seed),
        checked,
        seed,
        log,
    )


def checked_finite(chunk: np.ndarray) -> np.ndarray:
    """`chunk`, or ValueError when it holds a NaN or an inf."""
    if not np.isfinite(chunk).all():
        raise ValueError("vectors contain NaN or inf")
    return chunk


# FAISS's k-means subsamples to 256 points a centroid (ClusteringParameters
# max_points_per_centroid). A pass costs points × nlist × D: past 2^31 points·lists (80 s of
# training for nlist 4,096 on 2 cores) a sharded build draws fewer, down to FAISS's floor of
# 39 a list (16,384 lists at 10M questions: 639k points).
TRAIN_BUDGET = 2**31


def training_points(n: int, nlist: int) -> int:
    """Vectors an IVF index of `nlist` lists over `n` is trained on, in a sharded build."""
    budget = max(MIN_POINTS_PER_CENTROID * nlist, TRAIN_BUDGET // nlist)
    return min(n, 256 * nlist, budget)


def training_sample(shards: VectorShards, nlist: int | None, seed: int) -> np.ndarray:
    """What a sharded build trains an index of `nlist` lists on (None: no lists, every
    vector): `training_points` of them, drawn by `VectorShards.sample`."""
    n = len(shards)
    return shards.sample(n if nlist is None else training_points(n, nlist), seed)


def new_index(
    config: IndexConfig, n: int, d: int, *, seed: int, log: Callable[[str], None] = print
) -> tuple[faiss.Index, str]:
    """(the untrained CPU index `config` describes for `n` vectors of `d` dimensions, its
    factory as fitted by `fit_factory`, whose note is logged). Its k-means are seeded."""
    if n == 0:
        raise ValueError("cannot build an index from 0 vectors")
    if config.metric not in _METRICS:
        raise ValueError(f"metric must be one of {sorted(_METRICS)}, got {config.metric!r}")
    fitted, note = fit_factory(config.factory, n, d)
    if note:
        log(note)
    index = faiss.index_factory(d, fitted, _METRICS[config.metric])
    seed_training(index, seed)
    return index, fitted


def _built(
    config: IndexConfig,
    n: int,
    d: int,
    training: Callable[[int | None], np.ndarray],
    chunks: Callable[[], Iterator[np.ndarray]],
    seed: int,
    log: Callable[[str], None],
) -> faiss.Index:
    """The index `config` describes, trained on `training(nlist)` (float32 [n', D]; nlist
    None for an index without lists) and filled with `chunks()` in row order."""
    index, fitted = new_index(config, n, d, seed=seed, log=log)
    index, on_gpu = _placed(index, fitted, config.use_gpu, seed, log)
    graph = _hnsw(index)
    if graph is not None:
        graph.hnsw.efConstruction = int(config.ef_construction)
    started = time.perf_counter()
    if not index.is_trained:
        index.train(training(nlist_of(index)))
    trained = time.perf_counter()
    # A graph is inserted on one thread: parallel insertion links in thread order, and the
    # same command must give the same graph
    one = faiss_threads(1) if graph is not None else contextlib.nullcontext()
    with one:
        for chunk in chunks():
            if graph is not None:
                _add_with_progress(index, chunk, log)
            else:
                index.add(chunk)
            if n > chunk.shape[0]:
                log(f"  added {index.ntotal:,} / {n:,} vectors")
    added = time.perf_counter()
    timing = f"train {trained - started:.2f} s, add {added - trained:.2f} s"
    finish_index(index, config, fitted, log, where="GPU" if on_gpu else "CPU", timing=timing)
    return index


def _placed(
    index: faiss.Index, fitted: str, use_gpu: bool | None, seed: int, log: Callable[[str], None]
) -> tuple[faiss.Index, bool]:
    """(`index` on the GPU when `use_gpu` asks and FAISS sees one, else as it is; on GPU)."""
    if use_gpu is False:
        return index, False
    if not gpu_available():
        if use_gpu:
            log("GPU requested but faiss sees no GPU (faiss-cpu or no device): using CPU")
        return index, False
    try:
        index = _to_gpu(index)
    except RuntimeError as err:  # e.g. HNSW has no GPU implementation
        log(f"{fitted} cannot run on GPU ({str(err).splitlines()[0]}): using CPU")
        return index, False
    seed_training(index, seed)  # the GPU copy has its own clustering parameters
    return index, True


def finish_index(
    index: faiss.Index,
    config: IndexConfig,
    fitted: str,
    log: Callable[[str], None],
    *,
    where: str,
    timing: str,
) -> None:
    """Set the search knobs `config` names on a filled index (nprobe, the per-query scan,
    efSearch, the refine width) and log what was built: `fitted`, its factory, `where`
    ("CPU") and `timing` ("train 1.00 s, add 2.00 s")."""
    nprobe, ef_search = config.nprobe, config.ef_search
    probing = set_nprobe(index, nprobe)
    use_per_query_scan(index)
    walking = set_ef_search(index, ef_search)
    refining = set_refine_k_factor(index, config.refine_k_factor)
    if not probing and not walking:
        log(f"{fitted} has no inverted lists: nprobe={nprobe} ignored")
    log(
        f"built {fitted} ({config.metric}, {where}) on {index.ntotal:,} x {index.d} vectors: "
        + timing
        + (f", nprobe {nprobe}" if probing else "")
        + (f", efConstruction {config.ef_construction}, efSearch {ef_search}" if walking else "")
        + (f", exact re-ranking of {config.refine_k_factor:g}x k candidates" if refining else "")
    )


def _add_with_progress(
    index: faiss.Index, vectors: np.ndarray, log: Callable[[str], None], chunk: int = 20_000
) -> None:
    """index.add in chunks with a progress line each: an HNSW graph over 100k+ vectors
    takes minutes on one thread. Fixed chunks on one thread keep the graph a pure
    function of the vectors (FAISS inserts each chunk level by level; levels come from
    the index's own seeded generator)."""
    n = vectors.shape[0]
    started = time.perf_counter()
    for lo in range(0, n, chunk):
        index.add(vectors[lo : lo + chunk])
        done = min(lo + chunk, n)
        if n > chunk:
            rate = done / max(time.perf_counter() - started, 1e-9)
            log(f"  graph: {done:,} / {n:,} vectors ({rate:,.0f}/s)")


def save_index(index: faiss.Index, path: str | os.PathLike[str]) -> Path:
    """Write ``index`` to ``path`` as a CPU index (GPU indexes are copied back first).

    The file appears atomically (temp file + rename), so a server reloading it never reads
    a half-written index.
    """
    path = Path(path)
    with atomic_path(path) as tmp:
        faiss.write_index(_to_cpu(index), str(tmp))
    return path


def load_index(
    path: str | os.PathLike[str],
    *,
    nprobe: int | None,
    ef_search: int | None = None,
    use_gpu: bool | None = False,
) -> faiss.Index:
    """Read an index written by `save_index` and set its nprobe (not stored by FAISS's
    writer for every index type, and a serving knob anyway; None keeps the file's) and,
    when given, its efSearch (HNSW; None keeps the value stored in the file). The search
    kernel FAISS does not store is set too (`use_per_query_scan`).

    ``use_gpu``: False (default: serving and evaluation on CPU), None = GPU when present,
    True = GPU, falling back to CPU on faiss-cpu.
    """
    index = faiss.read_index(str(path))
    if use_gpu is not False and gpu_available():
        # no GPU implementation for this index type (HNSW): stay on CPU
        with contextlib.suppress(RuntimeError):
            index = _to_gpu(index)
    if nprobe is not None:
        set_nprobe(index, nprobe)
    use_per_query_scan(index)
    if ef_search is not None:
        set_ef_search(index, ef_search)
    return index


def stored_dim(path: str | os.PathLike[str]) -> int | None:
    """The vector width a FAISS index file holds, from its first 8 bytes, without reading
    the index (which may be gigabytes): every float index FAISS writes starts with its
    4-byte type code, then the width as int32. None when the file is missing or too short."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    if len(head) < 8:
        return None
    dim = int(np.frombuffer(head[4:], "<i4")[0])
    return dim if dim > 0 else None


@dataclass(frozen=True, eq=False)
class IdMap:
    """Row ↔ question id. ``qids`` is int64 [N]: index row r holds question ``qids[r]``.

    Stored beside the index as ``<index stem>.ids.npy`` (see `path_for`): a plain int64
    array, loadable without FAISS or pandas.
    """

    qids: np.ndarray
    _order: np.ndarray = field(init=False, repr=False)  # argsort of qids, for to_rows

    def __post_init__(self) -> None:
        qids = np.asarray(self.qids)
        if qids.ndim != 1 or not np.issubdtype(qids.dtype, np.integer):
            raise ValueError(f"qids must be 1-D integers, got {qids.dtype} {qids.shape}")
        qids = np.ascontiguousarray(qids, dtype=np.int64)
        order = np.argsort(qids, kind="stable")
        if qids.size and (np.diff(qids[order]) == 0).any():
            raise ValueError("qids must be unique: one question per index row")
        object.__setattr__(self, "qids", qids)
        object.__setattr__(self, "_order", order)

    def __len__(self) -> int:
        return int(self.qids.size)

    def to_qids(self, rows: np.ndarray) -> np.ndarray:
        """int64 rows (any shape) → int64 question ids; -1 (no result) stays -1."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and rows.max(initial=-1) >= len(self):
            raise IndexError(f"row {int(rows.max())} out of range for {len(self)} rows")
        out = np.full(rows.shape, -1, dtype=np.int64)
        hit = rows >= 0
        out[hit] = self.qids[rows[hit]]
        return out

    def to_rows(self, qids: np.ndarray) -> np.ndarray:
        """int64 question ids (any shape) → int64 rows; an id not in the index gives -1."""
        qids = np.asarray(qids, dtype=np.int64)
        order = self._order
        if len(self) == 0:
            return np.full(qids.shape, -1, dtype=np.int64)
        sorted_qids = self.qids[order]
        pos = np.clip(np.searchsorted(sorted_qids, qids), 0, len(self) - 1)
        found = sorted_qids[pos] == qids
        return np.where(found, order[pos], -1).astype(np.int64)

    @staticmethod
    def path_for(index_path: str | os.PathLike[str]) -> Path:
        """models/index.faiss → models/index.ids.npy"""
        p = Path(index_path)
        return p.with_name(f"{p.stem}.ids.npy")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the ids to ``path`` atomically (a plain int64 .npy)."""
        return save_numpy_atomic(path, self.qids)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> IdMap:
        return cls(np.load(Path(path), allow_pickle=False))


# ---------------------------------------------------------------- search


def drop_excluded(
    scores: np.ndarray, rows: np.ndarray, exclude: np.ndarray | None, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cut k+1 results per query down to k, removing ``exclude[i]`` from query i.

    scores: [Q, k+1] any dtype; rows: int64 [Q, k+1] in rank order; exclude: int64 [Q]
    (a negative value excludes nothing). Where the excluded row is absent the last
    result is dropped instead, so every query keeps its best k in order.
    """
    q, width = rows.shape
    if exclude is None:
        return scores[:, :k], rows[:, :k]
    exclude = np.asarray(exclude, dtype=np.int64)
    if exclude.shape != (q,):
        raise ValueError(f"exclude must be int64 [{q}], got shape {exclude.shape}")
    drop = (rows == exclude[:, None]) & (exclude[:, None] >= 0)
    # FAISS never returns a real row twice, so a query has at most one match.
    no_match = ~drop.any(axis=1)
    drop[no_match, width - 1] = True
    keep = ~drop
    kept = width - 1
    scores = scores[keep].reshape(q, kept)[:, :k]
    rows = rows[keep].reshape(q, kept)[:, :k]
    return scores, rows


def search(
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    *,
    exclude: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest rows for each query.

    queries : float32 [Q, D].
    exclude : int64 [Q] or None. ``exclude[i] >= 0`` removes that row from query i's
        results (a query that is itself in the index must not find itself): k+1 are
        asked for and one dropped. ``-1`` excludes nothing.
    allowed : bool [ntotal] or None (every row). Only rows with True are returned, and
        they are found inside the search (a FAISS selector: IVF lists and HNSW graphs are
        walked as usual, other rows skipped), not by asking for more and dropping. At most
        `EXACT_SCAN_ROWS` allowed rows are scored exactly instead (`_scan_allowed`).

    Returns ``(distances float32 [Q, k], rows int64 [Q, k])`` in rank order. Where fewer
    than k rows could be found (small index, few lists probed), rows are -1 with FAISS's
    sentinel distance; callers treat them as misses.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    queries = _as_matrix(queries, "queries", index.d)
    ask = k + 1 if exclude is not None else k
    if allowed is not None:
        allowed = _checked_mask(allowed, index.ntotal)
    with _threads_for(queries.shape[0]):
        if allowed is not None and (int(allowed.sum()) <= EXACT_SCAN_ROWS or _is_gpu_index(index)):
            distances, rows = _scan_allowed(index, queries, ask, allowed)
            return _finished(distances, rows, exclude, k)
        selector = None if allowed is None else RowSelector(allowed)
        refine = _refine(index)
        if refine is None:
            params = None if selector is None else selector.params(index)
            distances, rows = index.search(queries, ask, params=params)
        else:
            distances, rows = _refined_search(refine, queries, ask, selector)
    return _finished(distances, rows, exclude, k)


@contextlib.contextmanager
def faiss_threads(n: int) -> Iterator[None]:
    """FAISS's OpenMP limit of the calling thread set to `n` (at least 1) meanwhile, the
    caller's own put back after. libgomp keeps the limit per thread, so a service's request
    threads and a build's workers each set their own (`qpr.serve.openmp`)."""
    before = faiss.omp_get_max_threads()
    n = max(1, int(n))
    if before == n:
        yield
        return
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _threads_for(queries: int) -> contextlib.AbstractContextManager[None]:
    """One OpenMP thread for a single query, as the service runs it; a batch keeps the
    caller's limit.

    Why: FAISS splits a search by query, so one query runs on one thread whatever the
    limit, and a second thread only spins after it. In a fused search that spinning took
    the core BM25's worker needed: about 0.1 ms a Quora question (docs/scale.md)."""
    return faiss_threads(1) if queries == 1 else contextlib.nullcontext()


def _finished(
    distances: np.ndarray, rows: np.ndarray, exclude: np.ndarray | None, k: int
) -> tuple[np.ndarray, np.ndarray]:
    distances, rows = drop_excluded(distances, rows.astype(np.int64, copy=False), exclude, k)
    return np.ascontiguousarray(distances, dtype=np.float32), np.ascontiguousarray(rows)


class RowSelector:
    """An ``allowed`` mask as FAISS's selector (a bitmap, one bit a row) and the search
    parameters that carry it. The bitmap must outlive the search: FAISS keeps a pointer."""

    def __init__(self, allowed: np.ndarray) -> None:
        self._bits = np.packbits(allowed, bitorder="little")
        self.selector = faiss.IDSelectorBitmap(allowed.size, faiss.swig_ptr(self._bits))

    def params(self, index: faiss.Index) -> faiss.SearchParameters:
        """`index`'s own depth (nprobe, efSearch) with the selector: parameters passed to
        a search replace the index's, so they must carry its depth too."""
        graph = _hnsw(index)
        if graph is not None:
            params = faiss.SearchParametersHNSW()
            params.efSearch = graph.hnsw.efSearch
        else:
            try:
                ivf = faiss.extract_index_ivf(index)
            except RuntimeError:  # Flat: no lists
                ivf = None
            params = faiss.SearchParameters() if ivf is None else faiss.SearchParametersIVF()
            if ivf is not None:
                params.nprobe, params.max_codes = ivf.nprobe, ivf.max_codes
        params.sel = self.selector
        return params


def _checked_mask(allowed: np.ndarray, ntotal: int) -> np.ndarray:
    allowed = np.asarray(allowed)
    if allowed.dtype != np.bool_ or allowed.shape != (ntotal,):
        raise ValueError(f"allowed must be bool [{ntotal}], got {allowed.dtype} {allowed.shape}")
    return np.ascontiguousarray(allowed)


def _scan_allowed(
    index: faiss.Index, queries: np.ndarray, k: int, allowed: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest allowed rows by their exact distances, every allowed row scored. A
    graph or a few probed lists holding few allowed rows may find fewer than k of them;
    a few thousand exact distances cost less than the probe itself."""
    candidates = np.flatnonzero(allowed).astype(np.int64)
    q = queries.shape[0]
    out_d = np.full((q, k), np.finfo(np.float32).max, np.float32)
    out_r = np.full((q, k), -1, np.int64)
    if not candidates.size:
        return out_d, out_r
    distances = distances_to(index, queries, np.broadcast_to(candidates, (q, candidates.size)))
    take = min(k, candidates.size)
    for i in range(q):  # ties by row, as a Flat search breaks them
        order = np.lexsort((candidates, distances[i]))[:take]
        out_d[i, :take], out_r[i, :take] = distances[i][order], candidates[order]
    return out_d, out_r


def _refined_search(
    index: faiss.IndexRefine, queries: np.ndarray, k: int, selector: RowSelector | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A refine index re-ranks k·k_factor candidates picked by their PQ codes. For k = 1
    that is 8, too few to survive the codes' error between near-identical questions: at
    least MIN_REFINED_K are asked for. For large k (a fused search takes 100 candidates)
    k_factor·k exact distances cost more than the PQ scan itself while the best ones
    rarely change: at most k_factor·REFINE_BASE_K are re-ranked (and never fewer than k).
    """
    wide = max(k, MIN_REFINED_K)
    reranked = max(wide, index.k_factor * min(wide, REFINE_BASE_K))
    params = faiss.IndexRefineSearchParameters()
    params.k_factor = float((reranked + 0.5) / wide)  # FAISS truncates k·k_factor
    if selector is not None:  # the codes' scan skips other rows; the refine only re-ranks
        params.base_index_params = selector.params(index.base_index)
        params.sel = selector.selector
    distances, rows = index.search(queries, wide, params=params)
    return distances[:, :k], rows[:, :k]


def distances_to(index: faiss.Index, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Squared L2 distance from query i to each of its rows (float32 [Q, k]; inf for -1).

    queries : float32 [Q, D]; rows : int64 [Q, k]. The stored vectors are reconstructed
    (exact for Flat storage: Flat, HNSW…,Flat, IVF…,Flat; IVF gets a direct map first), so
    a row found by another retriever (BM25) gets the same distance a dense search gives.
    """
    queries = _as_matrix(queries, "queries", index.d)
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] != queries.shape[0]:
        raise ValueError(f"rows must be int64 [{queries.shape[0]}, k], got {rows.shape}")
    cpu = _to_cpu(index) if _is_gpu_index(index) else index
    found = rows >= 0
    out = np.full(rows.shape, np.inf, dtype=np.float32)
    if not found.any():
        return out
    flat = _flat_storage(cpu)
    if flat is not None and flat.metric_type == faiss.METRIC_L2:
        # One C++ call over the stored vectors: no copies of them, no temporaries.
        labels = np.ascontiguousarray(np.where(found, rows, 0))
        flat.compute_distance_subset(
            queries.shape[0],
            faiss.swig_ptr(queries),
            rows.shape[1],
            faiss.swig_ptr(out),
            faiss.swig_ptr(labels),
        )
        out[~found] = np.inf
        return out
    wanted = rows[found]
    try:
        stored = cpu.reconstruct_batch(wanted)
    except RuntimeError:  # IVF without a direct map
        faiss.extract_index_ivf(cpu).make_direct_map()
        stored = cpu.reconstruct_batch(wanted)
    repeated = np.repeat(queries, found.sum(axis=1), axis=0)
    out[found] = ((repeated - stored) ** 2).sum(axis=1)
    return out


class RowDistances:
    """`distances_to` for one query, with the index's stored vectors looked up once.

    The service's fused search scores ~120 candidates of one question a request; looking up
    the flat storage (SWIG downcasts) and checking the arguments cost more than the
    distances themselves. Same arithmetic as `distances_to` (the same FAISS call over the
    same storage), so the same float32 values.
    """

    def __init__(self, index: faiss.Index) -> None:
        self._index = index
        flat = None if _is_gpu_index(index) else _flat_storage(index)
        self._flat = flat if flat is not None and flat.metric_type == faiss.METRIC_L2 else None

    def __call__(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """float32 [n]: the distances from query float32 [1, D] to rows int64 [n] (all >= 0)."""
        query = np.ascontiguousarray(query, dtype=np.float32)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if self._flat is None:
            with _threads_for(1):
                return distances_to(self._index, query, rows[None])[0]
        if query.shape != (1, self._flat.d) or rows.ndim != 1:
            raise ValueError(
                f"query must be float32 [1, {self._flat.d}] and rows int64 [n], got "
                f"{query.shape} and {rows.shape}"
            )
        if rows.size and (rows.min() < 0 or rows.max() >= self._flat.ntotal):
            # FAISS would read outside its storage, not raise
            raise ValueError(f"rows must be in [0, {self._flat.ntotal}), got {rows}")
        out = np.empty(rows.size, dtype=np.float32)
        if not rows.size:  # FAISS asserts k > 0
            return out
        with _threads_for(1):  # one row set: a second thread would only spin
            self._flat.compute_distance_subset(
                1, faiss.swig_ptr(query), rows.size, faiss.swig_ptr(out), faiss.swig_ptr(rows)
            )
        return out


def recall_against(approx_rows: np.ndarray, exact_rows: np.ndarray) -> float:
    """Mean over queries of |approx ∩ exact| / |exact|: the share of the reference results
    (int64 [Q, k], -1 = empty) that the approximate ones (int64 [Q, k']) also hold. NaN for
    no queries; a query whose reference is empty counts as fully recalled."""
    approx_rows = np.asarray(approx_rows)
    exact_rows = np.asarray(exact_rows)
    if len(approx_rows) != len(exact_rows):
        raise ValueError(f"{len(approx_rows)} approximate but {len(exact_rows)} exact rows")
    if not len(exact_rows):
        return float("nan")
    shares = []
    for a, e in zip(approx_rows, exact_rows, strict=True):
        e = e[e >= 0]
        shares.append(np.intersect1d(a[a >= 0], e).size / e.size if e.size else 1.0)
    return float(np.mean(shares))


def exact_twin(index: faiss.Index) -> faiss.IndexFlat:
    """An exhaustive IndexFlat over ``index``'s stored vectors, same metric and row order:
    the reference an approximate search is measured against when the original vectors are
    not at hand. Stored vectors are exact for Flat storage (Flat, HNSW…,Flat, IVF…,Flat,
    …,RFlat) and the decoded codes otherwise. Costs ntotal·d·4 bytes."""
    cpu = _to_cpu(index) if _is_gpu_index(index) else index
    try:
        stored = cpu.reconstruct_n(0, cpu.ntotal)
    except RuntimeError:  # IVF without a direct map
        faiss.extract_index_ivf(cpu).make_direct_map()
        stored = cpu.reconstruct_n(0, cpu.ntotal)
    flat = faiss.IndexFlat(cpu.d, cpu.metric_type)
    flat.add(np.ascontiguousarray(stored, dtype=np.float32))
    return flat


# ---------------------------------------------------------------- gate checks


def self_check_rows(n: int, sample: int, seed: int) -> np.ndarray:
    """int64 [min(sample, n)], ascending: the rows `self_retrieval_rate` draws (without
    replacement, seeded), for a caller that encodes those rows' questions itself."""
    if n < 1 or sample < 1:
        raise ValueError("need at least one vector and sample >= 1")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(sample, n), replace=False)).astype(np.int64)


def self_retrieval_rate(
    index: faiss.Index,
    vectors: np.ndarray | VectorShards,
    sample: int,
    seed: int,
    *,
    queries: np.ndarray | None = None,
) -> float:
    """Share of sampled rows whose own vector finds the row itself at rank 1.

    vectors : float32 [N, D], the matrix the index was built from (row r = vectors[r]),
        or the shards it was built from.
    sample : rows drawn without replacement (all of them when sample >= N).
    queries : float32 [min(sample, N), D], the sampled rows' questions encoded as queries
        are (`self_check_rows` gives the rows; e.g. by the int8 query encoder, qpr.model.quantize);
        None: their stored vectors.

    A rank-1 row whose vector is identical to the query's (an exact duplicate question)
    counts as success: the two are indistinguishable at distance 0. Expected ≈ 1.0 for
    Flat/IVF-Flat with L2; lower values mean lossy codes (PQ), un-normalised vectors
    under "ip", or vectors that do not match the index.
    """
    if isinstance(vectors, VectorShards):
        n, take = len(vectors), vectors.rows
    else:
        vectors = _as_matrix(vectors, "vectors", index.d)
        n, take = vectors.shape[0], vectors.__getitem__
    if n != index.ntotal:
        raise ValueError(f"index holds {index.ntotal} vectors, got {n}")
    rows = self_check_rows(n, sample, seed)
    if queries is None:
        queries = take(rows)
    queries = _as_matrix(queries, "queries", index.d)
    if len(queries) != len(rows):
        raise ValueError(f"{len(rows)} sampled rows but {len(queries)} query vectors")
    _, found = search(index, queries, 1)
    top1 = found[:, 0]
    ok = top1 == rows
    tie = ~ok & (top1 >= 0)
    if tie.any():
        ok[tie] = (take(top1[tie]) == take(rows[tie])).all(axis=1)
    return float(ok.mean())


def exact_recall_at_k(
    index: faiss.Index, vectors: np.ndarray, queries: np.ndarray, k: int
) -> float:
    """k-recall@k of ``index`` against exact search (IndexFlat, same metric).

    vectors : float32 [N, D] the index was built from; queries : float32 [Q, D].
    Returns mean over queries of |approx top-k ∩ exact top-k| / k, in [0, 1]. Exact ties at
    the k-th distance can keep even an exact index a hair below 1.
    """
    vectors = _as_matrix(vectors, "vectors", index.d)
    queries = _as_matrix(queries, "queries", index.d)
    k = min(k, vectors.shape[0])
    flat = faiss.IndexFlat(index.d, index.metric_type)
    flat.add(vectors)
    _, exact = flat.search(queries, k)
    _, approx = search(index, queries, k)
    hits = 0
    for e, a in zip(exact, approx, strict=True):
        hits += np.intersect1d(e[e >= 0], a[a >= 0]).size
    return hits / (k * queries.shape[0]) if queries.shape[0] else float("nan")

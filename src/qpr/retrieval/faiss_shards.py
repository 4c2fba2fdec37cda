"""FAISS trained and filled as engine tasks: the file `build_index_from_shards` writes, byte
for byte, with the work on the engine's workers.

1. **train**: one task trains the empty index on the sample the driver build draws
   (`qpr.retrieval.dense.training_sample`) and writes it to `trained-<digest>.faiss`.
2. **add**: one task a vector shard reads that file, runs the driver build's own
   `index.add(shard)` and writes what the add stored, in `added-<digest>/`: each list's
   row numbers and codes in list order, and the refine store's codes (`stored`).
3. **assemble**: the driver puts them into the trained index, in row order (`assemble`).

Why not FAISS's ``merge_from`` of per-shard indexes: for fast-scan codes it ends in
``BlockInvertedLists::add_entries`` (faiss/invlists/BlockInvertedLists.cpp:60-71, v1.15.0).
That grows a list's blocks with ``AlignedTable::resize`` (faiss/utils/AlignedTable.h:44),
which leaves the new bytes as memory held them, then packs the codes in nibble by nibble.
The spare nibbles of a list's last block are then garbage: the same shards merged twice
give different files. And when a list already holds a multiple of ``block_size`` entries
(bytes compared with a count), it copies whole blocks past the list's end.

The sequential add (``IndexIVFFastScan::add_with_ids``, faiss/IndexIVFFastScan.cpp:196-207)
zeroes new blocks (``BlockInvertedLists::resize``) and ORs the codes in
(``pq4_pack_codes_range``, faiss/impl/fast_scan/fast_scan.cpp:159). So a list's bytes
depend only on its codes in order. Here each list's codes, every shard's in row order, are
packed into zeroed blocks by FAISS's own packer (``CodePackerPQ4.pack_all``), then stored
with ``add_entries`` on the empty list: one copy of whole blocks. Plain inverted lists
(``IVF…,Flat``, ``IVF…,PQ``) and flat stores (``Flat``, the refine store of ``RFlat`` or
``Refine(SQ8)``) are appended as they are.

The tasks run FAISS on the driver's thread count: the bytes matched for 1, 2 and 3
threads here, but FAISS promises no such thing. An HNSW graph, a GPU build, a
pre-transform (OPQ, PCA) or an index type not listed in `driver_only` is built in the
driver, with a log line that says why.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from faiss.contrib.inspect_tools import get_invlist

from qpr.io import digest, file_sha256, replace_dir, save_numpy_atomic
from qpr.retrieval.dense import (
    IndexConfig,
    VectorShards,
    build_index_from_shards,
    checked_finite,
    faiss_threads,
    finish_index,
    gpu_available,
    new_index,
    nlist_of,
    save_index,
    training_points,
    training_sample,
)
from qpr.tasks import Mapper, local_map

__all__ = [
    "AddTask",
    "TrainTask",
    "add_shard",
    "assemble",
    "build_index_on_engine",
    "driver_only",
    "stored",
    "train_index",
]

# Stores whose add appends each vector's code (IndexFlatCodes::add): read back, appended.
_FLAT = (faiss.IndexFlat, faiss.IndexFlatL2, faiss.IndexFlatIP, faiss.IndexScalarQuantizer)
# IVF indexes whose add stores (list number, code) a vector and nothing else.
_IVF = (faiss.IndexIVFFlat, faiss.IndexIVFPQ, faiss.IndexIVFScalarQuantizer)
_IVF_FAST_SCAN = (faiss.IndexIVFPQFastScan,)
_REFINE = (faiss.IndexRefine, faiss.IndexRefineFlat)


@dataclass(frozen=True)
class TrainTask:
    """Train the index `config` describes on a sample of `vectors` into `out` (empty)."""

    vectors: tuple[Path, ...]
    config: IndexConfig
    seed: int
    out: Path  # trained-<digest>.faiss
    threads: int = 1  # FAISS's OpenMP threads: the driver's


@dataclass(frozen=True)
class AddTask:
    """Add one vector shard to the `trained` index; what the add stored goes to `out`."""

    trained: Path
    vectors: Path  # float32 [n, D] .npy
    out: Path  # added-<digest>/, a folder of .npy files (`stored`)
    threads: int = 1


def _quiet(_: str) -> None:
    pass


def train_index(task: TrainTask) -> Path:
    """Run one TrainTask (skipped when its file exists): the driver build's training."""
    if task.out.is_file():
        return task.out
    shards = VectorShards(task.vectors)
    with faiss_threads(task.threads):
        index, _ = new_index(task.config, len(shards), shards.dim, seed=task.seed, log=_quiet)
        if not index.is_trained:
            index.train(training_sample(shards, nlist_of(index), task.seed))
    return save_index(index, task.out)


def add_shard(task: AddTask) -> Path:
    """Run one AddTask (skipped when its folder exists): the shard added to a copy of the
    trained index, as the driver build adds it, and what that stored written to a folder
    that appears whole (`qpr.io.replace_dir`)."""
    if task.out.is_dir():
        return task.out
    vectors = checked_finite(np.ascontiguousarray(np.load(task.vectors), dtype=np.float32))
    index = faiss.read_index(str(task.trained))
    with faiss_threads(task.threads):
        index.add(vectors)
    task.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=task.out.parent, prefix=f".{task.out.name}."))
    try:
        for name, array in stored(index).items():
            save_numpy_atomic(staging / f"{name}.npy", array)
        replace_dir(staging, task.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return task.out


# ---------------------------------------------------------------- what an add stores


def _parts(index: faiss.Index) -> tuple[faiss.Index, faiss.Index | None]:
    """(the index that holds the lists or codes, the refine store or None)."""
    index = faiss.downcast_index(index)
    if isinstance(index, _REFINE):
        return faiss.downcast_index(index.base_index), faiss.downcast_index(index.refine_index)
    return index, None


def driver_only(index: faiss.Index) -> str | None:
    """Why `index` (untrained, on CPU) must be filled in the driver, or None when its adds
    can run as tasks and be assembled into the driver build's bytes."""
    base, refine = _parts(index)
    if "HNSW" in type(base).__name__:
        return "an HNSW graph grows one vector at a time, on one thread, in row order"
    if refine is not None and type(refine) not in _FLAT:
        return f"its refine store {type(refine).__name__} has no sharded add here"
    if type(base) in _FLAT:
        return None
    if type(base) not in _IVF + _IVF_FAST_SCAN:
        return f"{type(base).__name__} has no sharded add here"
    quantizer = faiss.downcast_index(base.quantizer)
    if type(quantizer) not in _FLAT[:3]:
        return f"its coarse quantizer {type(quantizer).__name__} is not a flat index"
    return None


def _lists(ivf: faiss.Index) -> tuple[faiss.InvertedLists, faiss.CodePacker | None]:
    """(the inverted lists of `ivf`, their block packer or None for plain lists)."""
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    return lists, lists.packer if isinstance(lists, faiss.BlockInvertedLists) else None


def stored(index: faiss.Index) -> dict[str, np.ndarray]:
    """What adding a shard to an empty trained `index` stored, as arrays: for inverted lists
    `sizes` int64 [nlist], then `ids` int64 [n] (rows) and `codes` uint8 [n, code_size]
    list after list, unpacked; for a flat store `codes` in row order; for a refine index
    also `refine`, its store's codes in row order."""
    base, refine = _parts(index)
    out = {} if refine is None else {"refine": _flat_codes(refine)}
    if type(base) in _FLAT:
        return {**out, "codes": _flat_codes(base)}
    lists, packer = _lists(base)
    code_size = lists.code_size if packer is None else packer.code_size
    sizes = np.array([lists.list_size(i) for i in range(lists.nlist)], np.int64)
    ids, codes = [np.zeros(0, np.int64)], [np.zeros((0, code_size), np.uint8)]
    for list_no in np.flatnonzero(sizes).tolist():
        list_ids, list_codes = get_invlist(lists, list_no)
        ids.append(list_ids)
        if packer is not None:
            list_codes = _unpacked(packer, list_codes, len(list_ids))
        codes.append(list_codes.reshape(len(list_ids), code_size))
    return {**out, "sizes": sizes, "ids": np.concatenate(ids), "codes": np.concatenate(codes)}


def _flat_codes(index: faiss.Index) -> np.ndarray:
    return faiss.vector_to_array(index.codes).reshape(index.ntotal, index.code_size)


def _unpacked(packer: faiss.CodePacker, blocks: np.ndarray, n: int) -> np.ndarray:
    """uint8 [n, code_size]: the codes of a list's packed blocks, by FAISS's packer."""
    blocks = np.ascontiguousarray(blocks).reshape(-1, packer.block_size)
    flat = np.zeros((len(blocks) * packer.nvec, packer.code_size), np.uint8)
    for b, block in enumerate(blocks):
        packer.unpack_all(faiss.swig_ptr(block), faiss.swig_ptr(flat[b * packer.nvec :]))
    return flat[:n]


def _packed(packer: faiss.CodePacker, codes: np.ndarray) -> np.ndarray:
    """The blocks a sequential add leaves for a list of `codes` (uint8 [n, code_size]):
    zeroed blocks with every code packed in, the last block's spare slots left zero."""
    n_blocks = -(-len(codes) // packer.nvec)
    flat = np.zeros((n_blocks * packer.nvec, packer.code_size), np.uint8)
    flat[: len(codes)] = codes
    blocks = np.zeros((n_blocks, packer.block_size), np.uint8)
    for b, block in enumerate(blocks):
        packer.pack_all(faiss.swig_ptr(flat[b * packer.nvec :]), faiss.swig_ptr(block))
    return blocks


# ---------------------------------------------------------------- the driver


def assemble(trained: Path, parts: Sequence[Path], sizes: Sequence[int]) -> faiss.Index:
    """The `trained` index filled with what each shard's add stored (`parts`, folders
    written by `add_shard`, in row order; `sizes`: each shard's vectors): the index a
    sequential add of the shards gives, byte for byte. One part's codes in memory at a
    time for flat stores; the lists' parts are read through memory maps."""
    index = faiss.read_index(str(trained))
    base, refine = _parts(index)
    loaded = [
        {f.stem: np.asarray(np.load(f, mmap_mode="r")) for f in Path(part).glob("*.npy")}
        for part in parts
    ]
    total = int(sum(sizes))
    if refine is not None:
        for part in loaded:
            refine.add_sa_codes(np.ascontiguousarray(part["refine"]))
    if type(base) in _FLAT:
        for part in loaded:
            base.add_sa_codes(np.ascontiguousarray(part["codes"]))
    else:
        _fill_lists(base, loaded, np.cumsum([0, *sizes])[:-1])
        base.ntotal = total
    index.ntotal = total
    if base.ntotal != total or (refine is not None and refine.ntotal != total):
        raise ValueError(f"assembled {base.ntotal:,} vectors, expected {total:,}")
    return index


def _fill_lists(ivf: faiss.Index, parts: list[dict[str, np.ndarray]], starts: np.ndarray) -> None:
    """Each inverted list of `ivf` (empty) given every part's entries, in part order."""
    lists, packer = _lists(ivf)
    offsets = [np.concatenate([[0], np.cumsum(part["sizes"])]) for part in parts]
    for list_no in range(lists.nlist):
        pieces = [
            (part, int(at[list_no]), int(at[list_no + 1]), int(start))
            for part, at, start in zip(parts, offsets, starts, strict=True)
            if at[list_no + 1] > at[list_no]
        ]
        if not pieces:
            continue
        if lists.list_size(list_no):  # add_entries copies whole blocks only into an empty list
            raise ValueError(f"inverted list {list_no} of the trained index is not empty")
        ids = np.concatenate([part["ids"][a:b] + start for part, a, b, start in pieces])
        codes = np.concatenate([part["codes"][a:b] for part, a, b, _ in pieces])
        if packer is not None:
            codes = _packed(packer, codes)
        ids, codes = np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(codes)
        lists.add_entries(list_no, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(codes))


def build_index_on_engine(
    shards: VectorShards,
    config: IndexConfig,
    *,
    seed: int,
    work_dir: Path,
    engine: Mapper = local_map,
    log: Callable[[str], None] = print,
) -> faiss.Index:
    """`build_index_from_shards`'s index, trained and filled as tasks on `engine`, their
    files in `work_dir` (named by digests of their inputs: a rerun reuses them). The
    added parts are removed once assembled. Built in the driver instead, with a log line
    saying why, where `driver_only` says so or a GPU would build it."""
    notes: list[str] = []
    probe, fitted = new_index(config, len(shards), shards.dim, seed=seed, log=notes.append)
    gpu = config.use_gpu is not False and gpu_available()
    reason = "a GPU builds it" if gpu else driver_only(probe)
    if reason:
        log(f"FAISS in the driver, not as tasks: {fitted}: {reason}")
        return build_index_from_shards(shards, config, seed=seed, log=log)
    for note in notes:
        log(note)
    nlist = nlist_of(probe)
    keys = [file_sha256(path) for path in shards.paths]
    sample = len(shards) if nlist is None else training_points(len(shards), nlist)
    name = digest(faiss.__version__, fitted, config.metric, seed, sample, *keys)
    threads = faiss.omp_get_max_threads()
    work_dir = Path(work_dir).resolve()
    vectors = tuple(path.resolve() for path in shards.paths)
    started = time.perf_counter()
    task = TrainTask(vectors, config, seed, work_dir / f"trained-{name}.faiss", threads)
    trained = engine(train_index, [task])[0]
    adding = time.perf_counter()
    log(f"FAISS: {fitted} trained; adding {len(vectors)} shards as tasks")
    adds = [
        AddTask(trained, path, work_dir / f"added-{digest(trained.name, key)}", threads)
        for path, key in zip(vectors, keys, strict=True)
    ]
    parts = engine(add_shard, adds)
    assembling = time.perf_counter()
    index = assemble(trained, parts, np.diff(shards.starts).tolist())
    for part in [*parts, *work_dir.glob(".added-*")]:  # and what killed workers left
        shutil.rmtree(part, ignore_errors=True)
    done = time.perf_counter()
    timing = (
        f"train {adding - started:.2f} s, add {done - adding:.2f} s "
        f"(assembly {done - assembling:.2f} s)"
    )
    finish_index(index, config, fitted, log, where="CPU, tasks", timing=timing)
    return index

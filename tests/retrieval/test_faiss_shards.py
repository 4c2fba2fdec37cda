"""FAISS trained and filled as tasks: the one-process build's bytes, resumable, atomic."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from qpr.config import load_settings
from qpr.retrieval import faiss_shards
from qpr.retrieval.dense import IndexConfig, VectorShards, build_index_from_shards
from qpr.retrieval.faiss_shards import AddTask, add_shard, build_index_on_engine

ROOT = Path(__file__).resolve().parents[2]
QUIET = lambda _: None  # noqa: E731
# Uneven shards: lists cross block boundaries (32 codes) within and between shards.
SIZES = (1_300, 37, 2_100, 900)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> VectorShards:
    folder = tmp_path_factory.mktemp("vectors")
    rng = np.random.default_rng(11)
    paths = []
    for number, size in enumerate(SIZES):
        paths.append(folder / f"part-{number}.npy")
        np.save(paths[-1], rng.standard_normal((size, 48)).astype(np.float32))
    return VectorShards(paths)


def serialized(index: faiss.Index) -> bytes:
    return faiss.serialize_index(index).tobytes()


@pytest.mark.parametrize(
    "factory",
    [
        "IVF16,PQ24x4fs,Refine(SQfp16)",  # fast-scan PQ, 16-bit refine store
        load_settings(
            ROOT / "params.yaml"
        ).index.factory,  # the pipeline's: here IVF111,PQ48x4fs,RFlat
        "IVF16,Flat",
        "Flat",
    ],
)
def test_the_tasks_give_the_one_process_builds_bytes(
    shards: VectorShards, factory: str, tmp_path: Path
) -> None:
    config = IndexConfig(factory, nprobe=4, use_gpu=False)
    logged: list[str] = []
    made = build_index_on_engine(shards, config, seed=13, work_dir=tmp_path, log=logged.append)
    driver = build_index_from_shards(shards, config, seed=13, log=QUIET)
    assert made.ntotal == len(shards)
    assert serialized(made) == serialized(driver)
    assert "CPU, tasks" in logged[-1]
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["trained"]  # parts removed


def test_an_hnsw_graph_is_built_in_the_driver_and_the_log_says_why(
    shards: VectorShards, tmp_path: Path
) -> None:
    config = IndexConfig("HNSW8,Flat", nprobe=4, ef_construction=16, use_gpu=False)
    logged: list[str] = []
    made = build_index_on_engine(shards, config, seed=13, work_dir=tmp_path, log=logged.append)
    assert any("FAISS in the driver" in line and "HNSW" in line for line in logged)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    assert made.ntotal == len(shards)


def test_a_trained_index_is_reused_and_a_rerun_gives_the_same_bytes(
    shards: VectorShards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = IndexConfig("IVF16,PQ24x4fs,RFlat", nprobe=4, use_gpu=False)
    first = serialized(build_index_on_engine(shards, config, seed=13, work_dir=tmp_path, log=QUIET))

    def never(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(faiss_shards, "training_sample", never)
    again = build_index_on_engine(shards, config, seed=13, work_dir=tmp_path, log=QUIET)
    assert serialized(again) == first


def test_a_failed_add_leaves_no_folder(
    shards: VectorShards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = IndexConfig("IVF16,PQ24x4fs,Refine(SQ8)", nprobe=4, use_gpu=False)
    trained = faiss_shards.train_index(
        faiss_shards.TrainTask(tuple(shards.paths), config, 13, tmp_path / "trained.faiss")
    )
    written: list[Path] = []
    real_save = faiss_shards.save_numpy_atomic

    def disk_full_at_the_second(path: Path, array: np.ndarray) -> Path:
        if written:
            raise OSError("disk full")
        written.append(real_save(path, array))
        return written[-1]

    monkeypatch.setattr(faiss_shards, "save_numpy_atomic", disk_full_at_the_second)
    task = AddTask(trained, shards.paths[0], tmp_path / "added")
    with pytest.raises(OSError, match="disk full"):
        add_shard(task)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trained.faiss"]


def test_a_shard_with_nan_is_refused(shards: VectorShards, tmp_path: Path) -> None:
    bad = tmp_path / "bad.npy"
    vectors = np.load(shards.paths[1])
    vectors[3, 5] = np.nan
    np.save(bad, vectors)
    config = IndexConfig("Flat", nprobe=4, use_gpu=False)
    trained = faiss_shards.train_index(
        faiss_shards.TrainTask((bad,), config, 1, tmp_path / "trained.faiss")
    )
    with pytest.raises(ValueError, match="NaN or inf"):
        add_shard(AddTask(trained, bad, tmp_path / "added"))
    assert not (tmp_path / "added").exists()

"""The engines: Ray tasks give the local engine's files, and a killed worker's task is rerun.

The Ray tests start a two-node cluster on this machine (`ray.cluster_utils.Cluster`, one
CPU a node), as a real cluster would spread the tasks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import pytest

from flows.engine import mapper, ray_map
from qpr.artifacts import BM25_FILE, ENCODER_FILE, INDEX_FILE, VOCAB_FILE
from qpr.data.scale import ScaleSpec, write_scale_corpus
from qpr.retrieval.indexer import CountTask, EncodeTask, count_shard, encode_shard
from qpr.tasks import local_map
from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

QUIET = lambda _: None  # noqa: E731


def test_local_is_the_default_map() -> None:
    assert mapper("local") is local_map
    assert local_map(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="engine must be one of"):
        mapper("spark")


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes of one CPU each, on this machine."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": 128 * 1024**2},
    )
    cluster.add_node(num_cpus=1, object_store_memory=128 * 1024**2)
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("engine")
    models = build_bundle(root / "models", QUESTIONS, QIDS)
    spec = ScaleSpec(2_000, seed=9, shard_rows=500)
    return models, write_scale_corpus(spec, root / "corpus", log=QUIET)


def encode_tasks(models: Path, shards: list[Path], out: Path) -> list[EncodeTask]:
    return [
        EncodeTask(s, "question", models / ENCODER_FILE, models / VOCAB_FILE, out / f"{s.stem}.npy")
        for s in shards
    ]


@pytest.mark.slow
def test_ray_tasks_write_the_local_files(ray_cluster, work, tmp_path: Path) -> None:
    models, shards = work
    local = local_map(encode_shard, encode_tasks(models, shards, tmp_path / "local"))
    remote = ray_map(encode_shard, encode_tasks(models, shards, tmp_path / "ray"), log=QUIET)
    assert [p.read_bytes() for p in remote] == [p.read_bytes() for p in local]
    counts = [CountTask(s, "question", "english", tmp_path / f"{s.stem}.npz") for s in shards]
    assert ray_map(count_shard, counts, log=QUIET) == [c.out for c in counts]


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_the_result_is_exact(
    ray_cluster, work, tmp_path: Path
) -> None:
    models, shards = work
    marks = tmp_path / "marks"
    marks.mkdir()

    def dies_once(task: EncodeTask) -> Path:
        mark = marks / task.out.name
        if not mark.exists():
            mark.touch()
            os._exit(1)  # the worker process dies mid-task, as under kill -9
        return encode_shard(task)

    tasks = encode_tasks(models, shards, tmp_path / "ray")
    files = ray_map(dies_once, tasks, log=QUIET)
    assert len(list(marks.iterdir())) == len(shards)  # every task's first worker died
    expected = local_map(encode_shard, encode_tasks(models, shards, tmp_path / "local"))
    assert [p.read_bytes() for p in files] == [p.read_bytes() for p in expected]
    leftovers = [p for p in (tmp_path / "ray").iterdir() if p.suffix != ".npy"]
    assert leftovers == []  # nothing half-written


@pytest.mark.slow
def test_a_worker_killed_mid_add_is_retried_and_the_index_is_exact(
    ray_cluster, tmp_path: Path
) -> None:
    """FAISS's add tasks: each first worker dies after writing part of its folder."""
    from qpr.retrieval import faiss_shards
    from qpr.retrieval.dense import (
        IndexConfig,
        VectorShards,
        build_index_from_shards,
        finish_index,
    )

    threads = faiss.omp_get_max_threads()  # the driver's, as build_index_on_engine passes
    rng = np.random.default_rng(4)
    paths = []
    for number, size in enumerate((800, 1_100, 600)):
        paths.append(tmp_path / f"vectors-{number}.npy")
        np.save(paths[-1], rng.standard_normal((size, 32)).astype(np.float32))
    shards = VectorShards(paths)
    config = IndexConfig("IVF16,PQ16x4fs,Refine(SQfp16)", nprobe=4, use_gpu=False)
    trained = faiss_shards.train_index(
        faiss_shards.TrainTask(tuple(paths), config, 13, tmp_path / "trained.faiss", threads)
    )
    marks = tmp_path / "marks"
    marks.mkdir()

    def dies_mid_write(task: faiss_shards.AddTask) -> Path:
        mark = marks / task.out.name
        if not mark.exists():
            mark.touch()
            real = faiss_shards.save_numpy_atomic

            def save_then_die(path: Path, array: np.ndarray) -> Path:
                real(path, array)
                os._exit(1)  # the worker dies with one file of the folder written

            faiss_shards.save_numpy_atomic = save_then_die
        return faiss_shards.add_shard(task)

    tasks = [faiss_shards.AddTask(trained, p, tmp_path / f"added-{p.stem}", threads) for p in paths]
    parts = ray_map(dies_mid_write, tasks, log=QUIET)
    assert len(list(marks.iterdir())) == len(paths)  # every task's first worker died
    index = faiss_shards.assemble(trained, parts, [800, 1_100, 600])
    finish_index(index, config, "", QUIET, where="", timing="")
    expected = build_index_from_shards(shards, config, seed=13, log=QUIET)
    assert faiss.serialize_index(index).tobytes() == faiss.serialize_index(expected).tobytes()


@pytest.mark.slow
def test_a_task_error_stops_the_map(ray_cluster, work, tmp_path: Path) -> None:
    models, shards = work
    tasks = encode_tasks(models, shards, tmp_path / "out")
    bad = EncodeTask(
        tmp_path / "missing.parquet",
        "question",
        models / ENCODER_FILE,
        models / VOCAB_FILE,
        tmp_path / "x.npy",
    )
    with pytest.raises(Exception, match=r"missing\.parquet"):
        ray_map(encode_shard, [tasks[0], bad], retries=0, log=QUIET)
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.slow
def test_the_index_stage_gives_the_same_bundle_on_both_engines(ray_cluster, tmp_path: Path) -> None:
    """The stage on Ray: the same index, id map and BM25 files as on the local engine. Logs
    of about 900 questions: enough for the pipeline's factory to keep its 4-bit PQ codes."""
    from flows.engine import ray_map as ray_engine
    from qpr.config import settings_from_dict
    from qpr.data.synth import SynthSpec, write_logs
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train
    from qpr.retrieval.dense import IdMap
    from tests.conftest import tiny_overrides

    synth = {"seed": 7, "days": 3, "rows_per_day": 1000, "intents": 100}
    settings = settings_from_dict(
        tiny_overrides(
            tmp_path,
            data={"synth": synth},
            index={"self_check_sample": 100, "threads": 1, "shard_rows": 400},
        )
    )
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    paths = ProjectPaths(tmp_path)
    run_cluster(settings, out_dir=paths.cluster_dir, report_dir=tmp_path / "reports", log=QUIET)
    run_train(settings, paths, progress=False, log=QUIET)
    run_export(settings, paths, log=QUIET)
    local = run_index(settings, paths, log=QUIET)
    kept = shutil.copytree(paths.index_dir, tmp_path / "local-index")
    shutil.rmtree(paths.index_cache_dir)  # no reused vectors: Ray encodes them again
    remote = run_index(
        settings, paths, engine=lambda fn, items: ray_engine(fn, items, log=QUIET), log=QUIET
    )
    assert remote["vectors_reused"] == 0 and remote["questions"] == local["questions"]
    for name in (INDEX_FILE.name, IdMap.path_for(INDEX_FILE).name, BM25_FILE.name):
        assert (paths.index_dir / name).read_bytes() == (kept / name).read_bytes(), name
    index = faiss.read_index(str(kept / INDEX_FILE.name))  # held: it owns what downcasts see
    assert isinstance(index, faiss.IndexRefine)  # fast-scan PQ with a refine store: real work
    assert isinstance(faiss.downcast_index(index.base_index), faiss.IndexIVFPQFastScan)
    assert local["questions"] > 400  # two shards or more


@pytest.mark.slow
def test_the_cluster_stage_gives_the_same_outputs_on_both_engines(
    ray_cluster, tiny_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs cleaned, merged and clustered as Ray tasks: the local engine's files."""
    import qpr.data.sharded as sharded
    from flows.engine import ray_map as ray_engine
    from qpr.pipeline.cluster import run_cluster

    monkeypatch.setattr(sharded, "GROUP_BYTES", 1)  # a task a log file
    settings = tiny_settings.model_copy(
        update={"cluster": tiny_settings.cluster.model_copy(update={"shard_rows": 100})}
    )
    run = lambda out, **engine: run_cluster(  # noqa: E731
        settings,
        out_dir=tmp_path / out,
        report_dir=tmp_path / f"{out}-reports",
        log=QUIET,
        **engine,
    )
    local = run("local")
    remote = run("ray", engine=lambda fn, items: ray_engine(fn, items, log=QUIET))
    assert remote.metrics["clusters_total"] == local.metrics["clusters_total"] > 0
    for name in ("questions", "clusters", "pairs"):
        a = pd.read_parquet(tmp_path / "local" / f"{name}.parquet")
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ray" / f"{name}.parquet"), a)
    assert not (tmp_path / "ray-shards").exists()  # the tasks' files go once the stage is done


@pytest.mark.slow
def test_a_gate_failing_in_a_ray_task_stops_the_stage_as_a_gate_failure(
    ray_cluster, tiny_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's gate fails inside its Ray task: the caller gets the GateFailed (not a
    generic task error), and the last good outputs stay."""
    import qpr.data.sharded as sharded
    from flows.engine import ray_map as ray_engine
    from qpr.pipeline.cluster import run_cluster
    from qpr.quality.gate import GateFailed

    monkeypatch.setattr(sharded, "GROUP_BYTES", 1)  # the broken file is a task of its own
    logs = Path(tiny_settings.data.path)
    (logs / "zz-broken.csv").write_text("timestamp,question,answer_id\n" + "x,,?\n" * 30)
    previous = tmp_path / "out"
    previous.mkdir()
    (previous / "questions.parquet").write_text("the last good outputs")
    with pytest.raises(GateFailed, match=r"raw_logs\.zz-broken"):
        run_cluster(
            tiny_settings,
            out_dir=previous,
            report_dir=tmp_path / "reports",
            engine=lambda fn, items: ray_engine(fn, items, retries=0, log=QUIET),
            log=QUIET,
        )
    assert (previous / "questions.parquet").read_text() == "the last good outputs"
    assert not (tmp_path / "out.tmp").exists()

"""The sharded cluster stage: the in-memory stage's outputs, in any number of pieces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import qpr.data.sharded as sharded
from qpr.config import Settings
from qpr.data.dataset import build_clusters
from qpr.data.sharded import bucket_of, cluster_logs, file_groups
from qpr.data.splits import TooFewClusters
from qpr.quality.gate import GateFailed

QUIET = lambda _: None  # noqa: E731
FRAMES = ("questions", "clusters", "pairs")


def _with(settings: Settings, **cluster) -> Settings:
    return settings.model_copy(update={"cluster": settings.cluster.model_copy(update=cluster)})


def _sharded(settings: Settings, root: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    built = cluster_logs(settings, out, work_dir=root / "work", report_dir=root / "r", log=QUIET)
    return {name: pd.read_parquet(out / f"{name}.parquet") for name in FRAMES}, built.metrics


@pytest.fixture
def in_memory(tiny_settings: Settings, tmp_path: Path) -> tuple[dict, dict]:
    frames, metrics, _ = build_clusters(tiny_settings, tmp_path / "memory", QUIET)
    return frames, metrics


@pytest.mark.parametrize(("shard_rows", "group_bytes"), [(500_000, None), (97, None), (41, 1)])
def test_pieces_give_the_in_memory_outputs(
    tiny_settings, in_memory, tmp_path, monkeypatch, shard_rows, group_bytes
) -> None:
    """One range or many, one group of files or one file each: the same frames, metrics."""
    monkeypatch.setattr(sharded, "GROUP_BYTES", group_bytes or sharded.GROUP_BYTES)
    frames, metrics = _sharded(_with(tiny_settings, shard_rows=shard_rows), tmp_path)
    want_frames, want_metrics = in_memory
    for name in FRAMES:
        pd.testing.assert_frame_equal(
            frames[name], want_frames[name].reset_index(drop=True), check_dtype=False
        )
    assert metrics == want_metrics
    assert len(frames["pairs"]) > 0 and frames["questions"]["split"].nunique() == 4


def test_large_clusters_draw_their_pairs_as_in_memory(tiny_settings, tmp_path) -> None:
    """Capped clusters draw from one generator in cluster order, whatever the pieces."""
    capped = _with(tiny_settings, max_pairs_per_cluster=3)
    want, _, _ = build_clusters(capped, tmp_path / "memory", QUIET)
    got, _ = _sharded(_with(capped, shard_rows=50), tmp_path)
    assert (want["pairs"].groupby("cluster_id").size() == 3).any()
    pd.testing.assert_frame_equal(got["pairs"], want["pairs"], check_dtype=False)


def test_a_killed_stage_resumes_at_the_first_task_not_done(
    tiny_settings, tmp_path, monkeypatch
) -> None:
    settings = _with(tiny_settings, shard_rows=60)
    monkeypatch.setattr(sharded, "GROUP_BYTES", 1)
    want, _ = _sharded(settings, tmp_path / "whole")
    real = sharded.cluster_bucket

    def killed(task):
        raise KeyboardInterrupt("killed mid-stage")

    monkeypatch.setattr(sharded, "cluster_bucket", killed)
    with pytest.raises(KeyboardInterrupt):
        _sharded(settings, tmp_path / "killed")
    assert len(list((tmp_path / "killed" / "work").rglob("*.json"))) > 3

    def never(path):
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(sharded, "cluster_bucket", real)
    monkeypatch.setattr(sharded, "read_log_file", never)  # cleaning and merging are done
    got, _ = _sharded(settings, tmp_path / "killed")
    for name in FRAMES:
        pd.testing.assert_frame_equal(got[name], want[name])


def test_a_bad_file_stops_the_stage_and_names_itself(tiny_settings, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sharded, "GROUP_BYTES", 1)
    logs = Path(tiny_settings.data.path)
    bad = logs / "zz-broken.jsonl"
    row = json.dumps({"timestamp": "x", "question": "", "answer_id": "?"})
    bad.write_text("\n".join([row] * 20))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(GateFailed, match=r"raw_logs\.zz-broken") as failed:
        cluster_logs(
            tiny_settings, out, work_dir=tmp_path / "w", report_dir=tmp_path / "r", log=QUIET
        )
    assert failed.value.report_path == tmp_path / "r" / "raw_logs.zz-broken.json"
    assert not list(out.iterdir())


def test_groups_keep_file_order_and_size(tmp_path) -> None:
    sizes = [5, 5, 12, 1, 1, 1]
    files = []
    for i, size in enumerate(sizes):
        files.append(tmp_path / f"{i}.csv")
        files[-1].write_bytes(b"x" * size)
    groups = file_groups(files, group_bytes=10)
    names = [[f.name for f in g] for g in groups]
    assert names == [["0.csv", "1.csv"], ["2.csv"], ["3.csv", "4.csv", "5.csv"]]
    assert [f for g in groups for f in g] == files


def test_buckets_follow_cluster_id_order() -> None:
    ids = np.sort(np.random.default_rng(0).integers(0, 2**63 - 1, 1000, dtype=np.int64))
    for bits in (0, 1, 3, 6):
        buckets = bucket_of(ids, bits)
        assert buckets.min() >= 0 and buckets.max() < 2**bits
        assert (np.diff(buckets) >= 0).all()


def test_the_example_logs_are_too_few_clusters_and_nothing_is_written(
    tiny_settings, tmp_path
) -> None:
    """examples/my_logs.csv (40 questions, 8 answers) under params.yaml's split tolerance."""
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(Path(__file__).parents[2] / "examples" / "my_logs.csv", logs)
    data = tiny_settings.data.model_copy(update={"path": str(logs)})
    quality = tiny_settings.quality.model_copy(update={"split_ratio_tolerance": 0.05})
    settings = tiny_settings.model_copy(update={"data": data, "quality": quality})
    with pytest.raises(TooFewClusters, match="40 questions in 8 paraphrase clusters"):
        _sharded(settings, tmp_path)
    assert not any((tmp_path / "out").iterdir())
    with pytest.raises(TooFewClusters, match="at least 14 clusters"):
        build_clusters(settings, tmp_path / "memory", QUIET)

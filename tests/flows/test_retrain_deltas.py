"""Retraining and `qpr index add` at once (flows/retrain.py, qpr.ops.cycle): no question an
add acknowledged while a cycle ran is lost, whether the cycle fails or succeeds.

The tests share one throw-away project (its own git repository, DVC project, tiny params
and MLflow registry model, registry.follow_deltas on) and run in file order. Each add is
`qpr index add` in a process of its own, run where the cycle's pipeline step puts it:

1. a cycle that succeeds: the add comes after `dvc repro` (so after the register stage
   copied the bundle) and before the commit point. The new champion must hold it.
2. a cycle that fails: `dvc repro index` builds a new base (another encoder, of another
   width), the add is encoded by it, then the pipeline fails. After the rollback the old
   base is back and the add is live on it, encoded again by the old encoder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import pytest
import yaml

import flows.retrain as retrain
from qpr.config import settings_from_dict
from qpr.data.clustering import stable_id
from qpr.data.synth import SynthSpec, write_day, write_logs
from qpr.deltas.format import check_deltas, live_questions
from qpr.ops import cycle as ops
from qpr.ops import registry
from qpr.retrieval.bundle import Bundle
from qpr.text.normalize import normalize
from tests.conftest import REPO_ROOT, tiny_overrides

pytestmark = pytest.mark.slow

NAME = "qpr-retrain-deltas-test"  # its own registered model
COPIED = ("dvc.yaml", ".gitignore", ".dvcignore", "flows", "src")
# Questions no log of the synthetic generator holds (so no cycle indexes them itself).
DURING_SUCCESS = ["where can i rent a purple submarine", "how long does a flying carpet last"]
DURING_FAILURE = ["can a teapot orbit the moon", "why do zebras hum at breakfast"]


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _sh(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(list(args), cwd=root, env=env or _env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed: {done.stderr or done.stdout}"
    return done.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC project: this repository's pipeline code, tiny params, three days of
    logs versioned with `dvc add` and committed. No pipeline has run yet."""
    root = tmp_path_factory.mktemp("retrain-deltas") / "project"
    root.mkdir()
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    tree = tiny_overrides(
        root,
        registry={"name": NAME, "margin": 0.0, "min_metric": 0.0, "follow_deltas": True},
        retrain={"git_commit": True},
        mlflow={"experiment": "qpr-retrain-deltas-tests"},
    )
    tree["data"]["path"] = "data/logs"
    settings = settings_from_dict(tree)
    (root / "params.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    synth = settings.data.synth
    write_logs(
        root / "data" / "logs",
        SynthSpec(
            seed=synth.seed,
            start=synth.start,
            days=synth.days,
            rows_per_day=synth.rows_per_day,
            intents=synth.intents,
        ),
    )
    _sh(root, "git", "init", "-q")
    _sh(root, "git", "config", "user.email", "tests@example.com")
    _sh(root, "git", "config", "user.name", "tests")
    _sh(root, "dvc", "init", "-q")
    _sh(root, "dvc", "add", "-q", "data")
    _sh(root, "git", "add", "-A")
    _sh(root, "git", "commit", "-q", "-m", "three days of logs")
    return root


def _day(project: Path, day: int) -> Path:
    synth = yaml.safe_load((project / "params.yaml").read_text())["data"]["synth"]
    return write_day(
        project / "incoming" / "logs",
        date(2026, 10, day),
        seed=synth["seed"],
        rows=synth["rows_per_day"],
        intents=synth["intents"],
    )


def _add(project: Path, texts: list[str]) -> dict:
    """`qpr index add` of `texts` in a process of its own (publishing as an operator's add
    does); what it acknowledged."""
    listing = project / f"add-{hashlib.sha256(texts[0].encode()).hexdigest()[:8]}.txt"
    listing.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = _sh(
        project,
        *(sys.executable, "-m", "qpr.cli", "index", "add", str(listing)),
        *("--models-dir", str(project / "models"), "--params", str(project / "params.yaml")),
    )
    acknowledged = json.loads(out)
    assert acknowledged["added"] == len(texts), acknowledged
    return acknowledged


def _pipeline(monkeypatch: pytest.MonkeyPatch, repro) -> None:
    """The cycle's pipeline step replaced by `repro(cycle, journal)`."""
    monkeypatch.setattr(retrain, "STEPS", dataclasses.replace(retrain.STEPS, repro=repro))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_live(models: Path, texts: list[str]) -> None:
    """Each text is served by `models` and a search for it finds it first, at distance 0:
    its vector was made by the encoder the bundle queries with."""
    assert check_deltas(models) == {}
    live = set(live_questions(models)["text"])
    assert set(texts) <= live, f"not live in {models}: {set(texts) - live}"
    bundle = Bundle.load(models)
    for text in texts:
        best = bundle.search(text, k=1, threshold=float("inf")).hits[0]
        assert best.question_id == stable_id(normalize(text)), (text, best)
        assert best.distance < 1e-4, (text, best)


def _assert_in_champion(texts: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="qpr-champion-") as tmp:
        _assert_live(registry.download_bundle(NAME, registry.CHAMPION, Path(tmp)), texts)


def test_an_add_acknowledged_after_the_register_stage_is_in_the_new_champion(
    prefect_harness, project: Path, monkeypatch: pytest.MonkeyPatch
):
    _day(project, 4)
    acknowledged: list[dict] = []

    def repro_then_add(cycle: ops.Cycle, journal) -> None:
        ops.repro(cycle, journal)  # the real `dvc repro`: the register stage copied the bundle
        acknowledged.append(_add(project, DURING_SUCCESS))

    _pipeline(monkeypatch, repro_then_add)

    summary = retrain.retrain_flow(params=str(project / "params.yaml"))

    assert summary["outcome"] == "retrained", summary
    assert summary["register"]["promoted"] == 1 and acknowledged
    _assert_live(project / "models", DURING_SUCCESS)
    _assert_in_champion(DURING_SUCCESS)
    # Pinned as well: dvc.lock holds the delta, so `dvc checkout` brings it back.
    assert json.loads(_sh(project, "dvc", "status", "--json") or "{}") == {}


def test_an_add_acknowledged_during_a_failed_cycle_is_live_after_the_rollback(
    prefect_harness, project: Path, monkeypatch: pytest.MonkeyPatch
):
    models = project / "models"
    encoder = _digest(models / "encoder.onnx")
    _day(project, 5)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["model"]["output_dim"] = 2  # the failed cycle's base: vectors of another width
    (project / "params.yaml").write_text(yaml.safe_dump(params))

    def new_base_add_then_fail(cycle: ops.Cycle, journal) -> None:
        _sh(project, "dvc", "repro", "index", env=cycle.env)  # a new encoder and main index
        assert _digest(models / "encoder.onnx") != encoder
        _add(project, DURING_FAILURE)  # encoded by the new encoder
        raise RuntimeError("the pipeline failed after the add")

    _pipeline(monkeypatch, new_base_add_then_fail)

    with pytest.raises(RuntimeError, match="failed after the add"):
        retrain.retrain_flow(params=str(project / "params.yaml"))

    assert _digest(models / "encoder.onnx") == encoder  # the old base is back
    _assert_live(models, DURING_SUCCESS + DURING_FAILURE)
    _assert_in_champion(DURING_SUCCESS + DURING_FAILURE)
    # Pinned again (params.yaml still asks for the failed cycle's model: the train stage
    # is out of date, the index stage is not).
    assert json.loads(_sh(project, "dvc", "status", "--json", "index") or "{}") == {}

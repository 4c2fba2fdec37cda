"""What a registry version stores, on a real (sqlite + file store) MLflow registry: a
published delta stores its delta and references its base; a changed search config stores
that file; every way of loading (download_bundle, the service's source through
`Searcher.load`, the pyfunc) puts base + delta together and checks every digest; rollback
to and from a delta version serves; versions registered before (whole copies) still load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote, urlparse

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from qpr import Searcher
from qpr.artifacts import IDS_FILE, METRICS_FILE, SearchConfig
from qpr.deltas.add import add_questions
from qpr.deltas.publish import register_deltas
from qpr.ops import registry
from qpr.ops.pyfunc import (
    ModelIntegrityError,
    StoredFileUnavailable,
    _signature,
    _stage_code,
    digests,
)
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.serve.sources import SourceError
from tests.serve.test_app import QIDS, QUESTIONS, build_bundle
from tests.session_experiment import session_experiment

METRICS = {"success_1": 0.5, "val": {"recip_rank": 0.6}}
EXPERIMENT = "qpr-registry-storage-tests"
NEW = {9001: "how do i return a parcel abroad", 9002: "where is my refund for the lamp"}
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def experiment() -> Iterator[str]:
    """Artifacts in the session's file store, where a version's stored bytes can be read."""
    with session_experiment(EXPERIMENT) as experiment_id:
        yield experiment_id


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("storage") / "models", QUESTIONS, QIDS)


@pytest.fixture
def models(base_dir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str]:
    """A fresh copy of the bundle and a registered model of its own, the bundle its
    promoted first version."""
    import shutil

    models = Path(shutil.copytree(base_dir, tmp_path / "models"))
    name = f"storage-{request.node.name[:40]}"
    first = registry.register_bundle(models, METRICS, name=name, dedupe=False)
    registry.mark_committed(name, first.version, by="tests")
    registry.promote(name, first.version, reason="base", actor="tests")
    return models, name


def _add(models: Path, qid: int) -> None:
    frame = pd.DataFrame(
        {"question_id": [qid], "text": [NEW[qid]], "cluster_id": [-1], "answer_id": ["new"]}
    )
    add_questions(models, frame)


def _publish(models: Path, name: str, qid: int) -> registry.VersionInfo:
    _add(models, qid)
    info, said = register_deltas(models, name=name, actor="tests", reason=f"delta {qid}")
    assert said == "promoted" and info is not None
    return info


def _stored(name: str, version: int) -> dict[str, int]:
    """{path under the version's model folder: bytes} of what the store holds for it."""
    uri = MlflowClient().get_model_version_download_uri(name, str(version))
    root = Path(unquote(urlparse(uri).path))
    return {
        p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()
    }


def _served(name: str, tmp: Path, alias: str = registry.CHAMPION) -> set[int]:
    """The question ids the version at `alias` finds for the new questions, loaded the
    three ways: download_bundle, Searcher.load (the service's source) and the pyfunc."""
    bundle = Bundle.load(registry.download_bundle(name, alias, tmp))
    found = {h.question_id for q in NEW.values() for h in bundle.search(q, k=1).hits}
    searcher = Searcher.load(f"models:/{name}@{alias}")
    assert {h.question_id for q in NEW.values() for h in searcher.search(q, k=1).hits} == found
    model = mlflow.pyfunc.load_model(f"models:/{name}@{alias}")
    predicted = model.predict(list(NEW.values()), params={"k": 1})
    assert {int(q) for q in predicted["question_id"]} == found
    return found & set(NEW)


def test_a_published_delta_stores_only_its_delta(models, tmp_path: Path) -> None:
    models, name = models
    base = registry.champion(name)
    delta = _publish(models, name, 9001)

    stored = _stored(name, delta.version)
    files = {rel: size for rel, size in stored.items() if rel.startswith("artifacts/")}
    delta_files = {
        p.relative_to(models).as_posix(): p.stat().st_size
        for p in (models / "deltas").rglob("*")
        if p.is_file()
    }
    manifest = files.pop("artifacts/manifest.json")
    assert {rel.removeprefix("artifacts/bundle/"): s for rel, s in files.items()} == delta_files
    assert sum(files.values()) == sum(delta_files.values())  # no code, no base file again
    # The rest is metadata: the manifest, MLmodel, the model code and its loader.
    assert sum(stored.values()) - sum(files.values()) < 64_000 and manifest < 40_000
    assert sum(_stored(name, base.version).values()) > 20 * sum(stored.values())
    held = json.loads(
        (
            Path(registry.download_bundle(name, registry.CHAMPION, tmp_path)).parent
            / "manifest.json"
        ).read_text(encoding="utf-8")
    )["files"]
    assert held["bundle/index/index.faiss"]["version"] == base.version
    assert held["bundle/deltas/0001/ids.npy"]["version"] is None
    assert held["code/qpr/ops/pyfunc.py"]["version"] == base.version


def test_the_assembled_download_is_the_bundle_byte_for_byte(models, tmp_path: Path) -> None:
    models, name = models
    _publish(models, name, 9001)
    folder = registry.download_bundle(name, registry.CHAMPION, tmp_path / "dl")
    expected = registry._stage_bundle(models, METRICS, tmp_path / "expected")
    assert digests(folder) == digests(expected)
    assert (folder / METRICS_FILE).is_file()
    assert _served(name, tmp_path / "served") == {9001}


def test_rollback_to_and_from_a_delta_version_serves(models, tmp_path: Path) -> None:
    models, name = models
    base = registry.champion(name)
    first = _publish(models, name, 9001)
    assert _served(name, tmp_path / "a") == {9001}
    registry.rollback(name, reason="bad delta", actor="tests")  # back to the base
    assert registry.champion(name).version == base.version
    assert _served(name, tmp_path / "b") == set()

    registry.promote(name, first.version, reason="it was fine", actor="tests")
    second = _publish(models, name, 9002)  # references the base and the first delta
    assert _served(name, tmp_path / "c") == {9001, 9002}
    registry.rollback(name, reason="second delta is bad", actor="tests")  # to a delta version
    assert registry.champion(name).version == first.version
    assert _served(name, tmp_path / "d") == {9001}
    registry.promote(name, second.version, reason="fixed", actor="tests")
    assert _served(name, tmp_path / "e") == {9001, 9002}


def test_a_changed_search_config_stores_that_file_only(models) -> None:
    """What a `dvc exp run` that changes only a search knob registers."""
    models, name = models
    config = SearchConfig.read(models)
    replace(config, threshold=(config.threshold or 1.0) * 0.9, target_precision=0.95).write(models)
    info = registry.register_bundle(models, {**METRICS, "success_1": 0.51}, name=name)
    stored = {rel for rel in _stored(name, info.version) if rel.startswith("artifacts/")}
    assert stored == {
        "artifacts/manifest.json",
        "artifacts/bundle/search.json",
        "artifacts/bundle/metrics.json",
    }


def test_a_version_without_the_committed_mark_holds_nothing_for_others(base_dir, tmp_path):
    """A retraining cycle's version before its commit point is deleted if the cycle rolls
    back: no other version may take files from it."""
    import shutil

    name = "storage-unmarked"
    models = Path(shutil.copytree(base_dir, tmp_path / "models"))
    registry.register_bundle(models, METRICS, name=name)
    info = registry.register_bundle(models, {**METRICS, "success_1": 0.51}, name=name)
    bundle = {rel for rel in _stored(name, info.version) if rel.startswith("artifacts/bundle/")}
    assert f"artifacts/bundle/{IDS_FILE.as_posix()}" in bundle and len(bundle) > 5
    assert registry.stored_files(name) == {}


def test_a_changed_base_file_is_refused_naming_it_and_its_version(models, tmp_path) -> None:
    models, name = models
    base = registry.champion(name)
    _publish(models, name, 9001)
    location = Path(
        unquote(
            urlparse(MlflowClient().get_model_version_download_uri(name, str(base.version))).path
        )
    )
    ids = location / "artifacts" / "bundle" / IDS_FILE
    np.save(ids, np.arange(len(QUESTIONS), dtype=np.int64) + 500)  # same shape, other ids

    with pytest.raises(registry.RegistryError) as caught:
        registry.download_bundle(name, registry.CHAMPION, tmp_path)
    assert f"{IDS_FILE.as_posix()}: sha256" in str(caught.value)
    assert f"stored by version {base.version} of {name!r}" in str(caught.value)
    with pytest.raises(BundleError, match=f"{IDS_FILE.as_posix()}: sha256"):
        Searcher.load(f"models:/{name}@champion")
    with pytest.raises(ModelIntegrityError, match=f"{IDS_FILE.as_posix()}: sha256"):
        mlflow.pyfunc.load_model(f"models:/{name}@champion")


def test_a_deleted_base_is_refused_and_never_referenced_again(models, tmp_path) -> None:
    models, name = models
    base = registry.champion(name)
    _publish(models, name, 9001)
    MlflowClient().delete_model_version(name, str(base.version))

    with pytest.raises(registry.RegistryError) as caught:
        registry.download_bundle(name, registry.CHAMPION, tmp_path)
    message = str(caught.value)
    assert f"stored by version {base.version} of {name!r}, which cannot be read" in message
    assert "deleted" in message and message.count(": stored by version") == 1
    with pytest.raises(SourceError, match=f"version {base.version}"):
        Searcher.load(f"models:/{name}@champion")
    with pytest.raises(StoredFileUnavailable, match=f"version {base.version}"):
        mlflow.pyfunc.load_model(f"models:/{name}@champion")

    # The next version stores the base files again: the deleted version is no holder.
    latest = _publish(models, name, 9002)
    held = {e[0] for e in registry.stored_files(name).values()}
    assert base.version not in held and latest.version in held
    assert _served(name, tmp_path / "after") == {9001, 9002}


# What log_search_model did before versions referenced each other: a flat manifest, every
# bundle file stored, the qpr package as MLflow's code/ folder.
_MODEL_CODE_BEFORE = (
    '"""QPR\'s search model, logged as code (qpr.ops.pyfunc)."""\n\nimport mlflow\n\n'
    "from qpr.ops.pyfunc import QPRSearchModel\n\nmlflow.models.set_model(QPRSearchModel())\n"
)


def _register_as_before(models: Path, name: str, work: Path) -> int:
    staged = registry._stage_bundle(models, METRICS, work / "bundle")
    manifest = work / "manifest.json"
    manifest.write_text(json.dumps(digests(staged), indent=1, sort_keys=True), "utf-8")
    (work / "model.py").write_text(_MODEL_CODE_BEFORE, encoding="utf-8")
    with mlflow.start_run(run_name="register-before"):
        logged = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(work / "model.py"),
            artifacts={"bundle": str(staged), "manifest": str(manifest)},
            code_paths=[str(_stage_code(work / "code") / "qpr")],
            pip_requirements=["mlflow"],
            signature=_signature(),
            input_example=["how do i reset my password"],
        )
    client = MlflowClient()
    client.create_registered_model(name)
    tags = {  # what such a version records, as tags (before the details file)
        registry.TAG_BASE: registry.base_fingerprint(models),
        registry.TAG_MEASURES: json.dumps({"success_1": 0.5, "val.recip_rank": 0.6}),
        registry.TAG_METRIC: "val.recip_rank",
    }
    mv = client.create_model_version(name, logged.model_uri, tags=tags, model_id=logged.model_id)
    registry.mark_committed(name, mv.version, by="tests")
    registry.promote(name, mv.version, reason="before", actor="tests")
    return int(mv.version)


def test_a_version_registered_before_loads_and_is_referenced(base_dir, tmp_path) -> None:
    import shutil

    name = "storage-before"
    models = Path(shutil.copytree(base_dir, tmp_path / "models"))
    old = _register_as_before(models, name, tmp_path / "old")
    assert "code/qpr/ops/pyfunc.py" in _stored(name, old)  # a whole copy, as before
    assert _served(name, tmp_path / "a") == set()

    delta = _publish(models, name, 9001)
    stored = {rel for rel in _stored(name, delta.version) if rel.startswith("artifacts/bundle/")}
    assert stored == {
        f"artifacts/bundle/{p.relative_to(models).as_posix()}"
        for p in (models / "deltas").rglob("*")
        if p.is_file()
    }
    assert _served(name, tmp_path / "b") == {9001}
    registry.rollback(name, reason="back", actor="tests")
    assert registry.champion(name).version == old
    assert _served(name, tmp_path / "c") == set()


def test_a_version_loads_where_qpr_is_not_installed(models, tmp_path: Path) -> None:
    """`mlflow models serve` builds an environment without qpr: the model code fetches the
    package the version references (it stores none itself) before importing it."""
    models, name = models
    delta = _publish(models, name, 9001)
    assert not any(rel.startswith("artifacts/code/") for rel in _stored(name, delta.version))
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.path.append({sysconfig.get_paths()["purelib"]!r})
        assert importlib.util.find_spec("qpr") is None, "qpr is importable"
        import mlflow
        model = mlflow.pyfunc.load_model("models:/{name}@champion")
        import qpr
        print(qpr.__file__)
        print(model.predict([{NEW[9001]!r}], params={{"k": 1}})["question_id"].iloc[0])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    # -S: no site-packages .pth files, so the editable install of qpr is not on the path.
    done = subprocess.run(
        [sys.executable, "-S", "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    where, found = done.stdout.split()[-2:]
    assert "qpr-code-" in where and int(found) == 9001

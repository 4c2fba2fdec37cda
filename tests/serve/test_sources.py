"""Bundle sources: the registry during an outage (bounded polls, the kept bundles), only
versions whose run committed (the qpr.committed mark), and a local folder whose delta
files are watched."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from qpr.retrieval.bundle import Bundle
from qpr.serve.app import create_app
from qpr.serve.reload import Reloader
from qpr.serve.settings import ServeSettings
from qpr.serve.sources import Candidate, LocalSource, RegistrySource, SourceError
from tests.serve.test_reload import IDS1, Q1, build_bundle

SETTINGS = ServeSettings(poll_seconds=0, canaries=4, default_k=3)
PASSWORD = "s3cret-pw-42"


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "v1", Q1, IDS1, seed=0)


def closed_port() -> int:
    """A local port nothing listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable_registry(cache_dir: Path | None) -> RegistrySource:
    uri = f"http://bob:{PASSWORD}@127.0.0.1:{closed_port()}"
    return RegistrySource("qpr", tracking_uri=uri, registry_uri=uri, cache_dir=cache_dir)


def test_poll_of_an_unreachable_registry_fails_fast() -> None:
    # MLflow's own retries (7, backoff factor 2) held a start for minutes.
    source = unreachable_registry(None)
    started = time.monotonic()
    with pytest.raises(SourceError):
        source.poll()
    assert time.monotonic() - started < 5


def test_start_in_an_outage_opens_at_once_and_says_why(tmp_path: Path) -> None:
    app = create_app(unreachable_registry(tmp_path / "cache"), SETTINGS)
    reloader: Reloader = app.state.service.reloader
    started = time.monotonic()
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert time.monotonic() - started < 5
        assert reloader.first_check.wait(10)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
        assert PASSWORD not in ready.text and "bob:" not in ready.text
        assert "mlflow:models:/qpr@champion" in ready.json()["reason"]
        assert client.post("/search", json={"question": Q1[0]}).status_code == 503


def test_start_in_an_outage_serves_the_kept_bundle(bundle_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = unreachable_registry(cache)
    kept = Candidate(token="qpr/3", name="qpr", version="3", alias="champion")
    source.keep(kept, bundle_dir)  # as the reloader does after a version passed its checks
    source.keep(Candidate(token="qpr/2", name="qpr", version="2", alias="champion"), bundle_dir)
    assert sorted(p.name for p in (cache / "qpr").iterdir()) == ["2", "3"]

    app = create_app(source, SETTINGS.replace(startup_wait=60))
    with TestClient(app) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["model"]["version"] == "3"
        assert PASSWORD not in ready.text and "***@127.0.0.1" in ready.json()["source_unreachable"]
        hit = client.post("/search", json={"question": Q1[4]}).json()["hits"][0]
        assert hit["question_id"] == str(IDS1[4])


def test_keep_prunes_old_versions(bundle_dir: Path, tmp_path: Path) -> None:
    source = unreachable_registry(tmp_path)
    for version in ("8", "9", "10"):
        source.keep(Candidate(token=version, name="qpr", version=version, alias="a"), bundle_dir)
    assert sorted(p.name for p in (tmp_path / "qpr").iterdir()) == ["10", "9"]
    newest = source.fallback()
    assert newest is not None and newest.version == "10" and newest.token == "kept:qpr/10"
    with source.materialize(newest) as path:
        assert (path / "vocab.json").is_file()


class _Client:
    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags

    def get_model_version_by_alias(self, name: str, alias: str) -> SimpleNamespace:
        return SimpleNamespace(version="7", run_id="", tags=self.tags)


def test_a_version_without_the_committed_mark_is_not_served():
    source = RegistrySource("qpr", client=_Client({"qpr.bundle_fingerprint": "ab"}))
    with pytest.raises(SourceError, match=r"qpr\.committed"):
        source.poll()


def test_a_committed_version_is_served():
    source = RegistrySource("qpr", client=_Client({"qpr.committed": "retrain-cycle run"}))
    assert source.poll().version == "7"


def test_a_delta_file_changed_in_place_is_noticed_and_its_repair_served(
    bundle_dir: Path, tmp_path: Path
) -> None:
    """The manifest does not change when a delta's file is damaged or restored: the
    local source watches each delta file too, so both reach the service at the next poll."""
    import pandas as pd

    from qpr.artifacts import DELTA_QUESTIONS_FILE
    from qpr.deltas.add import add_questions
    from qpr.deltas.format import delta_dir
    from qpr.serve.reload import SWAPPED, UNCHANGED, ModelHolder

    models = Path(shutil.copytree(bundle_dir, tmp_path / "models"))
    frame = pd.DataFrame({"question_id": [1, 2], "text": ["fix my kite", "rent a tent"]})
    add_questions(models, frame.assign(cluster_id=-1))
    source = LocalSource(models)
    assert source.backoff is False and RegistrySource.backoff is True
    holder = ModelHolder()
    reloader = Reloader(source, holder, load=lambda path: Bundle.load(path), canaries=3)
    assert reloader.check() == SWAPPED and holder.current is not None
    assert holder.current.info.failed_deltas == {}

    table = models / delta_dir(1) / DELTA_QUESTIONS_FILE
    kept = table.read_bytes()
    table.write_bytes(kept[:-10])  # damaged in place: the manifest is as it was
    assert reloader.check() == SWAPPED
    assert list(holder.current.info.failed_deltas) == [1] and holder.current.bundle.size == len(Q1)
    table.write_bytes(kept)  # restored in place (dvc checkout, a backup)
    assert reloader.check() == SWAPPED
    assert holder.current.info.failed_deltas == {} and holder.current.bundle.size == len(Q1) + 2
    assert reloader.check() == UNCHANGED


def test_every_registry_call_gives_up_on_a_registry_that_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Accepts, never answers: each call fails after one read timeout (1 s here), none
    retries for minutes as MLflow's defaults would."""
    import threading

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # the operator's value wins
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel completes the handshakes; nothing reads or answers
    uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
    source = RegistrySource("qpr", tracking_uri=uri, registry_uri=uri)
    outcomes: dict[str, object] = {}

    def call(name: str, run) -> None:
        try:
            outcomes[name] = run()
        except Exception as exc:
            outcomes[name] = exc

    def download() -> None:
        with source.materialize(Candidate(token="qpr/3", name="qpr", version="3", alias="a")):
            pass

    calls = {"poll": source.poll, "run": lambda: source._run_commit("r1"), "download": download}
    threads = [threading.Thread(target=call, args=item, daemon=True) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    listener.close()
    assert not any(thread.is_alive() for thread in threads), outcomes
    assert isinstance(outcomes["poll"], SourceError)
    assert outcomes["run"] is None  # best effort: no commit, no wait
    assert isinstance(outcomes["download"], Exception)


def test_a_copy_cut_short_is_not_a_kept_version(bundle_dir: Path, tmp_path: Path) -> None:
    source = unreachable_registry(tmp_path)
    source.keep(Candidate(token="qpr/4", name="qpr", version="4", alias="a"), bundle_dir)
    partial = tmp_path / "qpr" / ".partial-x1"  # stopped between the record and the rename
    (partial / "bundle").mkdir(parents=True)
    (partial / "qpr-kept.json").write_text('{"version": "5"}')
    newest = source.fallback()
    assert newest is not None and newest.version == "4"

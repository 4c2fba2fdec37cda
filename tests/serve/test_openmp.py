"""FAISS's OpenMP limit reaches the threads that search (libgomp keeps it per thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import pytest
from fastapi.testclient import TestClient

from qpr.retrieval.bundle import Bundle
from qpr.serve.app import create_app
from qpr.serve.openmp import OpenMPThreads
from qpr.serve.sources import LocalSource
from tests.serve.test_app import QIDS, QUESTIONS, SETTINGS, build_bundle


def in_new_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join()
    return out[0]


def test_a_limit_set_in_one_thread_does_not_reach_another() -> None:
    # The runtime behaviour the module works around; if libgomp ever shares the
    # setting, this fails and the workaround can go.
    default = in_new_thread(faiss.omp_get_max_threads)
    limited = OpenMPThreads(default + 1)
    assert in_new_thread(lambda: limited.call(faiss.omp_get_max_threads)) == default + 1
    assert in_new_thread(faiss.omp_get_max_threads) == default


def test_call_passes_arguments_and_returns() -> None:
    limited = OpenMPThreads(1)
    assert in_new_thread(lambda: limited.call(divmod, 7, 2)) == (3, 1)
    assert in_new_thread(lambda: limited.call(dict, a=1)) == {"a": 1}


def test_zero_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"):
        OpenMPThreads(0)


def test_the_service_searches_with_its_limit(tmp_path: Path) -> None:
    bundle_dir = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    wanted = in_new_thread(faiss.omp_get_max_threads) + 1  # not what a thread starts with
    caller = faiss.omp_get_max_threads()
    seen: list[tuple[str, int, bool]] = []

    def load(path: Path) -> Bundle:
        bundle = Bundle.load(path)

        def recording(method: Callable[..., Any], name: str) -> Callable[..., Any]:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                main = threading.current_thread() is threading.main_thread()
                seen.append((name, faiss.omp_get_max_threads(), main))
                return method(*args, **kwargs)

            return wrapped

        bundle.search = recording(bundle.search, "search")  # type: ignore[method-assign]
        bundle.search_batch = recording(bundle.search_batch, "batch")  # type: ignore[method-assign]
        return bundle

    app = create_app(LocalSource(bundle_dir), SETTINGS.replace(faiss_threads=wanted), load=load)
    assert faiss.omp_get_max_threads() == caller  # building the app leaves this thread alone
    with TestClient(app) as client:
        seen.clear()  # the canaries and the warm-up ran in the loader's thread
        assert client.post("/search", json={"question": QUESTIONS[0]}).status_code == 200
        response = client.post("/search/batch", json={"questions": QUESTIONS[:2]})
        assert response.status_code == 200
    # search_batch is also what search calls inside: each call saw the limit
    assert {name for name, _, _ in seen} == {"search", "batch"}
    assert all(threads == wanted and not main for _, threads, main in seen), seen

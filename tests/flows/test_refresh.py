"""flows/refresh.py: the new questions of retrain.incoming into a delta, the files left
where they are for the daily retrain; a second run finds nothing new."""

from __future__ import annotations

from pathlib import Path

from qpr.data.synth import write_day
from qpr.deltas.format import read_manifest
from qpr.retrieval.bundle import Bundle


def test_refresh_adds_incoming_questions_once(tiny_params_file: Path) -> None:
    import datetime as dt

    from flows.refresh import add_incoming
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    root = tiny_params_file.parent
    build_bundle(root / "models", QUESTIONS, QIDS)
    incoming = root / "incoming" / "logs"
    day = write_day(incoming, dt.date(2027, 1, 1), seed=3, rows=40, intents=5)
    before = Bundle.load(root / "models").size

    first = add_incoming.fn(tiny_params_file)
    assert first["files"] == 1 and first["added"] > 0
    assert Bundle.load(root / "models").size == before + first["added"]
    assert day.is_file()  # left for the retrain cycle
    assert len(read_manifest(root / "models").deltas) == 1

    again = add_incoming.fn(tiny_params_file)
    assert again["files"] == 0 and again["added"] == 0

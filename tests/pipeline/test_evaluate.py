"""The evaluate stage's parts that need no trained model (qpr.pipeline.evaluate)."""

from __future__ import annotations

import json
from pathlib import Path

from qpr.pipeline.evaluate import _log_threshold


def test_the_threshold_log_shouts_each_warning() -> None:
    lines: list[str] = []
    threshold = {
        "value": 0.61,
        "rule": "bound",
        "test_answered_share": 0.449,
        "test_precision_at_1": 0.861,
        "test_false_answer_rate": 0.18,
        "test_unanswerable": 2259,
        "warnings": ["answers only 44.9% of the answerable test queries"],
    }
    _log_threshold(threshold, lines.append)
    assert "44.9%" in lines[0] and "18.0% of the 2259 with no paraphrase" in lines[0]
    assert lines[1:] == [
        "WARNING: no-answer threshold: answers only 44.9% of the answerable test queries"
    ]
    quiet: list[str] = []
    _log_threshold({**threshold, "warnings": []}, quiet.append)
    assert len(quiet) == 1 and "WARNING" not in quiet[0]


def test_search_json_declares_the_query_encoder_the_stages_left(tmp_path: Path) -> None:
    """The evaluate stage runs after the index and student stages: search.json names the
    encoder their files say queries go through, in the current format."""
    from qpr.artifacts import (
        QUERY_ENCODER_FILE,
        SEARCH_FILE,
        SEARCH_FORMAT,
        STUDENT_FILE,
        QueryEncoderEntry,
        SearchConfig,
    )
    from qpr.config import Settings
    from qpr.paths import ProjectPaths
    from qpr.pipeline.evaluate import write_search_config

    paths = ProjectPaths(tmp_path)
    for rel in (QUERY_ENCODER_FILE, STUDENT_FILE):
        (paths.models_dir / rel).parent.mkdir(parents=True)
        (paths.models_dir / rel).write_bytes(b"onnx")
    path = write_search_config(paths, Settings(), threshold=0.5, val_share=0.7)
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert path == paths.models_dir / SEARCH_FILE and payload["format"] == SEARCH_FORMAT
    assert payload["query_encoder"] == {"kind": "student", "files": [STUDENT_FILE.as_posix()]}
    declared = SearchConfig.read(paths.models_dir).query_encoder
    assert declared == QueryEncoderEntry("student", (STUDENT_FILE,))

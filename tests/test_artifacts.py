"""The bundle's contract: SearchConfig written and read back (search.json and an older
bundle's threshold.json), its serving precedence, the query encoder it declares, and
older bundles' configs read as the current format (migrate)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from qpr.artifacts import (
    ENCODER_FILE,
    LEGACY_SEARCH_FILE,
    QUERY_ENCODER_FILE,
    SEARCH_FILE,
    SEARCH_FORMAT,
    STUDENT_FILE,
    QueryEncoderEntry,
    SearchConfig,
    SearchConfigError,
    detect_query_encoder,
    migrate,
    search_config_file,
    served_query_encoder,
)

ONNX = QueryEncoderEntry("onnx", (ENCODER_FILE,))

FUSED = SearchConfig(
    threshold=1.25,
    dense_weight=0.6,
    lexical_candidates=100,
    dense_candidates=20,
    nprobe=384,
    ef_search=256,
    fused_nprobe=48,
    target_precision=0.9,
    val_answered_share=0.75,
    query_encoder=ONNX,
)


def test_write_then_read_gives_the_same_config(tmp_path: Path) -> None:
    student = QueryEncoderEntry("student", (STUDENT_FILE,))
    for config in (FUSED, SearchConfig(query_encoder=student), replace(FUSED, rerank_top=5)):
        path = config.write(tmp_path)
        assert path == tmp_path / SEARCH_FILE
        assert SearchConfig.read(tmp_path) == config
    payload = json.loads((tmp_path / SEARCH_FILE).read_text())
    assert payload["format"] == SEARCH_FORMAT
    assert payload["query_encoder"] == {"kind": "onnx", "files": ["encoder.onnx"]}
    # written without a declaration (a test's, a benchmark's): read as its files say
    SearchConfig(threshold=None, nprobe=16).write(tmp_path)
    assert "query_encoder" not in json.loads((tmp_path / SEARCH_FILE).read_text())
    assert SearchConfig.read(tmp_path) == SearchConfig(nprobe=16, query_encoder=ONNX)


def test_the_file_is_deterministic_plain_json(tmp_path: Path) -> None:
    first = FUSED.write(tmp_path / "a").read_bytes()
    # numpy scalars (what the evaluate stage computes with) give the same bytes
    again = SearchConfig(
        **{
            **asdict(FUSED),
            "threshold": np.float64(1.25),
            "dense_weight": np.float64(0.6),
            "lexical_candidates": np.int64(100),
        }
    )
    assert again.write(tmp_path / "b").read_bytes() == first
    payload = json.loads(first)
    assert list(payload) == sorted(payload)  # sorted keys, no timestamp among them
    # left out when None / False: bundles written before these keys keep their bytes
    left_out = {"rerank_top", "spelling", "companion", "companion_weight"}
    assert set(payload) == set(asdict(FUSED)) - left_out
    assert "query_encoder" not in json.loads(SearchConfig().write(tmp_path / "c").read_bytes())
    spelled = json.loads(replace(FUSED, spelling=True).write(tmp_path / "d").read_bytes())
    assert spelled["spelling"] is True
    assert SearchConfig.read(tmp_path / "d").spelling is True
    with pytest.raises(SearchConfigError, match="spelling"):
        SearchConfig(spelling="yes")  # type: ignore[arg-type]
    assert first.endswith(b"}\n")


def test_an_older_bundles_threshold_json_is_read(tmp_path: Path) -> None:
    legacy = {
        "threshold": 1.25,
        "target_precision": 0.9,
        "metric": "l2",
        "chosen_on": "val",
        "val_answered_share": 0.75,
        "fusion": {"dense_weight": 0.6, "candidates": 100, "dense_candidates": 20, "nprobe": 48},
    }
    (tmp_path / LEGACY_SEARCH_FILE).write_text(json.dumps(legacy), encoding="utf-8")
    assert search_config_file(tmp_path) == tmp_path / LEGACY_SEARCH_FILE
    config = SearchConfig.read(tmp_path)
    # its dense-only depth was the index file's: none named
    assert config == SearchConfig(**{**asdict(FUSED), "nprobe": None, "ef_search": None})
    assert config.fusion == legacy["fusion"]
    legacy["fusion"] = None
    (tmp_path / LEGACY_SEARCH_FILE).write_text(json.dumps(legacy), encoding="utf-8")
    dense = SearchConfig.read(tmp_path)
    assert not dense.fused and dense.fusion is None and dense.depth() == (None, None)
    # search.json wins once it exists
    FUSED.write(tmp_path)
    assert search_config_file(tmp_path) == tmp_path / SEARCH_FILE
    assert SearchConfig.read(tmp_path) == FUSED


def test_a_missing_or_bad_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(SearchConfigError, match=r"cannot read .*search\.json"):
        SearchConfig.read(tmp_path)
    (tmp_path / SEARCH_FILE).write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(SearchConfigError, match=r"search\.json: expected a JSON object"):
        SearchConfig.read(tmp_path)
    with pytest.raises(SearchConfigError, match="dense_weight"):
        SearchConfig(dense_weight=1.5, lexical_candidates=10)
    with pytest.raises(SearchConfigError, match="threshold"):
        SearchConfig(threshold=float("nan"))


def test_depth_one_source_at_serve_time() -> None:
    """fused_* for a fused bundle when the evaluate stage chose them, else the dense-only
    depth; None: the index file's own (Bundle.load's explicit arguments beat all)."""
    assert FUSED.depth() == (48, 256)
    assert SearchConfig(
        **{
            **asdict(FUSED),
            "dense_weight": None,
            "lexical_candidates": None,
            "dense_candidates": None,
            "fused_nprobe": None,
        }
    ).depth() == (384, 256)
    hnsw = SearchConfig(**{**asdict(FUSED), "fused_nprobe": None, "fused_ef_search": 40})
    assert hnsw.depth() == (384, 40)
    assert SearchConfig().depth() == (None, None)


def test_the_served_query_encoder(tmp_path: Path) -> None:
    assert served_query_encoder(tmp_path) == tmp_path / ENCODER_FILE
    (tmp_path / QUERY_ENCODER_FILE).parent.mkdir()
    (tmp_path / QUERY_ENCODER_FILE).write_bytes(b"int8")
    assert served_query_encoder(tmp_path) == tmp_path / QUERY_ENCODER_FILE


def test_the_id_map_lives_where_the_index_writes_it() -> None:
    from qpr.artifacts import IDS_FILE, INDEX_FILE
    from qpr.retrieval.dense import IdMap

    assert IdMap.path_for(INDEX_FILE) == IDS_FILE


def test_rerank_top_is_off_by_default_and_validated(tmp_path: Path) -> None:
    assert SearchConfig().rerank_top is None
    reranked = SearchConfig(threshold=0.5, rerank_top=np.int64(10), query_encoder=ONNX)
    assert reranked.rerank_top == 10 and type(reranked.rerank_top) is int
    reranked.write(tmp_path)
    assert json.loads((tmp_path / SEARCH_FILE).read_text())["rerank_top"] == 10
    assert SearchConfig.read(tmp_path) == reranked
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(SearchConfigError, match="rerank_top"):
            SearchConfig(rerank_top=bad)  # type: ignore[arg-type]
    (tmp_path / SEARCH_FILE).write_text(json.dumps({**asdict(SearchConfig()), "rerank_top": 0}))
    with pytest.raises(SearchConfigError, match=r"search\.json: rerank_top"):
        SearchConfig.read(tmp_path)


def test_the_declared_query_encoder_is_what_the_files_say(tmp_path: Path) -> None:
    """The evaluate stage declares it after the index and student stages wrote theirs."""
    assert detect_query_encoder(tmp_path) == ONNX
    for rel, kind in ((QUERY_ENCODER_FILE, "onnx-int8"), (STUDENT_FILE, "student")):
        (tmp_path / rel).parent.mkdir()
        (tmp_path / rel).write_bytes(b"onnx")
        assert detect_query_encoder(tmp_path) == QueryEncoderEntry(kind, (rel,))
    assert detect_query_encoder(tmp_path).files == (STUDENT_FILE,)  # the student wins


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "tflite", "files": ["a"]}, "kind 'tflite'"),
        ({"kind": "onnx", "files": ["index/query_encoder.onnx"]}, "loaded from"),
        ({"kind": "onnx", "files": "encoder.onnx"}, "a list of paths"),
        ({"kind": "onnx"}, "must be"),
        ("onnx", "must be"),
    ],
)
def test_a_bad_query_encoder_entry(tmp_path: Path, entry: object, message: str) -> None:
    with pytest.raises(SearchConfigError, match=message):
        SearchConfig(query_encoder=entry)  # type: ignore[arg-type]
    (tmp_path / SEARCH_FILE).write_text(json.dumps({"query_encoder": entry}))
    with pytest.raises(SearchConfigError, match=rf"search\.json: .*{message}"):
        SearchConfig.read(tmp_path)


def test_migrate_reads_an_older_search_json_as_the_current_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / SEARCH_FILE
    # a current file: as it is, nothing logged
    current = {"threshold": 1.0, "format": 2, "query_encoder": ONNX.as_json()}
    with caplog.at_level(logging.INFO, logger="qpr.artifacts"):
        assert migrate(current, path) == SearchConfig(threshold=1.0, query_encoder=ONNX)
    assert not caplog.records
    # format 1: no format, no declaration; fused without dense_candidates
    (tmp_path / QUERY_ENCODER_FILE).parent.mkdir()
    (tmp_path / QUERY_ENCODER_FILE).write_bytes(b"int8")
    old = {"threshold": 1.0, "dense_weight": 0.5, "lexical_candidates": 7}
    with caplog.at_level(logging.INFO, logger="qpr.artifacts"):
        config = migrate(old, path)
    assert config == SearchConfig(
        threshold=1.0,
        dense_weight=0.5,
        lexical_candidates=7,
        dense_candidates=7,  # now scored exactly
        query_encoder=QueryEncoderEntry("onnx-int8", (QUERY_ENCODER_FILE,)),
    )
    (record,) = caplog.records
    assert record.levelno == logging.WARNING  # its ranking changed
    for said in ("format 1 read as 2", "onnx-int8", "exact scoring"):
        assert said in record.getMessage()
    with pytest.raises(SearchConfigError, match="format 3 is newer"):
        migrate({**current, "format": 3}, path)
    for bad in (0, True, 2.0, "2"):
        with pytest.raises(SearchConfigError, match="format must be an integer"):
            migrate({**current, "format": bad}, path)
    with pytest.raises(SearchConfigError, match="this qpr writes 2"):
        SearchConfig(format=1)

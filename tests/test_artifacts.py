"""The bundle's contract: SearchConfig written and read back (search.json and an older
bundle's threshold.json), its serving precedence, and which query encoder is served."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from qpr.artifacts import (
    ENCODER_FILE,
    LEGACY_SEARCH_FILE,
    QUERY_ENCODER_FILE,
    SEARCH_FILE,
    SearchConfig,
    SearchConfigError,
    search_config_file,
    served_query_encoder,
)

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
)


def test_write_then_read_gives_the_same_config(tmp_path: Path) -> None:
    for config in (FUSED, SearchConfig(), SearchConfig(threshold=None, nprobe=16)):
        path = config.write(tmp_path)
        assert path == tmp_path / SEARCH_FILE
        assert SearchConfig.read(tmp_path) == config


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
    assert set(payload) == set(asdict(FUSED)) - {"rerank_top"}  # left out when None
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
    reranked = SearchConfig(threshold=0.5, rerank_top=np.int64(10))
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

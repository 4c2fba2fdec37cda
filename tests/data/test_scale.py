"""The scale corpus: deterministic shards, distinct questions, real-question word statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qpr.data.loaders import read_logs
from qpr.data.scale import ScaleSpec, parse_count, scale_queries, shard_path, write_scale_corpus
from qpr.retrieval.bm25 import BM25Index

QUIET = lambda _: None  # noqa: E731


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[ScaleSpec, list[Path]]:
    spec = ScaleSpec(20_000, seed=3, shard_rows=7_000)
    return spec, write_scale_corpus(spec, tmp_path_factory.mktemp("scale"), log=QUIET)


def test_shards_hold_the_asked_number_of_rows(corpus) -> None:
    spec, paths = corpus
    assert [len(pd.read_parquet(p)) for p in paths] == [7_000, 7_000, 6_000]
    assert spec.shards == 3


def test_a_shard_is_the_same_alone_or_in_a_range(corpus, tmp_path: Path) -> None:
    spec, paths = corpus
    again = write_scale_corpus(spec, tmp_path, log=QUIET)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths]
    shard_path(tmp_path, 1).unlink()  # a killed run: the missing shard is written again
    write_scale_corpus(spec, tmp_path, log=QUIET)
    assert shard_path(tmp_path, 1).read_bytes() == paths[1].read_bytes()


def test_another_spec_is_refused_in_the_same_folder(corpus) -> None:
    _, paths = corpus
    with pytest.raises(ValueError, match="another scale corpus"):
        write_scale_corpus(ScaleSpec(10, seed=3), paths[0].parent, log=QUIET)


def test_the_log_loader_reads_it(corpus) -> None:
    _, paths = corpus
    logs = read_logs(paths[0].parent)
    assert len(logs) == 20_000 and {"question", "answer_id", "timestamp"} <= set(logs.columns)


def test_questions_are_distinct_and_clustered(corpus) -> None:
    _, paths = corpus
    logs = pd.concat([pd.read_parquet(p) for p in paths])
    assert logs["question"].nunique() / len(logs) > 0.995
    sizes = logs.groupby("answer_id").size()
    assert 1.8 < sizes.mean() < 3.0 and sizes.max() <= 50


def test_word_statistics_look_like_questions(corpus) -> None:
    """Quora at 134k: top term in 40 % of questions, 10th 5.6 %, 6.9 terms a question."""
    _, paths = corpus
    texts = pd.concat([pd.read_parquet(p) for p in paths])["question"].tolist()
    bm25 = BM25Index.build(texts, stemmer="english")
    df = np.sort(np.diff(bm25.indptr))[::-1] / len(texts)
    assert 0.25 < df[0] < 0.6 and 0.03 < df[9] < 0.15 and df[999] < 0.005
    assert 4.5 < bm25.rows.size / len(texts) < 9


def test_queries_paraphrase_a_cluster_and_are_new(corpus) -> None:
    spec, paths = corpus
    logs = pd.concat([pd.read_parquet(p) for p in paths])
    queries = scale_queries(spec, 50)
    assert len(queries) > 30
    assert not set(queries["question"]) & set(logs["question"])
    assert set(queries["answer_id"]) <= set(logs["answer_id"])
    assert queries.equals(scale_queries(spec, 50))


@pytest.mark.parametrize(
    ("text", "value"), [("10M", 10_000_000), ("134k", 134_000), ("2500", 2500)]
)
def test_parse_count(text: str, value: int) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["ten", "0", "-5k", ""])
def test_parse_count_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_count(text)

"""Filters: a filtered search returns what a bundle of only the matching questions returns,
dense-only and fused, for exact match and set membership; no match gives no hits."""

from __future__ import annotations

import shutil
from pathlib import Path

import faiss
import numpy as np
import pytest

from qpr.artifacts import SearchConfig
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.bundle import Bundle, IndexedQuestions
from qpr.retrieval.dense import stored_vectors
from qpr.retrieval.selection import FilterError
from qpr.searcher import Searcher
from tests.serve.test_app import QIDS, QUESTIONS, UNSEEN, build_bundle

LOCALES = [("en", "de", "fr")[i % 3] for i in range(len(QUESTIONS))]
TENANTS = [("a", "b", "c", "d")[(i // 3) % 4] for i in range(len(QUESTIONS))]
ANSWERS = [f"ans-{i // 2}" for i in range(len(QUESTIONS))]
FILTERS = [{"locale": "en"}, {"tenant": ["a", "c"]}, {"locale": ["de", "fr"], "tenant": "b"}]
QUERIES = [QUESTIONS[0], QUESTIONS[7], QUESTIONS[31], "repair printer", UNSEEN]


@pytest.fixture(autouse=True, params=[2048, 0], ids=["scan", "inside"])
def exact_limit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Each test twice: the allowed rows scored from their own rows (the default for
    few), and the selector / MaxScore paths that larger filters take."""
    monkeypatch.setattr("qpr.retrieval.dense.EXACT_SCAN_ROWS", request.param)
    monkeypatch.setattr("qpr.retrieval.bm25.EXACT_SCAN_DOCS", request.param)
    return request.param


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a dense-only encoder bundle, the same encoder with a fused search config)."""
    dense = build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS)
    fused = tmp_path_factory.mktemp("fused") / "models"
    shutil.copytree(dense, fused)
    SearchConfig(threshold=0.5, dense_weight=0.6, lexical_candidates=8, dense_candidates=4).write(
        fused
    )
    return dense, fused


def _matching(filters: dict) -> list[int]:
    """Positions of the questions `filters` keeps, in index order."""
    columns = {"locale": LOCALES, "tenant": TENANTS}
    keep = []
    for i in range(len(QUESTIONS)):
        values = {f: {v} if isinstance(v, str) else set(v) for f, v in filters.items()}
        if all(columns[f][i] in wanted for f, wanted in values.items()):
            keep.append(i)
    return keep


def _full(encoder: Path, out: Path) -> Bundle:
    metadata = {"locale": LOCALES, "tenant": TENANTS}
    return Searcher.build(QUESTIONS, ANSWERS, encoder=encoder, out=out, question_ids=QIDS,
                          metadata=metadata).bundle  # fmt: skip


def _ranked(results: list) -> list[list[tuple[int, float]]]:
    return [[(h.question_id, round(h.distance, 5)) for h in r.hits] for r in results]


@pytest.mark.parametrize("filters", FILTERS)
def test_dense_filter_equals_a_rebuild(encoders, tmp_path: Path, filters: dict) -> None:
    full = _full(encoders[0] / "encoder.onnx", tmp_path / "full")
    keep = _matching(filters)
    subset = Searcher.build([QUESTIONS[i] for i in keep], [ANSWERS[i] for i in keep],
                            encoder=encoders[0] / "encoder.onnx", out=tmp_path / "subset",
                            question_ids=[QIDS[i] for i in keep]).bundle  # fmt: skip
    for k in (1, 5, 40):
        got = full.search_batch(QUERIES, k, filters=filters)
        assert _ranked(got) == _ranked(subset.search_batch(QUERIES, k))
        assert _ranked([full.search(QUERIES[1], k, filters=filters)]) == _ranked(got[1:2])
    assert {h.question_id for r in got for h in r.hits} <= {QIDS[i] for i in keep}


def _subset_of(bundle: Bundle, keep: list[int]) -> Bundle:
    """`bundle` over only the rows `keep`: their vectors in a Flat index, their BM25
    weights as the whole collection weighed them (the filter's promise for BM25)."""
    rows = np.asarray(keep, np.int64)
    index = faiss.IndexFlatL2(bundle.dim)
    index.add(stored_vectors(bundle._index)[rows])
    questions = IndexedQuestions(index, bundle._qids[rows], [bundle._texts[r] for r in keep],
                                 bundle._cluster_ids[rows], _bm25_rows(bundle.bm25, rows),
                                 [bundle._answer_ids[r] for r in keep])  # fmt: skip
    return bundle.with_questions(questions)


def _bm25_rows(bm25: BM25Index | None, rows: np.ndarray) -> BM25Index:
    assert bm25 is not None
    new_row = np.full(bm25.num_docs, -1, np.int64)
    new_row[rows] = np.arange(rows.size)
    kept = new_row[bm25.rows] >= 0
    term = np.repeat(np.arange(len(bm25.terms)), np.diff(bm25.indptr))[kept]
    indptr = np.zeros(len(bm25.terms) + 1, np.int64)
    np.cumsum(np.bincount(term, minlength=len(bm25.terms)), out=indptr[1:])
    return BM25Index(bm25.terms, indptr, new_row[bm25.rows[kept]].astype(np.int32),
                     bm25.weights[kept], int(rows.size), bm25.k1, bm25.b, bm25.stemmer)  # fmt: skip


@pytest.mark.parametrize("filters", FILTERS)
def test_fused_filter_equals_the_matching_questions_alone(
    encoders, tmp_path: Path, filters: dict
) -> None:
    full = _full(encoders[1], tmp_path / "full")
    assert full.bm25 is not None
    keep = _matching(filters)
    subset = _subset_of(full, keep)
    for k in (1, 3, 10):
        got = full.search_batch(QUERIES, k, filters=filters, explain=True)
        expected = subset.search_batch(QUERIES, k, explain=True)
        assert _ranked(got) == _ranked(expected)
        assert [[h.score for h in r.hits] for r in got] == [
            [h.score for h in r.hits] for r in expected
        ]
        assert [[h.explain for h in r.hits] for r in got] == [
            [h.explain for h in r.hits] for r in expected
        ]
        one = [full.search(q, k, filters=filters) for q in QUERIES]  # the service's path
        assert _ranked(one) == _ranked(expected)


def test_bm25_never_returns_a_masked_question(encoders, tmp_path: Path) -> None:
    full = _full(encoders[1], tmp_path / "full")
    allowed = full.allowed({"locale": "de"})
    assert allowed is not None
    _, rows = full.bm25.search("repair printer garden", full.size, allowed=allowed)
    assert rows[rows >= 0].size and allowed[rows[rows >= 0]].all()
    hits = full.search("repair printer garden", 20, filters={"locale": "de"}).hits
    assert hits and {LOCALES[QIDS.index(h.question_id)] for h in hits} == {"de"}


def test_no_match_is_no_hits_and_an_unknown_field_is_named(encoders, tmp_path: Path) -> None:
    full = _full(encoders[1], tmp_path / "full")
    assert full.filter_fields == ("answer_id", "locale", "tenant")
    result = full.search(QUESTIONS[0], 5, filters={"locale": "xx"}, threshold=np.inf)
    assert result.hits == [] and not result.answered
    assert full.search(QUESTIONS[2], 1, filters={"answer_id": "ans-1"}).hits[0].answer_id == "ans-1"
    # the no-answer threshold applies to the filtered top hit as before
    assert full.search(QUESTIONS[0], 1, filters={"locale": "en"}).answered
    assert not full.search(QUESTIONS[0], 1, filters={"locale": "de"}, threshold=0.0).answered
    with pytest.raises(FilterError, match="answer_id, locale, tenant"):
        full.search(QUESTIONS[0], 5, filters={"lang": "en"})

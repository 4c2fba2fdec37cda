"""The companion encoder (qpr.retrieval.companion): a question's vector does not depend on
its batch, the mix is the dense term when its weight is 0, and the served search mixes it
in the same way on its one-question path and its batch path."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from qpr.artifacts import SearchConfig, SearchConfigError
from qpr.retrieval.companion import (
    Companion,
    CompanionError,
    StaticEncoder,
    load_encoder,
    mixed,
    mixed_one,
)
from qpr.retrieval.hybrid import HybridSearch, fuse
from tests.retrieval.test_hybrid import TEXTS, _world


def tiny_encoder(dim: int = 6, seed: int = 0) -> StaticEncoder:
    """A real StaticEncoder over the fixture's words: a word-level tokenizer, random
    token vectors."""
    words = sorted({w for t in TEXTS for w in t.split()})
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    table = np.random.default_rng(seed).standard_normal((len(vocab), dim)).astype(np.float32)
    return StaticEncoder("tiny", tokenizer, table)


MIXED = SearchConfig(
    dense_weight=0.6,
    lexical_candidates=6,
    dense_candidates=4,
    companion="tiny",
    companion_weight=0.5,
)


def test_a_question_gets_the_vector_it_gets_alone() -> None:
    encoder = tiny_encoder()
    batch = encoder.encode([*TEXTS[:7], "zzz unknown"])
    for i, text in enumerate(TEXTS[:7]):
        np.testing.assert_array_equal(encoder.encode([text])[0], batch[i])
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, rtol=1e-6)
    assert encoder.encode([]).shape == (0, 6)
    with pytest.raises(TypeError):
        encoder.encode("one string")


def test_documents_are_float16_of_the_vectors() -> None:
    encoder = tiny_encoder()
    docs = encoder.documents(TEXTS, batch=7)
    assert docs.dtype == np.float16 and docs.shape == (len(TEXTS), 6)
    np.testing.assert_array_equal(docs, encoder.encode(TEXTS).astype(np.float16))


def test_extended_encodes_only_the_new_rows() -> None:
    encoder = tiny_encoder()
    base = Companion(encoder, encoder.documents(TEXTS[:10]))
    grown = base.extended(TEXTS[:13])
    np.testing.assert_array_equal(grown.vectors[:10], base.vectors)
    np.testing.assert_array_equal(grown.vectors, encoder.documents(TEXTS[:13]))
    assert base.extended(TEXTS[:10]) is base
    with pytest.raises(ValueError, match="9 texts for 10"):
        base.extended(TEXTS[:9])


def test_load_reads_the_index_stages_file_and_extends_it(tmp_path) -> None:
    encoder = load_encoder("wordllama")
    path = tmp_path / "companion.npy"
    np.save(path, encoder.documents(TEXTS[:10]))
    alone = Companion.load(path, "wordllama")
    assert alone.rows == 10 and alone.vectors.dtype == np.float32
    grown = Companion.load(path, "wordllama", TEXTS[:12])
    np.testing.assert_array_equal(grown.vectors[:10], alone.vectors)
    np.testing.assert_array_equal(grown.vectors[10:], encoder.documents(TEXTS[10:12]))
    with pytest.raises(CompanionError, match="unknown companion"):
        Companion.load(path, "glove")
    with pytest.raises(OSError):
        Companion.load(tmp_path / "missing.npy", "wordllama")
    np.save(path, np.zeros((3, 8), np.float16))
    with pytest.raises(ValueError, match="the encoder gives 256"):
        Companion.load(path, "wordllama")


def test_cosines_of_encoded_queries_are_the_similarities() -> None:
    encoder = tiny_encoder()
    companion = Companion(encoder, encoder.documents(TEXTS))
    union = np.array([[3, 0, 7, -1], [1, 2, -1, -1]], np.int64)
    queries = TEXTS[4:6]
    encoded = encoder.encode(queries)
    got = companion.cosines(encoded, union)
    np.testing.assert_allclose(got[0, :3], companion.vectors[[3, 0, 7]] @ encoded[0], rtol=1e-6)
    np.testing.assert_allclose(got[1, :2], companion.vectors[[1, 2]] @ encoded[1], rtol=1e-6)
    assert np.isneginf(got[0, 3]) and np.isneginf(got[1, 2:]).all()
    # the texts' own similarities: encoded here, the same cosines
    np.testing.assert_allclose(companion.similarities(queries, union), got, rtol=1e-6)


def test_mixed_is_the_dense_term_at_weight_zero_and_keeps_empty_slots() -> None:
    dense = np.array([[-3.0, -1.0, -2.0, -np.inf]], np.float32)
    other = np.array([[0.9, 0.1, 0.5, -np.inf]], np.float32)
    np.testing.assert_array_equal(mixed(dense, other, 0.0), dense)
    got = mixed(dense, other, 0.5)
    np.testing.assert_allclose(got[0, :3], [0.5 * 0 + 0.5 * 1, 0.5 * 1 + 0, 0.25 + 0.25])
    assert got[0, 3] == -np.inf
    # at weight 1 the companion alone orders the candidates
    assert np.argsort(-mixed(dense, other, 1.0)[0, :3]).tolist() == [0, 2, 1]


def test_the_companion_changes_the_ranking_where_it_disagrees() -> None:
    index, x, bm25 = _world()
    encoder = tiny_encoder()
    companion = Companion(encoder, encoder.documents(TEXTS))
    plain = SearchConfig(dense_weight=0.6, lexical_candidates=6, dense_candidates=4)
    without = HybridSearch(index, plain, bm25=bm25, texts=TEXTS, companion=companion)
    found = without.candidates(TEXTS, x, 5)
    assert found.companion is not None and found.companion.shape == found.union.shape
    ranked = [fuse(found, 0.6, 5, w).rows for w in (0.0, 0.5, 1.0)]
    assert not np.array_equal(ranked[0], ranked[2])
    # weight 0 is the search without a companion
    bare = HybridSearch(index, plain, bm25=bm25, texts=TEXTS)
    np.testing.assert_array_equal(ranked[0], bare.rank(TEXTS, lambda: x, 5).rows)


def test_one_question_mixes_as_a_batch_does() -> None:
    index, x, bm25 = _world()
    encoder = tiny_encoder()
    search = HybridSearch(
        index, MIXED, bm25=bm25, texts=TEXTS, companion=Companion(encoder, encoder.documents(TEXTS))
    )
    batch = search.rank(TEXTS[:9], lambda: x[:9], 5)
    found = search.candidates(TEXTS[:9], x[:9], 5)
    np.testing.assert_array_equal(batch.rows, fuse(found, 0.6, 5, 0.5).rows)
    for i in range(9):
        one = search.rank([TEXTS[i]], lambda i=i: x[i : i + 1], 5)
        assert one.rows[0].tolist() == batch.rows[i].tolist()
        np.testing.assert_array_equal(one.scores[0], batch.scores[i])


def test_a_mixing_config_needs_its_companion() -> None:
    index, _, bm25 = _world()
    with pytest.raises(ValueError, match="tiny companion"):
        HybridSearch(index, MIXED, bm25=bm25, texts=TEXTS)
    encoder = tiny_encoder()
    short = Companion(encoder, encoder.documents(TEXTS[:5]))
    with pytest.raises(ValueError, match="5 companion rows"):
        HybridSearch(index, MIXED, bm25=bm25, texts=TEXTS, companion=short)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"companion_weight": None}, "go together"),
        ({"companion": None}, "go together"),
        ({"companion_weight": 0.0}, r"not in \(0, 1\]"),
        ({"companion_weight": 1.5}, r"not in \(0, 1\]"),
        ({"dense_weight": None, "lexical_candidates": None, "dense_candidates": None}, "fused"),
    ],
)
def test_search_config_refuses_a_half_companion(changes: dict, message: str) -> None:
    fields = {
        "dense_weight": 0.6,
        "lexical_candidates": 6,
        "dense_candidates": 4,
        "companion": "wordllama",
        "companion_weight": 0.25,
    }
    with pytest.raises(SearchConfigError, match=message):
        SearchConfig(**{**fields, **changes})


def test_search_config_keeps_its_bytes_without_a_companion(tmp_path) -> None:
    plain = SearchConfig(dense_weight=0.6, lexical_candidates=6, dense_candidates=4)
    text = plain.write(tmp_path).read_text()
    assert "companion" not in text
    replace(MIXED, companion="wordllama", companion_weight=0.25).write(tmp_path)
    read = SearchConfig.read(tmp_path)
    assert (read.companion, read.companion_weight) == ("wordllama", 0.25)
    assert read.fusion["companion_weight"] == 0.25


def test_the_packaged_wordllama_finds_a_paraphrase() -> None:
    encoder = load_encoder("wordllama")
    v = encoder.encode(
        [
            "How do I learn Python?",
            "What is the best way to learn python programming?",
            "Why is the sky blue?",
        ]
    )
    assert v.shape == (3, 256)
    assert v[0] @ v[1] > 0.6 > v[0] @ v[2]


def test_an_unknown_companion_is_named() -> None:
    with pytest.raises(CompanionError, match="unknown companion 'glove'"):
        load_encoder("glove")


def test_mixed_one_is_mixed_for_a_full_row() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        dense = -rng.random(40).astype(np.float32) * 4
        other = rng.standard_normal(40).astype(np.float32)
        for w in (0.25, 0.5, 0.75):
            np.testing.assert_array_equal(
                mixed_one(dense, other, w), mixed(dense[None], other[None], w)[0]
            )
    flat = np.full(5, -2.0, np.float32)
    np.testing.assert_array_equal(mixed_one(flat, flat, 0.5), mixed(flat[None], flat[None], 0.5)[0])


def test_explain_shares_add_up_to_the_mixed_score() -> None:
    """What explain reports: α times the dense share (the companion mixed in) plus
    (1 - α) times BM25's is the fused score."""
    index, x, bm25 = _world()
    encoder = tiny_encoder()
    search = HybridSearch(
        index, MIXED, bm25=bm25, texts=TEXTS, companion=Companion(encoder, encoder.documents(TEXTS))
    )
    for i in (0, 7, 19):
        ranking = search.rank([TEXTS[i]], lambda i=i: x[i : i + 1], 5)
        rows = ranking.rows[0]
        dense_share, lexical_share = search.shares(TEXTS[i], x[i : i + 1], rows, 5, None)
        np.testing.assert_allclose(
            0.6 * dense_share + 0.4 * lexical_share, ranking.scores[0], atol=1e-6
        )

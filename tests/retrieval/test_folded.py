"""Folded encoders (`qpr.retrieval.folded`), a CNN and a static student, encode as their
ONNX models do."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from qpr.artifacts import ENCODER_FILE, INPUT_NAME, OUTPUT_NAME
from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx
from qpr.retrieval import folded as folded_module
from qpr.retrieval.bundle import Bundle
from qpr.retrieval.encoders import load_session
from qpr.retrieval.folded import FoldedCNN, FoldedStatic, checked_fold, fold_cnn, fold_static
from tests.serve.test_app import QIDS, QUESTIONS, UNSEEN, build_bundle

SEQUENCES = [[1], [2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [3, 0, 4], [7, 7, 7, 7]]


def exported(tmp_path: Path, **kwargs: object) -> Path:
    torch.manual_seed(0)
    encoder = CNNEncoder(40, embedding_dim=8, channels=6, output_dim=5, **kwargs)
    path = tmp_path / "encoder.onnx"
    export_onnx(encoder, path, metadata={"vocab_sha256": "x", "max_len": "16"})
    return path


def onnx_vectors(path: Path, sequences: list[list[int]]) -> np.ndarray:
    session = load_session(path, threads=1)
    return np.vstack(
        [session.run([OUTPUT_NAME], {INPUT_NAME: np.asarray([s], np.int64)})[0] for s in sequences]
    )


def test_hand_computed_window_of_three() -> None:
    # embedding [[0], [1], [2]] (one dimension), kernel offsets 0.1, 0.01, 0.001, no bias:
    # table j holds row v · kernel j. Question [1, 2] ("same" padding, shift 1):
    # t = 0 reads tokens -1 (none), 0, 1: 0.01·1 + 0.001·2 = 0.012
    # t = 1 reads tokens 0, 1, 2 (none): 0.1·1 + 0.01·2 = 0.12
    # pooled tanh(max) = tanh(0.12); projection 2·x + 1
    rows = np.array([[0.0], [1.0], [2.0]], np.float32)
    folded = FoldedCNN(
        tables=(np.stack([rows * 0.1, rows * 0.01, rows * 0.001]),),
        biases=(np.zeros(1, np.float32),),
        shifts=(1,),
        projection_t=np.array([[2.0]], np.float32),
        projection_bias=np.array([1.0], np.float32),
        normalize=False,
    )
    got = folded.encode([[1, 2], [2, 1]])
    assert got[0, 0] == pytest.approx(2 * math.tanh(0.12) + 1, rel=1e-6)
    # [2, 1]: t = 0: 0.01·2 + 0.001·1 = 0.021; t = 1: 0.1·2 + 0.01·1 = 0.21
    assert got[1, 0] == pytest.approx(2 * math.tanh(0.21) + 1, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [{"windows": (5,)}, {"windows": (2, 3)}, {"windows": (4,), "normalize": True}],
    ids=["window 5", "windows 2 and 3", "even window, unit vectors"],
)
def test_matches_the_onnx_model(tmp_path: Path, kwargs: dict) -> None:
    path = exported(tmp_path, **kwargs)
    folded = fold_cnn(path)
    assert folded is not None and folded.normalize == kwargs.get("normalize", False)
    reference = onnx_vectors(path, SEQUENCES)
    # one by one and as one padded batch (padding inside [3, 0, 4] masked as the graph does)
    assert folded.matches(reference, SEQUENCES) < 1e-5
    one_by_one = np.vstack([folded.encode([s]) for s in SEQUENCES])
    np.testing.assert_array_equal(folded.encode(SEQUENCES), one_by_one)


def test_only_padding_pools_to_the_masked_value(tmp_path: Path) -> None:
    path = exported(tmp_path)
    folded = fold_cnn(path)
    assert folded is not None
    assert folded.matches(onnx_vectors(path, [[0, 0]]), [[0, 0]]) < 1e-5


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    folded = fold_cnn(exported(tmp_path))
    assert folded is not None
    for ids in ([[1, 40]], [[-1]], [[1], [2, 40]]):
        with pytest.raises(ValueError, match="token ids must be in"):
            folded.encode(ids)


def test_other_graphs_are_not_folded(tmp_path: Path) -> None:
    named = onnx.load(exported(tmp_path))
    named.metadata_props.add(key="encoder", value="transformer")
    onnx.save(named, tmp_path / "named.onnx")
    assert fold_cnn(tmp_path / "named.onnx") is None

    tokens = helper.make_tensor_value_info(INPUT_NAME, TensorProto.INT64, [1, None])
    out = helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.INT64, [1, None])
    node = helper.make_node("Identity", [INPUT_NAME], [OUTPUT_NAME])
    identity = helper.make_model(helper.make_graph([node], "g", [tokens], [out]))
    onnx.save(identity, tmp_path / "identity.onnx")
    assert fold_cnn(tmp_path / "identity.onnx") is None


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS)


def test_bundle_searches_alike_folded_or_not(bundle_dir: Path) -> None:
    folded = Bundle.load(bundle_dir, fold_encoder=True)
    plain = Bundle.load(bundle_dir)
    assert (folded.encoder_kernel, plain.encoder_kernel) == ("folded", "onnx")
    questions = [*QUESTIONS[::7], UNSEEN]
    for question in questions:
        a, b = folded.search(question, k=5), plain.search(question, k=5)
        assert [h.question_id for h in a.hits] == [h.question_id for h in b.hits]
        np.testing.assert_allclose(
            [h.distance for h in a.hits], [h.distance for h in b.hits], rtol=1e-4, atol=1e-6
        )
        assert a.answered == b.answered
    batch = folded.search_batch(questions, k=5)
    assert [r.hits for r in batch] == [folded.search(q, k=5).hits for q in questions]


def test_a_folding_that_does_not_match_is_not_used(
    bundle_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def off_by_a_bit(path: Path) -> FoldedCNN | None:
        folded = fold_cnn(path)
        assert folded is not None
        return FoldedCNN(
            tables=tuple(t * 1.01 for t in folded.tables),
            biases=folded.biases,
            shifts=folded.shifts,
            projection_t=folded.projection_t,
            projection_bias=folded.projection_bias,
            normalize=folded.normalize,
        )

    monkeypatch.setattr(folded_module, "fold_cnn", off_by_a_bit)
    with caplog.at_level(logging.WARNING, logger="qpr.retrieval.folded"):
        bundle = Bundle.load(bundle_dir, fold_encoder=True)
    assert bundle.encoder_kernel == "onnx"
    assert "off the ONNX model" in caplog.text and str(bundle_dir / ENCODER_FILE) in caplog.text
    assert bundle.search(QUESTIONS[3], k=1).hits[0].question_id == QIDS[3]


def exported_static(tmp_path: Path, **kwargs: object) -> Path:
    from qpr.model.static import StaticEncoder

    torch.manual_seed(0)
    encoder = StaticEncoder(40, embedding_dim=8, output_dim=5, **kwargs)
    with torch.no_grad():  # a trained-looking projection, not the identity it starts as
        encoder.projection.weight.normal_()
        encoder.projection.bias.normal_()
    path = tmp_path / "query_encoder.onnx"
    export_onnx(encoder, path, metadata={"vocab_sha256": "x", "max_len": "16"})
    return path


def test_static_hand_computed() -> None:
    # table rows v·[1, 10]; question [1, 2, 0]: mean of rows 1 and 2 (padding left out)
    # = [1.5, 15], plus bias [1, -1]
    table = np.array([[0.0, 0.0], [1.0, 10.0], [2.0, 20.0]], np.float32)
    folded = FoldedStatic(table=table, bias=np.array([1.0, -1.0], np.float32), normalize=False)
    np.testing.assert_allclose(folded.encode([[1, 2, 0]])[0], [2.5, 14.0], rtol=1e-6)
    np.testing.assert_allclose(folded.encode([[0]])[0], [1.0, -1.0])  # only padding: the bias
    with pytest.raises(ValueError, match="token ids must be in"):
        folded.encode([[3]])


@pytest.mark.parametrize("normalize", [True, False], ids=["unit vectors", "raw"])
def test_static_student_matches_the_onnx_model(tmp_path: Path, normalize: bool) -> None:
    path = exported_static(tmp_path, normalize=normalize)
    assert fold_cnn(path) is None  # not a CNN
    folded = fold_static(path)
    assert folded is not None and folded.normalize == normalize
    sequences = [*SEQUENCES, [0, 0]]
    assert folded.matches(onnx_vectors(path, sequences), sequences) < 1e-5
    one_by_one = np.vstack([folded.encode([s]) for s in sequences])
    np.testing.assert_array_equal(folded.encode(sequences), one_by_one)
    assert isinstance(checked_fold(path, load_session(path, threads=1), 16), FoldedStatic)


def test_a_cnn_is_not_folded_as_a_static_student(tmp_path: Path) -> None:
    assert fold_static(exported(tmp_path)) is None

"""qpr.model.quantize.quantize_query_encoder on small hand-built ONNX graphs: what it keeps, what
it adds, what it refuses. (The transformer itself: tests/retrieval/test_bundle_transformer.py
and tests/model/test_transformer_stages.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpr.artifacts import QUANTIZED_FROM
from qpr.io import file_sha256
from qpr.model.quantize import quantize_query_encoder
from qpr.retrieval.encoders import load_session, row_cosines


def _graph(path: Path, *, with_matmul: bool) -> np.ndarray:
    """x float32 [N, 64] → tanh(x·W) (or tanh(x) without the product); returns W."""
    w = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32) / 8
    nodes = [helper.make_node("Tanh", ["h" if with_matmul else "x"], ["y"])]
    inits = []
    if with_matmul:
        nodes.insert(0, helper.make_node("MatMul", ["x", "w"], ["h"]))
        inits.append(numpy_helper.from_array(w, "w"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32 if with_matmul else 64])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    helper.set_model_props(model, {"vocab_sha256": "abc", "max_len": "16"})
    onnx.save(model, path)
    return w


def test_matmul_weights_become_int8_and_metadata_is_kept(tmp_path: Path) -> None:
    w = _graph(tmp_path / "f32.onnx", with_matmul=True)
    out = quantize_query_encoder(tmp_path / "f32.onnx", tmp_path / "sub" / "int8.onnx")
    assert out == tmp_path / "sub" / "int8.onnx" and out.is_file()
    assert not list((tmp_path / "sub").glob(".*tmp"))  # written aside, renamed in
    model = onnx.load(out)
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    props = {p.key: p.value for p in model.metadata_props}
    assert props["vocab_sha256"] == "abc" and props["max_len"] == "16"
    assert props[QUANTIZED_FROM] == file_sha256(tmp_path / "f32.onnx")
    x = np.random.default_rng(1).normal(size=(20, 64)).astype(np.float32)
    got = load_session(out).run(None, {"x": x})[0]
    want = np.tanh(x @ w)
    assert not np.array_equal(got, want)  # int8 arithmetic ran
    assert row_cosines(want, got).min() > 0.99


def test_graph_without_matrix_product_is_refused(tmp_path: Path) -> None:
    _graph(tmp_path / "f32.onnx", with_matmul=False)
    with pytest.raises(ValueError, match="no matrix product"):
        quantize_query_encoder(tmp_path / "f32.onnx", tmp_path / "int8.onnx")
    assert list(tmp_path.iterdir()) == [tmp_path / "f32.onnx"]  # nothing left behind


def test_missing_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing to quantise"):
        quantize_query_encoder(tmp_path / "absent.onnx", tmp_path / "int8.onnx")

"""qpr.model.onnx for an encoder: parity with torch, dynamic axes, padding invariance,
the encode path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from qpr.model import CNNEncoder
from qpr.model.onnx import export_onnx, padding_invariance_check, parity_check
from qpr.retrieval.encoders import embedding_dim, encode, load_session
from qpr.training.embed import encode_texts

VOCAB = 60


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[CNNEncoder, Path]:
    torch.manual_seed(0)
    encoder = CNNEncoder(VOCAB, embedding_dim=16, windows=(2, 5), channels=12, output_dim=8)
    path = tmp_path_factory.mktemp("onnx") / "encoder.onnx"
    export_onnx(encoder, path, metadata={"vocab_sha256": "abc", "max_len": "64"})
    return encoder, path


def _random_ids(batch: int, length: int, seed: int) -> np.ndarray:
    """Random questions of random length 0..length, right-padded (int64 [batch, length])."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(batch, length), dtype=np.int64)
    for row, n in enumerate(rng.integers(0, length + 1, size=batch)):
        ids[row, n:] = 0
    ids[0, :] = rng.integers(1, VOCAB, size=length)  # at least one full-length row
    return ids


def test_graph_has_named_dynamic_axes(exported: tuple[CNNEncoder, Path]) -> None:
    _, path = exported
    model = onnx.load(path)
    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == "token_ids" and out.name == "embeddings"
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [d.dim_param for d in inp.type.tensor_type.shape.dim] == ["batch", "length"]
    assert out.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert out.type.tensor_type.shape.dim[1].dim_value == 8
    metadata = {p.key: p.value for p in model.metadata_props}
    assert metadata == {"vocab_sha256": "abc", "max_len": "64"}
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temp left


def test_parity_across_batch_and_length(exported: tuple[CNNEncoder, Path]) -> None:
    encoder, path = exported
    batches = [
        _random_ids(b, n, seed) for seed, (b, n) in enumerate([(1, 3), (7, 3), (1, 50), (7, 50)])
    ]
    report = parity_check(encoder, path, batches)
    assert report["batches"] == 4 and report["rows"] == 16
    assert report["max_abs_diff"] < 1e-4
    assert encoder.training  # the check restores the module's mode


def test_onnx_padding_invariance(exported: tuple[CNNEncoder, Path]) -> None:
    _, path = exported
    assert padding_invariance_check(path, _random_ids(7, 12, seed=9), extra=16) < 1e-6


def test_encode_matches_torch_in_input_order(
    exported: tuple[CNNEncoder, Path], tiny_paraphrases
) -> None:
    vocab = tiny_paraphrases.vocab
    torch.manual_seed(1)
    encoder = CNNEncoder(vocab.size, embedding_dim=16, channels=12, output_dim=8)
    path = export_onnx(encoder, exported[1].parent / "tiny.onnx")
    session = load_session(path, threads=1)
    texts = [*tiny_paraphrases.val.texts[:9], "", "how", "a completely unseen zyzzyva question"]
    got = encode(session, vocab, texts, batch_size=4, max_len=16)
    expected = encode_texts(encoder, vocab, texts, max_len=16)
    assert got.dtype == np.float32 and got.shape == (len(texts), 8)
    assert np.abs(got - expected).max() < 1e-5
    # Batching and sorting do not change a vector: one question at a time gives the same.
    one_by_one = np.concatenate([encode(session, vocab, [t], max_len=16) for t in texts])
    assert np.abs(got - one_by_one).max() < 1e-6
    assert encode(session, vocab, [], max_len=16).shape == (0, 8)
    assert embedding_dim(session) == 8


def test_session_threads_are_explicit(exported: tuple[CNNEncoder, Path]) -> None:
    session = load_session(exported[1], threads=1)
    assert session.get_session_options().intra_op_num_threads == 1
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_service_path_does_not_import_torch() -> None:
    code = "import sys, qpr.retrieval.encoders, qpr.text.vocab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_dynamo_exporter_also_passes_parity(tmp_path: Path) -> None:
    torch.manual_seed(2)
    encoder = CNNEncoder(VOCAB, embedding_dim=16, windows=(5,), channels=12, output_dim=8)
    path = export_onnx(encoder, tmp_path / "dynamo.onnx", dynamo=True)
    batches = [_random_ids(1, 3, 0), _random_ids(7, 50, 1)]
    assert parity_check(encoder, path, batches)["max_abs_diff"] < 1e-4
    assert padding_invariance_check(path, batches[1]) < 1e-6

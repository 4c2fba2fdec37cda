"""Query spelling correction against the indexed questions' own words.

A typo'd query word ("hwo", "lerning") matches no BM25 posting and moves the encoder's
vector; 20 % typo'd words cost the served default 12.8 points of P@1 on Quora
(docs/results/noisy_queries.md). `Speller` puts such a word back when the index knows a
word one edit away: a word the indexed questions hold at least `min_count` times is
"known" and never changed; an unknown word of `min_len`+ letters becomes the most frequent
known word at Damerau distance 1 (one letter deleted, inserted, substituted, or two
neighbours swapped), or stays as written when there is none. Correcting twice changes
nothing more (a correction is a known word).

The lookup is symmetric-delete (as SymSpell's, at distance 1): each known word is filed
under itself and each of its one-letter deletions, and a query word's candidates are the
words filed under its own keys, checked by `one_edit`. Keys are held as sorted 64-bit
hashes (this process's `hash`), not strings: a few bytes a key.

Only runs of ASCII letters are looked at; digits, punctuation and other scripts stay as
written, as do words next to non-ASCII letters ("café" is not "caf" + "é").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["Speller", "one_edit", "word_counts"]

# A run of letters of any script; only ASCII runs are corrected.
_LETTERS = re.compile(r"[^\W\d_]+")


def word_counts(texts: Iterable[str]) -> Counter[str]:
    """How often each lower-cased ASCII letter run occurs in `texts`."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(w for w in _LETTERS.findall(text.lower()) if w.isascii())
    return counts


def _keys(word: str) -> set[str]:
    """`word` and each of its one-letter deletions: the keys it is filed and looked up under."""
    return {word, *(word[:i] + word[i + 1 :] for i in range(len(word)))}


def one_edit(a: str, b: str) -> bool:
    """True when `b` is `a` or one edit away: a letter deleted, inserted or substituted,
    or two neighbouring letters swapped (optimal string alignment distance <= 1)."""
    if a == b:
        return True
    la, lb = len(a), len(b)
    if abs(la - lb) > 1:
        return False
    i = 0
    while i < min(la, lb) and a[i] == b[i]:
        i += 1
    if la > lb:  # a letter of a deleted
        return a[i + 1 :] == b[i:]
    if la < lb:  # a letter inserted
        return a[i:] == b[i + 1 :]
    if a[i + 1 :] == b[i + 1 :]:  # substituted
        return True
    return i + 1 < la and a[i] == b[i + 1] and a[i + 1] == b[i] and a[i + 2 :] == b[i + 2 :]


class Speller:
    """Corrects unknown query words to the indexed questions' words (module docstring).

    counts: word → occurrences in the indexed questions (`word_counts`).
    min_count: occurrences that make a word known (2: a word seen once may be a typo).
    min_len: the shortest word corrected (shorter words have too many neighbours).
    """

    def __init__(self, counts: Mapping[str, int], *, min_count: int = 2, min_len: int = 3):
        if min_count < 1 or min_len < 1:
            raise ValueError(f"min_count and min_len must be >= 1, got {min_count}, {min_len}")
        self.min_count, self.min_len = min_count, min_len
        # Sorted for the same corrections whatever order the counts came in.
        known = sorted(w for w, n in counts.items() if n >= min_count)
        self._known = {w: int(counts[w]) for w in known}
        self._words = known
        hashes: list[int] = []
        owners: list[int] = []
        for wid, word in enumerate(known):
            if len(word) >= min_len - 1:  # a typo'd word of min_len may be one letter longer
                for key in _keys(word):
                    hashes.append(hash(key))
                    owners.append(wid)
        order = np.argsort(np.asarray(hashes, np.int64), kind="stable")
        self._hashes = np.asarray(hashes, np.int64)[order]
        self._owners = np.asarray(owners, np.int32)[order]

    @classmethod
    def from_texts(cls, texts: Iterable[str], **kwargs: int) -> Speller:
        """A speller knowing the words of `texts` (the indexed questions)."""
        return cls(word_counts(texts), **kwargs)

    def __len__(self) -> int:
        """Known words."""
        return len(self._words)

    def word(self, word: str) -> str:
        """The correction of one lower-case word: itself when known, short or beyond one
        edit of every known word; else the most frequent known word one edit away (ties:
        the first alphabetically)."""
        if word in self._known or len(word) < self.min_len or not word.isascii():
            return word
        keys = np.fromiter((hash(k) for k in _keys(word)), np.int64)
        lo = np.searchsorted(self._hashes, keys, "left")
        hi = np.searchsorted(self._hashes, keys, "right")
        best, best_count = word, 0
        for start, stop in zip(lo.tolist(), hi.tolist(), strict=True):
            for wid in self._owners[start:stop].tolist():
                candidate = self._words[wid]
                count = self._known[candidate]
                if (count > best_count or (count == best_count and candidate < best)) and (
                    one_edit(word, candidate)
                ):
                    best, best_count = candidate, count
        return best

    def correct(self, text: str) -> str:
        """`text` with each unknown ASCII word corrected; the rest as written. A corrected
        word keeps a leading capital."""

        def fix(match: re.Match[str]) -> str:
            written = match.group(0)
            if not written.isascii():
                return written
            fixed = self.word(written.lower())
            if fixed == written.lower():
                return written
            return fixed[:1].upper() + fixed[1:] if written[:1].isupper() else fixed

        return _LETTERS.sub(fix, text)

    def correct_all(self, texts: Iterable[str]) -> list[str]:
        """`correct` of each text, in order."""
        return [self.correct(text) for text in texts]

"""Word vocabulary with the hashing trick (paper section 2.1.1, Weinberger et al. 2009).

Ids:  0 = padding,  1..V = the V most frequent training words,  V+1..V+m = hash bins.
Every word outside the top V goes to bin ``crc32(utf-8 word) % m``, so rare and unseen
words (typos, ASR errors, names) still get an embedding shared with few other words
instead of one "unknown" id shared with all of them.

The hash must give the same bin in every process and on every machine: Python's hash()
is salted per process (PYTHONHASHSEED), so zlib.crc32 is used. A vocabulary file records
the normaliser version and the hash function, and is checked on load.

numpy only: the search service loads the vocabulary without torch.
"""

from __future__ import annotations

import json
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qpr.errors import QPRError
from qpr.io import json_sha256, write_text_atomic
from qpr.text.normalize import NORMALIZER_VERSION, tokenize

PAD_ID = 0
FORMAT = "qpr-vocabulary"
FORMAT_VERSION = 1
HASH_NAME = "crc32"


class VocabularyError(QPRError, ValueError):
    """A vocabulary file is missing, corrupt, or from an incompatible version."""


def stable_hash(word: str) -> int:
    """CRC-32 of the UTF-8 bytes: identical across processes, platforms and Python versions."""
    return zlib.crc32(word.encode("utf-8"))


def pad_sequences(
    sequences: Sequence[Sequence[int]], *, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id sequences with PAD_ID.

    Returns (token_ids int64 [B, L], lengths int64 [B]) with L = max(1, min(max_len,
    longest sequence)); longer sequences are truncated to max_len (lengths are after
    truncation). L is at least 1 so an all-empty batch is still a valid model input.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    lengths = np.fromiter(
        (min(len(s), max_len) for s in sequences), dtype=np.int64, count=len(sequences)
    )
    width = max(1, int(lengths.max(initial=0)))
    token_ids = np.zeros((len(sequences), width), dtype=np.int64)
    for row, (seq, n) in enumerate(zip(sequences, lengths, strict=True)):
        if n:
            token_ids[row, :n] = seq[:n]
    return token_ids, lengths


@dataclass(frozen=True)
class Vocabulary:
    """Top-V words (by frequency, ties alphabetical) plus m hash bins; see module docstring.

    `max_words` / `min_count` are the build parameters; `words` may be shorter than
    max_words when the corpus has fewer distinct words. hash_bins = 0 disables hashing:
    out-of-vocabulary words are then dropped.
    """

    words: tuple[str, ...]
    hash_bins: int
    max_words: int
    min_count: int = 1
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.hash_bins < 0:
            raise ValueError(f"hash_bins must be >= 0, got {self.hash_bins}")
        if len(self.words) > self.max_words:
            raise ValueError(f"{len(self.words)} words > max_words={self.max_words}")
        index = {word: i + 1 for i, word in enumerate(self.words)}
        if len(index) != len(self.words):
            raise ValueError("duplicate words in vocabulary")
        object.__setattr__(self, "_index", index)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def build(
        cls, texts: Iterable[str], *, max_words: int, hash_bins: int, min_count: int = 1
    ) -> Vocabulary:
        """Count normalised tokens of `texts`; keep the top max_words with count >= min_count.

        Order: count descending, then the word itself ascending, so equal corpora give
        byte-identical vocabularies whatever the input order.
        """
        if max_words < 0:
            raise ValueError(f"max_words must be >= 0, got {max_words}")
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(tokenize(text))
        ranked = sorted(
            (item for item in counts.items() if item[1] >= min_count),
            key=lambda item: (-item[1], item[0]),
        )
        words = tuple(word for word, _ in ranked[:max_words])
        return cls(words=words, hash_bins=hash_bins, max_words=max_words, min_count=min_count)

    # -- ids ------------------------------------------------------------------------------

    @property
    def num_words(self) -> int:
        """V: the number of real vocabulary words."""
        return len(self.words)

    @property
    def size(self) -> int:
        """Number of ids = embedding rows: 1 (padding) + V + m."""
        return 1 + len(self.words) + self.hash_bins

    def word_id(self, word: str) -> int | None:
        """Id of an already-normalised token; None when OOV and hashing is off."""
        wid = self._index.get(word)
        if wid is not None:
            return wid
        if self.hash_bins == 0:
            return None
        return len(self.words) + 1 + stable_hash(word) % self.hash_bins

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw question (normalised here); [] for an empty question."""
        index = self._index
        offset = len(self.words) + 1
        bins = self.hash_bins
        ids: list[int] = []
        for token in tokenize(text):
            wid = index.get(token)
            if wid is not None:
                ids.append(wid)
            elif bins:
                ids.append(offset + stable_hash(token) % bins)
        return ids

    def encode_batch(self, texts: Sequence[str], *, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids int64 [B, L], lengths int64 [B]); see pad_sequences for L."""
        return pad_sequences([self.encode(t) for t in texts], max_len=max_len)

    # -- persistence ----------------------------------------------------------------------

    def _payload(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "normalizer_version": NORMALIZER_VERSION,
            "hash": HASH_NAME,
            "max_words": self.max_words,
            "hash_bins": self.hash_bins,
            "min_count": self.min_count,
            "words": list(self.words),
        }

    @property
    def checksum(self) -> str:
        """sha256 of the canonical JSON of the content (ties checkpoints to a vocabulary)."""
        return json_sha256(self._payload())

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write JSON atomically (temp file + rename: a crash never leaves half a file)."""
        path = Path(path)
        payload = self._payload()
        payload["sha256"] = json_sha256(payload)
        return write_text_atomic(path, json.dumps(payload, ensure_ascii=False, indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocabulary:
        """Read a file written by save(); VocabularyError on any mismatch or corruption."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VocabularyError(f"cannot read vocabulary {path}: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise VocabularyError(f"{path} is not a {FORMAT} file")
        if payload.get("format_version") != FORMAT_VERSION:
            raise VocabularyError(
                f"{path}: format version {payload.get('format_version')!r}, "
                f"this code reads version {FORMAT_VERSION}"
            )
        stored = payload.pop("sha256", None)
        actual = json_sha256(payload)
        if stored != actual:
            raise VocabularyError(
                f"{path}: checksum mismatch (stored {stored}, content {actual}); "
                "the file was modified or truncated"
            )
        if payload.get("normalizer_version") != NORMALIZER_VERSION:
            raise VocabularyError(
                f"{path}: built with normaliser version {payload.get('normalizer_version')}, "
                f"this code normalises with version {NORMALIZER_VERSION}; rebuild it"
            )
        if payload.get("hash") != HASH_NAME:
            raise VocabularyError(f"{path}: unknown hash function {payload.get('hash')!r}")
        return cls(
            words=tuple(payload["words"]),
            hash_bins=int(payload["hash_bins"]),
            max_words=int(payload["max_words"]),
            min_count=int(payload["min_count"]),
        )

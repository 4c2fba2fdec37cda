"""Normalisation, tokenisation and the hashed vocabulary (ids, stability, persistence);
the word-piece tokenizer of the transformer encoder, and `load_tokenizer` for either."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

__all__ = ["load_tokenizer"]


def load_tokenizer(path: str | os.PathLike[str]) -> Vocabulary | WordPieceTokenizer:
    """The tokenizer saved at ``path`` (``models/vocab.json``), whichever kind it is.

    A file with ``"kind": "wordpiece"`` is a `qpr.text.wordpiece.WordPieceTokenizer`
    (transformer encoder); anything else, including files written before the field
    existed, is a `qpr.text.vocab.Vocabulary` (CNN encoder). Both offer ``encode``,
    ``encode_batch``, ``size``, ``checksum`` and ``save``.

    Raises:
        qpr.text.vocab.VocabularyError: the file is missing, corrupt or of an unknown format.
    """
    from qpr.text.vocab import Vocabulary

    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return Vocabulary.load(path)  # raises its own VocabularyError naming the problem
    if isinstance(payload, dict) and payload.get("kind") == "wordpiece":
        # Imported here: the tokenizers wheel is only needed for this kind.
        from qpr.text.wordpiece import WordPieceTokenizer

        return WordPieceTokenizer.from_payload(payload, where=str(path))
    return Vocabulary.load(path)

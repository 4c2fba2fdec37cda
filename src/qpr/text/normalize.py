"""Question normalisation and tokenisation, shared by training, indexing and the service.

The same function must run at training time and on the query path, so it is deliberately
small and cheap (a few µs per question; an ASCII fast path skips Unicode work):

1. Unicode NFKC (full-width letters, ligatures, superscripts → plain forms); the typographic
   apostrophes ’ ‘ ʼ ′ become ' so "what’s" and "what's" are one token.
2. Lowercase (str.lower; casefold() would also turn "ß" into "ss", which we do not need).
3. Accents removed from Latin/Greek/Cyrillic letters ("Café" → "cafe"): only the combining
   diacritics block U+0300-U+036F is dropped, so marks that carry meaning in other scripts
   (Devanagari vowel signs, Arabic harakat, ...) are kept.
4. Every punctuation, symbol, separator or control character except the apostrophe becomes
   a space ("e-mail" → "e mail", "3.5" → "3 5", "c++" → "c"); underscores too. Letters,
   digits and combining marks stay.
5. An apostrophe survives only between two word characters ("what's", "o'neill" stay one
   token; "'quoted'" and "students'" lose it).
6. Whitespace collapsed; leading/trailing whitespace removed.

Changing any of these rules changes token ids, so it invalidates every vocabulary and
trained encoder: bump NORMALIZER_VERSION (vocabulary files record it and refuse a mismatch).
"""

from __future__ import annotations

import re
import unicodedata

NORMALIZER_VERSION = 1

# Apostrophe look-alikes that NFKC leaves alone.
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'"})
_COMBINING_DIACRITICS = re.compile("[\u0300-\u036f]+")
# ASCII fast path: not (letter or digit or apostrophe); \w also matches "_", listed explicitly.
_NON_WORD = re.compile(r"[^\w']+|_+")
# An apostrophe with a non-word character (or the string edge) on either side.
_LOOSE_APOSTROPHE = re.compile(r"(?<!\w)'+|'+(?!\w)")


def normalize(text: str) -> str:
    """Return the canonical form of a question (see the module docstring for the rules)."""
    if not text.isascii():
        # lower() before stripping accents: "İ".lower() is "i" + a combining dot.
        text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()
        # NFD exposes accents as combining marks; NFC afterwards re-composes what is left
        # (e.g. Hangul syllables) so the token looks like what the user typed.
        decomposed = unicodedata.normalize("NFD", text)
        text = unicodedata.normalize("NFC", _COMBINING_DIACRITICS.sub("", decomposed))
        # re's \w does not match combining marks (Devanagari vowel signs, ...), so the
        # punctuation rule is applied by Unicode category here: punctuation, symbols,
        # separators and control characters become spaces; letters, digits, marks stay.
        text = "".join(
            " " if ch != "'" and unicodedata.category(ch)[0] in "PSZC" else ch for ch in text
        )
    else:
        text = _NON_WORD.sub(" ", text.lower())
    if "'" in text:
        text = _LOOSE_APOSTROPHE.sub(" ", text)
    return " ".join(text.split())


def tokenize(text: str) -> list[str]:
    """Normalise and split on whitespace."""
    return normalize(text).split()

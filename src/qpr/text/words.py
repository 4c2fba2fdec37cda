"""Words for the lexical side (BM25 and the Jaccard baseline): bm25s's tokenisation
(lower-cased words of 2+ word characters, English stop words removed), optionally reduced
to Snowball stems with PyStemmer, or cut into character n-grams (`char_grams`, the
"chars" analyzer: a typo changes a few grams of a word, not the whole word). The encoders'
own tokenisation is `normalize.tokenize`.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterable

from qpr.config import check_stemmer

# bm25s's default token pattern: words of 2+ word characters, lower-cased.
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


@functools.cache
def _english_stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def _stopword_set(stopwords: str | Iterable[str] | None) -> frozenset[str]:
    if stopwords is None:
        return frozenset()
    if isinstance(stopwords, str):
        if stopwords not in ("en", "english"):
            raise ValueError(f"only 'en' or an explicit word list, got {stopwords!r}")
        return _english_stopwords()
    return frozenset(stopwords)


_STEMMERS = threading.local()


def _stem_words(name: str) -> Callable[[list[str]], list[str]]:
    """The stemWords of a Snowball stemmer of this thread: a PyStemmer object (and its
    cache) must not be shared between threads, and the service searches on several."""
    stemmers = _STEMMERS.__dict__
    if name not in stemmers:
        import Stemmer

        stemmers[name] = Stemmer.Stemmer(check_stemmer(name)).stemWords
    return stemmers[name]


def tokenize(
    texts: Iterable[str],
    stopwords: str | Iterable[str] | None = "en",
    stemmer: str | None = None,
) -> list[list[str]]:
    """Lower-cased words of 2+ characters, stop words removed (bm25s's tokenisation, and
    its English list by default), so both baselines see the same words; with ``stemmer``
    (a Snowball algorithm, e.g. "english") each kept word becomes its stem, as bm25s does
    with a PyStemmer stemmer (stop words are removed before stemming)."""
    stop = _stopword_set(stopwords)
    words = [[w for w in _TOKEN.findall(str(t).lower()) if w not in stop] for t in texts]
    if stemmer is None:
        return words
    stem = _stem_words(stemmer)
    return [stem(w) for w in words]


# How BM25 reads a text (index.lexical.analyzer): its words, or their character n-grams.
ANALYZERS = ("words", "chars")


def check_analyzer(analyzer: str, ngram: int) -> tuple[str, int]:
    """(analyzer, ngram) checked; ValueError naming what is wrong."""
    if analyzer not in ANALYZERS:
        raise ValueError(f"unknown analyzer {analyzer!r}; expected one of {', '.join(ANALYZERS)}")
    if int(ngram) < 2:
        raise ValueError(f"ngram must be >= 2, got {ngram}")
    return analyzer, int(ngram)


def char_grams(words: Iterable[str], n: int = 3) -> list[str]:
    """The character n-grams of each word, marked "<" and ">" at its ends so that a word's
    first and last letters make grams of their own (fastText's marks): "how" → "<ho",
    "how", "ow>". A marked word shorter than n is one gram. Repeats are kept, in order."""
    grams: list[str] = []
    for word in words:
        marked = f"<{word}>"
        grams.extend(marked[i : i + n] for i in range(max(1, len(marked) - n + 1)))
    return grams


def analyze(
    texts: Iterable[str],
    *,
    stemmer: str | None = None,
    analyzer: str = "words",
    ngram: int = 3,
) -> list[list[str]]:
    """BM25's terms of each text: the words `tokenize` yields (stop words removed, stemmed
    with ``stemmer``), or with analyzer "chars" their character ``ngram``-grams."""
    analyzer, ngram = check_analyzer(analyzer, ngram)
    words = tokenize(texts, stemmer=stemmer)
    if analyzer == "words":
        return words
    return [char_grams(w, ngram) for w in words]

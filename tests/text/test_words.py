"""BM25's terms (qpr.text.words): words, and their character n-grams with boundary marks."""

from __future__ import annotations

import pytest

from qpr.text.words import analyze, char_grams, tokenize


def test_char_grams_hand_computed_with_boundary_marks() -> None:
    assert char_grams(["how"]) == ["<ho", "how", "ow>"]
    assert char_grams(["cats"], 3) == ["<ca", "cat", "ats", "ts>"]
    assert char_grams(["cats"], 4) == ["<cat", "cats", "ats>"]
    # the marks tell a word's ends from its middle: "at" alone is not "at" inside "cats"
    assert char_grams(["at"]) == ["<at", "at>"]


def test_a_word_shorter_than_a_gram_is_one_gram_and_repeats_are_kept() -> None:
    assert char_grams(["ab"], 5) == ["<ab>"]
    assert char_grams(["ab"], 4) == ["<ab>"]
    assert char_grams(["ab", "ab"], 4) == ["<ab>", "<ab>"]
    assert char_grams([]) == []


def test_chars_are_the_grams_of_the_words_tokenize_keeps() -> None:
    text = "How is the Cat, the cat?"
    assert tokenize([text]) == [["how", "cat", "cat"]]  # stop words and case gone
    assert analyze([text], analyzer="chars") == [char_grams(["how", "cat", "cat"])]
    assert analyze([text]) == tokenize([text])
    # with a stemmer the grams are the stems'
    assert analyze(["losing"], stemmer="english", analyzer="chars") == [char_grams(["lose"])]
    assert analyze(["the of a"], analyzer="chars") == [[]]


def test_a_typo_keeps_most_of_a_words_grams() -> None:
    right, typo = set(char_grams(["passport"])), set(char_grams(["pasport"]))
    assert len(right & typo) >= 5 and "passport" not in tokenize(["pasport"])[0]


@pytest.mark.parametrize(("analyzer", "ngram"), [("letters", 3), ("chars", 1)])
def test_unknown_analyzers_and_short_grams_are_refused(analyzer: str, ngram: int) -> None:
    with pytest.raises(ValueError, match=r"analyzer|ngram"):
        analyze(["a question"], analyzer=analyzer, ngram=ngram)

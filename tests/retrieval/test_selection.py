"""Filters on metadata → the row mask every retriever applies."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.retrieval.selection import FieldValues, FilterError, allowed_rows, both

FIELDS = {
    "locale": FieldValues.of(["en", "de", None, "en", "fr"]),
    "tenant": FieldValues.of(["a", "b", "a", "c", "b"]),
}


def test_exact_match_and_set_membership() -> None:
    assert allowed_rows(FIELDS, {"locale": "en"}, 5).tolist() == [1, 0, 0, 1, 0]
    assert allowed_rows(FIELDS, {"tenant": ["a", "b"]}, 5).tolist() == [1, 1, 1, 0, 1]
    both_fields = allowed_rows(FIELDS, {"locale": "en", "tenant": ["a", "b"]}, 5)
    assert both_fields.dtype == np.bool_ and both_fields.tolist() == [1, 0, 0, 0, 0]


def test_nothing_matches_and_null_matches_no_filter() -> None:
    assert not allowed_rows(FIELDS, {"locale": "xx"}, 5).any()
    assert not allowed_rows(FIELDS, {"locale": []}, 5).any()
    assert allowed_rows(FIELDS, {}, 5).all()


def test_unknown_field_or_bad_value() -> None:
    with pytest.raises(FilterError, match=r"'lang'.*locale, tenant") as err:
        allowed_rows(FIELDS, {"lang": "en"}, 5)
    assert err.value.known == ("locale", "tenant")
    with pytest.raises(FilterError, match="string or a list of strings"):
        allowed_rows(FIELDS, {"locale": 3}, 5)


def test_both_masks() -> None:
    a, b = np.array([1, 1, 0], bool), np.array([0, 1, 1], bool)
    assert both(a, b).tolist() == [0, 1, 0]
    assert both(None, b) is b and both(a, None) is a and both(None, None) is None

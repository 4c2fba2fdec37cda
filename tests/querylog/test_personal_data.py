"""qpr.querylog.personal_data: e-mail addresses, phone numbers and long digit runs out of
logged questions; the rest of the question (years, model numbers, dates) kept."""

from __future__ import annotations

import pytest

from qpr.querylog.personal_data import redact_personal


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to john.doe+qpr@mail.example.co.uk today", "write to <email> today"),
        ("is A@B.ORG my login?", "is <email> my login?"),
        ("call +44 20 7946 0958 please", "call <phone> please"),
        ("my number is 555-123-4567", "my number is <phone>"),
        ("(555) 123 4567 or +1 (555) 123-4567", "<phone> or <phone>"),
        ("0044 20 7946 0958", "<phone>"),
        ("+4915112345678 is mine", "<phone> is mine"),
        ("555.123.4567", "<phone>"),
        ("order 48213377 never came", "order <number> never came"),
        ("my code 123456 fails", "my code <number> fails"),
        ("card 4111 1111 1111 1111 declined", "card <number> declined"),
        ("4111-1111-1111-1111", "<number>"),
    ],
)
def test_personal_data_is_replaced(text: str, expected: str) -> None:
    assert redact_personal(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "how do i reset my password?",
        "iphone 15 or pixel 8 in 2019",
        "what happened on 2020-01-15 and 15.01.2020",
        "the wars of 1990-2000",
        "is pi 3.14159",
        "weather in 10001",  # a zip code: five digits
        "route 66 and highway 101",
        "a@b is not an address",
        "version 1.2.3 of 1,000,000 rows",
        "",
    ],
)
def test_everything_else_is_kept(text: str) -> None:
    assert redact_personal(text) == text

"""64-bit ids at the JSON boundary: decimal strings out, strings or integers in.

Question and cluster ids are int64, most of them hashes above 2^53. JavaScript, and so
Swagger UI, reads a JSON number as a double, which holds integers exactly only up to 2^53:
9007199254740993 arrives as 9007199254740992. So every JSON the product hands to clients
writes these ids as decimal strings: the service's hits, `qpr search --json`, the ids
`qpr index` prints, and the MLflow pyfunc's columns (a JSON serving layer writes them out).
Inside, ids stay int64 (numpy arrays, `Hit.question_id`); only these helpers convert them.

An id a client sends back may be such a string or, as before, a JSON integer.

Imports nothing of qpr: the retrieval, serving, delta and registry code all use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ID_FIELDS", "ID_PATTERN", "id_text", "id_texts", "parse_id", "with_id_texts"]

# The fields of a hit (and of the pyfunc's rows) that hold a 64-bit id.
ID_FIELDS = ("question_id", "cluster_id")
# What an id looks like as text: the JSON schema's pattern, and what `parse_id` reads.
ID_PATTERN = r"^-?[0-9]{1,19}$"
_ID = re.compile(ID_PATTERN)
_INT64 = range(-(2**63), 2**63)


def id_text(value: int) -> str:
    """An id as JSON carries it: its decimal digits, "-1" for a cluster id meaning none."""
    return str(int(value))


def id_texts(values: Iterable[int]) -> list[str]:
    """`id_text` of each id (a list, a numpy array)."""
    return [id_text(v) for v in values]


def with_id_texts(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` with the `ID_FIELDS` it holds as decimal strings, the rest as it is."""
    return {k: id_text(v) if k in ID_FIELDS and v is not None else v for k, v in record.items()}


def parse_id(value: object) -> int:
    """An id a client sent: a decimal string ("9007199254740993"), or an integer (as clients
    sent before ids were strings). ValueError for anything else: a bool, text that is not
    decimal digits, an id outside int64, or a float, which may already have lost digits
    (a whole float below 2^53 is exact, so it is taken)."""
    if isinstance(value, bool):
        raise ValueError(f"an id is a string of digits, got {value!r}")
    if isinstance(value, float):
        if not (value.is_integer() and abs(value) < 2**53):
            shown = value if math.isfinite(value) else str(value)
            raise ValueError(f"id {shown!r} is not exact as a number: send it as a string")
        value = int(value)
    if isinstance(value, str):
        if not _ID.fullmatch(value):
            raise ValueError(f"an id is a string of decimal digits, got {value[:40]!r}")
        value = int(value)
    if not isinstance(value, int):
        # numpy integers and the like: int() is exact for them.
        try:
            value = int(value.__index__())  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            raise ValueError(f"an id is a string of digits, got {type(value).__name__}") from None
    if value not in _INT64:
        raise ValueError(f"id {value} is outside the 64-bit range")
    return value

"""Which index rows a search may return: filters on the questions' metadata → a row mask.

A filter names a metadata field of the bundle's question table (``answer_id`` and the
string columns the index stage kept, `qpr.config.IndexSettings.filter_fields`) and one value
(exact match) or several (set membership); several fields must all match. The result is
``allowed``, bool [N] over index rows (True = may be returned), which the dense search
(`qpr.retrieval.dense.search`) and BM25 (`qpr.retrieval.bm25.BM25Index.search`) apply
while they search, so the k results are the k best *allowed* rows, as an index of only
those rows would return them. Deleted rows (tombstones) are the same kind of mask,
combined with `both`.

A null value matches no filter. Arrays only; no FAISS, no framework code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qpr.errors import QPRError

__all__ = ["FieldValues", "FilterError", "Filters", "allowed_rows", "both", "normalised"]

# {field: value} or {field: [values]}: exact match or set membership.
Filters = Mapping[str, "str | Sequence[str]"]


class FilterError(QPRError, ValueError):
    """A filter names a field the bundle does not keep, or is not strings."""

    def __init__(self, message: str, known: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.known = tuple(known)


@dataclass(frozen=True)
class FieldValues:
    """One metadata field over the index rows, dictionary-encoded: row r holds
    ``values[codes[r]]`` (codes int32 [N]; -1 = null), so a filter compares integers."""

    values: tuple[str, ...]
    codes: np.ndarray

    @classmethod
    def of(cls, column: Sequence[str | None]) -> FieldValues:
        """The field of one value (or None) per row."""
        values = tuple(sorted({v for v in column if v is not None}))
        code_of = {v: i for i, v in enumerate(values)}
        codes = np.fromiter((code_of.get(v, -1) for v in column), np.int32, len(column))
        return cls(values, codes)

    def matching(self, wanted: frozenset[str]) -> np.ndarray:
        """bool [N]: rows whose value is one of `wanted`."""
        # A table over the codes, read once per row: 10x faster than np.isin at 134k rows.
        table = np.zeros(len(self.values) + 1, bool)  # the last entry: null (code -1)
        table[[i for i, v in enumerate(self.values) if v in wanted]] = True
        return table[self.codes]


def normalised(filters: Filters, known: Sequence[str]) -> dict[str, frozenset[str]]:
    """{field: the values it accepts}; FilterError (listing `known`) for an unknown field
    or a value that is not a string or a list of strings."""
    out: dict[str, frozenset[str]] = {}
    for field, value in filters.items():
        if field not in known:
            raise FilterError(
                f"unknown filter field {field!r}; this bundle keeps: "
                f"{', '.join(sorted(known)) or 'none'}",
                known,
            )
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, Sequence | frozenset | set) or not all(
            isinstance(v, str) for v in values
        ):
            raise FilterError(f"filter {field!r} must be a string or a list of strings", known)
        out[field] = frozenset(values)
    return out


def allowed_rows(fields: Mapping[str, FieldValues], filters: Filters, n: int) -> np.ndarray:
    """bool [n]: the rows matching every filter (all True for no filters).
    fields: each metadata field over the n rows. FilterError for a bad filter."""
    allowed = np.ones(n, bool)
    for field, wanted in normalised(filters, list(fields)).items():
        allowed &= fields[field].matching(wanted)
    return allowed


def both(first: np.ndarray | None, second: np.ndarray | None) -> np.ndarray | None:
    """The rows both masks allow (None = every row), e.g. a filter and the live rows."""
    if first is None:
        return second
    if second is None:
        return first
    return first & second

"""The expectation suites the pipeline's gates run, built from settings values.

Settings are passed in as plain arguments (the caller reads `config.Settings`), so this
module needs no config import and tests can build any variant. Great Expectations is
imported inside the builders, never at module import (it takes seconds).

Raw vs clean log suites check the same things with different strictness:

- raw (`raw_log_expectations`): row-level checks carry `mostly = 1 - max_bad_fraction`.
  A few bad rows in a day's log are normal (ASR noise, a broken client); the cleaner drops
  and counts them. A batch where more than that fraction is bad is a broken export or a
  wrong file, and must be quarantined rather than cleaned into a smaller, skewed dataset.
- clean (`clean_log_expectations`): the same checks with `mostly = 1.0`, as a post-condition
  of the cleaner: whatever it let through must be fully valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation

__all__ = [
    "ANSWER_ID_REGEX",
    "CLUSTER_ROW_IDS",
    "CONTROL_CHAR_REGEX",
    "DEFAULT_SPLIT_RATIOS",
    "LOG_COLUMNS",
    "REPLACEMENT_CHAR_REGEX",
    "SPLITS",
    "clean_log_expectations",
    "cluster_expectations",
    "cluster_gate_frames",
    "raw_log_expectations",
    "split_questions_frame",
    "split_share_frame",
    "training_pair_expectations",
]

#: Columns the log loader must produce (extra columns such as confidence, locale are allowed).
LOG_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "timestamp_utc",
    "question",
    "answer_id",
    "source_file",
)
#: An answer id is an opaque key: alphanumeric start, then a few safe punctuation characters.
#: `\Z` rather than `$`: with pandas' regex search, `$` would also accept a trailing newline.
ANSWER_ID_REGEX = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}\Z"
#: U+FFFD is what the loader decodes invalid UTF-8 bytes to: the text is corrupted.
REPLACEMENT_CHAR_REGEX = r"\ufffd"
#: C0 controls except tab/newline/carriage return (whitespace the cleaner collapses) and DEL:
#: the same set `qpr.data.loaders.clean_logs` drops, so the clean gate checks what it promises.
CONTROL_CHAR_REGEX = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
#: At least one non-space character: "   " has a valid length but is no question.
NOT_BLANK_REGEX = r"\S"

SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_SPLIT_RATIOS: dict[str, float] = {"train": 0.8, "val": 0.1, "test": 0.1}
#: Pass as `gate(..., row_ids=CLUSTER_ROW_IDS)` so failures name the offending rows.
CLUSTER_ROW_IDS: dict[str, list[str]] = {
    "clusters": ["cluster_id"],
    "questions": ["question_id"],
    "split_questions": ["question_id", "split"],
    "split_shares": ["split"],
    "pairs": ["q1_id", "q2_id"],
}


# --------------------------------------------------------------------------- logs


def raw_log_expectations(
    *, min_chars: int = 2, max_chars: int = 400, max_bad_fraction: float = 0.05
) -> list[Expectation]:
    """Suite for the raw log frame as the loader returns it, before cleaning.

    Schema problems (missing columns, no rows) always fail; row-level problems fail only
    when more than `max_bad_fraction` of the rows have them.
    """
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise ValueError(f"max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
    return _log_expectations(min_chars, max_chars, mostly=1.0 - max_bad_fraction)


def clean_log_expectations(*, min_chars: int = 2, max_chars: int = 400) -> list[Expectation]:
    """Suite for the cleaned log frame: the raw checks with no tolerance (a post-condition)."""
    return _log_expectations(min_chars, max_chars, mostly=1.0)


def _log_expectations(min_chars: int, max_chars: int, *, mostly: float) -> list[Expectation]:
    import great_expectations.expectations as gxe

    if not 1 <= min_chars <= max_chars:
        raise ValueError(f"need 1 <= min_chars <= max_chars, got {min_chars}, {max_chars}")
    # GX rejects mostly=0 (and a 100% tolerance means "no check" anyway); keep it tiny instead.
    mostly = max(mostly, 1e-9)
    expectations: list[Expectation] = [
        gxe.ExpectTableRowCountToBeBetween(
            min_value=1, description="an empty batch means a broken export or a wrong path"
        )
    ]
    expectations += [
        gxe.ExpectColumnToExist(column=c, description="the loader's output schema")
        for c in LOG_COLUMNS
    ]
    expectations += [
        gxe.ExpectColumnValuesToNotBeNull(
            column="question", mostly=mostly, description="a log row without a question"
        ),
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="question",
            min_value=min_chars,
            max_value=max_chars,
            mostly=mostly,
            description="empty or overlong questions (pasted documents, ASR run-ons)",
        ),
        gxe.ExpectColumnValuesToMatchRegex(
            column="question",
            regex=NOT_BLANK_REGEX,
            mostly=mostly,
            description="whitespace-only questions",
        ),
        gxe.ExpectColumnValuesToNotMatchRegex(
            column="question",
            regex=REPLACEMENT_CHAR_REGEX,
            mostly=mostly,
            description="U+FFFD: the bytes were not valid UTF-8 (wrong encoding upstream)",
        ),
        gxe.ExpectColumnValuesToNotMatchRegex(
            column="question",
            regex=CONTROL_CHAR_REGEX,
            mostly=mostly,
            description="control characters: binary junk or a mis-decoded file",
        ),
        gxe.ExpectColumnValuesToBeOfType(
            column="timestamp_utc",
            type_="Timestamp",
            description="timestamp_utc must be parsed, timezone-aware datetimes",
        ),
        gxe.ExpectColumnValuesToNotBeNull(
            column="timestamp_utc",
            mostly=mostly,
            description="NaT: the raw timestamp could not be parsed",
        ),
        gxe.ExpectColumnValuesToNotBeNull(
            column="answer_id",
            mostly=mostly,
            description="a question without an answer cannot join a paraphrase cluster",
        ),
        gxe.ExpectColumnValuesToMatchRegex(
            column="answer_id",
            regex=ANSWER_ID_REGEX,
            mostly=mostly,
            description="answer ids are opaque keys; anything else is a parsing error",
        ),
    ]
    return expectations


# --------------------------------------------------------------------------- clusters


def cluster_expectations(
    *,
    coherence_threshold: float = 0.1,
    tolerance: float = 0.05,
    ratios: Mapping[str, float] | None = None,
    min_size: int = 2,
    max_size: int | None = None,
) -> dict[str, list[Expectation]]:
    """Suites for the cluster stage outputs, keyed by the frame names of `cluster_gate_frames`.

    Frames: `clusters` (kept clusters only), `questions`, `split_questions` (questions with
    split != "none"), `split_shares` (from `split_share_frame`) and `pairs` (all splits).
    What they guard: incoherent clusters leaking into training (paper eq. 4-5), a question
    in two splits (test leakage), splits far from the configured ratios, and self pairs or
    wrong-split pairs that would teach the encoder nothing or leak.
    """
    import great_expectations.expectations as gxe

    ratios = dict(DEFAULT_SPLIT_RATIOS if ratios is None else ratios)
    expected_splits = sorted(s for s, r in ratios.items() if r > 0)
    return {
        "clusters": _kept_cluster_expectations(gxe, coherence_threshold, min_size, max_size),
        "questions": _question_expectations(gxe),
        "split_questions": [
            *_exist(gxe, "norm_key", "split"),
            gxe.ExpectColumnValuesToBeUnique(
                column="norm_key",
                description="a question in two splits leaks test data into training",
            ),
            gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        ],
        "split_shares": [
            *_exist(gxe, "split", "share", "expected", "deviation"),
            gxe.ExpectColumnValuesToBeBetween(
                column="deviation",
                max_value=tolerance,
                description="split shares (by cluster) must stay near the configured ratios",
            ),
        ],
        "pairs": _pair_expectations(gxe, expected_splits),
    }


def _exist(gxe: ModuleType, *columns: str) -> list[Expectation]:
    return [gxe.ExpectColumnToExist(column=c) for c in columns]


def _int64(gxe: ModuleType, *columns: str) -> list[Expectation]:
    return [gxe.ExpectColumnValuesToBeOfType(column=c, type_="int64") for c in columns]


def _kept_cluster_expectations(
    gxe: ModuleType, coherence_threshold: float, min_size: int, max_size: int | None
) -> list[Expectation]:
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1, description="no cluster survived"),
        *_exist(gxe, "cluster_id", "size", "coherence", "kept", "split"),
        *_int64(gxe, "cluster_id", "size"),
        gxe.ExpectColumnValuesToBeUnique(column="cluster_id"),
        gxe.ExpectColumnValuesToBeBetween(
            column="size",
            min_value=min_size,
            max_value=max_size,
            description="a cluster of one question yields no positive pair",
        ),
        gxe.ExpectColumnValuesToNotBeNull(column="coherence"),
        gxe.ExpectColumnValuesToBeBetween(
            column="coherence",
            min_value=coherence_threshold,
            max_value=1.0,
            description="clusters below the coherence threshold must have been dropped",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="kept", value_set=[True], description="only kept clusters are checked"
        ),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
    ]


def _question_expectations(gxe: ModuleType) -> list[Expectation]:
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        *_exist(gxe, "question_id", "text", "norm_key", "cluster_id", "split"),
        *_int64(gxe, "question_id", "cluster_id"),
        gxe.ExpectColumnValuesToBeUnique(column="question_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="text"),
        gxe.ExpectColumnValuesToNotBeNull(column="norm_key"),
        gxe.ExpectColumnValuesToBeBetween(
            column="cluster_id", min_value=-1, description="-1 means in no cluster"
        ),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=[*SPLITS, "none"]),
    ]


def _pair_expectations(gxe: ModuleType, expected_splits: list[str]) -> list[Expectation]:
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1, description="no positive pairs"),
        *_exist(gxe, "q1_id", "q2_id", "cluster_id", "split"),
        *_int64(gxe, "q1_id", "q2_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="q1_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="q2_id"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="q2_id",
            column_B="q1_id",
            or_equal=False,
            description="pairs are stored q1_id < q2_id; equal ids are self pairs",
        ),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["q1_id", "q2_id"], description="duplicate pairs skew the loss"
        ),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        gxe.ExpectColumnDistinctValuesToContainSet(
            column="split",
            value_set=expected_splits,
            description="every split with a non-zero ratio needs positive pairs",
        ),
    ]


def training_pair_expectations(*, min_pairs: int = 2) -> list[Expectation]:
    """The train stage's input: positive pairs joined to their question texts.

    Columns q1_id, q2_id, cluster_id (int64), q1_text, q2_text (str). Guards a join that
    lost texts (an id missing from the questions table), empty texts, self pairs, and a
    training set too small to form a batch.
    """
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableRowCountToBeBetween(
            min_value=min_pairs, description="too few training pairs to form one batch"
        ),
        *[gxe.ExpectColumnToExist(column=c) for c in ("q1_id", "q2_id", "q1_text", "q2_text")],
        gxe.ExpectColumnValuesToNotBeNull(
            column="q1_text", description="pair id without a question text (broken join)"
        ),
        gxe.ExpectColumnValuesToNotBeNull(
            column="q2_text", description="pair id without a question text (broken join)"
        ),
        gxe.ExpectColumnValueLengthsToBeBetween(column="q1_text", min_value=1),
        gxe.ExpectColumnValueLengthsToBeBetween(column="q2_text", min_value=1),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="q2_id", column_B="q1_id", or_equal=False, description="self pair"
        ),
    ]


# Expectations about a table as a whole: a piece of the table may fail them on its own.
TABLE_LEVEL = ("ExpectTableRowCountToBeBetween", "ExpectColumnDistinctValuesToContainSet")


def table_level(expectations: list[Expectation]) -> tuple[list[Expectation], list[Expectation]]:
    """(row-level, table-level) expectations of a suite, each in suite order."""
    whole = [e for e in expectations if type(e).__name__ in TABLE_LEVEL]
    return [e for e in expectations if type(e).__name__ not in TABLE_LEVEL], whole


def split_share_frame(
    clusters_df: pd.DataFrame,
    ratios: Mapping[str, float],
    *,
    weight_column: str | None = None,
) -> pd.DataFrame:
    """Each split's share of the kept clusters next to its configured ratio.

    Returns columns split, clusters, share, expected, deviation = |share - expected|, one
    row per split in `ratios` plus any split found in the data but not configured (its
    expected share is 0, so any cluster there counts as deviation). A split with ratio 0
    is kept as a row and passes with share 0. `weight_column` (e.g. "size") weighs clusters
    by their number of questions instead of counting each once.
    """
    columns = ["split", "clusters", "share", "expected", "deviation"]
    if "split" not in clusters_df.columns or (weight_column and weight_column not in clusters_df):
        return pd.DataFrame(columns=columns)  # the clusters suite reports the missing column
    kept = clusters_df
    if "kept" in clusters_df.columns:
        kept = clusters_df[clusters_df["kept"].astype(bool)]
    weights = kept[weight_column].astype(float) if weight_column else pd.Series(1.0, kept.index)
    per_split = weights.groupby(kept["split"].astype(str)).sum()
    total = float(per_split.sum())
    splits = list(ratios) + sorted(s for s in per_split.index if s not in ratios)
    rows = []
    for split in splits:
        amount = float(per_split.get(split, 0.0))
        share = amount / total if total > 0 else 0.0
        expected = float(ratios.get(split, 0.0))
        rows.append(
            {
                "split": split,
                "clusters": int((kept["split"].astype(str) == split).sum()),
                "share": share,
                "expected": expected,
                "deviation": abs(share - expected),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def split_questions_frame(questions_df: pd.DataFrame) -> pd.DataFrame:
    """Questions in a split (split != "none"), one row per (norm_key, split).

    Uniqueness of norm_key in this frame then means exactly "no question in two splits".
    Two texts with one norm_key inside the same split (Quora has such near-duplicates)
    are no leak, so they are collapsed first rather than reported.
    """
    if "split" not in questions_df.columns or "norm_key" not in questions_df.columns:
        return questions_df  # the questions suite reports the missing column
    in_split = questions_df[questions_df["split"].astype(str) != "none"]
    return in_split.drop_duplicates(["norm_key", "split"]).reset_index(drop=True)


def cluster_gate_frames(
    clusters_df: pd.DataFrame,
    questions_df: pd.DataFrame,
    pairs_df: pd.DataFrame,
    ratios: Mapping[str, float],
) -> dict[str, pd.DataFrame]:
    """The frames `cluster_expectations` checks, derived from the cluster stage outputs.

    `clusters_df` may hold dropped clusters too (kept == False): only kept ones are checked.
    """
    kept = clusters_df
    if "kept" in clusters_df.columns:
        kept = clusters_df[clusters_df["kept"].astype(bool)].reset_index(drop=True)
    return {
        "clusters": kept,
        "questions": questions_df,
        "split_questions": split_questions_frame(questions_df),
        "split_shares": split_share_frame(clusters_df, ratios),
        "pairs": pairs_df,
    }

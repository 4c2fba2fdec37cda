"""Loaders on crafted good and bad inputs: a clear error for an unusable file, a counted
drop for a bad row, never silent loss."""

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from qpr.data.loaders import DataFormatError, clean_logs, read_log_file, read_logs, read_quora

GOOD = [
    {
        "timestamp": "2026-10-01T08:00:00Z",
        "question": "how tall is the eiffel tower",
        "answer_id": "ans-1",
        "locale": "en-US",
    },
    {
        "timestamp": "2026-10-01T08:00:05+02:00",
        "question": "what's the height of the eiffel tower",
        "answer_id": "ans-1",
        "locale": "en-GB",
    },
    {
        "timestamp": "1790000000",
        "question": "who wrote hamlet",
        "answer_id": "ans-2",
        "locale": "en-US",
    },
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _clean(frame):
    return clean_logs(frame, min_chars=2, max_chars=400)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_each_format_loads_the_same_rows(tmp_path, suffix):
    path = tmp_path / f"day{suffix}"
    frame = pd.DataFrame(GOOD)
    if suffix == ".jsonl":
        _jsonl(path, GOOD)
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    raw = read_log_file(path)
    clean, report = _clean(raw)
    assert report.rows_dropped == 0 and len(clean) == 3
    assert str(clean["timestamp_utc"].dtype) == "datetime64[ns, UTC]"
    # +02:00 offset normalised to UTC; epoch seconds understood.
    assert clean["timestamp_utc"][1] == pd.Timestamp("2026-10-01T06:00:05Z")
    assert clean["timestamp_utc"][2] == pd.Timestamp(1790000000, unit="s", tz="UTC")
    assert set(clean["source_file"]) == {path.name}


def test_bad_rows_are_dropped_and_counted(tmp_path):
    bad = [
        {"timestamp": "2026-10-01T09:00:00Z", "question": "", "answer_id": "ans-1"},
        {"timestamp": "2026-10-01T09:00:01Z", "question": "   ", "answer_id": "ans-1"},
        {"timestamp": "2026-10-01T09:00:02Z", "question": "x" * 10_000, "answer_id": "ans-1"},
        {"timestamp": "yesterday at noon", "question": "what time is it", "answer_id": "ans-3"},
        {"timestamp": "2026-10-01T09:00:03Z", "question": "what day is it", "answer_id": None},
        {"timestamp": "2026-10-01T09:00:04Z", "question": "bad\x07bell", "answer_id": "ans-4"},
        GOOD[0],  # a client retry: the exact same request again
    ]
    path = _jsonl(tmp_path / "day.jsonl", [*GOOD, *bad])
    with path.open("ab") as handle:
        handle.write(
            b'{"timestamp": "2026-10-01T10:00:00Z", "question": "caf\xe9 hours", '
            b'"answer_id": "ans-5"}\n'
        )
        handle.write(b"this line is not json\n")
    raw = read_log_file(path)
    assert len(raw) == len(GOOD) + len(bad) + 2  # nothing vanishes at read time
    clean, report = _clean(raw)
    assert len(clean) == 3
    assert dict(report.dropped) == {
        "empty_question": 2,
        "too_long": 1,
        "bad_timestamp": 1,
        "bad_answer_id": 1,
        "invalid_encoding": 2,  # control character, undecodable byte
        "duplicate_row": 1,
        "malformed": 1,
    }
    assert report.rows_in == report.rows_out + sum(report.dropped.values())
    assert "dropped" in report.summary()


def test_file_that_is_not_a_log_gets_a_clear_error(tmp_path):
    path = tmp_path / "sales.csv"
    path.write_text("a,b,c\n1,2,3\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"not a QA log: missing column\(s\) timestamp"):
        read_log_file(path)


def test_compressed_logs_are_named_not_quoted(tmp_path):
    packed = tmp_path / "day.csv"
    packed.write_bytes(gzip.compress(b"timestamp,question,answer_id\n"))
    with pytest.raises(DataFormatError, match=r"1f 8b 08 00 \(gzip-compressed: decompress"):
        read_log_file(packed)


def test_one_odd_byte_is_a_row_not_a_binary_file(tmp_path):
    path = tmp_path / "day.csv"
    rows = [f"2026-01-01T00:00:{i:02d}Z,question {i},a1" for i in range(20)]
    path.write_text("timestamp,question,answer_id\n" + "\n".join(rows) + "\nx,bad\x00row,a1\n")
    assert len(read_log_file(path)) == 21


def _ragged_csv(path: Path, good: int, ragged: int) -> Path:
    rows = [
        f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z,how do i fix thing {i},a{i % 5}"
        for i in range(good)
    ]
    for j in range(ragged):  # an unquoted comma: one field more than the header
        rows.insert(1 + 3 * j, "2026-01-01T00:00:00Z,where, exactly,a1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("timestamp,question,answer_id\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_ragged_csv_row_is_a_bad_row_not_a_bad_file(tmp_path):
    frame = read_log_file(_ragged_csv(tmp_path / "day.csv", good=204, ragged=1))
    assert len(frame) == 205 and int(frame["malformed"].sum()) == 1
    clean, report = clean_logs(frame, min_chars=2, max_chars=400)
    assert len(clean) == 204 and dict(report.dropped) == {"malformed": 1}
    assert "where" not in " ".join(clean["question"])


def test_a_csv_with_a_broken_quote_is_still_unreadable(tmp_path):
    # A quote left open is no row problem: pandas' Python parser would stop there without
    # a word, losing every row after it.
    path = _ragged_csv(tmp_path / "quote.csv", good=200, ragged=1)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[150] = '2026-01-01T00:02:30Z,"an open quote,a1'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"not a readable CSV file: .*EOF inside string"):
        read_log_file(path)


def test_binary_garbage_and_unknown_types(tmp_path):
    junk = tmp_path / "x.jsonl"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00garbage\n")
    with pytest.raises(DataFormatError, match=r"not a text file: starts with bytes 89 50 4e 47"):
        read_log_file(junk)
    junk.write_bytes(b"{not json}\n" * 20)
    with pytest.raises(DataFormatError, match="not JSON Lines"):
        read_log_file(junk)
    parquet = tmp_path / "x.parquet"
    parquet.write_text("not parquet", encoding="utf-8")
    with pytest.raises(DataFormatError, match="not a readable Parquet"):
        read_log_file(parquet)
    other = tmp_path / "x.xlsx"
    other.write_text("?", encoding="utf-8")
    with pytest.raises(DataFormatError, match="unknown log file type"):
        read_log_file(other)
    with pytest.raises(DataFormatError, match="does not exist"):
        read_logs(tmp_path / "missing")
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(DataFormatError, match="no log files"):
        read_logs(empty)


def test_directory_of_daily_files_concatenates_in_order(tmp_path):
    _jsonl(tmp_path / "2026-10-02.jsonl", GOOD[1:])
    _jsonl(tmp_path / "2026-10-01.jsonl", GOOD[:1])
    raw = read_logs(tmp_path)
    assert raw["source_file"].tolist() == [
        "2026-10-01.jsonl",
        "2026-10-02.jsonl",
        "2026-10-02.jsonl",
    ]


def test_quora_format_loads_and_counts_bad_rows(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "0\t1\t2\tHow do I learn Python?\tWhat is the best way to learn Python?\t1\n"
        "1\t3\t4\t\tempty first question\t0\n"
        "2\t5\t6\tq five\tq six\tmaybe\n",
        encoding="utf-8",
    )
    pairs, report = read_quora(path)
    assert len(pairs) == 1 and pairs["qid1"].dtype == "int64"
    assert dict(report.dropped) == {"empty_question": 1, "bad_label": 1}
    bad = tmp_path / "bad.tsv"
    bad.write_text("question\tanswer\nhi\tthere\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="not in the Quora pairs format"):
        read_quora(bad)


@pytest.mark.quora
def test_real_quora_copy_loads(quora_tsv):
    pairs, report = read_quora(quora_tsv)
    assert len(pairs) > 100_000
    assert set(pairs["is_duplicate"].unique()) <= {0, 1}
    assert report.rows_out == len(pairs)

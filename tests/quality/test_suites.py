"""Data-quality gates: good inputs pass, each kind of bad input fails loudly and legibly.

A failing gate must tell a person what was wrong without opening the report: each
assertion below checks that the message names the expectation, the column and an
offending value.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from qpr.quality.suites import (
    CLUSTER_ROW_IDS,
    LOG_COLUMNS,
    clean_log_expectations,
    cluster_expectations,
    cluster_gate_frames,
    raw_log_expectations,
    split_share_frame,
)

from .factories import SPLIT_RATIOS, make_log_frame

LogFactory = Callable[[int], pd.DataFrame]
ClusterOutputs = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def run_raw(gx_gate: ModuleType, df: pd.DataFrame, report_dir: Path | None = None):
    return gx_gate.gate("raw_logs", {"logs": df}, {"logs": raw_log_expectations()}, report_dir)


def run_clusters(
    gx_gate: ModuleType,
    outputs: ClusterOutputs,
    report_dir: Path | None = None,
    **suite_kwargs: float,
):
    clusters, questions, pairs = outputs
    kwargs = {"coherence_threshold": 0.1, "tolerance": 0.05, **suite_kwargs}
    return gx_gate.gate(
        "clusters",
        cluster_gate_frames(clusters, questions, pairs, SPLIT_RATIOS),
        cluster_expectations(ratios=SPLIT_RATIOS, **kwargs),
        report_dir,
        row_ids=CLUSTER_ROW_IDS,
    )


def failure_message(call: Callable[[], object], gx_gate: ModuleType) -> str:
    with pytest.raises(gx_gate.GateFailed) as info:
        call()
    return str(info.value)


# --------------------------------------------------------------------------- passing gates


def test_good_raw_logs_pass_with_counts(gx_gate: ModuleType, log_frame: LogFactory) -> None:
    suite = raw_log_expectations()
    result = gx_gate.gate("raw_logs", {"logs": log_frame(300)}, {"logs": suite}, None)
    assert result.success
    assert result.evaluated == len(suite)
    assert result.failed == 0
    assert result.report_path is None
    assert result.statistics["frames"]["logs"]["rows"] == 300
    assert result.statistics["successful_expectations"] == len(suite)


def test_good_clean_logs_pass(gx_gate: ModuleType, log_frame: LogFactory) -> None:
    df = log_frame(50)
    result = gx_gate.gate("clean_logs", {"logs": df}, {"logs": clean_log_expectations()}, None)
    assert result.success


def test_good_cluster_outputs_pass(gx_gate: ModuleType, cluster_outputs: ClusterOutputs) -> None:
    result = run_clusters(gx_gate, cluster_outputs)
    assert result.success
    assert set(result.statistics["frames"]) == set(CLUSTER_ROW_IDS)


def test_repeated_gates_with_one_name_do_not_clash(
    gx_gate: ModuleType, log_frame: LogFactory
) -> None:
    for _ in range(3):
        assert run_raw(gx_gate, log_frame(20)).success


# --------------------------------------------------------------------------- bad raw logs


def _drop_answer_id(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["answer_id"])


def _empty_questions(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[: len(df) // 10, "question"] = ""  # ~10%: above the 5% tolerance
    return df


def _huge_questions(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[: len(df) // 10, "question"] = "x" * 10_000
    return df


def _invalid_utf8(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[: len(df) // 10, "question"] = "caf\ufffd au lait price"
    return df


def _control_chars(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[: len(df) // 10, "question"] = "ding\x07dong"
    return df


def _unparseable_timestamps(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[: len(df) // 10, "timestamp"] = "yesterday-ish"
    df.loc[: len(df) // 10, "timestamp_utc"] = pd.NaT
    return df


def _bad_answer_ids(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[: len(df) // 10, "answer_id"] = "answer #7; DROP TABLE"
    return df


def _not_a_log(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"a": [1, 2], "b": [3, 4], "c": [5, 6]})


@pytest.mark.parametrize(
    ("corrupt", "expectation", "column", "shown"),
    [
        (_drop_answer_id, "expect_column_to_exist", "answer_id", "column missing"),
        (_empty_questions, "expect_column_value_lengths_to_be_between", "question", "''"),
        (_huge_questions, "expect_column_value_lengths_to_be_between", "question", "'xxxx"),
        (_invalid_utf8, "expect_column_values_to_not_match_regex", "question", "caf\ufffd au"),
        (_control_chars, "expect_column_values_to_not_match_regex", "question", r"ding\x07dong"),
        (_unparseable_timestamps, "expect_column_values_to_not_be_null", "timestamp_utc", "NaT"),
        (_bad_answer_ids, "expect_column_values_to_match_regex", "answer_id", "'answer #7"),
        (_not_a_log, "expect_column_to_exist", "question", "columns a, b, c"),
    ],
    ids=["missing-column", "empty", "10k-chars", "utf8", "control", "nat", "answer-id", "abc"],
)
def test_bad_raw_logs_fail_with_a_legible_message(
    gx_gate: ModuleType,
    log_frame: LogFactory,
    corrupt: Callable[[pd.DataFrame], pd.DataFrame],
    expectation: str,
    column: str,
    shown: str,
) -> None:
    df = corrupt(log_frame(200))
    message = failure_message(lambda: run_raw(gx_gate, df), gx_gate)
    assert message.startswith("gate 'raw_logs' failed:")
    line = next((ln for ln in message.splitlines() if f"{expectation}({column}" in ln), None)
    assert line is not None, message
    assert shown in line, message


def test_long_values_are_shortened_in_the_message(
    gx_gate: ModuleType, log_frame: LogFactory
) -> None:
    message = failure_message(lambda: run_raw(gx_gate, _huge_questions(log_frame(200))), gx_gate)
    assert "…" in message
    assert max(len(line) for line in message.splitlines()) < 300


def test_not_a_log_lists_every_missing_column(gx_gate: ModuleType) -> None:
    df = _not_a_log(pd.DataFrame())
    with pytest.raises(gx_gate.GateFailed) as info:
        run_raw(gx_gate, df)
    missing = {
        f["columns"][0] for f in info.value.failures if f["expectation"] == "expect_column_to_exist"
    }
    assert missing == set(LOG_COLUMNS)
    assert "not run, column 'question' missing" in str(info.value)


def test_failure_carries_structured_failures(gx_gate: ModuleType, log_frame: LogFactory) -> None:
    with pytest.raises(gx_gate.GateFailed) as info:
        run_raw(gx_gate, _bad_answer_ids(log_frame(100)))
    error = info.value
    assert error.gate_name == "raw_logs"
    assert error.report_path is None
    [failure] = error.failures
    assert failure["columns"] == ["answer_id"]
    assert failure["unexpected_count"] == 11
    assert failure["element_count"] == 100
    assert failure["examples"] == ["'answer #7; DROP TABLE'"]


# --------------------------------------------------------------------------- tolerance


def test_few_bad_rows_pass_raw_gate_but_fail_clean_gate(
    gx_gate: ModuleType, log_frame: LogFactory
) -> None:
    df = log_frame(200)
    df.loc[:2, "question"] = ["", "a", "\ufffd\ufffd"]  # 1.5%: under the 5% tolerance
    df.loc[3, "timestamp_utc"] = pd.NaT
    df.loc[4, "answer_id"] = None

    assert run_raw(gx_gate, df).success
    with pytest.raises(gx_gate.GateFailed) as info:
        gx_gate.gate("clean_logs", {"logs": df}, {"logs": clean_log_expectations()}, None)
    failed = {(f["expectation"], tuple(f["columns"])) for f in info.value.failures}
    assert ("expect_column_value_lengths_to_be_between", ("question",)) in failed
    assert ("expect_column_values_to_not_match_regex", ("question",)) in failed
    assert ("expect_column_values_to_not_be_null", ("timestamp_utc",)) in failed
    assert ("expect_column_values_to_not_be_null", ("answer_id",)) in failed


def test_tolerance_is_a_parameter(gx_gate: ModuleType, log_frame: LogFactory) -> None:
    df = _empty_questions(log_frame(200))  # ~10% empty
    suite = raw_log_expectations(max_bad_fraction=0.2)
    assert gx_gate.gate("raw_logs", {"logs": df}, {"logs": suite}, None).success


# --------------------------------------------------------------------------- cluster outputs


def test_incoherent_cluster_fails(gx_gate: ModuleType, cluster_outputs: ClusterOutputs) -> None:
    clusters, _, _ = cluster_outputs
    clusters.loc[3, "coherence"] = 0.04  # kept although below the 0.1 threshold
    message = failure_message(lambda: run_clusters(gx_gate, cluster_outputs), gx_gate)
    assert "[clusters] expect_column_values_to_be_between(coherence, min 0.1, max 1)" in message
    assert "cluster_id=3: coherence=0.04" in message


def test_question_in_two_splits_fails(gx_gate: ModuleType, cluster_outputs: ClusterOutputs) -> None:
    _, questions, _ = cluster_outputs
    test_row = questions.index[questions["split"] == "test"][0]
    questions.loc[test_row, "norm_key"] = questions.loc[0, "norm_key"]  # same question as train
    message = failure_message(lambda: run_clusters(gx_gate, cluster_outputs), gx_gate)
    assert "[split_questions] expect_column_values_to_be_unique(norm_key)" in message
    assert "split='train': norm_key='how do i do task 0 variant 0'" in message
    assert "split='test': norm_key='how do i do task 0 variant 0'" in message


def test_same_norm_key_within_one_split_is_no_leak(
    gx_gate: ModuleType, cluster_outputs: ClusterOutputs
) -> None:
    _, questions, _ = cluster_outputs
    questions.loc[1, "norm_key"] = questions.loc[0, "norm_key"]  # both train: near-duplicates
    assert run_clusters(gx_gate, cluster_outputs).success


def test_split_shares_off_by_more_than_tolerance_fail(
    gx_gate: ModuleType, cluster_outputs: ClusterOutputs
) -> None:
    clusters, _, _ = cluster_outputs
    clusters.loc[:3, "split"] = "test"  # 12/20 train, 2 val, 6 test: 0.6/0.1/0.3
    message = failure_message(lambda: run_clusters(gx_gate, cluster_outputs), gx_gate)
    assert "[split_shares] expect_column_values_to_be_between(deviation, max 0.05)" in message
    assert "split='train': deviation=0.2" in message
    assert "split='test': deviation=0.2" in message


def test_self_pair_fails(gx_gate: ModuleType, cluster_outputs: ClusterOutputs) -> None:
    _, _, pairs = cluster_outputs
    pairs.loc[5, "q2_id"] = pairs.loc[5, "q1_id"]
    message = failure_message(lambda: run_clusters(gx_gate, cluster_outputs), gx_gate)
    assert "[pairs] expect_column_pair_values_a_to_be_greater_than_b(q2_id, q1_id" in message
    q1 = pairs.loc[5, "q1_id"]
    assert f"q1_id={q1} q2_id={q1}" in message


def test_split_share_frame_counts_kept_clusters_only(cluster_outputs: ClusterOutputs) -> None:
    clusters, _, _ = cluster_outputs
    shares = split_share_frame(clusters, SPLIT_RATIOS).set_index("split")
    assert list(shares.index) == ["train", "val", "test"]  # "dropped" rows are not kept
    assert shares["clusters"].sum() == 20
    assert shares["deviation"].max() == pytest.approx(0.0)


def test_split_share_frame_zero_ratio_and_unknown_split() -> None:
    clusters = pd.DataFrame(
        {"kept": [True] * 4, "split": ["train", "train", "train", "holdout"], "size": [2] * 4}
    )
    shares = split_share_frame(clusters, {"train": 1.0, "val": 0.0}).set_index("split")
    assert shares.loc["val", "share"] == 0.0
    assert shares.loc["val", "deviation"] == 0.0  # a zero ratio with zero share passes
    assert shares.loc["holdout", "expected"] == 0.0  # unconfigured split: all of it is deviation
    assert shares.loc["holdout", "deviation"] == pytest.approx(0.25)


# --------------------------------------------------------------------------- reports


def test_reports_are_written_and_parseable(
    gx_gate: ModuleType, log_frame: LogFactory, tmp_path: Path
) -> None:
    result = run_raw(gx_gate, log_frame(40), tmp_path)
    assert result.report_path == tmp_path / "raw_logs.json"
    report = json.loads(result.report_path.read_text(encoding="utf-8"))
    assert report["success"] is True
    assert report["statistics"]["evaluated_expectations"] == result.evaluated
    validation = report["frames"]["logs"]["validation"]
    assert len(validation["results"]) == result.evaluated
    assert "PASSED" in (tmp_path / "raw_logs.md").read_text(encoding="utf-8")


def test_failing_gate_still_writes_its_report(
    gx_gate: ModuleType, log_frame: LogFactory, tmp_path: Path
) -> None:
    with pytest.raises(gx_gate.GateFailed) as info:
        run_raw(gx_gate, _invalid_utf8(log_frame(100)), tmp_path / "reports")
    path = tmp_path / "reports" / "raw_logs.json"
    assert info.value.report_path == path
    assert f"full report: {path}" in str(info.value)
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["success"] is False
    assert report["failures"][0]["unexpected_count"] == 11
    assert "\ufffd" in json.dumps(report["frames"], ensure_ascii=False)
    summary = (tmp_path / "reports" / "raw_logs.md").read_text(encoding="utf-8")
    assert "FAILED" in summary
    assert "not valid UTF-8" in summary


def test_no_report_dir_writes_nothing(
    gx_gate: ModuleType, log_frame: LogFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gx_gate.GateFailed) as info:
        run_raw(gx_gate, _empty_questions(log_frame(50)), None)
    assert info.value.report_path is None
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- misuse, cost


def test_frames_and_suites_must_match(gx_gate: ModuleType, log_frame: LogFactory) -> None:
    with pytest.raises(ValueError, match="frames without a suite"):
        gx_gate.gate("x", {"logs": log_frame(5), "extra": log_frame(5)}, {"logs": []}, None)
    with pytest.raises(ValueError, match="suites without a frame"):
        gx_gate.gate("x", {}, {"logs": raw_log_expectations()}, None)
    with pytest.raises(ValueError, match="file stem"):
        gx_gate.gate("../escape", {"logs": log_frame(5)}, {"logs": []}, None)


def test_importing_the_gate_does_not_import_great_expectations() -> None:
    code = (
        "import sys, qpr.quality.gate, qpr.quality.suites; "
        "sys.exit('great_expectations' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_gate_on_30k_rows_is_fast_once_warm(gx_gate: ModuleType) -> None:
    df = make_log_frame(30_801)
    started = time.perf_counter()
    assert run_raw(gx_gate, df).success
    assert time.perf_counter() - started < 10.0

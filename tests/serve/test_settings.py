"""qpr.serve.settings: QPR_SERVE_* parsed, checked, and errors that name the variable."""

from __future__ import annotations

import pytest

from qpr.serve.settings import ServeSettings, SettingsError


def test_variables_are_parsed_and_blank_ones_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPR_SERVE_MAX_K", " 30 ")
    monkeypatch.setenv("QPR_SERVE_FOLD_ENCODER", "off")
    monkeypatch.setenv("QPR_SERVE_NPROBE", "   ")
    monkeypatch.setenv("QPR_SERVE_MODELS_DIR", " elsewhere ")
    settings = ServeSettings.from_env(threads=2, alias=None)
    assert (settings.max_k, settings.fold_encoder, settings.nprobe) == (30, False, None)
    assert (settings.models_dir, settings.threads, settings.alias) == ("elsewhere", 2, "champion")
    assert ServeSettings().max_k == 100  # plain construction reads no environment


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("QPR_SERVE_MAX_BATCH", "70.0", "QPR_SERVE_MAX_BATCH='70.0' is not a valid integer"),
        ("QPR_SERVE_ACCESS_LOG", "t", "QPR_SERVE_ACCESS_LOG='t' is not a valid boolean"),
        # out of range: the rule broken, then the variable that broke it
        ("QPR_SERVE_CANARIES", "0", r"canaries must be >= 1, got 0 \(QPR_SERVE_CANARIES='0'\)"),
        ("QPR_SERVE_POLL_SECONDS", "nan", r"poll_seconds .* \(QPR_SERVE_POLL_SECONDS='nan'\)"),
        ("QPR_SERVE_DEFAULT_K", "200", r"above max_k=100 \(QPR_SERVE_DEFAULT_K='200'\)"),
        (
            "QPR_SERVE_QUERY_LOG_SAMPLE",
            "1.5",
            r"query_log_sample must be between 0 and 1, got 1.5 \(QPR_SERVE_QUERY_LOG_SAMPLE=",
        ),
        (
            "QPR_SERVE_QUERY_LOG_TOTAL_BYTES",
            "4096",
            r"query_log_total_bytes \(4096\) must be at least twice query_log_file_bytes "
            r".*\(QPR_SERVE_QUERY_LOG_TOTAL_BYTES='4096'\)",
        ),
        ("QPR_SERVE_QUERY_LOG_QUEUE", "0", r"query_log_queue must be >= 1, got 0 \(QPR_SERVE_"),
    ],
)
def test_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, words: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=words):
        ServeSettings.from_env()


def test_an_option_out_of_range_is_named_as_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPR_SERVE_THREADS", "2")
    with pytest.raises(SettingsError, match=r"^threads must be >= 1, got 0$"):
        ServeSettings.from_env(threads=0)  # the CLI's --threads, not the variable


def test_the_query_log_is_on_with_a_folder_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not ServeSettings().query_log_on  # no folder: no log
    monkeypatch.setenv("QPR_SERVE_QUERY_LOG", "logs/service")
    monkeypatch.setenv("QPR_SERVE_QUERY_LOG_SAMPLE", "0.25")
    on = ServeSettings.from_env()
    assert on.query_log_on and on.query_log_limits().sample == 0.25
    monkeypatch.setenv("QPR_SERVE_QUERY_LOG_ENABLED", "off")
    assert not ServeSettings.from_env().query_log_on

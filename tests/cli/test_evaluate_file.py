"""`qpr evaluate`: the stage without FILE, a file's evaluation with it. The evaluation
itself is tested end to end in tests/evaluation/test_on_file.py."""

from typer.testing import CliRunner

from qpr.cli import app

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

"""`qpr model ...` without a registry; tests/flows/test_stage_register.py runs them on one."""

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_a_forced_promotion_needs_a_reason(tmp_path):
    result = runner.invoke(app, ["model", "promote", "3", "--force"])
    assert result.exit_code == 1
    assert "--force needs a --reason" in result.output

"""`qpr index`: the stage without a sub-command, the deltas with one."""

import json

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_index_add_then_delete_serves_fresh_questions_at_once(tmp_path):
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    logs = tmp_path / "logs"
    made = runner.invoke(app, ["data", "synth", "--out", str(logs), "--day", "2026-11-02"])
    assert made.exit_code == 0, made.output
    listed = tmp_path / "new.txt"
    listed.write_text(f"how do i descale my espresso machine\n{QUESTIONS[0]}\n")

    added = runner.invoke(
        app,
        ["index", "add", str(logs / "2026-11-02.jsonl"), str(listed), "--models-dir", str(models)],
    )
    assert added.exit_code == 0, added.output
    out = json.loads(added.output)
    assert out["files"] == 2 and out["added"] >= 1  # QUESTIONS[0] is served already
    again = runner.invoke(app, ["index", "add", str(listed), "--models-dir", str(models)])
    assert json.loads(again.output)["files"] == 0  # the same file is not added twice

    args = ["search", "how do i descale my espresso machine", "-k", "1", "--models-dir"]
    hit = json.loads(runner.invoke(app, [*args, str(models), "--json"]).output)["hits"][0]
    assert hit["distance"] == 0.0
    deleted = runner.invoke(
        app,
        ["index", "delete", "--question-id", str(hit["question_id"]), "--models-dir", str(models)],
    )
    assert deleted.exit_code == 0, deleted.output
    after = json.loads(runner.invoke(app, [*args, str(models), "--json"]).output)["hits"][0]
    assert after["question_id"] != hit["question_id"]
    assert runner.invoke(app, ["index", "delete", "--models-dir", str(models)]).exit_code == 1
    assert "published" in out  # not a DVC project, no champion: said, not failed
    assert out["published"]["dvc"].startswith("not the models/ of a DVC project")

    dropped = runner.invoke(
        app, ["index", "drop", "1", "--reason", "bad file", "--models-dir", str(models), "--local"]
    )
    assert dropped.exit_code == 0, dropped.output
    assert json.loads(dropped.output)["dropped"] == 1 and "published" not in dropped.output
    gone = json.loads(runner.invoke(app, [*args, str(models), "--json"]).output)["hits"][0]
    assert gone["text"] != "how do i descale my espresso machine"
    again = runner.invoke(app, ["index", "drop", "1", "--models-dir", str(models), "--local"])
    assert again.exit_code == 1 and "no delta 1" in again.output
    listed = runner.invoke(app, ["index", "list", "--models-dir", str(models)])
    assert listed.exit_code == 0 and "dropped" in listed.output
    manifest = json.loads(
        runner.invoke(app, ["index", "list", "--json", "--models-dir", str(models)]).output
    )
    assert manifest["dropped"][0]["number"] == 1 and manifest["absorbed_version"] == 0


def test_index_delete_and_list_take_and_print_64_bit_ids_as_strings(tmp_path):
    """An id as `--json` prints it (a string) deletes that question; the ids printed back
    and the tombstones of `index list --json` are strings too, whole above 2^53."""
    from tests.serve.test_app import BIG_QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, BIG_QIDS)
    args = ["search", QUESTIONS[5], "-k", "1", "--models-dir", str(models), "--json"]
    hit = json.loads(runner.invoke(app, args).output)["hits"][0]
    assert hit["question_id"] == str(BIG_QIDS[5])
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(f"{BIG_QIDS[6]}\n{2**53 + 2}\n")  # the second one is not served
    delete = ["index", "delete", "--question-id", hit["question_id"], "--ids-file", str(ids_file)]
    deleted = runner.invoke(app, [*delete, "--models-dir", str(models), "--local"])
    assert deleted.exit_code == 0, deleted.output
    out = json.loads(deleted.output, parse_int=float)  # as JavaScript reads numbers
    assert out["deleted"] == [str(BIG_QIDS[5]), str(BIG_QIDS[6])]
    assert out["unknown"] == [str(2**53 + 2)]
    listed = runner.invoke(app, ["index", "list", "--json", "--models-dir", str(models)])
    stones = json.loads(listed.output)["tombstones"]
    assert stones == [[str(BIG_QIDS[5]), 1], [str(BIG_QIDS[6]), 1]]
    after = json.loads(runner.invoke(app, args).output)["hits"][0]
    assert after["question_id"] not in {str(BIG_QIDS[5]), str(BIG_QIDS[6])}

    ids_file.write_text("12.5\n")
    refused = runner.invoke(app, [*delete, "--models-dir", str(models), "--local"])
    assert refused.exit_code == 1 and "decimal digits" in " ".join(refused.output.split())
    assert "Traceback" not in refused.output


def test_index_help_names_the_stage_and_the_delta_commands():
    result = runner.invoke(app, ["index", "--help"])
    assert result.exit_code == 0
    words = ("Stage 4", "add", "delete", "list", "drop", "compact")
    assert all(word in result.output for word in words)


def test_index_params_before_a_sub_command_is_refused(tmp_path, monkeypatch):
    """`qpr index --params P add ...`: --params is the stage's option; the sub-command
    would otherwise read params.yaml, silently."""
    from qpr.cli import common

    monkeypatch.setattr(common, "run_flow", lambda *args: 1)  # the stage is never run
    params = str(tmp_path / "params.yaml")
    result = runner.invoke(app, ["index", "--params", params, "list"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "give it after the sub-command" in said
    assert runner.invoke(app, ["index", "--params", params]).exit_code == 1  # the stage ran


def test_index_list_names_a_failed_delta_and_add_refuses_in_one_line(tmp_path):
    from qpr.artifacts import DELTA_IDS_FILE, DELTAS_MANIFEST_FILE
    from qpr.deltas.format import delta_dir
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    listed = tmp_path / "new.txt"
    listed.write_text("how do i descale my espresso machine\n")
    add = ["index", "add", str(listed), "--models-dir", str(models), "--local"]
    assert runner.invoke(app, add).exit_code == 0
    (models / delta_dir(1) / DELTA_IDS_FILE).unlink()
    manifest = (models / DELTAS_MANIFEST_FILE).read_bytes()

    shown = runner.invoke(app, ["index", "list", "--models-dir", str(models)])
    assert shown.exit_code == 0 and "failed:" in shown.output  # the cell wraps at 80 columns
    assert "delta 1 fails its check and is not served" in " ".join(shown.output.split())
    as_json = runner.invoke(app, ["index", "list", "--json", "--models-dir", str(models)])
    assert (
        json.loads(as_json.output)["deltas"][0]["state"] == "failed: deltas/0001: ids.npy missing"
    )

    other = tmp_path / "other.txt"
    other.write_text("how do i clean my espresso machine\n")
    refused = runner.invoke(app, ["index", "add", str(other), "--models-dir", str(models)])
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "delta 1 fails its check" in refused.output and "Traceback" not in refused.output
    assert (models / DELTAS_MANIFEST_FILE).read_bytes() == manifest
    for command in (["delete", "--question-id", str(QIDS[0])], ["compact"]):
        out = runner.invoke(app, ["index", *command, "--models-dir", str(models), "--local"])
        assert out.exit_code == 1 and "qpr index drop 1" in " ".join(out.output.split())
    assert (models / DELTAS_MANIFEST_FILE).read_bytes() == manifest

    drop = ["index", "drop", "1", "--models-dir", str(models), "--local"]
    assert runner.invoke(app, drop).exit_code == 0
    again = runner.invoke(app, ["index", "list", "--json", "--models-dir", str(models)])
    assert json.loads(again.output)["deltas"] == []
    assert (
        runner.invoke(
            app, ["index", "add", str(other), "--models-dir", str(models), "--local"]
        ).exit_code
        == 0
    )

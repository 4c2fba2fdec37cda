"""`qpr search`: the service's field names, explanations and metadata filters."""

import io
import json
from types import SimpleNamespace

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_search_json_hits_have_the_service_field_names(tmp_path):
    from qpr.retrieval.bundle import HIT_FIELDS
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    args = ["search", QUESTIONS[7], "-k", "3", "--models-dir", str(models), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert [tuple(h) for h in hits] == [HIT_FIELDS] * 3
    assert (hits[0]["question_id"], hits[0]["answer_id"]) == (str(QIDS[7]), "ans-3")
    explained = runner.invoke(app, [*args, "--explain"])
    assert explained.exit_code == 0, explained.output
    part = json.loads(explained.output)["hits"][0]["explain"]
    assert part["fused_score"] == hits[0]["score"] and part["dense_weight"] == 1.0
    table = runner.invoke(app, ["search", QUESTIONS[7], "--models-dir", str(models), "--explain"])
    assert table.exit_code == 0, table.output
    assert "ans-3" in table.output and "matched" in table.output


def test_search_json_writes_64_bit_ids_as_strings(tmp_path):
    """Ids above 2^53 come through `--json` whole, even read as JavaScript reads numbers."""
    from tests.serve.test_app import BIG_QIDS, QUESTIONS, build_bundle

    clusters = [BIG_QIDS[-1 - i // 2] for i in range(len(QUESTIONS))]
    models = build_bundle(tmp_path / "models", QUESTIONS, BIG_QIDS, cluster_ids=clusters)
    for i in (7, len(QUESTIONS) - 1):
        args = ["search", QUESTIONS[i], "-k", "2", "--models-dir", str(models), "--json"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        top = json.loads(result.output, parse_int=float)["hits"][0]
        assert (top["question_id"], top["cluster_id"]) == (str(BIG_QIDS[i]), str(clusters[i]))
        assert int(top["question_id"]) == BIG_QIDS[i] and float(BIG_QIDS[i]) != BIG_QIDS[i]


def test_search_filter_flag(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qpr.cli.serving import parse_filters
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    table = pq.read_table(models / "index" / "questions.parquet")
    locales = [("en", "de")[i % 2] for i in range(table.num_rows)]
    pq.write_table(table.append_column("locale", pa.array(locales)),
                   models / "index" / "questions.parquet")  # fmt: skip
    args = ["search", QUESTIONS[7], "-k", "5", "--models-dir", str(models), "--json"]
    result = runner.invoke(
        app, [*args, "--filter", "locale=en", "--filter", "answer_id=ans-2,ans-4"]
    )
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert hits and all(QIDS.index(int(h["question_id"])) % 2 == 0 for h in hits)
    assert {h["answer_id"] for h in hits} <= {"ans-2", "ans-4"}
    unknown = runner.invoke(app, [*args, "--filter", "tenant=a"])
    assert unknown.exit_code != 0 and "answer_id, locale" in " ".join(unknown.output.split())
    assert parse_filters(["locale=en", "tenant=a, b"]) == {"locale": "en", "tenant": ["a", "b"]}
    for bad in (["locale"], ["=en"], ["locale=en", "locale=de"]):
        refused = runner.invoke(app, [*args, *(f"--filter={b}" for b in bad)])
        assert refused.exit_code != 0, bad


def test_indexed_text_in_the_hits_table_is_not_markup() -> None:
    from rich.console import Console

    from qpr.cli.serving import _hits_table

    hit = SimpleNamespace(text="[/] \x1b[2J", answer_id="a1", distance=0.1, score=0.9, explain=None)
    out = Console(width=200, record=True, file=io.StringIO())
    out.print(_hits_table("[bold]x", [hit], explain=False))
    text = out.export_text()
    assert "[/] \\x1b[2J" in text and "'[bold]x'" in text and "\x1b" not in text


def test_the_table_shows_no_rank_score_unless_explained() -> None:
    """A fused rank score is ~1 for the top hit of any question: not shown as if it
    measured the match; --explain shows it beside its parts."""
    from rich.console import Console

    from qpr.cli.serving import _hits_table

    hit = SimpleNamespace(text="xq zzv", answer_id="a1", distance=1.9, score=1.0, explain=None)
    for explain, shows in ((False, False), (True, True)):
        out = Console(width=200, record=True, file=io.StringIO())
        out.print(_hits_table("xq zzv", [hit], explain=explain))
        text = out.export_text()
        assert "1.9000" in text
        assert ("1.000" in text.replace("1.9000", "")) is shows
        assert ("rank score" in text) is shows and "│ score" not in text

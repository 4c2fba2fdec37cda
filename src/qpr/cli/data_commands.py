"""`qpr data ...`: make, check and version the raw question-answer logs, without Prefect
or MLflow."""

from __future__ import annotations

import dataclasses
import sys
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from qpr import environment
from qpr.cli.common import ParamsOption, console, fail, shown
from qpr.cli.terminal import command_group

data_app = command_group(
    help="Make, check and version the raw question-answer logs.", no_args_is_help=True
)


@data_app.command("synth")
def data_synth(
    out: Annotated[Path, typer.Option(help="Directory for the daily JSONL files.")] = Path(
        "data/logs"
    ),
    params: ParamsOption = Path("params.yaml"),
    days: Annotated[int | None, typer.Option(help="Days of logs (default: params).")] = None,
    rows_per_day: Annotated[
        int | None, typer.Option(help="Requests per day; raise it for a larger data set.")
    ] = None,
    intents: Annotated[int | None, typer.Option(help="Answer intents (default: params).")] = None,
    seed: Annotated[int | None, typer.Option(help="Generator seed (default: params).")] = None,
    day: Annotated[
        str | None,
        typer.Option(help="Write only this day (YYYY-MM-DD): the next day's fresh logs."),
    ] = None,
) -> None:
    """Write the embedded synthetic voice-assistant QA logs, one JSONL file per day.

    Deterministic: the same seed and sizes give the same bytes on any machine, and a day's
    file is the same whether written alone or with the others.
    """
    from qpr.config import load_settings
    from qpr.data.synth import SynthSpec, write_day, write_logs

    given = {"seed": seed, "days": days, "rows_per_day": rows_per_day, "intents": intents}
    spec = dataclasses.replace(
        SynthSpec.from_settings(load_settings(params).data.synth),
        **{name: value for name, value in given.items() if value is not None},
    )
    if day is not None:
        try:
            the_day = date.fromisoformat(day)
        except ValueError:
            fail(f"--day must be YYYY-MM-DD, got {day!r}")
        path = write_day(out, the_day, seed=spec.seed, rows=spec.rows_per_day, intents=spec.intents)
        console.print(f"wrote {path}")
        return
    from tqdm import tqdm

    with tqdm(
        total=spec.days, unit="day", desc="synth logs", disable=not sys.stderr.isatty()
    ) as bar:
        files = write_logs(out, spec, progress=lambda done, total: bar.update(1))
    rows = sum(1 for f in files for _ in f.open(encoding="utf-8"))
    console.print(f"wrote {len(files)} daily files, {rows:,} rows, to {out}")


@data_app.command("scale")
def data_scale(
    questions: Annotated[str, typer.Option(help="Questions to write: 1M, 3M, 10M, 250k, ...")],
    out: Annotated[Path, typer.Option(help="Directory for the Parquet shards.")],
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 13,
    shard_rows: Annotated[int, typer.Option(help="Questions a shard.")] = 500_000,
) -> None:
    """Write synthetic QA logs of any size, with real questions' word statistics (Parquet
    shards, `qpr.data.scale`). Deterministic by seed; a killed run resumes at the first
    shard not yet written. docs/scale.md compares them with Quora."""
    from qpr.data.scale import ScaleSpec, parse_count, write_scale_corpus

    try:
        spec = ScaleSpec(parse_count(questions), seed=seed, shard_rows=shard_rows)
        files = write_scale_corpus(spec, out, log=lambda line: console.print(line))
    except ValueError as exc:
        fail(str(exc))
    size = sum(f.stat().st_size for f in files) / 1e6
    console.print(
        f"wrote {spec.questions:,} questions in {len(files)} shards ({size:,.0f} MB) to {out}"
    )


@data_app.command("check")
def data_check(
    path: Annotated[Path, typer.Argument(help="A log file or a directory of log files.")],
    params: ParamsOption = Path("params.yaml"),
    report_dir: Annotated[
        Path | None, typer.Option(help="Where to write the full validation report.")
    ] = None,
) -> None:
    """Validate QA logs with the raw-log gate and show what cleaning would drop, and why."""
    from qpr.config import load_settings
    from qpr.data.loaders import DataFormatError, clean_logs, read_logs
    from qpr.quality.data_gates import gate_raw_logs
    from qpr.quality.gate import GateFailed

    quality = load_settings(params).quality
    try:
        raw = read_logs(path)
        result = gate_raw_logs(raw, quality, report_dir)
    except (DataFormatError, GateFailed) as err:
        fail(str(err))
    _, drops = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    console.print(f"[green]gate passed[/] ({result.evaluated} expectations); {drops.summary()}")
    for reason, examples in drops.examples.items():
        # The examples are the file's own questions: escaped, never read as markup.
        console.print(f"  {reason}: e.g. {shown(', '.join(map(str, examples)))}")


@data_app.command("ensure")
def data_ensure(
    params: ParamsOption = Path("params.yaml"),
    dvc_file: Annotated[Path, typer.Option(help="The DVC file that pins data/.")] = Path(
        "data.dvc"
    ),
) -> None:
    """Make `data/` match what data.dvc pins, offline.

    Checks out from the DVC cache when it has the data, else regenerates the synthetic logs
    (byte-identical by construction) and caches them. Says so loudly when the result does
    not match the pinned hash (the generator or its parameters changed).
    """
    environment.apply()
    from qpr.data.versioning import ensure_data

    try:
        message = ensure_data(Path(params), dvc_file)
    except RuntimeError as err:
        fail(str(err))
    console.print(message)

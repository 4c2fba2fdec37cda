"""The `qpr` command: one sub-command per pipeline stage and per user task.

Stage commands run the stage's Prefect flow (which logs to MLflow), exactly as `dvc repro`
does; `qpr data ...` works on the raw data without Prefect or MLflow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import subprocess
import sys
import typing
from collections.abc import Callable
from datetime import date
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from qpr import environment

if TYPE_CHECKING:
    from qpr.retrieval.bundle import Hit

app = typer.Typer(
    name="qpr",
    help=(
        "Question paraphrase retrieval: map new, noisy questions onto the questions you "
        "already answer.\n\nThe pipeline (cluster → train → export → index → evaluate) is "
        "reproduced by `dvc repro`; each stage is also a sub-command here. Settings come "
        "from params.yaml."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
data_app = typer.Typer(
    help="Make, check and version the raw question-answer logs.", no_args_is_help=True
)
app.add_typer(data_app, name="data")
model_app = typer.Typer(
    help="The MLflow model registry: list versions, promote one to champion, roll back.",
    no_args_is_help=True,
)
app.add_typer(model_app, name="model")
console = Console()
errors = Console(stderr=True)

ParamsOption = Annotated[
    Path, typer.Option("--params", "-p", help="Parameter file (the pipeline's knobs).")
]


@app.callback()
def main(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Every framework's log lines too (as QPR_LOG_LEVEL=INFO does); quiet "
            "by default: the stages' progress, warnings and results.",
        ),
    ] = False,
) -> None:
    """Question paraphrase retrieval."""
    if verbose:
        environment.set_log_level("INFO")


def _fail(message: str) -> None:
    errors.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(1)


def _run_flow(module: str, *args: str) -> int:
    """Run `python -m module args` (a Prefect flow of flows/) in the project's environment;
    the library never imports flows/. Returns the exit code; the flow prints its errors."""
    environment.apply()
    return subprocess.run([sys.executable, "-m", module, *args], check=False).returncode


def _run_stage(stage: str, params: Path) -> dict:
    """Run one pipeline stage as its flow; its metrics, or exit 1 when it failed."""
    from qpr.paths import ProjectPaths

    if _run_flow("flows.stage", stage, "--params", str(params.resolve())) != 0:
        raise typer.Exit(1)
    paths = ProjectPaths(params.resolve().parent)
    return _with_timings(paths.stage_metrics(stage), paths.stage_timings(stage))


def _with_timings(metrics_file: Path, timings_file: Path) -> dict:
    """A stage's metrics with its wall-clock figures put back (they are kept apart, outside
    DVC, because they differ on every run)."""
    from qpr.io import join_timings

    metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
    if not timings_file.is_file():
        return metrics
    return join_timings(metrics, json.loads(timings_file.read_text(encoding="utf-8")))


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
            _fail(f"--day must be YYYY-MM-DD, got {day!r}")
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
        _fail(str(exc))
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
        _fail(str(err))
    _, drops = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    console.print(f"[green]gate passed[/] ({result.evaluated} expectations); {drops.summary()}")
    for reason, examples in drops.examples.items():
        console.print(f"  {reason}: e.g. {', '.join(examples)}")


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
        _fail(str(err))
    console.print(message)


NameOption = Annotated[
    str | None, typer.Option("--name", help="Registered model (default: registry.name in params).")
]
ActorOption = Annotated[
    str | None, typer.Option("--actor", help="Who does it, recorded as a tag (default: $USER).")
]


def _registry(params: Path, name: str | None) -> tuple[Any, str]:
    """The registry module and model name; the environment is set before MLflow loads."""
    environment.apply()
    from qpr.config import SettingsError, load_settings

    if name is None:
        try:
            name = load_settings(params).registry.name
        except SettingsError as err:
            _fail(str(err))
    from qpr.ops import registry

    return registry, name


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in a bare container
        return "unknown"


def _registry_call(call: Callable[[], Any]) -> Any:
    """Run a registry call; a RegistryError becomes one line on stderr and exit 1."""
    from qpr.ops.registry import RegistryError

    try:
        return call()
    except RegistryError as err:
        _fail(str(err))
        raise  # unreachable: _fail exits


@model_app.command("list")
def model_list(params: ParamsOption = Path("params.yaml"), name: NameOption = None) -> None:
    """Every registered version, newest first: aliases (champion, challenger,
    previous-champion), the validation measure it was judged by, when, the MLflow run, and
    its last promotion or rollback (who, why)."""
    registry, name = _registry(params, name)
    versions = _registry_call(lambda: registry.list_versions(name))
    if not versions:
        console.print(f"model {name!r} has no versions yet")
        return
    metrics = sorted({v.metric for v in versions if v.metric})
    table = Table(title=f"registered model {name!r}, judged by {' / '.join(metrics) or '-'}")
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("aliases", no_wrap=True)
    table.add_column("measure", justify="right", no_wrap=True)
    table.add_column("created (UTC)")
    table.add_column("run")
    table.add_column("last action")
    why = []
    for info in versions:
        history = registry.events(info)
        last = history[-1] if history else None
        if last:
            why.append(f"  v{info.version} {last['action']}: {last['reason']}")
        table.add_row(
            str(info.version),
            "\n".join(info.aliases) or "-",
            f"{info.value:.4f}" if info.value is not None else "-",
            info.created.strftime("%Y-%m-%d %H:%M"),
            (info.run_id or "-")[:8],
            f"{last['action']} by {last['actor']} {last['at'][:16].replace('T', ' ')}"
            if last
            else "-",
            style="bold green" if info.is_champion else None,
        )
    console.print(table)
    if why:
        console.print("why:\n" + "\n".join(why), highlight=False)


@model_app.command("promote")
def model_promote(
    version: Annotated[int, typer.Argument(help="The version to make champion.")],
    reason: Annotated[str, typer.Option(help="Why: recorded on the version.")] = (
        "promoted by hand"
    ),
    actor: ActorOption = None,
    params: ParamsOption = Path("params.yaml"),
    name: NameOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Promote a version the registry refuses (no committed mark, or trained on "
            "another data source than the champion); needs --reason, recorded as a tag.",
        ),
    ] = False,
) -> None:
    """Make VERSION the champion by hand (no margin check); the replaced champion becomes
    previous-champion, so `qpr model rollback` undoes this."""
    if force and reason == "promoted by hand":
        _fail("--force needs a --reason: it is recorded on the version")
    registry, name = _registry(params, name)
    who = _actor(actor)

    def run():
        before = registry.champion(name)
        return before, registry.promote(name, version, reason=reason, actor=who, force=force)

    before, after = _registry_call(run)
    if force:
        errors.print(f"forced by {who}: {reason}")
    if before is not None and before.version == after.version:
        console.print(f"[green]champion version {after.version} of {name!r} marked committed[/]")
        return
    was = f"; version {before.version} is previous-champion" if before else ""
    console.print(f"[green]version {after.version} of {name!r} is now champion[/]{was}")


@model_app.command("rollback")
def model_rollback(
    reason: Annotated[str, typer.Option(help="Why: recorded on both versions.")] = (
        "rolled back by hand"
    ),
    actor: ActorOption = None,
    params: ParamsOption = Path("params.yaml"),
    name: NameOption = None,
) -> None:
    """Move champion back to the version it replaced (previous-champion)."""
    registry, name = _registry(params, name)
    who = _actor(actor)

    def run():
        before = registry.champion(name)
        return before, registry.rollback(name, reason=reason, actor=who)

    before, after = _registry_call(run)
    console.print(
        f"[green]rolled back {name!r}: champion is version {after.version} again[/] "
        f"(was version {before.version})"
    )


@app.command("cluster")
def cluster(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 1: cluster questions (answers or duplicate pairs), filter incoherent clusters,
    split 80:10:10 by cluster, generate positive pairs. Gated; logged to MLflow."""
    metrics = _run_stage("cluster", params)
    _print_metrics({"cluster": metrics})


@app.command("train")
def train(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 2: build the vocabulary (top-V words + hashing trick) and train the CNN encoder
    with SDML (or triplet) loss; early stopping on validation ROC AUC, a checkpoint every
    epoch, resumes after a kill."""
    _print_metrics({"train": _run_stage("train", params)})


@app.command("export")
def export(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 3: export the encoder to ONNX; gate on torch-vs-ONNX parity and padding
    invariance."""
    _print_metrics({"export": _run_stage("export", params)})


index_app = typer.Typer(
    help="Stage 4 (no sub-command), or fresh questions into a served bundle without "
    "retraining: add, delete, drop, compact (docs/operations.md).",
)
app.add_typer(index_app, name="index")
ModelsOption = Annotated[Path, typer.Option("--models-dir", help="The bundle the deltas go into.")]
LocalOption = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Change the folder only: no `dvc commit`, no registry version (docs/operations.md).",
    ),
]


def _published(
    out: dict[str, Any], models_dir: Path, params: Path, local: bool, reason: str
) -> dict[str, Any]:
    """`out` with what `qpr.ops.fresh.publish` did (dvc.lock, registry), unless --local."""
    if local:
        return out
    environment.apply()
    from qpr.config import load_settings
    from qpr.ops.fresh import publish

    settings = load_settings(params)
    return out | {"published": publish(models_dir, settings, actor=_actor(None), reason=reason)}


@index_app.callback(invoke_without_command=True)
def index(ctx: typer.Context, params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 4: encode every known question with ONNX Runtime and build the FAISS index;
    gate on counts, finite vectors and self-retrieval."""
    if ctx.invoked_subcommand is None:
        _print_metrics({"index": _run_stage("index", params)})


@index_app.command("add")
def index_add(
    files: Annotated[list[Path], typer.Argument(help="Log files or question lists.")],
    models_dir: ModelsOption = Path("models"),
    params: ParamsOption = Path("params.yaml"),
    report_dir: Annotated[
        Path | None, typer.Option(help="Where the raw-log gate writes its report.")
    ] = None,
    local: LocalOption = False,
) -> None:
    """Make the files' new questions searchable now, as one delta beside the index: logs
    pass the raw-log gate first. A running service picks the delta up at its next poll."""
    from qpr.config import load_settings
    from qpr.data.loaders import DataFormatError
    from qpr.ops.fresh import add_files
    from qpr.quality.gate import GateFailed

    settings = load_settings(params)
    try:
        out = add_files(
            models_dir,
            files,
            settings.quality,
            report_dir=report_dir,
            batch_size=settings.index.encode_batch_size,
            threads=settings.index.threads,
        )
    except (DataFormatError, GateFailed, ValueError) as err:
        _fail(str(err))
    if out["delta"] is not None:
        reason = f"index add: delta {out['delta']['number']}, {out['added']} questions"
        out = _published(out, models_dir, params, local, reason)
    typer.echo(json.dumps(out, indent=2, default=str))


@index_app.command("delete")
def index_delete(
    question_id: Annotated[
        list[int] | None, typer.Option("--question-id", help="A question id (repeatable).")
    ] = None,
    ids_file: Annotated[
        Path | None, typer.Option("--ids-file", help="Question ids, one a line (or .npy).")
    ] = None,
    models_dir: ModelsOption = Path("models"),
    params: ParamsOption = Path("params.yaml"),
    local: LocalOption = False,
) -> None:
    """Stop serving questions: a tombstone each, applied at search time until compaction."""
    from qpr.ops.fresh import read_ids
    from qpr.retrieval.deltas import delete_questions

    ids = read_ids(question_id or [], ids_file)
    if not ids:
        _fail("give --question-id or --ids-file")
    out = delete_questions(models_dir, ids)
    if out["deleted"]:
        reason = f"index delete: {len(out['deleted'])} questions"
        out = _published(out, models_dir, params, local, reason)
    typer.echo(json.dumps(out))


@index_app.command("list")
def index_list(
    models_dir: ModelsOption = Path("models"),
    as_json: Annotated[bool, typer.Option("--json", help="The manifest as JSON.")] = False,
) -> None:
    """The bundle's deltas: number, version, questions, BM25 words unknown to the main
    index, and whether the main index already holds them (absorbed) or a load adds them."""
    from qpr.retrieval.deltas import DeltaError, absorbed_version, read_manifest

    try:
        manifest, absorbed = read_manifest(models_dir), absorbed_version(models_dir)
    except DeltaError as err:
        _fail(str(err))
    if as_json:
        typer.echo(json.dumps(manifest.as_dict() | {"absorbed_version": absorbed}, indent=2))
        return
    table = Table("delta", "version", "questions", "unknown BM25 words", "state", "sources")
    for delta in manifest.deltas:
        share = delta.get("unknown_tokens", 0) / max(delta.get("tokens", 0), 1)
        state = "absorbed" if int(delta["version"]) <= absorbed else "served as a delta"
        sources = ", ".join(s[:12] for s in delta.get("sources", [])) or "-"
        table.add_row(
            str(delta["number"]),
            str(delta["version"]),
            f"{delta['rows']:,}",
            f"{share:.1%}",
            state,
            sources,
        )
    for delta in manifest.dropped:
        table.add_row(
            str(delta["number"]),
            str(delta["version"]),
            f"{delta['rows']:,}",
            "",
            f"dropped: {delta.get('reason', '')}",
            "",
        )
    console.print(table)
    pending = sum(int(t[1]) > absorbed for t in manifest.tombstones)
    console.print(
        f"manifest version {manifest.version}; the main index holds version {absorbed}; "
        f"{pending} tombstones applied at search time"
    )


@index_app.command("drop")
def index_drop(
    number: Annotated[int, typer.Argument(help="The delta's number (deltas/deltas.json).")],
    reason: Annotated[str, typer.Option(help="Why: kept in the manifest.")] = "dropped by hand",
    models_dir: ModelsOption = Path("models"),
    params: ParamsOption = Path("params.yaml"),
    local: LocalOption = False,
) -> None:
    """Undo one delta: its questions go, the rows it replaced come back, and its files are
    never added again. A delta a full build or compaction absorbed cannot be dropped."""
    from qpr.retrieval.deltas import DeltaError, drop_delta

    try:
        out = drop_delta(models_dir, number, reason=reason)
    except DeltaError as err:
        _fail(str(err))
    out = _published(out, models_dir, params, local, f"index drop {number}: {reason}")
    typer.echo(json.dumps(out))


@index_app.command("compact")
def index_compact(
    models_dir: ModelsOption = Path("models"),
    params: ParamsOption = Path("params.yaml"),
    local: LocalOption = False,
) -> None:
    """Merge the deltas and tombstones into a new main index (index.factory of params),
    BM25 statistics recomputed over every question."""
    from qpr.config import load_settings
    from qpr.retrieval.deltas import compact
    from qpr.retrieval.dense import IndexConfig, build_index

    settings = load_settings(params)
    config = IndexConfig.from_settings(settings.index)
    out = compact(
        models_dir,
        lambda vectors: build_index(vectors, config, seed=settings.seed, log=lambda _: None),
        batch_size=settings.index.encode_batch_size,
        threads=settings.index.threads,
    )
    reason = f"index compact: {out['deltas_merged']} deltas merged"
    typer.echo(json.dumps(_published(out, models_dir, params, local, reason)))


class DataFormat(StrEnum):
    auto = "auto"
    quora = "quora"
    logs = "logs"


class EvaluateSplit(StrEnum):
    all = "all"
    test = "test"


def _grouped_options(options_type: type) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Let a command take many options as one frozen dataclass. Typer reads a command's
    options from its signature: the command's `options` parameter is shown to typer as the
    dataclass's fields (each annotated with its typer.Option), and the values typer parses
    are grouped back into one `options_type` for the command."""
    hints = typing.get_type_hints(options_type, include_extras=True)
    fields = dataclasses.fields(options_type)
    flat = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
        )
        for f in fields
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = inspect.signature(command, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "options"]

        @functools.wraps(command)
        def flattened(**values: Any) -> None:
            grouped = options_type(**{f.name: values.pop(f.name) for f in fields})
            return command(**values, options=grouped)

        parameters = [*kept, *flat]
        flattened.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        flattened.__annotations__ = {p.name: p.annotation for p in parameters}
        return flattened

    return decorate


_ANY_DATA = "Any data set (--data)"


@dataclasses.dataclass(frozen=True)
class EvaluateDataOptions:
    """`qpr evaluate`'s options for evaluating the bundle on any data set (--data), one
    field per option (see `_grouped_options`)."""

    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Evaluate the trained bundle on this Quora pairs file or QA-log file (or "
            "folder of log files) instead of running the stage. No retraining, no MLflow run.",
            rich_help_panel=_ANY_DATA,
        ),
    ] = None
    data_format: Annotated[
        DataFormat,
        typer.Option(
            "--format",
            help="quora: tab-separated id, qid1, qid2, question1, question2, is_duplicate. "
            "logs: CSV / JSON Lines / Parquet with timestamp, question, answer_id. auto: a "
            "folder or .csv/.jsonl/.json/.parquet is logs, a .tsv or a Quora header is quora.",
            rich_help_panel=_ANY_DATA,
        ),
    ] = DataFormat.auto
    models_dir: Annotated[
        Path,
        typer.Option(
            help="The trained model bundle (vocab.json, encoder.onnx, index/, search.json).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = Path("models")
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A registered model instead of --models-dir: models:/NAME@ALIAS (models:/NAME: "
            "its champion), downloaded as the service downloads it (MLFLOW_TRACKING_URI).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = None
    with_model_index: Annotated[
        bool,
        typer.Option(
            "--with-model-index",
            help="Also put the bundle's own indexed questions into the index, as distractors "
            "(never relevant; one whose normalised text is already in the file is not added "
            "twice).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = False
    split: Annotated[
        EvaluateSplit,
        typer.Option(
            help="all: every question of every cluster is a query. test: only the test "
            "split the cluster stage would cut from this file with these params (the same "
            "queries as the pipeline's evaluation when the bundle was trained on this file).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = EvaluateSplit.all
    k: Annotated[
        int | None,
        typer.Option(
            "--k",
            "-k",
            min=1,
            help="Results kept per query (default: evaluate.k in params).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = None
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for results.json, results.md and the gate reports (default: "
            "reports/evaluate_file/NAME: the data file's name, with -test and -model-index "
            "appended when those options are on).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = None
    baselines: Annotated[
        str,
        typer.Option(
            help="Comma-separated lexical baselines on the same queries and index: bm25, "
            "jaccard (default: none).",
            rich_help_panel=_ANY_DATA,
        ),
    ] = ""
    exact: Annotated[
        bool | None,
        typer.Option(
            "--exact/--approximate",
            help="The encoder-alone row's index. --exact: exhaustive (Flat) FAISS index, "
            "the encoder's own ranking. --approximate: index.factory with index.nprobe / "
            "index.ef_search from params. Default: exact up to 200,000 index questions. "
            "The served row always searches index.factory at the bundle's depth.",
            show_default=False,
            rich_help_panel=_ANY_DATA,
        ),
    ] = None

    # Each option's flag, as the error for options given without --data names it.
    FLAGS: typing.ClassVar[dict[str, str]] = {
        "data_format": "--format",
        "models_dir": "--models-dir",
        "model": "--model",
        "with_model_index": "--with-model-index",
        "split": "--split",
        "k": "--k",
        "out": "--out",
        "baselines": "--baselines",
        "exact": "--exact/--approximate",
    }

    def given(self) -> list[str]:
        """The flags of the --data options set to other than their defaults."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return [flag for name, flag in self.FLAGS.items() if getattr(self, name) != defaults[name]]

    def out_dir(self, data: Path) -> Path:
        """--out, or reports/evaluate_file/NAME (NAME: the data's, -test, -model-index)."""
        if self.out is not None:
            return self.out
        name = (data.stem if data.suffix else data.name) or "data"
        name += ("-test" if self.split == "test" else "") + (
            "-model-index" if self.with_model_index else ""
        )
        return Path("reports") / "evaluate_file" / name


@app.command("evaluate")
@_grouped_options(EvaluateDataOptions)
def evaluate(params: ParamsOption = Path("params.yaml"), *, options: EvaluateDataOptions) -> None:
    """Stage 5: TREC evaluation on the test split (success@1/@10, MRR, MAP, nDCG@10,
    recall@20) against the baselines; choose the no-answer threshold on validation.

    With **--data FILE**: evaluate the trained bundle (--models-dir, or a registered
    --model models:/NAME@ALIAS) on any Quora pairs file or QA-log file instead, without
    retraining. The file is clustered by the cluster stage's own code (logs: gates,
    cleaning, one cluster per answer, coherence filter; Quora: transitive closure of the
    duplicate pairs). Every question of a cluster of size >= 2 is a query, its relevant
    documents are the other questions of its cluster, it is excluded from its own
    results. Rows: **served** (the bundle's search as the service runs it over the
    file's questions: depth, BM25 fusion, re-ranker, no-answer threshold), **encoder
    alone** and **BM25 alone**, all over the file's questions (with --with-model-index
    the bundle's own questions join them as distractors). Writes results.json and
    results.md to --out; prints the table.
    """
    if options.data is None:
        given = options.given()
        if given:
            verb = "is" if len(given) == 1 else "are"
            _fail(f"{', '.join(given)} {verb} for --data FILE only; the stage takes --params only")
        metrics = _run_stage("evaluate", params)
        _print_results(metrics)
        return
    _evaluate_data(params, options.data, options)


def _evaluate_model(config: Any, settings: Any, model: str | None) -> Any:
    """evaluate_file on --models-dir, or on the --model registry reference downloaded to
    a temporary folder for the length of the evaluation."""
    from qpr.evaluation.on_file import evaluate_file

    def log(line: str) -> None:
        errors.print(line, markup=False, highlight=False, style="dim")

    if model is None:
        return evaluate_file(config, settings, log=log)
    if config.models_dir != Path("models"):
        _fail("--model and --models-dir name two bundles: give one of them")
    environment.apply()  # MLflow's tracking URI, before the registry is read
    from qpr.searcher import registry_bundle
    from qpr.serve.sources import SourceError

    with contextlib.ExitStack() as stack:
        try:
            folder = stack.enter_context(registry_bundle(model))
        except (ValueError, SourceError) as err:  # a malformed URI, no such model or alias
            _fail(f"--model {model}: {err}")
        log(f"{model}: downloaded to {folder}")
        return evaluate_file(dataclasses.replace(config, models_dir=folder), settings, log=log)


def _evaluate_data(params: Path, data: Path, options: EvaluateDataOptions) -> None:
    """`qpr evaluate --data`: the library call, its errors as one line, the table."""
    from qpr.config import SettingsError, load_settings
    from qpr.data.loaders import DataFormatError
    from qpr.evaluation.on_file import (
        REPORT_COLUMNS,
        SYSTEM_LABELS,
        EvaluateFileConfig,
        EvaluateFileError,
        write_report,
    )
    from qpr.quality.gate import GateFailed
    from qpr.retrieval.bundle import BundleError

    out = options.out_dir(data)
    config = EvaluateFileConfig(
        data=data,
        gate_reports=out / "gates",
        models_dir=options.models_dir,
        fmt=options.data_format.value,  # type: ignore[arg-type]
        split=options.split.value,  # type: ignore[arg-type]
        k=options.k,
        with_model_index=options.with_model_index,
        baselines=options.baselines.split(","),
        exact=options.exact,
        source=options.model,
    )
    try:
        settings = load_settings(params)
        result = _evaluate_model(config, settings, options.model)
    except (EvaluateFileError, DataFormatError, GateFailed, BundleError, SettingsError) as err:
        _fail(str(err))
        return
    summary = result.summary
    json_path, md_path = write_report(summary, out)
    counts = summary["counts"]
    index = summary["index"]
    table = Table(
        title=f"{data} ({summary['format']}, split {summary['split']}): "
        f"{counts['queries']:,} queries, {counts['clusters']:,} clusters, index "
        f"{counts['index_size']:,} questions ({index['factory']}), top {summary['k']}"
    )
    columns = {key: label for key, label in REPORT_COLUMNS.items() if key != "system"}
    table.add_column("system")
    for label in columns.values():
        table.add_column(label, justify="right")
    for name, values in summary["systems"].items():
        cells = [values.get(m) for m in columns]
        table.add_row(
            SYSTEM_LABELS.get(name, name),
            *(
                "-" if v is None else f"{v:.4f}" if m != "p50_ms" else f"{v:.2f}"
                for m, v in zip(columns, cells, strict=True)
            ),
        )
    console.print(table)
    console.print(
        f"P@N = success@N (a paraphrase among the first N). {summary['seconds']['total']:.1f} s; "
        f"wrote {json_path} and {md_path}",
        highlight=False,
    )


@app.command("pipeline")
def pipeline(
    force: Annotated[bool, typer.Option(help="Rerun every stage, changed or not.")] = False,
) -> None:
    """Run every stage that changed, in order (`dvc repro`), then print the metrics."""
    environment.apply()
    command = ["dvc", "repro", *(["--force"] if force else [])]
    code = subprocess.call(command)
    if code != 0:
        _fail(f"`{' '.join(command)}` failed (exit {code}); see the stage output above")
    metrics()


@app.command("retrain")
def retrain(
    params: ParamsOption = Path("params.yaml"),
    recover_only: Annotated[
        bool,
        typer.Option(help="Only roll back (or finish) a crashed retraining run, then stop."),
    ] = False,
) -> None:
    """Run one retraining cycle now: new log files in retrain.incoming are validated (a bad
    one is quarantined with its report), merged into data/ without duplicates, versioned
    (dvc add), and `dvc repro` retrains; the register stage promotes the new model only if
    it is better. Safe to rerun: nothing new, nothing changes. Scheduled: `python -m
    flows.retrain --serve` or the prefect.yaml deployment (README). Exit codes: 0 done,
    1 failed (rolled back), 3 every new file was quarantined (docs/operations.md)."""
    args = ["--params", str(params.resolve())] + (["--recover-only"] if recover_only else [])
    code = _run_flow("flows.retrain", *args)
    if code != 0:
        raise typer.Exit(code)


@app.command("ui")
def ui(
    prefect_port: Annotated[int, typer.Option(help="Port of the Prefect UI.")] = (
        environment.PREFECT_UI_PORT
    ),
    mlflow_port: Annotated[int, typer.Option(help="Port of the MLflow UI.")] = (
        environment.MLFLOW_UI_PORT
    ),
) -> None:
    """See the runs: the Prefect UI (the flow runs of `make run` and `qpr retrain`) and the
    MLflow UI (runs, metrics, artifacts, registered models) over this project's records,
    both on 127.0.0.1; Ctrl-C stops both. In team mode (PREFECT_API_URL,
    MLFLOW_TRACKING_URI naming servers) it prints the shared servers' addresses."""
    import os

    from qpr.ui import serve, ui_servers

    environment.apply()
    servers = ui_servers(
        environment.project_root(), os.environ, prefect_port=prefect_port, mlflow_port=mlflow_port
    )
    raise typer.Exit(serve(servers, log=console.print))


@app.command("search")
def search(
    question: Annotated[str, typer.Argument(help="The question to find paraphrases of.")],
    k: Annotated[int, typer.Option("-k", help="How many paraphrases to return.")] = 10,
    models_dir: Annotated[Path, typer.Option(help="The model bundle the pipeline built.")] = Path(
        "models"
    ),
    threshold: Annotated[
        float | None,
        typer.Option(help="No-answer distance threshold (default: the one chosen on val)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Show each hit's score parts: dense and BM25 shares, matched words, alpha.",
        ),
    ] = False,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="Search only questions whose metadata match: FIELD=VALUE, or "
            "FIELD=V1,V2 for any of several; repeat for more fields (all must match).",
        ),
    ] = None,
) -> None:
    """Find the known questions that ask the same thing, nearest first, with their answer
    id and L2 distance. "answered" says whether the best match is within the model's
    no-answer threshold."""
    from qpr.retrieval.bundle import Bundle, BundleError

    try:
        wanted = parse_filters(filters or [])
        bundle = Bundle.load(models_dir)
        result = bundle.search(question, k=k, threshold=threshold, explain=explain, filters=wanted)
    except (BundleError, ValueError) as err:
        _fail(str(err))
    if as_json:
        # Hit.as_dict: the same field names as the service and the MLflow pyfunc.
        hits = [h.as_dict() for h in result.hits]
        console.print_json(
            json.dumps({"query": result.query, "answered": result.answered, "hits": hits})
        )
        return
    console.print(_hits_table(question, result.hits, explain))
    limit = bundle.threshold if threshold is None else threshold
    verdict = "[green]answered[/]" if result.answered else "[yellow]no answer[/]"
    console.print(f"{verdict} (threshold {limit if limit is not None else 'none'})")


def parse_filters(options: list[str]) -> dict[str, str | list[str]]:
    """``["locale=en", "tenant=a,b"]`` → ``{"locale": "en", "tenant": ["a", "b"]}``;
    ValueError for an option without ``=`` or a field given twice."""
    out: dict[str, str | list[str]] = {}
    for option in options:
        field, sep, value = option.partition("=")
        field = field.strip()
        if not sep or not field:
            raise ValueError(f"--filter {option!r}: expected FIELD=VALUE or FIELD=V1,V2")
        if field in out:
            raise ValueError(f"--filter {field} given twice: list its values once, {field}=V1,V2")
        values = [v.strip() for v in value.split(",")]
        out[field] = values[0] if len(values) == 1 else values
    return out


def _hits_table(question: str, hits: list[Hit], explain: bool) -> Table:
    """The hits as `qpr search` prints them; with explain, the parts of each score."""
    table = Table(title=f"paraphrases of: {question!r}")
    columns = ["#", "question", "answer", "distance", "score"]
    if explain:
        columns += ["dense", "bm25", "matched", "alpha"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("question", "matched") else "right")
    for rank, hit in enumerate(hits, 1):
        cells = [str(rank), hit.text, str(hit.answer_id), f"{hit.distance:.4f}", f"{hit.score:.3f}"]
        if explain and hit.explain is not None:
            part = hit.explain
            bm25 = (
                "-"
                if part.bm25_score is None
                else f"{part.bm25_score:.2f} ({part.bm25_scaled:.2f})"
            )
            cells += [
                f"{part.dense_scaled:.3f}",
                bm25,
                " ".join(part.matched_words),
                f"{part.dense_weight:.2f}",
            ]
        table.add_row(*cells)
    return table


@app.command("serve")
def serve(
    models_dir: Annotated[
        Path | None,
        typer.Option(help="Serve this local bundle, reloaded when its files change."),
    ] = None,
    registry_name: Annotated[
        str | None,
        typer.Option(help="Serve this MLflow registered model at --alias instead."),
    ] = None,
    alias: Annotated[str | None, typer.Option(help="Registry alias (default: champion).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    threads: Annotated[
        int | None, typer.Option(help="ONNX Runtime intra-op threads (default 1).")
    ] = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve a non-loopback --host without an API key (QPR_SERVE_AUTH=off).",
        ),
    ] = False,
) -> None:
    """Run the search service (POST /search, /search/batch; GET /healthz, /readyz,
    /version, /metrics). It polls its model source and swaps in a new model once it passed
    its checks. Off loopback it needs an API key (QPR_SERVE_API_KEY_FILE). Limits and other
    knobs: QPR_SERVE_* variables (docs/serving.md)."""
    import logging

    from qpr.serve.auth import check_exposure
    from qpr.serve.settings import ServeSettings, SettingsError

    if models_dir is not None and registry_name is not None:
        _fail("give --models-dir or --registry-name, not both")
    environment.apply()  # MLflow's local default store, as the pipeline uses
    try:
        settings = ServeSettings.from_env(
            threads=threads,
            alias=alias,
            registry_name=registry_name,
            models_dir=None if models_dir is None else str(models_dir),
        )
        if models_dir is not None:
            settings = settings.replace(registry_name=None)  # the option beats the variable
        settings = check_exposure(settings, host, insecure_no_auth=insecure_no_auth)
    except SettingsError as err:
        _fail(str(err))
    import uvicorn

    from qpr.serve.app import create_app
    from qpr.serve.connections import uvicorn_options

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings=settings),
        host=host,
        port=port,
        access_log=settings.access_log,
        log_level="info",
        **uvicorn_options(settings),
    )


def _print_results(metrics: dict) -> None:
    """The evaluation table: the model against each baseline, test split."""
    from qpr.evaluation.trec import MEASURE_LABELS as shown

    table = Table(
        title=f"test split, {metrics.get('num_queries', 0):,.0f} queries "
        "(P@N = success@N: a paraphrase among the first N)"
    )
    table.add_column("system")
    for label in shown.values():
        table.add_column(label, justify="right")
    fusion = metrics.get("fusion")
    rows = {"model": metrics, **metrics.get("baselines", {})}
    if fusion:
        rows = {"model": metrics, "dense": fusion["dense_test"], **metrics.get("baselines", {})}
    for name, values in rows.items():
        table.add_row(name, *(f"{values.get(m, float('nan')):.4f}" for m in shown))
    console.print(table)
    if fusion:
        weight = fusion["dense_weight"]
        what = {
            1.0: "ranked by embedding distance alone"
            + (" (over both retrievers' candidates)" if fusion.get("served") else ""),
            0.0: "BM25 alone",
        }.get(weight, "both fused")
        console.print(
            f"model = dense (the encoder) and BM25 fused at α {weight:g}, chosen on "
            f"validation: {what}"
        )
        served = fusion.get("served")
        if served:
            probing = "".join(
                f"at {knob} {served[knob]}, "
                for knob in ("nprobe", "ef_search")
                if served.get(knob) is not None
            )
            console.print(
                f"served: BM25's {fusion['candidates']} and the index's "
                f"{fusion['dense_candidates']} candidates scored exactly, {probing}recall@k "
                f"{served['recall']:.4f} against an exact dense search"
                + ("" if served["reached"] else f" (BELOW the target {served['target']})")
            )
        lexical = fusion.get("lexical")
        if lexical:
            from qpr.retrieval.bm25 import describe_bm25

            console.print(
                f"lexical = the bundle's BM25 alone ({describe_bm25(lexical)}); bm25 = plain "
                "BM25 (bm25s, words as written)"
            )
    chosen = metrics.get("threshold", {})
    if chosen:
        # Rounded for people: metrics.json keeps the full figures.
        console.print(
            f"no-answer threshold {_rounded(chosen.get('value'), '.4f')} (target P@1 "
            f"{chosen.get('target_precision')}): answers "
            f"{_rounded(chosen.get('test_answered_share'), '.1%')} of test queries at P@1 "
            f"{_rounded(chosen.get('test_precision_at_1'), '.4f')}, and "
            f"{_rounded(chosen.get('test_false_answer_rate'), '.1%')} of those with no paraphrase"
        )
        for warning in chosen.get("warnings") or []:
            console.print(f"[bold red]WARNING[/]: no-answer threshold: {warning}")


def _rounded(value: object, spec: str) -> str:
    """A number as people read it ("-" when absent, as is when not a number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return "-" if value is None else str(value)


def _format_value(value: object) -> str:
    """Metrics files hold numbers, but also strings (a reason) and nulls (no champion yet)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return str(value) if value is not None else "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value, default=str)


def _print_metrics(groups: dict[str, dict]) -> None:
    for name, values in groups.items():
        table = Table(title=name, show_header=True, header_style="bold")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in sorted(values.items()):
            table.add_row(key, _format_value(value))
        console.print(table)


@app.command("metrics")
def metrics(
    metrics_dir: Annotated[Path, typer.Option(help="Where stages write metrics.")] = Path(
        "metrics"
    ),
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="Only the evaluation table and the registry's decision (what `make run` "
            "prints after the run).",
        ),
    ] = False,
) -> None:
    """Print every stage's metrics with its timings, and the evaluation table."""
    from qpr.artifacts import METRICS_FILE, stage_metrics_file

    files = sorted(metrics_dir.glob("*.json"))
    evaluation = metrics_dir.parent / METRICS_FILE
    if not files and not evaluation.is_file():
        _fail(f"no metrics in {metrics_dir}/ yet: run `dvc repro` (or `make run`) first")
    if summary and evaluation.is_file():
        _print_results(json.loads(evaluation.read_text(encoding="utf-8")))
        register = metrics_dir / stage_metrics_file("register")
        if register.is_file():
            decision = json.loads(register.read_text(encoding="utf-8"))
            console.print(f"registry: version {decision.get('version')}: {decision.get('reason')}")
        console.print("every stage's metrics and timings: `qpr metrics` (make metrics)")
        return
    stages = {
        file.stem: _with_timings(file, metrics_dir / "timings" / file.name)
        for file in files
        if not (file.stem == "evaluate" and evaluation.is_file())  # the table below shows it
    }
    _print_metrics(stages)
    if evaluation.is_file():
        _print_results(json.loads(evaluation.read_text(encoding="utf-8")))


if __name__ == "__main__":
    app()

"""`qpr evaluate`: stage 7 without a file; with FILE, the trained bundle evaluated on any
Quora pairs file or QA-log file (`qpr.evaluation.on_file`), without retraining and without
an MLflow run. The argument says which one runs: the stage takes --params only, and
FILE's options are refused without a FILE."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from qpr import environment
from qpr.cli.common import ParamsOption, console, errors, fail
from qpr.cli.stages import evaluate_stage


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


_FILE_PANEL = "Evaluating a FILE"


@dataclasses.dataclass(frozen=True)
class FileOptions:
    """`qpr evaluate FILE`'s options, one field per option (see `_grouped_options`)."""

    data_format: Annotated[
        DataFormat,
        typer.Option(
            "--format",
            help="quora: tab-separated id, qid1, qid2, question1, question2, is_duplicate. "
            "logs: CSV / JSON Lines / Parquet with timestamp, question, answer_id. auto: a "
            "folder or .csv/.jsonl/.json/.parquet is logs, a .tsv or a Quora header is quora.",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = DataFormat.auto
    models_dir: Annotated[
        Path,
        typer.Option(
            help="The trained model bundle (vocab.json, encoder.onnx, index/, search.json).",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = Path("models")
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A registered model instead of --models-dir: models:/NAME@ALIAS (models:/NAME: "
            "its champion), downloaded as the service downloads it (MLFLOW_TRACKING_URI).",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = None
    with_model_index: Annotated[
        bool,
        typer.Option(
            "--with-model-index",
            help="Also put the bundle's own indexed questions into the index, as distractors "
            "(never relevant; one whose normalised text is already in the file is not added "
            "twice).",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = False
    split: Annotated[
        EvaluateSplit,
        typer.Option(
            help="all: every question of every cluster is a query. test: only the test "
            "split the cluster stage would cut from this file with these params (the same "
            "queries as the pipeline's evaluation when the bundle was trained on this file).",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = EvaluateSplit.all
    k: Annotated[
        int | None,
        typer.Option(
            "--k",
            "-k",
            min=1,
            help="Results kept per query (default: evaluate.k in params).",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = None
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for results.json, results.md and the gate reports (default: "
            "reports/evaluate_file/NAME: the data file's name, with -test and -model-index "
            "appended when those options are on).",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = None
    baselines: Annotated[
        str,
        typer.Option(
            help="Comma-separated lexical baselines on the same queries and index: bm25, "
            "jaccard (default: none).",
            rich_help_panel=_FILE_PANEL,
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
            rich_help_panel=_FILE_PANEL,
        ),
    ] = None
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="Choose a no-answer threshold for this file: on half its clusters, by the "
            "evaluate stage's rule (evaluate.target_precision, max_false_answer_rate), "
            "checked on the other half beside the bundle's own threshold.",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = False
    save_calibrated: Annotated[
        Path | None,
        typer.Option(
            help="A new folder: the bundle copied there with the calibrated threshold, to "
            "serve (qpr serve --models-dir). Implies --calibrate.",
            rich_help_panel=_FILE_PANEL,
        ),
    ] = None

    # Each option's flag, as the error for options given without FILE names it.
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
        "calibrate": "--calibrate",
        "save_calibrated": "--save-calibrated",
    }

    def given(self) -> list[str]:
        """The flags of the options set to other than their defaults."""
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


FileArgument = Annotated[
    Path | None,
    typer.Argument(
        help="A Quora pairs file or QA-log file (or folder of log files): evaluate the "
        "trained bundle on it instead of running the stage. No retraining, no MLflow run.",
        metavar="FILE",
        show_default=False,
    ),
]
# The file's old spelling, before it became the argument: still read, said once.
DataOption = Annotated[Path | None, typer.Option("--data", hidden=True)]


@_grouped_options(FileOptions)
def evaluate(
    file: FileArgument = None,
    params: ParamsOption = Path("params.yaml"),
    data: DataOption = None,
    *,
    options: FileOptions,
) -> None:
    """Stage 7 without FILE: TREC evaluation on the test split (success@1/@10, MRR, MAP,
    nDCG@10, recall@20) against the baselines; choose the no-answer threshold on
    validation. With FILE: the trained bundle on that file, without retraining.

    qpr evaluate FILE evaluates the trained bundle (--models-dir, or a registered
    --model models:/NAME@ALIAS) on any Quora pairs file or QA-log file. The file is
    clustered by the cluster stage's own code (logs: gates, cleaning, one cluster per
    answer, coherence filter; Quora: transitive closure of the duplicate pairs). Every
    question of a cluster of size >= 2 is a query, its relevant documents are the other
    questions of its cluster, it is excluded from its own results. Rows: "served" (the
    bundle's search as the service runs it over the file's questions: depth, BM25 fusion,
    re-ranker, no-answer threshold), "encoder alone" and "BM25 alone", all over the
    file's questions (with --with-model-index the bundle's own questions join them as
    distractors). Writes results.json and results.md to --out; prints the table. Every
    option but --params is for FILE only.
    """
    if data is not None:
        if file is not None:
            fail("give the file once: FILE or --data, not both")
        errors.print("--data is deprecated: give the file as an argument, qpr evaluate FILE")
        file = data
    if file is None:
        given = options.given()
        if given:
            verb = "is" if len(given) == 1 else "are"
            flags = ", ".join(given)
            fail(f"{flags} {verb} for qpr evaluate FILE only; the stage takes --params only")
        evaluate_stage(params)
        return
    _evaluate_file(params, file, options)


def _evaluate_model(config: Any, settings: Any, model: str | None) -> Any:
    """evaluate_file on --models-dir, or on the --model registry reference downloaded to
    a temporary folder for the length of the evaluation."""
    from qpr.evaluation.on_file import evaluate_file

    def log(line: str) -> None:
        errors.print(line, markup=False, highlight=False, style="dim")

    if model is None:
        return evaluate_file(config, settings, log=log)
    if config.models_dir != Path("models"):
        fail("--model and --models-dir name two bundles: give one of them")
    environment.apply()  # MLflow's tracking URI, before the registry is read
    from qpr.searcher import registry_bundle
    from qpr.serve.sources import SourceError

    with contextlib.ExitStack() as stack:
        try:
            folder = stack.enter_context(registry_bundle(model))
        except (ValueError, SourceError) as err:  # a malformed URI, no such model or alias
            fail(f"--model {model}: {err}")
        log(f"{model}: downloaded to {folder}")
        return evaluate_file(dataclasses.replace(config, models_dir=folder), settings, log=log)


def _evaluate_file(params: Path, data: Path, options: FileOptions) -> None:
    """`qpr evaluate FILE`: the library call, its errors as one line, the table."""
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
        calibrate=options.calibrate,
        save_calibrated=options.save_calibrated,
    )
    try:
        settings = load_settings(params)
        result = _evaluate_model(config, settings, options.model)
    except (EvaluateFileError, DataFormatError, GateFailed, BundleError, SettingsError) as err:
        fail(str(err))
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
    if summary.get("calibration") is not None:
        threshold = summary["no_answer"]["threshold"]
        console.print(calibration_lines(summary["calibration"], threshold), highlight=False)
    console.print(
        f"P@N = success@N (a paraphrase among the first N). {summary['seconds']['total']:.1f} s; "
        f"wrote {json_path} and {md_path}",
        highlight=False,
    )


def calibration_lines(calibration: dict[str, Any], bundle_threshold: float | None) -> str:
    """What --calibrate chose and how both thresholds do on the check half, as lines
    under 80 characters."""

    def threshold(value: float | None) -> str:
        return "none" if value is None else f"{value:.4f}"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    chose = calibration["calibration"]
    mine = calibration["check"]["calibrated"]
    lines = [
        f"calibrated threshold {threshold(calibration['threshold'])} (rule "
        f"{calibration['rule']}), chosen on {chose['clusters']:,} clusters",
        f"checked on the other {chose['check_clusters']:,} clusters ({mine['answerable']:,} "
        f"queries, {mine['unanswerable']:,} with no paraphrase):",
    ]
    for name, value in (("bundle's", bundle_threshold), ("calibrated", calibration["threshold"])):
        check = calibration["check"]["bundle" if name == "bundle's" else "calibrated"]
        lines.append(
            f"  {name} {threshold(value)}: answered {share(check['answered_share'])}, "
            f"P@1 {share(check['precision_at_1'])}, false answers "
            f"{share(check['false_answer_rate'])}"
        )
    return "\n".join(lines)

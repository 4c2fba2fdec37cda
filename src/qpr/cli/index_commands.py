"""`qpr index`: without a sub-command, stage 4 (the full build); with one, fresh questions
into a served bundle without retraining (add, delete, list, drop, compact).

The one module of the command that imports the deltas' code (`qpr.deltas.format`,
`qpr.deltas.add`, `qpr.deltas.publish`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from qpr import environment
from qpr.cli.common import (
    ParamsOption,
    actor_name,
    console,
    fail,
    print_metrics,
    run_stage,
    shown,
)
from qpr.cli.terminal import command_group
from qpr.ids import id_text, id_texts

index_app = command_group(
    help="Stage 4 without a sub-command: the full build, as `dvc repro` runs it. With one: "
    "fresh questions into a served bundle without retraining: add, delete, list, drop, "
    "compact (docs/operations.md).",
)
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
    """`out` with what `qpr.deltas.publish.publish` did (dvc.lock, registry), unless --local."""
    if local:
        return out
    environment.apply()
    from qpr.config import load_settings
    from qpr.deltas.publish import publish

    settings = load_settings(params)
    return out | {"published": publish(models_dir, settings, actor=actor_name(None), reason=reason)}


@index_app.callback(invoke_without_command=True)
def index(ctx: typer.Context, params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 4: encode every known question with ONNX Runtime and build the FAISS index;
    gate on counts, finite vectors and self-retrieval."""
    if ctx.invoked_subcommand is None:
        print_metrics({"index": run_stage("index", params)})
    elif getattr(ctx.get_parameter_source("params"), "name", None) != "DEFAULT":
        # `qpr index --params P add ...` would otherwise add with params.yaml, silently.
        fail(
            f"--params before {ctx.invoked_subcommand!r} is the stage's option: give it "
            f"after the sub-command (qpr index {ctx.invoked_subcommand} --params ...)"
        )


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
    pass the raw-log gate first. A running service picks the delta up at its next poll.
    Refused, nothing written, while a delta fails its check (`qpr index list` shows it)."""
    from qpr.config import load_settings
    from qpr.data.loaders import DataFormatError
    from qpr.deltas.add import add_files
    from qpr.deltas.lock import WriterBusy
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
    except (DataFormatError, GateFailed, ValueError, WriterBusy) as err:
        fail(str(err))
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
    from qpr.deltas.add import delete_questions, read_ids
    from qpr.deltas.format import DeltaError
    from qpr.deltas.lock import WriterBusy

    try:
        ids = read_ids(question_id or [], ids_file)
    except (OSError, ValueError) as err:
        fail(f"--ids-file {ids_file}: {err}")
    if not ids:
        fail("give --question-id or --ids-file")
    try:
        out = delete_questions(models_dir, ids)
    except (DeltaError, WriterBusy) as err:
        fail(str(err))
    if out["deleted"]:
        reason = f"index delete: {len(out['deleted'])} questions"
        out = _published(out, models_dir, params, local, reason)
    # The ids as the service writes them: decimal strings (qpr.ids).
    out |= {key: id_texts(out[key]) for key in ("deleted", "unknown")}
    typer.echo(json.dumps(out))


@index_app.command("list")
def index_list(
    models_dir: ModelsOption = Path("models"),
    as_json: Annotated[bool, typer.Option("--json", help="The manifest as JSON.")] = False,
) -> None:
    """The bundle's deltas: number, version, questions, BM25 words unknown to the main
    index, and their state: absorbed (the main index holds them), served as a delta, or
    failed (its check, as a load makes it: a load leaves it out; `qpr index drop N`)."""
    from qpr.deltas.format import DeltaError, absorbed_version, check_deltas, read_manifest

    try:
        manifest, absorbed = read_manifest(models_dir), absorbed_version(models_dir)
        failed = check_deltas(models_dir)
    except DeltaError as err:
        fail(str(err))

    def state(delta: dict[str, Any]) -> str:
        if int(delta["number"]) in failed:
            return f"failed: {failed[int(delta['number'])]}"
        return "absorbed" if int(delta["version"]) <= absorbed else "served as a delta"

    if as_json:
        out = manifest.as_dict() | {"absorbed_version": absorbed}
        out["deltas"] = [{**delta, "state": state(delta)} for delta in manifest.deltas]
        # [question_id, version]: the id as the service writes it, a decimal string (qpr.ids).
        out["tombstones"] = [[id_text(q), v] for q, v in manifest.tombstones]
        typer.echo(json.dumps(out, indent=2))
        return
    table = Table("delta", "version", "questions", "unknown BM25 words", "state", "sources")
    for delta in manifest.deltas:
        share = delta.get("unknown_tokens", 0) / max(delta.get("tokens", 0), 1)
        sources = ", ".join(s[:12] for s in delta.get("sources", [])) or "-"
        table.add_row(
            str(delta["number"]),
            str(delta["version"]),
            f"{delta['rows']:,}",
            f"{share:.1%}",
            shown(state(delta)),
            sources,
        )
    for delta in manifest.dropped:
        table.add_row(
            str(delta["number"]),
            str(delta["version"]),
            f"{delta['rows']:,}",
            "",
            shown(f"dropped: {delta.get('reason', '')}"),
            "",
        )
    console.print(table)
    pending = sum(int(t[1]) > absorbed for t in manifest.tombstones)
    console.print(
        f"manifest version {manifest.version}; the main index holds version {absorbed}; "
        f"{pending} tombstones applied at search time"
    )
    if failed:
        numbers = sorted(failed)
        drops = " and ".join(f"`qpr index drop {n}`" for n in numbers)
        said = (
            f"delta {numbers[0]} fails its check and is not served: {drops} removes it"
            if len(numbers) == 1
            else f"deltas {', '.join(map(str, numbers))} fail their check and are not "
            f"served: {drops} remove them"
        )
        console.print(shown(said), style="bold red")


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
    from qpr.deltas.add import drop_delta
    from qpr.deltas.format import DeltaError
    from qpr.deltas.lock import WriterBusy

    try:
        out = drop_delta(models_dir, number, reason=reason)
    except (DeltaError, WriterBusy) as err:
        fail(str(err))
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
    from qpr.deltas.add import compact
    from qpr.deltas.format import DeltaError
    from qpr.deltas.lock import WriterBusy
    from qpr.retrieval.dense import IndexConfig, build_index

    settings = load_settings(params)
    config = IndexConfig.from_settings(settings.index)
    try:
        out = compact(
            models_dir,
            lambda vectors: build_index(vectors, config, seed=settings.seed, log=lambda _: None),
            batch_size=settings.index.encode_batch_size,
            threads=settings.index.threads,
        )
    except (DeltaError, WriterBusy) as err:
        fail(str(err))
    reason = f"index compact: {out['deltas_merged']} deltas merged"
    typer.echo(json.dumps(_published(out, models_dir, params, local, reason)))

"""`qpr model ...`: the MLflow model registry by hand: list the versions, promote one to
champion, roll back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from qpr import environment
from qpr.cli.common import ParamsOption, actor_name, console, errors, fail
from qpr.cli.terminal import command_group

model_app = command_group(
    help="The MLflow model registry: list versions, promote one to champion, roll back.",
    no_args_is_help=True,
)

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
            fail(str(err))
    from qpr.ops import registry

    return registry, name


def _registry_call(call: Callable[[], Any]) -> Any:
    """Run a registry call; a RegistryError becomes one line on stderr and exit 1."""
    from qpr.ops.registry import RegistryError

    try:
        return call()
    except RegistryError as err:
        fail(str(err))


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
        fail("--force needs a --reason: it is recorded on the version")
    registry, name = _registry(params, name)
    who = actor_name(actor)

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
    who = actor_name(actor)

    def run():
        before = registry.champion(name)
        return before, registry.rollback(name, reason=reason, actor=who)

    before, after = _registry_call(run)
    console.print(
        f"[green]rolled back {name!r}: champion is version {after.version} again[/] "
        f"(was version {before.version})"
    )

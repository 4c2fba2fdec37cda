"""`qpr search` and `qpr serve`: the trained bundle answering questions, once from the
command line or as the HTTP service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from qpr import environment
from qpr.cli.common import console, fail, shown

if TYPE_CHECKING:
    from qpr.retrieval.bundle import Hit


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
    id and L2 distance (smaller is closer). "answered" says whether the best match is within
    the model's no-answer threshold. --explain adds each hit's rank score and its parts."""
    from qpr.retrieval.bundle import Bundle, BundleError

    try:
        wanted = parse_filters(filters or [])
        bundle = Bundle.load(models_dir)
        result = bundle.search(question, k=k, threshold=threshold, explain=explain, filters=wanted)
    except (BundleError, ValueError) as err:
        fail(str(err))
    if as_json:
        # Hit.as_dict: the same field names as the service and the MLflow pyfunc, and the
        # same ids as decimal strings (qpr.ids).
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
    """The hits as `qpr search` prints them; with explain, each rank score and its parts.

    The rank score is left out otherwise: fused with BM25 it is scaled within the query's
    candidates, so the top hit of any question, gibberish included, scores about 1. The
    distance (against the threshold) says how close a match is."""
    # Questions come from people and indexed files: shown escaped, never read as markup.
    table = Table(title=f"paraphrases of: {shown(repr(question))}")
    columns = ["#", "question", "answer", "distance"]
    if explain:
        columns += ["rank score", "dense", "bm25", "matched", "alpha"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("question", "matched") else "right")
    for rank, hit in enumerate(hits, 1):
        cells = [
            str(rank),
            shown(hit.text),
            shown(hit.answer_id),
            f"{hit.distance:.4f}",
        ]
        if explain:
            cells.append(f"{hit.score:.3f}")
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
                shown(" ".join(part.matched_words)),
                f"{part.dense_weight:.2f}",
            ]
        table.add_row(*cells)
    return table


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
    """Run the search service (POST /search, /search/batch, /feedback; GET /healthz, /readyz,
    /version, /metrics). It polls its model source and swaps in a new model once it passed
    its checks. Off loopback it needs an API key (QPR_SERVE_API_KEY_FILE). Limits and other
    knobs: QPR_SERVE_* variables (docs/serving.md)."""
    import logging

    from qpr.serve.auth import check_exposure
    from qpr.serve.settings import ServeSettings, SettingsError

    if models_dir is not None and registry_name is not None:
        fail("give --models-dir or --registry-name, not both")
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
        fail(str(err))
    from qpr.serve import connections
    from qpr.serve.app import create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    connections.serve(
        create_app(settings=settings),
        host=host,
        port=port,
        access_log=settings.access_log,
        log_level="info",
        settings=settings,
    )

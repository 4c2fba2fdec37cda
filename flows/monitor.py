"""Watching the service: one Prefect flow run = one monitoring report (qpr.monitor).

    read the query log since the last report (query_log; the position is kept in
    monitor.state_dir) → load the served bundle (monitor.model) and a seeded sample of
    the training questions (data.*) → qpr.monitor.report.measure → report.json,
    report.html and report.png in monitor.reports/<time> → one MLflow run (metrics, the
    report as artifacts) → <query log>/monitor.json, shown on the service's /metrics →
    an alarm: one WARNING line per measure, and with monitor.retrain_on_alarm a
    retraining cycle (`python -m flows.retrain`) at once.

With fewer than monitor.min_questions new questions, the report measures the service
alone and the position stays, so the next run reads these questions again with more.

    python -m flows.monitor            # one report now (what `qpr monitor` runs)
    python -m flows.monitor --serve    # a local runner on monitor.cron (hourly)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow
from prefect.logging import get_run_logger

from flows import tracking
from flows.lifetime import flow_program
from flows.schedule import serve_on_cron
from flows.stage import run_cli, settings_and_paths
from qpr.config import Settings
from qpr.io import write_json_atomic
from qpr.ops.layout import utc_stamp
from qpr.ops.processes import tool_env

POSITION_FILE = "position.json"


def _under(root: Path, path: Path | str) -> Path:
    return path if Path(path).is_absolute() else root / path  # type: ignore[return-value]


def _since(state_dir: Path) -> pd.Timestamp | None:
    """The last question's time the previous report counted; None before the first."""
    try:
        return pd.Timestamp(json.loads((state_dir / POSITION_FILE).read_text())["last"])
    except (OSError, ValueError, KeyError):
        return None


def _window(folder: Path, since: pd.Timestamp | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The query and feedback lines after `since` (all of them before the first report)."""
    from qpr.querylog import read_feedback, read_queries

    queries, feedback = read_queries(folder, since=since), read_feedback(folder, since=since)
    if since is not None:
        queries = queries[queries["timestamp_utc"] > since]
        feedback = feedback[feedback["timestamp_utc"] > since]
    return queries.sort_values("timestamp_utc", kind="stable"), feedback


def _model(settings: Settings, root: Path):
    from qpr.searcher import REGISTRY_SCHEME, Searcher

    source = settings.monitor.model
    return Searcher.load(source if source.startswith(REGISTRY_SCHEME) else _under(root, source))


def _write(report: dict[str, Any], out: Path) -> dict[str, Path]:
    from qpr.monitor.render import write_html, write_plot

    out.mkdir(parents=True, exist_ok=True)
    files = {"json": write_json_atomic(out / "report.json", report)}
    files["png"] = write_plot(report, out / "report.png")
    files["html"] = write_html(report, files["png"], out / "report.html")
    return files


def _metrics(report: dict[str, Any]) -> dict[str, float]:
    values = {
        f"monitor.{name}": float(m["value"])
        for name, m in report["measures"].items()
        if isinstance(m["value"], int | float)
    }
    values["monitor.questions"] = float(report["service"]["questions"])
    values["monitor.alarms"] = float(len(report["alarms"]))
    return values


def _retrain(params: Path) -> int:
    """A retraining cycle now, in its own process (its lock, journal and exit codes)."""
    command = [sys.executable, "-m", "flows.retrain", "--params", str(params)]
    return subprocess.run(command, env=tool_env(), check=False).returncode


@flow(name="monitor", log_prints=True)
def monitor_flow(params: str | None = None) -> dict[str, Any]:
    """One report; returns it (with where its files are and what an alarm started)."""
    from qpr.data.ingest import source_questions
    from qpr.monitor.report import measure, reference_sample
    from qpr.monitor.status import status_of, write_status

    logger = get_run_logger()
    settings, paths = settings_and_paths(params)
    cfg, root = settings.monitor, paths.root
    folder, state_dir = _under(root, settings.query_log), _under(root, cfg.state_dir)
    since = _since(state_dir)
    queries, feedback = _window(folder, since)
    print(f"read {len(queries):,} questions and {len(feedback):,} verdicts from {folder}")
    searcher = _model(settings, root)
    reference = reference_sample(
        source_questions(settings), searcher.bundle, cfg.reference_questions, settings.seed
    )
    report = measure(queries, feedback, searcher.bundle, reference, cfg, seed=settings.seed)
    report["model"] = {"source": cfg.model, "fingerprint": searcher.bundle.fingerprint}
    out = _under(root, cfg.reports) / utc_stamp()
    files = _write(report, out)
    write_status(folder, status_of(report, time.time()))
    with tracking.stage_run("monitor", settings, root=root):
        tracking.log_metrics(_metrics(report))
        tracking.log_artifacts({"monitor": out})
    for name in report["alarms"]:
        m = report["measures"][name]
        logger.warning(
            "ALARM %s: %.3g against a threshold of %.3g", name, m["value"], m["threshold"]
        )
    if report["drift_measured"] and len(queries):
        last = queries["timestamp_utc"].max().isoformat()
        write_json_atomic(state_dir / POSITION_FILE, {"last": last})
    else:
        print(f"drift waits for {report['waiting_for']} more questions; the position stays")
    report["files"] = {kind: str(path) for kind, path in files.items()}
    if report["alarms"] and cfg.retrain_on_alarm:
        print("an alarm starts a retraining cycle (monitor.retrain_on_alarm)")
        report["retrain_exit_code"] = _retrain(paths.params)
    print(f"alarms: {', '.join(report['alarms']) or 'none'}; report: {files['html']}")
    return report


def serve(params: str | None = None) -> None:
    """Run monitor_flow on monitor.cron in this process (a local Prefect runner); the
    deployment is named monitor-local. Stop with Ctrl-C."""
    settings, paths = settings_and_paths(params)
    cfg = settings.monitor
    serve_on_cron(
        monitor_flow, "monitor-local", cron=cfg.cron, timezone=cfg.timezone, params=paths.params
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.monitor", description=__doc__)
    parser.add_argument("--params", help="params file (default: the project's params.yaml)")
    parser.add_argument("--serve", action="store_true", help="run on monitor.cron until stopped")
    args = parser.parse_args(argv)
    if args.serve:  # a schedule needs a real server: none is started here
        run_cli(serve, args.params)
        return
    with flow_program():  # its temporary Prefect server dies with it
        report = run_cli(monitor_flow, params=args.params)
    raise SystemExit(3 if report["alarms"] else 0)


if __name__ == "__main__":
    main()

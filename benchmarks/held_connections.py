#!/usr/bin/env python
"""Held connections under a low open-files limit: `qpr serve` with ``ulimit -n 256``.

    python benchmarks/held_connections.py                  # writes docs/results/
    python benchmarks/held_connections.py --before e0f10ab   # and the code at a commit
    python benchmarks/held_connections.py --quick --out /tmp/held     # smoke run, ~1 min

The server runs under an open-files limit of ``--fd-limit`` (256), soft and hard, as
``ulimit -n 256`` sets it: the service cannot raise it, so its connection cap is the
limit minus `qpr.serve.connections.FD_RESERVE`. Against it, in one run:

1. idle: normal POST /search traffic, first over 4 keep-alive connections, then one
   request per new connection (2 at a time);
2. held: the same traffic while a second process holds ``--held`` (1,000) connections
   that each sent a head and part of a body, reopening each one the server closes
   (`reliability.py`'s holder).

Recorded: failed normal requests (timeout 5 s), p50/p99 of each kind held against idle
as a ratio, the accept() failures for lack of descriptors in the server log (EMFILE,
"Too many open files"; the log throttle's window is set to 1 s so that its counts of
suppressed records reach the log, and they are added), the server's most
open descriptors (sampled from /proc every 50 ms), the machine and its load average.
Targets: 0 failed, no EMFILE, keep-alive p99 held within 2x of idle.

``--before REV`` runs the same first against this repository's ``src/`` at a git
revision (the code before a change), so that both lie in one file, measured on one
machine minutes apart.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script: its own folder is on sys.path.
from reliability import (
    CLIENT_TIMEOUT,
    NORMAL_CONNECTIONS,
    get,
    normal_traffic,
    percentiles_ms,
    questions,
    raise_fd_limit,
    read_response,
    say,
    search_request,
)
from reliability import machine as describe_machine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results"
NAME = "held_connections"
FRESH_WORKERS = 2
EMFILE_TEXT = re.compile(r"Too many open files|EMFILE|out of system resource")
SUPPRESSED = re.compile(r"suppressed (\d+) similar")
# A log record's first line: "2026-11-27 15:39:50,123 ERROR asyncio: ..." or uvicorn's
# "INFO:     ..."; its message and traceback lines follow.
RECORD_START = re.compile(r"^(?=\d{4}-\d\d-\d\d |[A-Z]+: )", re.MULTILINE)


class LimitedServer:
    """`qpr serve` from `src` in a subprocess whose open-files limit is `fd_limit`, hard
    and soft; its log goes to a file."""

    def __init__(self, models: Path, src: Path, log_path: Path, fd_limit: int) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.log_path = log_path
        env = {
            **os.environ,
            "QPR_SERVE_POLL_SECONDS": "0",
            "QPR_SERVE_ACCESS_LOG": "false",
            # The log throttle's window: each second's suppressed count reaches the log.
            "QPR_SERVE_LOG_INTERVAL": "1",
            "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(models)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]

        def ulimit() -> None:  # `ulimit -n`: the server cannot raise it back
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        self._log = open(log_path, "wb")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=src.parent,
            preexec_fn=ulimit,
        )
        deadline = time.monotonic() + 300
        while get(self.port, "/readyz")[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server not ready: {log_path.read_text()[-2000:]}")
            time.sleep(0.25)

    def open_fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.process.pid}/fd"))
        except OSError:
            return -1

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


async def fresh_traffic(port: int, texts: list[str], seconds: float) -> dict[str, Any]:
    """One request per new connection, `FRESH_WORKERS` at a time."""
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    stop = time.monotonic() + seconds

    async def one(raw: bytes) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(raw)
            status, _, _ = await read_response(reader)
            return status
        finally:
            writer.close()

    async def worker(index: int) -> None:
        i = index
        while time.monotonic() < stop:
            i += FRESH_WORKERS
            t0 = time.perf_counter()
            try:
                raw = search_request(texts[i % len(texts)])
                status = await asyncio.wait_for(one(raw), CLIENT_TIMEOUT)
            except TimeoutError:
                outcomes["timeout"] += 1
                continue
            except (OSError, asyncio.IncompleteReadError, ValueError):
                outcomes["closed unanswered"] += 1
                continue
            if status == 200:
                latencies.append(time.perf_counter() - t0)
                outcomes["ok"] += 1
            else:
                outcomes[f"status {status}"] += 1

    await asyncio.gather(*(worker(i) for i in range(FRESH_WORKERS)))
    return {
        "requests": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        **percentiles_ms(latencies),
    }


def emfile_count(log_text: str) -> int:
    """accept() failures for lack of descriptors: the log records that name one, and the
    throttle's counts of those it suppressed (noted at the end of the next record)."""
    count = 0
    for record in RECORD_START.split(log_text):
        if EMFILE_TEXT.search(record):
            count += 1 + sum(int(n) for n in SUPPRESSED.findall(record))
    return count


def phase(server: LimitedServer, texts: list[str], seconds: float) -> dict[str, Any]:
    """Keep-alive, then fresh-connection traffic, sampling the server's descriptors."""
    peak = [server.open_fds()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak.append(server.open_fds())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        keep_alive = asyncio.run(normal_traffic(server.port, texts, seconds))
        fresh = asyncio.run(fresh_traffic(server.port, texts, seconds / 2))
    finally:
        done.set()
        sampler.join()
    return {"keep_alive": keep_alive, "fresh": fresh, "peak_open_fds": max(peak)}


def scenario(models: Path, src: Path, log_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Idle, then held, against one server; all of it in one run."""
    started = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()]
    server = LimitedServer(models, src, log_path, args.fd_limit)
    texts = questions(models)
    try:
        asyncio.run(normal_traffic(server.port, texts, 3))  # warm-up, not counted
        say(f"idle: {args.phase_seconds} s keep-alive, {args.phase_seconds / 2} s fresh")
        idle = phase(server, texts, args.phase_seconds)
        say(f"held: {args.held} connections")
        holder = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "reliability.py"),
                "_hold",
                str(server.port),
                str(args.held),
                str(args.phase_seconds * 1.5 + args.settle_seconds + 5),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(args.settle_seconds)  # let them all connect
        held = phase(server, texts, args.phase_seconds)
        out, _ = holder.communicate(timeout=300)
        counts = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        held["holder_opened"] = counts[-1]["opened"] if counts else None
        held["holder_closed_by_server"] = counts[-1]["closed"] if counts else None
        ready_after = get(server.port, "/readyz")[0]
    finally:
        server.stop()
    log_text = server.log_path.read_text(errors="replace")
    cap = re.search(r"at most (\d+) connections", log_text)
    failed = {
        kind: sum(v for k, v in held[kind]["outcomes"].items() if k != "ok")
        for kind in ("keep_alive", "fresh")
    }
    return {
        "src": str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else "src",
        "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "connection_cap": int(cap.group(1)) if cap else None,
        "idle": idle,
        "held": held,
        "failed_held": failed,
        "p50_ratio": {k: _ratio(held[k]["p50"], idle[k]["p50"]) for k in failed},
        "p99_ratio": {k: _ratio(held[k]["p99"], idle[k]["p99"]) for k in failed},
        "emfile_in_log": emfile_count(log_text),
        "server_log_bytes": len(log_text.encode()),
        "ready_after": ready_after,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def _ratio(held: float, idle: float) -> float | None:
    return round(held / idle, 2) if idle and idle == idle and held == held else None


def _commit(root: Path, rev: str = "HEAD") -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", rev], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def export_src(rev: str, work: Path) -> tuple[Path, str]:
    """This repository's src/ at `rev`, written under `work`; and the full commit."""
    commit = _commit(ROOT, f"{rev}^{{commit}}")
    if commit is None:
        raise SystemExit(f"--before: no commit {rev!r} in {ROOT}")
    target = work / "before"
    target.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src", commit


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def targets(run: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    failed = sum(run["failed_held"].values())
    ratio = run["p99_ratio"]["keep_alive"]
    return [
        ("normal requests failed or timed out while held", "0", str(failed), failed == 0),
        ("EMFILE in the server log", "0", str(run["emfile_in_log"]), run["emfile_in_log"] == 0),
        ("p99 held / p99 idle (keep-alive)", "<= 2", str(ratio), ratio is not None and ratio <= 2),
    ]


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    args = report["settings"]
    lines = [
        "# Held connections under `ulimit -n " + str(args["fd_limit"]) + "`",
        "",
        f"Measured by `benchmarks/held_connections.py` at commit {str(m.get('git_commit'))[:12]}"
        f"{' (dirty tree)' if m.get('dirty') else ''}.",
        "",
        f"**Machine**: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB, "
        f"{m['platform']}, Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + ". Server, normal client and holder share these cores.",
        "",
        f"The server's open-files limit is {args['fd_limit']}, soft and hard. Normal traffic: "
        f"{NORMAL_CONNECTIONS} keep-alive connections for {args['phase_seconds']} s, then one "
        f"request per new connection ({FRESH_WORKERS} at a time) for "
        f"{args['phase_seconds'] / 2} s; client timeout {CLIENT_TIMEOUT} s. Held: "
        f"{args['held']:,} connections that sent a head and part of a body, each reopened "
        "when the server closes it.",
    ]
    for label, run in report["runs"].items():
        lines += [
            "",
            f"## {label}",
            "",
            f"_`{run['src']}` at commit {str(run['git_commit'])[:12]}, measured "
            f"{run['measured_at']} in {run['wall_seconds']} s; load average before "
            f"{run['load_average_before']}, after {run['load_average_after']}._",
            "",
            "| target | bound | measured | met |",
            "|---|---|---|---|",
        ]
        for what, bound, got, met in targets(run):
            lines.append(f"| {what} | {bound} | {got} | {'yes' if met else 'NO'} |")
        lines += [
            "",
            "| traffic | phase | requests | outcomes | p50 ms | p99 ms | max ms |",
            "|---|---|---:|---|---:|---:|---:|",
        ]
        for kind in ("keep_alive", "fresh"):
            for name in ("idle", "held"):
                r = run[name][kind]
                lines.append(
                    f"| {kind.replace('_', '-')} | {name} | {r['requests']:,} | {r['outcomes']} | "
                    f"{r['p50']} | {r['p99']} | {r.get('max', 'n/a')} |"
                )
        held = run["held"]
        lines += [
            "",
            f"- Held / idle: keep-alive p50 {run['p50_ratio']['keep_alive']}x, p99 "
            f"{run['p99_ratio']['keep_alive']}x; fresh connections p50 "
            f"{run['p50_ratio']['fresh']}x, p99 {run['p99_ratio']['fresh']}x.",
            f"- Connection cap {run['connection_cap']}; most descriptors open: "
            f"{run['idle']['peak_open_fds']} idle, {held['peak_open_fds']} held.",
            f"- The holder opened {held['holder_opened']:,} connections; the server closed "
            f"{held['holder_closed_by_server']:,} (evicted for a newcomer, or timed out).",
            f"- Server log: {run['server_log_bytes']:,} bytes, {run['emfile_in_log']:,} EMFILE; "
            f"/readyz afterwards {run['ready_after']}.",
        ]
    return "\n".join(lines) + "\n"


def write(out: Path, report: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from qpr.io import write_json_atomic, write_text_atomic

    write_json_atomic(out / f"{NAME}.json", report)
    write_text_atomic(out / f"{NAME}.md", render(report))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="bundle to serve")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--fd-limit", type=int, default=256)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--phase-seconds", type=float, default=15.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--before", help="a git revision whose src/ runs first")
    parser.add_argument("--quick", action="store_true", help="300 held, 6 s phases")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.held, args.phase_seconds, args.settle_seconds = 300, 6.0, 3.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        write(args.out, json.loads((args.out / f"{NAME}.json").read_text()))
        return 0
    raise_fd_limit(4096)  # the client side: the normal client, and the holder it starts
    report: dict[str, Any] = {
        "machine": describe_machine(),
        "settings": {
            k: getattr(args, k) for k in ("fd_limit", "held", "phase_seconds", "settle_seconds")
        },
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="qpr-held-") as tmp:
        work = Path(tmp)
        sources = [("this tree", ROOT / "src", _commit(ROOT))]
        if args.before:
            sources.insert(0, (f"before ({args.before})", *export_src(args.before, work)))
        ignore = shutil.ignore_patterns(".*")
        models = Path(shutil.copytree(args.models.resolve(), work / "models", ignore=ignore))
        for label, src, commit in sources:
            say(f"{label}: {src}")
            log_path = work / f"server-{len(report['runs'])}.log"
            report["runs"][label] = {**scenario(models, src, log_path, args), "git_commit": commit}
            write(args.out, report)
    for label, run in report["runs"].items():
        for what, bound, got, met in targets(run):
            say(f"{label}: {'ok ' if met else 'MISSED'} {what}: {got} (bound {bound})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

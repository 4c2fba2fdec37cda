#!/usr/bin/env python
"""The search service's memory over hot swaps: does RSS grow without bound?

    python benchmarks/swap_memory.py                       # models/, 20 swaps
    python benchmarks/swap_memory.py --models /path/to/models --swaps 20 --out /tmp/mem
    python benchmarks/swap_memory.py --name swap_memory_before   # another results file

One `qpr serve` subprocess serves a symlink flipped between two copies of the bundle
(their search configs differ, so their fingerprints do) while ``--clients`` threads keep
searching. After each swap is seen on /version, the clients search on for
``--settle`` seconds, then the server's VmRSS, RssAnon and RssFile are read from
/proc/<pid>/status. Written: docs/results/<name>.json and .md (name: swap_memory).

The verdict compares the last ten swaps: a bounded service levels off (the old bundle is
freed once its last request drops it); a leak keeps one bundle's worth growing per swap.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Run as a script (python benchmarks/x.py): its own folder is on sys.path.
from machine_info import describe

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results"
NAME = "swap_memory"
SEED = 39


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM of a process, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        headers = {"content-type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        result = response.status, response.read()
        conn.close()
        return result
    except OSError:
        return 0, b""


def two_bundles(models: Path, work: Path) -> tuple[Path, Path]:
    """Copies of the bundle that differ in their search config (so in fingerprint)."""
    first = Path(shutil.copytree(models, work / "bundle-a", ignore=shutil.ignore_patterns(".*")))
    second = Path(shutil.copytree(first, work / "bundle-b"))
    config = json.loads((second / "search.json").read_text())
    config["threshold"] = float(config.get("threshold") or 1.0) * 1.001
    (second / "search.json").write_text(json.dumps(config, indent=2))
    return first, second


def questions(models: Path, n: int = 200) -> list[str]:
    import pyarrow.parquet as pq

    column = pq.read_table(models / "index" / "questions.parquet", columns=["text"])
    texts = column.column("text").to_pylist()
    return random.Random(SEED).sample(texts, min(n, len(texts)))


class Clients:
    """Threads that search over keep-alive connections until stopped."""

    def __init__(self, port: int, texts: list[str], count: int) -> None:
        self.port, self.texts = port, texts
        self.stop = threading.Event()
        self.ok = self.failed = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def _run(self, index: int) -> None:
        rng = random.Random(SEED + index)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self.stop.is_set():
            body = json.dumps({"question": rng.choice(self.texts)}).encode()
            try:
                conn.request("POST", "/search", body, {"content-type": "application/json"})
                response = conn.getresponse()
                response.read()
                good = response.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                good = False
            with self._lock:
                if good:
                    self.ok += 1
                else:
                    self.failed += 1
        conn.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def fingerprint(port: int) -> str | None:
    status, body = call(port, "GET", "/version")
    model = json.loads(body)["model"] if status == 200 else None
    return None if model is None else model["fingerprint"]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    first, second = two_bundles(args.models, work)
    link = work / "current"
    link.symlink_to(first)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {
        **os.environ,
        "QPR_SERVE_POLL_SECONDS": "0.5",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(link)]
    log = (work / "server.log").open("wb")
    server = subprocess.Popen(
        [*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
    )
    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 300
        while call(port, "GET", "/readyz")[0] != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((work / "server.log").read_text()[-2000:])
            time.sleep(0.25)
        clients = Clients(port, questions(args.models), args.clients)
        try:
            time.sleep(args.settle)
            samples.append({"swap": 0, "seconds": 0.0, **memory_kib(server.pid)})
            started = time.monotonic()
            for n in range(1, args.swaps + 1):
                before = fingerprint(port)
                staged = link.with_name(".flip")
                staged.unlink(missing_ok=True)
                staged.symlink_to(second if n % 2 else first)
                os.replace(staged, link)
                limit = time.monotonic() + 60
                while fingerprint(port) == before:
                    if time.monotonic() > limit:
                        raise RuntimeError(f"swap {n} not seen within 60 s")
                    time.sleep(0.1)
                time.sleep(args.settle)
                sample = memory_kib(server.pid)
                samples.append(
                    {"swap": n, "seconds": round(time.monotonic() - started, 1), **sample}
                )
                say(f"swap {n}: VmRSS {sample['VmRSS'] / 1024:.0f} MiB")
        finally:
            clients.close()
        status, body = call(port, "GET", "/version")
        reload = json.loads(body)["reload"] if status == 200 else None
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    return {
        "samples": samples,
        "requests_ok": clients.ok,
        "requests_failed": clients.failed,
        "reloader": reload,
        "bundle_mib": round(
            sum(p.stat().st_size for p in first.rglob("*") if p.is_file()) / 2**20, 1
        ),
    }


def verdict(samples: list[dict[str, Any]]) -> dict[str, Any]:
    rss = [s["VmRSS"] / 1024 for s in samples]
    last = rss[-10:]
    per_swap = (last[-1] - last[0]) / (len(last) - 1) if len(last) > 1 else 0.0
    return {
        "rss_start_mib": round(rss[0], 1),
        "rss_after_first_swap_mib": round(rss[1], 1) if len(rss) > 1 else None,
        "rss_end_mib": round(rss[-1], 1),
        "rss_max_mib": round(max(rss), 1),
        "last_ten_spread_mib": round(max(last) - min(last), 1),
        "last_ten_median_mib": round(statistics.median(last), 1),
        "mib_per_swap_over_last_ten": round(per_swap, 2),
    }


def render(report: dict[str, Any]) -> str:
    m, v, r = report["machine"], report["verdict"], report["run"]
    lines = [
        "# Service memory over hot swaps",
        "",
        f"`benchmarks/swap_memory.py`, {report['swaps']} swaps of a {r['bundle_mib']} MiB "
        f"bundle (two copies, different search configs), {report['clients']} clients "
        f"searching throughout; RSS read {report['settle']} s after each swap was seen.",
        "",
        f"Machine: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB; "
        f"load average before the run {m['load_average']}; commit {m['git_commit']}"
        f"{' (dirty)' if m['dirty'] else ''}; {report['when']}.",
        "",
        f"- RSS: {v['rss_start_mib']} MiB before the first swap, "
        f"{v['rss_after_first_swap_mib']} MiB after it, {v['rss_end_mib']} MiB after the "
        f"last (max {v['rss_max_mib']} MiB).",
        f"- Last ten swaps: spread {v['last_ten_spread_mib']} MiB, "
        f"{v['mib_per_swap_over_last_ten']} MiB a swap.",
        f"- Requests: {r['requests_ok']:,} answered, {r['requests_failed']} failed.",
        "",
        "| swap | s | VmRSS MiB | RssAnon MiB | RssFile MiB |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in r["samples"]:
        lines.append(
            f"| {s['swap']} | {s['seconds']} | {s['VmRSS'] / 1024:.1f} | "
            f"{s['RssAnon'] / 1024:.1f} | {s['RssFile'] / 1024:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after each swap")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default=NAME, help="results file stem")
    args = parser.parse_args()
    import fastapi
    import uvicorn

    machine = describe(
        ROOT,
        {"fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__},
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    with tempfile.TemporaryDirectory(prefix="qpr-swap-memory-") as tmp:
        result = run(args, Path(tmp))
    report = {
        "machine": machine,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "swaps": args.swaps,
        "clients": args.clients,
        "settle": args.settle,
        "run": result,
        "verdict": verdict(result["samples"]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(render(report))
    say(f"wrote {args.out / args.name}.json and .md: {report['verdict']}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Hand-written code against the library that could do its job, measured side by side.

    python benchmarks/library_choices.py                 # the three cases, ~2-3 min on 2 cores
    python benchmarks/library_choices.py --only bm25     # one case (metrics, settings, bm25);
                                                         # the others' last results are kept
    python benchmarks/library_choices.py --quick         # smoke run, ~1 min, writes
                                                         # reports/benchmarks/

Issue 24 asks for "a library where one does the job as well": measure side by side, keep
hand-written code only where it wins. The cases:

1. metrics: the service's Prometheus metrics, hand-written (`qpr/serve/metrics.py` as it
   was at --hand-commit, read from git, driven the way the old `_Telemetry` of
   `serve/app.py` drove it) against `prometheus_client` with one `CollectorRegistry` per
   app (`qpr.serve.metrics.Telemetry`). Per request: one counter increment and one
   histogram observation, as the service's middleware does, over a fixed mix of 1,000
   requests; per scrape: the /metrics text with the model gauges refreshed. Blocks
   alternate between the two; medians of the blocks. Both texts are parsed back
   (`prometheus_client.parser`) and compared family by family.
2. settings: `qpr.serve.settings.ServeSettings` (QPR_SERVE_* parsed by hand) against the
   idiomatic pydantic-settings class written below (`PydanticServeSettings`, errors turned
   into `qpr.config.SettingsError` naming the variable): the outcome of every variable
   with valid, padded, empty, blank, zero, negative, malformed and lenient values, and
   the size of each (lines of code, docstrings and comments left out).
3. bm25: our BM25 + MaxScore (`qpr.retrieval.bm25`, numba kernel in
   `qpr.retrieval.maxscore`) against bm25s with its numba backend, same words (our
   `tokenize`, params.yaml's stemmer, k1, b), on every distinct question of the Quora copy
   (../shared/data/quora, only read). Queries: sampled questions with one word dropped.
   Single question from its text: p50/p99 at k 10 and at k 100 (the service's BM25
   candidates); the top 10 compared. Concurrent: BM25 on a worker thread while the
   calling thread encodes the question (the service's fused path, `HybridSearch.rank`),
   and BM25 latency while another thread encodes questions without a pause; encoders:
   ONNX Runtime (1 thread) on a randomly initialised CNN of the paper's size, the folded
   CNN (numba; the service's default) and a busy numpy loop of small operations (which
   holds the GIL). Last, `maxscore.top_k` (grouped arguments) against its compiled
   kernel called with its arrays one by one: the wrapper's cost.

Noise: the machine is shared, so every measurement alternates the two sides in blocks
and the tables show medians of the blocks with their range. Outputs:
docs/results/library_choices.{json,md} (--quick: reports/benchmarks/).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime as dt
import importlib.metadata
import inspect
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tokenize as pytokenize
import types
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe
from paper_cnn import ENCODER_KW, HASH_BINS, MAX_LEN, MAX_WORDS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUORA = ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
DEFAULT_OUT = ROOT / "docs" / "results"
QUICK_OUT = ROOT / "reports" / "benchmarks"
NAME = "library_choices"
# The last commit whose serve/metrics.py is the hand-written registry.
HAND_METRICS_COMMIT = "62fd3f9"
SEED = 24
CASES = ("metrics", "settings", "bm25")


@dataclass(frozen=True)
class Plan:
    repeats: int  # alternating blocks per measurement
    metric_calls: int  # requests observed per block
    scrapes: int  # /metrics renders per block
    queries: int  # BM25 questions per block
    concurrent_queries: int  # questions per concurrent block


FULL = Plan(repeats=7, metric_calls=20_000, scrapes=300, queries=2000, concurrent_queries=600)
QUICK = Plan(repeats=3, metric_calls=5_000, scrapes=50, queries=300, concurrent_queries=150)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summary(values: Sequence[float], digits: int = 4) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def alternate(
    sides: dict[str, Callable[[], Any]], repeats: int, label: str
) -> dict[str, list[Any]]:
    """Each side's result per block, blocks alternating (who goes first swaps each time)."""
    names = list(sides)
    out: dict[str, list[Any]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(sides[name]())
        say(f"{label}: block {r + 1}/{repeats}")
    return out


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def code_lines(source: str) -> int:
    """Lines holding code: blank lines, comments and docstrings left out."""
    lines: set[int] = set()
    previous = pytokenize.NEWLINE
    for tok in pytokenize.generate_tokens(io.StringIO(source).readline):
        kind = tok.type
        if kind == pytokenize.STRING and previous in (pytokenize.NEWLINE, pytokenize.INDENT):
            previous = kind  # a docstring (or a bare string statement)
            continue
        if kind not in (
            pytokenize.COMMENT,
            pytokenize.NL,
            pytokenize.NEWLINE,
            pytokenize.INDENT,
            pytokenize.DEDENT,
            pytokenize.ENDMARKER,
        ):
            lines.update(range(tok.start[0], tok.end[0] + 1))
        if kind not in (pytokenize.COMMENT, pytokenize.NL):
            previous = kind
    return len(lines)


# ======================================================================================
# 1. metrics
# ======================================================================================


def git_source(commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def hand_telemetry_source(commit: str) -> str:
    """The old `_Telemetry` class of serve/app.py: the hand-written side's metric families."""
    source = git_source(commit, "src/qpr/serve/app.py")
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "_Telemetry":
            return ast.get_source_segment(source, node) or ""
    return ""


def hand_metrics_module(commit: str) -> types.ModuleType:
    """serve/metrics.py as it was at `commit` (stdlib only), as a module of its own."""
    source = git_source(commit, "src/qpr/serve/metrics.py")
    module = types.ModuleType("hand_metrics")
    module.__dict__["__source__"] = source
    exec(compile(source, f"{commit}:src/qpr/serve/metrics.py", "exec"), module.__dict__)
    return module


class HandTelemetry:
    """The old `serve/app.py::_Telemetry`: the same families, calls and refresh hook."""

    def __init__(self, hand: types.ModuleType) -> None:
        self.registry = registry = hand.Registry()
        self.requests = registry.counter(
            "qpr_http_requests_total",
            "HTTP requests by endpoint, method and status code.",
            ("endpoint", "method", "status"),
        )
        self.latency = registry.histogram(
            "qpr_http_request_duration_seconds",
            "Time from request start to the end of the response, by endpoint.",
            ("endpoint",),
        )
        self.questions = registry.counter(
            "qpr_questions_total",
            "Questions searched, by whether the top hit was within the no-answer threshold.",
            ("answered",),
        )
        self.model_info = registry.gauge(
            "qpr_model_info",
            "The serving model (value 1); labels say which.",
            ("name", "version", "alias", "fingerprint"),
        )
        self.model_loaded = registry.gauge(
            "qpr_model_loaded_timestamp_seconds", "When the serving model was loaded."
        )
        self.model_questions = registry.gauge(
            "qpr_model_index_questions", "Questions in the serving model's index."
        )
        self.ready = registry.gauge("qpr_ready", "1 when a model serves, else 0.")
        self.reloads = registry.counter(
            "qpr_model_reloads_total",
            "Reload attempts by outcome (swapped, refused, error).",
            ("outcome",),
        )
        self.served: Any = None
        registry.on_collect(lambda: self.refresh_model(self.served))

    def observe(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.inc(endpoint, method, str(status))
        self.latency.observe(seconds, endpoint)

    def refresh_model(self, served: Any) -> None:
        if served is None:
            self.model_info.replace([])
            self.ready.set(0)
            return
        info = served.info
        self.model_info.replace(
            [((info.name, info.version or "", info.alias or "", info.fingerprint), 1.0)]
        )
        self.model_loaded.set(info.loaded_at)
        self.model_questions.set(info.questions)
        self.ready.set(1)

    def render(self) -> bytes:
        return self.registry.render().encode("utf-8")


def request_mix(n: int, rng: np.random.Generator) -> list[tuple[str, str, int, float]]:
    """n requests as the service sees them: mostly searches, some refused, probes, scrapes,
    the odd unknown path; latencies around a millisecond with a long tail."""
    kinds = [
        ("/search", "POST", 200),
        ("/search", "POST", 422),
        ("/search/batch", "POST", 200),
        ("/healthz", "GET", 200),
        ("/readyz", "GET", 200),
        ("/metrics", "GET", 200),
        ("other", "GET", 404),
    ]
    weights = np.array([70, 5, 5, 8, 6, 4, 2], np.float64)
    picks = rng.choice(len(kinds), size=n, p=weights / weights.sum())
    seconds = rng.lognormal(np.log(1.2e-3), 0.8, size=n)
    return [(*kinds[int(i)], float(s)) for i, s in zip(picks, seconds, strict=True)]


def served_model() -> Any:
    info = types.SimpleNamespace(
        name="qpr",
        version="7",
        alias="champion",
        fingerprint="0f" * 32,
        loaded_at=1_795_000_000.25,
        questions=134_091,
    )
    return types.SimpleNamespace(info=info)


def parsed_families(text: str) -> dict[str, dict[str, Any]]:
    """family → type, help, and {(sample name, sorted labels): value}; `le` as a number."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        samples = {}
        for s in family.samples:
            labels = {k: (float(v) if k == "le" else v) for k, v in s.labels.items()}
            samples[(s.name, tuple(sorted(labels.items())))] = float(s.value)
        out[family.name] = {"type": family.type, "help": family.documentation, "samples": samples}
    return out


def compare_exposition(hand: str, lib: str) -> dict[str, Any]:
    """What differs between the two texts once parsed, and as text."""
    a, b = parsed_families(hand), parsed_families(lib)
    differences = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            differences.append(f"family {name} only in {'library' if name in b else 'hand'}")
            continue
        for field in ("type", "help"):
            if a[name][field] != b[name][field]:
                differences.append(f"{name}: {field} {a[name][field]!r} vs {b[name][field]!r}")
        sa, sb = a[name]["samples"], b[name]["samples"]
        for key in sorted(set(sa) ^ set(sb), key=str):
            where = "library" if key in sb else "hand"
            differences.append(f"{name}: sample {key[0]}{dict(key[1])} only in {where}")
        for key in sorted(set(sa) & set(sb), key=str):
            if sa[key] != sb[key]:
                differences.append(f"{name}: {key} = {sa[key]} vs {sb[key]}")
    hand_lines, lib_lines = hand.splitlines(), lib.splitlines()
    return {
        "families": len(a),
        "samples_hand": sum(len(f["samples"]) for f in a.values()),
        "samples_library": sum(len(f["samples"]) for f in b.values()),
        "parsed_identical": not differences,
        "parsed_differences": differences,
        "text_identical": hand == lib,
        "lines_hand": len(hand_lines),
        "lines_library": len(lib_lines),
        "lines_in_both": len(set(hand_lines) & set(lib_lines)),
        "bytes_hand": len(hand.encode()),
        "bytes_library": len(lib.encode()),
        "example_hand": [ln for ln in hand_lines if ln.startswith("qpr_model_info")][:1]
        + [ln for ln in hand_lines if 'le="1"' in ln][:1],
        "example_library": [ln for ln in lib_lines if ln.startswith("qpr_model_info")][:1]
        + [ln for ln in lib_lines if 'le="1.0"' in ln][:1],
    }


def service_request_ms() -> dict[str, Any] | None:
    """The service's own latency, for scale: serve_latency.json's HTTP and in-process p50."""
    try:
        report = json.loads((DEFAULT_OUT / "serve_latency.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    found = {t["target"]: t["measured"] for t in report.get("targets", [])}
    if "HTTP p50 (ms)" not in found:
        return None
    return {
        "http_p50_ms": found["HTTP p50 (ms)"],
        "in_process_p50_ms": found.get("in-process p50 (ms)"),
        "measured_at": report.get("finished_at"),
        "source": "docs/results/serve_latency.json",
    }


def bench_metrics(plan: Plan, commit: str) -> dict[str, Any]:
    from qpr.serve.metrics import LATENCY_BUCKETS, Telemetry

    hand_module = hand_metrics_module(commit)
    if tuple(hand_module.LATENCY_BUCKETS) != tuple(LATENCY_BUCKETS):
        raise SystemExit("the two sides' latency buckets differ: compare like with like")
    hand, lib = HandTelemetry(hand_module), Telemetry()
    model: dict[str, Any] = {"served": None}
    lib.watch_model(lambda: model["served"])
    mix = request_mix(1000, np.random.default_rng(SEED))
    passes = max(1, plan.metric_calls // len(mix))
    texts_unloaded = (hand.render().decode(), lib.render().decode())

    def per_request(side: Any) -> Callable[[], float]:
        observe = side.observe

        def run() -> float:
            started = time.perf_counter()
            for _ in range(passes):
                for endpoint, method, status, seconds in mix:
                    observe(endpoint, method, status, seconds)
            return (time.perf_counter() - started) / (passes * len(mix)) * 1e9

        return run

    say(f"metrics: {passes * len(mix):,} requests a block, {plan.repeats} blocks each")
    ns = alternate(
        {"hand": per_request(hand), "library": per_request(lib)}, plan.repeats, "per request"
    )
    hand.reloads.inc("swapped")
    lib.reloads.labels("swapped").inc()
    hand.questions.inc("true", amount=900)
    hand.questions.inc("false", amount=100)
    lib.questions.labels("true").inc(900)
    lib.questions.labels("false").inc(100)
    hand.served = model["served"] = served_model()

    def per_scrape(side: Any) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(plan.scrapes):
                side.render()
            return (time.perf_counter() - started) / plan.scrapes * 1e6

        return run

    us = alternate(
        {"hand": per_scrape(hand), "library": per_scrape(lib)}, plan.repeats, "per scrape"
    )
    serving = compare_exposition(hand.render().decode(), lib.render().decode())
    unloaded = compare_exposition(*texts_unloaded)
    scale = service_request_ms()
    extra_ns = statistics.median(ns["library"]) - statistics.median(ns["hand"])
    return {
        "hand_commit": commit,
        "requests_per_block": passes * len(mix),
        "scrapes_per_block": plan.scrapes,
        "per_request_ns": {k: summary(v, 1) for k, v in ns.items()},
        "per_request_ratio": ratio(statistics.median(ns["library"]), statistics.median(ns["hand"])),
        "per_request_extra_ns": round(extra_ns, 1),
        "per_scrape_us": {k: summary(v, 1) for k, v in us.items()},
        "per_scrape_ratio": ratio(statistics.median(us["library"]), statistics.median(us["hand"])),
        "service": scale,
        "extra_share_of_http_p50": (
            None if scale is None else round(extra_ns / (scale["http_p50_ms"] * 1e6), 6)
        ),
        "exposition_serving": serving,
        "exposition_before_a_model": unloaded,
        "code_lines_hand": code_lines(hand_module.__dict__["__source__"])
        + code_lines(hand_telemetry_source(commit)),
        "code_lines_library": code_lines(inspect.getsource(sys.modules[Telemetry.__module__])),
    }


# ======================================================================================
# 2. settings
# ======================================================================================


def pydantic_settings_class() -> tuple[type, str]:
    """The candidate, written as one would with pydantic-settings; (class, its source)."""
    source = """
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qpr.config import SettingsError

ENV_PREFIX = "QPR_SERVE_"


class PydanticServeSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="forbid"
    )

    max_k: int = Field(100, ge=1)
    default_k: int = Field(10, ge=1)
    max_question_chars: int = Field(1000, ge=1)
    max_body_bytes: int = Field(256 * 1024, ge=1)
    max_batch: int = Field(64, ge=1)
    poll_seconds: float = Field(30.0, ge=0)
    threads: int = Field(1, ge=1)
    faiss_threads: int = Field(1, ge=1)
    fold_encoder: bool = True
    nprobe: int | None = Field(None, ge=1)
    ef_search: int | None = Field(None, ge=1)
    canaries: int = Field(5, ge=1)
    access_log: bool = False
    models_dir: str = "models"
    registry_name: str | None = None
    alias: str = Field("champion", min_length=1)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise SettingsError(describe(err)) from None

    @model_validator(mode="after")
    def _k_within_limit(self) -> "PydanticServeSettings":
        if self.default_k > self.max_k:
            raise ValueError(f"default_k={self.default_k} is above max_k={self.max_k}")
        return self

    @classmethod
    def from_env(cls, **overrides: Any) -> "PydanticServeSettings":
        return cls(**{k: v for k, v in overrides.items() if v is not None})

    def replace(self, **changes: Any) -> "PydanticServeSettings":
        return type(self)(**{**self.model_dump(), **changes})


def describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        name = ENV_PREFIX + field.upper() if field else "settings"
        parts.append(f"{name}={e['input']!r}: {e['msg']}" if field else e["msg"])
    return "; ".join(parts)
"""
    namespace: dict[str, Any] = {"__name__": "pydantic_serve_settings"}
    exec(compile(source, "pydantic_serve_settings", "exec"), namespace)
    return namespace["PydanticServeSettings"], source


def settings_cases() -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """(what, environment, overrides): every variable with good, odd and bad values."""
    from qpr.serve.settings import ServeSettings

    fields = {f.name: f.type for f in dataclasses.fields(ServeSettings)}
    values = {
        "int": ["70", " 70 ", "", "   ", "0", "-1", "many", "70.0", "7_0", "+70"],
        "bool": ["true", "TRUE", "yes", "on", "1", "false", "no", "off", "0", "t", "y", "maybe"],
        "float": ["0", "2.5", " 2.5 ", "-1", "nan", "inf", "x", ""],
        "str": ["x", " x ", "", "  "],
    }
    cases = [("defaults", {}, {})]
    for name, kind in fields.items():
        group = next(g for g in ("bool", "float", "int", "str") if g in str(kind))
        for value in values[group]:
            cases.append((name, {f"QPR_SERVE_{name.upper()}": value}, {}))
    cases += [
        ("default_k above max_k", {"QPR_SERVE_DEFAULT_K": "200"}, {}),
        ("lower-case variable name", {"qpr_serve_max_k": "30"}, {}),
        ("unknown variable", {"QPR_SERVE_FOO": "1"}, {}),
        ("override beats variable", {"QPR_SERVE_THREADS": "3"}, {"threads": 2}),
        ("override None ignored", {"QPR_SERVE_ALIAS": "staging"}, {"alias": None}),
        ("unknown override", {}, {"bogus": 1}),
        ("bad override", {}, {"threads": 0}),
    ]
    return cases


def settings_outcome(
    build: Callable[..., Any], env: dict[str, str], overrides: dict[str, Any], fields: list[str]
) -> dict[str, Any]:
    """Build with exactly this QPR_SERVE_* environment; the values, or the error."""
    from qpr.config import SettingsError

    saved = {k: v for k, v in os.environ.items() if k.upper().startswith("QPR_SERVE_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        made = build(**overrides)
        return {"ok": {f: getattr(made, f) for f in fields}}
    except SettingsError as err:
        return {"error": "SettingsError", "message": str(err)}
    except Exception as err:  # anything else is a difference worth seeing
        return {"error": type(err).__name__, "message": str(err)}
    finally:
        for key in env:
            os.environ.pop(key, None)
        os.environ.update(saved)


def bench_settings() -> dict[str, Any]:
    import qpr.serve.settings as hand_module
    from qpr.serve.settings import ServeSettings

    candidate, source = pydantic_settings_class()
    fields = [f.name for f in dataclasses.fields(ServeSettings)]
    rows, differing = [], []
    for what, env, overrides in settings_cases():
        hand = settings_outcome(ServeSettings.from_env, env, overrides, fields)
        lib = settings_outcome(candidate.from_env, env, overrides, fields)
        same = hand.keys() == lib.keys() and ("ok" not in hand or hand["ok"] == lib["ok"])
        row = {"case": what, "env": env, "overrides": overrides, "same": same}
        row |= {"hand": hand, "library": lib}
        rows.append(row)
        if not same:
            differing.append(row)
    # Plain construction: the dataclass reads no environment, a BaseSettings always does.
    plain = settings_outcome(lambda: ServeSettings(), {"QPR_SERVE_MAX_K": "30"}, {}, fields)
    plain_lib = settings_outcome(lambda: candidate(), {"QPR_SERVE_MAX_K": "30"}, {}, fields)

    def naming(side: str) -> dict[str, int]:
        """Errors for a value set in the environment, and how many name its variable."""
        errors = [r for r in rows if r["env"] and "error" in r[side]]
        named = sum(any(key in r[side]["message"] for key in r["env"]) for r in errors)
        return {"errors": len(errors), "naming_the_variable": named}

    return {
        "cases": len(rows),
        "same": sum(r["same"] for r in rows),
        "differing": differing,
        "environment_errors": {"hand": naming("hand"), "library": naming("library")},
        "plain_constructor_reads_environment": {
            "hand": plain.get("ok", {}).get("max_k") == 30,
            "library": plain_lib.get("ok", {}).get("max_k") == 30,
        },
        "code_lines": {
            "hand": code_lines(inspect.getsource(hand_module)),
            "library": code_lines(source),
        },
        "rows": rows,
    }


# ======================================================================================
# 3. bm25
# ======================================================================================


def quora_questions(path: Path) -> list[str]:
    """Every distinct question of the Quora pairs file (by qid), in file order."""
    import pandas as pd

    from qpr.data.loaders import read_quora

    frame, _ = read_quora(path)
    questions = pd.concat(
        [
            frame[["qid1", "question1"]].set_axis(["qid", "text"], axis=1),
            frame[["qid2", "question2"]].set_axis(["qid", "text"], axis=1),
        ],
        ignore_index=True,
    ).drop_duplicates("qid")
    return questions["text"].tolist()


def new_questions(texts: list[str], n: int, rng: np.random.Generator) -> list[str]:
    """Sampled questions with one word dropped (when they have 4 or more): not stored."""
    out = []
    for i in rng.choice(len(texts), size=n, replace=False):
        words = texts[int(i)].split()
        if len(words) >= 4:
            del words[int(rng.integers(len(words)))]
        out.append(" ".join(words))
    return out


def lexical_settings() -> dict[str, Any]:
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    lexical = params["index"]["lexical"]
    return {
        "stemmer": lexical["stemmer"],
        "k1": float(lexical["k1"]),
        "b": float(lexical["b"]),
        "candidates": int(lexical["candidates"]),
    }


@dataclass
class Lexical:
    """Both BM25 implementations over the same words, each searching from a question's text."""

    ours: Any  # qpr.retrieval.bm25.BM25Index
    theirs: Any  # bm25s.BM25
    stemmer: str | None
    build_seconds: dict[str, float]

    def ours_search(self, text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ours.search(text, k)

    def theirs_search(self, text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        from qpr.text.words import tokenize

        words = tokenize([text], stemmer=self.stemmer)[0]
        found = self.theirs.retrieve([words], k=k, show_progress=False, n_threads=1)
        return found.scores[0], found.documents[0].astype(np.int64)


def build_lexical(texts: list[str], settings: dict[str, Any]) -> Lexical:
    import bm25s

    from qpr.retrieval.bm25 import BM25Index
    from qpr.text.words import tokenize

    stemmer, k1, b = settings["stemmer"], settings["k1"], settings["b"]
    started = time.perf_counter()
    ours = BM25Index.build(texts, k1=k1, b=b, stemmer=stemmer)
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    theirs = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numba")
    theirs.index(tokenize(texts, stemmer=stemmer), show_progress=False)
    theirs_s = time.perf_counter() - started
    lexical = Lexical(
        ours, theirs, stemmer, {"ours": round(ours_s, 2), "bm25s": round(theirs_s, 2)}
    )
    for text in texts[:50]:  # compile (numba) and warm both
        lexical.ours_search(text, 100)
        lexical.theirs_search(text, 100)
    return lexical


def latencies_ms(search: Callable[[Any], Any], queries: Sequence[Any]) -> list[float]:
    out = []
    for text in queries:
        started = time.perf_counter()
        search(text)
        out.append((time.perf_counter() - started) * 1e3)
    return out


def percentiles(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, np.float64)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def side_by_side(
    sides: dict[str, Callable[[], list[float]]], repeats: int, label: str
) -> dict[str, Any]:
    """p50 / p99 per block of each side, summarised over blocks; ratios ours / bm25s."""
    blocks = alternate(sides, repeats, label)
    out: dict[str, Any] = {}
    for name, runs in blocks.items():
        stats = [percentiles(r) for r in runs]
        out[name] = {q: summary([s[q] for s in stats]) for q in ("p50", "p99")}
    if "ours" in out and "bm25s" in out:
        out["ratio_ours_to_bm25s"] = {
            q: ratio(out["ours"][q]["median"], out["bm25s"][q]["median"]) for q in ("p50", "p99")
        }
    return out


def same_up_to_ties(s1: np.ndarray, r1: np.ndarray, s2: np.ndarray, r2: np.ndarray) -> bool:
    """The same ranking but for the order of equal scores (rtol 1e-6): every group of equal
    scores holds the same rows, except the last, which the cut at k may split anywhere."""
    if r1.size != r2.size or not np.allclose(s1, s2, rtol=1e-6, atol=0):
        return False
    starts = [0] + [i for i in range(1, s1.size) if not np.isclose(s1[i], s1[i - 1], rtol=1e-6)]
    bounds = [*starts, s1.size]
    return all(
        set(r1[a:z].tolist()) == set(r2[a:z].tolist()) for a, z in itertools.pairwise(bounds[:-1])
    )


def top_identity(lexical: Lexical, queries: list[str], k: int) -> dict[str, Any]:
    """Our top k against bm25s's: the same rows in the same order; the same once bm25s's
    ties are put in our order (score descending, then row); the same up to the order of
    equal scores; the same scores rank by rank. Only hits with a positive score count
    (bm25s fills k with zeros)."""
    same_order = same_after_ties = up_to_ties = same_scores = 0
    for text in queries:
        s1, r1 = lexical.ours_search(text, k)
        s2, r2 = lexical.theirs_search(text, k)
        keep1, keep2 = r1 >= 0, s2 > 0
        r1, s1, r2, s2 = r1[keep1], s1[keep1], r2[keep2], s2[keep2]
        order = np.lexsort((r2, -s2))
        same_order += r1.tolist() == r2.tolist()
        same_after_ties += r1.tolist() == r2[order].tolist()
        up_to_ties += same_up_to_ties(s1, r1, s2[order], r2[order])
        same_scores += r1.size == r2.size and np.allclose(s1, s2[order], rtol=1e-5, atol=0)
    return {
        "k": k,
        "queries": len(queries),
        "same_rows_same_order": same_order,
        "same_order_once_ties_by_row": same_after_ties,
        "same_up_to_ties": up_to_ties,
        "same_scores_rtol_1e-5": same_scores,
    }


@dataclass
class Encoders:
    """What runs beside BM25: each takes a question's token ids and encodes it."""

    vocab: Any
    jobs: dict[str, Callable[[list[int]], Any]]
    notes: dict[str, str]


def build_encoders(texts: list[str], folder: Path) -> Encoders:
    """A randomly initialised CNN of the paper's size (the weights do not change the cost),
    as ONNX Runtime runs it (1 thread) and folded (numba, the service's default), and a
    busy numpy loop."""
    import torch

    from qpr.model.cnn import CNNEncoder
    from qpr.model.onnx import export_onnx
    from qpr.retrieval.encoders import load_session
    from qpr.retrieval.folded import fold_cnn
    from qpr.text.vocab import Vocabulary

    vocab = Vocabulary.build(texts, max_words=MAX_WORDS, hash_bins=HASH_BINS)
    torch.manual_seed(SEED)
    path = export_onnx(CNNEncoder(vocab.size, **ENCODER_KW), folder / "encoder.onnx")
    session = load_session(path, threads=1)
    folded = fold_cnn(path)
    assert folded is not None
    x0 = np.linspace(-1.0, 1.0, 300, dtype=np.float32)
    bias = np.full(300, 0.01, np.float32)

    def onnx(ids: list[int]) -> Any:
        return session.run(None, {"token_ids": np.asarray([ids], np.int64)})[0]

    def numpy_loop(ids: list[int]) -> Any:
        x = x0
        for _ in range(150):  # small arrays: numpy keeps the GIL for each
            x = np.tanh(x * np.float32(0.5) + bias)
        return x

    return Encoders(
        vocab=vocab,
        jobs={"onnx": onnx, "folded": lambda ids: folded.encode([ids]), "numpy": numpy_loop},
        notes={
            "onnx": "ONNX Runtime, 1 intra-op thread, paper-size CNN (random weights)",
            "folded": "the same CNN folded into lookup tables (numba, the service's default)",
            "numpy": "150 steps of tanh(0.5 x + b) on 300 floats: numpy holds the GIL",
        },
    )


def fused_path(
    search: Callable[[str], Any],
    encode: Callable[[list[int]], Any],
    queries: list[str],
    ids: list[list[int]],
    pool: ThreadPoolExecutor,
) -> list[float]:
    """The service's fused question: BM25 submitted to a worker, the question encoded on
    the calling thread meanwhile, then BM25's result awaited. ms per question."""
    out = []
    for text, tokens in zip(queries, ids, strict=True):
        started = time.perf_counter()
        lexical = pool.submit(search, text)
        encode(tokens)
        lexical.result()
        out.append((time.perf_counter() - started) * 1e3)
    return out


def beside_neighbour(
    search: Callable[[str], Any] | None,
    encode: Callable[[list[int]], Any],
    queries: list[str],
    ids: list[list[int]],
    seconds: float,
) -> dict[str, Any]:
    """BM25 on this thread while another encodes questions without a pause: BM25's
    latencies and the neighbour's encodings per second (search None: the neighbour alone
    for `seconds`)."""
    stop, done = threading.Event(), [0]

    def neighbour() -> None:
        i = 0
        while not stop.is_set():
            encode(ids[i % len(ids)])
            i += 1
        done[0] = i

    thread = threading.Thread(target=neighbour)
    started = time.perf_counter()
    thread.start()
    lat = [] if search is None else latencies_ms(search, queries)
    if search is None:
        time.sleep(seconds)
    stop.set()
    thread.join()
    return {"lat": lat, "rate": done[0] / (time.perf_counter() - started)}


def bench_concurrent(
    lexical: Lexical, encoders: Encoders, queries: list[str], plan: Plan, k: int
) -> dict[str, Any]:
    ids = [encoders.vocab.encode(q)[:MAX_LEN] or [1] for q in queries]
    searches = {
        "ours": lambda text: lexical.ours_search(text, k),
        "bm25s": lambda text: lexical.theirs_search(text, k),
    }
    pool = ThreadPoolExecutor(1, thread_name_prefix="bm25")
    for search in searches.values():  # the worker thread's own scratch arrays, warm
        pool.submit(search, queries[0]).result()
    out: dict[str, Any] = {"k": k, "encoders": encoders.notes, "fused_path": {}, "neighbour": {}}
    for name, encode in encoders.jobs.items():
        sides = {
            side: (lambda s=search, e=encode: fused_path(s, e, queries, ids, pool))
            for side, search in searches.items()
        }
        sides["encode_alone"] = lambda e=encode: latencies_ms(e, ids)
        out["fused_path"][name] = side_by_side(sides, plan.repeats, f"fused path, {name}")
        out["neighbour"][name] = bench_neighbour(searches, encode, queries, ids, plan, name)
    pool.shutdown()
    return out


def bench_neighbour(
    searches: dict[str, Callable[[str], Any]],
    encode: Callable[[list[int]], Any],
    queries: list[str],
    ids: list[list[int]],
    plan: Plan,
    name: str,
) -> dict[str, Any]:
    seconds = 0.5 if plan is QUICK else 1.0
    sides = {
        side: (lambda s=search: beside_neighbour(s, encode, queries, ids, 0))
        for side, search in searches.items()
    }
    sides["alone"] = lambda: beside_neighbour(None, encode, queries, ids, seconds)
    blocks = alternate(sides, plan.repeats, f"beside a busy {name} thread")
    out: dict[str, Any] = {}
    for side, runs in blocks.items():
        row: dict[str, Any] = {"neighbour_per_s": summary([r["rate"] for r in runs], 1)}
        if side != "alone":
            stats = [percentiles(r["lat"]) for r in runs]
            row |= {q: summary([s[q] for s in stats]) for q in ("p50", "p99")}
        out[side] = row
    out["ratio_ours_to_bm25s"] = {
        q: ratio(out["ours"][q]["median"], out["bm25s"][q]["median"]) for q in ("p50", "p99")
    }
    return out


def bench_wrapper(lexical: Lexical, queries: list[str], plan: Plan, k: int) -> dict[str, Any]:
    """`maxscore.top_k` (grouped) against `maxscore._top_k` (arrays flat): µs per call."""
    from qpr.retrieval import maxscore
    from qpr.retrieval.bm25 import WORTH_PRUNING

    index = lexical.ours
    postings = index.postings
    scratch = maxscore.thread_scratch(index.num_docs, len(index.terms))
    prepared = []
    for text in queries:
        counts = Tally(index.query_terms(text).tolist())
        if counts:
            prepared.append(maxscore.Query.of(counts, index.upper_bounds))
    wp = WORTH_PRUNING
    flat = [(*postings, *q, k, -1, wp, *scratch) for q in prepared]
    for q, args in zip(prepared, flat, strict=True):  # the same results, and warm
        a = maxscore.top_k(postings, q, k, scratch, worth_pruning=wp)
        b = maxscore._top_k(*args)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]

    def paired() -> dict[str, float]:
        """Both calls on each question back to back (who goes first alternates), so the
        machine's load hits both alike: medians of the calls and of their difference."""
        wrapped, direct = [], []
        for i, (q, args) in enumerate(zip(prepared, flat, strict=True)):
            calls = [
                ("top_k", lambda q=q: maxscore.top_k(postings, q, k, scratch, worth_pruning=wp)),
                ("_top_k", lambda args=args: maxscore._top_k(*args)),
            ]
            for name, call in calls if i % 2 == 0 else calls[::-1]:
                started = time.perf_counter()
                call()
                (wrapped if name == "top_k" else direct).append(time.perf_counter() - started)
        diff = np.asarray(wrapped) - np.asarray(direct)
        return {
            "top_k": float(np.median(wrapped)) * 1e6,
            "_top_k": float(np.median(direct)) * 1e6,
            "difference": float(np.median(diff)) * 1e6,
        }

    blocks = alternate({"paired": paired}, plan.repeats, "top_k wrapper")["paired"]
    us = {key: summary([b[key] for b in blocks], 3) for key in ("top_k", "_top_k", "difference")}
    return {
        "k": k,
        "queries": len(prepared),
        "us_per_call": {"top_k": us["top_k"], "_top_k": us["_top_k"]},
        "wrapper_extra_us": us["difference"],
        "ratio": ratio(us["top_k"]["median"], us["_top_k"]["median"]),
        "dispatch_ns": bench_dispatch(plan),
    }


def bench_dispatch(plan: Plan) -> dict[str, Any]:
    """The wrapper's own cost, where the kernel does next to nothing (one word found in
    one of three documents): ns per call, blocks of 20,000 calls alternating."""
    from qpr.retrieval import maxscore
    from qpr.retrieval.bm25 import BM25Index

    index = BM25Index.build(["rare word", "other text", "more text"])
    postings = index.postings
    question = maxscore.Query.of({index.terms["rare"]: 1}, index.upper_bounds)
    scratch = maxscore.thread_scratch(index.num_docs, len(index.terms))
    args = (*postings, *question, 1, -1, 2048, *scratch)
    calls = 20_000

    def wrapper() -> float:
        started = time.perf_counter()
        for _ in range(calls):
            maxscore.top_k(postings, question, 1, scratch, worth_pruning=2048)
        return (time.perf_counter() - started) / calls * 1e9

    def kernel() -> float:
        started = time.perf_counter()
        for _ in range(calls):
            maxscore._top_k(*args)
        return (time.perf_counter() - started) / calls * 1e9

    wrapper(), kernel()  # warm (and compile for these types)
    blocks = alternate({"top_k": wrapper, "_top_k": kernel}, plan.repeats, "top_k dispatch")
    return {name: summary(v, 0) for name, v in blocks.items()}


def bench_bm25(plan: Plan, quora: Path) -> dict[str, Any]:
    settings = lexical_settings()
    say(f"bm25: reading {quora}")
    texts = quora_questions(quora)
    lexical = build_lexical(texts, settings)
    say(f"bm25: {len(texts):,} questions; built in {lexical.build_seconds}")
    rng = np.random.default_rng(SEED)
    queries = new_questions(texts, plan.queries, rng)
    k_service = settings["candidates"]
    single = {}
    for k in (10, k_service):
        sides = {
            "ours": lambda k=k: latencies_ms(lambda t: lexical.ours_search(t, k), queries),
            "bm25s": lambda k=k: latencies_ms(lambda t: lexical.theirs_search(t, k), queries),
        }
        single[f"k{k}"] = side_by_side(sides, plan.repeats, f"one question, k {k}")
    from qpr.text.words import tokenize

    words = side_by_side(
        {
            "tokenize": lambda: latencies_ms(
                lambda t: tokenize([t], stemmer=lexical.stemmer), queries
            )
        },
        plan.repeats,
        "tokenize alone",
    )
    identity = {f"k{k}": top_identity(lexical, queries, k) for k in (10, k_service)}
    with tempfile.TemporaryDirectory(prefix="library_choices_") as folder:
        say("bm25: building the encoders (a paper-size CNN, random weights)")
        encoders = build_encoders(texts, Path(folder))
        concurrent_queries = queries[: plan.concurrent_queries]
        concurrent = bench_concurrent(lexical, encoders, concurrent_queries, plan, k_service)
    return {
        "corpus": f"{quora.name}: {len(texts):,} distinct questions indexed",
        "settings": settings,
        "queries": len(queries),
        "build_seconds": lexical.build_seconds,
        "single": single,
        "tokenize_alone": words["tokenize"],
        "identity": identity,
        "concurrent": concurrent,
        "wrapper": bench_wrapper(lexical, queries, plan, k_service),
    }


# ======================================================================================
# Report
# ======================================================================================


def fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def metrics_lines(m: dict[str, Any]) -> list[str]:
    serving, unloaded = m["exposition_serving"], m["exposition_before_a_model"]
    scale = m.get("service")
    share = m.get("extra_share_of_http_p50")
    lines = [
        "## 1. Service metrics: hand-written registry vs prometheus_client",
        "",
        f"Hand-written: `serve/metrics.py` at commit {m['hand_commit']} (read from git), driven "
        "as the old `_Telemetry` did. Library: `qpr.serve.metrics.Telemetry` "
        "(prometheus_client, one `CollectorRegistry` per app, no `_created` series). "
        f"{m['requests_per_block']:,} requests and {m['scrapes_per_block']} scrapes a block; "
        "median (range) of the blocks.",
        "",
        "| | hand-written | prometheus_client | library / hand |",
        "|---|---:|---:|---:|",
        f"| per request (one counter + one histogram), ns | {fmt(m['per_request_ns']['hand'], 0)} "
        f"| {fmt(m['per_request_ns']['library'], 0)} | {m['per_request_ratio']} |",
        f"| per scrape (/metrics text), µs | {fmt(m['per_scrape_us']['hand'], 0)} "
        f"| {fmt(m['per_scrape_us']['library'], 0)} | {m['per_scrape_ratio']} |",
        f"| exposition, lines / bytes | {serving['lines_hand']} / {serving['bytes_hand']:,} "
        f"| {serving['lines_library']} / {serving['bytes_library']:,} | |",
        f"| code lines (metrics.py + the app's families; no docstrings, comments) "
        f"| {m['code_lines_hand']} | {m['code_lines_library']} | |",
        "",
    ]
    if scale is not None and share is not None:
        lines += [
            f"For scale: the service's HTTP p50 is {scale['http_p50_ms']} ms "
            f"({scale['source']}, {scale['measured_at']}); the library's extra "
            f"{m['per_request_extra_ns']:.0f} ns a request is {share:.3%} of it.",
            "",
        ]
    lines += [
        "Exposition compared after parsing both texts (families, types, help, every sample's "
        f"name, labels and value): serving a model, "
        f"{'identical' if serving['parsed_identical'] else 'different'} "
        f"({serving['families']} families, {serving['samples_hand']} samples); "
        f"as text, {serving['lines_in_both']} of {serving['lines_hand']} lines are "
        'the same: the library writes every value as a float (`2.0`, `le="1.0"`), sorts a '
        "series' labels by name and keeps series in the order they first appeared:",
        "",
        "```",
        *[f"hand:    {ln}" for ln in serving["example_hand"]],
        *[f"library: {ln}" for ln in serving["example_library"]],
        "```",
        "",
        "Before a model is loaded: "
        + (
            "identical."
            if unloaded["parsed_identical"]
            else "; ".join(unloaded["parsed_differences"])
            + " (a gauge without labels always has a value in prometheus_client)."
        ),
        "",
    ]
    return lines


def outcome_text(o: dict[str, Any], other: dict[str, Any]) -> str:
    """'accepted' (with the values that differ from the other side's), or the error."""
    if "ok" in o:
        theirs = other.get("ok", {})
        changed = {k: v for k, v in o["ok"].items() if k in theirs and theirs[k] != v}
        return "accepted" + (f" ({json.dumps(changed)})" if changed else "")
    return f"{o['error']}: {o['message']}".replace("|", "\\|")


def settings_lines(s: dict[str, Any]) -> list[str]:
    named = s["environment_errors"]
    plain = s["plain_constructor_reads_environment"]
    lines = [
        "## 2. Service settings: hand-written QPR_SERVE_* parsing vs pydantic-settings",
        "",
        "Hand-written: `qpr.serve.settings.ServeSettings`. Library: `PydanticServeSettings` in "
        "this script (`BaseSettings`, `env_prefix`, `Field` bounds, one model validator, "
        "validation errors turned into `SettingsError` naming the variable).",
        "",
        "| | hand-written | pydantic-settings |",
        "|---|---:|---:|",
        f"| inputs with the same outcome | {s['same']} of {s['cases']} | {s['same']} of "
        f"{s['cases']} |",
        "| errors for a variable's value that name the variable | "
        + " | ".join(
            f"{named[side]['naming_the_variable']} of {named[side]['errors']}"
            for side in ("hand", "library")
        )
        + " |",
        f"| `ServeSettings()` reads the environment | {'yes' if plain['hand'] else 'no'} | "
        f"{'yes' if plain['library'] else 'no'} |",
        f"| code lines (docstrings, comments left out) | {s['code_lines']['hand']} | "
        f"{s['code_lines']['library']} |",
        "",
        "Inputs where the two differ:",
        "",
        "| case | environment / overrides | hand-written | pydantic-settings |",
        "|---|---|---|---|",
    ]
    for row in s["differing"]:
        given = json.dumps({**row["env"], **row["overrides"]})
        lines.append(
            f"| {row['case']} | `{given}` | {outcome_text(row['hand'], row['library'])} "
            f"| {outcome_text(row['library'], row['hand'])} |"
        )
    return [*lines, ""]


def latency_table(title: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"| {title} | p50 ms | p99 ms |", "|---|---:|---:|"]
    for name, row in rows.items():
        if isinstance(row, dict) and isinstance(row.get("p50"), dict):
            lines.append(f"| {name} | {fmt(row['p50'])} | {fmt(row['p99'])} |")
    return lines


def bm25_lines(b: dict[str, Any]) -> list[str]:
    st = b["settings"]
    lines = [
        "## 3. BM25: our numba BM25 + MaxScore vs bm25s (numba backend)",
        "",
        f"{b['corpus']}; stemmer {st['stemmer']}, k1 {st['k1']}, b {st['b']} (params.yaml), "
        f"the same words on both sides (`qpr.text.words.tokenize`). {b['queries']:,} new "
        "questions (sampled, one word dropped), searched one at a time from their text. Built "
        f"in {b['build_seconds']['ours']} s (ours) and {b['build_seconds']['bm25s']} s (bm25s).",
        "",
    ]
    for key, single in b["single"].items():
        lines += latency_table(f"one question, {key.replace('k', 'k ')}", single)
        r = single["ratio_ours_to_bm25s"]
        lines += [f"| ours / bm25s | {r['p50']} | {r['p99']} |", ""]
    lines += [
        "Tokenising a question (both sides do it): p50 "
        f"{b['tokenize_alone']['p50']['median']:.3f} ms.",
        "",
        "Top k against bm25s's, questions alike: same rows in the same order; the same once "
        "bm25s's ties are put in our order (score, then row); the same up to the order of equal "
        "scores (rtol 1e-6; the last tied group may be cut anywhere); the same score at every "
        "rank (rtol 1e-5). bm25s sums each word's weight in the question's order, we in "
        "MaxScore's, so equal scores can differ in the last bit and swap.",
        "",
        "| top k | same order | same once ties go by row | same up to ties | same scores |",
        "|---|---:|---:|---:|---:|",
    ]
    for ident in b["identity"].values():
        n = ident["queries"]
        lines.append(
            f"| k {ident['k']} ({n} questions) | {ident['same_rows_same_order']} "
            f"| {ident['same_order_once_ties_by_row']} | {ident.get('same_up_to_ties', '–')} "
            f"| {ident['same_scores_rtol_1e-5']} |"
        )
    c = b["concurrent"]
    lines += [
        "",
        f"### Concurrent (k {c['k']}, the service's BM25 candidates)",
        "",
        "The service's fused path: BM25 submitted to a worker thread, the question encoded on "
        "the calling thread, then BM25 awaited; ms per question.",
        "",
    ]
    for name, rows in c["fused_path"].items():
        lines += latency_table(f"beside {name}: {c['encoders'][name]}", rows)
        r = rows["ratio_ours_to_bm25s"]
        lines += [f"| ours / bm25s | {r['p50']} | {r['p99']} |", ""]
    lines += [
        "BM25 on one thread while another encodes questions without a pause: BM25's latency, "
        "and how many questions the other thread encodes a second (alone: BM25 idle).",
        "",
        "| neighbour | BM25 | p50 ms | p99 ms | neighbour's encodings/s |",
        "|---|---|---:|---:|---:|",
    ]
    for name, rows in c["neighbour"].items():
        for side in ("ours", "bm25s", "alone"):
            row = rows[side]
            p50 = fmt(row["p50"]) if "p50" in row else "–"
            p99 = fmt(row["p99"]) if "p99" in row else "–"
            lines.append(f"| {name} | {side} | {p50} | {p99} | {fmt(row['neighbour_per_s'], 0)} |")
    w = b["wrapper"]
    lines += [
        "",
        f"### `maxscore.top_k` (arrays grouped) vs its kernel `_top_k` (arrays flat), k {w['k']}",
        "",
        f"{w['queries']:,} prepared questions, µs per call: `top_k` "
        f"{fmt(w['us_per_call']['top_k'])}, "
        f"`_top_k` {fmt(w['us_per_call']['_top_k'])} (each question's two calls back to back); "
        f"the wrapper adds {fmt(w['wrapper_extra_us'])} µs a call, the median of the paired "
        f"differences (ratio of the medians {w['ratio']}). Same scores, rows and pruning "
        "point on every question. Where the kernel does next to nothing (one word in one of "
        f"three documents) a call costs {fmt(w['dispatch_ns']['top_k'], 0)} ns through "
        f"`top_k` and {fmt(w['dispatch_ns']['_top_k'], 0)} ns straight to `_top_k`: the "
        "wrapper's own cost.",
        "",
    ]
    return lines


def metrics_verdict(m: dict[str, Any]) -> str:
    share = m.get("extra_share_of_http_p50")
    same = m["exposition_serving"]["parsed_identical"]
    if same and share is not None and share < 0.01:
        return (
            f"**Reading**: the library costs {m['per_request_extra_ns']:.0f} ns more a request "
            f"({share:.3%} of the service's HTTP p50) and "
            f"{m['per_scrape_us']['library']['median'] - m['per_scrape_us']['hand']['median']:.0f}"
            " µs more a scrape, and writes the same families, samples and buckets: as good "
            "for the job. The service uses it (`qpr.serve.metrics`)."
        )
    return "**Reading**: the hand-written registry wins here (cost or exposition differ)."


def settings_verdict(s: dict[str, Any]) -> str:
    if s["same"] == s["cases"] and s["code_lines"]["library"] < s["code_lines"]["hand"]:
        return "**Reading**: equal behaviour in less code: pydantic-settings does the job."
    return (
        f"**Reading**: {s['cases'] - s['same']} of {s['cases']} inputs behave differently, so "
        "the hand-written parsing stays; a `BaseSettings` that behaved the same would need "
        "validators for blank, padded and lenient values, aliases for upper-case-only names "
        "and a switch keeping plain construction off the environment: the parsing it replaces."
    )


def bm25_verdict(b: dict[str, Any]) -> str:
    k = b["settings"]["candidates"]
    single = b["single"][f"k{k}"]["ratio_ours_to_bm25s"]
    fused = {n: r["ratio_ours_to_bm25s"]["p50"] for n, r in b["concurrent"]["fused_path"].items()}
    near = {n: r["ratio_ours_to_bm25s"]["p50"] for n, r in b["concurrent"]["neighbour"].items()}
    ours_wins_alone = single["p50"] < 1 and single["p99"] < 1
    ours_wins_together = all(v < 1 for v in [*fused.values(), *near.values()])
    if ours_wins_alone:
        who = "ours is faster"
    elif ours_wins_together:
        who = "ours wins only when concurrent"
    else:
        who = "bm25s is faster, alone and concurrent"
    return (
        f"**Reading** (k {k}, ours / bm25s, p50): one question {single['p50']} (p99 "
        f"{single['p99']}); fused path "
        + ", ".join(f"{n} {v}" for n, v in fused.items())
        + "; beside a busy thread "
        + ", ".join(f"{n} {v}" for n, v in near.items())
        + f": {who}."
    )


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Library choices: hand-written code against the library that could replace it",
        "",
        f"Measured by `benchmarks/library_choices.py` ({report['finished_at']}; "
        f"{'--quick smoke run' if report.get('quick') else 'full run'}), commit "
        f"{(m.get('git_commit') or '?')[:12]}{' with local changes' if m.get('dirty') else ''}.",
        "",
        f"**Machine**: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB, "
        f"{m['platform']}, Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f". Shared machine: load average {m.get('loadavg_start')} at start, "
        f"{m.get('loadavg_end')} at the end.",
        "",
        "Every measurement alternates the two sides in blocks; tables show the median of the "
        "blocks and their range.",
        "",
    ]
    if "metrics" in report:
        lines += [*metrics_lines(report["metrics"]), metrics_verdict(report["metrics"]), ""]
    if "settings" in report:
        lines += [*settings_lines(report["settings"]), settings_verdict(report["settings"]), ""]
    if "bm25" in report:
        lines += [*bm25_lines(report["bm25"]), bm25_verdict(report["bm25"]), ""]
    return "\n".join(lines).rstrip() + "\n"


def versions() -> dict[str, str]:
    out = {}
    for name in ("prometheus-client", "pydantic-settings", "pydantic", "bm25s", "numba", "numpy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    import onnxruntime

    out["onnxruntime"] = onnxruntime.__version__
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from qpr.io import write_text_atomic

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(CASES), help="cases to run (comma separated)")
    parser.add_argument("--quick", action="store_true", help="smoke run (fewer, shorter blocks)")
    parser.add_argument("--quora", type=Path, default=DEFAULT_QUORA)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--hand-commit", default=HAND_METRICS_COMMIT)
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {CASES}")
    plan = QUICK if args.quick else FULL
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{NAME}.json"
    report: dict[str, Any] = {}
    if json_path.is_file() and set(cases) != set(CASES):  # keep the other cases' results
        report = json.loads(json_path.read_text(encoding="utf-8"))
    machine = describe(ROOT, versions(), loadavg_start=[round(x, 2) for x in os.getloadavg()])
    started = time.perf_counter()
    for case in cases:
        say(f"case {case}")
        if case == "metrics":
            report["metrics"] = bench_metrics(plan, args.hand_commit)
        elif case == "settings":
            report["settings"] = bench_settings()
        else:
            report["bm25"] = bench_bm25(plan, args.quora)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report |= {
        "quick": args.quick,
        "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine,
        "plan": dataclasses.asdict(plan),
    }
    write_text_atomic(json_path, json.dumps(report, indent=2, default=str) + "\n")
    write_text_atomic(out / f"{NAME}.md", render_markdown(report))
    say(f"wrote {json_path} and {NAME}.md in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

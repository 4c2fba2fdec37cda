"""The search service's limits and knobs, read from ``QPR_SERVE_*`` environment variables.

Every limit exists so that one request cannot hurt the service or its neighbours: a huge
body would be buffered in memory, a huge question tokenised, a huge k or batch would hold a
worker thread for a long time. The defaults suit a question-answering front end (questions
are a sentence, k is small); raise them through the environment, not the code.

=================================  =========  ==============================================
variable                           default    meaning
=================================  =========  ==============================================
``QPR_SERVE_MAX_K``                100        largest k a request may ask for
``QPR_SERVE_DEFAULT_K``            10         k when a request gives none
``QPR_SERVE_MAX_QUESTION_CHARS``   1000       longest question, in characters
``QPR_SERVE_MAX_BODY_BYTES``       262144     largest request body (Content-Length and
                                              the bytes actually streamed)
``QPR_SERVE_MAX_BATCH``            64         most questions in one /search/batch request
``QPR_SERVE_POLL_SECONDS``         30         how often the model source is polled (0: never)
``QPR_SERVE_THREADS``              1          ONNX Runtime intra-op threads per bundle
``QPR_SERVE_FAISS_THREADS``        1          FAISS OpenMP threads per searching thread
``QPR_SERVE_FOLD_ENCODER``         true       encode with the CNN folded into lookup tables
                                              (`qpr.retrieval.folded`; more memory, 8x faster)
``QPR_SERVE_NPROBE``               (stored)   IVF lists probed per query; empty = the
                                              bundle's (`qpr.artifacts.SearchConfig`)
``QPR_SERVE_EF_SEARCH``            (stored)   HNSW candidates kept per query; empty: as
                                              QPR_SERVE_NPROBE
``QPR_SERVE_CANARIES``             5          indexed questions a new bundle must retrieve
                                              first before it may serve
``QPR_SERVE_ACCESS_LOG``           false      one log line per request (uvicorn's)
``QPR_SERVE_MODELS_DIR``           models     local bundle to serve (when no registry name)
``QPR_SERVE_REGISTRY_NAME``        (none)     serve the MLflow registered model of this name
``QPR_SERVE_ALIAS``                champion   ... at this alias
``QPR_SERVE_API_KEY_FILE``         (none)     file holding the API key (whitespace stripped;
                                              refused when other users may read or write
                                              it); preferred over the variable below
``QPR_SERVE_API_KEY``              (none)     the API key itself; with either, requests need
                                              it (`qpr.serve.auth`)
``QPR_SERVE_AUTH``                 (auto)     ``off``: no key even off loopback; ``on``:
                                              refuse to start without a key
``QPR_SERVE_ALLOWED_HOSTS``        (auto)     Host header names served, comma-separated;
                                              ``*`` any, ``*.example.com`` subdomains;
                                              unset: loopback names under ``qpr serve`` on
                                              loopback, else any
``QPR_SERVE_CACHE_DIR``            (auto)     registry versions that served are kept here, to
                                              start from in an outage (default:
                                              <models dir>/.registry-cache)
``QPR_SERVE_STARTUP_WAIT``         0          seconds startup waits for the first model before
                                              the port opens (0: open at once, load behind)
``QPR_SERVE_RETRY_MAX_SECONDS``    60         longest wait between retries of a failing source
                                              (the wait doubles from 1 s)
``QPR_SERVE_HEADER_TIMEOUT``       10         seconds a connection may take to send a request
                                              head; then it is closed
``QPR_SERVE_BODY_TIMEOUT``         10         seconds a request body may take to arrive; then
                                              408 and the connection is closed
``QPR_SERVE_KEEP_ALIVE``           5          seconds an idle keep-alive connection stays open
``QPR_SERVE_MAX_CONNECTIONS``      1000       open connections; past it the longest-stalled one
                                              is closed (lowered below the open-files limit)
``QPR_SERVE_BACKLOG``              1024       connections the kernel queues before accept
``QPR_SERVE_LIMIT_CONCURRENCY``    (none)     503 (``too_busy``) past this many connections
                                              or requests in progress, stalled ones included
``QPR_SERVE_SHUTDOWN_SECONDS``     10         grace for in-flight requests at shutdown
``QPR_SERVE_LOG_BURST``            10         log records of one kind let through per interval
``QPR_SERVE_LOG_INTERVAL``         60         ... the interval, seconds; the rest are counted
``QPR_SERVE_QUERY_LOG``            (none)     folder of the query log and feedback
                                              (`qpr.querylog`); unset: no log
``QPR_SERVE_QUERY_LOG_ENABLED``    true       ``false``: no log even with the folder set
``QPR_SERVE_QUERY_LOG_SAMPLE``     1.0        share of requests logged (by request id)
``QPR_SERVE_QUERY_LOG_FILE_BYTES`` 67108864   a log file is closed before it passes this
``QPR_SERVE_QUERY_LOG_TOTAL_BYTES`` 1073741824 the folder's bound; oldest files deleted
``QPR_SERVE_QUERY_LOG_ROTATE_SECONDS`` 3600   a log file is closed at this age
``QPR_SERVE_QUERY_LOG_QUEUE``      10000      requests waiting for the log's writer; past
                                              it new ones are dropped (and counted)
=================================  =========  ==============================================

Why parsed here and not by pydantic-settings: compared input by input
(`benchmarks/library_choices.py`, docs/results/library_choices.md), an idiomatic
`BaseSettings` treats about one input in five differently (a blank value is an error, not
unset; "70.0", "t" and lower-case names are accepted; values are not stripped; plain
construction reads the environment). Making it behave the same takes validators doing the
parsing written here, so the saving goes.

Why one FAISS thread: the service searches one question per call, where FAISS parallelises
over queries, so more threads only add OpenMP start-up cost; with several requests in
flight, each in its own worker thread, more OpenMP threads would oversubscribe the cores.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qpr.config import SettingsError
from qpr.querylog.log_writer import LogLimits

__all__ = ["ENV_PREFIX", "ServeSettings", "SettingsError"]

ENV_PREFIX = "QPR_SERVE_"
# LogLimits' fields that are QPR_SERVE_QUERY_LOG_<NAME>.
_LIMIT_NAMES = ("sample", "file_bytes", "total_bytes", "rotate_seconds")


@dataclass(frozen=True)
class ServeSettings:
    """Validated service settings; `from_env` reads them, `replace` overrides some."""

    max_k: int = 100
    default_k: int = 10
    max_question_chars: int = 1000
    max_body_bytes: int = 256 * 1024
    max_batch: int = 64
    poll_seconds: float = 30.0
    threads: int = 1
    faiss_threads: int = 1
    fold_encoder: bool = True
    nprobe: int | None = None
    ef_search: int | None = None
    canaries: int = 5
    access_log: bool = False
    models_dir: str = "models"
    registry_name: str | None = None
    alias: str = "champion"
    # repr=False: settings may be logged; the key must not be.
    api_key: str | None = dataclasses.field(default=None, repr=False)
    api_key_file: str | None = None
    auth: bool | None = None  # None: a key when one is set, required off loopback
    allowed_hosts: tuple[str, ...] | None = None
    cache_dir: str | None = None
    startup_wait: float = 0.0
    retry_max_seconds: float = 60.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    keep_alive: int = 5
    max_connections: int = 1000
    backlog: int = 1024
    limit_concurrency: int | None = None
    shutdown_seconds: int = 10
    log_burst: int = 10
    log_interval: float = 60.0
    query_log: str | None = None
    query_log_enabled: bool = True
    query_log_sample: float = 1.0
    query_log_file_bytes: int = 64 * 2**20
    query_log_total_bytes: int = 2**30
    query_log_rotate_seconds: float = 3600.0
    query_log_queue: int = 10_000

    def __post_init__(self) -> None:
        positive = {
            "max_k": self.max_k,
            "default_k": self.default_k,
            "max_question_chars": self.max_question_chars,
            "max_body_bytes": self.max_body_bytes,
            "max_batch": self.max_batch,
            "threads": self.threads,
            "faiss_threads": self.faiss_threads,
            "canaries": self.canaries,
            "keep_alive": self.keep_alive,
            "max_connections": self.max_connections,
            "backlog": self.backlog,
            "shutdown_seconds": self.shutdown_seconds,
            "log_burst": self.log_burst,
        }
        for name, value in positive.items():
            if value < 1:
                raise SettingsError(f"{name} must be >= 1, got {value}")
        if self.default_k > self.max_k:
            raise SettingsError(f"default_k={self.default_k} is above max_k={self.max_k}")
        if not self.poll_seconds >= 0:  # NaN too
            raise SettingsError(f"poll_seconds must be >= 0 (0 = never), got {self.poll_seconds}")
        for name in ("header_timeout", "body_timeout", "retry_max_seconds", "log_interval"):
            value = getattr(self, name)
            if not value > 0:  # NaN too
                raise SettingsError(f"{name} must be > 0 seconds, got {value}")
        if not self.startup_wait >= 0:
            raise SettingsError(f"startup_wait must be >= 0 seconds, got {self.startup_wait}")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise SettingsError(f"limit_concurrency must be >= 1, got {self.limit_concurrency}")
        if self.nprobe is not None and self.nprobe < 1:
            raise SettingsError(f"nprobe must be >= 1, got {self.nprobe}")
        if self.ef_search is not None and self.ef_search < 1:
            raise SettingsError(f"ef_search must be >= 1, got {self.ef_search}")
        if not self.alias:
            raise SettingsError("alias must not be empty")
        if self.api_key is not None and self.api_key_file is not None:
            raise SettingsError("set QPR_SERVE_API_KEY_FILE or QPR_SERVE_API_KEY, not both")
        if self.auth is False and (self.api_key is not None or self.api_key_file is not None):
            raise SettingsError("QPR_SERVE_AUTH=off but an API key is set: drop one of them")
        if self.allowed_hosts is not None and not self.allowed_hosts:
            raise SettingsError("allowed_hosts is empty: name a host, or * for any")
        self._check_query_log()

    def _check_query_log(self) -> None:
        # The writer's own rules (qpr.querylog.LogLimits), said in the settings' words.
        try:
            self.query_log_limits()
        except ValueError as err:
            names = {
                **{n: f"query_log_{n}" for n in _LIMIT_NAMES},
                "queue_events": "query_log_queue",
            }
            text = re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m[1]], str(err))
            raise SettingsError(text) from None

    def query_log_limits(self) -> LogLimits:
        """The query log's limits from these settings."""
        return LogLimits(
            sample=self.query_log_sample,
            file_bytes=self.query_log_file_bytes,
            total_bytes=self.query_log_total_bytes,
            rotate_seconds=self.query_log_rotate_seconds,
            queue_events=self.query_log_queue,
        )

    @property
    def query_log_on(self) -> bool:
        """A folder is set and the switch is not off."""
        return bool(self.query_log) and self.query_log_enabled

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServeSettings:
        """Defaults, then ``QPR_SERVE_<FIELD>`` variables, then ``overrides`` (e.g. CLI
        options; None values are ignored). SettingsError names a bad variable."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        given: dict[str, str] = {}  # field -> "VARIABLE='value'", for the error messages
        for field in dataclasses.fields(cls):
            key = ENV_PREFIX + field.name.upper()
            raw = env.get(key)
            if raw is None or raw.strip() == "":
                continue
            what, parse = _PARSERS[field.name]
            try:
                values[field.name] = parse(raw.strip())
            except ValueError:
                raise SettingsError(f"{key}={raw!r} is not a valid {what}") from None
            # A secret field (repr=False) is named in messages, never shown.
            given[field.name] = f"{key}={raw!r}" if field.repr else key
        chosen = {k: v for k, v in overrides.items() if v is not None}
        values.update(chosen)
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        try:
            return cls(**values)
        except SettingsError as err:  # out of range: say which variable set it
            named = [
                where
                for name, where in given.items()
                if name not in chosen and re.search(rf"\b{name}\b", str(err))
            ]
            if not named:
                raise
            raise SettingsError(f"{err} ({', '.join(named)})") from None

    def replace(self, **changes: Any) -> ServeSettings:
        return dataclasses.replace(self, **changes)


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(raw)


def _parse_hosts(raw: str) -> tuple[str, ...]:
    hosts = tuple(h.strip().strip("[]").lower() for h in raw.split(",") if h.strip())
    if not hosts or any(not h or " " in h or "/" in h for h in hosts):
        raise ValueError(raw)
    for host in hosts:
        # Names are matched without the port; "api.example.com:443" would never match.
        if ":" in host:
            ipaddress.IPv6Address(host)  # ValueError unless an IPv6 address
    return hosts


# field → (what the value must look like, parser)
_PARSERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "max_k": ("integer", int),
    "default_k": ("integer", int),
    "max_question_chars": ("integer", int),
    "max_body_bytes": ("integer", int),
    "max_batch": ("integer", int),
    "poll_seconds": ("number of seconds", float),
    "threads": ("integer", int),
    "faiss_threads": ("integer", int),
    "fold_encoder": ("boolean (true/false)", _parse_bool),
    "nprobe": ("integer", int),
    "ef_search": ("integer", int),
    "canaries": ("integer", int),
    "access_log": ("boolean (true/false)", _parse_bool),
    "models_dir": ("path", str),
    "registry_name": ("model name", str),
    "alias": ("alias", str),
    "api_key": ("key", str),
    "api_key_file": ("path", str),
    "auth": ("on/off", _parse_bool),
    "allowed_hosts": ("comma-separated list of host names", _parse_hosts),
    "cache_dir": ("path", str),
    "startup_wait": ("number of seconds", float),
    "retry_max_seconds": ("number of seconds", float),
    "header_timeout": ("number of seconds", float),
    "body_timeout": ("number of seconds", float),
    "keep_alive": ("integer (seconds)", int),
    "max_connections": ("integer", int),
    "backlog": ("integer", int),
    "limit_concurrency": ("integer", int),
    "shutdown_seconds": ("integer (seconds)", int),
    "log_burst": ("integer", int),
    "log_interval": ("number of seconds", float),
    "query_log": ("folder", str),
    "query_log_enabled": ("boolean (true/false)", _parse_bool),
    "query_log_sample": ("number between 0 and 1", float),
    "query_log_file_bytes": ("integer (bytes)", int),
    "query_log_total_bytes": ("integer (bytes)", int),
    "query_log_rotate_seconds": ("number of seconds", float),
    "query_log_queue": ("integer", int),
}

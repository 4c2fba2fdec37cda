"""Hot reload: poll the source, load a new bundle beside the old one, check it, swap.

The sequence for every change the source reports (`Reloader.check`):

1. ``source.poll()`` → a `Candidate`; an unchanged token ends the check (the common case,
   a stat or one registry call).
2. ``source.materialize`` + `Bundle.load`: the new bundle is loaded next to the serving
   one, which keeps answering meanwhile (memory: both for a moment). `Bundle.load`
   already refuses files that do not belong together (vocabulary vs encoder, encoder width
   vs index width, id map and question table vs index).
3. `check_bundle`: the checks a file-level cross-check cannot make. A few questions of the
   bundle's own index (evenly spaced rows) must each retrieve themselves first, at a
   distance of about 0, from the dense index alone (tokenise → the encoder as served, ONNX
   or folded, or a student bundle's document encoder → FAISS): with BM25 weighing most the
   fused ranking may put a question sharing the words first. This catches an index built
   by another encoder of the same width, a model whose vectors collapsed, NaNs, a
   vocabulary that tokenises differently. The query vectors must have the index's width
   and finite distances.
4. `warm_up`: searches of several lengths and a batch, so the first real requests do not
   pay ONNX Runtime's and FAISS's first-call allocations.
5. The swap: one reference assignment under a lock (`ModelHolder.swap`). A request reads
   `ModelHolder.current` once and uses that `Served` object to the end, so in-flight
   requests finish on the bundle they started with; the old bundle is freed when the last
   of them drops it.

A delta that fails its check does not refuse the bundle: `Bundle.load` leaves it out, the
bundle serves the main index and the other deltas, and `ModelInfo.failed_deltas` names it
(/readyz, /version, the log).

A candidate that fails 2-4 is *refused*: logged with the reason, counted, shown by
/version, and the serving model stays. A refused token is not retried until the source
reports another one (a broken upload does not cost a full load every poll). Errors that
may be transient (download failed, registry unreachable) are retried at the next polls,
up to `MAX_ATTEMPTS` for one token, then refused too.

Starting: the first check runs in the polling thread, so the port opens while it loads.
While a remote source fails, checks are retried after 1, 2, 4, ... seconds, at most
``retry_max_seconds`` apart. A source whose ``backoff`` is False (a local folder: a check
is a few stats) is checked at ``poll_seconds`` whatever happens, so a repair is seen at
the next poll. When nothing serves and the source cannot say what to serve
(registry down), a source with a ``fallback()`` (the registry's local cache of versions
that served before) offers its newest kept bundle; a source with ``keep(candidate,
path)`` is handed every bundle that passed its checks, to keep.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from qpr.artifacts import QUESTIONS_FILE
from qpr.errors import QPRError
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.serve.sources import BundleSource, Candidate, SourceError

__all__ = [
    "MAX_ATTEMPTS",
    "STOP_WAIT_SECONDS",
    "ModelHolder",
    "ModelInfo",
    "ReloadRefused",
    "Reloader",
    "Served",
    "check_bundle",
    "pick_canaries",
    "warm_up",
]

log = logging.getLogger("qpr.serve")

# Loads of one token that may fail for transient reasons before it is refused for good.
MAX_ATTEMPTS = 3
# How long a shutdown waits for the polling thread (Reloader.stop): SIGTERM must stop the
# service within seconds even while a registry call hangs.
STOP_WAIT_SECONDS = 1.0
# Neighbours fetched per canary: a canary may tie with exact duplicates at distance 0
# (Quora holds questions that differ only in case or punctuation), so "first" means
# "among the results tied for first".
_CANARY_K = 10
# A canary's own vector must come back at distance ~0: at most this share of the distance
# to its 10th neighbour (float32 noise is ~1e-7 of it, a wrong index gives ~1).
_CANARY_RTOL = 1e-3

# The outcomes of one check, as counted in qpr_model_reloads_total{outcome=...}.
UNCHANGED = "unchanged"
SWAPPED = "swapped"
REFUSED = "refused"
ERROR = "error"


class ReloadRefused(QPRError, RuntimeError):
    """A loaded bundle failed the canary or dimension checks (the message says how)."""


@dataclass(frozen=True)
class ModelInfo:
    """What /version, /metrics and every response say about the serving model."""

    name: str
    version: str | None
    alias: str | None
    source: str
    fingerprint: str
    loaded_at: float  # unix seconds
    questions: int
    dim: int
    nprobe: int | None
    threshold: float | None
    ef_search: int | None = None
    fusion: dict[str, float] | None = None  # BM25 fused in: dense weight α and candidates
    encoder_kernel: str = (
        "onnx"  # "folded" (qpr.retrieval.folded), "onnx-int8" (qpr.model.quantize)
    )
    query_student: bool = False  # queries through a student of the document encoder
    spelling: bool = False  # queries' unknown words corrected first (search.json)
    details: dict[str, str] = field(default_factory=dict)
    # {delta number: why it failed its check}: the deltas this bundle serves without
    failed_deltas: dict[int, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "alias": self.alias,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "loaded_at": _iso(self.loaded_at),
            "questions": self.questions,
            "dim": self.dim,
            "nprobe": self.nprobe,
            "ef_search": self.ef_search,
            "threshold": self.threshold,
            "fusion": self.fusion,
            "encoder_kernel": self.encoder_kernel,
            "query_student": self.query_student,
            "spelling": self.spelling,
            "failed_deltas": self.failed_deltas_list(),
            **self.details,
        }

    def failed_deltas_list(self) -> list[dict[str, Any]]:
        """[{"delta": number, "reason": why}] in number order: what /readyz and /version say."""
        return [{"delta": n, "reason": r} for n, r in sorted(self.failed_deltas.items())]


@dataclass(frozen=True)
class Served:
    """A bundle and its description, swapped together so they can never disagree."""

    bundle: Bundle
    info: ModelInfo


class ModelHolder:
    """The one reference requests read. Reading `current` is a single attribute load
    (atomic under the GIL, and under free-threading a plain reference read); writers
    serialise on a lock so two swaps cannot interleave with their bookkeeping."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Served | None = None

    def swap(self, new: Served) -> Served | None:
        with self._lock:
            old, self.current = self.current, new
        return old


def pick_canaries(questions_path: Path, count: int) -> list[tuple[int, str]]:
    """(question id, text) of `count` evenly spaced rows of the bundle's question table."""
    table = pq.read_table(questions_path, columns=["question_id", "text"])
    n = table.num_rows
    if n == 0 or count < 1:
        return []
    rows = np.unique(np.linspace(0, n - 1, num=min(count, n)).round().astype(np.int64))
    picked = table.take(rows)
    return list(
        zip(
            (int(q) for q in picked.column("question_id").to_pylist()),
            picked.column("text").to_pylist(),
            strict=True,
        )
    )


def _canary_neighbours(
    bundle: Bundle, canaries: list[tuple[int, str]]
) -> list[tuple[int, str, list[float], list[int]]]:
    """(question id, text, distances, question ids) of each usable canary's nearest
    questions in the dense index (`Bundle.document_neighbours`: the served fusion would let
    BM25 rank a shorter question sharing the words first); a canary whose text has no
    words for this vocabulary is left out. One call for every canary, as a student's
    bundle loads its document encoder for it."""
    try:
        found = [bundle.document_neighbours([text for _, text in canaries], _CANARY_K)]
        batches = [canaries]
    except ValueError:  # a canary with no words: each one alone, to skip only it
        found, batches = [], []
        for canary in canaries:
            try:
                found.append(bundle.document_neighbours([canary[1]], _CANARY_K))
                batches.append([canary])
            except ValueError:
                continue
    out = []
    for (distances, ids), batch in zip(found, batches, strict=True):
        for i, (qid, text) in enumerate(batch):
            kept = ids[i] >= 0
            out.append((qid, text, distances[i][kept].tolist(), ids[i][kept].tolist()))
    return out


def check_bundle(bundle: Bundle, canaries: Iterable[tuple[int, str]]) -> int:
    """Raise ReloadRefused unless every usable canary retrieves itself first.

    A canary whose text has no words for this vocabulary (ValueError from search) is
    skipped; at least one must be usable. Returns the number checked.
    """
    if bundle.size < 1:
        raise ReloadRefused("the index holds no questions")
    checked = 0
    for qid, text, distances, ids in _canary_neighbours(bundle, list(canaries)):
        checked += 1
        if not distances:
            raise ReloadRefused(f"canary question {qid} ({text!r}) retrieved nothing")
        if not all(math.isfinite(d) for d in distances):
            raise ReloadRefused(f"canary question {qid}: non-finite distances {distances[:3]}")
        tolerance = _CANARY_RTOL * max(1.0, distances[-1])
        if distances[0] > tolerance:
            raise ReloadRefused(
                f"canary question {qid} ({text!r}): nearest neighbour at distance "
                f"{distances[0]:.4g}, expected ~0 (its own vector): the index was not built "
                "by this encoder and vocabulary"
            )
        tied = [i for i, d in zip(ids, distances, strict=True) if d <= distances[0] + tolerance]
        if qid not in tied:
            raise ReloadRefused(
                f"canary question {qid} ({text!r}) did not retrieve itself first: got "
                f"question {ids[0]} at distance {distances[0]:.4g}"
            )
    if checked == 0:
        raise ReloadRefused("no canary question could be encoded: vocabulary and index disagree")
    return checked


def warm_up(bundle: Bundle, texts: list[str], k: int) -> None:
    """Run the query path on short, long and batched inputs before taking traffic."""
    searchable = []
    for text in texts:
        try:
            bundle.search(text, k=k)
        except ValueError:  # no words for this vocabulary: not usable here
            continue
        searchable.append(text)
    if not searchable:
        return
    longest = " ".join(searchable)  # reaches max_len: the largest tensor one query makes
    for text in [longest, *searchable]:
        bundle.search(text, k=k)
    bundle.search_batch(searchable, k=k)


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class _Refusal:
    token: str
    name: str
    version: str | None
    reason: str
    at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "reason": self.reason,
            "at": _iso(self.at),
        }


class Reloader:
    """Keeps `holder` serving the source's model (see the module docstring).

    load: how a directory becomes a Bundle (Bundle.load with the service's threads and
        nprobe); tests pass their own.
    on_event: called with (outcome, message) after every check that did something; the
        app counts outcomes in /metrics.
    """

    def __init__(
        self,
        source: BundleSource,
        holder: ModelHolder,
        *,
        load: Callable[[Path], Bundle],
        canaries: int = 5,
        warmup_k: int = 10,
        poll_seconds: float = 30.0,
        retry_max_seconds: float = 60.0,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self.source = source
        self.holder = holder
        self._load = load
        self._canaries = canaries
        self._warmup_k = warmup_k
        self.poll_seconds = poll_seconds
        self.retry_max_seconds = retry_max_seconds
        self.first_check = threading.Event()  # set once the first check is done, either way
        self.source_down: str | None = None  # the source's error while it fails, else None
        self._failures = 0  # checks in a row that left the source failing or nothing served
        self._on_event = on_event or (lambda outcome, message: None)
        self._check_lock = threading.Lock()  # one check at a time (poller vs manual)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # state shown by /version
        self._settled_token: str | None = None  # served, or refused for good
        self._attempts: dict[str, int] = {}
        self.checks = 0
        self.swaps = 0
        self.refused = 0
        self.errors = 0
        self.last_check_at: float | None = None
        self.last_refusal: _Refusal | None = None
        self.last_error: str | None = None

    # -- one check ------------------------------------------------------------------------

    def check(self) -> str:
        """Poll once; load, check and swap when the source changed. Returns the outcome."""
        with self._check_lock:
            self.checks += 1
            self.last_check_at = time.time()
            try:
                candidate = self.source.poll()
            except SourceError as exc:
                return self._source_failed(str(exc))
            except Exception as exc:  # a poll must never kill the poller
                log.exception("polling %s failed", self.source.description)
                return self._source_failed(f"polling {self.source.description} failed: {exc}")
            self.source_down = None
            if candidate.token == self._settled_token:
                return UNCHANGED
            return self._try(candidate)

    def _source_failed(self, message: str) -> str:
        self.source_down = message
        outcome = self._error(message)
        fallback = getattr(self.source, "fallback", None)
        if self.holder.current is not None or fallback is None:
            return outcome
        try:
            kept = fallback()
        except Exception:  # the cache is a convenience: never let it break the check
            log.exception("reading the kept bundles of %s failed", self.source.description)
            return outcome
        if kept is None or kept.token == self._settled_token:
            return outcome
        log.warning("%s; starting from the kept %s", message, _label(kept))
        return self._try(kept)

    def _try(self, candidate: Candidate) -> str:
        label = _label(candidate)
        started = time.perf_counter()
        try:
            with self.source.materialize(candidate) as path:
                bundle = self._load(path)
                canaries = pick_canaries(path / QUESTIONS_FILE, self._canaries)
                expected = candidate.expected_fingerprint
                if expected and expected != bundle.fingerprint:
                    raise ReloadRefused(
                        f"the downloaded bundle's fingerprint {bundle.fingerprint[:12]}… "
                        f"differs from the registered {expected[:12]}…: corrupt or incomplete "
                        "files"
                    )
                checked = check_bundle(bundle, canaries)
                warm_up(bundle, [text for _, text in canaries], self._warmup_k)
                self._keep(candidate, path)
        except (BundleError, ReloadRefused) as exc:
            return self._refuse(candidate, str(exc))
        except Exception as exc:
            # Download or I/O trouble may pass; a token that keeps failing is refused.
            attempts = self._attempts.get(candidate.token, 0) + 1
            self._attempts = {candidate.token: attempts}
            log.warning(
                "loading %s failed (attempt %d of %d)", label, attempts, MAX_ATTEMPTS, exc_info=True
            )
            if attempts >= MAX_ATTEMPTS:
                return self._refuse(candidate, f"{type(exc).__name__}: {exc}")
            return self._error(f"loading {label} failed: {type(exc).__name__}: {exc}")

        current = self.holder.current
        info = ModelInfo(
            name=candidate.name,
            version=candidate.version,
            alias=candidate.alias,
            source=self.source.description,
            fingerprint=bundle.fingerprint,
            loaded_at=time.time(),
            questions=bundle.size,
            dim=bundle.dim,
            nprobe=bundle.nprobe,
            ef_search=bundle.ef_search,
            threshold=bundle.threshold,
            fusion=bundle.fusion,
            encoder_kernel=bundle.encoder_kernel,
            query_student=bundle.asymmetric,
            spelling=bundle.search_config.spelling,
            details=dict(candidate.details),
            failed_deltas=bundle.failed_deltas,
        )
        self._settled_token = candidate.token
        self._attempts = {}
        if current is not None and _same(current.info, info):
            # Touched but byte-identical files (same fingerprint, same version): keep the
            # warm bundle that is serving; nothing a client could notice changed.
            log.info("%s unchanged (fingerprint %s)", label, info.fingerprint[:12])
            return UNCHANGED
        self.holder.swap(Served(bundle=bundle, info=info))
        self.swaps += 1
        seconds = time.perf_counter() - started
        previous = "nothing" if current is None else _label_info(current.info)
        message = (
            f"serving {label} (fingerprint {info.fingerprint[:12]}, {info.questions:,} "
            f"questions, dim {info.dim}; {checked} canaries passed; loaded in {seconds:.2f} s), "
            f"replacing {previous}"
        )
        if info.failed_deltas:
            left_out = ", ".join(str(n) for n in sorted(info.failed_deltas))
            message += f"; without delta(s) {left_out}, which fail their check"
            log.warning(message)
        else:
            log.info(message)
        self._on_event(SWAPPED, message)
        return SWAPPED

    def _keep(self, candidate: Candidate, path: Path) -> None:
        keep = getattr(self.source, "keep", None)
        if keep is None:
            return
        try:
            keep(candidate, path)
        except Exception:  # a full disk must not stop a good bundle from serving
            log.warning("could not keep a copy of %s", _label(candidate), exc_info=True)

    def _refuse(self, candidate: Candidate, reason: str) -> str:
        self._settled_token = candidate.token
        self._attempts = {}
        self.refused += 1
        self.last_refusal = _Refusal(
            token=candidate.token,
            name=candidate.name,
            version=candidate.version,
            reason=reason,
            at=time.time(),
        )
        current = self.holder.current
        keeping = (
            "no model yet" if current is None else f"still serving {_label_info(current.info)}"
        )
        message = f"refused {_label(candidate)}: {reason}; {keeping}"
        log.error(message)
        self._on_event(REFUSED, message)
        return REFUSED

    def _error(self, message: str) -> str:
        self.errors += 1
        self.last_error = message
        log.warning(message)
        self._on_event(ERROR, message)
        return ERROR

    # -- polling thread -------------------------------------------------------------------

    def start(self) -> None:
        """Check now, then every `poll_seconds`, in a daemon thread. With poll_seconds 0 the
        thread ends once a model serves."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="qpr-reloader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_WAIT_SECONDS) -> None:
        """Ask the polling thread to end; wait at most `timeout` seconds for it. A thread
        inside a source call (a registry that accepts and never answers) is not waited
        for: it is a daemon, it holds nothing the process needs at exit, and a shutdown
        must not last as long as the call's own timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        self._check_and_count()
        self.first_check.set()
        if self.holder.current is None:
            log.error("no model could be loaded from %s; not ready", self.source.description)
        while not (self.poll_seconds <= 0 and self.holder.current is not None):
            if self._stop.wait(self.next_wait()):
                return
            self._check_and_count()

    def _check_and_count(self) -> None:
        try:
            outcome = self.check()
        except Exception:  # keep polling whatever happens; the log has the trace
            log.exception("reload check failed")
            outcome = ERROR
        failing = outcome == ERROR or self.holder.current is None
        self._failures = self._failures + 1 if failing else 0

    def next_wait(self) -> float:
        """Seconds to the next check: `poll_seconds`, or while failing 1, 2, 4, ... up to
        `retry_max_seconds` (a source that is down is not hammered, nor given up on). A
        source without backoff (a local folder) keeps `poll_seconds` while it fails; with
        poll_seconds 0 (no polling once served) it backs off until a model serves."""
        if self._failures == 0:
            return self.poll_seconds
        if not getattr(self.source, "backoff", True) and self.poll_seconds > 0:
            return self.poll_seconds
        return min(self.retry_max_seconds, 2.0 ** min(self._failures - 1, 30))

    # -- reporting ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "source": self.source.description,
            "poll_seconds": self.poll_seconds,
            "checks": self.checks,
            "swaps": self.swaps,
            "refused": self.refused,
            "errors": self.errors,
            "last_check_at": _iso(self.last_check_at),
            "last_refused": None if self.last_refusal is None else self.last_refusal.as_dict(),
            "last_error": self.last_error,
            "source_unreachable": self.source_down,
        }


def _label(candidate: Candidate) -> str:
    if candidate.version is None:
        return candidate.name
    alias = f"@{candidate.alias}" if candidate.alias else ""
    return f"{candidate.name} version {candidate.version}{alias}"


def _label_info(info: ModelInfo) -> str:
    if info.version is None:
        return f"{info.name} {info.fingerprint[:12]}"
    return f"{info.name} version {info.version} ({info.fingerprint[:12]})"


def _same(a: ModelInfo, b: ModelInfo) -> bool:
    return (a.fingerprint, a.name, a.version, a.alias) == (
        b.fingerprint,
        b.name,
        b.version,
        b.alias,
    )

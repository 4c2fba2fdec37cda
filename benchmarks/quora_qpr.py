"""Quora QPR benchmark: the paper's loss comparison (Bonadiman et al. 2019, Tables 1, 2, 4)
on the real Quora copy, every row on the same split and the same index.

Protocol (stated again in the output):
- clusters = transitive closure of the duplicate pairs; clusters of size >= 2 split
  80/10/10 by cluster with a fixed seed;
- every question of a test cluster is a query; its relevant documents are the other
  questions of its cluster;
- the index holds every distinct question of the file (including questions in no cluster);
- each query is excluded from its own results; top 20 kept; trec_eval measures
  (success@1 / success@10 = the paper's P@1 / P@10, recip_rank = MRR, nDCG@10).

Each row trains with the pipeline's own stage functions (train → export → index →
evaluate) in its own work directory, is logged as an MLflow run, and is appended to
docs/results/quora.json as soon as it finishes; the Markdown table is rewritten after each
row. Rows already in the JSON with the same configuration are skipped, so an interrupted
benchmark continues where it stopped (`--fresh` starts over from nothing: the work folder's
clusters and checkpoints are deleted too).

    python benchmarks/quora_qpr.py                      # every row
    python benchmarks/quora_qpr.py --rows main          # losses and baselines only
    python benchmarks/quora_qpr.py --rows eps,batch --sweep-epochs 3
    python benchmarks/quora_qpr.py --rows models        # MiniLM, AM-Softmax
    python benchmarks/quora_qpr.py --rows long --long-epochs 12   # the default, trained further
    # two row groups side by side, then one table:
    python benchmarks/quora_qpr.py --rows models --out /tmp/models-rows
    python benchmarks/quora_qpr.py --rows main,models --merge /tmp/models-rows/quora.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
MEASURES = ("success_1", "success_10", "recip_rank", "ndcg_cut_10")

# Seed 003, Tables 1, 2 and 4 (Quora test split; P@1, P@10, MRR).
PAPER: dict[str, tuple[float, float, float]] = {
    "SDML (ε 0.3, N 512)": (0.6043, 0.8179, 0.6789),
    "TL(Rand) SSD": (0.5507, 0.7641, 0.6265),
    "TL(Rand) EUC": (0.4641, 0.6523, 0.5297),
}

# SDML whose smoothing mass follows all-MiniLM-L6-v2's similarities (train.prior: teacher).
TEACHER_PRIOR = {
    "loss": "sdml",
    "smoothing": 0.5,
    "prior": "teacher",
    "teacher": {"temperature": 0.1},
    "batch_size": 512,
}
# Fine-tuning 22M parameters on 2 cores: a time budget, smaller batches and a lower
# learning rate, as usual for pretrained transformers. Unit vectors with SDML ε 0 and logit
# scale 10 (the cosine softmax MiniLM was trained with) won the GPU sweep on validation
# (docs/results/transformer_fine_tune.md). Mined negatives, which won there too, have rows
# of their own below: with its negative a pair costs half as much again.
MINILM_FINE_TUNE = {
    "loss": "sdml",
    "smoothing": 0.0,
    "scale": 10.0,
    "batch_size": 64,
    "lr": 3e-5,
    "time_budget_s": 1500,
    "max_pairs": 30_000,
    # The packaged model starts near the top of the trainer's validation (MRR ~0.985 among
    # the validation questions): the epoch kept is the best by MRR, not by a saturated AUC.
    "monitor": "val_mrr",
}
MINILM_MINED = {**MINILM_FINE_TUNE, "hard_negatives": {"mine": True, "skip": 0, "window": 10}}
MINILM_MINED_60K = {**MINILM_MINED, "time_budget_s": 3000, "max_pairs": 60_000}
# Negatives that are not paraphrases in disguise: about half of the packaged model's wrong
# first hits are unlabelled paraphrases (docs/results/label_audit.json), so the nearest 3
# are skipped and the negative drawn from ranks 4 to 13.
MINILM_MINED_SKIP3 = {**MINILM_FINE_TUNE, "hard_negatives": {"mine": True, "skip": 3, "window": 10}}


# Query students of the packaged MiniLM (the `student` section), stopped by epochs and
# early stopping. The measured rows ran under time budgets, since removed: the static one
# stopped by patience after 4 epochs, the CNN one was cut in its 5th, the 2-layer one after
# 16 % of its first (docs/models.md).
STUDENT_STATIC = {"enabled": True, "kind": "static"}
STUDENT_CNN = {"enabled": True, "kind": "cnn", "max_epochs": 5}
STUDENT_2L = {
    "enabled": True,
    "kind": "transformer",
    "layers": 2,
    "lr": 5e-5,
    "batch_size": 64,
    "max_epochs": 1,
}
# The same student trained on (each resumed from the row before it).
STUDENT_2L_3 = {**STUDENT_2L, "max_epochs": 3}
STUDENT_2L_5 = {**STUDENT_2L, "max_epochs": 5}


def minilm_fused(int8_queries: bool = False) -> dict[str, dict[str, Any]]:
    """The other sections' overrides of a MiniLM row with BM25 fused in (unit vectors,
    ONNX batches of 64), queries encoded in int8 or float32."""
    index: dict[str, Any] = {"encode_batch_size": 64, "lexical": {"enabled": True}}
    if int8_queries:
        index["query_encoder"] = "int8"
    return {"model": {"encoder": "transformer", "normalize": True}, "index": index}


# name → (group, training overrides[, other sections' overrides]). Sweep rows get
# --sweep-epochs epochs; "models" rows (other encoders and losses) their own budget.
ROWS: dict[str, tuple] = {
    "SDML (ε 0.3, N 512)": ("main", {"loss": "sdml", "smoothing": 0.3, "batch_size": 512}),
    "CE (ε 0)": ("main", {"loss": "sdml", "smoothing": 0.0, "batch_size": 512}),
    "TL(Rand) EUC": (
        "main",
        {"loss": "triplet", "distance": "euclidean", "negatives": "random", "batch_size": 512},
    ),
    "TL(Rand) SSD": (
        "main",
        {"loss": "triplet", "distance": "squared", "negatives": "random", "batch_size": 512},
    ),
    "TL(Hard) SSD": (
        "main",
        {"loss": "triplet", "distance": "squared", "negatives": "hard", "batch_size": 512},
    ),
    **{
        f"sweep ε {eps}": ("eps", {"loss": "sdml", "smoothing": eps, "batch_size": 512})
        for eps in (0.0, 0.1, 0.2, 0.3, 0.4)
    },
    **{
        f"sweep N {n}": ("batch", {"loss": "sdml", "smoothing": 0.3, "batch_size": n})
        for n in (32, 64, 128, 256, 512, 1024)
    },
    # Its "untrained" baseline is the packaged all-MiniLM-L6-v2 off the shelf.
    "MiniLM fine-tuned, SDML": (
        "models",
        MINILM_FINE_TUNE,
        # batches of 64 encode this encoder 2.6x faster than the CNN's 1024 (docs/models.md)
        {
            "model": {"encoder": "transformer", "normalize": True},
            "index": {"encode_batch_size": 64},
        },
    ),
    # 4,096 of the 36.5k classes scored a step (Partial FC): the full softmax made this
    # row train at 325 pairs/s against SDML's 1,700-2,000 (docs/models.md).
    "CNN + AM-Softmax (m 0.35, s 30, 4,096 sampled classes)": (
        "models",
        {
            "loss": "amsoftmax",
            "am_margin": 0.35,
            "am_scale": 30.0,
            "am_sampled_classes": 4096,
            "batch_size": 512,
        },
        {"model": {"normalize": True}},
    ),
    # The 1 ms query path: FAISS time grows with D (docs/results/embedding_size.md).
    "SDML, D 128": (
        "models",
        {"loss": "sdml", "smoothing": 0.3, "batch_size": 512},
        {"model": {"output_dim": 128}},
    ),
    # The paper's closing proposal: the smoothing mass follows all-MiniLM-L6-v2's
    # similarities over the batch instead of spreading uniformly (ε and τ: the best of
    # short budgeted runs on the validation split, see docs/models.md).
    "SDML + MiniLM prior (ε 0.5, τ 0.1), D 128": (
        "models",
        TEACHER_PRIOR,
        {"model": {"output_dim": 128}},
    ),
    # BM25 fused with the encoder's ranking, α chosen on validation (index.lexical); the
    # training is the named row's own (its checkpoints are reused, not trained again).
    "SDML (ε 0.3, N 512) + BM25 fusion": (
        "models",
        {"loss": "sdml", "smoothing": 0.3, "batch_size": 512},
        {"index": {"lexical": {"enabled": True}}},
    ),
    "SDML, D 128 + BM25 fusion": (
        "models",
        {"loss": "sdml", "smoothing": 0.3, "batch_size": 512},
        {"model": {"output_dim": 128}, "index": {"lexical": {"enabled": True}}},
    ),
    "SDML + MiniLM prior (ε 0.5, τ 0.1), D 128 + BM25 fusion": (
        "models",
        TEACHER_PRIOR,
        {"model": {"output_dim": 128}, "index": {"lexical": {"enabled": True}}},
    ),
    # The default configuration (params.yaml: BM25 with Snowball stems, k1 0.9; epochs
    # kept by validation MRR) trained further: the 4-epoch row's best epoch was its last.
    # It resumes from that row's checkpoints; early stopping (patience) still applies.
    "SDML (ε 0.3, N 512) + BM25 fusion, up to 12 epochs": (
        "long",
        {"loss": "sdml", "smoothing": 0.3, "batch_size": 512, "monitor": "val_mrr"},
        {"index": {"lexical": {"enabled": True}}},
    ),
    # The fine-tuned MiniLM with the default BM25 (stems, k1 0.9) fused in: its training is
    # the "MiniLM fine-tuned, SDML" row's (checkpoints reused, nothing trained again).
    "MiniLM fine-tuned, SDML + BM25 fusion": (
        "transformer-fusion",
        MINILM_FINE_TUNE,
        minilm_fused(),
    ),
    # The GPU sweep's winner on 2 cores: one mined negative per pair (ranks 1-10 of the
    # packaged model), the same 1,500 s budget; a pair then costs half as much again.
    "MiniLM fine-tuned, SDML, mined negatives + BM25 fusion": (
        "transformer-fusion",
        MINILM_MINED,
        minilm_fused(),
    ),
    # That model served with int8 queries (qpr.model.quantize): the transformer setting to use.
    "MiniLM fine-tuned, SDML, mined negatives + BM25 fusion, int8 queries": (
        "transformer-fusion",
        MINILM_MINED,
        minilm_fused(int8_queries=True),
    ),
    # The mined-negatives recipe with twice the budget and twice the pairs: one pass over
    # 60k of the 94k training pairs (about 50 minutes of training on 2 cores).
    "MiniLM fine-tuned, SDML, mined negatives, 60k pairs + BM25 fusion, int8 queries": (
        "transformer-fusion",
        MINILM_MINED_60K,
        minilm_fused(int8_queries=True),
    ),
    # The 30k-pair recipe, its negatives drawn past the nearest 3 (MINILM_MINED_SKIP3).
    "MiniLM fine-tuned, SDML, mined negatives past the nearest 3 + BM25 fusion, int8 queries": (
        "transformer-fusion",
        MINILM_MINED_SKIP3,
        minilm_fused(int8_queries=True),
    ),
    # That model with float32 queries, beside its int8 row (the same index vectors).
    "MiniLM fine-tuned, SDML, mined negatives, 60k pairs + BM25 fusion": (
        "transformer-fusion",
        MINILM_MINED_60K,
        minilm_fused(),
    ),
    # The same model and index; queries encoded with int8 matrix products (qpr.model.quantize).
    "MiniLM fine-tuned, SDML + BM25 fusion, int8 queries": (
        "transformer-fusion",
        MINILM_FINE_TUNE,
        minilm_fused(int8_queries=True),
    ),
    # The document encoder of the query students: the packaged all-MiniLM-L6-v2, not
    # trained (train.max_epochs 0), with BM25 fused in.
    "MiniLM off the shelf + BM25 fusion": ("students", {}, minilm_fused()),
    # Query students of that document encoder (qpr.pipeline.student): the index keeps
    # MiniLM's vectors, queries go through the student. Their "dense" figures in the fusion
    # table are the student alone.
    "static student of MiniLM + BM25 fusion": (
        "students",
        {},
        {**minilm_fused(), "student": STUDENT_STATIC},
    ),
    # MiniLM's two lower layers, fine-tuned into the 6-layer model's space, int8 queries.
    "2-layer MiniLM student of MiniLM + BM25 fusion": (
        "students",
        {},
        {
            **minilm_fused(),
            "student": STUDENT_2L,
        },
    ),
    "2-layer MiniLM student of MiniLM, 3 epochs + BM25 fusion": (
        "students",
        {},
        {**minilm_fused(), "student": STUDENT_2L_3},
    ),
    "2-layer MiniLM student of MiniLM, 5 epochs + BM25 fusion": (
        "students",
        {},
        {**minilm_fused(), "student": STUDENT_2L_5},
    ),
    "CNN student of MiniLM + BM25 fusion": (
        "students",
        {},
        {**minilm_fused(), "student": STUDENT_CNN},
    ),
    # Each student alone (no BM25): the fused row's student, reused, not trained again.
    **{
        name.replace(" + BM25 fusion", " alone"): (
            "students-alone",
            {},
            {
                "model": {"encoder": "transformer", "normalize": True},
                "index": {"encode_batch_size": 64, "lexical": {"enabled": False}},
                "student": student,
            },
        )
        for name, student in (
            ("static student of MiniLM + BM25 fusion", STUDENT_STATIC),
            ("2-layer MiniLM student of MiniLM + BM25 fusion", STUDENT_2L),
            ("CNN student of MiniLM + BM25 fusion", STUDENT_CNN),
        )
    },
}
TRAINED_AS = {
    "static student of MiniLM alone": "static student of MiniLM + BM25 fusion",
    "2-layer MiniLM student of MiniLM alone": "2-layer MiniLM student of MiniLM + BM25 fusion",
    "CNN student of MiniLM alone": "CNN student of MiniLM + BM25 fusion",
    "static student of MiniLM + BM25 fusion": "MiniLM off the shelf + BM25 fusion",
    "2-layer MiniLM student of MiniLM + BM25 fusion": "MiniLM off the shelf + BM25 fusion",
    "2-layer MiniLM student of MiniLM, 3 epochs + BM25 fusion": (
        "2-layer MiniLM student of MiniLM + BM25 fusion"
    ),
    "2-layer MiniLM student of MiniLM, 5 epochs + BM25 fusion": (
        "2-layer MiniLM student of MiniLM, 3 epochs + BM25 fusion"
    ),
    "CNN student of MiniLM + BM25 fusion": "MiniLM off the shelf + BM25 fusion",
    "MiniLM fine-tuned, SDML + BM25 fusion": "MiniLM fine-tuned, SDML",
    "MiniLM fine-tuned, SDML + BM25 fusion, int8 queries": "MiniLM fine-tuned, SDML",
    "MiniLM fine-tuned, SDML, mined negatives + BM25 fusion, int8 queries": (
        "MiniLM fine-tuned, SDML, mined negatives + BM25 fusion"
    ),
    "MiniLM fine-tuned, SDML, mined negatives, 60k pairs + BM25 fusion": (
        "MiniLM fine-tuned, SDML, mined negatives, 60k pairs + BM25 fusion, int8 queries"
    ),
    "SDML (ε 0.3, N 512) + BM25 fusion": "SDML (ε 0.3, N 512)",
    "SDML (ε 0.3, N 512) + BM25 fusion, up to 12 epochs": "SDML (ε 0.3, N 512) + BM25 fusion",
    "SDML, D 128 + BM25 fusion": "SDML, D 128",
    "SDML + MiniLM prior (ε 0.5, τ 0.1), D 128 + BM25 fusion": (
        "SDML + MiniLM prior (ε 0.5, τ 0.1), D 128"
    ),
}
STUDENTS = [name for name, (group, *_) in ROWS.items() if group.startswith("students")]
# Rows that measure the untrained encoder as a baseline beside their own figures.
UNTRAINED_TOO = {"MiniLM fine-tuned, SDML"}
# Rows with their own baselines: the off-the-shelf MiniLM is measured by the row that
# trained it (encoding the index once more costs 11 minutes).
OWN_BASELINES = {
    "MiniLM off the shelf + BM25 fusion": ["bm25"],
    "static student of MiniLM + BM25 fusion": [],
    "2-layer MiniLM student of MiniLM + BM25 fusion": [],
    "CNN student of MiniLM + BM25 fusion": [],
    "static student of MiniLM alone": [],
    "2-layer MiniLM student of MiniLM alone": [],
    "CNN student of MiniLM alone": [],
    "MiniLM fine-tuned, SDML + BM25 fusion": ["bm25"],
    "MiniLM fine-tuned, SDML + BM25 fusion, int8 queries": [],
    "MiniLM fine-tuned, SDML, mined negatives + BM25 fusion": ["bm25"],
    "MiniLM fine-tuned, SDML, mined negatives + BM25 fusion, int8 queries": [],
    "MiniLM fine-tuned, SDML, mined negatives, 60k pairs + BM25 fusion, int8 queries": ["bm25"],
    "MiniLM fine-tuned, SDML, mined negatives, 60k pairs + BM25 fusion": [],
    "MiniLM fine-tuned, SDML, mined negatives past the nearest 3 + BM25 fusion, int8 queries": [
        "bm25"
    ],
}


def indexes_used(results: dict[str, Any]) -> str:
    """'HNSW32,Flat efSearch 256: 23 rows; ...' over the rows measured so far."""
    counts: dict[str, int] = {}
    for row in results.get("rows", {}).values():
        index = row.get("config", {}).get("index", {})
        factory = index.get("factory", "?")
        knob = (
            f"efSearch {index.get('ef_search')}"
            if "HNSW" in factory
            else f"nprobe {index.get('nprobe')}"
        )
        counts[f"`{factory}` {knob}"] = counts.get(f"`{factory}` {knob}", 0) + 1
    return "; ".join(f"{name}: {n} rows" for name, n in counts.items()) or "none yet"


def base_settings(data: Path, seed: int):
    import yaml

    from qpr.config import settings_from_dict

    # The paper's system: params.yaml with model.encoder cnn, so its `auto` keys take the
    # CNN's values (qpr.config.FAMILY_DEFAULTS); the product default has rows of its own.
    tree = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    tree["model"]["encoder"] = "cnn"
    raw = settings_from_dict(tree).model_dump(mode="json")
    raw["seed"] = seed
    raw["data"]["source"] = "quora"
    raw["data"]["path"] = str(data)
    raw["mlflow"]["experiment"] = "qpr-quora-benchmark"
    # The paper's system: rows differ from it only by their own overrides (params.yaml's
    # defaults move on: D 128, BM25 fused in). It ranks by the encoder alone, 300 dims.
    raw["index"]["lexical"]["enabled"] = False
    raw["model"]["output_dim"] = 300
    raw["train"]["monitor"] = "val_auc"  # the paper's rows stop on ROC AUC
    # Rows were measured before spelling correction existed; one that wants it says so.
    raw["index"]["spelling"] = False
    return raw


def with_overrides(
    raw: dict,
    train: dict[str, Any],
    max_epochs: int,
    baselines: list[str],
    extra: dict[str, dict[str, Any]] | None = None,
):
    from qpr.config import settings_from_dict

    tree = json.loads(json.dumps(raw))
    tree["train"].update(train)
    for section, values in (extra or {}).items():
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(tree[section].get(key), dict):
                tree[section][key] = {**tree[section][key], **value}
            else:
                tree[section][key] = value
    tree["train"]["max_epochs"] = max_epochs
    tree["evaluate"]["baselines"] = baselines
    tree["evaluate"]["min_success_1"] = 0.0  # a benchmark row reports, it does not gate
    return settings_from_dict(tree)


def reindex_row(settings, row_dir: Path, done: dict, log: Callable[[str], None]) -> dict:
    """index → evaluate again with a trained row's own models (the index settings changed,
    the training did not): the row's training figures are kept."""
    from qpr.paths import ProjectPaths
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.index import run_index

    paths = ProjectPaths(row_dir)
    index = run_index(settings, paths, log=log)
    evaluation = run_evaluate(settings, paths, log=log)
    return {**done, "index": index, "evaluate": evaluation, "reindexed": True}


def row_dir_of(rows_dir: Path, name: str) -> Path:
    return rows_dir / name.replace(" ", "_").replace("/", "-")


def reuse_training(rows_dir: Path, name: str, log: Callable[[str], None]) -> None:
    """A row trained like another (TRAINED_AS) starts from that row's checkpoints: the
    train stage resumes after its last epoch, so nothing is trained twice. The training
    fingerprint in the checkpoint still has to match, or the stage trains from scratch.
    The other row's encoding of the index questions comes along: the index stage reuses it
    when the exported encoder is the same file (qpr.pipeline.index), else encodes again."""
    source = TRAINED_AS.get(name)
    if source is None:
        return
    for part, marker, what in (
        ("artifacts/train", "checkpoints/last.pt", "training checkpoints"),
        ("artifacts/index", "vectors/*.npy", "index vectors"),
        ("models/student", "query_encoder.onnx", "query student"),
        # A student trained further resumes after the other row's last epoch.
        ("artifacts/student", "checkpoints/last.pt", "student checkpoints"),
    ):
        src = row_dir_of(rows_dir, source) / part
        dst = row_dir_of(rows_dir, name) / part
        if any(src.glob(marker)) and not dst.exists():
            shutil.copytree(src, dst)
            log(f"{name}: {what} of {source!r} copied")


def reused_student(settings, paths, log: Callable[[str], None]) -> dict | None:
    """The metrics of a query student copied from the row trained like this one, when it
    was trained with these settings for this document encoder; else None (train it)."""
    from qpr.artifacts import STUDENT_FILE, STUDENT_OF
    from qpr.io import file_sha256
    from qpr.retrieval.encoders import load_session

    path = paths.models_dir / STUDENT_FILE
    if not settings.student.enabled or not path.is_file():
        return None
    saved = json.loads((path.parent / "student.json").read_text())
    metadata = load_session(path).get_modelmeta().custom_metadata_map
    if saved.get("config") != settings.student.model_dump(mode="json") or metadata.get(
        STUDENT_OF
    ) != file_sha256(paths.encoder_onnx):
        return None
    log(f"query student reused from {path} (same settings, same document encoder)")
    return saved.get("metrics", {"enabled": 1, "kind": settings.student.kind})


def query_latency(models_dir: Path, questions: list[str]) -> dict[str, float]:
    """Single-question search as the service runs it (tokenise + encode + FAISS, one
    thread each; a CNN encoder folded into lookup tables, as the service loads it):
    p50 / p99 in ms over real questions, and which kernel encoded them."""
    import statistics

    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.dense import faiss_threads

    load_before = os.getloadavg()
    with faiss_threads(1):
        bundle = Bundle.load(models_dir, threads=1, fold_encoder=True)
        for question in questions[:50]:  # warm-up
            bundle.search(question, k=10)
        times = []
        for question in questions[50:550]:
            t0 = time.perf_counter()
            bundle.search(question, k=10)
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times) * 1e3, 3),
        "p99_ms": round(times[int(0.99 * (len(times) - 1))] * 1e3, 3),
        "questions": len(times),
        "kernel": bundle.encoder_kernel,
        "asymmetric": bundle.asymmetric,
        # The machine is shared: a p50 means little without the load it was taken at.
        "load_avg": [list(load_before), list(os.getloadavg())],
    }


def project_row(root: Path, cluster_dir: Path) -> dict[str, Any]:
    """A row of a project built by the pipeline itself: its stages' metrics files, the
    params it ran with (config.params), its bundle's latency and sizes measured here. It
    must hold this benchmark's split: the same test questions, in the same order."""
    import pandas as pd

    from qpr.config import load_settings
    from qpr.io import join_timings

    def read(name: str) -> dict[str, Any]:
        # Timings live apart from the metrics (metrics/timings/): they differ run to run.
        stable, timings = (
            json.loads(path.read_text()) if path.is_file() else {}
            for path in (
                root / "metrics" / f"{name}.json",
                root / "metrics" / "timings" / f"{name}.json",
            )
        )
        return join_timings(stable, timings)

    mine = pd.read_parquet(cluster_dir / "questions.parquet", columns=["text", "split"])
    theirs = pd.read_parquet(
        root / "artifacts" / "cluster" / "questions.parquet", columns=["text", "split"]
    )
    if not mine.equals(theirs):
        raise SystemExit(f"{root}: its clusters are not this benchmark's split")
    settings = load_settings(root / "params.yaml")
    evaluate = read("evaluate")
    train = read("train")
    test = mine.loc[mine["split"] == "test", "text"].tolist()[:550]
    return {
        "train": train,
        "student": read("student"),
        "train_wall_seconds": train.get("train_seconds", 0.0),
        "export": read("export"),
        "index": read("index"),
        "evaluate": evaluate,
        "config": {
            "params": settings.model_dump(mode="json"),
            "index": index_config(settings),
            "project": str(root),
        },
        "query_latency": query_latency(root / "models", test),
        "sizes": bundle_sizes(root / "models"),
    }


def index_config(settings) -> dict[str, Any]:
    """What decides a row's index: rows with another index are measured again."""
    cfg = settings.index
    described = {
        "factory": cfg.factory,
        "nprobe": cfg.nprobe,
        "ef_search": cfg.ef_search,
        "ef_construction": cfg.ef_construction,
    }
    if "RFlat" in cfg.factory:  # only then: rows measured before the knob existed stay valid
        described["refine_k_factor"] = cfg.refine_k_factor
    if cfg.lexical.enabled:  # only when on: rows measured before fusion existed stay valid
        described["lexical"] = cfg.lexical.model_dump(mode="json")
    return described


def run_row(settings, row_dir: Path, cluster_dir: Path, log: Callable[[str], None]) -> dict:
    """train → export → index → evaluate in `row_dir`, on the shared cluster outputs."""
    from qpr.paths import ProjectPaths
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.student import run_student
    from qpr.pipeline.train import run_train

    paths = ProjectPaths(row_dir)
    paths.cluster_dir.parent.mkdir(parents=True, exist_ok=True)
    if not paths.cluster_dir.exists():
        paths.cluster_dir.symlink_to(cluster_dir, target_is_directory=True)
    started = time.perf_counter()

    def on_epoch(record: dict[str, Any]) -> None:
        log(
            f"epoch {record['epoch']}: loss {record['train_loss']:.4f}, val AUC "
            f"{record['val_auc']:.4f}, val MRR {record['val_mrr']:.4f}, "
            f"{record['pairs_per_s']:.0f} pairs/s"
        )

    train = run_train(settings, paths, on_epoch=on_epoch, progress=False, log=log)
    train_seconds = time.perf_counter() - started
    export = run_export(settings, paths, log=log)
    index = run_index(settings, paths, log=log)
    student = reused_student(settings, paths, log) or run_student(settings, paths, log=log)
    evaluation = run_evaluate(settings, paths, log=log)
    return {
        "train": train.metrics,
        "student": student,
        "train_wall_seconds": train_seconds,
        "export": export,
        "index": index,
        "evaluate": evaluation,
    }


def table(results: dict[str, Any], protocol: dict[str, Any]) -> str:
    from qpr.retrieval.bm25 import describe_bm25

    header = (
        "| row | P@1 | P@10 | MRR | nDCG@10 | val MRR | epochs (best) | train min | "
        "query p50 ms | paper P@1 / P@10 / MRR |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [header]
    # Each row stores its own baselines; rows measured on the same split with the same BM25
    # settings repeat the same figures, so a baseline line is printed once, where first met.
    printed: set[str] = set()
    for name, row in results["rows"].items():
        ev = row["evaluate"]
        train = row["train"]
        paper = PAPER.get(name)
        lines.append(
            f"| {name} | {ev['success_1']:.4f} | {ev['success_10']:.4f} | {ev['recip_rank']:.4f}"
            f" | {ev['ndcg_cut_10']:.4f} | {ev['val']['recip_rank']:.4f} | "
            f"{train.get('epochs', '')} ({train.get('best_epoch', '')}) | "
            f"{train.get('train_seconds', row['train_wall_seconds']) / 60:.1f} | "
            f"{row.get('query_latency', {}).get('p50_ms', '')} | "
            + (" / ".join(f"{v:.4f}" for v in paper) if paper else "")
            + " |"
        )
        config = row.get("config", {})
        # A project's row carries its whole params; the others, their overrides.
        overrides = config.get("overrides", config.get("params", {}))
        transformer = overrides.get("model", {}).get("encoder") == "transformer"
        for baseline, values in ev.get("baselines", {}).items():
            label = baseline
            if baseline == "lexical":
                lexical = row["evaluate"].get("fusion", {}).get("lexical", {})
                label = f"BM25, {describe_bm25(lexical)} (the row's lexical half alone, α = 0)"
            if baseline == "untrained":
                unit = overrides.get("model", {}).get("normalize", False)
                label = (
                    "MiniLM off the shelf (all-MiniLM-L6-v2 as packaged"
                    + (", unit vectors" if unit else "")
                    + "; its training data includes Quora duplicates)"
                    if transformer
                    else "untrained CNN"
                )
            line = (
                f"| {label} | {values['success_1']:.4f} | {values['success_10']:.4f} | "
                f"{values['recip_rank']:.4f} | {values['ndcg_cut_10']:.4f} | | | | | |"
            )
            if line not in printed:
                printed.add(line)
                lines.append(line)
    fused = [(name, row) for name, row in results["rows"].items() if "fusion" in row["evaluate"]]
    if fused:
        lines += [
            "",
            "BM25 fusion rows: the dense weight α chosen on the validation split, and the "
            "same model ranking by its encoder alone. Each encoder is trained like the named "
            "row's: that row's checkpoints are reused when they still match the settings "
            "(else it is trained again, same settings and seed). Candidates: BM25's and "
            "the index's top max(k, N), every one scored by its exact distance, at the "
            "nprobe chosen for served recall@20 >= 0.98 (docs/pipeline.md, *Hybrid search*); rows "
            "measured before that took 100 per side, each with its own side's score:",
            "",
            "| row | trained like | BM25 words | candidates | α | val P@1 fused | "
            "val P@1 dense | test P@1 dense | test MRR dense |",
            "|---|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for name, row in fused:
            fusion = row["evaluate"]["fusion"]
            # rows measured before index.lexical had a stemmer: words as written, k1 1.5
            lexical = row.get("config", {}).get("index", {}).get("lexical", {})
            served = fusion.get("served")
            candidates = (
                f"{fusion['candidates']} per side"
                if served is None
                else f"BM25 {fusion['candidates']} + index {fusion['dense_candidates']}, "
                + "exact; "
                + "".join(
                    f"{knob} {served[knob]} "
                    for knob in ("nprobe", "ef_search")
                    if served.get(knob) is not None
                )
                + f"(served recall {served['recall']:.3f})"
            )
            lines.append(
                f"| {name} | {TRAINED_AS.get(name, name)} | {describe_bm25(lexical)} | "
                f"{candidates} | {fusion['dense_weight']:g} | "
                f"{row['evaluate']['val']['success_1']:.4f} | "
                f"{fusion['dense_val']['success_1']:.4f} | "
                f"{fusion['dense_test']['success_1']:.4f} | "
                f"{fusion['dense_test']['recip_rank']:.4f} |"
            )
    lines += students_table(results)
    missing = [name for name in results["planned"] if name not in results["rows"]]
    notes = [
        "# Quora QPR benchmark",
        "",
        f"Written by `benchmarks/quora_qpr.py` on {results['written']} "
        f"({results['machine']}); never edited by hand.",
        "",
        "## Protocol",
        "",
        *[f"- {line}" for line in protocol["text"]],
        f"- rows by index: {indexes_used(results)}",
        "",
        "## Results (test split)",
        "",
        "P@N is trec_eval's success@N (a paraphrase among the first N), as in the paper. "
        "The paper's figures are on the full Quora release (537k-question index); this copy "
        "holds about a quarter of it, so absolute figures are easier here — compare rows "
        "with each other. Sweep rows train for fewer epochs (see the epochs column). A "
        "baseline several rows measured with the same figures is listed once, after the "
        "first of them.",
        "",
        *lines,
        "",
    ]
    if missing:
        notes += [
            f"Planned, not measured (not run, or failed: see the last call): {', '.join(missing)}.",
            "",
        ]
    return "\n".join(notes + run_time_lines(results))


def students_table(results: dict[str, Any]) -> list[str]:
    """The query-student rows beside their document encoder's: quality alone and fused,
    served latency, training time and size (docs/models.md, *Query students*)."""
    teachers = {TRAINED_AS[name] for name in STUDENTS if name in TRAINED_AS}
    rows = [
        (name, row)
        for name, row in results["rows"].items()
        if row.get("student", {}).get("enabled") or name in teachers
    ]
    if not rows:
        return []
    lines = [
        "",
        "Query students (`student` section of params.yaml): the index holds the document "
        "encoder's vectors (all-MiniLM-L6-v2 as packaged), queries go through the student. "
        "Fused: BM25 fused in, α chosen on validation. p50 / p99: one question at a time "
        "through the served bundle, 2 cores, 500 test questions. train min: the student's "
        "own training, every epoch (a row resumed from another's counts the other's too; the "
        "document encoder is not trained here). load: the 1-minute load "
        "average before and after the timing (blank: not recorded).",
        "",
        "| row | queries through | BM25 | test P@1 | P@10 | MRR | p50 ms | p99 ms | load | "
        "train min | query encoder MB | bundle MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, row in rows:
        ev, student = row["evaluate"], row.get("student", {})
        if "train_seconds" not in student:  # reused: the training row's figures
            trained = results["rows"].get(TRAINED_AS.get(name, ""), {}).get("student", {})
            student = {**trained, **student}
        latency, sizes = row.get("query_latency", {}), row.get("sizes", {})
        kind = f"{student['kind']} student" if student.get("enabled") else "MiniLM (6 layers)"
        kernel = f" ({latency['kernel']})" if "kernel" in latency else ""
        load = " → ".join(f"{avg[0]:.1f}" for avg in latency.get("load_avg", []))
        lines.append(
            f"| {name} | {kind}{kernel} | {'fused' if 'fusion' in ev else 'no'} | "
            f"{ev['success_1']:.4f} | {ev['success_10']:.4f} | {ev['recip_rank']:.4f} | "
            f"{latency.get('p50_ms', '')} | {latency.get('p99_ms', '')} | {load} | "
            f"{student_seconds(name, results['rows']) / 60:.1f} | "
            f"{sizes.get('query_encoder_mb', '')} | {sizes.get('bundle_mb', '')} |"
        )
    return lines


def student_seconds(name: str, rows: dict[str, Any]) -> float:
    """The student's training seconds over its whole history: a row resumed from another
    row's student checkpoints (`reuse_training`) timed only its own epochs; a row reusing
    another's student (the `alone` rows) has that row's."""
    row = rows.get(name, {})
    student = row.get("student", {})
    source = TRAINED_AS.get(name, "")
    mine = row.get("config", {}).get("overrides", {}).get("student", {})
    earlier = rows.get(source, {}).get("config", {}).get("overrides", {}).get("student", {})
    if "train_seconds" not in student:
        return student_seconds(source, rows) if source in rows else 0.0
    # Resumed: the same student trained further (more epochs); else trained afresh or reused.
    resumed = bool(mine) and earlier.get("kind") == mine.get("kind")
    resumed = resumed and mine.get("max_epochs", 0) > earlier.get("max_epochs", 0)
    return student["train_seconds"] + (student_seconds(source, rows) if resumed else 0.0)


def bundle_sizes(models_dir: Path) -> dict[str, float]:
    """MB of the files a service loads, and of the encoder queries go through."""
    from qpr.artifacts import served_query_encoder

    files = [f for f in models_dir.rglob("*") if f.is_file() and f.suffix != ".pt"]
    return {
        "bundle_mb": round(sum(f.stat().st_size for f in files) / 1e6, 1),
        "query_encoder_mb": round(served_query_encoder(models_dir).stat().st_size / 1e6, 1),
    }


def write_outputs(out: Path, results: dict[str, Any], protocol: dict[str, Any]) -> None:
    """quora.json and quora.md in `out`, rewritten whole (after every row, so an interrupted
    call keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "quora.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "quora.md").write_text(table(results, protocol))


def run_time_lines(results: dict[str, Any]) -> list[str]:
    """The last call's wall time, and each row's (training + export + index + evaluation
    + latency), for the rows measured since the per-row time was recorded."""
    call = results.get("last_call")
    timed = [
        (n, r["row_wall_seconds"]) for n, r in results["rows"].items() if "row_wall_seconds" in r
    ]
    if not call and not timed:
        return []
    lines = ["## Run time", ""]
    if call:
        state = (
            f"finished {call['finished']}"
            if call.get("finished")
            else "interrupted or still running"
        )
        lines += [
            f"Last call, `{call['command']}`: started {call['started']}, {state}; "
            f"{len(call['measured'])} rows measured in {call['wall_seconds'] / 3600:.2f} h "
            f"({call['wall_seconds'] / 60:.0f} min), {len(call['skipped'])} already measured "
            "and skipped. A call that measures every row (a fresh `--work` folder or "
            "`--fresh`, all groups) is the time to reproduce the whole table with one command.",
            "",
        ]
        for name, why in call.get("failed", {}).items():
            lines += [f"- **failed in that call**: {name} ({why}); the next call runs it again"]
        if call.get("failed"):
            lines += [""]
    if timed:
        lines += ["| row | minutes, all steps |", "|---|---:|"]
        lines += [f"| {name} | {seconds / 60:.1f} |" for name, seconds in timed]
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--rows",
        default="main,models,eps,batch,long,transformer-fusion",
        help="groups: main, models, eps, batch, long, transformer-fusion, students, students-alone",
    )
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument(
        "--long-epochs",
        type=int,
        default=12,
        help="epochs for the `long` rows (the default configuration trained further)",
    )
    parser.add_argument("--sweep-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only this row of the chosen groups (repeatable), e.g. --only 'SDML, D 128'",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/qpr-quora-benchmark"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start from nothing: ignore the rows already in --out's quora.json and delete "
        "what earlier calls left in --work (the clusters and every row's checkpoints, "
        "vectors and models), so every row is trained again",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        help="quora.json of another benchmark process (e.g. row groups run side by side with "
        "their own --out): its rows are added to --out's and the table is rewritten; no row "
        "is run (--rows only names the rows the table lists as planned)",
    )
    parser.add_argument(
        "--project",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a row from a project the pipeline built on this Quora file with this seed "
        "(`dvc repro` or `python -m flows.stage ...`, e.g. the product default of "
        "params.yaml): its stages' metrics, its params, and the query latency of its bundle "
        "measured here; no row is trained",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="measure the chosen rows again from their trained models (index → evaluate), "
        "even when their configuration is unchanged: after a change to the served path",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="with --merge: a merged row replaces --out's row of the same name (a row "
        "measured again, e.g. under new settings); without it --out's row is kept",
    )
    args = parser.parse_args()

    from qpr import environment

    environment.apply(REPO)
    import mlflow

    from qpr.pipeline.cluster import run_cluster

    if not args.data.is_file():
        raise SystemExit(f"Quora file not found: {args.data}")
    groups = set(args.rows.split(","))
    planned = [name for name, (group, *_) in ROWS.items() if group in groups]
    if args.only:
        unknown = sorted(set(args.only) - set(ROWS))
        if unknown:
            raise SystemExit(f"no such rows: {unknown}; rows: {list(ROWS)}")
        planned = [name for name in planned if name in args.only]
    raw = base_settings(args.data, args.seed)
    json_path = args.out / "quora.json"
    results: dict[str, Any] = {"rows": {}}
    if json_path.is_file() and not args.fresh:
        results = json.loads(json_path.read_text())
    info = describe(REPO, {})
    results.update(
        {
            "machine": f"{info['cpu_model']}, {info['cpu_count']} cores",
            # rows planned by earlier calls stay listed (a call may run one group only)
            "planned": list(dict.fromkeys([*results.get("planned", []), *planned])),
            "seed": args.seed,
        }
    )

    def log(message: str) -> None:
        print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)

    work = args.work
    if args.fresh:
        # Only the folders this script makes: --work may be a folder holding other things.
        for part in ("cluster", "gates", "rows"):
            if (work / part).exists():
                shutil.rmtree(work / part)
                log(f"--fresh: removed {work / part}")
    cluster_dir = work / "cluster"
    settings0 = with_overrides(raw, {}, args.max_epochs, [])
    if not (cluster_dir / "questions.parquet").is_file():
        log("clustering the Quora pairs (transitive closure, 80/10/10 by cluster)")
        run_cluster(settings0, out_dir=cluster_dir, report_dir=work / "gates", log=log)
    protocol = {
        "text": [
            f"data: `{args.data.name}` (the partial real copy; see its README)",
            "clusters: transitive closure of duplicate pairs; size >= 2; split 80/10/10 by "
            f"cluster with seed {args.seed}",
            "queries: every test-cluster question; relevant: the other questions of its cluster",
            "index: every distinct question of the file; the query itself excluded; top 20",
            "measures: trec_eval via pytrec_eval; a query retrieving nothing scores 0",
            "training: Adam lr 0.001, early stopping on validation ROC AUC (validation MRR "
            f"where a row's config says `monitor: val_mrr`; patience "
            f"{raw['train']['patience']}), at most {args.max_epochs} epochs for the main rows, "
            f"{args.sweep_epochs} for the ε and batch-size sweeps, {args.long_epochs} for the "
            "`long` rows (resumed from the named row's checkpoints); CNN e_dim 300, window 5, "
            "300 channels, n 300; vocabulary top 50k words + 5k hash bins",
            f"index: params.yaml's `{settings0.index.factory}` ("
            + (
                f"efSearch {settings0.index.ef_search}, efConstruction "
                f"{settings0.index.ef_construction}"
                if "HNSW" in settings0.index.factory
                else f"nprobe {settings0.index.nprobe}"
            )
            + ") for the rows a run measures, their baselines beside them; each row's own "
            "index is its `config.index` in quora.json, and rows measured under earlier "
            "params keep theirs (counted in the next line)",
            "other encoders and losses (the `models` rows): the overrides in the row's "
            "`config.overrides` and `config.train` in quora.json (MiniLM: unit vectors, SDML "
            "ε 0 with logit scale 10, Adam 3e-5, batches of 64, a 1,500 s training budget on "
            "a seeded 30k-pair subset; the `60k pairs` rows 3,000 s on 60k pairs)",
            "train min: the epochs' batch time summed over the training history (kept in the "
            "checkpoints, so a resumed or reused training counts its earlier epochs)",
            "query p50 ms: one question at a time through the served bundle (tokenise + ONNX "
            "encode + FAISS, one thread each), 500 test questions",
        ]
    }
    results["protocol"] = protocol["text"]
    for other in args.merge:
        theirs = json.loads(other.read_text())
        added = [
            name for name in theirs.get("rows", {}) if args.replace or name not in results["rows"]
        ]
        results["rows"].update({name: theirs["rows"][name] for name in added})
        results["planned"] = list(dict.fromkeys([*results["planned"], *added]))
        log(f"merged {len(added)} rows from {other}: {', '.join(added) or 'none new'}")
    if args.merge:
        results["written"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        write_outputs(args.out, results, protocol)
        return  # merging only rewrites the outputs; run rows in a call without --merge
    if args.project:
        for spec in args.project:
            name, _, folder = spec.partition("=")
            results["rows"][name] = project_row(Path(folder), cluster_dir)
            results["planned"] = list(dict.fromkeys([*results["planned"], name]))
            log(f"{name}: test P@1 {results['rows'][name]['evaluate']['success_1']:.4f}")
        results["written"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        write_outputs(args.out, results, protocol)
        return
    import pandas as pd

    test = pd.read_parquet(cluster_dir / "questions.parquet", columns=["text", "split"])
    latency_questions = test.loc[test["split"] == "test", "text"].tolist()[:550]
    mlflow.set_experiment("qpr-quora-benchmark")
    # How long this call takes, row by row: with a fresh work folder (or --fresh) and every
    # group, the time to reproduce the whole table with one command.
    call_started = time.perf_counter()
    results["last_call"] = {
        "command": " ".join(["benchmarks/quora_qpr.py", *sys.argv[1:]]),
        "started": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "finished": None,
        "wall_seconds": 0.0,
        "measured": [],
        "skipped": [],
    }
    for name in planned:
        group, train, *more = ROWS[name]
        extra = more[0] if more else {}
        epochs = {
            "eps": args.sweep_epochs,
            "batch": args.sweep_epochs,
            "students": 0,
            "students-alone": 0,
        }.get(group, args.long_epochs if group == "long" else args.max_epochs)
        # The first row also measures the baselines: same queries, same index questions.
        baselines = ["bm25", "jaccard", "untrained"] if name == planned[0] else []
        if name in UNTRAINED_TOO:
            baselines = sorted({*baselines, "untrained"})
        baselines = OWN_BASELINES.get(name, baselines)
        settings = with_overrides(raw, train, epochs, baselines, extra)
        config = {
            "train": train,
            "epochs": epochs,
            "baselines": baselines,
            "index": index_config(settings),
        }
        if extra:
            config["overrides"] = extra
        done = results["rows"].get(name)
        row_dir = row_dir_of(work / "rows", name)
        row_started = time.perf_counter()
        if done and done.get("config") == config and not args.again:
            results["last_call"]["skipped"].append(name)
            if "query_latency" not in done and (row_dir / "models" / "encoder.onnx").is_file():
                done["query_latency"] = query_latency(row_dir / "models", latency_questions)
                write_outputs(args.out, results, protocol)
                log(f"{name}: query latency measured ({done['query_latency']['p50_ms']} ms)")
            log(f"{name}: already measured, skipped")
            continue
        # Same training, another index (or baselines): measure the trained model again.
        same_training = done is not None and all(
            done.get("config", {}).get(key, {}) == config.get(key, {})
            for key in ("train", "overrides", "epochs")
        )
        reindex = same_training and (row_dir / "models" / "encoder.onnx").is_file()
        try:
            with mlflow.start_run(run_name=name):
                mlflow.log_params({"row": name, **{f"train.{k}": v for k, v in train.items()}})
                mlflow.log_params({f"index.{k}": v for k, v in config["index"].items()})
                if reindex:
                    log(
                        f"{name}: trained before; indexing and evaluating again ({config['index']})"
                    )
                    row = reindex_row(settings, row_dir, done, log)
                else:
                    reuse_training(work / "rows", name, log)
                    log(f"{name}: training with {train}, up to {epochs} epochs")
                    row = run_row(settings, row_dir, cluster_dir, log)
                row["config"] = config
                row["query_latency"] = query_latency(row_dir / "models", latency_questions)
                row["sizes"] = bundle_sizes(row_dir / "models")
                mlflow.log_metric("query_p50_ms", row["query_latency"]["p50_ms"])
                ev = row["evaluate"]
                mlflow.log_metrics({m: ev[m] for m in MEASURES})
                mlflow.log_metric("train_wall_seconds", row["train_wall_seconds"])
                row["row_wall_seconds"] = time.perf_counter() - row_started
                mlflow.log_metric("row_wall_seconds", row["row_wall_seconds"])
        except Exception as err:  # one row's failure must not cost the others
            # A row that fails (a quality gate, a crash) is reported and the table goes on:
            # the call exits non-zero at the end, and the next call runs that row again.
            log(f"{name}: FAILED, {type(err).__name__}: {err}")
            traceback.print_exc()
            first_line = next(iter(str(err).splitlines()), "")
            results["last_call"].setdefault("failed", {})[name] = (
                f"{type(err).__name__}: {first_line}"
            )
            results["last_call"]["wall_seconds"] = time.perf_counter() - call_started
            write_outputs(args.out, results, protocol)
            continue
        results["last_call"]["measured"].append(name)
        results["last_call"]["wall_seconds"] = time.perf_counter() - call_started
        if json_path.is_file():  # another benchmark process may have added rows meanwhile
            on_disk = json.loads(json_path.read_text())
            results["rows"] = {**on_disk.get("rows", {}), **results["rows"]}
            results["planned"] = list(dict.fromkeys([*on_disk.get("planned", []), *planned]))
        results["rows"][name] = row
        results["written"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        write_outputs(args.out, results, protocol)
        log(
            f"{name}: test P@1 {ev['success_1']:.4f}, P@10 {ev['success_10']:.4f}, "
            f"MRR {ev['recip_rank']:.4f} ({row['train_wall_seconds'] / 60:.1f} min training, "
            f"{row['row_wall_seconds'] / 60:.1f} min in all)"
        )
    results["last_call"]["wall_seconds"] = time.perf_counter() - call_started
    results["last_call"]["finished"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    write_outputs(args.out, results, protocol)
    failed = results["last_call"].get("failed", {})
    log(
        f"{len(results['last_call']['measured'])} rows measured, "
        f"{len(results['last_call']['skipped'])} already measured, {len(failed)} failed, in "
        f"{results['last_call']['wall_seconds'] / 3600:.2f} h"
    )
    if failed:
        for name, why in failed.items():
            log(f"FAILED: {name}: {why}")
        sys.exit(1)


if __name__ == "__main__":
    main()

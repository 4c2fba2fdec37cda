#!/usr/bin/env python
"""Throughput of the QPR pipeline on this machine: training, index encoding, FAISS.

    python benchmarks/pipeline_speed.py                 # ~5-10 min on two free cores
    python benchmarks/pipeline_speed.py --quick         # smoke run (~1 min)
    python benchmarks/pipeline_speed.py --quora PATH --repeats 5 --out docs/results

What is measured (every figure is the median over `--repeats` runs, with min and max):

1. Training: pairs/s of one training step of the paper's CNN encoder (e_dim 300, window 5,
   300 channels, n 300; vocabulary = top-50k words + 5k hash bins of the training
   questions) at batch N = 512, with SDML (ε 0.3) and with the triplet loss. The step is
   the trainer's own `qpr.training.loop.train_pass` (fused Adam, both sides in one forward pass,
   loss, backward, step) on batches from `ClusterDisjointBatchSampler`, so this measures
   exactly what `train_encoder` runs, minus validation and checkpoints.
2. Index encoding: questions/s of ONNX Runtime (`qpr.model.onnx.encode`, tokenisation
   included) at batch 1, 64, 256, 1024 with 1 and 2 intra-op threads, and of the torch
   path (`qpr.training.embed.encode_texts`) at batch 1024.
3. FAISS: build time of "IVF2000,Flat" (nlist lowered on small corpora by
   `qpr.retrieval.dense.fit_factory`) with nprobe 16 for growing corpus sizes, and search time per
   query, batched (evaluation) and one query per call (the service).

Noise: the machine is shared, so configurations that are compared are interleaved inside
each repeat (SDML then triplet, every encoder setting in turn, every corpus size in turn):
a slow patch of time hits all of them alike and the ratios stay fair. Each measurement
also records the CPU cores it got (process CPU time / wall time), and the tables show
throughput per CPU-second beside the raw rate: it barely moves when other jobs take the
cores, so it is what to compare across runs. The load average at start and end is recorded.

Data: the Quora copy at ../shared/data/quora (duplicate pairs = training pairs, clusters =
transitive closure, index corpus = every distinct question). It is only read; nothing
derived from it is written except the measured numbers. When it is absent, the project's
synthetic QA-log generator is used instead, and the outputs say so.

Outputs: <out>/pipeline_speed.json (machine, versions, every repeat) and
<out>/pipeline_speed.md (tables). --quick writes to reports/benchmarks/ unless --out is
given, so a smoke run never overwrites the committed full-run results in docs/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import onnxruntime as ort
import pandas as pd
import torch

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe
from paper_cnn import ENCODER_KW, HASH_BINS, MAX_LEN, MAX_WORDS
from tqdm import tqdm

from qpr.data.clustering import components
from qpr.data.loaders import clean_logs, read_logs, read_quora
from qpr.data.synth import GENERIC_ANSWER_IDS, SynthSpec, write_logs
from qpr.io import write_text_atomic
from qpr.model.cnn import CNNEncoder
from qpr.model.losses import SDMLLoss, TripletLoss
from qpr.model.onnx import export_onnx
from qpr.retrieval.dense import (
    MIN_POINTS_PER_CENTROID,
    IndexConfig,
    build_index,
    fit_factory,
    search,
)
from qpr.retrieval.encoders import encode, load_session
from qpr.text.vocab import Vocabulary
from qpr.training.checkpoint import seed_everything
from qpr.training.embed import encode_texts
from qpr.training.encoder_step import EncodedPairs, EncoderStep
from qpr.training.loop import PROGRESS_EVERY_S, train_pass
from qpr.training.sampler import ClusterDisjointBatchSampler

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUORA = ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
DEFAULT_OUT = ROOT / "docs" / "results"
QUICK_OUT = ROOT / "reports" / "benchmarks"
NAME = "pipeline_speed"

# The machine has 2 cores; every library gets both unless a measurement sweeps threads.
THREADS = 2
SEED = 13

# params.yaml cluster.max_pairs_per_cluster: the cluster stage caps positive pairs per
# cluster. It matters for speed, not just balance: Quora's transitive closure has a cluster
# with 1,133 duplicate pairs, and a cluster-disjoint sampler needs at least as many batches
# as its largest cluster has pairs, which would shrink batches to ~100 pairs instead of 512.
MAX_PAIRS_PER_CLUSTER = 50
BATCH_SIZE = 512
LR = 1e-3
SMOOTHING = 0.3
MARGIN = 0.5
FACTORY = "IVF2000,Flat"
NPROBE = 16
TOP_K = 20
ORT_BATCHES = (1, 64, 256, 1024)
ORT_THREADS = (1, 2)
TORCH_BATCH = 1024


@dataclass(frozen=True)
class Plan:
    """How much of everything to run: the default plan or the --quick one."""

    repeats: int
    warmup_batches: int
    train_batches: int
    encode_sample: int  # questions encoded per encoder measurement
    corpus_sizes: tuple[int | None, ...]  # None: the whole index corpus
    search_queries: int  # queries of the batched search
    single_queries: int  # queries sent one per call


FULL = Plan(
    repeats=3,
    warmup_batches=3,
    train_batches=20,
    encode_sample=8192,
    corpus_sizes=(25_000, 50_000, 100_000, None),
    search_queries=2000,
    single_queries=300,
)
QUICK = Plan(
    repeats=2,
    warmup_batches=1,
    train_batches=4,
    encode_sample=2048,
    corpus_sizes=(10_000, 25_000),
    search_queries=500,
    single_queries=100,
)


# --------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------

_T0 = time.perf_counter()


def say(message: str) -> None:
    """Progress line with the elapsed time (the full run takes minutes; show it moving)."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {message}", flush=True)


@dataclass
class Measurement:
    """One measured quantity: all repeats kept, so the JSON shows the spread, not just a
    summary. `higher_is_better` tells a reader of the JSON which way is good."""

    name: str
    unit: str
    params: dict[str, Any]
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "params": self.params,
            "repeats": len(self.values),
            "values": [round(v, 6) for v in self.values],
            "median": round(self.median, 6),
            "min": round(min(self.values), 6),
            "max": round(max(self.values), 6),
            "higher_is_better": self.higher_is_better,
            **({"extra": self.extra} if self.extra else {}),
        }


class Results:
    """Measurements by key; adding to an existing key appends a repeat."""

    def __init__(self) -> None:
        self.items: dict[str, Measurement] = {}

    def add(
        self,
        key: str,
        value: float,
        *,
        unit: str,
        params: dict[str, Any] | None = None,
        higher_is_better: bool = True,
        cores: float | None = None,
        threads: int | None = None,
    ) -> Measurement:
        item = self.items.get(key)
        if item is None:
            item = Measurement(key, unit, dict(params or {}), higher_is_better=higher_is_better)
            self.items[key] = item
        item.values.append(float(value))
        if cores is not None:
            item.extra.setdefault("cores_used", []).append(round(cores, 3))
        if threads is not None:
            item.extra["threads"] = threads
        return item

    def core_share(self) -> float:
        """Median over measurements of cores used / threads asked for: ~1 when the machine
        was ours, lower when other jobs took the cores."""
        shares = [
            c / item.extra["threads"]
            for item in self.items.values()
            if "threads" in item.extra
            for c in item.extra.get("cores_used", [])
        ]
        return float(statistics.median(shares)) if shares else float("nan")

    def cores(self, key: str) -> float:
        """Median CPU cores this measurement got (nan when not recorded)."""
        used = self.items[key].extra.get("cores_used")
        return float(statistics.median(used)) if used else float("nan")

    def per_cpu(self, key: str) -> float:
        """Median of value / cores used per repeat: throughput per CPU-second. On a busy
        machine it moves far less than the raw throughput (a descheduled process does no
        work and burns no CPU), though threads spin-waiting on a busy peer still lower it."""
        item = self.items[key]
        used = item.extra.get("cores_used")
        if not used:
            return float("nan")
        return float(statistics.median(v / c for v, c in zip(item.values, used, strict=True)))

    def median(self, key: str) -> float:
        return self.items[key].median

    def ratio(self, num: str, den: str) -> float:
        """Median of the per-repeat ratios: both values of a repeat were measured side by
        side, so this cancels slow phases of a shared machine better than a ratio of
        medians would."""
        a, b = self.items[num].values, self.items[den].values
        return float(statistics.median(x / y for x, y in zip(a, b, strict=True)))


class Stopwatch:
    """`with Stopwatch() as sw: ...` then sw.seconds (wall) and sw.cores.

    cores = this process's CPU time / wall time: about the thread count when the machine
    is ours, less when other jobs take the cores. It tells a reader how contended each
    figure was (spin-waiting threads count too, so it is an upper bound on useful work).
    """

    seconds: float = float("nan")
    cores: float = float("nan")

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        self._cpu = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self.cores = (time.process_time() - self._cpu) / max(self.seconds, 1e-9)


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """Training pairs (with cluster ids for the sampler) and the index questions."""

    source: str
    description: str
    q1: list[str]
    q2: list[str]
    pair_cluster: np.ndarray
    questions: list[str]


def cap_pairs(
    q1: list[str], q2: list[str], cluster: np.ndarray, cap: int
) -> tuple[list[str], list[str], np.ndarray]:
    """At most `cap` pairs per cluster (a seeded random subset), as the cluster stage does."""
    order = np.random.default_rng(SEED).permutation(cluster.size)
    # Rank of each pair inside its cluster, in the random order: keep ranks < cap.
    by_cluster = order[np.argsort(cluster[order], kind="stable")]
    sorted_ids = cluster[by_cluster]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    rank = np.arange(sorted_ids.size) - np.repeat(starts, np.diff(np.r_[starts, sorted_ids.size]))
    keep = np.sort(by_cluster[rank < cap])
    return [q1[i] for i in keep], [q2[i] for i in keep], cluster[keep]


def load_quora(path: Path) -> Corpus:
    frame, report = read_quora(path)
    dup = frame[frame["is_duplicate"] == 1]
    # Clusters = transitive closure of the duplicate pairs, as the cluster stage builds
    # them; the sampler needs them so that no batch holds two pairs of one cluster.
    comp = components(zip(dup["qid1"].tolist(), dup["qid2"].tolist(), strict=True))
    cluster = np.array([comp[q] for q in dup["qid1"].tolist()], dtype=np.int64)
    # Index corpus = every distinct question of the file, as the cluster stage keeps them.
    texts = pd.concat(
        [
            frame[["qid1", "question1"]].set_axis(["qid", "text"], axis=1),
            frame[["qid2", "question2"]].set_axis(["qid", "text"], axis=1),
        ],
        ignore_index=True,
    ).drop_duplicates("qid")
    q1, q2, capped = cap_pairs(
        dup["question1"].tolist(), dup["question2"].tolist(), cluster, MAX_PAIRS_PER_CLUSTER
    )
    return Corpus(
        source="quora",
        description=(
            f"Quora duplicate-question pairs, {path} ({report.summary()}): "
            f"{len(dup):,} duplicate pairs in {np.unique(cluster).size:,} clusters "
            f"(transitive closure), {len(q1):,} of them used for training after capping "
            f"clusters at {MAX_PAIRS_PER_CLUSTER} pairs; index corpus = the "
            f"{len(texts):,} distinct questions"
        ),
        q1=q1,
        q2=q2,
        pair_cluster=capped,
        questions=texts["text"].tolist(),
    )


def load_synthetic(tmp: Path) -> Corpus:
    spec = SynthSpec()
    write_logs(tmp / "logs", spec)
    logs, report = clean_logs(read_logs(tmp / "logs"), min_chars=2, max_chars=400)
    # Generic answers ("yes", a number) are the incoherent clusters the pipeline drops.
    logs = logs[~logs["answer_id"].isin(GENERIC_ANSWER_IDS)]
    q1: list[str] = []
    q2: list[str] = []
    cluster: list[int] = []
    for cid, (_, group) in enumerate(logs.groupby("answer_id", sort=True)):
        distinct = list(dict.fromkeys(group["question"].tolist()))
        # A chain of consecutive distinct questions: n - 1 pairs for a cluster of n.
        for a, b in itertools.pairwise(distinct):
            q1.append(a)
            q2.append(b)
            cluster.append(cid)
    questions = list(dict.fromkeys(logs["question"].tolist()))
    q1, q2, capped = cap_pairs(q1, q2, np.asarray(cluster, dtype=np.int64), MAX_PAIRS_PER_CLUSTER)
    return Corpus(
        source="synthetic",
        description=(
            f"SYNTHETIC fallback (no Quora copy found): qpr.data.synth {spec}, "
            f"{report.summary()}; {len(q1):,} training pairs (chains of distinct questions "
            f"per answer, at most {MAX_PAIRS_PER_CLUSTER} per answer), index corpus = "
            f"{len(questions):,} distinct questions"
        ),
        q1=q1,
        q2=q2,
        pair_cluster=capped,
        questions=questions,
    )


# --------------------------------------------------------------------------------------
# 1. Training throughput
# --------------------------------------------------------------------------------------


def make_loss(name: str) -> torch.nn.Module:
    if name == "sdml":
        return SDMLLoss(smoothing=SMOOTHING)
    # The paper's best triplet setting: squared distance (SSD), random in-batch negatives.
    return TripletLoss(margin=MARGIN, distance="squared", negatives="random", seed=SEED)


def train_steps(
    encoder: torch.nn.Module,
    loss: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pairs: EncodedPairs,
    flip: torch.Tensor,
    batches: list[np.ndarray],
) -> tuple[float, int]:
    """The trainer's own inner loop over `batches`: (sum of loss × batch size, pairs)."""
    step = _PairSteps(encoder, loss, optimizer, pairs, flip)
    with tqdm(total=len(batches), disable=True) as bar:
        loss_sum, pairs_seen, _ = train_pass(
            step, batches, epoch=1, bar=bar, progress_every_s=PROGRESS_EVERY_S
        )
    return loss_sum, pairs_seen


class _PairSteps:
    """The encoder family's batch loss (qpr.training.encoder_step.EncoderStep) over pairs
    encoded here, without its data preparation and validation."""

    unit = "pairs"
    scheduler = None
    batch_loss = EncoderStep.batch_loss

    def __init__(self, encoder, loss, optimizer, pairs, flip) -> None:
        self.model, self.loss, self.optimizer = encoder, loss, optimizer
        self.pairs, self.flip = pairs, flip
        self.config = argparse.Namespace(device="cpu")


def bench_training(
    corpus: Corpus, vocab: Vocabulary, plan: Plan, results: Results
) -> torch.nn.Module:
    """pairs/s of the trainer's step for SDML and triplet; returns an encoder for export."""
    # drop_last=True: every batch holds exactly N pairs (the trainer's default, False,
    # gives N - 1 or N on the capped Quora pairs: the same speed). A cluster-disjoint
    # batch of N pairs needs N clusters; the synthetic fallback has fewer, so there the
    # sampler's own smaller batches are measured and the tables show their size.
    sampler = ClusterDisjointBatchSampler(
        corpus.pair_cluster, BATCH_SIZE, seed=SEED, drop_last=True
    )
    if len(sampler) == 0:
        sampler = ClusterDisjointBatchSampler(corpus.pair_cluster, BATCH_SIZE, seed=SEED)
        clusters = np.unique(corpus.pair_cluster).size
        say(f"only {clusters} clusters: batches smaller than {BATCH_SIZE} pairs")
    if len(sampler) == 0:
        raise SystemExit("no training pairs")
    needed = plan.warmup_batches + plan.train_batches
    batches: list[np.ndarray] = []
    epoch = 0
    while len(batches) < needed:  # small corpora: continue into the next epochs
        epoch += 1
        sampler.set_epoch(epoch)
        batches += sampler.batches()
    batches = batches[:needed]
    # Encode only the pairs these batches use (the trainer encodes all of them once before
    # the first epoch; that one-off cost is not throughput) and renumber the batches.
    used = np.unique(np.concatenate(batches))
    if epoch > 1:
        say(f"training: {len(sampler)} batches per epoch, so batches of {epoch} epochs are used")
    pairs = EncodedPairs(vocab, [corpus.q1[i] for i in used], [corpus.q2[i] for i in used], MAX_LEN)
    local = [np.searchsorted(used, b) for b in batches]
    warmup, measured = local[: plan.warmup_batches], local[plan.warmup_batches :]
    flip = torch.from_numpy(np.random.default_rng([SEED, 1, 1]).random(used.size) < 0.5)
    measured_pairs = sum(b.size for b in measured)
    widths = [int(pairs.pair_len[torch.from_numpy(b)].max()) for b in measured]
    say(
        f"training: {len(measured)} batches of {measured_pairs / len(measured):.0f} pairs "
        f"(sampler's N = {BATCH_SIZE}, mean width "
        f"{statistics.mean(widths):.1f} tokens) after {len(warmup)} warm-up, "
        f"vocabulary {vocab.size:,} ids"
    )

    encoder: torch.nn.Module | None = None
    for repeat in range(plan.repeats):
        for loss_name in ("sdml", "triplet"):
            seed_everything(SEED)
            encoder = CNNEncoder(vocab.size, **ENCODER_KW)
            loss = make_loss(loss_name)
            # As train_encoder builds it: the fused kernel is what makes the 9M-parameter
            # embedding's Adam step cheap on CPU.
            optimizer = torch.optim.Adam(
                [*encoder.parameters(), *loss.parameters()], lr=LR, fused=True
            )

            steps = (encoder, loss, optimizer, pairs, flip)
            train_steps(*steps, warmup)  # first calls allocate buffers and pick kernels
            with Stopwatch() as sw:
                loss_sum, seen = train_steps(*steps, measured)
            seconds = sw.seconds
            assert seen == measured_pairs
            rate = seen / seconds
            results.add(
                f"train.{loss_name}.pairs_per_s",
                rate,
                unit="pairs/s",
                cores=sw.cores,
                threads=torch.get_num_threads(),
                params={
                    "loss": repr(loss),
                    "batch_size": BATCH_SIZE,
                    "batches": len(measured),
                    "warmup_batches": len(warmup),
                    "pairs": measured_pairs,
                    "mean_batch_pairs": round(measured_pairs / len(measured), 1),
                    "max_len": MAX_LEN,
                    "mean_batch_width": round(statistics.mean(widths), 2),
                    "encoder": {"vocab_size": vocab.size, **ENCODER_KW},
                    "optimizer": f"Adam(lr={LR}, fused=True)",
                    "torch_threads": torch.get_num_threads(),
                },
            )
            say(
                f"  repeat {repeat + 1}/{plan.repeats} {loss_name:7s}: {rate:7.0f} pairs/s "
                f"({seconds / len(measured):.3f} s/batch, {sw.cores:.2f} cores, "
                f"loss {loss_sum / seen:.3f})"
            )
    assert encoder is not None
    return encoder.eval()


# --------------------------------------------------------------------------------------
# 2. Index encoding throughput
# --------------------------------------------------------------------------------------


def padding_factor(lengths: np.ndarray, batch: int) -> float:
    """Token positions computed / real tokens when `lengths` are encoded in batches of
    `batch` after sorting by length, as qpr.model.onnx.encode does (1.0 = no padding)."""
    capped = np.sort(np.clip(lengths, 1, MAX_LEN))
    computed = sum(
        int(capped[i : i + batch].max()) * capped[i : i + batch].size
        for i in range(0, capped.size, batch)
    )
    return round(computed / float(capped.sum()), 3)


def index_like_sample(
    vocab: Vocabulary, questions: list[str], size: int
) -> tuple[list[str], dict[str, dict[int, float]]]:
    """`size` questions that batch like the whole index corpus does.

    The index stage sorts all questions by length, so each of its batches of 1,024 is
    padded by ~1.5 % on Quora. A random sample of 8k sorted on its own would give batches
    of 1,024 that span an eighth of the length range each (~34 % padding) and understate
    large batches. So the sample is made of whole batches of the corpus's length-sorted
    order, evenly spaced over it: the same length mix as the corpus, the same padding.
    Returns the sample (shuffled; encode sorts it again) and the padding factors of the
    sample and of the whole corpus by batch size.
    """
    block = max(ORT_BATCHES)
    lengths = np.fromiter((len(vocab.encode(q)) for q in questions), dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    blocks = max(1, len(questions) // block)
    count = min(blocks, max(1, -(-size // block)))
    starts = ((np.arange(count) + 0.5) * blocks / count).astype(np.int64) * block
    pick = np.concatenate([order[start : start + block] for start in starts])
    np.random.default_rng(SEED).shuffle(pick)
    padding = {
        "sample": {b: padding_factor(lengths[pick], b) for b in ORT_BATCHES},
        "corpus": {b: padding_factor(lengths, b) for b in ORT_BATCHES},
    }
    return [questions[i] for i in pick], padding


def bench_encoding(
    encoder: torch.nn.Module,
    vocab: Vocabulary,
    corpus: Corpus,
    onnx_path: Path,
    plan: Plan,
    results: Results,
) -> dict[str, dict[int, float]]:
    sample, padding = index_like_sample(vocab, corpus.questions, plan.encode_sample)
    n = len(sample)
    say(
        f"encoding: {n:,} questions per measurement, ORT threads {ORT_THREADS}; padded / "
        f"real tokens by batch size: {padding['sample']}"
    )
    sessions = {t: load_session(onnx_path, threads=t) for t in ORT_THREADS}

    def ort_run(threads: int, batch: int, texts: Sequence[str]) -> np.ndarray:
        return encode(sessions[threads], vocab, texts, batch_size=batch, max_len=MAX_LEN)

    def torch_run(threads: int, texts: Sequence[str]) -> np.ndarray:
        torch.set_num_threads(threads)
        try:
            return encode_texts(encoder, vocab, texts, max_len=MAX_LEN, batch_size=TORCH_BATCH)
        finally:
            torch.set_num_threads(THREADS)

    # Warm-up: ORT plans its kernels per input shape on first use, torch allocates.
    warm = sample[: min(n, 2 * max(ORT_BATCHES))]
    for threads in ORT_THREADS:
        for batch in ORT_BATCHES:
            ort_run(threads, batch, warm[: max(2 * batch, 64)])
        torch_run(threads, warm)

    for repeat in range(plan.repeats):
        # Tokenisation alone: every ORT figure below includes it (encode() tokenises).
        with Stopwatch() as sw:
            for text in sample:
                vocab.encode(text)
        seconds = sw.seconds
        results.add(
            "encode.tokenize.questions_per_s",
            n / seconds,
            unit="questions/s",
            cores=sw.cores,
            threads=1,
            params={"questions": n, "what": "vocab.encode only (normalise, split, ids)"},
        )
        line = []
        for threads in ORT_THREADS:
            for batch in ORT_BATCHES:
                with Stopwatch() as sw:
                    ort_run(threads, batch, sample)
                seconds = sw.seconds
                results.add(
                    f"encode.ort.t{threads}.b{batch}.questions_per_s",
                    n / seconds,
                    unit="questions/s",
                    cores=sw.cores,
                    threads=threads,
                    params={
                        "path": "qpr.model.onnx.encode (tokenisation included)",
                        "intra_op_threads": threads,
                        "batch_size": batch,
                        "questions": n,
                    },
                )
                line.append(f"t{threads}/b{batch} {n / seconds:,.0f}")
            with Stopwatch() as sw:
                torch_run(threads, sample)
            seconds = sw.seconds
            results.add(
                f"encode.torch.t{threads}.b{TORCH_BATCH}.questions_per_s",
                n / seconds,
                unit="questions/s",
                cores=sw.cores,
                threads=threads,
                params={
                    "path": "qpr.training.embed.encode_texts (tokenisation included)",
                    "torch_threads": threads,
                    "batch_size": TORCH_BATCH,
                    "questions": n,
                },
            )
            line.append(f"torch t{threads}/b{TORCH_BATCH} {n / seconds:,.0f}")
        say(f"  repeat {repeat + 1}/{plan.repeats} questions/s: " + ", ".join(line))
    return padding


# --------------------------------------------------------------------------------------
# 3. FAISS build and search
# --------------------------------------------------------------------------------------

_BUILD_LOG = re.compile(r"train ([0-9.]+) s, add ([0-9.]+) s")


def bench_faiss(vectors: np.ndarray, plan: Plan, results: Results) -> list[int]:
    total = vectors.shape[0]
    sizes = sorted({total if s is None else min(s, total) for s in plan.corpus_sizes})
    say(f"FAISS: {FACTORY} nprobe {NPROBE} on N = {', '.join(f'{s:,}' for s in sizes)}")
    faiss.omp_set_num_threads(THREADS)
    order = np.random.default_rng(SEED).permutation(total)

    for repeat in range(plan.repeats):
        line = []
        for n in sizes:
            corpus = np.ascontiguousarray(vectors[order[:n]])
            fitted, _ = fit_factory(FACTORY, n)
            logged: list[str] = []
            with Stopwatch() as sw:
                index = build_index(
                    corpus,
                    IndexConfig(FACTORY, nprobe=NPROBE, use_gpu=False),
                    seed=SEED,
                    log=logged.append,
                )
            seconds = sw.seconds
            params = {"factory": FACTORY, "fitted_factory": fitted, "nprobe": NPROBE, "n": n}
            item = results.add(
                f"faiss.build.n{n}.seconds",
                seconds,
                unit="s",
                params={**params, "threads": THREADS},
                higher_is_better=False,
                cores=sw.cores,
                threads=THREADS,
            )
            # Search cost depends on how evenly the vectors fill the lists (1.0 = even).
            item.extra["imbalance_factor"] = round(
                float(faiss.extract_index_ivf(index).invlists.imbalance_factor()), 3
            )
            # build_index reports its k-means (train) and add split in its log line.
            split = next((m for m in map(_BUILD_LOG.search, logged) if m), None)
            if split:
                for part, value in zip(("train", "add"), split.groups(), strict=True):
                    results.add(
                        f"faiss.build.n{n}.{part}_seconds",
                        float(value),
                        unit="s",
                        params=params,
                        higher_is_better=False,
                    )

            # Queries are index questions searched with self-exclusion, as evaluation does.
            nq = min(plan.search_queries, n)
            rows = np.arange(nq, dtype=np.int64)
            queries = corpus[:nq]
            search(index, queries[:10], TOP_K, exclude=rows[:10])  # warm-up
            with Stopwatch() as sw:
                search(index, queries, TOP_K, exclude=rows)
            batched_ms = 1000 * sw.seconds / nq
            results.add(
                f"faiss.search_batched.n{n}.ms_per_query",
                batched_ms,
                unit="ms/query",
                params={**params, "k": TOP_K, "queries": nq, "mode": "one call, all queries"},
                higher_is_better=False,
            )
            ns = min(plan.single_queries, n)
            times = []
            for i in range(ns):
                start = time.perf_counter()
                search(index, queries[i : i + 1], TOP_K)
                times.append(time.perf_counter() - start)
            single_ms = 1000 * statistics.median(times)
            item = results.add(
                f"faiss.search_single.n{n}.ms_per_query",
                single_ms,
                unit="ms/query",
                params={**params, "k": TOP_K, "queries": ns, "mode": "one query per call"},
                higher_is_better=False,
            )
            # Per-call tail of this repeat: the service's view; the median is the value.
            item.extra.setdefault("p99_ms_per_repeat", []).append(
                round(1000 * float(np.percentile(times, 99)), 4)
            )
            line.append(f"N {n:,}: build {seconds:.1f} s, {batched_ms:.3f}/{single_ms:.3f} ms")
        say(f"  repeat {repeat + 1}/{plan.repeats}: " + "; ".join(line))
    return sizes


def nlist_of(factory: str) -> int:
    """nlist of an "IVF<nlist>,..." factory string (0 when it has no IVF component)."""
    match = re.search(r"IVF(\d+)", factory)
    return int(match.group(1)) if match else 0


def growth_exponent(sizes: Sequence[int], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) on log(N): cost ∝ N^slope over the measured range."""
    if len(sizes) < 2:
        return float("nan")
    x = np.log(np.asarray(sizes, dtype=float))
    y = np.log(np.asarray(values, dtype=float))
    return round(float(np.polyfit(x, y, 1)[0]), 3)


# --------------------------------------------------------------------------------------
# Machine description and reports
# --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return describe(
        ROOT,
        {
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "faiss": faiss.__version__,
            "numpy": np.__version__,
        },
        threads={"torch": THREADS, "faiss_omp": THREADS, "onnxruntime": list(ORT_THREADS)},
    )


def _fmt(x: float, digits: int = 0) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:,.{digits}f}"


def _threads(t: int) -> str:
    return f"{t} thread{'s' if t > 1 else ''}"


def _spread(m: Measurement, digits: int = 0) -> str:
    return f"{_fmt(min(m.values), digits)} – {_fmt(max(m.values), digits)}"


def render_markdown(report: dict[str, Any], results: Results, sizes: list[int]) -> str:
    """The human-readable page: medians, ranges, ratios, and what each number means."""
    r, m, plan, data = results, report["machine"], report["plan"], report["data"]
    load = report["load_average"]
    lines = [
        "# Pipeline speed",
        "",
        f"Measured {report['date']} by `benchmarks/pipeline_speed.py` "
        f"({'quick' if report['quick'] else 'default'} plan, {plan['repeats']} "
        f"repeat{'s' if plan['repeats'] > 1 else ''}, "
        f"wall time {report['wall_seconds'] / 60:.1f} min). Figures are medians over the "
        "repeats, with the range; ratios are medians of per-repeat ratios of measurements "
        "taken side by side in the same repeat. Every repeat is in "
        "[pipeline_speed.json](pipeline_speed.json).",
        "",
        f"- Machine: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB, "
        f"shared with other jobs: load average (1/5/15 min) {load['start']} at the start, "
        f"{load['end']} at the end. *Cores used* = this process's CPU time / wall time "
        "during a measurement: close to the thread count on an idle machine, lower when "
        "other jobs took the cores. *Per CPU-second* = throughput / cores used, repeat by "
        "repeat: far steadier under contention than the raw rate.",
        f"- Versions: torch {m['versions']['torch']}, onnxruntime {m['versions']['onnxruntime']}"
        f", faiss {m['versions']['faiss']}, numpy {m['versions']['numpy']}, Python "
        f"{m['python']}; code at commit `{(m['git_commit'] or 'unknown')[:12]}`.",
        f"- Data ({data['source']}): {data['description']}.",
        f"- Threads: torch {THREADS}, FAISS (OpenMP) {THREADS}, ONNX Runtime as stated.",
    ]
    share = r.core_share()
    if share < 0.8:
        # Say it at the top, not only in a column: low rates and thread ratios below 1
        # would otherwise read as findings about the code rather than about the machine.
        lines += [
            "",
            f"**Contention:** this run got a median of {100 * share:.0f} % of the cores it "
            "asked for (cores used / threads, over all measurements): other jobs were "
            "running. The raw rates are lower than on an idle machine, 2-thread settings "
            "suffer most (a thread waits for its descheduled peer), and the *per CPU-second* "
            "columns are the figures to compare across settings and runs.",
        ]
    lines += [
        "",
        "## 1. Training throughput",
        "",
        "One training step of the paper's CNN encoder (e_dim 300, window 5, 300 channels, "
        f"n 300; vocabulary {data['vocab_size']:,} ids = {data['vocab_words']:,} words of the "
        f"training questions + {HASH_BINS:,} hash bins; max_len {MAX_LEN}) at batch N = "
        f"{BATCH_SIZE}: the trainer's own `qpr.training.loop.train_pass` "
        "(both sides in one forward "
        "pass, loss, backward, fused Adam step) on `ClusterDisjointBatchSampler` batches, "
        f"{plan['train_batches']} batches timed after {plan['warmup_batches']} warm-up, the "
        "same batches for both losses.",
        "",
        "| loss | pairs per batch | pairs/s | range | s per batch | cores used | "
        "pairs per CPU-second |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("sdml", "SDML, ε 0.3"), ("triplet", "triplet, SSD, random negatives")):
        key = f"train.{name}.pairs_per_s"
        item = r.items[key]
        per_batch = item.params["mean_batch_pairs"] / item.median
        lines.append(
            f"| {label} | {item.params['mean_batch_pairs']:g} | {_fmt(item.median)} | "
            f"{_spread(item)} | {per_batch:.3f} | "
            f"{_fmt(r.cores(key), 2)} | {_fmt(r.per_cpu(key))} |"
        )
    pairs = data["training_pairs"]
    sdml = r.median("train.sdml.pairs_per_s")
    lines += [
        "",
        f"SDML / triplet: {r.ratio('train.sdml.pairs_per_s', 'train.triplet.pairs_per_s'):.2f}×"
        " in pairs/s, "
        f"{r.per_cpu('train.sdml.pairs_per_s') / r.per_cpu('train.triplet.pairs_per_s'):.2f}×"
        " per CPU-second (both share the encoder's forward and backward pass and the Adam "
        "step; the losses themselves add only an N × N distance matrix, so a gap in pairs/s "
        "that vanishes per CPU-second is contention, not the loss). "
        f"At {_fmt(sdml)} pairs/s one epoch over the {pairs:,} training pairs takes "
        f"{pairs / sdml / 60:.1f} min of steps (validation not included).",
        "",
        "## 2. Index encoding throughput",
        "",
        f"Questions/s over {plan['encode_sample']:,} index questions, raw text in, vectors out "
        "(tokenisation included), batches formed after sorting by length as the index stage "
        "does. The sample is whole batches of the corpus's length-sorted order, evenly spaced "
        "over it, so each batch is padded as much as in the real index build (column *pad*: "
        "token positions computed / real tokens).",
        "",
        "| path | batch | pad | 1 thread | 2 threads | 2 threads / 1 | cores used (1 / 2) | "
        "per CPU-second (1 / 2) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pad = report["encode_padding"]["sample"]
    rows = [(f"encode.ort.t{{t}}.b{b}.questions_per_s", "ONNX Runtime", b) for b in ORT_BATCHES]
    rows.append((f"encode.torch.t{{t}}.b{TORCH_BATCH}.questions_per_s", "torch", TORCH_BATCH))
    for pattern, path, batch in rows:
        one, two = (pattern.format(t=t) for t in (1, 2))
        lines.append(
            f"| {path} | {batch} | {pad[batch]:.3f} | {_fmt(r.median(one))} | "
            f"{_fmt(r.median(two))} | {r.ratio(two, one):.2f}× | "
            f"{_fmt(r.cores(one), 2)} / {_fmt(r.cores(two), 2)} | "
            f"{_fmt(r.per_cpu(one))} / {_fmt(r.per_cpu(two))} |"
        )
    lines += ["", "| comparison (same repeat, side by side) | ratio |", "|---|---:|"]
    for t in ORT_THREADS:
        ort_big = f"encode.ort.t{t}.b{TORCH_BATCH}.questions_per_s"
        torch_big = f"encode.torch.t{t}.b{TORCH_BATCH}.questions_per_s"
        lines.append(
            f"| ORT / torch at batch {TORCH_BATCH}, {_threads(t)} | "
            f"{r.ratio(ort_big, torch_big):.2f}× |"
        )
    for t in ORT_THREADS:
        big, single = (f"encode.ort.t{t}.b{b}.questions_per_s" for b in (max(ORT_BATCHES), 1))
        lines.append(
            f"| ORT batch {max(ORT_BATCHES)} / batch 1, {_threads(t)} | "
            f"{r.ratio(big, single):.2f}× |"
        )
    tok = r.median("encode.tokenize.questions_per_s")
    best = max(
        (r.median(f"encode.ort.t{t}.b{b}.questions_per_s"), t, b)
        for t in ORT_THREADS
        for b in ORT_BATCHES
    )
    full = report["corpus_encode"]
    lines += [
        "",
        f"Tokenisation alone (`Vocabulary.encode`, one core) runs at {_fmt(tok)} questions/s: "
        f"{100 * best[0] / tok:.0f} % of the time of the fastest ORT setting "
        f"({_threads(best[1])}, batch {best[2]}). Encoding the index corpus once "
        f"({full['questions']:,} questions, ORT, 2 threads, batch 1024, as the index stage "
        f"does) took {full['seconds']:.1f} s: {_fmt(full['questions'] / full['seconds'])} "
        "questions/s.",
        "",
        "## 3. FAISS build and search",
        "",
        "`qpr.retrieval.dense.build_index(vectors, "
        f'IndexConfig("{FACTORY}", nprobe={NPROBE}))` on CPU (d = 300, L2) '
        "over the vectors of the first N questions of a fixed shuffle of the index corpus. "
        f"nlist is lowered to N // {MIN_POINTS_PER_CENTROID} below "
        f"{MIN_POINTS_PER_CENTROID * 2000:,} vectors (`fit_factory`: FAISS wants "
        f"≥ {MIN_POINTS_PER_CENTROID} training points per list). Search: k = {TOP_K}, "
        "queries are index questions with themselves excluded (as evaluation runs them); "
        f"*batched* = one call for {plan['search_queries']:,} queries (evaluation), *single* = "
        f"one query per call, {plan['single_queries']} calls (the service), median and p99 "
        "per call. *Imbalance* = FAISS's imbalance factor of the inverted lists (1 = even).",
        "",
        "| N | index | build s | range | k-means s | add s | build cores used | imbalance | "
        "ms/query batched | ms/query single (p99) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        build = r.items[f"faiss.build.n{n}.seconds"]
        train = r.items.get(f"faiss.build.n{n}.train_seconds")
        add = r.items.get(f"faiss.build.n{n}.add_seconds")
        single = r.items[f"faiss.search_single.n{n}.ms_per_query"]
        p99 = statistics.median(single.extra["p99_ms_per_repeat"])
        lines.append(
            f"| {n:,} | {build.params['fitted_factory']} | {_fmt(build.median, 2)} | "
            f"{_spread(build, 2)} | {_fmt(train.median, 2) if train else 'n/a'} | "
            f"{_fmt(add.median, 2) if add else 'n/a'} | "
            f"{_fmt(r.cores(f'faiss.build.n{n}.seconds'), 2)} | "
            f"{build.extra['imbalance_factor']:.2f} | "
            f"{_fmt(r.median(f'faiss.search_batched.n{n}.ms_per_query'), 3)} | "
            f"{_fmt(single.median, 3)} ({_fmt(p99, 3)}) |"
        )
    lines += ["", *growth_text(report["faiss_growth"], sizes)]
    lines += [
        "",
        "Caveat: the vectors come from the encoder after only the benchmark's few training "
        "steps, not a converged one. Build time hardly depends on that (a fixed 10 k-means "
        "iterations over N × nlist distances); search time does, through how evenly the "
        "vectors fill the lists (the imbalance column).",
        "",
        "## Rerun",
        "",
        "```bash",
        ".venv/bin/python benchmarks/pipeline_speed.py           # these tables, ~5-10 min "
        "on two free cores",
        ".venv/bin/python benchmarks/pipeline_speed.py --quick   # ~1 min smoke run, "
        "written to reports/benchmarks/",
        ".venv/bin/python benchmarks/pipeline_speed.py --quora PATH --repeats 5 --out DIR",
        "```",
        "",
        f"This run: `{report['command']}`. Numbers from a shared machine move by tens of "
        "percent between runs; compare ratios from one run rather than figures across runs.",
        "",
    ]
    return "\n".join(lines)


def pairwise_exponents(sizes: Sequence[int], values: Sequence[float]) -> list[float]:
    """Local growth exponent between consecutive sizes: log(v2 / v1) / log(N2 / N1)."""
    return [
        round(math.log(v2 / v1) / math.log(n2 / n1), 3)
        for (n1, v1), (n2, v2) in itertools.pairwise(zip(sizes, values, strict=True))
    ]


def faiss_growth(results: Results, sizes: list[int]) -> dict[str, Any]:
    """How FAISS cost grows with N, measured and modelled.

    Models (IVF-Flat, fixed 10 k-means iterations): building is dominated by k-means,
    O(N · nlist) distance computations (the add step assigns N vectors to nlist centroids:
    the same order); a query scans the nlist centroids plus nprobe lists of ~N / nlist
    vectors, so ~nlist + nprobe · N / nlist vectors. nlist = min(2000, N // 39) here, so
    the build is O(N²) until nlist is capped and O(N) after it.
    """
    build = [results.median(f"faiss.build.n{n}.seconds") for n in sizes]
    batched = [results.median(f"faiss.search_batched.n{n}.ms_per_query") for n in sizes]
    single = [results.median(f"faiss.search_single.n{n}.ms_per_query") for n in sizes]
    nlists = [nlist_of(fit_factory(FACTORY, n)[0]) for n in sizes]
    work = [n * k for n, k in zip(sizes, nlists, strict=True)]
    scanned = [k + NPROBE * n / k for n, k in zip(sizes, nlists, strict=True)]
    return {
        "nlist": dict(zip(map(str, sizes), nlists, strict=True)),
        "scanned_per_query_model": dict(
            zip(map(str, sizes), [round(s) for s in scanned], strict=True)
        ),
        "exponent_overall": {
            "build": growth_exponent(sizes, build),
            "search_batched": growth_exponent(sizes, batched),
            "search_single": growth_exponent(sizes, single),
        },
        "exponent_step_by_step": {
            "build": pairwise_exponents(sizes, build),
            "build_model_n_times_nlist": pairwise_exponents(sizes, work),
            "search_batched": pairwise_exponents(sizes, batched),
            "search_single": pairwise_exponents(sizes, single),
            "search_model_scanned": pairwise_exponents(sizes, scanned),
        },
    }


def growth_text(growth: dict[str, Any], sizes: list[int]) -> list[str]:
    """Markdown lines: the exponents, measured next to what the cost model predicts."""
    if len(sizes) < 2:
        return ["Only one corpus size was measured: no growth rate."]
    steps = [f"{a:,}→{b:,}" for a, b in itertools.pairwise(sizes)]
    step = growth["exponent_step_by_step"]
    overall = growth["exponent_overall"]

    def row(label: str, values: Sequence[float]) -> str:
        return f"| {label} | " + " | ".join(f"N^{v:.2f}" for v in values) + " |"

    return [
        "How cost grows with N: local exponents between consecutive sizes (cost ∝ N^x), "
        "measured next to the cost model: k-means work ∝ N · nlist for the build, and "
        f"≈ nlist + nprobe · N / nlist vectors scanned per query "
        f"({', '.join(f'{v:,}' for v in growth['scanned_per_query_model'].values())}).",
        "",
        "| | " + " | ".join(steps) + " |",
        "|---|" + "---:|" * len(steps),
        row("build, measured", step["build"]),
        row("build, model N · nlist", step["build_model_n_times_nlist"]),
        row("search batched, measured", step["search_batched"]),
        row("search single, measured", step["search_single"]),
        row("search, model scanned vectors", step["search_model_scanned"]),
        "",
        f"Over the whole range: build N^{overall['build']:.2f}, batched search "
        f"N^{overall['search_batched']:.2f}, single-query search "
        f"N^{overall['search_single']:.2f}. The model: the build is quadratic while nlist = "
        f"N // {MIN_POINTS_PER_CENTROID} grows with N and linear once nlist is capped at 2000 "
        f"(N ≥ {MIN_POINTS_PER_CENTROID * 2000:,}). A query is sublinear in N over this "
        "range because scanning the 2,000 centroids dominates the 16 short lists; it turns "
        f"linear past N ≈ nlist² / nprobe = {2000**2 // NPROBE:,}, and at the paper's 10M "
        f"questions it would scan ~{10_000_000 * NPROBE // 2000:,} vectors: there nlist must "
        "grow (or the index be sharded) to keep queries fast. Search times are tenths of a "
        "millisecond and the most sensitive figures here to other jobs on the machine (see "
        "the p99): read their exponents as rough.",
    ]


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Training, encoding and FAISS throughput of the QPR pipeline.",
    )
    parser.add_argument(
        "--quora",
        type=Path,
        default=DEFAULT_QUORA,
        help=f"Quora-format pairs file (default {DEFAULT_QUORA}); when it is absent the "
        "synthetic QA logs are used",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="repeats per measurement (default 3, quick 2)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default {DEFAULT_OUT.relative_to(ROOT)}; "
        f"with --quick {QUICK_OUT.relative_to(ROOT)})",
    )
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            raise SystemExit("--repeats must be >= 1")
        plan = Plan(**{**plan.__dict__, "repeats": args.repeats})
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()

    torch.set_num_threads(THREADS)
    info = machine()
    say(
        f"{info['cpu_model']}, {info['cpus_usable']} cores; torch {torch.__version__}, "
        f"onnxruntime {ort.__version__}, faiss {faiss.__version__}; plan {plan}"
    )

    results = Results()
    with tempfile.TemporaryDirectory(prefix="qpr-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.quora.is_file():
            corpus = load_quora(args.quora)
        else:
            say(f"{args.quora} not found: using the synthetic QA logs instead")
            corpus = load_synthetic(tmp)
        say(f"data: {corpus.description}")
        vocab = Vocabulary.build([*corpus.q1, *corpus.q2], max_words=MAX_WORDS, hash_bins=HASH_BINS)
        say(f"vocabulary: {vocab.num_words:,} words + {HASH_BINS:,} hash bins")

        encoder = bench_training(corpus, vocab, plan, results)

        onnx_path = export_onnx(encoder, tmp / "encoder.onnx")
        padding = bench_encoding(encoder, vocab, corpus, onnx_path, plan, results)

        # The FAISS corpus: the index stage's own encode of every index question.
        wanted = [len(corpus.questions) if s is None else s for s in plan.corpus_sizes]
        limit = min(len(corpus.questions), max(wanted))
        texts = corpus.questions[:limit]
        say(f"encoding the index corpus: {len(texts):,} questions (ORT, 2 threads, b 1024)")
        session = load_session(onnx_path, threads=THREADS)
        with Stopwatch() as sw:
            vectors = encode(session, vocab, texts, batch_size=1024, max_len=MAX_LEN)
        seconds = sw.seconds
        corpus_encode = {
            "questions": len(texts),
            "seconds": round(seconds, 3),
            "cores_used": round(sw.cores, 3),
        }
        say(f"  {seconds:.1f} s, {len(texts) / seconds:,.0f} questions/s")
        sizes = bench_faiss(vectors, plan, results)

    growth = faiss_growth(results, sizes)
    wall = time.perf_counter() - _T0
    report: dict[str, Any] = {
        "benchmark": NAME,
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "wall_seconds": round(wall, 1),
        "core_share": round(results.core_share(), 3),
        "load_average": {
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
        "machine": info,
        "plan": plan.__dict__ | {"corpus_sizes": sizes},
        "data": {
            "source": corpus.source,
            "description": corpus.description,
            "training_pairs": len(corpus.q1),
            "index_questions": len(corpus.questions),
            "vocab_words": vocab.num_words,
            "vocab_size": vocab.size,
        },
        "corpus_encode": corpus_encode,
        "encode_padding": padding,
        "faiss_growth": growth,
        "measurements": [item.as_dict() for item in results.items.values()],
    }
    write_text_atomic(out / f"{NAME}.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    write_text_atomic(out / f"{NAME}.md", render_markdown(report, results, sizes))
    say(f"wrote {out / (NAME + '.json')} and {out / (NAME + '.md')} ({wall / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Training throughput of the paper's CNN with SDML on each device torch sees.

    python benchmarks/train_device.py               # the CPU, and the GPU when there is one
    python benchmarks/train_device.py --pairs 40000 --out DIR

What is measured: `qpr.training.encoder_step.train_encoder` itself (what the train stage runs with
`train.device`) for two epochs of SDML (ε 0.3, batch N = 512) with the paper's CNN
(embedding 300, window 5, 300 channels, output 300, max_len 40; vocabulary = top-50k words
+ 5k hash bins), once per device. The figure is the trainer's own pairs/s of each epoch
(`pairs_per_s` in its history: batches only, validation excluded); the first epoch on a GPU
includes its warm-up, so the second is the one to compare. On the CPU torch uses every
core this process may run on (`--threads` to change).

Data: seeded random questions (12 words of a 20k-word Zipf vocabulary; each pair's second
question is the first with two words replaced). The cost of a step depends on the shapes,
not on the words, so no dataset is needed and nothing is read.

Outputs: <out>/train_device.json (machine, versions, every epoch) and <out>/train_device.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe
from paper_cnn import ENCODER_KW, HASH_BINS, MAX_LEN, MAX_WORDS

ROOT = Path(__file__).resolve().parents[1]
NAME = "train_device"
SEED = 13
WORDS = 20_000
QUESTION_WORDS = 12


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def random_pairs(n: int, seed: int) -> tuple[list[str], list[str], np.ndarray]:
    """n paraphrase-shaped pairs (q1, q2, cluster ids 0..n-1) of Zipf-distributed words."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, WORDS + 1)
    words = rng.choice(WORDS, size=(n, QUESTION_WORDS), p=weights / weights.sum())
    changed = words.copy()
    rows = np.arange(n)[:, None]
    changed[rows, rng.integers(0, QUESTION_WORDS, size=(n, 2))] = rng.integers(0, WORDS, (n, 2))
    q1 = [" ".join(f"w{w}" for w in row) for row in words]
    q2 = [" ".join(f"w{w}" for w in row) for row in changed]
    return q1, q2, np.arange(n, dtype=np.int64)


def measure(device: str, pairs: int, threads: int) -> dict[str, Any]:
    from qpr.model.cnn import CNNEncoder
    from qpr.model.losses import build_loss
    from qpr.text.vocab import Vocabulary
    from qpr.training.checkpoint import seed_everything
    from qpr.training.encoder_step import train_encoder
    from qpr.training.pairs import TrainData
    from qpr.training.train_config import TrainConfig
    from qpr.training.validation import ValidationSet

    q1, q2, clusters = random_pairs(pairs, SEED)
    vocab = Vocabulary.build(q1 + q2, max_words=MAX_WORDS, hash_bins=HASH_BINS)
    val_q1, val_q2, _ = random_pairs(500, SEED + 1)
    val = ValidationSet(val_q1 + val_q2, np.tile(np.arange(500), 2), seed=1)
    seed_everything(SEED)
    encoder = CNNEncoder(vocab.size, **ENCODER_KW)
    epochs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qpr-train-device-") as out_dir:
        started = time.perf_counter()
        config = TrainConfig(
            batch_size=512,
            max_epochs=2,
            patience=2,
            monitor="val_mrr",
            max_len=MAX_LEN,
            seed=SEED,
            resume=False,
            progress=False,
            threads=threads,
            device=device,
        )
        train_encoder(
            config,
            TrainData(q1, q2, clusters, val),
            encoder=encoder,
            loss=build_loss("sdml", smoothing=0.3),
            vocab=vocab,
            out_dir=out_dir,
            on_epoch=epochs.append,
        )
        wall = time.perf_counter() - started
    rows = [
        {"epoch": r["epoch"], "pairs_per_s": round(r["pairs_per_s"], 1), "seconds": r["seconds"]}
        for r in epochs
    ]
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU, {threads} threads"
    say(f"{device} ({name}): " + ", ".join(f"{r['pairs_per_s']:.0f} pairs/s" for r in rows))
    return {"device": device, "name": name, "pairs": pairs, "epochs": rows, "wall_s": wall}


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Training throughput by device",
        "",
        f"Measured {report['finished_at']} by `benchmarks/train_device.py` (commit "
        f"{str(m['git_commit'])[:12]}{', with uncommitted changes' if m['dirty'] else ''}) on "
        f"{m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB, Python "
        f"{m['python']}, torch {m['versions']['torch']}"
        + (f", GPU: {report['gpu']}" if report["gpu"] else ", no GPU")
        + ".",
        "",
        "`qpr.training.encoder_step.train_encoder` (what the train stage runs), SDML ε 0.3, "
        "batch 512, the "
        f"paper's CNN (embedding 300, window 5, 300 channels, output 300), "
        f"{report['pairs']:,} random question pairs per epoch (cost depends on shapes, not "
        "words). pairs/s is the trainer's own figure (batches only); epoch 1 on a GPU "
        "includes its warm-up.",
        "",
        "| device | epoch 1 pairs/s | epoch 2 pairs/s | two epochs, wall s |",
        "|---|---:|---:|---:|",
    ]
    for r in report["runs"]:
        e = {row["epoch"]: row["pairs_per_s"] for row in r["epochs"]}
        lines.append(
            f"| {r['device']} ({r['name']}) | {e.get(1, float('nan')):,.0f} | "
            f"{e.get(2, float('nan')):,.0f} | {r['wall_s']:.1f} |"
        )
    fast = {r["device"]: r["epochs"][-1]["pairs_per_s"] for r in report["runs"]}
    if "cuda" in fast and "cpu" in fast:
        lines += [
            "",
            f"The GPU trains {fast['cuda'] / fast['cpu']:.0f}× as many pairs per second as "
            f"this machine's CPU ({report['threads']} threads); Quora's 92,602 training pairs "
            f"take {92_602 / fast['cuda']:.1f} s an epoch there against "
            f"{92_602 / fast['cpu']:.0f} s.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20_000, help="pairs per epoch")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--devices", default="cpu,cuda", help="those torch sees are measured")
    args = parser.parse_args(argv)
    wanted = [d for d in args.devices.split(",") if d == "cpu" or torch.cuda.is_available()]
    runs = [measure(device, args.pairs, args.threads) for device in wanted]
    report = {
        "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": describe(ROOT, {"torch": torch.__version__, "numpy": np.__version__}),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "pairs": args.pairs,
        "threads": args.threads,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (args.out / f"{NAME}.md").write_text(render(report), encoding="utf-8")
    say(f"wrote {args.out / NAME}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

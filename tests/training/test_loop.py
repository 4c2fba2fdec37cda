"""Training loop on the tiny synthetic paraphrase set: it learns, checkpoints, resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qpr.model import CNNEncoder
from qpr.model.losses import build_loss
from qpr.training.checkpoint import (
    TrainingStateError,
    load_checkpoint,
    load_encoder,
    save_checkpoint,
    seed_everything,
)
from qpr.training.embed import encode_texts
from qpr.training.loop import LoopConfig, TrainResult, fit
from qpr.training.train_config import TrainConfig, resolve_device
from qpr.training.validation import ValidationSet, mean_reciprocal_rank, roc_auc
from tests.paraphrases import train_tiny

MAX_LEN = 16


def _encoder(vocab_size: int) -> CNNEncoder:
    seed_everything(0)
    return CNNEncoder(vocab_size, embedding_dim=32, channels=32, output_dim=32)


def _train(data, out_dir: Path, *, loss: str = "sdml", **kwargs: Any) -> TrainResult:
    kwargs.setdefault("max_len", MAX_LEN)
    return train_tiny(
        data,
        out_dir,
        encoder=_encoder(data.vocab.size),
        loss=build_loss(loss, **({"seed": 1} if loss == "triplet" else {})),
        **kwargs,
    )


# -- metrics ---------------------------------------------------------------------------------


def test_roc_auc_matches_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    pos = rng.integers(0, 6, size=40).astype(float)  # integer scores: many ties
    neg = rng.integers(0, 5, size=30).astype(float)
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert roc_auc(pos, neg) == pytest.approx(wins / (40 * 30))
    assert roc_auc([2.0, 3.0], [0.0, 1.0]) == 1.0
    assert roc_auc([0.0], [1.0]) == 0.0
    assert roc_auc([1.0, 1.0], [1.0]) == 0.5


def test_mrr_hand_example_and_pessimistic_ties() -> None:
    # 1-D points; cluster A = {0, 1, 4}, cluster B = {2, 3}. Distances |x_i - x_j|:
    #   q0 (0.0, A): relevant 1 at 1.0; B item 2 at 0.4 is closer        → rank 2
    #   q1 (1.0, A): relevant 0 at 1.0; item 2 at 0.6 is closer          → rank 2
    #   q2 (0.4, B): relevant 3 at 4.6; items 0 (0.4) and 1 (0.6) closer → rank 3
    #   q3 (5.0, B): relevant 2 at 4.6; items 1 and 4 (both 4.0) closer  → rank 3
    #   q4 (9.0, A): relevant 1 at 8.0; item 3 at 4.0 is closer          → rank 2
    emb = torch.tensor([[0.0], [1.0], [0.4], [5.0], [9.0]])
    labels = np.array([0, 0, 1, 1, 0])
    expected = (1 / 2 + 1 / 2 + 1 / 3 + 1 / 3 + 1 / 2) / 5
    assert mean_reciprocal_rank(emb, labels, chunk=2) == pytest.approx(expected)
    # A collapsed encoder is not rewarded for ties: every other item ties with the relevant
    # ones and ranks ahead: A queries rank 3, B queries rank 4 → (3/3 + 2/4) / 5 = 0.3.
    collapsed = torch.zeros(5, 3)
    assert mean_reciprocal_rank(collapsed, labels) == pytest.approx(0.3)


def test_validation_set_default_pairs() -> None:
    val = ValidationSet(["a", "b", "c", "d", "e"], np.array([3, 1, 3, 1, 7]), num_negatives=20)
    assert sorted(map(tuple, val.positive_pairs.tolist())) == [(0, 2), (1, 3)]
    assert val.negative_pairs.shape == (20, 2)
    labels = val.cluster_ids
    assert (labels[val.negative_pairs[:, 0]] != labels[val.negative_pairs[:, 1]]).all()
    with pytest.raises(ValueError, match="two clusters"):
        ValidationSet(["a", "b"], np.array([1, 1]))


# -- config ----------------------------------------------------------------------------------


def test_the_fingerprint_is_the_config_fields_a_resume_must_keep() -> None:
    config = TrainConfig(lr=3e-3, batch_size=32, max_len=16, seed=0, max_epochs=4)
    assert config.fingerprint() == {"lr": 3e-3, "batch_size": 32, "max_len": 16, "seed": 0}
    # What a resume may change is not in it.
    resumed = dataclasses.replace(
        config, max_epochs=9, patience=7, monitor="val_mrr", threads=1, progress=False
    )
    assert resumed.fingerprint() == config.fingerprint()
    # The limits enter it when set.
    limited = TrainConfig(max_pairs=10, time_budget_s=5)
    assert limited.fingerprint()["max_pairs"] == 10
    assert limited.fingerprint()["time_budget_s"] == 5.0
    with pytest.raises(ValueError, match="monitor"):
        TrainConfig(monitor="loss")


# -- training --------------------------------------------------------------------------------


def test_training_beats_the_untrained_encoder(tiny_paraphrases, tmp_path: Path) -> None:
    data = tiny_paraphrases
    seen: list[dict[str, Any]] = []
    result = _train(data, tmp_path, max_epochs=5, on_epoch=seen.append)

    assert [r["epoch"] for r in seen] == [1, 2, 3, 4, 5]
    assert set(seen[0]) >= {"epoch", "train_loss", "val_auc", "val_mrr", "pairs_per_s", "seconds"}
    assert all(np.isfinite(r["train_loss"]) for r in seen)
    assert seen[-1]["train_loss"] < seen[0]["train_loss"]
    # The untrained encoder groups questions by template, not by meaning.
    assert result.initial["val_mrr"] < 0.3
    assert result.best["val_mrr"] > result.initial["val_mrr"] + 0.5
    assert result.best["val_auc"] > 0.95

    # Paraphrases end up closer than non-paraphrases (the returned encoder = best epoch).
    best_encoder = load_encoder(result.best_checkpoint)
    emb = encode_texts(best_encoder, data.vocab, data.val.texts, max_len=MAX_LEN)
    pos, neg = data.val.positive_pairs, data.val.negative_pairs
    d_pos = ((emb[pos[:, 0]] - emb[pos[:, 1]]) ** 2).sum(axis=1)
    d_neg = ((emb[neg[:, 0]] - emb[neg[:, 1]]) ** 2).sum(axis=1)
    assert d_pos.mean() < 0.5 * d_neg.mean()
    assert isinstance(best_encoder, CNNEncoder) and not best_encoder.training

    assert result.last_checkpoint.is_file() and result.best_checkpoint.is_file()
    last = load_checkpoint(result.last_checkpoint)
    assert last["epoch"] == 5 and len(last["history"]) == 5
    assert {"model", "optimizer", "step", "rng", "config", "fingerprint"} <= set(last)
    assert last["config"]["max_epochs"] == 5 and last["fingerprint"]["lr"] == 3e-3
    best = load_checkpoint(result.best_checkpoint)
    assert best["epoch"] == result.best_epoch
    assert best["metrics"]["val_auc"] == pytest.approx(result.best["val_auc"])


@pytest.mark.parametrize("loss", ["sdml", "triplet"])
def test_killed_run_resumes_to_the_same_weights(tiny_paraphrases, tmp_path: Path, loss) -> None:
    data = tiny_paraphrases
    straight = _train(data, tmp_path / "straight", loss=loss, max_epochs=4)

    class Killed(RuntimeError):
        pass

    def kill_after_epoch_2(record: dict[str, Any]) -> None:
        if record["epoch"] == 2:
            raise Killed

    with pytest.raises(Killed):
        _train(data, tmp_path / "resumed", loss=loss, max_epochs=4, on_epoch=kill_after_epoch_2)
    assert load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["epoch"] == 2

    # A fresh process would build a fresh encoder; resume must overwrite all of its state.
    resumed = _train(data, tmp_path / "resumed", loss=loss, max_epochs=4)
    assert resumed.resumed_from_epoch == 2
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3, 4]

    def strip_timing(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: r[k] for k in ("epoch", "train_loss", "val_auc", "val_mrr")} for r in history]

    assert strip_timing(resumed.history) == strip_timing(straight.history)
    assert resumed.best_epoch == straight.best_epoch
    for name in ("last.pt", "best.pt"):
        a = load_checkpoint(tmp_path / "straight" / "checkpoints" / name)["model"]
        b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / name)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_finished_run_is_not_repeated_and_settings_are_checked(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    first = _train(data, tmp_path, max_epochs=2)
    again = _train(data, tmp_path, max_epochs=2)
    assert again.resumed_from_epoch == 2 and again.history == first.history
    # More epochs continue the same run.
    longer = _train(data, tmp_path, max_epochs=3)
    assert [r["epoch"] for r in longer.history] == [1, 2, 3]
    with pytest.raises(TrainingStateError, match="lr"):
        _train(data, tmp_path, max_epochs=3, lr=1e-2)
    # resume=False starts over.
    fresh = _train(data, tmp_path, max_epochs=1, lr=1e-2, resume=False)
    assert fresh.resumed_from_epoch is None and len(fresh.history) == 1


def test_a_shorter_run_does_not_resume_a_longer_ones_checkpoint(
    tiny_paraphrases, tmp_path: Path
) -> None:
    """An experiment with fewer epochs than the run before it trains its own model."""
    _train(tiny_paraphrases, tmp_path, max_epochs=3)
    with pytest.raises(TrainingStateError, match="past max_epochs 2"):
        _train(tiny_paraphrases, tmp_path, max_epochs=2)
    short = _train(tiny_paraphrases, tmp_path, max_epochs=2, resume=False)
    alone = _train(tiny_paraphrases, tmp_path / "alone", max_epochs=2)
    assert short.history[-1]["val_mrr"] == alone.history[-1]["val_mrr"]


def test_epochs_run_under_other_math_are_not_resumed(
    tiny_paraphrases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of native math (QPR_NATIVE_MATH) is another run for pinned math: its
    epochs rounded otherwise, so the stage trains afresh instead of mixing the two."""
    from qpr.environment import PINNED_MATH

    for name in PINNED_MATH:
        monkeypatch.delenv(name, raising=False)
    _train(tiny_paraphrases, tmp_path, max_epochs=1)
    for name, value in PINNED_MATH.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(TrainingStateError, match="math"):
        _train(tiny_paraphrases, tmp_path, max_epochs=1)
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["fingerprint"]["math"] == "native"


def test_early_stopping_on_validation_auc(tiny_paraphrases, tmp_path: Path) -> None:
    result = _train(tiny_paraphrases, tmp_path, max_epochs=30, patience=2, lr=1e-2)
    assert result.stopped_early
    assert result.last_epoch == result.best_epoch + 2
    aucs = [r["val_auc"] for r in result.history]
    assert result.best["val_auc"] == max(aucs)


def test_early_stopping_on_validation_mrr_keeps_the_best_mrr_epoch(
    tiny_paraphrases, tmp_path: Path
) -> None:
    result = _train(
        tiny_paraphrases, tmp_path, max_epochs=30, patience=2, lr=1e-2, monitor="val_mrr"
    )
    assert result.stopped_early
    assert result.last_epoch == result.best_epoch + 2
    mrrs = [r["val_mrr"] for r in result.history]
    assert result.best["val_mrr"] == max(mrrs) == mrrs[result.best_epoch - 1]
    assert load_checkpoint(result.best_checkpoint)["epoch"] == result.best_epoch
    with pytest.raises(ValueError, match="monitor"):
        _train(tiny_paraphrases, tmp_path / "bad", monitor="loss")


def test_a_run_resumed_under_another_monitor_keeps_an_epoch_it_has_weights_for(
    tiny_paraphrases, tmp_path: Path
) -> None:
    by_auc = _train(tiny_paraphrases, tmp_path, max_epochs=3, monitor="val_auc")
    kept, last = by_auc.history[by_auc.best_epoch - 1], by_auc.history[-1]
    by_mrr = _train(tiny_paraphrases, tmp_path, max_epochs=3, monitor="val_mrr")
    assert by_mrr.resumed_from_epoch == 3 and by_mrr.history == by_auc.history
    expected = last if last["val_mrr"] > kept["val_mrr"] else kept
    assert by_mrr.best_epoch == expected["epoch"]
    assert by_mrr.best["val_mrr"] == expected["val_mrr"]
    best = load_checkpoint(by_mrr.best_checkpoint)
    assert best["epoch"] == by_mrr.best_epoch
    # and training goes on under the new monitor
    longer = _train(tiny_paraphrases, tmp_path, max_epochs=4, monitor="val_mrr")
    assert [r["epoch"] for r in longer.history] == [1, 2, 3, 4]
    assert longer.best["val_mrr"] == max(
        [expected["val_mrr"], *(r["val_mrr"] for r in longer.history[3:])]
    )


def test_atomic_save_keeps_the_old_file_when_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"epoch": 1})

    def crash(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("qpr.io.os.replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"epoch": 2})
    assert load_checkpoint(path) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# -- device ----------------------------------------------------------------------------------


def test_resolve_device_takes_the_gpu_only_when_there_is_one() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="sees no GPU"):
            resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trains_on_the_gpu_and_the_checkpoint_resumes_and_encodes_on_the_cpu(
    tiny_paraphrases, tmp_path: Path
) -> None:
    data = tiny_paraphrases
    result = _train(data, tmp_path, max_epochs=3, device="cuda")
    assert result.best["val_mrr"] > result.initial["val_mrr"] + 0.5
    # The checkpoint holds CPU tensors: the export and the service never need a GPU.
    on_cpu = load_encoder(result.best_checkpoint)
    assert {p.device.type for p in on_cpu.parameters()} == {"cpu"}
    emb_cpu = encode_texts(on_cpu, data.vocab, data.val.texts, max_len=MAX_LEN)
    emb_gpu = encode_texts(
        load_encoder(result.best_checkpoint).to("cuda"),
        data.vocab,
        data.val.texts,
        max_len=MAX_LEN,
        device="cuda",
    )
    np.testing.assert_allclose(emb_gpu, emb_cpu, atol=1e-4)
    # A run started on the GPU goes on from its last epoch on the CPU.
    resumed = _train(data, tmp_path, max_epochs=4, device="cpu")
    assert resumed.resumed_from_epoch == 3 and resumed.last_epoch == 4


def test_train_or_restart_sets_another_runs_checkpoint_aside() -> None:
    """A checkpoint of another run is not continued: the run starts afresh, and says so."""
    from qpr.training.checkpoint import TrainingStateError
    from qpr.training.distill import StudentConfig
    from qpr.training.loop import train_or_restart

    tried: list[bool] = []

    def train(config: StudentConfig) -> str:
        tried.append(config.resume)
        if config.resume:
            raise TrainingStateError("last.pt belongs to another run")
        return "trained afresh"

    said: list[str] = []
    assert train_or_restart(train, StudentConfig(), said.append) == "trained afresh"
    assert tried == [True, False]
    assert said == ["not resuming: last.pt belongs to another run; training from scratch"]


@dataclasses.dataclass(frozen=True)
class _ScriptedConfig(LoopConfig):
    MONITORS = ("val_mrr",)

    monitor: str = "val_mrr"
    progress: bool = False


class _Scripted:
    """A family whose validation reads from a script: the start, then each epoch."""

    unit = "items"
    scheduler = None

    def __init__(self, script: list[float]) -> None:
        self.counts: dict[str, int] = {}
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.script = list(script)

    def fingerprint(self) -> dict[str, Any]:
        return {}

    def batches(self, epoch: int) -> list[int]:
        return [0]

    def batch_loss(self, batch: int) -> tuple[torch.Tensor, int]:
        return self.model(torch.ones(1, 2)).sum(), 1  # every step moves the weights

    def evaluate(self) -> dict[str, float]:
        return {"val_mrr": self.script.pop(0)}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def best_extras(self) -> dict[str, Any]:
        return {}


def test_a_start_no_epoch_beats_is_kept_when_it_is_a_candidate(tmp_path: Path) -> None:
    """keep_start: the model as built is epoch 0 of the race. Epochs that rank worse count
    against patience, and the run ends holding the start's weights."""
    family = _Scripted([0.9, 0.5, 0.6, 0.7])
    start = {k: v.clone() for k, v in family.model.state_dict().items()}
    config = _ScriptedConfig(max_epochs=3, patience=2, keep_start=True)
    result = fit(family, config, tmp_path / "kept")
    assert (result.best_epoch, result.last_epoch, result.stopped_early) == (0, 2, True)
    assert result.best == {"val_mrr": 0.9}
    for name, value in family.model.state_dict().items():
        torch.testing.assert_close(value, start[name], rtol=0, atol=0)
    # Without it, the first epoch is the best by definition, however it ranks.
    family = _Scripted([0.9, 0.5, 0.6, 0.7])
    result = fit(family, dataclasses.replace(config, keep_start=None), tmp_path / "plain")
    assert (result.best_epoch, result.best) == (3, {"val_mrr": 0.7})

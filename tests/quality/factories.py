"""Crafted, valid frames shaped like the pipeline's outputs; tests corrupt their own copies."""

from __future__ import annotations

import pandas as pd

SPLIT_RATIOS = {"train": 0.8, "val": 0.1, "test": 0.1}


def make_log_frame(n: int = 200) -> pd.DataFrame:
    """A valid raw log frame shaped like the loader's output (plus an optional column)."""
    raw = [f"2026-10-01T{(i // 60) % 24:02d}:{i % 60:02d}:00Z" for i in range(n)]
    return pd.DataFrame(
        {
            "timestamp": raw,
            "timestamp_utc": pd.to_datetime(raw, utc=True).astype("datetime64[ns, UTC]"),
            "question": [f"how do i reset my password, attempt {i}?" for i in range(n)],
            "answer_id": [f"ans_{i % 17}:v1" for i in range(n)],
            "source_file": ["2026-10-01.jsonl"] * n,
            "confidence": [0.9] * n,
        }
    )


def make_cluster_outputs(
    n_clusters: int = 20, size: int = 3
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Valid cluster-stage outputs: clusters (2 dropped), questions, pairs; 80:10:10 split."""
    n_train = round(n_clusters * SPLIT_RATIOS["train"])
    n_val = round(n_clusters * SPLIT_RATIOS["val"])
    splits = ["train"] * n_train + ["val"] * n_val
    splits += ["test"] * (n_clusters - len(splits))
    clusters = pd.DataFrame(
        {
            "cluster_id": pd.Series(range(n_clusters + 2), dtype="int64"),
            "size": pd.Series([size] * n_clusters + [2, 4], dtype="int64"),
            "coherence": [0.6] * n_clusters + [0.02, 0.05],
            "kept": [True] * n_clusters + [False, False],
            "split": [*splits, "dropped", "dropped"],
        }
    )
    questions, pairs = [], []
    qid = 0
    for cluster_id, split in enumerate(splits):
        ids = []
        for j in range(size):
            text = f"how do i do task {cluster_id} variant {j}"
            questions.append(
                {
                    "question_id": qid,
                    "text": text.capitalize() + "?",
                    "norm_key": text,
                    "cluster_id": cluster_id,
                    "split": split,
                }
            )
            ids.append(qid)
            qid += 1
        pairs += [
            {"q1_id": a, "q2_id": b, "cluster_id": cluster_id, "split": split}
            for i, a in enumerate(ids)
            for b in ids[i + 1 :]
        ]
    questions.append(
        {
            "question_id": qid,
            "text": "Hello?",
            "norm_key": "hello",
            "cluster_id": -1,
            "split": "none",
        }
    )
    questions_df = pd.DataFrame(questions).astype({"question_id": "int64", "cluster_id": "int64"})
    pairs_df = pd.DataFrame(pairs).astype({"q1_id": "int64", "q2_id": "int64"})
    return clusters, questions_df, pairs_df

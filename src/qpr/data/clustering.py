"""Paraphrase clusters from QA logs (one per answer, coherence-filtered) or from Quora pairs
(transitive closure of the duplicate relation).

Both paths end in the same two frames:

- questions: question_id (int64), text (str), norm_key (str), cluster_id (int64, -1 = none),
  and from logs one str column per metadata field kept (``data.filter_fields``)
- clusters:  cluster_id (int64), source_key (str), size (int64), coherence (float64)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from qpr.text.normalize import normalize, tokenize

NO_CLUSTER = -1


def coherence(questions: Sequence[str]) -> float:
    """Cluster coherence c, Bonadiman et al. 2019, eq. 4-5.

    S = ∪ T_q over the cluster's questions (T_q: the set of unique tokens of q) and
    c = (1/n) Σ_q |T_q ∩ S| / |S|. Incoherent clusters (unrelated questions mapped to one
    generic answer such as "yes" or a bare number) share few tokens, so S is large relative
    to each T_q and c is small; the paper drops clusters with c < 0.1.
    """
    token_sets = [set(tokenize(q)) for q in questions]
    union: set[str] = set().union(*token_sets) if token_sets else set()
    if not union:
        return 0.0
    return float(sum(len(t & union) for t in token_sets) / (len(token_sets) * len(union)))


def stable_id(key: str) -> int:
    """A 63-bit id that stays the same for the same key across runs, machines and data
    refreshes, so a question keeps its id in qrels, indexes and the service."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF


class UnionFind:
    """Disjoint sets over hashable items (path halving + union by size)."""

    def __init__(self) -> None:
        self._parent: dict = {}
        self._size: dict = {}

    def add(self, item) -> None:
        if item not in self._parent:
            self._parent[item] = item
            self._size[item] = 1

    def find(self, item):
        self.add(item)
        parent = self._parent
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    def union(self, a, b) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return
        if self._size[root_a] < self._size[root_b]:
            root_a, root_b = root_b, root_a
        self._parent[root_b] = root_a
        self._size[root_a] += self._size[root_b]

    def groups(self) -> dict:
        """root → sorted members, for every item ever added."""
        members: dict = {}
        for item in self._parent:
            members.setdefault(self.find(item), []).append(item)
        return {root: sorted(items) for root, items in members.items()}


def components(pairs: Iterable[tuple[int, int]], items: Iterable[int] = ()) -> dict[int, int]:
    """item → component id (the smallest item of its component) under the pair relation."""
    sets = UnionFind()
    for item in items:
        sets.add(item)
    for a, b in pairs:
        sets.union(a, b)
    return {item: members[0] for members in sets.groups().values() for item in members}


def log_counts(logs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cleaned log rows → how often each question was logged in each form and under each
    answer: (forms: norm_key, question, n; votes: norm_key, answer_id, n), sorted by key.

    Counts of several batches add up (`questions_from_counts` of their concatenation is that
    of the whole), which is how the sharded cluster stage reduces them (`qpr.data.sharded`).
    """
    frame = pd.DataFrame(
        {"question": logs["question"].to_numpy(), "answer_id": logs["answer_id"].to_numpy()}
    )
    frame["norm_key"] = frame["question"].map(normalize)
    frame = frame[frame["norm_key"] != ""]
    forms = frame.groupby(["norm_key", "question"], sort=True).size().reset_index(name="n")
    votes = frame.groupby(["norm_key", "answer_id"], sort=True).size().reset_index(name="n")
    return forms, votes


def tag_counts(logs: pd.DataFrame, fields: Sequence[str]) -> pd.DataFrame:
    """How often each question was logged with each value of each metadata field:
    norm_key, field, value, n (str, str, str, int64), sorted; null values are not counted.
    Like `log_counts`, counts of several batches add up. DataFormatError when the logs have
    no such column."""
    from qpr.data.loaders import DataFormatError

    missing = [f for f in fields if f not in logs.columns]
    if missing:
        raise DataFormatError(
            f"data.filter_fields names {', '.join(missing)}, which the logs do not have "
            f"(their columns: {', '.join(map(str, logs.columns))})"
        )
    keys = logs["question"].map(normalize).to_numpy()
    columns = ["norm_key", "field", "value"]
    parts = [
        pd.DataFrame({"norm_key": keys, "field": field, "value": logs[field].to_numpy()})
        for field in fields
    ]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns}).assign(n=0)
    frame = pd.concat(parts, ignore_index=True).dropna(subset=["value"])
    frame = frame[frame["norm_key"] != ""].astype({"value": str})
    return frame.groupby(columns, sort=True).size().reset_index(name="n")


def majority_tags(
    tags: pd.DataFrame, keys: Sequence[str], fields: Sequence[str]
) -> dict[str, list[str | None]]:
    """{field: a value per key}: the value each question was logged with most often, ties
    by the smaller value (as its answer is chosen); None when never logged with one."""
    tags = tags.groupby(["norm_key", "field", "value"], sort=False)["n"].sum().reset_index()
    order = ["norm_key", "field", "n", "value"]
    tags = tags.sort_values(order, ascending=[True, True, False, True])
    best = tags.drop_duplicates(["norm_key", "field"])
    out: dict[str, list[str | None]] = {}
    for field in fields:
        value_of = dict(
            zip(*(best.loc[best["field"] == field, c] for c in ("norm_key", "value")), strict=True)
        )
        out[field] = [value_of.get(key) for key in keys]
    return out


def questions_from_counts(
    forms: pd.DataFrame,
    votes: pd.DataFrame,
    tags: pd.DataFrame | None = None,
    fields: Sequence[str] = (),
) -> tuple[pd.DataFrame, dict[str, int]]:
    """(forms, votes) of `log_counts` (summed over batches) → one row per distinct question,
    sorted by norm_key: question_id, text, norm_key, cluster_id, answer_id; and counts.

    A distinct question is a distinct normalised text; its displayed text is its most
    frequent logged form. A question logged under several answers (a false negative of the
    logs) joins the answer it was logged under most often, ties by answer id, so every
    question is in exactly one cluster and cannot land in two splits. Its metadata fields
    (`tag_counts` of `fields`) follow the same rule (`majority_tags`).
    """
    forms = forms.groupby(["norm_key", "question"], sort=False)["n"].sum().reset_index()
    votes = votes.groupby(["norm_key", "answer_id"], sort=False)["n"].sum().reset_index()
    surface = (
        forms.sort_values(["norm_key", "n", "question"], ascending=[True, False, True])
        .drop_duplicates("norm_key")
        .set_index("norm_key")["question"]
    )
    votes = votes.sort_values(["norm_key", "n", "answer_id"], ascending=[True, False, True])
    answers_per_question = votes.groupby("norm_key").size()
    majority = votes.drop_duplicates("norm_key").set_index("norm_key")["answer_id"]
    keys = sorted(majority.index)
    answers = majority.loc[keys].to_numpy()
    cluster_of_answer = {a: stable_id(f"answer:{a}") for a in set(answers.tolist())}
    questions = pd.DataFrame(
        {
            "question_id": np.array([stable_id(k) for k in keys], dtype=np.int64),
            "text": surface.loc[keys].to_numpy(),
            "norm_key": keys,
            "cluster_id": np.array([cluster_of_answer[a] for a in answers], dtype=np.int64),
            "answer_id": answers,
        }
    )
    if fields and tags is not None:
        questions = questions.assign(
            **{f: pd.Series(v, dtype=object) for f, v in majority_tags(tags, keys, fields).items()}
        )
    counts = {
        "questions": len(questions),
        "questions_multi_answer": int((answers_per_question > 1).sum()),
    }
    return questions, counts


def cluster_frame(questions: pd.DataFrame, source_of: dict[int, str]) -> pd.DataFrame:
    """One row per cluster of `questions` (cluster_id -1 is none), sorted by cluster_id:
    cluster_id, source_key (`source_of[cluster_id]`), size, coherence."""
    clustered = questions[questions["cluster_id"] != NO_CLUSTER]
    rows = [
        {
            "cluster_id": int(cluster_id),
            "source_key": source_of[int(cluster_id)],
            "size": len(group),
            "coherence": coherence(group["text"].tolist()),
        }
        for cluster_id, group in clustered.groupby("cluster_id", sort=True)
    ]
    frame = pd.DataFrame(rows, columns=["cluster_id", "source_key", "size", "coherence"])
    return frame.astype({"cluster_id": "int64", "size": "int64", "coherence": "float64"})


def clusters_from_logs(
    logs: pd.DataFrame, fields: Sequence[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """Cleaned log rows → (questions, clusters, counts), in memory (`questions_from_counts`
    says how a question gets its text, cluster and metadata `fields`)."""
    tags = tag_counts(logs, fields) if fields else None
    questions, counts = questions_from_counts(*log_counts(logs), tags, fields)
    source_of = dict(zip(questions["cluster_id"], questions["answer_id"], strict=True))
    clusters = cluster_frame(questions, source_of)
    counts = {**counts, "answers": len(clusters)}
    return questions.drop(columns="answer_id"), clusters, counts


def clusters_from_pairs(pairs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """Quora-format pairs → (questions, clusters, counts).

    Clusters are the transitive closure of the duplicate pairs (paper section 4.1.2); every
    distinct question of the file is kept, including those that only occur in
    non-duplicate pairs (cluster_id -1): they belong in the index as distractors.
    """
    texts = (
        pd.concat(
            [
                pairs[["qid1", "question1"]].set_axis(["qid", "text"], axis=1),
                pairs[["qid2", "question2"]].set_axis(["qid", "text"], axis=1),
            ],
            ignore_index=True,
        )
        .drop_duplicates("qid")
        .sort_values("qid")
    )
    duplicates = pairs[pairs["is_duplicate"] == 1]
    component_of = components(
        zip(duplicates["qid1"].tolist(), duplicates["qid2"].tolist(), strict=True)
    )
    sizes: dict[int, int] = {}
    for root in component_of.values():
        sizes[root] = sizes.get(root, 0) + 1
    cluster_ids = [
        component_of[q] if q in component_of and sizes[component_of[q]] >= 2 else NO_CLUSTER
        for q in texts["qid"].tolist()
    ]
    questions = pd.DataFrame(
        {
            "question_id": texts["qid"].to_numpy(dtype=np.int64),
            "text": texts["text"].to_numpy(),
            "norm_key": texts["text"].map(normalize).to_numpy(),
            "cluster_id": np.array(cluster_ids, dtype=np.int64),
        }
    )
    clusters = cluster_frame(
        questions, {c: f"qid:{c}" for c in set(cluster_ids) if c != NO_CLUSTER}
    )
    counts = {
        "questions": len(questions),
        "pairs_in_file": len(pairs),
        "duplicate_pairs_in_file": len(duplicates),
    }
    return questions, clusters, counts

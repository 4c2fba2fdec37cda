"""New questions into a served bundle without retraining: what `qpr index add` and the
`refresh` flow run around `qpr.retrieval.deltas`.

A file is either QA logs (it has a timestamp column: the raw-log gate, then the cleaning
of the cluster stage) or a question list (.txt one question a line, or CSV / JSONL /
Parquet with a "question" or "text" column and optional question_id, answer_id). Questions
the bundle already serves with the same text are skipped; a listed question_id the bundle
serves is replaced (a changed answer). Other new questions get the id the cluster stage
would give them (`stable_id` of the normalised text): a full build that later finds them
in the logs indexes them once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qpr.artifacts import ANSWER_ID
from qpr.config import QualitySettings, Settings
from qpr.data.clustering import stable_id
from qpr.data.loaders import DataFormatError, clean_logs, read_log_file
from qpr.io import file_sha256
from qpr.retrieval import deltas
from qpr.text.normalize import normalize


def read_questions(path: Path, quality: QualitySettings, report_dir: Path | None) -> pd.DataFrame:
    """The file's questions: question_id (int64, -1: none given), text, answer_id.
    GateFailed when a log file fails the raw-log gate; DataFormatError for other files
    without a question column."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        frame = pd.DataFrame({"text": [line for line in lines if line]})
    else:
        frame = _table(path)
        if "timestamp" in frame.columns:
            return _from_logs(path, quality, report_dir)
        column = "question" if "question" in frame.columns else "text"
        if column not in frame.columns:
            raise DataFormatError(f"{path}: no question or text column")
        frame = frame.rename(columns={column: "text"})
    if "question_id" not in frame.columns:
        frame["question_id"] = -1
    if ANSWER_ID not in frame.columns:
        frame[ANSWER_ID] = None
    frame["text"] = frame["text"].astype(str).str.split().str.join(" ")
    lengths = frame["text"].str.len()
    keep = (lengths >= quality.min_question_chars) & (lengths <= quality.max_question_chars)
    frame = frame[keep].drop_duplicates("text")
    frame["question_id"] = pd.to_numeric(frame["question_id"]).fillna(-1).astype(np.int64)
    return frame[["question_id", "text", ANSWER_ID]].reset_index(drop=True)


def _table(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix in (".jsonl", ".json"):
        return pd.read_json(path, lines=True, dtype=False)
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _from_logs(path: Path, quality: QualitySettings, report_dir: Path | None) -> pd.DataFrame:
    """Each distinct clean question of a log file with its last logged answer."""
    from qpr.quality.data_gates import gate_raw_logs

    raw = read_log_file(path)
    gate_raw_logs(raw, quality, report_dir, part=path.stem)
    clean, _ = clean_logs(
        raw, min_chars=quality.min_question_chars, max_chars=quality.max_question_chars
    )
    last = clean.sort_values("timestamp_utc").drop_duplicates("question", keep="last")
    return pd.DataFrame(
        {
            "question_id": np.full(len(last), -1, np.int64),
            "text": last["question"].tolist(),
            ANSWER_ID: last["answer_id"].tolist(),
        }
    )


def new_questions(models_dir: Path, questions: pd.DataFrame) -> pd.DataFrame:
    """The questions to add: those whose given id the bundle serves (a replacement), and
    the others whose text and id it does not serve. Without a given id, a question's id is
    the cluster stage's (`stable_id` of its normalised text), so two spellings of one
    question are added once. cluster_id -1 (no paraphrase cluster is known before the next
    training)."""
    live = deltas.live_questions(models_dir)
    served_ids = set(live["question_id"].tolist())
    served_texts = set(live["text"].tolist())
    keys = questions["text"].map(normalize)
    ids = questions["question_id"].to_numpy(np.int64).copy()
    given = ids >= 0
    ids[~given] = [stable_id(k) for k in keys[~given]]
    served = np.isin(ids, list(served_ids))
    replaces = given & served
    fresh = ~questions["text"].isin(served_texts).to_numpy() & ~served & (keys != "").to_numpy()
    frame = questions.assign(question_id=ids)[replaces | fresh]
    frame = frame.drop_duplicates("question_id", keep="last")
    return frame.assign(cluster_id=np.int64(-1)).reset_index(drop=True)


def add_files(
    models_dir: Path,
    files: Sequence[Path],
    quality: QualitySettings,
    *,
    report_dir: Path | None = None,
    batch_size: int = 256,
    threads: int = 1,
) -> dict[str, Any]:
    """Every file's new questions as one delta (none when nothing is new). Returns
    {"files", "questions_read", "added", "replaced", "delta"}; files already indexed
    (same sha256, recorded in the manifest) are skipped."""
    manifest = deltas.read_manifest(models_dir)
    # A dropped delta's files stay out: the schedule would offer them again.
    seen = {s for d in manifest.deltas + manifest.dropped for s in d.get("sources", [])}
    todo = [(Path(f), file_sha256(f)) for f in files]
    todo = [(f, sha) for f, sha in todo if sha not in seen]
    frames = [read_questions(f, quality, report_dir) for f, _ in todo]
    read = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    out: dict[str, Any] = {"files": len(todo), "questions_read": len(read), "added": 0}
    if read.empty:
        return out | {"replaced": 0, "delta": None}
    frame = new_questions(models_dir, read.drop_duplicates("text", keep="last"))
    if frame.empty:
        return out | {"replaced": 0, "delta": None}
    entry = deltas.add_questions(
        models_dir,
        frame,
        batch_size=batch_size,
        threads=threads,
        sources=[sha for _, sha in todo],
    )
    return out | {"added": len(frame), "replaced": entry["replaced"], "delta": entry}


def read_ids(values: Sequence[int], file: Path | None) -> list[int]:
    """Question ids given one by one and / or in a file (one a line, or an .npy)."""
    ids = [int(v) for v in values]
    if file is not None:
        if Path(file).suffix == ".npy":
            ids += np.load(file, allow_pickle=False).astype(np.int64).tolist()
        else:
            ids += [int(line) for line in Path(file).read_text().split() if line.strip()]
    return ids


def publish(models_dir: Path, settings: Settings, *, actor: str, reason: str) -> dict[str, str]:
    """After an index change: pin it in dvc.lock (`qpr.ops.vcs.pin_deltas`) and, with
    registry.follow_deltas, register and promote it (`qpr.ops.registry.register_refresh`).
    The change is already served from the folder; a failure here undoes nothing and
    is said in the result ({"dvc": ..., "registry": ...})."""
    from qpr.ops.layout import RetrainError
    from qpr.ops.vcs import pin_deltas

    try:
        out = {"dvc": pin_deltas(models_dir)}
    except (RetrainError, OSError, ValueError) as err:
        out = {"dvc": f"not pinned: {err}"}
    if settings.registry.follow_deltas:
        from qpr.ops.registry import RegistryError, register_refresh

        try:
            info, said = register_refresh(
                models_dir, name=settings.registry.name, actor=actor, reason=reason
            )
            out["registry"] = said if info is None else f"version {info.version}: {said}"
        except RegistryError as err:
            out["registry"] = f"not registered: {err}"
    return out

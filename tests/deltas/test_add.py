"""Adding, deleting, dropping and compacting deltas (qpr.deltas.add), as Bundle serves them.

The fixture bundle (factories.py) is changed with the library, as `qpr index add` does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qpr.artifacts import (
    ABSORBED_FILE,
    BM25_FILE,
    DELTA_QUESTIONS_FILE,
    DELTAS_DIR,
    DELTAS_MANIFEST_FILE,
    QUESTIONS_FILE,
    WRITER_LOCK_FILE,
)
from qpr.config import QualitySettings
from qpr.data.loaders import DataFormatError
from qpr.deltas import format as delta_format
from qpr.deltas.add import (
    add_files,
    add_questions,
    compact,
    delete_questions,
    drop_delta,
    read_ids,
    read_questions,
)
from qpr.deltas.format import (
    DeltaError,
    absorbed_version,
    check_deltas,
    delta_dir,
    delta_files,
    live_questions,
    read_manifest,
)
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.bundle import Bundle
from qpr.retrieval.loading import BundleError

from .factories import LATER, MAIN, MAIN_IDS, flat, frame, ids, search_config, write_index


def test_a_deltas_questions_are_found_without_retraining(models: Path) -> None:
    before = Bundle.load(models)
    entry = add_questions(models, frame(LATER[:10], list(range(1, 11))))
    bundle = Bundle.load(models)
    assert bundle.size == before.size + 10 and entry["rows"] == 10
    assert bundle.fingerprint != before.fingerprint
    for i, text in enumerate(LATER[:10]):
        hit = bundle.search(text, k=3).hits[0]
        assert (hit.question_id, hit.answer_id, hit.distance) == (i + 1, "new", 0.0)
    # a reworded question still finds its delta question (BM25 on main's words + dense)
    reworded = LATER[0].replace("how do i", "how can i").replace("?", "")
    assert 1 in ids(bundle, reworded, k=5)
    # batches, explanations and dense-only search see the delta too
    batch = bundle.search_batch(LATER[:10], k=1)
    assert [r.hits[0].question_id for r in batch] == list(range(1, 11))
    assert bundle.search(LATER[3], k=2, explain=True).hits[0].explain is not None


def test_bm25_drift_is_measured(models: Path) -> None:
    entry = add_questions(
        models, frame(["how do i varnish my canoe", "how do i sell my car"], [1, 2])
    )
    # "varnish" and "canoe" are unknown to the main vocabulary: they score nothing
    assert (entry["unknown_terms"], entry["unknown_tokens"]) == (2, 2)
    assert entry["tokens"] > entry["unknown_tokens"]


def test_a_delta_added_to_a_chars_bundle_is_searched_with_chars(models: Path) -> None:
    from qpr.text.words import char_grams

    BM25Index.build(MAIN, k1=1.2, analyzer="chars").save(models / BM25_FILE)
    # new words made of grams the main questions have ("piano", "house", "boat", "garden")
    entry = add_questions(models, frame(["my pianohouse and boatgarden"], [1]))
    assert entry["tokens"] == len(
        char_grams(["my", "pianohouse", "boatgarden"])
    )  # grams, not words
    bundle = Bundle.load(models)
    assert bundle.bm25 is not None and bundle.bm25.analyzer == "chars"
    _, rows = bundle.bm25.search("pianohose boatgardn", 1)  # typo'd, as a user types
    assert int(rows[0]) == bundle.size - 1  # the delta's row, after main's
    compact(models, flat)
    assert BM25Index.load(models / BM25_FILE).settings["analyzer"] == "chars"


def test_a_tombstoned_question_never_comes_back(models: Path) -> None:
    add_questions(models, frame(LATER[:4], [1, 2, 3, 4]))
    out = delete_questions(models, [MAIN_IDS[5], 2, 999_999])
    assert out["deleted"] == [2, MAIN_IDS[5]] and out["unknown"] == [999_999]
    bundle = Bundle.load(models)
    everything = bundle.size
    for text in (MAIN[5], LATER[1]):
        assert not {MAIN_IDS[5], 2} & set(ids(bundle, text, everything))
        (result,) = bundle.search_batch([text], k=everything, explain=True)
        assert not {MAIN_IDS[5], 2} & {hit.question_id for hit in result.hits}
        assert len(result.hits) == everything  # the dead rows leave no hole
    dense = bundle.with_questions(_questions_of(bundle), dense_only=True)
    assert not {MAIN_IDS[5], 2} & set(ids(dense, MAIN[5], 20))


def _questions_of(bundle: Bundle):
    """The loaded rows, dead mask included, without BM25 (a dense-only search)."""
    from qpr.retrieval.bundle import IndexedQuestions

    return IndexedQuestions(
        bundle._index,
        bundle._qids,
        bundle._texts,
        bundle._cluster_ids,
        None,
        bundle._answer_ids,
        dead=None if bundle._live_rows is None else ~bundle._live_rows,
    )


def test_deleting_nothing_served_writes_no_manifest(models: Path) -> None:
    assert delete_questions(models, [999_999]) == {
        "deleted": [],
        "unknown": [999_999],
        "version": 0,
    }
    assert delta_files(models) == []


def test_a_changed_answer_replaces_the_old_row(models: Path) -> None:
    add_questions(models, frame([MAIN[7]], [MAIN_IDS[7]], answer="changed"))
    bundle = Bundle.load(models)
    hits = [h for h in bundle.search(MAIN[7], k=bundle.size).hits if h.question_id == MAIN_IDS[7]]
    assert len(hits) == 1 and hits[0].answer_id == "changed"
    assert bundle.size == len(MAIN)


@pytest.mark.parametrize("fused", [False, True])
def test_compaction_equals_a_full_build(models: Path, tmp_path: Path, fused: bool) -> None:
    search_config(fused).write(models)
    add_questions(models, frame(LATER[:16], list(range(1, 17))))
    delete_questions(models, [MAIN_IDS[0], 3])
    add_questions(models, frame(LATER[16:24], list(range(17, 25))))
    live = live_questions(models)
    with_deltas = Bundle.load(models)
    queries = [*MAIN[::7], *LATER[:24:3], "clean the bicycle", "sell boat"]
    served = [ids(with_deltas, q, 5) for q in queries]

    full = Path(shutil.copytree(models, tmp_path / "full"))
    shutil.rmtree(full / "index")
    shutil.rmtree(full / DELTAS_DIR)
    (full / "index").mkdir()
    write_index(full, live["text"].tolist(), live["question_id"].tolist())
    manifest = (models / DELTAS_MANIFEST_FILE).read_bytes()
    out = compact(models, flat)
    assert out == {
        "questions": len(live),
        "deltas_merged": 2,
        "tombstones_applied": 2,
        "version": 3,
    }
    # The manifest stays (a full build needs the deltas again); loads skip what is absorbed.
    assert (models / DELTAS_MANIFEST_FILE).read_bytes() == manifest
    assert absorbed_version(models) == read_manifest(models).version == 3
    assert delta_files(models) == [ABSORBED_FILE, DELTAS_MANIFEST_FILE]
    compacted, rebuilt = Bundle.load(models), Bundle.load(full)
    assert compacted.size == rebuilt.size == with_deltas.size
    assert [ids(compacted, q, 5) for q in queries] == [ids(rebuilt, q, 5) for q in queries]
    if not fused:  # the same exact distances before and after; fused: IDF is recomputed
        assert [ids(compacted, q, 5) for q in queries] == served


def _state(models: Path) -> tuple[str, list[list[int]]]:
    bundle = Bundle.load(models)
    return bundle.fingerprint, [ids(bundle, q, 3) for q in (MAIN[1], LATER[0], LATER[5])]


def test_an_add_that_fails_before_its_commit_changes_nothing(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_questions(models, frame(LATER[:3], [1, 2, 3]))
    before = _state(models)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    # The manifest's one writer (manifest_update) fails at the commit point.
    monkeypatch.setattr(delta_format, "write_json_atomic", crash)
    with pytest.raises(OSError, match="disk full"):
        add_questions(models, frame(LATER[3:8], [4, 5, 6, 7, 8]))
    assert (models / delta_dir(2)).is_dir()  # written, but named by no manifest
    assert _state(models) == before
    monkeypatch.undo()
    add_questions(models, frame(LATER[3:8], [4, 5, 6, 7, 8]))
    assert 5 in ids(Bundle.load(models), LATER[4], 1)


def test_a_killed_add_leaves_the_served_state_unchanged(models: Path) -> None:
    before = _state(models)
    # SIGKILL at the commit point: the delta folder is renamed, the manifest not written
    script = f"""
import os, signal
import pandas as pd
from qpr.deltas import format
from qpr.deltas.add import add_questions
format.write_json_atomic = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
frame = pd.DataFrame({{"question_id": [1, 2], "text": {LATER[:2]!r}, "cluster_id": -1}})
add_questions({str(models)!r}, frame)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, check=False)
    assert done.returncode == -signal.SIGKILL
    assert (models / DELTAS_DIR).is_dir()
    assert _state(models) == before
    assert json.loads(json.dumps(read_manifest(models).as_dict()))["deltas"] == []


def test_filters_see_deltas_tombstones_and_survive_compaction(models: Path) -> None:
    """A filter field of the main index: a delta's rows are null (no filter matches
    them), a tombstone hides a matching row, and compaction keeps the field."""
    locale = ["en" if i % 2 == 0 else "de" for i in range(len(MAIN))]
    table = pq.read_table(models / QUESTIONS_FILE)
    pq.write_table(
        table.append_column("locale", pa.array(locale, pa.string())), models / QUESTIONS_FILE
    )
    add_questions(models, frame(LATER[:4], [1, 2, 3, 4]))
    delete_questions(models, [MAIN_IDS[0]])
    english = {q for q, lang in zip(MAIN_IDS, locale, strict=True) if lang == "en"} - {MAIN_IDS[0]}

    def found(bundle: Bundle) -> set[int]:
        (result,) = bundle.search_batch([LATER[0]], k=bundle.size, filters={"locale": "en"})
        return {hit.question_id for hit in result.hits}

    bundle = Bundle.load(models)
    assert found(bundle) == english  # no delta row, not the tombstoned one
    by_answer = bundle.search(LATER[0], k=bundle.size, filters={"answer_id": "new"})
    assert {hit.question_id for hit in by_answer.hits} == {1, 2, 3, 4}
    compact(models, flat)
    assert found(Bundle.load(models)) == english


def test_dropping_a_delta_undoes_its_add(models: Path) -> None:
    """The dropped delta's questions go, the rows it replaced come back, a later delta
    stays, and its number is never given again."""
    add_questions(models, frame([*LATER[:2], MAIN[2]], [1, 2, MAIN_IDS[2]], "bad"))
    add_questions(models, frame(LATER[2:4], [3, 4]))
    bundle = Bundle.load(models)
    assert bundle.search(MAIN[2], k=1).hits[0].answer_id == "bad"

    out = drop_delta(models, 1, reason="wrong answers")
    assert out == {"dropped": 1, "questions": 3, "tombstones_lifted": 1, "version": 3}
    assert not (models / delta_dir(1)).exists()
    live = live_questions(models).set_index("question_id")
    assert {1, 2}.isdisjoint(live.index) and {3, 4} <= set(live.index)
    assert live.loc[MAIN_IDS[2], "answer_id"] == f"a{MAIN_IDS[2]}"
    bundle = Bundle.load(models)
    assert bundle.search(MAIN[2], k=1).hits[0].answer_id == f"a{MAIN_IDS[2]}"
    assert bundle.search(LATER[0], k=1).hits[0].question_id not in (1, 2)
    assert add_questions(models, frame(LATER[4:5], [5]))["number"] == 3
    assert read_manifest(models).dropped[0]["reason"] == "wrong answers"
    with pytest.raises(DeltaError, match="no delta 1"):
        drop_delta(models, 1)


def _files(models: Path) -> dict[str, tuple[int, int]]:
    """Every file of the bundle but the writer lock: (size, mtime) by relative path."""
    return {
        p.relative_to(models).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(models.rglob("*"))
        if p.is_file() and p.name != WRITER_LOCK_FILE.name
    }


def test_writers_refuse_to_build_on_a_delta_that_fails_its_check(
    models: Path, tmp_path: Path
) -> None:
    """add, delete and compact write nothing on a broken delta and say, in one line, to
    drop it; drop is the repair, and then they work again."""
    add_questions(models, frame(LATER[:2], [1, 2]))
    table = models / delta_dir(1) / DELTA_QUESTIONS_FILE
    table.write_bytes(table.read_bytes()[:-10])
    listed = tmp_path / "new.txt"
    listed.write_text(f"{LATER[3]}\n")
    before = _files(models)
    attempts = {
        "add": lambda: add_questions(models, frame(LATER[2:3], [3])),
        "add files": lambda: add_files(models, [listed], QualitySettings()),
        "delete": lambda: delete_questions(models, [MAIN_IDS[0]]),
        "compact": lambda: compact(models, flat),
    }
    for name, attempt in attempts.items():
        with pytest.raises(DeltaError) as refused:
            attempt()
        said = str(refused.value)
        assert "delta 1 fails its check" in said and "`qpr index drop 1`" in said, name
        assert "nothing written" in said and "\n" not in said
        assert _files(models) == before, name

    drop_delta(models, 1, reason="corrupt")
    assert check_deltas(models) == {}
    assert add_files(models, [listed], QualitySettings())["added"] == 1
    bundle = Bundle.load(models)
    assert bundle.search(LATER[3], k=1).hits[0].text == LATER[3] and not bundle.failed_deltas


def test_an_add_on_a_corrupt_manifest_writes_nothing(models: Path) -> None:
    add_questions(models, frame(LATER[:2], [1, 2]))
    (models / DELTAS_MANIFEST_FILE).write_text('{"format": "qpr-deltas/1", "version": ')
    before = _files(models)
    with pytest.raises(DeltaError, match="not a readable deltas manifest"):
        add_questions(models, frame(LATER[2:3], [3]))
    assert _files(models) == before


def test_a_compacted_delta_cannot_be_dropped_and_later_ones_still_load(models: Path) -> None:
    add_questions(models, frame(LATER[:2], [1, 2]))
    compact(models, flat)
    with pytest.raises(DeltaError, match="main index"):
        drop_delta(models, 1)
    add_questions(models, frame(LATER[2:3], [3]))
    delete_questions(models, [1])
    bundle = Bundle.load(models)
    assert bundle.size == len(MAIN) + 2  # main (with 1 and 2) + 3, less the deleted 1
    live = set(live_questions(models)["question_id"])
    assert live == set(MAIN_IDS) | {2, 3}
    assert ids(bundle, LATER[2], 1) == [3]
    assert 1 not in ids(bundle, LATER[0], bundle.size)


def test_a_delta_folder_holds_its_questions_in_row_order(models: Path) -> None:
    add_questions(models, frame(LATER[:3], [30, 10, 20]))
    table = pq.read_table(models / delta_dir(1) / DELTA_QUESTIONS_FILE).to_pandas()
    assert table["question_id"].tolist() == [30, 10, 20]
    assert table["cluster_id"].tolist() == [-1, -1, -1]


def test_question_lists_are_read_cleaned_and_deduplicated(tmp_path: Path) -> None:
    listed = tmp_path / "new.txt"
    listed.write_text("how do i  paint a boat\n\nhi\nhow do i paint a boat\n", encoding="utf-8")
    quality = QualitySettings(min_question_chars=5)
    read = read_questions(listed, quality, None)
    assert read["text"].tolist() == ["how do i paint a boat"]  # "hi" is too short
    assert read["question_id"].tolist() == [-1] and read["answer_id"].tolist() == [None]
    table = tmp_path / "new.csv"
    table.write_text("question_id,question,answer_id\n7,how do i sell a piano,a7\n")
    read = read_questions(table, quality, None)
    assert read.to_dict("records") == [
        {"question_id": 7, "text": "how do i sell a piano", "answer_id": "a7"}
    ]


def test_ids_come_one_by_one_and_from_files(tmp_path: Path) -> None:
    (tmp_path / "ids.txt").write_text("4\n5 6\n")
    np.save(tmp_path / "ids.npy", np.array([7, 8], np.int64))
    assert read_ids([1, 2], tmp_path / "ids.txt") == [1, 2, 4, 5, 6]
    assert read_ids([], tmp_path / "ids.npy") == [7, 8]
    big = 2**53 + 1  # as the service writes it: a string (qpr.ids)
    assert read_ids([str(big), 3], None) == [big, 3]
    with pytest.raises(ValueError, match="decimal digits"):
        read_ids(["3.0"], None)


def test_listed_ids_above_2_53_are_read_exactly(tmp_path: Path) -> None:
    """Strings or JSON integers, a row without one included: never through a float64."""
    big = 2**53 + 1
    quality = QualitySettings(min_question_chars=5)
    rows = [
        {"question_id": str(big), "question": "how do i sell a piano"},
        {"question_id": big + 2, "question": "how do i tune a piano"},
        {"question": "how do i move a piano"},
    ]
    listed = tmp_path / "new.jsonl"
    listed.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert read_questions(listed, quality, None)["question_id"].tolist() == [big, big + 2, -1]
    # Integers only, one row without: pandas reads a float64 column, which lost the digit.
    listed.write_text("".join(json.dumps(row) + "\n" for row in [rows[1], rows[2]]))
    with pytest.raises(DataFormatError, match="send it as a string"):
        read_questions(listed, quality, None)
    table = tmp_path / "new.csv"
    table.write_text(f"question_id,question\n{big},how do i sell a piano\n,how do i tune one\n")
    assert read_questions(table, quality, None)["question_id"].tolist() == [big, -1]
    table.write_text("question_id,question\n12abc,how do i sell a piano\n")
    with pytest.raises(DataFormatError, match="question_id"):
        read_questions(table, quality, None)


def test_a_question_id_given_as_a_string_is_deleted(models: Path) -> None:
    out = delete_questions(models, [str(MAIN_IDS[5]), MAIN_IDS[6]])
    assert out["deleted"] == sorted([MAIN_IDS[5], MAIN_IDS[6]])


def test_a_companion_covers_a_deltas_rows_and_survives_compaction(models: Path) -> None:
    """A bundle mixing in a companion (qpr.retrieval.companion): a delta's questions get
    their companion vectors when the bundle loads, and compaction writes them for the
    live rows (the old file's rows were the old index's)."""
    from dataclasses import replace

    from qpr.artifacts import COMPANION_FILE, SearchConfig
    from qpr.retrieval.companion import load_encoder

    encoder = load_encoder("wordllama")
    np.save(models / COMPANION_FILE, encoder.documents(MAIN))
    mixing = replace(search_config(True), companion="wordllama", companion_weight=0.5)
    mixing.write(models)
    before = Bundle.load(models)
    add_questions(models, frame(LATER[:4], [1, 2, 3, 4]))
    delete_questions(models, [MAIN_IDS[0]])
    bundle = Bundle.load(models)
    assert bundle.fingerprint != before.fingerprint
    companion = bundle._ranker.companion
    assert companion is not None and companion.rows == len(MAIN) + 4  # tombstoned rows kept
    np.testing.assert_array_equal(companion.vectors[-4:], encoder.documents(LATER[:4]))
    for i, text in enumerate(LATER[:4]):
        assert bundle.search(text, k=1).hits[0].question_id == i + 1
    compact(models, flat)
    live = MAIN[1:] + LATER[:4]
    np.testing.assert_array_equal(np.load(models / COMPANION_FILE), encoder.documents(live))
    compacted = Bundle.load(models)
    assert [compacted.search(t, k=1).hits[0].question_id for t in LATER[:4]] == [1, 2, 3, 4]
    # a config mixing in a companion whose vectors are gone is refused, naming the file
    (models / COMPANION_FILE).unlink()
    with pytest.raises(BundleError, match=r"companion\.npy is missing"):
        Bundle.load(models)
    assert SearchConfig.read(models).companion == "wordllama"

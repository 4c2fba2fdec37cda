"""Deltas encoded again with the bundle's present encoder (qpr.deltas.add.reencode_deltas):
what a retraining's rollback does for the adds made while the cycle ran, whose vectors
came from the model the rollback removed."""

from __future__ import annotations

from pathlib import Path

from qpr.artifacts import DELTA_IDS_FILE, ENCODER_FILE
from qpr.deltas.add import add_questions, delete_questions, reencode_deltas
from qpr.deltas.format import check_deltas, delta_dir, live_questions, read_manifest

from .factories import LATER, MAIN_IDS, found_at_zero, frame, write_encoder


def test_the_deltas_added_after_a_version_are_encoded_again(models: Path) -> None:
    before_cycle = add_questions(models, frame(LATER[:3], [1, 2, 3]))
    served = (models / ENCODER_FILE).read_bytes()
    since = read_manifest(models).version
    # While a retraining ran: its encoder made the next delta's vectors.
    write_encoder(models, seed=1, output_dim=8)
    add_questions(models, frame(LATER[3:6], [4, 5, 6]))
    delete_questions(models, [5, MAIN_IDS[0]])
    (models / ENCODER_FILE).write_bytes(served)  # the rollback's checkout
    assert not found_at_zero(models, [LATER[3]])
    manifest = read_manifest(models)

    out = reencode_deltas(models, since)

    assert out == {"reencoded": [2], "left": {}}
    after = read_manifest(models)
    assert check_deltas(models) == {}
    assert after.version == manifest.version and after.tombstones == manifest.tombstones
    first, second = after.deltas
    assert first == manifest.deltas[0] and first["sha256"] == before_cycle["sha256"]
    assert second["sha256"] != manifest.deltas[1]["sha256"]  # new vectors
    assert {**second, "sha256": None} == {**manifest.deltas[1], "sha256": None}
    live = set(live_questions(models)["question_id"])
    assert {1, 2, 3, 4, 6} <= live and not {5, MAIN_IDS[0]} & live
    assert found_at_zero(models, [LATER[i] for i in (0, 1, 2, 3, 5)])


def test_a_delta_of_another_width_is_sound_again(models: Path) -> None:
    served = (models / ENCODER_FILE).read_bytes()
    write_encoder(models, seed=1, output_dim=4)
    add_questions(models, frame(LATER[:2], [1, 2]))
    (models / ENCODER_FILE).write_bytes(served)
    assert set(check_deltas(models)) == {1}  # 4-d vectors beside an 8-d main index

    assert reencode_deltas(models, 0) == {"reencoded": [1], "left": {}}

    assert check_deltas(models) == {} and found_at_zero(models, LATER[:2])


def test_a_delta_whose_files_changed_is_left_as_it_is(models: Path) -> None:
    add_questions(models, frame(LATER[:2], [1, 2]))
    add_questions(models, frame(LATER[2:4], [3, 4]))
    ids = models / delta_dir(1) / DELTA_IDS_FILE
    ids.write_bytes(ids.read_bytes()[:-8])
    untouched = (models / delta_dir(1) / DELTA_IDS_FILE).read_bytes()

    out = reencode_deltas(models, None)

    assert out["reencoded"] == [2] and set(out["left"]) == {1}
    assert ids.read_bytes() == untouched and set(check_deltas(models)) == {1}

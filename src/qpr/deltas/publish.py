"""After an index change (`qpr index add | delete | drop | compact`, the refresh flow):
pinned in dvc.lock by `dvc commit`, and, with registry.follow_deltas, registered and
promoted as a version that `qpr model rollback` undoes.

The change is already served from the folder; publishing it undoes nothing when it fails.
Publishing holds the writer lock (`qpr.deltas.lock`): no add changes the folder while
`dvc commit` hashes it or the registry copies it. MLflow is reached only through the
registry adapter (`qpr.ops.registry`), imported when a change is registered, so a change
that is not registered never loads MLflow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qpr.artifacts import DELTAS_DIR, INDEX_DIR
from qpr.config import Settings
from qpr.deltas.lock import WriterBusy, writer_lock
from qpr.ops.processes import run_tool, tool_env

if TYPE_CHECKING:
    from qpr.ops.registry import VersionInfo

__all__ = ["pin_deltas", "publish", "register_deltas"]

# What `qpr index add | delete | drop | compact` change: the index stage's outputs only.
_INDEX_OUTS = {(Path("models") / folder).as_posix() for folder in (INDEX_DIR, DELTAS_DIR)}


def publish(models_dir: Path, settings: Settings, *, actor: str, reason: str) -> dict[str, str]:
    """Pin the change in dvc.lock (`pin_deltas`) and, with registry.follow_deltas, register
    and promote it (`register_deltas`). A failure here undoes nothing and is said in the
    result ({"dvc": ..., "registry": ...}). Both run under the models folder's writer lock
    (`qpr.deltas.lock`), so what is pinned and registered is one state of the folder."""
    try:
        with writer_lock(models_dir):
            return _publish(models_dir, settings, actor=actor, reason=reason)
    except WriterBusy as err:
        return {"dvc": f"not pinned: {err}"}


def _publish(models_dir: Path, settings: Settings, *, actor: str, reason: str) -> dict[str, str]:
    from qpr.ops.layout import RetrainError

    try:
        out = {"dvc": pin_deltas(models_dir)}
    except (RetrainError, OSError, ValueError) as err:
        out = {"dvc": f"not pinned: {err}"}
    if settings.registry.follow_deltas:
        from qpr.ops.registry import RegistryError

        try:
            info, said = register_deltas(
                models_dir, name=settings.registry.name, actor=actor, reason=reason
            )
            out["registry"] = said if info is None else f"version {info.version}: {said}"
        except (RegistryError, OSError) as err:
            # OSError: a bundle whose first build has not finished (an add while the first
            # retraining runs its evaluate stage, before search.json exists).
            out["registry"] = f"not registered: {err}"
    return out


def pin_deltas(models_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """`dvc commit` the index stage after an index change, so dvc.lock pins each delta and
    the DVC cache keeps its files (`dvc checkout` brings back any pinned state). Only when
    nothing but those outputs changed: with a changed dep, dvc.lock would claim a build
    that never ran (`dvc repro` builds and pins it then). Says what it did."""
    models_dir = Path(models_dir).resolve()
    root = models_dir.parent
    if models_dir.name != "models" or not (root / "dvc.yaml").is_file():
        return "not the models/ of a DVC project: nothing pinned"
    env = env or tool_env()
    status = run_tool(["dvc", "status", "--json", "index"], root, env, check=False)
    if status.returncode != 0:
        return f"not pinned: `dvc status` failed: {(status.stderr or status.stdout).strip()[-300:]}"
    changes = json.loads(status.stdout or "{}").get("index", [])
    if not changes:
        return "dvc.lock already pins this state"
    outs = [c.get("changed outs", {}) for c in changes if isinstance(c, dict)]
    other = [c for c in changes if not (isinstance(c, dict) and set(c) == {"changed outs"})]
    if other or any(set(o) - _INDEX_OUTS or set(o.values()) != {"modified"} for o in outs):
        return f"dvc.lock left as it was: the index stage has other changes {changes}"
    run_tool(["dvc", "commit", "--force", "--quiet", "index"], root, env)
    return "pinned in dvc.lock (dvc commit index)"


def register_deltas(
    models_dir: str | Path, *, name: str, actor: str, reason: str
) -> tuple[VersionInfo | None, str]:
    """The bundle with its deltas as a new registry version, committed and promoted, when
    the champion has the same base (`registry.TAG_BASE`). So a service that follows the
    registry serves the change, and `rollback` undoes it. Returns (the version or None,
    what happened). A version rolled back before is not promoted again; a champion with
    another base (a retraining not promoted yet, or one registered before deltas were)
    leaves the change local. RegistryError when the registry cannot be reached."""
    from qpr.ops import registry

    models_dir = Path(models_dir)
    current = registry.champion(name)
    if current is None:
        return None, f"model {name!r} has no champion: the change stays local"
    if current.tag(registry.TAG_BASE) != registry.base_fingerprint(models_dir):
        return None, (
            f"champion version {current.version} serves another base than {models_dir} "
            "(or was registered before deltas were): the change stays local"
        )
    measures = json.loads(current.tag(registry.TAG_MEASURES) or "{}")
    metrics: dict[str, Any] = {k: v for k, v in measures.items() if not k.startswith("val.")}
    metrics["val"] = {k[4:]: v for k, v in measures.items() if k.startswith("val.")}
    keep = (registry.TAG_DATA_SOURCE, registry.TAG_DATA_HASH, registry.TAG_GIT_COMMIT)
    info = registry.register_bundle(
        models_dir,
        metrics,
        name=name,
        metric=current.tag(registry.TAG_METRIC) or "val.recip_rank",
        tags={key: value for key in keep if (value := current.tag(key)) is not None},
    )
    if info.version == current.version:
        return info, f"version {info.version} already serves this state"
    if registry.last_event(info, "rolled_back") is not None:
        return info, f"version {info.version} holds this state and was rolled back: not promoted"
    registry.mark_committed(name, info.version, by=actor)
    return registry.promote(name, info.version, reason=reason, actor=actor), "promoted"

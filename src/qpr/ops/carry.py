"""The deltas that `qpr index add | delete | drop` acknowledge while a retraining cycle runs:
none is lost, whether the cycle is rolled back or commits.

A cycle does not hold the models folder's writer lock (`qpr.deltas.lock`) while it runs:
adds would wait for minutes. The index stage holds it from its read of the deltas to its
swap; the steps here hold it while they change models/.

Rolled back (`checkout_keeping_deltas`): the deltas as they are now are copied beside the
journal's snapshot, `dvc checkout` puts the old base back (and, without this, the deltas
dvc.lock pinned before the cycle), then the copy goes back on top of the old base. The
deltas added after the snapshot (manifest version above the journal's `deltas_version`)
may have been encoded by the model the rollback removed: they are encoded again with the
restored one (`qpr.deltas.add.reencode_deltas`). The cycle then publishes them as an add
does (`qpr.deltas.publish.publish`). Each step is repeatable: a rollback killed halfway
starts again from the copy.

Committed: the register stage registered the bundle with the deltas it found. The cycle
pins the deltas in dvc.lock before its git commit (`pin_carried`: an add's own pin fails
while `dvc repro` holds DVC's lock), and after it has settled the registry, a change
acknowledged after the register stage's copy is registered and promoted on top of the new
version (`register_carried`, with registry.follow_deltas).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from qpr.artifacts import DELTAS_DIR, DELTAS_MANIFEST_FILE, ENCODER_FILE
from qpr.config import Settings
from qpr.deltas.add import reencode_deltas
from qpr.deltas.format import DeltaError, absorbed_version, read_manifest
from qpr.deltas.lock import WriterBusy, writer_lock
from qpr.deltas.publish import pin_deltas, register_deltas
from qpr.io import replace_dir
from qpr.ops.layout import RetrainError

__all__ = [
    "KEPT_DIR",
    "checkout_keeping_deltas",
    "deltas_version",
    "pin_carried",
    "register_carried",
]

# The copy of models/deltas a rollback keeps, inside the journal's snapshot folder.
KEPT_DIR = "deltas-kept"


def deltas_version(models_dir: Path) -> int | None:
    """The deltas manifest's version now (0 without one); None when it is unreadable (a
    rollback then encodes again every delta the main index does not hold)."""
    try:
        return read_manifest(models_dir).version
    except DeltaError:
        return None


def checkout_keeping_deltas(
    models_dir: Path,
    kept: Path,
    since: int | None,
    checkout: Callable[[], str],
    settings: Settings,
) -> tuple[list[str], bool]:
    """`checkout()` (the stage outputs back to the restored dvc.lock) under the writer lock
    of `models_dir`, with its deltas kept: copied into `kept` first (once: a repeated
    rollback uses the copy it made), put back after, and those added after manifest
    version `since` encoded again with the restored encoder. Returns (what was done,
    whether deltas were kept that the checkout had undone or that were added since: they
    need publishing)."""
    if not models_dir.is_dir():
        return [checkout()], False
    deltas = models_dir / DELTAS_DIR
    with writer_lock(models_dir):
        if not kept.is_dir() and deltas.is_dir():
            _copy_dir(deltas, kept)
        done = [checkout()]
        if not kept.is_dir():
            return done, False
        checked_out = _manifest_sha256(models_dir)
        staging = deltas.with_name(deltas.name + ".kept-tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(kept, staging)
        replace_dir(staging, deltas)
        now = _manifest_sha256(models_dir)
        newer = _added_since(models_dir, since)
        if now == checked_out and not newer:
            return done, False
        if now is None or not newer or not (models_dir / ENCODER_FILE).is_file():
            # Nothing to encode, or nothing to encode with (no base was served before the
            # cycle: the next full build absorbs them).
            return [*done, f"deltas kept ({newer} added during the run)"], True
        out = reencode_deltas(
            models_dir,
            since,
            batch_size=settings.index.encode_batch_size,
            threads=settings.index.threads,
        )
    done.append(
        f"deltas kept; {len(out['reencoded'])} added during the run encoded again with the "
        "restored encoder"
    )
    done += [f"delta {n} left as it is: {why}" for n, why in sorted(out["left"].items())]
    return done, True


def _added_since(models_dir: Path, since: int | None) -> int:
    """How many deltas the main index does not hold were added after version `since`."""
    try:
        pending, _ = read_manifest(models_dir).pending(absorbed_version(models_dir))
    except DeltaError:
        return 0
    return sum(1 for d in pending if since is None or int(d["version"]) > since)


def _copy_dir(source: Path, target: Path) -> None:
    """`source` copied to `target`, which exists only once the copy is whole."""
    partial = target.with_name(target.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    partial.rename(target)


def _manifest_sha256(models_dir: Path) -> str | None:
    try:
        return read_manifest(models_dir).sha256
    except DeltaError:
        return None


def pin_carried(models_dir: Path, env: Mapping[str, str]) -> list[str]:
    """After a cycle's `dvc repro`: the deltas as they are now pinned in dvc.lock (the
    repro pinned those the index stage found). A failure is said, not raised."""
    if not (models_dir / DELTAS_MANIFEST_FILE).is_file():
        return []
    try:
        with writer_lock(models_dir):
            said = pin_deltas(models_dir, env)
    except (RetrainError, WriterBusy, OSError, ValueError) as err:
        said = f"not pinned: {err}"
    return [] if said == "dvc.lock already pins this state" else [f"deltas: {said}"]


def register_carried(
    models_dir: Path, settings: Settings, version: int, *, actor: str, reason: str
) -> list[str]:
    """With registry.follow_deltas: when the deltas changed after the register stage
    copied the bundle as `version`, the bundle as it is now registered and promoted on top
    of it (`qpr.deltas.publish.register_deltas`: only when the champion serves the same
    base). A registry error is said, not raised."""
    from qpr.ops import registry

    name = settings.registry.name
    if not settings.registry.follow_deltas or not (models_dir / DELTAS_MANIFEST_FILE).is_file():
        return []
    try:
        with writer_lock(models_dir):
            held = json.loads(registry.get_version(name, version).tag(registry.TAG_DELTAS) or "{}")
            if held.get("manifest_sha256") == _manifest_sha256(models_dir):
                return []
            info, said = register_deltas(models_dir, name=name, actor=actor, reason=reason)
    except (registry.RegistryError, WriterBusy, DeltaError, ValueError) as err:
        return [f"registry: deltas added during the run not registered: {err}"]
    where = said if info is None else f"version {info.version}: {said}"
    return [f"registry: deltas added during the run: {where}"]

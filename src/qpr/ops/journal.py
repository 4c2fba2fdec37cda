"""The journal that makes a retraining run undoable, and the recovery that reads it.

The journal (``<state_dir>/journal.json``) is written *before* data/ changes. It holds
what is needed to put everything back: a hard-link snapshot of data/ (cheap: the merge
writes new files and renames them, so the snapshot's inodes are never written to), copies
of data.dvc, dvc.lock and the uncached stage outputs, and an opaque snapshot of the model
registry that the caller supplies. A run moves the journal through three phases:

``begun``      data/ may be modified from here on
``repro``      ``dvc repro`` is running (the pid and start time of its process group are
               recorded, so a successor can stop what a killed run left behind)
``committed``  the commit point: the pipeline succeeded and everything is kept

Whoever finds a journal (the next run, first thing, or ``qpr retrain --recover-only``)
rolls a ``begun``/``repro`` run back and rolls a ``committed`` one forward (finishes
archiving the incoming files). Every recovery step is idempotent, so a crash during
recovery is recovered by the next one. What rolling back or forward means for the
registry, git and DVC is the caller's (qpr.ops.cycle), passed in as functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qpr.io import fsync_dir, replace_dir, write_json_atomic
from qpr.ops.incoming import IncomingFile
from qpr.ops.layout import RetrainError, RetrainLayout
from qpr.ops.processes import kill_group, pid_alive

JOURNAL_VERSION = 1
PHASES = ("begun", "repro", "committed")


def _link_tree(source: Path, target: Path) -> None:
    """Mirror `source` into `target` with hard links (copies where linking fails)."""
    for dirpath, _dirnames, filenames in os.walk(source):
        rel = Path(dirpath).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            src = Path(dirpath) / name
            dst = target / rel / name
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


@dataclass
class Journal:
    """The on-disk record of one run in progress (see the module docstring)."""

    layout: RetrainLayout
    data: dict[str, Any]

    @property
    def phase(self) -> str:
        return str(self.data["phase"])

    @property
    def files(self) -> list[IncomingFile]:
        return [
            IncomingFile(path=Path(f["path"]), sha256=f["sha256"], size=int(f["size"]))
            for f in self.data.get("files", [])
        ]

    def save(self) -> None:
        write_json_atomic(self.layout.journal, self.data)

    def set(self, **values: Any) -> None:
        self.data.update(values)
        self.save()

    @classmethod
    def load(cls, layout: RetrainLayout) -> Journal | None:
        if not layout.journal.is_file():
            return None
        data = json.loads(layout.journal.read_text(encoding="utf-8"))
        if data.get("version") != JOURNAL_VERSION or data.get("phase") not in PHASES:
            raise RetrainError(
                f"{layout.journal} is not a journal this qpr understands ({data.get('version')}"
                f", {data.get('phase')}): resolve by hand, then delete it"
            )
        return cls(layout, data)

    @classmethod
    def begin(
        cls,
        layout: RetrainLayout,
        *,
        run: str,
        files: Sequence[IncomingFile],
        registry: Any = None,
        outputs: Sequence[str] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> Journal:
        """Snapshot data/, data.dvc, dvc.lock and copies of the given stage `outputs`
        (project-relative: the uncached ones, which `dvc checkout` cannot bring back);
        then write the journal. Only after this returns may anything in data/ change."""
        if layout.journal.exists():
            raise RetrainError(f"{layout.journal} exists: recover the previous run first")
        snap = layout.snapshot
        shutil.rmtree(snap, ignore_errors=True)  # a leftover from a run that never began
        snap.mkdir(parents=True)
        _link_tree(layout.data_dir, snap / "data")
        shutil.copy2(layout.dvc_file, snap / layout.dvc_file.name)
        had_lock = layout.dvc_lock.is_file()
        if had_lock:
            shutil.copy2(layout.dvc_lock, snap / "dvc.lock")
        saved, absent = [], []
        for rel in outputs:
            source = layout.root / rel
            target = snap / "outs" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            # Copies, not links: a stage may rewrite these files in place.
            if source.is_dir():
                shutil.copytree(source, target)
            elif source.is_file():
                shutil.copy2(source, target)
            else:
                absent.append(rel)
                continue
            saved.append(rel)
        journal = cls(
            layout,
            {
                "version": JOURNAL_VERSION,
                "run": run,
                "phase": "begun",
                "started_at": datetime.now(UTC).isoformat(),
                "started_ms": int(time.time() * 1000),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "files": [{"path": str(f.path), "sha256": f.sha256, "size": f.size} for f in files],
                "had_dvc_lock": had_lock,
                "outputs": {"saved": saved, "absent": absent},
                "registry": registry,
                "child": None,
                **dict(extra or {}),
            },
        )
        journal.save()
        return journal

    def close(self) -> None:
        """Forget the run: drop the snapshot, then the journal (the last thing to go)."""
        shutil.rmtree(self.layout.snapshot, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.layout.journal.unlink()
        fsync_dir(self.layout.state_dir)

    def keep_copy(self, outcome: str) -> Path:
        """Keep the journal under ``<state_dir>/recovered/`` for the record."""
        target = self.layout.state_dir / "recovered" / f"{self.data['run']}.json"
        return write_json_atomic(target, {**self.data, "recovery": outcome})


def restore_data(journal: Journal) -> list[str]:
    """Put data/, data.dvc and dvc.lock back as the journal's snapshot has them.

    Idempotent, and safe to interrupt: data/ is swapped by renames on one file system
    (`qpr.io.replace_dir`: current aside, snapshot → data/), and each step checks what
    is done."""
    layout = journal.layout
    snap = layout.snapshot
    done = []
    saved_data = snap / "data"
    if saved_data.is_dir():
        replace_dir(saved_data, layout.data_dir)
        done.append(f"{layout.data_dir.name}/ restored")
    saved_pin = snap / layout.dvc_file.name
    if saved_pin.is_file():
        shutil.copy2(saved_pin, layout.dvc_file)
        done.append(f"{layout.dvc_file.name} restored")
    saved_lock = snap / "dvc.lock"
    if saved_lock.is_file():
        shutil.copy2(saved_lock, layout.dvc_lock)
        done.append("dvc.lock restored")
    elif not journal.data.get("had_dvc_lock") and layout.dvc_lock.is_file():
        layout.dvc_lock.unlink()
        done.append("dvc.lock removed (there was none before)")
    outputs = journal.data.get("outputs") or {}
    restored = 0
    for rel in outputs.get("saved", []):
        saved = snap / "outs" / rel
        if not saved.exists():  # restored by an interrupted earlier recovery
            continue
        _remove(layout.root / rel)
        (layout.root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(saved, layout.root / rel)
        restored += 1
    for rel in outputs.get("absent", []):
        _remove(layout.root / rel)
    if outputs.get("saved") or outputs.get("absent"):
        done.append(f"{restored} uncached stage output(s) restored")
    return done


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def uncached_outputs(dvc_yaml: Path) -> list[str]:
    """The outputs, metrics and plots that dvc.yaml marks `cache: false`: DVC keeps no
    copy of them, so a rollback must (metrics, reports, plots, training checkpoints)."""
    import yaml

    if not Path(dvc_yaml).is_file():
        return []
    stages = (yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8")) or {}).get("stages")
    paths: list[str] = []
    for stage in (stages or {}).values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or []:
                if isinstance(entry, Mapping):
                    for path, options in entry.items():
                        if isinstance(options, Mapping) and options.get("cache") is False:
                            paths.append(str(path))
    return sorted(set(paths))


@dataclass
class Recovery:
    run: str
    phase: str
    action: str  # rolled-back | rolled-forward
    steps: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recover(
    layout: RetrainLayout,
    *,
    restore_registry: Callable[[dict[str, Any]], list[str]],
    checkout_outputs: Callable[[], str],
    finish_commit: Callable[[Journal], list[str]],
    on_rolled_back: Callable[[Journal], None] | None = None,
    hold: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Recovery | None:
    """Deal with the journal a crashed (or failed) run left; None when there is none.

    ``begun``/``repro``: stop what is left of its pipeline process group, restore data/,
    data.dvc and dvc.lock, check the cached stage outputs out for that dvc.lock
    (`checkout_outputs`), put the registry back (`restore_registry(journal data)`: the
    journal holds the caller's registry snapshot), then drop the journal.
    ``committed``: finish the commit (`finish_commit`: git commit, archive the incoming
    files) and drop the journal.
    `hold()` is held from the restore of data/ to the registry's (the caller's models
    folder writer lock), after the leftover pipeline is stopped.
    The caller must hold the RetrainLock.
    """
    journal = Journal.load(layout)
    if journal is None:
        return None
    steps: list[str] = []
    if journal.phase == "committed":
        steps += finish_commit(journal)
        journal.keep_copy("rolled-forward")
        journal.close()
        return Recovery(journal.data["run"], journal.phase, "rolled-forward", steps)

    child = journal.data.get("child") or {}
    same_host = journal.data.get("host") == socket.gethostname()
    if (
        child.get("pid")
        and same_host
        and kill_group(int(child["pid"]), child.get("start_time"), root=layout.root)
    ):
        steps.append(f"killed the leftover pipeline process group {child['pid']}")
    steps += clear_stale_dvc_lock(layout.root)
    with hold():
        steps += restore_data(journal)
        steps.append(checkout_outputs())
        steps += restore_registry(journal.data)
    if on_rolled_back is not None:
        on_rolled_back(journal)
    journal.keep_copy("rolled-back")
    journal.close()
    return Recovery(journal.data["run"], journal.phase, "rolled-back", steps)


def clear_stale_dvc_lock(root: Path) -> list[str]:
    """Remove DVC's read/write lock when every process it names is dead.

    A `dvc repro` killed while a stage ran leaves `.dvc/tmp/rwlock` naming it, and DVC
    then refuses `status`/`checkout` ("is busy, it is being blocked by ...") until the
    file is removed by hand. Only locks of dead processes are cleared."""
    path = Path(root) / ".dvc" / "tmp" / "rwlock"
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError):
        return []
    holders: list[dict[str, Any]] = []
    for mode in ("read", "write"):
        for value in (info.get(mode) or {}).values():
            holders.extend(value if isinstance(value, list) else [value])
    alive = [h for h in holders if h.get("pid") and pid_alive(int(h["pid"]))]
    if not holders or alive:
        return []
    path.unlink(missing_ok=True)
    return [f"removed DVC's stale lock of {len(holders)} dead process(es)"]

"""The git and DVC commands of a retraining run: check that data/ is versioned, version
the merged data, run the pipeline, put the stage outputs back, commit and push the pins.

Each takes the environment its commands run in (`env`: qpr.ops.processes.tool_env plus
what the orchestrator adds), so the same calls work from a flow, the CLI and tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from qpr.data.versioning import data_status, pinned_md5
from qpr.ops.journal import Journal
from qpr.ops.layout import RetrainError, RetrainLayout
from qpr.ops.processes import run_pipeline, run_tool

# Who commits when git has no identity configured (CI, a container).
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "qpr retrain",
    "GIT_AUTHOR_EMAIL": "qpr-retrain@localhost",
    "GIT_COMMITTER_NAME": "qpr retrain",
    "GIT_COMMITTER_EMAIL": "qpr-retrain@localhost",
}


def git(
    root: Path, *args: str, env: Mapping[str, str], check: bool = True
) -> subprocess.CompletedProcess:
    """`git args` in the project, as the configured user or else as GIT_IDENTITY."""
    env = dict(env)
    probe = run_tool(["git", "var", "GIT_COMMITTER_IDENT"], root, env, check=False)
    if probe.returncode != 0:
        env.update(GIT_IDENTITY)
    return run_tool(["git", *args], root, env, check=check)


def require_data_in_sync(layout: RetrainLayout, env: Mapping[str, str]) -> None:
    """A rollback restores data/ to what data.dvc pins; refuse to start when data/ holds
    changes nobody versioned (they would be versioned by this run without anyone asking)."""
    in_sync, said = data_status(Path(layout.dvc_file.name), cwd=layout.root, env=env)
    if not in_sync:
        raise RetrainError(
            f"{layout.data_dir.name}/ does not match {layout.dvc_file.name} (or is not in the DVC "
            f"cache): `dvc add {layout.data_dir.name}` to keep what is there, or `dvc checkout "
            f"{layout.dvc_file.name}` to drop it, then retrain. dvc status: {said[:300]}"
        )


def version_data(layout: RetrainLayout, env: Mapping[str, str]) -> str:
    """`dvc add` data/; the md5 it pinned in data.dvc."""
    run_tool(["dvc", "add", "-q", layout.data_dir.name], layout.root, env)
    md5 = pinned_md5(layout.dvc_file)
    if md5 is None:
        raise RetrainError(f"`dvc add` wrote no hash into {layout.dvc_file}")
    return md5


def run_repro(
    layout: RetrainLayout,
    journal: Journal,
    env: Mapping[str, str],
    log_path: Path,
    *,
    timeout_s: float | None = None,
    echo: Callable[[str], None] | None = None,
) -> None:
    """`dvc repro` in its own process group, recorded in the journal (phase ``repro``, its
    pid and start time) as soon as it runs; fails with the log's tail."""

    def started(pid: int, start_time: str | None) -> None:
        journal.set(phase="repro", child={"pid": pid, "start_time": start_time})

    code = run_pipeline(
        ["dvc", "repro"], layout.root, env, log_path, started, timeout_s=timeout_s, echo=echo
    )
    if code != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8").splitlines()[-15:])
        raise RetrainError(f"`dvc repro` failed (exit {code}); full log {log_path}:\n{tail}")


def checkout_outputs(layout: RetrainLayout, env: Mapping[str, str]) -> str:
    """Cached stage outputs back to what the restored dvc.lock pins (best effort: the
    uncached ones, metrics and reports, come back with the next `dvc repro`)."""
    result = run_tool(["dvc", "checkout", "--force", "-q"], layout.root, env, check=False)
    if result.returncode == 0:
        return "dvc checkout: stage outputs match the restored dvc.lock"
    last = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
    return f"dvc checkout --force exited {result.returncode} ({last[0][:200]}): run `dvc repro`"


def commit_pins(
    layout: RetrainLayout, message: str, env: Mapping[str, str]
) -> tuple[str | None, str]:
    """git commit data.dvc and dvc.lock when they changed: (short sha or None, what was done).
    A failed commit is a warning, not an error: it happens after the commit point."""
    pinned = [p.name for p in (layout.dvc_file, layout.dvc_lock) if p.exists()]
    changed = git(layout.root, "status", "--porcelain", "--", *pinned, env=env).stdout.strip()
    if not changed:
        return None, "git: data.dvc and dvc.lock already committed"
    git(layout.root, "add", "--", *pinned, env=env)  # dvc.lock may be new to git
    result = git(layout.root, "commit", "-q", "-m", message, "--", *pinned, env=env, check=False)
    if result.returncode != 0:
        return None, f"WARNING: git commit failed: {(result.stderr or '').strip()[:300]}"
    sha = git(layout.root, "rev-parse", "--short", "HEAD", env=env).stdout.strip()
    return sha, f"git commit {sha}"


def push_data(layout: RetrainLayout, env: Mapping[str, str]) -> str:
    """`dvc push` the data data.dvc pins; a failure is a warning (after the commit point)."""
    pushed = run_tool(["dvc", "push", "-q", layout.dvc_file.name], layout.root, env, check=False)
    if pushed.returncode == 0:
        return "dvc push: data pushed"
    return f"WARNING: dvc push failed: {(pushed.stderr or '').strip()[:300]}"

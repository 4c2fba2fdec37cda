"""Keep `data/` and its DVC pin (data.dvc) in step without any DVC remote.

A fresh clone has data.dvc but neither data/ nor a DVC cache. The embedded data set is
deterministic, so regenerating it reproduces exactly the bytes data.dvc pins; `dvc add`
then caches them and `dvc status` is clean. Data a user put in data/ is never overwritten.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import yaml

from qpr.config import load_settings
from qpr.errors import QPRError


class DataVersionError(QPRError, RuntimeError):
    """data/ and data.dvc disagree and nothing was changed; the message says what to do."""


def _dvc(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["dvc", *args], cwd=cwd, env=dict(env) if env else None, capture_output=True, text=True
    )


def pinned_md5(dvc_file: Path) -> str | None:
    if not dvc_file.is_file():
        return None
    outs = (yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}).get("outs") or [{}]
    return outs[0].get("md5")


def data_status(
    dvc_file: Path, *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[bool, str]:
    """(in sync, what `dvc status` said): in sync when the work tree's data matches the pin
    and the DVC cache holds it. `cwd` and `env` are those of the dvc command."""
    result = _dvc("status", "--json", str(dvc_file), cwd=cwd, env=env)
    try:
        in_sync = result.returncode == 0 and json.loads(result.stdout or "{}") == {}
    except json.JSONDecodeError:
        in_sync = False
    return in_sync, (result.stdout or result.stderr).strip()


def is_in_sync(dvc_file: Path) -> bool:
    """True when the work tree's data matches the pin and the DVC cache holds it."""
    return data_status(dvc_file)[0]


def ensure_data(params: Path, dvc_file: Path) -> str:
    """Bring data/ in line with data.dvc; return what was done, in words."""
    settings = load_settings(params)
    data_dir = dvc_file.with_suffix("")
    if settings.data.source != "logs":
        return f"data source is {settings.data.source!r} at {settings.data.path}: nothing to make"
    if dvc_file.is_file() and is_in_sync(dvc_file):
        return f"{data_dir}/ matches {dvc_file} ({pinned_md5(dvc_file)})"
    has_user_data = data_dir.exists() and any(data_dir.iterdir())
    if has_user_data:
        raise DataVersionError(
            f"{data_dir}/ differs from {dvc_file} and was left as it is. To version what is in "
            f"{data_dir}/ now: `dvc add {data_dir}` and commit {dvc_file}; to get the pinned "
            f"version back: `dvc checkout {dvc_file}` (or remove {data_dir}/ to regenerate it)."
        )
    # Only an empty or missing data/ is ever written to, so nothing of the user's is lost.
    restored = dvc_file.is_file() and _dvc("checkout", "-q", str(dvc_file)).returncode == 0
    if restored and is_in_sync(dvc_file):
        return f"{data_dir}/ checked out from the DVC cache ({pinned_md5(dvc_file)})"
    shutil.rmtree(data_dir, ignore_errors=True)
    from qpr.data.synth import SynthSpec, write_logs

    files = write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    before = pinned_md5(dvc_file)
    added = _dvc("add", "-q", str(data_dir))
    if added.returncode != 0:
        raise DataVersionError(f"`dvc add {data_dir}` failed:\n{added.stderr or added.stdout}")
    after = pinned_md5(dvc_file)
    made = f"generated {len(files)} daily log files into {settings.data.path} and cached them"
    if before is None:
        return f"{made}; {dvc_file} created ({after}): commit it"
    if before != after:
        return (
            f"WARNING: {made}, but they differ from what {dvc_file} pinned ({before} → {after}): "
            f"the generator or data.synth parameters changed. Commit {dvc_file} if intended."
        )
    return f"{made}; identical to the pinned version ({after})"

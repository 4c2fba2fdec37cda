"""Write requirements.lock with a sha256 for every file each pin may install.

    python tools/hash_lock.py PINS [-o requirements.lock] [--find-links DIR ...]

PINS is a file of ``name==version`` lines (pip freeze's output, or a hashed lock itself:
its ``--hash`` lines are ignored, so ``tools/hash_lock.py requirements.lock -o
requirements.lock`` redoes the hashes after a pin was edited by hand). ``-`` reads stdin.

The hashes of a pin are those of every file PyPI holds for that release (PEP 691 simple
API: what pip itself reads), so the lock installs on any platform PyPI has wheels for, plus
those of matching files in the find-links folders (``--find-links``, and pip's
``PIP_FIND_LINKS``): a machine whose pip takes a local build (this project's CPU torch,
``torch-2.13.0+cpu``) instead of PyPI's file installs with ``--require-hashes`` too.
A pin that has no file anywhere is an error: a lock pip cannot install is worse than none.

A freeze holds what the interpreter that froze needs. Another supported Python may need
more: redis requires async-timeout only below Python 3.11.3, so a lock frozen on 3.11.7
failed in the Docker image (Debian's 3.11.2). For each ``--python`` (default
``SUPPORTED_PYTHONS``), every locked distribution's requirements whose markers hold there
are added when missing, at the newest version on the index that satisfies them (one level:
their own requirements are not followed, as they are not installed here)
(`missing_requirements`, `newest_version`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # a fresh venv (make install, before the lock): pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import (
        canonicalize_name,
        parse_sdist_filename,
        parse_wheel_filename,
    )
    from pip._vendor.packaging.version import InvalidVersion, Version

INDEX = "https://pypi.org/simple"
HEADER = """\
# Every pin with the sha256 of each file pip may take for it; install with
#   pip install --require-hashes -r requirements.lock
# then the project itself: pip install --no-deps -e . (an editable install has no hash).
# Regenerate with `make lock` (tools/hash_lock.py): never edit a hash by hand.
"""
# The Pythons the lock must install on: the Docker image's (Debian bookworm's python3) and
# the newest 3.11 patch release a host may have. Markers on python_full_version split there.
SUPPORTED_PYTHONS = ("3.11.2", "3.11.14")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def read_pins(lines: Iterable[str]) -> list[tuple[str, str]]:
    """(name, version) of each ``name==version`` line; comments, hashes and blanks skipped."""
    pins = []
    for line in lines:
        match = _PIN.match(line.strip())
        if match:
            pins.append((match.group(1), match.group(2)))
    return pins


def read_lock(lines: Iterable[str]) -> dict[str, tuple[str, set[str]]]:
    """{canonical name: (version, hashes)} of a hashed lock."""
    text = "".join(lines).replace("\\\n", " ")
    entries = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            hashes = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
            entries[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return entries


def marker_environment(python: str) -> dict[str, str]:
    """The PEP 508 marker values of CPython `python` (e.g. "3.11.2") on x86-64 Linux."""
    return {
        "python_full_version": python,
        "python_version": ".".join(python.split(".")[:2]),
        "implementation_name": "cpython",
        "implementation_version": python,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "sys_platform": "linux",
        "os_name": "posix",
        "extra": "",
    }


def missing_requirements(
    pins: list[tuple[str, str]],
    pythons: Iterable[str],
    requires: Callable[[str], list[str] | None] | None = None,
) -> dict[str, Requirement]:
    """{canonical name: requirement} of what a locked distribution requires on one of
    `pythons` (its markers evaluated there, no extras) that the lock lacks. `requires`
    gives a distribution's Requires-Dist lines (default: the installed metadata, that of
    the venv that froze); a distribution not installed is skipped."""
    from importlib import metadata

    def installed(name: str) -> list[str] | None:
        try:
            return metadata.distribution(name).requires
        except metadata.PackageNotFoundError:
            return None

    requires = requires or installed
    locked = {canonicalize_name(name) for name, _ in pins}
    missing: dict[str, Requirement] = {}
    for python in pythons:
        environment = marker_environment(python)
        for name, _ in pins:
            for line in requires(name) or []:
                requirement = Requirement(line)
                key = canonicalize_name(requirement.name)
                if key in locked or key in missing:
                    continue
                if requirement.marker is None or requirement.marker.evaluate(environment):
                    missing[key] = requirement
    return missing


def newest_version(requirement: Requirement, index: str = INDEX) -> str:
    """The newest final release on the index that satisfies `requirement`."""
    request = urllib.request.Request(
        f"{index}/{canonicalize_name(requirement.name)}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    versions = {found[1] for f in files if (found := _file_version(f["filename"]))}
    good = [v for v in versions if not v.is_prerelease and v in requirement.specifier]
    if not good:
        raise LookupError(f"no release of {requirement} on {index}")
    return str(max(good))


def local_wheels(lock: dict[str, tuple[str, set[str]]], folders: Iterable[Path]) -> list[str]:
    """Requirement lines (``path --hash=...``) for the local files the lock has a hash for.

    Why: in hash-checking mode pip prefers a file whose index states its hash; a wheel in
    a find-links folder states none, so PyPI's torch (the CUDA build, whose nvidia-*
    dependencies the CPU lock does not hold) would win over the local CPU build. `make
    install` installs these files first; the lock then finds them already satisfied."""
    lines = []
    for folder in folders:
        for path in sorted(folder.glob("*")) if folder.is_dir() else ():
            parsed = _file_version(path.name) if path.is_file() else None
            if parsed is None or parsed[0] not in lock:
                continue
            version, hashes = lock[parsed[0]]
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if _matches(path.name, parsed[0], version) and digest in hashes:
                lines.append(f"{path} --hash=sha256:{digest}")
    return lines


def _file_version(filename: str) -> tuple[str, Version] | None:
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (ValueError, InvalidVersion):
        return None
    return canonicalize_name(name), version


def _matches(filename: str, name: str, version: str) -> bool:
    """The file is a build of name==version (a local label like +cpu matches, as in pip)."""
    parsed = _file_version(filename)
    return (
        parsed is not None
        and parsed[0] == canonicalize_name(name)
        and parsed[1].public == Version(version).public
    )


def index_hashes(name: str, version: str, index: str = INDEX) -> set[str]:
    """sha256 of every file of the release on the index (PEP 691 JSON)."""
    request = urllib.request.Request(
        f"{index}/{canonicalize_name(name)}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    return {
        f["hashes"]["sha256"]
        for f in files
        if "sha256" in f.get("hashes", {}) and _matches(f["filename"], name, version)
    }


def local_hashes(name: str, version: str, folders: Iterable[Path]) -> set[str]:
    """sha256 of the matching wheels and sdists in the find-links folders."""
    found = set()
    for folder in folders:
        for path in sorted(folder.glob("*")) if folder.is_dir() else ():
            if path.is_file() and _matches(path.name, name, version):
                found.add(hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def render(pins: list[tuple[str, str]], hashes: dict[str, set[str]]) -> str:
    """The lock: the header, then each pin with its hashes (sorted, so diffs stay small)."""
    blocks = []
    for name, version in sorted(pins, key=lambda p: canonicalize_name(p[0])):
        lines = [f"{name}=={version}", *(f"--hash=sha256:{h}" for h in sorted(hashes[name]))]
        blocks.append(" \\\n    ".join(lines))
    return HEADER + "\n".join(blocks) + "\n"


def _find_links(given: list[str]) -> list[Path]:
    """The folders given, then pip's own find-links (PIP_FIND_LINKS, pip config): where
    this machine's pip may take a file PyPI does not hold."""
    configured = os.environ.get("PIP_FIND_LINKS", "").split()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        configured += subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
    local = [p.removeprefix("file://") for p in [*given, *configured]]
    return list(dict.fromkeys(Path(p) for p in local if "://" not in p))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pins", help="name==version lines (pip freeze, or a lock); - = stdin")
    parser.add_argument("-o", "--output", help="where to write the lock (default stdout)")
    parser.add_argument("--find-links", action="append", default=[], metavar="DIR")
    parser.add_argument("--index", default=INDEX, help="a PEP 691 simple index")
    parser.add_argument(
        "--local-wheels",
        action="store_true",
        help="print the find-links files PINS (a hashed lock) has a hash for, then stop",
    )
    parser.add_argument(
        "--python",
        action="append",
        default=None,
        metavar="X.Y.Z",
        help=f"a Python the lock must also install on (default: {', '.join(SUPPORTED_PYTHONS)})",
    )
    args = parser.parse_args(argv)
    source = sys.stdin if args.pins == "-" else open(args.pins, encoding="utf-8")  # noqa: SIM115
    with source:
        lines = source.readlines()
    folders = _find_links(args.find_links)
    if args.local_wheels:
        found = local_wheels(read_lock(lines), folders)
        sys.stdout.write("".join(f"{line}\n" for line in found))
        return 0
    pins = read_pins(lines)
    for requirement in missing_requirements(pins, args.python or SUPPORTED_PYTHONS).values():
        version = newest_version(requirement, args.index)
        print(f"added {requirement.name}=={version}: {requirement}", file=sys.stderr)
        pins.append((requirement.name, version))

    def hashes_of(pin: tuple[str, str]) -> set[str]:
        return index_hashes(*pin, index=args.index) | local_hashes(*pin, folders)

    with ThreadPoolExecutor(max_workers=8) as pool:
        hashes = dict(zip((n for n, _ in pins), pool.map(hashes_of, pins), strict=True))
    missing = [f"{n}=={v}" for n, v in pins if not hashes[n]]
    if missing:
        print(f"no file found for: {', '.join(missing)}", file=sys.stderr)
        return 1
    text = render(pins, hashes)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

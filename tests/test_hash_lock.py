"""requirements.lock installs on every supported Python: what a distribution requires only
on an older patch release (redis → async-timeout below 3.11.3) is locked too."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import REPO_ROOT


def _hash_lock():
    spec = importlib.util.spec_from_file_location("hash_lock", REPO_ROOT / "tools" / "hash_lock.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hash_lock = _hash_lock()


def test_the_lock_holds_what_each_supported_python_needs() -> None:
    lock = (REPO_ROOT / "requirements.lock").read_text(encoding="utf-8")
    pins = hash_lock.read_pins(lock.splitlines())
    pythons = (*hash_lock.SUPPORTED_PYTHONS, "{}.{}.{}".format(*sys.version_info[:3]))
    missing = hash_lock.missing_requirements(pins, pythons)
    assert not missing, f"run `make lock`: {sorted(str(r) for r in missing.values())}"


def test_a_requirement_of_an_older_patch_release_is_found() -> None:
    requires = {"redis": ['async-timeout>=4.0.3; python_full_version < "3.11.3"', "idna"]}
    pins = [("redis", "8.1.0"), ("idna", "3.10")]
    assert hash_lock.missing_requirements(pins, ["3.11.7"], requires.get) == {}
    found = hash_lock.missing_requirements(pins, ["3.11.2", "3.11.7"], requires.get)
    assert list(found) == ["async-timeout"]
    assert str(found["async-timeout"].specifier) == ">=4.0.3"
    # Extras and other platforms stay out: only what a plain install on Linux pulls in.
    requires["redis"] += ['hiredis>=3; extra == "hiredis"', 'pywin32; sys_platform == "win32"']
    assert list(hash_lock.missing_requirements(pins, ["3.11.2"], requires.get)) == ["async-timeout"]

"""qpr.io: atomic writes, digests and the keyed vector cache."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qpr.io import (
    VectorCache,
    atomic_path,
    digest,
    file_sha256,
    json_text,
    recover_dir,
    replace_dir,
    save_numpy_atomic,
    texts_digest,
    write_atomic,
    write_json_atomic,
    write_text_atomic,
)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = write_text_atomic(tmp_path / "a.txt", "old")

    def crash(handle) -> None:
        handle.write(b"half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        write_atomic(target, crash)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_atomic_path_renames_only_when_the_block_succeeds(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "index.bin"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
        assert not target.exists()
    assert target.read_bytes() == b"new"


def test_written_files_get_the_mode_a_plain_open_gives(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    atomic = write_text_atomic(tmp_path / "atomic", "x")
    assert stat.S_IMODE(os.stat(atomic).st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


def test_json_is_sorted_indented_and_ends_with_a_newline(tmp_path: Path) -> None:
    path = write_json_atomic(tmp_path / "m.json", {"b": 1, "a": {"d": 2.5, "c": None}})
    assert path.read_text() == '{\n  "a": {\n    "c": null,\n    "d": 2.5\n  },\n  "b": 1\n}\n'
    assert json_text({"a": 1}) == '{\n  "a": 1\n}\n'


def test_numpy_round_trip(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.load(save_numpy_atomic(tmp_path / "v.npy", array)), array)


def test_digests_follow_content_and_order(tmp_path: Path) -> None:
    a = write_text_atomic(tmp_path / "a", "one")
    assert file_sha256(a) == "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed"
    assert texts_digest(["ab", "c"]) != texts_digest(["a", "bc"])  # the separator counts
    key = digest(a, 64, ["x", "y"])
    assert key == digest(a, 64, ["x", "y"]) and len(key) == 32
    assert key != digest(a, 64, ["y", "x"])
    assert key != digest(a, 65, ["x", "y"])
    write_text_atomic(a, "two")
    assert key != digest(a, 64, ["x", "y"])


def test_vector_cache_stores_by_key_and_keeps_one_when_asked(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path / "c", keep_one=True)
    assert cache.get("k1") is None
    cache.put("k1", np.ones((2, 3), np.float32), {"model": "m"})
    vectors, info = cache.get("k1")
    np.testing.assert_array_equal(vectors, np.ones((2, 3), np.float32))
    assert info == {"model": "m"}
    cache.put("k2", np.zeros((1, 3), np.float32))
    assert cache.get("k1") is None
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["k2.npy"]
    many = VectorCache(tmp_path / "m")
    many.put("a", np.ones((1, 1), np.float32))
    many.put("b", np.ones((1, 1), np.float32))
    assert many.get("a") is not None and many.get("b", mmap=True) is not None


def test_vector_cache_describes_stored_keys_and_keeps_a_set(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path / "c")
    for key in ("s0", "s1", "old"):
        cache.put(key, np.ones((2, 3), np.float32), {"made": key})
    assert cache.has("s0") and not cache.has("s9") and cache.info("s9") == {}
    cache.describe("s0", {"seconds": 1.5})
    assert cache.info("s0") == {"seconds": 1.5}
    (tmp_path / "c" / ".old.npy.tmp").write_bytes(b"")  # a write in progress
    cache.keep(["s0", "s1"])
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        ".old.npy.tmp",
        "s0.json",
        "s0.npy",
        "s1.json",
        "s1.npy",
    ]
    VectorCache(tmp_path / "absent").keep([])  # nothing stored yet: nothing to remove


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


def _folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


OLD = {"a.txt": "old a", "sub/b.txt": "old b", "only_old.txt": "x"}
NEW = {"a.txt": "new a", "sub/b.txt": "new b", "sub/c/only_new.txt": "y"}

# replace_dir in a child process, killed by SIGKILL (no cleanup runs) before its STEP-th
# rename (1: old folder aside, 2: new one in, 3: old one to the trash) or while the old
# one is removed (4: one file gone, then the kill); 99: never killed.
_CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from pathlib import Path

    from qpr.io import replace_dir

    step, renames = int(sys.argv[3]), []
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def replace(src, dst):
        renames.append(src)
        if len(renames) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    def rmtree(path, ignore_errors=False):
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        if files and step == 4:
            files[0].unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        real_rmtree(path, ignore_errors=ignore_errors)

    os.replace, shutil.rmtree = replace, rmtree
    replace_dir(sys.argv[1], sys.argv[2])
    """
)


@pytest.mark.parametrize("step", [1, 2, 3, 4, 99])
def test_a_swap_killed_at_any_step_leaves_the_old_or_the_new_folder(
    tmp_path: Path, step: int
) -> None:
    final = _folder(tmp_path / "out", OLD)
    new = _folder(tmp_path / "out.tmp", NEW)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(new), str(final), str(step)], env=env, check=False
    )
    assert child.returncode == (0 if step == 99 else -signal.SIGKILL)
    aside = tmp_path / ".out.old"
    # Right after the kill: a whole folder under `final`, or none and the old one aside.
    if final.exists():
        assert _tree(final) in (OLD, NEW)
    else:
        assert _tree(aside) == OLD
    # What the next swap (or a reader) does first puts the old folder back.
    recover_dir(final)
    assert _tree(final) == (OLD if step <= 2 else NEW)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"out"} | ({"out.tmp"} if step <= 2 else set())
    )
    # ... and a later swap goes through.
    replace_dir(_folder(tmp_path / "next", {"n.txt": "n"}), final)
    assert _tree(final) == {"n.txt": "n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"out"} | ({"out.tmp"} if step <= 2 else set())
    )


def test_replace_dir_makes_a_missing_folder_and_refuses_a_missing_source(tmp_path: Path) -> None:
    final = replace_dir(_folder(tmp_path / "new", NEW), tmp_path / "out")
    assert _tree(final) == NEW and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / "absent", final)
    assert _tree(final) == NEW

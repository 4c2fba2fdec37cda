"""The README's recipes work as written: each ```bash (and ```python) block under "I want
to…" runs, in order, in a scratch project where `make run` has already happened.

A fresh clone's `make run` takes minutes (it trains on the embedded data), so the scratch
project is built the fast way instead: the tiny configuration of the other tests (a few
hundred rows of the embedded logs, a small encoder), the stages run in process
(`tests.conftest.run_stages`), and the bundle registered twice in the project's own MLflow
store, as after `make run` and one retraining (version 1 champion, version 2 challenger).
Its `.venv` links to the running interpreter's environment, so `make` finds it installed.
The blocks run with bash, with the project's `.venv/bin` first on PATH and none of the
test session's MLflow or Prefect settings: what a user with the venv activated gets.

An HTML comment right above a block says how to run it (`<!-- test: KEY VALUE; ... -->`):

- `needs quora|gpu|cluster`: skipped; the data, the device or the cluster is not here.
- `covered TESTS`: not run here, because it runs the whole pipeline (minutes: `dvc repro`,
  `dvc exp run`, `qpr retrain`) or a scheduler that runs until stopped; TESTS name the
  tests that run the same code on a tiny project. The quick start's `make run` and
  `make test` are above the recipes: `make test` is this suite, and the tiny project
  below stands in for what `make run` leaves.
- `if COMMAND`: run only when COMMAND succeeds in the project (a command or an option
  that a branch adds); skipped otherwise.
- `exit N`: the block must exit with status N (a gate that rejects a file).
- `background [URL]`: a server: started, and left running for the blocks after it, once
  URL answers (without one: once it prints an address); stopped at the end. Port 8000 is
  replaced by a free port in every block and URL, as other tests may hold it.

Every other block must exit 0 within BLOCK_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from qpr import environment
from tests.conftest import REPO_ROOT, run_stages, tiny_overrides

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
RECIPES_HEADING = "## I want to"
MAX_WORDS = 1500
BLOCK_TIMEOUT_S = 180
READY_TIMEOUT_S = 120
# What a fresh clone has beside what the recipes read: the example logs, the Makefile and
# the files its stamp hashes (requirements.lock, pyproject.toml), prefect.yaml.
COPIED = ("examples", "Makefile", "requirements.lock", "pyproject.toml", "prefect.yaml")
SKIPPED_NEEDS = {"quora", "gpu", "cluster"}
FENCE = re.compile(
    r"(?:<!--\s*test:(?P<marks>.*?)-->\s*\n)?```(?P<lang>bash|python)\n(?P<body>.*?)\n```",
    re.S,
)


@dataclass(frozen=True)
class Block:
    heading: str
    lang: str
    body: str
    marks: dict[str, str]

    @property
    def id(self) -> str:
        return re.sub(r"\W+", "-", self.heading.lower()).strip("-")


def _marks(text: str | None) -> dict[str, str]:
    marks: dict[str, str] = {}
    for part in (text or "").split(";"):
        key, _, value = part.strip().partition(" ")
        if key:
            marks[key] = value.strip()
    return marks


def recipe_blocks(text: str) -> list[Block]:
    """The code blocks after the recipes heading, with the `###` heading each is under."""
    start = text.index(RECIPES_HEADING)
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks = []
    for match in FENCE.finditer(section):
        headings = re.findall(r"^### (.+)$", section[: match.start()], re.M)
        blocks.append(
            Block(
                heading=headings[-1] if headings else "recipes",
                lang=match["lang"],
                body=match["body"],
                marks=_marks(match["marks"]),
            )
        )
    return blocks


BLOCKS = recipe_blocks(README.read_text(encoding="utf-8"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link_venv(root: Path) -> None:
    """root/.venv: links to this interpreter's environment, and the stamp `make` checks."""
    venv = root / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        if not entry.name.startswith(".installed-"):
            (venv / entry.name).symlink_to(entry)
    stamp = subprocess.run(
        ["make", "-s", "-p", "-n", "help"], cwd=root, capture_output=True, text=True
    ).stdout
    name = re.search(r"^STAMP := (.+)$", stamp, re.M)
    assert name, "the Makefile no longer names its STAMP"
    (root / name[1].strip()).touch()


def _register(root: Path, env: dict[str, str]) -> None:
    """Two versions of the bundle in root's MLflow store: 1 champion, 2 challenger."""
    script = """
import json
from pathlib import Path
from qpr.ops import registry

metrics = json.loads(Path("metrics/evaluate.json").read_text())
first = registry.register_bundle("models", metrics, name="qpr")
registry.mark_committed("qpr", first.version, by="make run")  # as the register stage does
registry.promote("qpr", first.version, reason="first model", actor="make run")
second = registry.register_bundle("models", metrics, name="qpr", dedupe=False)
registry.mark_committed("qpr", second.version, by="make run")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A project as `make run` leaves it, tiny; and the environment the blocks run in."""
    from qpr.config import settings_from_dict

    root = tmp_path_factory.mktemp("readme") / "qpr"
    root.mkdir()
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name)
        else:
            shutil.copy2(source, root / name)
    settings = settings_from_dict(tiny_overrides(root, mlflow={"experiment": "qpr"}))
    tree = settings.model_dump(mode="json")
    tree["data"]["path"] = "data/logs"
    (root / "params.yaml").write_text(yaml.safe_dump(tree), encoding="utf-8")
    evaluation = json.dumps(run_stages(settings, root), default=str)
    (root / "metrics").mkdir(exist_ok=True)
    for path in (root / "metrics" / "evaluate.json", root / "metrics.json"):
        path.write_text(evaluation, encoding="utf-8")  # as the evaluate stage writes them
    _link_venv(root)
    unset = {*environment.local_defaults(root), "PREFECT_API_URL", "VIRTUAL_ENV"}
    # MLflow's and Prefect's variables of the test session (an experiment id of its store)
    # would point the blocks at another store: a user's shell has none of them.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in unset and not key.startswith(("MLFLOW_", "PREFECT_"))
    }
    env["PATH"] = f"{root / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    env["COLUMNS"] = "120"
    _register(root, env)
    return root, env


@pytest.fixture(scope="module")
def servers(project):
    """The background blocks started so far; stopped (their process groups) at the end,
    then anything else still running for the scratch project."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        # The whole group, until it is empty: a block's shell may exit at once while what
        # it started (qpr ui stopping its servers) still needs a few seconds.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and _group_alive(process):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    # Nothing the recipes started outlives them (a SIGKILLed `qpr ui` leaves its servers).
    for pid in _leftovers(project[0]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _leftovers(root: Path) -> list[int]:
    """Processes whose command line or environment names the scratch project `root`:
    servers a block started in sessions of their own (qpr ui's), which a killed group
    leaves running."""
    mark = str(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark in (entry / "cmdline").read_bytes() or mark in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _group_alive(process: subprocess.Popen) -> bool:
    process.poll()  # reap the leader: a zombie would count as alive
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def port() -> str:
    return str(_free_port())


def _command(block: Block, port: str) -> list[str]:
    body = block.body.replace("8000", port)
    if block.lang == "python":
        return ["python", "-c", body]
    return ["bash", "-e", "-o", "pipefail", "-c", body]


def _wait_ready(process: subprocess.Popen, log: Path, block: Block, port: str) -> None:
    given = block.marks["background"] or block.body
    url = re.search(r"https?://\S+", given.replace("8000", port))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        if url is None:
            if re.search(r"https?://", log.read_text(errors="replace")):
                return
        else:
            try:
                with urllib.request.urlopen(url[0].rstrip(")`,."), timeout=2):
                    return
            except OSError:
                pass
        time.sleep(1)
    pytest.fail(f"not ready in {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{i:02d}-{b.id}" for i, b in enumerate(BLOCKS)])
def test_recipe_block_runs(block: Block, project, servers, port: str):
    root, env = project
    needs = block.marks.get("needs")
    if needs is not None:
        assert needs in SKIPPED_NEEDS, f"unknown need {needs!r}"
        pytest.skip(f"needs {needs}")
    if "covered" in block.marks:
        assert block.marks["covered"].startswith("tests/"), "say which tests cover it"
        pytest.skip(f"a whole pipeline or a server that runs on; see {block.marks['covered']}")
    if "if" in block.marks:
        check = subprocess.run(
            ["bash", "-c", block.marks["if"]], cwd=root, env=env, capture_output=True
        )
        if check.returncode != 0:
            pytest.skip(f"not on this branch: {block.marks['if']}")
    if "background" in block.marks:
        log = root / f"background-{len(servers)}.log"
        # `make ui` on free ports: a server a user (or an earlier run) left on 4200 or 5000
        # must not fail the block.
        ui_ports = {"QPR_UI_PREFECT_PORT": _free_port(), "QPR_UI_MLFLOW_PORT": _free_port()}
        with log.open("w") as out:
            process = subprocess.Popen(
                _command(block, port),
                cwd=root,
                env={**env, **ui_ports},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        servers.append(process)
        _wait_ready(process, log, block, port)
        return
    done = subprocess.run(
        _command(block, port),
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    expected = int(block.marks.get("exit", 0))
    assert done.returncode == expected, (
        f"exit {done.returncode}, expected {expected}\n{block.body}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
    assert (done.stdout + done.stderr).strip(), "a recipe prints what it did"


def test_readme_keeps_its_shape():
    """Short, the two quick-start commands first, every block's marks known, links alive."""
    text = README.read_text(encoding="utf-8")
    assert len(text.split()) <= MAX_WORDS
    quick = text[text.index("## Quick start") : text.index(RECIPES_HEADING)]
    assert "make run" in quick and "make test" in quick
    known = {"needs", "covered", "if", "exit", "background"}
    for block in BLOCKS:
        assert set(block.marks) <= known, block.marks
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (REPO_ROOT / target).exists(), f"README links to a missing {target}"

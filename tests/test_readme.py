"""The README's recipes work as written: each ```bash (and ```python) block under "I want
to…" runs, in order, in a scratch project where `make run` has already happened.

A fresh clone's `make run` takes minutes (it trains on the embedded data), so the scratch
project is built the fast way instead: the tiny configuration of the other tests (a few
hundred rows of the embedded logs, a small encoder), the stages run in process
(`tests.conftest.run_stages`), and the bundle registered twice in the project's own MLflow
store, as after `make run` and the retraining recipe (version 2 champion, as it beat
version 1; version 1 its previous champion).
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

A ```text block after a block, in the same `###` section with no other block between,
shows what that block prints. The run's output (stdout and stderr together, as a terminal
shows them) must hold it: its lines in order, next to each other, where a line `...`
stands for any lines and `...` in a line for any text; empty lines and a table's rules
are left out. Both sides go through `mask` first: the tiny project prints other numbers
than the README's full run, so numbers, hashes, times and paths are masked; words are
not. A mark above the ```text block, `<!-- test: output-differs REASON -->`, skips the
comparison where the tiny project cannot print what a full run does; REASON says why.
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
from dataclasses import dataclass, field, replace
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
    r"(?:<!--\s*test:(?P<marks>.*?)-->\s*\n)?```(?P<lang>bash|python|text)\n(?P<body>.*?)\n```",
    re.S,
)
RUN_MARKS = {"needs", "covered", "if", "exit", "background"}
SHOWN_MARKS = {"output-differs"}


@dataclass(frozen=True)
class Block:
    heading: str
    lang: str
    body: str
    marks: dict[str, str]
    shown: str | None = None  # the ```text block after it: what it prints
    shown_marks: dict[str, str] = field(default_factory=dict)

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
    """The code blocks after the recipes heading, with the `###` heading each is under and
    the ```text block that shows what it prints."""
    start = text.index(RECIPES_HEADING)
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks: list[Block] = []
    last: Block | None = None  # the block right before, if a ```text block may show its output
    for match in FENCE.finditer(section):
        headings = re.findall(r"^### (.+)$", section[: match.start()], re.M)
        heading = headings[-1] if headings else "recipes"
        marks = _marks(match["marks"])
        if match["lang"] != "text":
            last = Block(heading=heading, lang=match["lang"], body=match["body"], marks=marks)
            blocks.append(last)
        elif last is not None and last.heading == heading:
            blocks[-1] = replace(last, shown=match["body"], shown_marks=marks)
            last = None
        else:  # a file's content, not a command's output
            last = None
    return blocks


# What `mask` replaces, in this order: a date's digits are no numbers of their own, and a
# hash's digits are left to the hash (a digit next to a letter is no number).
_MASKS = (
    # Timestamps and dates: 2026-10-15, 2026-10-15T08:01:00Z, 08:01:00, 12:00:01.5+00:00.
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"
            r"|\b\d{2}:\d{2}:\d{2}(?:\.\d+)?"
        ),
        "<time>",
    ),
    # Numbers, not the digits of a label (P@10, nDCG@10, R@20, v2, raw_logs.2): 41,
    # -0.5, 1,234, 25.00%, 1e-09.
    (re.compile(r"(?<![\w@.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?%?(?![\w@])"), "#"),
    # No number: a lone "-" after a word or a number (a table cell, "P@1 -,"), not a bullet.
    (re.compile(r"(?<=\S )-(?=[\s,;)]|$)", re.M), "#"),
    # Hashes and fingerprints: 7 to 64 hex digits, with a digit (a word has none).
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b"), "<hash>"),
    # Rules of a table: as long as its columns are wide.
    (re.compile(r"([─━═])\1+"), r"\1"),
    # Whitespace runs: columns padded to the width of their numbers.
    (re.compile(r"[ \t]+"), " "),
)


def mask(text: str, project: Path | None = None) -> str:
    """`text` with what differs between the tiny project and the README's full run masked:
    paths under `project` (written relative to it), timestamps and dates, hex hashes,
    numbers ("-" for none too), the lengths of table rules, whitespace runs; each line
    stripped. Words are kept: row labels, column headers and messages must match as they
    are."""
    if project is not None:
        text = text.replace(f"{project}/", "").replace(str(project), ".")
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return "\n".join(line.strip() for line in text.splitlines())


def _line_matches(shown: str, printed: str) -> bool:
    """One masked line: equal, where `...` in the shown line stands for any text."""
    if "..." not in shown:
        return shown == printed
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return re.fullmatch(pattern, printed) is not None


def _kept(line: str) -> bool:
    """A line compared: not empty, not a table's rule (its borders, between its rows)."""
    return re.fullmatch(r"[\u2500-\u257f ]*", line) is None


def shown_mismatch(shown: str, printed: str, project: Path | None = None) -> str | None:
    """Why `printed` does not hold the `shown` output, or None when it does: the shown
    lines, masked, in order and next to each other, a line `...` standing for any lines.
    Empty lines and table rules are left out on both sides: the README may omit rules."""
    lines = [line for line in mask(printed, project).splitlines() if _kept(line)]
    segments: list[list[str]] = [[]]
    for line in mask(shown).splitlines():
        if line == "...":
            segments.append([])
        elif _kept(line):
            segments[-1].append(line)
    at = 0
    for segment in filter(None, segments):
        found = next(
            (
                start
                for start in range(at, len(lines) - len(segment) + 1)
                if all(map(_line_matches, segment, lines[start : start + len(segment)]))
            ),
            None,
        )
        if found is None:
            missing = [
                line for line in segment if not any(_line_matches(line, p) for p in lines[at:])
            ]
            what = repr(missing[0]) if missing else f"these lines together: {segment!r}"
            return f"not printed (masked) after printed line {at}: {what}"
        at = found + len(segment)
    return None


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
    """Two versions of the bundle in root's MLflow store: 2 champion, 1 before it."""
    script = """
import json
from pathlib import Path
from qpr.ops import registry

metrics = json.loads(Path("metrics/evaluate.json").read_text())
first = registry.register_bundle("models", metrics, name="qpr")
registry.mark_committed("qpr", first.version, by="make run")  # as the register stage does
registry.promote("qpr", first.version, reason="first model", actor="make run")
second = registry.register_bundle("models", metrics, name="qpr", dedupe=False)
registry.mark_committed("qpr", second.version, by="qpr retrain")
registry.promote("qpr", second.version, reason="better", actor="qpr retrain")
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
    env["COLUMNS"] = "80"  # a common terminal; piped, Rich would assume 80 too
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order a terminal shows it
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    printed = done.stdout
    expected = int(block.marks.get("exit", 0))
    assert done.returncode == expected, (
        f"exit {done.returncode}, expected {expected}\n{block.body}\n--- output\n{printed[-5000:]}"
    )
    assert printed.strip(), "a recipe prints what it did"
    if block.shown is not None and "output-differs" not in block.shown_marks:
        mismatch = shown_mismatch(block.shown, printed, root)
        assert mismatch is None, (
            f"the README's output block is not what the command prints: {mismatch}\n"
            f"--- shown (masked)\n{mask(block.shown)}\n"
            f"--- printed (masked)\n{mask(printed, root)[-5000:]}"
        )


def test_readme_keeps_its_shape():
    """Short, the two quick-start commands first, every block's marks known, links alive."""
    text = README.read_text(encoding="utf-8")
    assert len(text.split()) <= MAX_WORDS
    quick = text[text.index("## Quick start") : text.index(RECIPES_HEADING)]
    assert "make run" in quick and "make test" in quick
    for block in BLOCKS:
        assert set(block.marks) <= RUN_MARKS, block.marks
        assert set(block.shown_marks) <= SHOWN_MARKS, block.shown_marks
        assert all(block.shown_marks.values()), f"say why the output differs: {block.body}"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (REPO_ROOT / target).exists(), f"README links to a missing {target}"


PRINTED = """\
8 clusters to evaluate (0 dropped as incoherent), 40 queries, 40 questions
┏━━━━━━━━┳━━━━━━━━┳━━━━━━━━┓
┃ system ┃    P@1 ┃   P@10 ┃
┡━━━━━━━━╇━━━━━━━━╇━━━━━━━━┩
│ served │ 0.8333 │ 1.0000 │
│ bm25   │ 0.7500 │ 0.9000 │
└────────┴────────┴────────┘
wrote /tmp/x/qpr/reports/evaluate_file/2026-10-15T08:01:00Z-3f9a2c1d.json
"""


def test_mask_hides_numbers_and_widths_but_not_words():
    assert mask("│ served │ 1.0000 │   25.00% │ 1,234 │") == mask("│ served │  0.9 │ 3% │ 7 │")
    assert mask("┏━━━┳━━┓") == mask("┏━━━━━━━━┳━━━━━━━━━━┓")
    assert mask("at 2026-10-15T08:01:00Z, run 3f9a2c1d") == "at <time>, run <hash>"
    assert mask("wrote /p/qpr/models/x.onnx", Path("/p/qpr")) == "wrote models/x.onnx"
    # Labels and messages stay: P@1 is not P@10, "served" not "model", "mostly" kept.
    assert mask("┃ P@1 ┃ nDCG@10 ┃") != mask("┃ P@10 ┃ nDCG@10 ┃")
    assert mask("│ served │ 1.0 │") != mask("│ model │ 1.0 │")
    assert mask("mostly 0.95): 3 of 12 rows") == "mostly #): # of # rows"
    assert mask("│ 0.5 │ - │\nP@1 -, false") == mask("│ 1.0 │ 0.25 │\nP@1 1.0, false")
    assert mask("  - expect_column") == "- expect_column"


def test_shown_output_must_be_printed_in_order():
    project = Path("/tmp/x/qpr")
    shown = "┃ system ┃ P@1 ┃ P@10 ┃\n...\n│ bm25   │ 0.7 │ 0.9 │\n...\nwrote reports/...json"
    assert shown_mismatch(shown, PRINTED, project) is None
    # A row the tool does not print, by its label: the drift a user found.
    stale = shown.replace("bm25", "model")
    assert "'│ model │ # │ # │'" in shown_mismatch(stale, PRINTED, project)
    # Lines out of order, or apart where no `...` stands between them.
    assert shown_mismatch("│ bm25 │ 1 │ 1 │\n...\n│ served │ 1 │ 1 │", PRINTED) is not None
    assert shown_mismatch("┃ system ┃ P@1 ┃ P@10 ┃\n│ bm25 │ 1 │ 1 │", PRINTED) is not None
    # A table's rules may be left out; its header and first row are then next to each other.
    assert shown_mismatch("┃ system ┃ P@1 ┃ P@10 ┃\n│ served │ 1 │ 1 │", PRINTED) is None
    assert shown_mismatch("wrote /elsewhere/reports/...", PRINTED, project) is not None

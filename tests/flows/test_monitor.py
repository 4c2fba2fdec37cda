"""flows/monitor.py on a tiny project: the service's query log read since the last
report, a report on disk and in MLflow, the status the service shows, the position kept;
questions of another topic raise alarms, and the command line exits 3 on them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from qpr.data.synth import generate_day
from qpr.querylog import QueryLog
from qpr.searcher import Searcher
from tests.conftest import run_stages
from tests.monitor.test_report import OTHER_TOPIC


def _log(root: Path, questions: list[str], start: int) -> None:
    searcher = Searcher.load(root / "models")
    with QueryLog(root / "logs" / "service") as log:
        for i, question in enumerate(questions, start):
            result = searcher.search(question, k=3)
            log.queries(
                f"r{i}", [result], endpoint="/search", model={}, k=3, threshold=None, latency_ms=1.0
            )


@pytest.mark.slow
def test_the_monitor_reports_drift_only_on_another_topic(
    prefect_harness, tiny_settings, tiny_params_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flows.monitor
    from flows.monitor import main, monitor_flow

    root = tiny_params_file.parent
    run_stages(tiny_settings, root)
    synth = tiny_settings.data.synth
    day = generate_day(dt.date(2027, 1, 1), seed=synth.seed, rows=400, intents=synth.intents)
    _log(root, [r["question"] for r in day if str(r["question"] or "").strip()][:300], 0)

    report = monitor_flow(params=str(tiny_params_file))
    assert report["drift_measured"] and report["service"]["questions"] == 300
    assert report["alarms"] == []
    assert {Path(p).name for p in report["files"].values()} == {
        "report.json",
        "report.png",
        "report.html",
    }
    status = json.loads((root / "logs" / "service" / "monitor.json").read_text())
    assert status["alarms"] == [] and "embedding_auc" in status["measures"]
    assert (root / ".monitor" / "position.json").is_file()

    again = monitor_flow(params=str(tiny_params_file))  # nothing new since the position
    assert again["service"]["questions"] == 0 and not again["drift_measured"]

    _log(root, OTHER_TOPIC * 10, 1000)
    with pytest.raises(SystemExit) as exited:
        main(["--params", str(tiny_params_file)])
    assert exited.value.code == 3
    status = json.loads((root / "logs" / "service" / "monitor.json").read_text())
    assert {"embedding_auc", "unseen_words"} <= set(status["alarms"])

    # monitor.retrain_on_alarm: the alarm starts a cycle. The cycle itself is
    # tests/flows/test_retrain.py's; here, that it is started, with these params.
    params = yaml.safe_load(tiny_params_file.read_text())
    params["monitor"]["retrain_on_alarm"] = True
    tiny_params_file.write_text(yaml.safe_dump(params))
    started: list[Path] = []
    monkeypatch.setattr(flows.monitor, "_retrain", lambda path: started.append(path) or 0)
    (root / ".monitor" / "position.json").unlink()  # read the whole log again
    report = monitor_flow(params=str(tiny_params_file))
    assert report["alarms"] and report["retrain_exit_code"] == 0
    assert started == [tiny_params_file]


def test_a_schedule_without_a_prefect_server_is_refused_in_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    done = subprocess.run(
        [sys.executable, "-m", "flows.monitor", "--serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("ERROR: scheduling needs a Prefect")

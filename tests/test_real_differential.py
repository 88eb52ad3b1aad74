"""Differential test on the CPU lane: >= 50 generated programs on real gloo and in the simulator (gloo semantics).

Each case must agree on which ranks did not finish (hang/no-hang per rank), except where the difference is a
documented simulator gap (``simnccl.real.compare.KNOWN_GAPS``) or a store-key collision whose real outcome is decided by
connection order (then only pass/no-pass is compared). A failure prints the case as a replayable program and the
``python -m simnccl.real diff --seed S --only I`` command that runs it again.
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")

from simnccl.real.differential import MUTATIONS, cases, classify, run_cases, summary
from simnccl.real.launch import Launcher
from simnccl.real.zygote import pid_alive

pytestmark = pytest.mark.real

# Seed 3: its 52 cases draw every mutation class (seed 2 no longer drew swap-collectives and skip-new-group once the
# generator drew element types, group timeouts, splits of groups and two more classes).
SEED = int(os.environ.get("REAL_DIFF_SEED", "3"))
COUNT = int(os.environ.get("REAL_DIFF_COUNT", "52"))


def test_generated_programs_agree_between_simulator_and_real_gloo() -> None:
    chosen = cases(SEED, COUNT)
    assert len(chosen) >= 50
    assert {c.mutation for c in chosen} >= {None, *MUTATIONS} - {"skip-recv"}, "every mutation class is drawn"
    assert all(2 <= c.world_size <= 4 and max(len(p) for p in c.programs) <= 12 for c in chosen)
    started = time.monotonic()
    with Launcher() as launcher:
        results = run_cases(chosen, launcher=launcher, parallel=4)
    elapsed = time.monotonic() - started
    assert not [p for p in launcher.all_pids if pid_alive(p)], "a rank process outlived the run"
    print(f"\n{summary(results)} in {elapsed:.0f}s")
    disagreements = [r for r in results if classify(r) == "disagree"]
    assert not disagreements, "\n\n".join(r.describe() for r in disagreements)
    kinds = [classify(r) for r in results]
    assert kinds.count("agree") >= 35, summary(results)
    verdicts = {r.comparison.real["verdict"] for r in results}
    assert {"pass", "hang"} <= verdicts, "the cases exercise both outcomes"


def test_ctrl_c_stops_the_queued_cases_and_leaves_a_partial_report(tmp_path) -> None:
    """Ctrl-C during ``real diff``: its pool ran every queued case before the interrupt was seen, and nothing
    was written. Now the queued cases never start, the running world ends, and the JSON holds the cases that
    finished, marked ``interrupted`` and not ok; exit 130, no traceback, no process left."""
    import json
    import signal
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    from conftest import ended_by_ctrl_c, marked_processes

    repo = Path(__file__).resolve().parent.parent
    report = tmp_path / "diff.json"
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "simnccl.real", "diff", "--count", "40", "--parallel", "1", "--json", str(report)],
        cwd=repo,
        env=dict(os.environ, REAL_TEST_MARK=mark, PYTHONUNBUFFERED="1", PYTHONPATH=str(repo)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        while "(sim " not in (line := proc.stdout.readline()):
            assert line, "the command ended before its first case finished"
        proc.send_signal(signal.SIGINT)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    ended_by_ctrl_c(proc)
    (result,) = json.loads(report.read_text())["results"]
    assert result["interrupted"] is True and 1 <= len(result["cases"]) < 40
    assert len(result["cases"]) + len(result["not_finished"]) == 40
    assert json.loads(report.read_text())["ok"] is False, "an interrupted diff never reads as passing"
    deadline = time.monotonic() + 10
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(mark) == []


def test_a_ctrl_c_while_a_case_is_reported_lets_its_line_finish(tmp_path, monkeypatch, capsys) -> None:
    """A case handed back is kept (the JSON document's ``cases``) and reported (its --quiet line), or neither: a
    Ctrl-C landing while it was reported kept a case that had no line, neither its own nor "not finished".
    The real side is stood in by the simulated one (agreeing cases), the Ctrl-C by a real SIGINT sent while the
    first case is classified."""
    import json
    import signal

    from simnccl.cli_guard import guarded
    from simnccl.real import __main__ as real_main
    from simnccl.real import differential
    from simnccl.real.compare import compare_variant

    def simulated_only(chosen, **_kwargs):
        return [
            differential.CaseResult(case, compare_variant(case.name, "cpu", sim, sim, case.world_size, 0.0))
            for case in chosen
            for sim in [differential.simulate_case(case)]
        ]

    real_classify = differential.classify
    sent: list[str] = []

    def interrupted_classify(result):
        if not sent:
            sent.append(result.case.name)
            os.kill(os.getpid(), signal.SIGINT)
        return real_classify(result)

    monkeypatch.setattr(differential, "run_cases", simulated_only)
    monkeypatch.setattr(differential, "classify", interrupted_classify)
    target = tmp_path / "diff.json"
    argv = ["diff", "--count", "3", "--parallel", "1", "--quiet", "--json", str(target)]
    assert guarded(real_main.main, command=("real",))(argv) == 130
    lines = capsys.readouterr().out.splitlines()
    named = [line.split("  ")[1] for line in lines]
    document = json.loads(target.read_text())
    (result,) = document["results"]
    kept = [record["case"] for record in result["cases"]]
    assert sent[0] in kept and sorted(kept + result["not_finished"]) == sorted(named), (lines, result)
    assert len(named) == len(set(named)) == 3, lines

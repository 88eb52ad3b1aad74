"""A "pass" that a race of the simulated timing decided is not a pass to rely on.

A race (``RunOutcome.races``) is a store write or connection the simulated clock ordered one way, where real ranks
order it either way and the other order fails or hangs (each race's text says what was measured). No hang or error
carries it, so the engine's verdict stays "pass" — and every check that asks "did it pass" used to say yes: the
property invariant ``passes``, ``simnccl run`` (exit 0), a sweep cell ("ok"), the replay (``--simulate-only``:
exit 0). Each now fails it, saying the race, unless the user accepts races (``--allow race``,
``--accept-verdict race``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simnccl.cli import main
from simnccl.engine import RunOutcome
from simnccl.engine.outcome import pass_decided_by_race
from simnccl.ops import Compute, InitProcessGroup, NewGroup, Op
from simnccl.testing import replay, simulate
from simnccl.testing.invariants import passes, passes_or_times_out
from simnccl.testing.replay import SimCase

GLOO = InitProcessGroup(backend="gloo")
# Rank 0's counter runs one ahead (a local group of its own), so its one-rank group [0] writes its key under the
# name ranks 1 and 2 bootstrap [1, 2] under, 0.2 s after they came: real rank 1 hung there (real diff
# seed132-case33); in the simulated timing both read their peers' keys first and pass.
LATE = (GLOO, Compute(seconds=0.2), NewGroup(ranks=(0,), use_local_synchronization=True), NewGroup(ranks=(0,)))
PAIR = (GLOO, NewGroup(ranks=(0,)), NewGroup(ranks=(1, 2)))

# Every rank destroys and re-initialises the default group at once under spawn: rank 0's destroy drops the store
# it hosts at the very instant the others re-initialise (real: rank 1 failed in 2 runs of 6).
SPAWN_REINIT = """
[scenario]
name = "reinit"
[cluster]
gpu = "h100-80gb"
nodes = 1
gpus_per_node = 2
[torch]
release = "2.15"
launcher = "spawn"
[workload]
steps = [
  { op = "init_process_group", backend = "gloo" },
  { op = "destroy_process_group" },
  { op = "init_process_group", backend = "gloo" },
  { op = "all_reduce" },
]
"""


def racy_outcome() -> RunOutcome:
    out = simulate([list(LATE), list(PAIR), list(PAIR)], gpus_per_node=3)
    assert out.verdict == "pass" and len(out.races) == 1, (out.verdict, out.races)
    return out


def test_passes_fails_a_pass_that_a_race_decided_and_says_the_race() -> None:
    out = racy_outcome()
    verdict = passes(out)
    assert not verdict
    assert verdict.explanation.startswith("passed only in the simulated order of events")
    assert out.races[0] in verdict.explanation
    assert not passes_or_times_out(out, out)
    assert pass_decided_by_race(out) == verdict.explanation
    # the same program without the late write races nothing and passes
    calm = simulate([[GLOO, NewGroup(ranks=(0,)), NewGroup(ranks=(1, 2))]] * 3, gpus_per_node=3)
    assert calm.races == [] and passes(calm) and pass_decided_by_race(calm) is None


def test_a_race_beside_a_failure_is_left_to_the_failure() -> None:
    # a verdict other than pass already fails every check; the race adds nothing to it
    out = racy_outcome()
    out.verdict = "hang"
    assert pass_decided_by_race(out) is None


@pytest.fixture
def racy_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "reinit.toml"
    path.write_text(SPAWN_REINIT, encoding="utf-8")
    return path


def test_simnccl_run_exits_1_on_a_pass_a_race_decided_unless_races_are_allowed(
    racy_scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    assert main(["run", str(racy_scenario), "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert "race: rank 1 re-initialised the default group at" in text
    assert "passed only in the simulated order of events" in text and "--allow race" in text
    ((variant,),) = [r["variants"] for r in json.loads(out.read_text())["results"]]
    assert variant["verdict"] == "pass" and len(variant["races"]) == 1
    failed = [e for e in variant["expectations"] if not e["ok"]]
    assert [e["key"] for e in failed] == ["race"]
    # accepted on the command line: exit 0, the race still printed
    assert main(["run", str(racy_scenario), "--allow", "race"]) == 0
    assert "race: rank 1 re-initialised" in capsys.readouterr().out
    # an expectation of "pass" does not accept the race: the verdict check holds, the race entry fails
    expecting = racy_scenario.read_text() + '[[expect]]\nverdict = "pass"\n'
    racy_scenario.write_text(expecting, encoding="utf-8")
    assert main(["run", str(racy_scenario)]) == 1
    assert "passed only in the simulated order of events" in capsys.readouterr().out


def test_allow_names_race_among_what_it_accepts(capsys: pytest.CaptureFixture[str], racy_scenario: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", str(racy_scenario), "--allow", "races"])
    assert exited.value.code == 2
    assert "expected pass, fail, hang, error, race" in capsys.readouterr().err


def test_explain_says_the_pass_was_decided_by_a_race(racy_scenario: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", str(racy_scenario), "--allow", "race"])
    text = capsys.readouterr().out
    assert "every rank finished its program, but it passed only in the simulated order of events" in text
    assert "nothing to explain" not in text


def test_a_sweep_cell_fails_on_a_pass_a_race_decided_unless_accepted(
    racy_scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simnccl.sweep import command
    from simnccl.sweep.store import read_json

    out = tmp_path / "s.json"
    assert main(["sweep", "--scenario", str(racy_scenario), "--jobs", "1", "--json", str(out)]) == (
        command.EXIT_CHECK_FAILED
    )
    (row,) = read_json(out)[2]
    assert row["verdict"] == "pass" and row["status"] == "fail", row
    assert "passed only in the simulated order of events" in capsys.readouterr().out
    argv = ["sweep", "--scenario", str(racy_scenario), "--jobs", "1", "--json", str(out), "--overwrite"]
    assert main([*argv, "--accept-verdict", "pass", "--accept-verdict", "race"]) == 0, capsys.readouterr()
    (row,) = read_json(out)[2]
    assert row["status"] == "ok", row


def test_a_workload_cell_fails_on_a_raced_pass_unless_race_is_accepted() -> None:
    from simnccl.sweep.cell import verdict_failures
    from simnccl.sweep.matrix import Checks

    raced = racy_outcome()
    (failure,) = verdict_failures(raced, Checks(("pass",), None))
    assert failure.startswith("verdict pass passed only in the simulated order of events")
    assert verdict_failures(raced, Checks(("pass", "race"), None)) == []
    assert verdict_failures(raced, Checks(("hang", "race"), None)) == ["verdict pass"]  # pass itself not accepted


def _case_file(tmp_path: Path, programs: list[tuple[Op, ...]]) -> Path:
    case = SimCase(programs=tuple(programs), nodes=1, gpus_per_node=len(programs))
    return case.dump(tmp_path / "case.json")


def test_the_replay_does_not_call_a_raced_pass_a_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _case_file(tmp_path, [LATE, PAIR, PAIR])
    assert replay.main([str(path), "--simulate-only"]) == replay.EXIT_STILL_FAILS
    text = capsys.readouterr().out
    assert "verdict: pass" in text and "  race: store key collision under group name" in text
    assert replay.main([str(path)]) == replay.EXIT_STILL_FAILS  # no recorded check: a valid program must pass
    calm = _case_file(tmp_path, [(GLOO, NewGroup(ranks=(0,)), NewGroup(ranks=(1, 2)))] * 3)
    assert replay.main([str(calm), "--simulate-only"]) == replay.EXIT_OK

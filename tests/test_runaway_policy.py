"""A team's policy that never returns still ends every run: the timeout that stops it ends the run at once,
and no other rank enters the policy after it (simpy would otherwise wake the next rank first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import user_policies
from conftest import TINY

import simnccl.testing.replay as replay
from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
from simnccl.policy import UserPolicyError
from simnccl.testing.replay import SimCase

TESTS = Path(__file__).resolve().parent
PROGRAM = (SetDevice(), InitProcessGroup(), NewGroup(ranks=(0, 1, 2, 3), bind="g"), AllReduce(group="g"))


def _under_a_3_s_limit(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m simnccl ARGV`` run from tests/ (its policies importable) with ``max_wall_s`` at 3 s."""
    return subprocess.run(
        [sys.executable, "-m", "simnccl", *argv],
        cwd=TESTS,
        env={**os.environ, "SIMNCCL_LIMIT_MAX_WALL_S": "3"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("command", [["run", "-q"], ["cost", "--workload", "vllm", "--tp", "2", "--jobs", "1", "-q"]])
def test_the_commands_wall_clock_stops_a_policy_that_never_returns(command: list[str]) -> None:
    """Before: the limit's alarm fired once, inside rank 0's call; rank 1 entered the same loop and the command
    never ended (run, and cost in one process)."""
    done = _under_a_3_s_limit(*command, "--policy", "user_policies:LoopsForever", timeout=90)
    assert done.returncode == 2, done.stderr
    assert "ran past its wall-clock limit max_wall_s = 3 s" in done.stderr
    assert done.stderr.count("loops-forever: rank") == 1, done.stderr  # rank 0, stopped; no one after it


def test_a_property_case_whose_policy_never_returns_fails_once_and_asks_no_other_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replay, "CASE_WALL_S", 1.0)
    user_policies.LOOPS_ENTERED.clear()
    case = SimCase(programs=(PROGRAM,) * 4, gpus_per_node=4, policy="user_policies:LoopsForever")
    with pytest.raises(UserPolicyError, match=r"on_group raised CaseTimeout: .*still simulating after 1 s"):
        case.run()
    assert user_policies.LOOPS_ENTERED == [0]


def test_the_simulated_side_of_a_comparison_is_held_to_the_wall_clock_limit(tmp_path: Path) -> None:
    """``real`` bounds its own runs (``--timeout`` for the real ranks), so the command's limit was off for it, and a
    policy that never returns in the simulating process made ``real compare`` run until killed."""
    pytest.importorskip("torch")
    scenario = tmp_path / "tiny.toml"
    after_init = '{ op = "checkpoint", name = "after_init" },'
    scenario.write_text(TINY.replace(after_init, after_init + '\n  { op = "new_group", ranks = [0, 1], bind = "g" },'))
    done = _under_a_3_s_limit("real", "compare", "-q", str(scenario), "--policy", "user_policies:LoopsForever")
    assert done.returncode == 2, done.stderr
    assert "the simulated side of the comparison ran past its wall-clock limit max_wall_s = 3 s" in done.stderr

"""What a rank's environment holds: what its launcher sets, the same in the simulator, the capture and real torchrun.

A team's policy reads ``request.env``, the process environment. Simulated ranks saw only RANK, LOCAL_RANK and
WORLD_SIZE, so a policy branching on ``LOCAL_WORLD_SIZE`` ("groups within a node are free") was proven on a branch
production never takes, and ``--env LOCAL_WORLD_SIZE=2`` was refused as "given from the world's shape", which it
was not. Under torchrun every rank now gets what torchrun's agent sets (``env_knobs.torchrun_env``), checked here
against a real ``torchrun``; under spawn, nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from simnccl.env_knobs import LAUNCHER_VARIABLES, PER_RANK_VARIABLES, torchrun_env
from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, NewGroup, SetDevice
from simnccl.policy import BasePolicy
from simnccl.testing import simulate


@dataclass(frozen=True)
class SeesEnv(BasePolicy):
    """Keeps what each rank's request showed of the launcher's variables."""

    name: str = "sees-env"
    seen: dict[int, dict[str, str]] = field(default_factory=dict, compare=False, hash=False)

    def on_group(self, request: Any, decision: Any) -> Any:
        self.seen[request.rank] = {k: v for k, v in request.env.items() if k in LAUNCHER_VARIABLES}
        return decision


@dataclass(frozen=True)
class IntraNodeFree(BasePolicy):
    """A team's rule: a two-rank group is free (a fake backend) when ranks share a node (LOCAL_WORLD_SIZE > 1)."""

    name: str = "intra-node-free"

    def on_group(self, request: Any, decision: Any) -> Any:
        if len(request.ranks) == 2 and int(request.env.get("LOCAL_WORLD_SIZE", "1")) > 1:
            return replace(decision, backend="fake", explanation="ranks share a node: free")
        return decision


PROGRAM = [SetDevice(), InitProcessGroup(backend="nccl"), NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="end")]


def test_a_simulated_torchrun_rank_sees_what_torchrun_sets() -> None:
    spy = SeesEnv()
    simulate(PROGRAM, nodes=2, gpus_per_node=2, policy=spy)
    assert sorted(spy.seen) == [0, 1, 2, 3]  # every rank calls new_group
    for rank, env in spy.seen.items():
        local, node = rank % 2, rank // 2
        expected = torchrun_env(
            rank=rank, local_rank=local, node=node, world_size=4, local_world_size=2, nodes=2, env={}
        )
        assert env == {k: v for k, v in expected.items() if k in LAUNCHER_VARIABLES}
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == str(node)
        assert env["LOCAL_RANK"] == str(local) and env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"


def test_torchrun_sets_async_error_handling_unless_the_scenario_did() -> None:
    assert (
        torchrun_env(rank=0, local_rank=0, node=0, world_size=1, local_world_size=1, nodes=1, env={})[
            "TORCH_NCCL_ASYNC_ERROR_HANDLING"
        ]
        == "1"
    )
    mine = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    assert (
        torchrun_env(rank=0, local_rank=0, node=0, world_size=1, local_world_size=1, nodes=1, env=mine)[
            "TORCH_NCCL_ASYNC_ERROR_HANDLING"
        ]
        == "2"
    )


def test_a_spawned_rank_sees_none_of_them() -> None:
    spy = SeesEnv()
    simulate(PROGRAM, nodes=1, gpus_per_node=2, policy=spy, launcher="spawn")
    assert spy.seen == {0: {}, 1: {}}


def test_a_policy_reading_local_world_size_takes_its_branch_in_simulation() -> None:
    out = simulate(PROGRAM, gpus_per_node=2, policy=IntraNodeFree(), keep_trace=True)
    assert out.verdict == "pass"
    [record] = [r for k, r in out.groups.items() if k[0] == "1"]
    assert record.impl == "fake", record
    # and where the program communicates on that group, the fake backend moves nothing: the run fails
    used = simulate([*PROGRAM[:3], AllReduce(group="g", size_bytes=1024)], gpus_per_node=2, policy=IntraNodeFree())
    assert {e["type"] for e in used.errors} == {"PolicyFakeBackend"}


def test_per_rank_variables_are_those_that_differ_per_rank() -> None:
    envs = [
        torchrun_env(rank=r, local_rank=r % 4, node=r // 4, world_size=8, local_world_size=4, nodes=2, env={})
        for r in range(8)
    ]
    differ = {k for k in envs[0] if len({e[k] for e in envs}) > 1}
    assert differ == set(PER_RANK_VARIABLES)
    assert set(envs[0]) - {"TORCH_NCCL_ASYNC_ERROR_HANDLING"} == set(LAUNCHER_VARIABLES)


SHOW_ENV = """
import json, os, sys
names = sys.argv[1].split(",")
print("ENV " + json.dumps({k: os.environ.get(k) for k in names}), flush=True)
"""


def test_the_variables_are_what_a_real_torchrun_sets(tmp_path: Path) -> None:
    """torch 2.15's own torchrun, two processes on this host: the same names, and the same values but for the
    store's port and the run id (this test's own arguments)."""
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV, encoding="utf-8")
    names = [*LAUNCHER_VARIABLES, "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    env = {k: v for k, v in os.environ.items() if k not in names}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
    argv += ["--master-port", "0", "--rdzv-id", "none", str(script), ",".join(names)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = sorted(
        (json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ENV ")),
        key=lambda e: int(e["RANK"]),
    )
    assert len(seen) == 2, proc.stdout
    for rank, real in enumerate(seen):
        mine = torchrun_env(rank=rank, local_rank=rank, node=0, world_size=2, local_world_size=2, nodes=1, env={})
        for name in names:
            if name in ("MASTER_PORT", "MASTER_ADDR"):
                assert real[name], name  # set, to wherever this run's store is
                continue
            assert real[name] == mine[name], (name, real[name], mine[name])


@pytest.mark.parametrize("name", ["LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_RANK", "TORCHELASTIC_RUN_ID"])
def test_a_launcher_variable_cannot_be_set_for_every_rank(name: str) -> None:
    with pytest.raises(ValueError, match="set per rank by the launcher"):
        simulate(PROGRAM, gpus_per_node=2, env={name: "1"})

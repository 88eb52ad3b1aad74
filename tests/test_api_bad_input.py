"""Bad input through the Python API a user's own tests call (``simulate``, the ops, ``Limits``, the
``simnccl_simulate`` fixture's case, ``used_mib``): refused before anything runs, with the argument or field
named, never a crash deep in the engine, a hang, or a verdict for a program a file would be refused for.

Each case here is one a fuzzing round of the API found misbehaving (a NaN size spun until the 900 s wall guard,
a negative size or a misspelt ``traffic`` passed, a string where a number goes crashed in the engine)."""

from __future__ import annotations

import math

import pytest

from simnccl.engine import Limits
from simnccl.ops import (
    Alloc,
    AllReduce,
    Checkpoint,
    Compute,
    EmptyCache,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Op,
    PgOptions,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.scenario import ScenarioError
from simnccl.testing import simulate, used_mib
from simnccl.testing.replay import SimCase

START = [SetDevice(), InitProcessGroup()]


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (AllReduce(size_bytes=math.nan), "program[2].size_bytes: expected an integer, got a number nan"),  # type: ignore[arg-type]
        (AllReduce(size_bytes=-1), "program[2].size_bytes: expected a non-negative number of bytes, got -1"),
        (AllReduce(size_bytes="4"), "program[2].size_bytes: expected an integer, got a string '4'"),  # type: ignore[arg-type]
        (Send(peer=1, size_bytes=-1), "program[2].size_bytes: expected a non-negative number"),
        (Alloc(mib=-1000), "program[2].mib: expected a non-negative number of MiB, got -1000"),
        (Alloc(mib=math.inf), "program[2].mib: expected a finite number, got inf"),
        (EmptyCache(mib=-500), "program[2].mib: expected a non-negative number of MiB"),
        (Compute(seconds=-100), "program[2].seconds: expected a non-negative number of seconds"),
        (Compute(seconds=math.nan), "program[2].seconds: expected a finite number"),
        (MemoryCheck(gpu_memory_utilization=0.0), "expected a fraction of the GPU's memory in (0, 1], got 0"),
        (MemoryCheck(gpu_memory_utilization="0.9"), "gpu_memory_utilization: expected a number, got a string"),  # type: ignore[arg-type]
        (NewGroup(ranks=(0, 1), traffic="P2P"), "program[2].traffic: expected one of collectives, p2p, none"),
        (NewGroup(ranks=(0, 1), timeout_s=-1), "program[2].timeout_s: expected a positive number of seconds"),
        (NewGroup(ranks=(0, 1), backend=5), "program[2].backend: expected a string, got an integer 5"),  # type: ignore[arg-type]
        (NewGroup(ranks=(0, 1), backend="bogus"), "program[2].backend: "),
        (NewGroup(ranks=(0, 1), pg_options=None), "program[2].pg_options: expected a PgOptions"),  # type: ignore[arg-type]
        (NewGroup(ranks=(0, "a")), "program[2].ranks: expected a list of integers"),  # type: ignore[arg-type]
        (NewGroup(ranks=(0, 1), pg_options=PgOptions(max_ctas=-3)), "program[2].pg_options.max_ctas: expected"),
        (Checkpoint(label="a\nb"), "program[2].label: expected a name on one line"),
        (Op(), "program[2]: expected an op of simnccl.ops"),
    ],
)
def test_a_bad_op_is_refused_naming_its_field(op: Op, message: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        simulate([*START, op])
    assert message in str(raised.value), raised.value
    assert str(raised.value).startswith("simulate: ")


def test_an_op_in_one_ranks_list_is_named_with_its_rank() -> None:
    good = [*START, AllReduce()]
    with pytest.raises(ScenarioError, match=r"simulate: program\[1\]\[2\].size_bytes"):
        simulate([good, [*START, AllReduce(size_bytes=-4)]])


def test_ranks_are_left_to_the_simulated_torch_and_lists_of_ranks_are_taken() -> None:
    """torch raises for ranks out of the world at the call, and a program may test that: ``simulate`` runs it.
    ``NewGroup(ranks=[0, 1])`` is natural Python: taken as the tuple it stands for."""
    out = simulate([*START, NewGroup(ranks=(0, 5))])
    assert out.verdict == "error" and "ValueError" in {e["type"] for e in out.errors}, out.errors
    listed = simulate([*START, NewGroup(ranks=[0, 1], bind="tp"), SplitGroup(split_ranks=[[0], [1]]), AllReduce("tp")])  # type: ignore[arg-type]
    tupled = simulate(
        [*START, NewGroup(ranks=(0, 1), bind="tp"), SplitGroup(split_ranks=((0,), (1,))), AllReduce("tp")]
    )
    assert listed.verdict == "pass" and listed.trace_hash == tupled.trace_hash


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"env": {"TORCH_DIST_USE_NCCL2": 0}}, TypeError, "env: expected names and values that are strings"),
        ({"env": {5: "1"}}, TypeError, "env: expected names and values that are strings"),
        ({"env": "TORCH_DIST_USE_NCCL2=0"}, TypeError, "env: expected a mapping"),
        ({"env": {"A=B": "1"}}, ValueError, "env: 'A=B': expected an environment variable's name"),
        ({"env": {"NCCL_DEBUG": "WA\x00RN"}}, ValueError, "env: NCCL_DEBUG: a NUL character in the value"),
        ({"launcher": "torchrn"}, ValueError, "launcher: expected one of torchrun, spawn, got 'torchrn'"),
        ({"launcher": None}, ValueError, "launcher: expected one of torchrun, spawn"),
        ({"limits": 5}, TypeError, "limits: expected a Limits or None, got int"),
        ({"faults": "crash rank 1"}, TypeError, "faults: expected a FaultSchedule or None, got str"),
    ],
)
def test_a_bad_argument_is_refused_naming_it(kwargs: dict[str, object], error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        simulate([*START, AllReduce()], **kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize("program", [{"a": 1}, "set_device", 42, [SetDevice(), [InitProcessGroup()]]])
def test_a_program_that_is_no_list_of_ops_is_refused(program: object) -> None:
    with pytest.raises((TypeError, ScenarioError)) as raised:
        simulate(program)  # type: ignore[arg-type]
    assert "program" in str(raised.value)


def test_a_program_past_max_program_ops_is_refused_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_PROGRAM_OPS", "10")
    with pytest.raises(ValueError, match="program of 11 ops exceeds the limit max_program_ops = 10"):
        simulate([*START, *[Compute(0.0)] * 9])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wall_s": math.nan}, "Limits.wall_s: expected a number of seconds > 0, got nan"),
        ({"max_sim_time_s": 0}, "Limits.max_sim_time_s: expected a number of seconds > 0, got 0"),
        ({"max_ops": "10"}, "Limits.max_ops: expected an integer >= 1, got '10'"),
        ({"max_ops": True}, "Limits.max_ops: expected an integer >= 1, got True"),
    ],
)
def test_a_guard_that_would_not_guard_is_refused(kwargs: dict[str, object], message: str) -> None:
    """``wall_s=nan`` compared false with every elapsed time: the guard was off, silently."""
    with pytest.raises(ValueError) as raised:
        Limits(**kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lazy_init": "False"}, "lazy_init: expected a boolean, got str 'False'"),
        ({"max_ctas": 1.5}, "max_ctas: expected an integer, got float 1.5"),
        ({"split_share": 1}, "split_share: expected a boolean, got int 1"),
        ({"comm_name": 3}, "comm_name: expected a string, got int 3"),
    ],
)
def test_pg_options_of_the_wrong_type_are_refused_when_made(options: dict[str, object], message: str) -> None:
    """``PgOptions(lazy_init="False")`` was simulated as lazy (the text is true), where torch's field refuses it."""
    with pytest.raises(ValueError) as raised:
        PgOptions(**options)  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize(("nodes", "error"), [(0, ValueError), (-1, ValueError), ("2", ValueError)])
def test_a_case_of_no_cluster_is_refused(nodes: object, error: type) -> None:
    with pytest.raises(error, match="nodes: expected an integer >= 1"):
        SimCase(programs=(), nodes=nodes)  # type: ignore[arg-type]


def test_the_fixture_leaves_a_bad_cluster_to_simulate_which_names_it(simnccl_simulate: object) -> None:
    """The fixture built its case (a tuple per rank) before ``simulate`` checked the cluster: ``nodes=10**9`` made
    a two-billion-entry tuple first; ``nodes=0`` raised IndexError."""
    run = simnccl_simulate
    with pytest.raises(ValueError, match="exceeds the limit max_world_size"):
        run([*START], nodes=10**9)  # type: ignore[operator]
    with pytest.raises(ValueError, match="nodes"):
        run([*START], nodes=0)  # type: ignore[operator]
    with pytest.raises(TypeError, match="env: expected a mapping"):
        run([*START], env="x")  # type: ignore[operator]


def test_used_mib_names_the_checkpoints_a_run_passed() -> None:
    out = simulate([*START, Checkpoint("after_init")])
    with pytest.raises(
        KeyError, match="checkpoint 'after-init' was not passed by this run; checkpoints passed: 'after_init'"
    ):
        used_mib(out, "after-init")
    with pytest.raises(TypeError, match="expected the RunOutcome simulate returned"):
        used_mib(None, "after_init")  # type: ignore[arg-type]


def test_the_cluster_fixture_is_bounded_as_simulate_is(simnccl_cluster: object) -> None:
    with pytest.raises(ValueError, match="a cluster of 2000000000 ranks exceeds the limit max_world_size"):
        simnccl_cluster(nodes=10**9)  # type: ignore[operator]
    assert simnccl_cluster(nodes=2).world_size == 4  # type: ignore[operator]


def test_the_scenario_fixture_names_a_bad_path_or_variant_list(simnccl_scenario: object) -> None:
    with pytest.raises(TypeError, match="simnccl_scenario: path: expected a scenario file's path, got int"):
        simnccl_scenario(5)  # type: ignore[operator]
    with pytest.raises(TypeError, match="simnccl_scenario: variants: expected a list of variant names, got 'a'"):
        simnccl_scenario("scenario.toml", "a")  # type: ignore[operator]

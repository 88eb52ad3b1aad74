"""Safety then liveness over generated (program, fault schedule) pairs (testing-practices §4).

Safety: while faults are active, after every memory event no device is over capacity, every run ends with a
verdict, every stuck rank is explained, and only live ranks leave flight-recorder dumps. Liveness: once the
faults are healed (the same program, no schedule) the job completes. Same seed, same schedule, same trace.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simnccl.engine import Limits
from simnccl.faults import FAULT_KINDS, generate
from simnccl.ops import AllReduce, Checkpoint, Compute, Program
from simnccl.testing import simulate
from simnccl.workloads import generate as workload

pytestmark = pytest.mark.property

EXAMPLES = int(os.environ.get("SIMNCCL_FAULT_EXAMPLES", "520"))
VERDICTS = {"pass", "fail", "hang", "error"}


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[Program], int, str]:
    """A Megatron-style startup plus a few training collectives, on 2-8 ranks of one node."""
    world = draw(st.sampled_from([2, 4, 8]))
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if world % d == 0]))
    pp = draw(st.sampled_from([d for d in (1, 2) if (world // tp) % d == 0]))
    startup = workload("megatron", {"tp": tp, "pp": pp}, world)
    steps = draw(st.integers(1, 3))
    tail = []
    for _ in range(steps):
        tail += [
            AllReduce(group="tp", size_bytes=draw(st.sampled_from([4096, 1 << 20]))),
            Compute(seconds=0.5),
            AllReduce(group="dp", size_bytes=1 << 20),
        ]
    tail.append(Checkpoint(label="end"))
    cache: dict[int, Program] = {}
    programs = [cache.setdefault(id(p), Program((*p.ops, *tail))) for p in startup]
    policy = draw(st.sampled_from(["torch-default", "legacy", "lazy-init", "dedupe"]))
    return programs, world, policy


def run(programs, world, policy, faults=None, keep_trace=False):
    return simulate(
        [p.ops for p in programs],
        gpus_per_node=world,
        policy=policy,
        faults=faults,
        limits=Limits(wall_s=60),
        keep_trace=keep_trace,
    )


def crash_events(out) -> list[tuple[int, int]]:
    """(trace index, rank) of each crash or gpu-crash fault that struck, in trace order."""
    return [
        (i, event[1])
        for i, event in enumerate(out.trace)
        if event[2:3] == ("fault",) and event[3:4] in (("crash",), ("gpu-crash",))
    ]


def dumped_after_death(out) -> set[int]:
    """The crashed ranks with a flight-recorder dump recorded after their crash: a dead process writes nothing.
    (A rank may dump and then die: another rank's abort signalled the dump at the instant its own crash was due.)"""
    died_at = {}
    for index, rank in crash_events(out):
        died_at.setdefault(rank, index)
    return {
        event[1] for i, event in enumerate(out.trace) if event[2:3] == ("fr-dump",) and died_at.get(event[1], i + 1) < i
    }


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(jobs(), st.integers(0, 2**31 - 1), st.lists(st.sampled_from(FAULT_KINDS), unique=True, max_size=4))
def test_faults_keep_safety_and_healing_brings_liveness(job, seed, classes) -> None:
    programs, world, policy = job
    schedule = generate(seed, programs, classes=classes or None, max_faults=2)
    out = run(programs, world, policy, schedule, keep_trace=True)
    # safety, after every memory event
    assert out.verdict in VERDICTS
    for ledger in out.ledgers.values():
        assert all(0 <= event.used_bytes <= ledger.total_bytes for event in ledger.timeline)
    for hang in out.hangs:
        assert hang["explanation"] or hang["waiting_for"], hang
    dead = {e["rank"] for e in out.errors if e["kind"] == "crash"}
    assert dead <= {rank for _, rank in crash_events(out)}
    assert not dumped_after_death(out)
    if not schedule.faults:
        assert out.verdict == "pass"
    # liveness: the same job without faults converges
    healed = run(programs, world, policy)
    assert healed.verdict == "pass", healed.errors or healed.hangs


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.integers(0, 2**31 - 1))
def test_same_seed_same_schedule_same_trace(job, seed) -> None:
    programs, world, policy = job
    first, second = generate(seed, programs), generate(seed, programs)
    assert first == second
    assert run(programs, world, policy, first).trace_hash == run(programs, world, policy, second).trace_hash

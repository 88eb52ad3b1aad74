"""Faults: seeded schedules replay exactly; each kind does what it claims, at the op or time it names."""

from __future__ import annotations

import pytest

from simnccl.faults import FAULT_KINDS, Fault, FaultError, FaultSchedule, apply_to_programs, generate
from simnccl.ops import Alloc, AllReduce, Compute, InitProcessGroup, NewGroup, Program, SetDevice
from simnccl.testing import simulate

START = [SetDevice(), InitProcessGroup(backend="nccl")]
BODY = [
    *START,
    NewGroup(ranks=(0, 1, 2, 3), bind="tp"),
    AllReduce(group="tp"),
    Compute(seconds=1.0),
    AllReduce(group="tp"),
    AllReduce(group="tp"),
]
PROGRAMS = [Program(tuple(BODY))] * 4


def run(*faults: Fault, env=None):
    return simulate(BODY, gpus_per_node=4, env=env, faults=FaultSchedule(None, (), tuple(faults)))


def test_same_seed_gives_the_same_schedule_and_trace() -> None:
    a, b = generate(11, PROGRAMS), generate(11, PROGRAMS)
    assert a == b and a.describe() == b.describe()
    assert a.describe().startswith("fault schedule seed=11 classes=")
    outs = [
        simulate(BODY, gpus_per_node=4, faults=generate(11, PROGRAMS, classes=FAULT_KINDS, max_faults=3))
        for _ in range(2)
    ]
    assert outs[0].trace_hash == outs[1].trace_hash


def test_swarm_switches_whole_classes_off() -> None:
    classes = {generate(seed, PROGRAMS).classes for seed in range(40)}
    assert len(classes) > 10  # different subsets of the fault classes, not always all of them
    assert all(
        f.kind in generate(seed, PROGRAMS).classes for seed in range(40) for f in generate(seed, PROGRAMS).faults
    )


def test_skip_rewrites_only_the_culprits_program() -> None:
    programs = apply_to_programs(FaultSchedule(None, (), (Fault("skip", 2, at_op=5),)), PROGRAMS)
    assert programs[0] is PROGRAMS[0] and programs[2] is not PROGRAMS[2]
    assert isinstance(programs[2].ops[5], Compute) and len(programs[2].ops) == len(BODY)


def test_skip_hangs_the_others_who_name_the_culprit() -> None:
    out = run(Fault("skip", 2, at_op=5))
    assert out.verdict == "hang"
    waiting = {h["rank"]: h for h in out.hangs}
    assert waiting[0]["waiting_for"] == [2]
    assert "rank 2" in waiting[0]["explanation"]


def test_crash_at_an_op_kills_the_rank_without_a_dump_and_others_time_out() -> None:
    out = run(Fault("crash", 1, at_op=5))
    assert out.verdict == "error"
    crash = [e for e in out.errors if e["kind"] == "crash"]
    assert [e["rank"] for e in crash] == [1] and "injected fault: crash rank 1 at op 5" in crash[0]["message"]
    assert 1 not in out.fr_dumps and set(out.fr_dumps) == {0, 2, 3}
    assert "died: Crash" in next(h for h in out.hangs if h["rank"] == 0)["explanation"]


def test_crash_at_a_time_interrupts_whatever_the_rank_is_doing() -> None:
    out = run(Fault("crash", 3, at_s=0.5))
    (crash,) = [e for e in out.errors if e["kind"] == "crash"]
    assert crash["rank"] == 3 and crash["time_s"] == pytest.approx(0.5)


def test_gpu_crash_takes_every_process_on_that_gpu() -> None:
    # four gloo processes sharing two GPUs (cuda:r%2): a crash of GPU 0 kills ranks 0 and 2 only
    programs = [
        [SetDevice(device=r % 2), InitProcessGroup(backend="gloo"), Alloc(mib=16), Compute(seconds=5.0)]
        for r in range(4)
    ]
    out = simulate(
        programs, gpus_per_node=2, ranks_per_node=4, faults=FaultSchedule(None, (), (Fault("gpu-crash", 0, at_s=1.0),))
    )
    crashed = sorted(e["rank"] for e in out.errors if e["kind"] == "crash")
    assert crashed == [0, 2]
    assert {rt.rank: rt.status for rt in out.ranks} == {0: "aborted", 1: "done", 2: "aborted", 3: "done"}


def test_straggler_is_slower_but_finishes() -> None:
    fast = run()
    slow = run(Fault("straggler", 1, factor=4.0))
    assert slow.verdict == fast.verdict == "pass"
    assert slow.end_time_s == pytest.approx(fast.end_time_s + 3.0, abs=1e-6)


def test_oom_at_init_fails_that_ranks_next_communicator() -> None:
    out = run(Fault("oom-at-init", 2))
    (oom,) = [e for e in out.errors if e["kind"] == "oom"]
    assert oom["rank"] == 2 and "injected fault: oom-at-init" in oom["message"]
    assert out.verdict == "fail"


def test_nccl_error_aborts_after_the_dump_wait() -> None:
    out = run(Fault("nccl-error", 0, at_op=5))
    (err,) = [e for e in out.errors if e["rank"] == 0]
    assert "NCCL Async Error" in err["message"] and err["time_s"] >= 15.0
    assert out.verdict == "error"


@pytest.mark.parametrize(
    "fault",
    [
        Fault("explode", 0),
        Fault("crash", 9, at_op=0),
        Fault("skip", 0, at_op=0),
        Fault("crash", 0),
        Fault("straggler", 0, factor=0.5),
        Fault("skip", 0, at_op=99),
    ],
)
def test_malformed_faults_are_rejected(fault) -> None:
    with pytest.raises(FaultError):
        apply_to_programs(FaultSchedule(None, (), (fault,)), PROGRAMS)

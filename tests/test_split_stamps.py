"""Split stamps (``engine/fast/stamps.py``): in a cohort block, a split's members after the first are made from
what the first one's making decided, and nothing observable changes.

Why: a stamp skips the ordinary path's questions for every member but the first, so it must leave the run
event for event as the ordinary path does: the trace (its hash and every event), every ledger by owner, every
group record with its members, every rank's groups, the NVLS ledger, and a failure raised at the same step on
the same rank. These tests compare runs with stamps on and off where a stamp is taken, where a member must not
take it (another class, a device without its first communicator yet), and where a member fails inside it
(NVLS slots exhausted, out of memory).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import load_benchmark

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, RunOutcome, SimConfig
from simnccl.engine.comms import Comms
from simnccl.engine.fast.cohorts import Cohorts
from simnccl.engine.fast.stamps import SplitStamps
from simnccl.engine.memory import Memory
from simnccl.memory import Owner
from simnccl.ops import InitProcessGroup, NewGroup, Program, SetDevice
from simnccl.profiles import find_profile

bench = load_benchmark("engine")  # the Megatron-style startup every rank runs (one shared Program)
gate = load_benchmark("engine_gate")

SMALL = bench.Dims(tp=4, cp=1, pp=2, ep=4)
NVLS_MESSAGE = "Failed to bind NVLink SHARP (NVLS) Multicast memory"


def _config(world: int, dims: Any = SMALL, *, gpu: str = "h100-80gb") -> SimConfig:
    config = bench.make_config(bench.build_startup(world, dims), 120.0)
    cluster = Cluster(get_gpu_kind(gpu), world // 8, 8)
    return replace(config, cluster=cluster, profile=find_profile(gpu, "2.15"))


def _run(config: SimConfig, *, stamps: bool, sharing_rank: int | None = None) -> tuple[Engine, RunOutcome]:
    """One run; ``sharing_rank``: a rank whose environment asks for shared split resources (a class of its own)."""
    engine = Engine(config, keep_trace=True)
    engine.fast.cohorts.stamps = stamps
    if sharing_rank is not None:
        rt = engine.sim.ranks[sharing_rank]
        rt.ctx = replace(rt.ctx, env={**rt.ctx.env, "NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"})
    return engine, engine.run()


def _facts(engine: Engine, outcome: RunOutcome) -> dict[str, Any]:
    """The gate's record (verdict, event count, trace hash, reports) plus every event, every ledger by owner
    and its timeline, the host ledgers, every group's record, every rank's groups, handles and flight recorder
    groups, NVLS slots, every communicator id's members, the watchdogs' shortest timeout."""
    return {
        "record": gate._record(outcome, engine.explanations),
        "trace": outcome.trace,
        "ledgers": {
            key: (ledger.used_bytes, ledger.peak_bytes, dict(ledger.by_owner), list(ledger.timeline))
            for key, ledger in {**outcome.ledgers, **outcome.host_ledgers}.items()
        },
        "groups": {key: (rec.impl, rec.via_split, rec.members) for key, rec in outcome.groups.items()},
        "ranks": [
            (
                rt.status,
                rt.pc,
                [
                    (g.name, g.rank_in_group, g.bound_device, {t: c.comm_id for t, c in g.comms.items()})
                    for g in rt.groups
                ],
                {bind: getattr(handle, "name", handle) for bind, handle in rt.handles.items()},
            )
            for rt in outcome.ranks
        ],
        "flight_recorders": [None if rt.fr is None else repr(rt.fr.groups) for rt in outcome.ranks],
        "slots": outcome.slots_charged,
        "communicators": dict(engine.fast.cohorts.comms.registry.members),  # each id's members
        "shortest_timeout": engine.fast.cohorts.groups.watchdogs.min_timeout_s,
        "errors": outcome.errors,
    }


def _memberships(outcome: RunOutcome) -> int:
    return sum(len(rt.groups) - 1 for rt in outcome.ranks)  # every group but the default one


def test_every_split_member_of_a_block_is_stamped_and_the_run_is_unchanged() -> None:
    """512 ranks, ~20 groups each, all made by splits of the default group in one block: every membership is
    made by a stamp, and the run equals the ordinary path's event for event."""
    config = _config(512, bench.Dims())
    engine, outcome = _run(config, stamps=True)
    assert outcome.verdict == "pass"
    assert engine.fast.cohorts.split_stamps.made == _memberships(outcome)
    ordinary, plain = _run(config, stamps=False)
    assert ordinary.fast.cohorts.split_stamps.made == 0
    assert _facts(engine, outcome) == _facts(ordinary, plain)


def test_children_that_share_their_parents_resources_reuse_its_nvls_slots() -> None:
    """NCCL_COMM_SPLIT_SHARE_RESOURCES=1 everywhere: each split child shares its parent's resources, and one with
    as many ranks on its node as the parent reuses the parent's NVLS slots (a tp group of a node's 8 ranks) —
    which a stamp must note (``note_parent``) as the ordinary path does; and groups with a shorter timeout than
    the default group's shorten the watchdogs' step."""
    config = _config(64, bench.Dims(tp=8, cp=1, pp=2, ep=8))
    program = config.programs[0]
    shorter = Program(tuple(replace(op, timeout_s=60.0) if isinstance(op, NewGroup) else op for op in program.ops))
    config = replace(config, env={"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}, programs=[shorter] * 64)
    engine, outcome = _run(config, stamps=True)
    assert outcome.verdict == "pass"
    assert engine.fast.cohorts.split_stamps.made == _memberships(outcome)
    assert engine.fast.cohorts.groups.watchdogs.min_timeout_s == 60.0
    assert _facts(engine, outcome) == _facts(*_run(config, stamps=False))


def test_a_member_of_another_class_is_stamped_with_its_own_plan() -> None:
    """One rank asks for shared split resources (NCCL_COMM_SPLIT_SHARE_RESOURCES=1): its children are planned
    as sharing (a class of its own); a stamp makes them from its own plan, and the run is the ordinary path's."""
    config = _config(64)
    engine, outcome = _run(config, stamps=True, sharing_rank=5)
    assert outcome.verdict == "pass"
    odd = outcome.ranks[5]
    assert all(g.comms["cuda"].shared for g in odd.groups[1:])
    assert not any(g.comms["cuda"].shared for rt in outcome.ranks if rt.rank != 5 for g in rt.groups)
    assert engine.fast.cohorts.split_stamps.made == _memberships(outcome)
    assert _facts(engine, outcome) == _facts(*_run(config, stamps=False, sharing_rank=5))


def test_a_member_that_is_not_steady_takes_the_ordinary_path(monkeypatch) -> None:
    """In a block every member's device already holds its default group's communicator (the split's parent),
    so members are steady unless a fault is armed, and faults keep blocks out altogether. So the ordinary path
    is forced here for rank 3, as if it were not steady: its memberships are made by the ordinary path, every
    other by a stamp, and the run is the same either way."""
    is_steady = Memory.is_steady
    monkeypatch.setattr(Memory, "is_steady", lambda self, rt, device: rt.rank != 3 and is_steady(self, rt, device))
    config = _config(64)
    engine, outcome = _run(config, stamps=True)
    assert outcome.verdict == "pass"
    assert engine.fast.cohorts.split_stamps.made == _memberships(outcome) - (len(outcome.ranks[3].groups) - 1)
    monkeypatch.undo()
    assert _facts(engine, outcome) == _facts(*_run(config, stamps=False))


def test_members_a_stamp_does_not_make_in_the_middle_of_a_call_take_the_ordinary_path(monkeypatch) -> None:
    """``make_members`` makes a call's members in one pass, asking per member only whether this member's plan is
    the call's and the member steady; a member that is not (rank 3, as if not steady; rank 5, a class of its
    own that plans shared split resources) in the middle of a call is made by the ordinary path or from its own
    plan at its place in member order, the members after it by the stamp again, and the run is the ordinary
    path's."""
    is_steady = Memory.is_steady
    monkeypatch.setattr(Memory, "is_steady", lambda self, rt, device: rt.rank != 3 and is_steady(self, rt, device))
    ordinary: list[int] = []
    apply_member_plan = Cohorts._apply_member_plan

    def counting(self: Cohorts, rt: Any, plan: Any, op: Any, child_id: Any) -> Any:
        ordinary.append(rt.rank)
        return apply_member_plan(self, rt, plan, op, child_id)

    monkeypatch.setattr(Cohorts, "_apply_member_plan", counting)
    config = _config(64)
    engine, outcome = _run(config, stamps=True, sharing_rank=5)
    assert outcome.verdict == "pass"
    assert set(ordinary) == {3} and len(ordinary) == len(outcome.ranks[3].groups) - 1
    assert engine.fast.cohorts.split_stamps.made == _memberships(outcome) - len(ordinary)
    assert all(g.comms["cuda"].shared for g in outcome.ranks[5].groups[1:])
    # Rank 3 and 5 sit inside calls with members on both sides (the tp group of ranks 0-3 and 4-7, dp groups).
    assert any(g.ranks[0] < 3 < g.ranks[-1] for g in outcome.ranks[3].groups[1:])
    assert any(g.ranks[0] < 5 < g.ranks[-1] for g in outcome.ranks[5].groups[1:])
    monkeypatch.undo()
    assert _facts(engine, outcome) == _facts(*_run(config, stamps=False, sharing_rank=5))


@pytest.mark.parametrize("conf", [None, "expandable_segments:True"])
def test_a_stamp_asks_the_cudamallocasync_check_only_where_the_allocator_is_configured(monkeypatch, conf) -> None:
    """torch 2.15 aborts a process whose PYTORCH_CUDA_ALLOC_CONF picks cudaMallocAsync at its first NCCL
    communicator (``Comms.abort_if_cudamallocasync``). A process without that variable can't abort so, and a
    stamp does not ask for it (asking was a call per membership); with the variable set, every stamped member
    is checked, and the run is the ordinary path's either way."""
    asked: list[int] = []
    check = Comms.abort_if_cudamallocasync

    def counting(self: Comms, rt: Any, comm: Any) -> None:
        asked.append(rt.rank)
        check(self, rt, comm)

    monkeypatch.setattr(Comms, "abort_if_cudamallocasync", counting)
    config = _config(64)
    if conf is not None:
        config = replace(config, env={"PYTORCH_CUDA_ALLOC_CONF": conf})
    engine, outcome = _run(config, stamps=True)
    assert outcome.verdict == "pass"
    made = engine.fast.cohorts.split_stamps.made
    assert made == _memberships(outcome)
    # Each rank's default group asks on the ordinary path; a stamped member only where the variable is set.
    assert len(asked) == 64 + (made if conf is not None else 0)
    monkeypatch.undo()
    assert _facts(engine, outcome) == _facts(*_run(config, stamps=False))


def test_steady_means_context_first_communicator_and_no_armed_fault() -> None:
    """``make`` asks ``Memory.is_steady``: a member whose device has no CUDA context or no communicator of this
    process yet, or with an out-of-memory fault armed, would be charged more than its communicator, which only
    the ordinary path charges."""
    engine, outcome = _run(_config(16), stamps=True)
    rt = outcome.ranks[3]
    device = rt.world.bound_device
    memory = engine.fast.cohorts.memory
    assert memory.is_steady(rt, device)
    rt.nccl_devices.discard(device)
    assert not memory.is_steady(rt, device)
    rt.nccl_devices.add(device)
    rt.contexts.discard(device)
    assert not memory.is_steady(rt, device)
    rt.contexts.add(device)
    memory.fail_next_init(rt.rank)
    assert not memory.is_steady(rt, device)


def _stamp_failures(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every failure a call's ``make_members`` kept (in every test using this, its members are all stamped):
    (rank, type)."""
    raised: list[tuple[int, str]] = []
    make_members = SplitStamps.make_members

    def recording(self: SplitStamps, *args: Any) -> bool:
        failures = args[7]
        before = set(failures)
        failed = make_members(self, *args)
        raised.extend((rank, type(failures[rank][1]).__name__) for rank in failures if rank not in before)
        return failed

    monkeypatch.setattr(SplitStamps, "make_members", recording)
    return raised


def test_nvls_slots_run_out_inside_a_stamped_member_as_on_the_ordinary_path(monkeypatch) -> None:
    """H200 nodes (128 multicast slots, ~10 a communicator, NCCL 2.30: a failed bind is fatal). Node 1 holds
    ten groups of its own; then groups over both nodes: rank 0 binds on node 0, and rank 8, node 1's first
    member, finds its node's slots exhausted. It and node 1's other members
    fail with NCCL's error at that call, inside their stamps, and the run is the ordinary path's."""
    raised = _stamp_failures(monkeypatch)
    node_one = [NewGroup(ranks=tuple(range(8, 16)), bind=f"n1g{i}") for i in range(10)]
    both = [NewGroup(ranks=tuple(range(16)), bind=f"all{i}") for i in range(3)]
    program = Program((SetDevice(), InitProcessGroup(backend="nccl"), *node_one, *both))
    config = replace(_config(16, gpu="h200-141gb"), programs=[program] * 16)
    engine, outcome = _run(config, stamps=True)
    assert outcome.verdict != "pass"
    assert {rank for rank, kind in raised} == set(range(8, 16))
    assert {kind for rank, kind in raised} == {"TorchError"}
    failed = {e["rank"]: e for e in outcome.errors}
    assert set(range(8, 16)) <= set(failed)
    assert all(NVLS_MESSAGE in failed[rank]["message"] for rank in range(8, 16))
    monkeypatch.undo()
    assert _facts(engine, outcome) == _facts(*_run(config, stamps=False))


def test_a_device_that_runs_out_of_memory_inside_a_stamped_member_fails_as_on_the_ordinary_path(monkeypatch) -> None:
    """Another process holds so much of rank 9's device that its last split child is 50 MiB short at its init
    charge: that communicator, made by a stamp, fails with the
    out-of-memory error NCCL's cudaMalloc gives, at the same call, with everything before it kept, and the run
    is the ordinary path's."""
    probe_engine, probe = _run(_config(64), stamps=True)
    rt = probe.ranks[9]
    ledger = probe_engine.fast.cohorts.memory.ledger(rt, rt.world.bound_device)
    key = ledger.device
    splits = {rec.name for rec in probe.groups.values() if rec.via_split}
    last_init = [e for e in ledger.timeline if e.owner.phase == "init" and e.owner.group in splits][-1]
    spare = ledger.total_bytes - last_init.used_bytes + 50 * 2**20

    def run(stamps: bool) -> tuple[Engine, RunOutcome]:
        engine = Engine(_config(64), keep_trace=True)
        engine.fast.cohorts.stamps = stamps
        engine.fast.cohorts.memory.ledgers[key].allocate(Owner("torch", 9), spare, time_s=0.0, op=None)
        return engine, engine.run()

    raised = _stamp_failures(monkeypatch)
    engine, outcome = run(True)
    assert outcome.verdict == "fail"  # an out-of-memory is the workload failing, not the harness
    assert raised == [(9, "SimulatedOOM")]
    assert [e["rank"] for e in outcome.errors if "Failed to CUDA calloc" in e["message"]] == [9]
    monkeypatch.undo()
    assert _facts(engine, outcome) == _facts(*run(False))

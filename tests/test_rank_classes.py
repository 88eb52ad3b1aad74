"""Rank classes (``engine/fast/classes.py``): members that plan a call alike up to relabelling are planned once
per class, the plan relabelled for the others — and nothing observable changes.

Why: a world-wide block of group creation plans every member of every group; classes make that one plan per
class and call arguments. These tests pin that the relabelled plan *is* torch's plan for that rank (checked
plan by plan), that a run with classes equals one without (trace, ledgers, groups, reports), that a rank of
another class, a fault on one rank or a rank-dependent policy falls back to planning of its own, and that a
hang after a class-planned block at a large world still names every stuck rank.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from simnccl.c10d import Members, TorchError, validate_ranks
from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, RunOutcome, SimConfig
from simnccl.faults import NO_FAULTS, Fault, FaultSchedule
from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, NewGroup, Program, SetDevice
from simnccl.policy import BasePolicy, GroupDecision, GroupRequest
from simnccl.profiles import find_profile
from simnccl.release import MISMATCHED_BOUND_DEVICE, get_release
from simnccl.testing.replay import SimCase
from simnccl.testing.strategies import cases

_BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"simnccl_bench_{name}", _BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load("engine")  # the Megatron-style startup every rank runs (one shared Program)
gate = _load("engine_gate")  # a generated case as a SimConfig


def _run(config: SimConfig, *, classes: bool, fast_path: bool = True) -> tuple[Engine, RunOutcome]:
    engine = Engine(config, keep_trace=True, fast_path=fast_path)
    engine.classes.enabled = classes and fast_path
    engine.classes.check = classes  # every relabelled plan is compared with the rules' plan for its rank
    return engine, engine.run()


def _facts(engine: Engine, outcome: RunOutcome) -> dict[str, Any]:
    """What a run is observed by: the gate's record (verdict, events, trace hash, reports) plus every device's
    ledger by owner, every group's members and every rank's groups."""
    return {
        "record": gate._record(outcome, engine.explanations),
        "trace": outcome.trace,
        "ledgers": {
            key: (ledger.used_bytes, ledger.peak_bytes, sorted((repr(o), held) for o, held in ledger.by_owner.items()))
            for key, ledger in outcome.ledgers.items()
        },
        "groups": {key: (rec.impl, rec.via_split, rec.members) for key, rec in outcome.groups.items()},
        "ranks": [
            (rt.status, rt.pc, rt.counter, [(g.name, g.rank_in_group, g.bound_device) for g in rt.groups])
            for rt in outcome.ranks
        ],
    }


def _startup_config(world: int, dims: Any, *, ops: tuple[Any, ...] | None = None, **changes: Any) -> SimConfig:
    startup = bench.build_startup(world, dims)
    config = bench.make_config(startup, 120.0)
    if ops is not None:
        config = replace(config, programs=[Program(ops)] * world)
    return replace(config, **changes)


SMALL = bench.Dims(tp=4, cp=1, pp=2, ep=4)


# ---------------------------------------------------------------------------------------------- equal outcomes


@seed(20261203)
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(cases(min_world=2, max_world=16, policy=st.none()))
def test_class_planning_equals_per_rank_planning_on_generated_programs(case: SimCase) -> None:
    config = gate._case_config(case, NO_FAULTS)
    fanned = _run(config, classes=True)
    per_rank = _run(config, classes=False)
    assert _facts(*fanned) == _facts(*per_rank)


@seed(20261204)
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(cases(min_world=4, max_world=16, policy=st.sampled_from(["dedupe", "lazy-init", "budget(700)"])))
def test_class_planning_equals_per_rank_planning_under_built_in_policies(case: SimCase) -> None:
    config = gate._case_config(case, NO_FAULTS)
    assert _facts(*_run(config, classes=True)) == _facts(*_run(config, classes=False))


def test_a_startup_is_planned_once_per_class_and_call_arguments() -> None:
    """512 ranks, every rank a member of ~20 groups: one class (a bound default group, one environment), one
    set of call arguments, so one plan by the rules and every other membership relabelled."""
    config = _startup_config(512, bench.Dims())
    engine, outcome = _run(config, classes=True)
    memberships = sum(len(rt.groups) - 1 for rt in outcome.ranks)
    assert outcome.verdict == "pass"
    assert engine.classes.planned == 1
    assert engine.classes.relabelled == memberships  # + 1 plan: rank 0's, asking whether a block opens
    assert _facts(engine, outcome) == _facts(*_run(config, classes=False))


# ---------------------------------------------------------------------------------------------- divergence


def _ranks_after_init(world: int) -> tuple[Engine, list[Any]]:
    config = _startup_config(world, SMALL, ops=(SetDevice(), InitProcessGroup(backend="nccl")))
    engine, outcome = _run(config, classes=True)
    assert outcome.verdict == "pass"
    return engine, outcome.ranks


def test_a_rank_of_another_class_is_planned_by_the_rules() -> None:
    """One rank whose environment asks for shared split resources is a class of its own: it gets a plan of
    its own (shared), the others one plan relabelled, and every plan equals the rules' plan for that rank."""
    engine, ranks = _ranks_after_init(16)
    odd = ranks[5]
    odd.ctx = replace(odd.ctx, env={**odd.ctx.env, "NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"})
    op = NewGroup(ranks=tuple(range(16)), bind="all")
    members = validate_ranks(op.ranks, 16)
    assert isinstance(members, Members)
    plans = dict(engine.classes.member_plans(ranks, op, members, counter=7))
    assert engine.classes.planned == 2 and engine.classes.relabelled == 14
    for rank, plan in plans.items():
        assert plan == engine.classes.planner.plan_new_group(ranks[rank], op, 7)
        assert plan.rank_in_group == rank and plan.bound_device == ranks[rank].world.bound_device
        assert plan.comms[0].split_from is ranks[rank].world.comm_for("cuda")
    assert [rank for rank, plan in plans.items() if plan.comms[0].shared] == [5]


def test_a_member_not_bound_to_the_calls_device_id_raises_as_torch_does() -> None:
    """``new_group(device_id=0)``: the bound device is relabelled between members, so the bound-device check
    is the rules' on every member — rank 0 (bound to 0) gets its plan, the others torch's error."""
    engine, ranks = _ranks_after_init(16)
    engine.classes.check = False  # the relabelled plans alone (checking would plan by the rules too)
    op = NewGroup(ranks=(0, 1, 2, 3), bind="g", device_id=0)
    planner = engine.classes.planner
    assert planner.plan_new_group(ranks[0], op, 3).bound_device == 0
    for rank in (1, 2, 3):
        with pytest.raises(TorchError) as err:
            planner.plan_new_group(ranks[rank], op, 3)
        assert err.value.message == MISMATCHED_BOUND_DEVICE


def test_a_fault_on_one_rank_falls_back_to_per_rank_simulation() -> None:
    """A crash on one rank mid-startup: no block is taken for anyone (the faulted rank would leave it): every
    rank runs its own calls (members still planned per class, each plan checked), and the outcome is the one
    the per-rank path gives."""
    faults = FaultSchedule(None, (), (Fault("crash", 5, at_op=6),))
    config = _startup_config(64, SMALL, faults=faults)
    engine, outcome = _run(config, classes=True)
    assert outcome.verdict != "pass"
    assert engine.fast.cohorts.program is None and not engine.fast.cohorts.by_start
    assert _facts(engine, outcome) == _facts(*_run(config, classes=False, fast_path=False))


@dataclass(frozen=True)
class RankDependent(BasePolicy):
    """A user policy that decides by the calling rank (so it can't be trusted to decide alike): odd ranks make
    singletons fake ones — including singletons of other ranks, which the members-agree check catches."""

    name: str = "rank-dependent"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) == 1 and request.rank % 2:
            return GroupDecision("fake", decision.pg_options, decision.use_local_synchronization)
        return decision


def test_a_rank_dependent_policy_falls_back_to_per_rank_planning_and_its_mismatch_is_reported() -> None:
    config = _startup_config(64, SMALL, policy=RankDependent())
    engine, outcome = _run(config, classes=True)
    cohorts = engine.fast.cohorts.by_start.values()
    assert cohorts and all(c.broken for c in cohorts)  # no block under an unverified policy: each rank decides
    assert outcome.verdict == "error"
    assert {e["type"] for e in outcome.errors} == {"PolicyInconsistency"}
    assert _facts(engine, outcome) == _facts(*_run(config, classes=False, fast_path=False))


@dataclass(frozen=True)
class OwnDevices(BasePolicy):
    """Each rank binds its multi-rank groups to its own GPU (``device_id`` = its local rank); rank 0 alone asks
    ``deviating`` of group [0, 1, 2, 3] (a member disagreement), or, with ``lazy_every``, groups are lazy on
    every other call of the history (members agree)."""

    name: str = "own-devices"
    deviating: str = ""
    lazy_every: bool = False

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) > 1:
            decision = replace(decision, device_id=request.rank % 8, explanation="its own device")
        if self.deviating and request.rank == 0 and request.ranks == (0, 1, 2, 3):
            options = replace(decision.pg_options, **{self.deviating: True})
            decision = replace(decision, pg_options=options, explanation="rank 0 differs")
        if self.lazy_every and request.history.calls % 2 == 0:
            decision = replace(decision, pg_options=replace(decision.pg_options, lazy_init=True))
        return decision


_OWN_DEVICE_OPS = (
    SetDevice(),
    InitProcessGroup(backend="nccl"),
    NewGroup(ranks=(0, 2, 4, 6), bind="a"),
    NewGroup(ranks=(1, 3, 5, 7), bind="a"),
    NewGroup(ranks=(0, 1, 2, 3), bind="b"),
    NewGroup(ranks=(4, 5, 6, 7), bind="b"),
    AllReduce(group="a"),
    AllReduce(group="b"),
    Checkpoint(label="end"),
)


@pytest.mark.parametrize(
    ("policy", "verdict"),
    [(OwnDevices(deviating="is_high_priority_stream"), "error"), (OwnDevices(lazy_every=True), "pass")],
    ids=["a-member-disagrees", "members-agree"],
)
def test_a_policy_binding_each_rank_its_own_device_is_checked_as_the_per_rank_path_checks_it(
    policy: OwnDevices, verdict: str
) -> None:
    """Found by a tester: a shared decision a rank turned down (its device differs) was in its history twice,
    once as taken and once as recorded, so its call numbers ran one ahead of the other members': the fast path
    passed a disagreement the per-rank path reports (PolicyInconsistency), and hung where it passes."""
    config = SimConfig(
        cluster=Cluster(get_gpu_kind("h100-80gb"), 1, 8),
        release=get_release("2.15"),
        profile=find_profile("h100-80gb", "2.15"),
        programs=[Program(_OWN_DEVICE_OPS)] * 8,
        policy=policy,
    )
    engine, outcome = _run(config, classes=True)
    assert outcome.verdict == verdict
    if verdict == "error":
        assert {e["type"] for e in outcome.errors} == {"PolicyInconsistency"}
    assert _facts(engine, outcome) == _facts(*_run(config, classes=False, fast_path=False))


# ---------------------------------------------------------------------------------------------- hang report


def test_a_hang_after_a_class_planned_block_names_every_stuck_rank_at_1024_ranks() -> None:
    """After the world-wide block (class-planned), half the world creates a group with local synchronization:
    on 2.15 its members split the bound default group, which the other half never joins. Every one of the 512
    stuck members is named, each waiting for all 512 ranks that finished without joining."""
    world = 1024
    startup = bench.build_startup(world, SMALL)
    half = tuple(range(world // 2))
    ops = (
        *startup.program.ops[:-1],
        NewGroup(ranks=half, bind="half", use_local_synchronization=True),
        AllReduce(group="half"),
        Checkpoint(label="end"),
    )
    config = _startup_config(world, SMALL, ops=ops)
    engine, outcome = _run(config, classes=True)
    assert outcome.verdict == "hang"
    assert engine.classes.relabelled > world  # the block before it was class-planned
    assert sorted(h["rank"] for h in outcome.hangs) == list(half)
    for hang in outcome.hangs:
        assert hang["waiting_for"] == list(range(world // 2, world))
        assert f"rank {world - 1} finished its program without joining" in hang["explanation"]
    # One meeting, worked out once: the report grows with the world, not with world x missing.
    assert len({id(h["waiting_for"]) for h in outcome.hangs}) == 1

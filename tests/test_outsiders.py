"""The engine's outsider fast path (``engine/fast/outsiders.py``) against the ordinary per-rank path.

Why: the fast path takes the calls a rank makes outside a group without planning them, and shares policy
decisions between ranks with equal histories. It must change nothing but speed: the same event trace (hash and
count), ledgers, checkpoints, groups, handles, counters, policy explanations and per-rank histories. Small
generated Megatron startups cover the lazy default group (legacy, lazy-init), fake singletons, gloo twins,
reuse (dedupe), history-priced decisions (budget), 2.14, shared and per-rank Programs, faults and the op guard.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, EngineGuardError, Limits, RunOutcome, SimConfig
from simnccl.faults import NO_FAULTS, Fault, FaultSchedule
from simnccl.ops import Program
from simnccl.policy import BasePolicy, GroupDecision, GroupRequest, decides_alike_on_every_rank, get_policy
from simnccl.profiles import find_profile
from simnccl.release import get_release
from simnccl.workloads import GENERATORS

POLICIES = (
    None,
    "legacy",
    "lazy-init",
    "lazy-single-rank",
    "skip-single-rank",
    "nccl-lazy-p2p",
    "share-resources",
    "dedupe",
    "budget(700)",
    "dedupe+lazy-single-rank",
)


@dataclass(frozen=True)
class RankSkewedPolicy(BasePolicy):
    """A user policy that looks at the calling rank (so it may not share decisions): lazy on odd ranks' calls
    for singletons only, which every member still agrees on (a singleton has one member)."""

    name: str = "rank-skewed"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) == 1 and request.rank % 2:
            return GroupDecision("fake", decision.pg_options, decision.use_local_synchronization)
        return decision


def _engine(
    knobs: dict[str, Any],
    world: int,
    *,
    policy: Any = None,
    env: dict[str, str] | None = None,
    release: str = "2.15",
    per_rank_programs: bool = False,
    faults: FaultSchedule = NO_FAULTS,
    limits: Limits | None = None,
    fast_path: bool,
) -> Engine:
    programs = GENERATORS["megatron"](knobs, world)
    if per_rank_programs:  # equal programs and ops, but distinct objects (as capture builds them): no cohorts
        programs = tuple(Program(tuple(replace(op) for op in p.ops)) for p in programs)
    per_node = min(8, world)
    cluster = Cluster(get_gpu_kind("h100-80gb"), world // per_node, per_node)
    config = SimConfig(
        cluster=cluster,
        release=get_release(release),
        profile=find_profile(cluster.gpu.key, release),
        programs=programs,
        env=dict(env or {}),
        policy=get_policy(policy) if isinstance(policy, str) else policy,
        faults=faults,
        limits=limits or Limits(),
    )
    return Engine(config, keep_trace=True, fast_path=fast_path)


def _facts(engine: Engine, outcome: RunOutcome) -> dict[str, Any]:
    """Everything a run is observed by, in comparable form."""
    ledgers = {
        key: (ledger.used_bytes, sorted((repr(owner), held) for owner, held in ledger.by_owner.items()))
        for key, ledger in outcome.ledgers.items()
    }
    checkpoints = {
        label: {d: (s.used_bytes, s.time_s, s.rank) for d, s in snaps.items()}
        for label, snaps in outcome.checkpoints.items()
    }
    groups = {
        key: (rec.desc, rec.impl, rec.via_split, {r: (m["bytes"], m["phases"]) for r, m in rec.members.items()})
        for key, rec in outcome.groups.items()
    }
    ranks = []
    for rt in outcome.ranks:
        history = engine.history_of(rt.rank)
        ranks.append(
            (
                rt.status,
                rt.pc,
                rt.counter,
                sorted((h, g if isinstance(g, int) else g.name) for h, g in rt.handles.items()),
                [(g.name, g.ranks, g.backend.requested, g.options) for g in rt.groups],
                (history.calls, history.digest, history.created, history.eager_by_rank),
            )
        )
    return {
        "verdict": outcome.verdict,
        "trace_hash": outcome.trace_hash,
        "trace": outcome.trace,
        "events": outcome.event_count,
        "ops": outcome.ops_executed,
        "end": outcome.end_time_s,
        "errors": outcome.errors,
        "hangs": outcome.hangs,
        "ledgers": ledgers,
        "checkpoints": checkpoints,
        "groups": groups,
        "ranks": ranks,
        "explanations": engine.explanations,
    }


def _every_call_in_blocks(engine: Engine) -> bool:
    cohorts = engine.fast.cohorts
    taken = sum(c.executed for c in cohorts.by_start.values() if not c.broken)
    return cohorts.program is not None and taken == sum(cohorts.block_starts)


def _both(knobs: dict[str, Any], world: int, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    results = []
    for fast_path in (True, False):
        engine = _engine(knobs, world, fast_path=fast_path, **kwargs)
        results.append(_facts(engine, engine.run()))
        if not fast_path:
            assert not any(engine.fast.outsiders.plans.values())  # no outsider plan shared: the ordinary path only
        elif decides_alike_on_every_rank(engine.policy):
            # the fast path really ran, or had nothing to take: every group-creation call in a cohort block
            assert any(engine.fast.outsiders.plans.values()) or _every_call_in_blocks(engine)
    return results[0], results[1]


@pytest.mark.parametrize("policy", POLICIES)
def test_fast_path_changes_nothing_on_a_megatron_startup(policy) -> None:
    fast, slow = _both({"tp": 2, "pp": 2, "dp": 8}, 32, policy=policy)
    assert fast["verdict"] == "pass"
    assert fast == slow


@pytest.mark.parametrize("policy", [None, "lazy-init", "skip-single-rank", "dedupe", "budget(700)"])
def test_fast_path_changes_nothing_under_the_legacy_env_and_on_2_14(policy) -> None:
    knobs = {
        "tp": 2,
        "pp": 2,
        "dp": 4,
        "num_distributed_optimizer_instances": 2,
        "use_sharp": True,
        "sharp_enabled_group": "dp_replica",  # SHARP barriers (megatron-core 0.19.2 raises on the "dp" default)
    }
    assert (
        _both(knobs, 16, policy=policy, env={"TORCH_DIST_USE_NCCL2": "0"})[0]
        == _both(knobs, 16, policy=policy, env={"TORCH_DIST_USE_NCCL2": "0"})[1]
    )
    fast, slow = _both(knobs, 16, policy=policy, release="2.14")
    assert fast == slow


@pytest.mark.parametrize("policy", [None, "lazy-init", "dedupe", RankSkewedPolicy()])
def test_fast_path_changes_nothing_with_one_program_per_rank(policy) -> None:
    fast, slow = _both({"tp": 2, "pp": 2, "dp": 4, "gloo": False}, 16, policy=policy, per_rank_programs=True)
    assert fast == slow


def test_equal_ops_of_distinct_programs_share_decisions() -> None:
    """Per-rank programs with equal ops decide each call once per history state, not once per rank."""
    engine = _engine({"tp": 2, "pp": 2, "dp": 4}, 16, policy="lazy-init", per_rank_programs=True, fast_path=True)
    assert engine.run().verdict == "pass"
    assert max(len(node.steps) for node in engine.histories.nodes.values()) == 1


@pytest.mark.parametrize("policy", [None, "lazy-init", "skip-single-rank"])
def test_fast_path_changes_nothing_under_faults(policy) -> None:
    faults = FaultSchedule(None, (), (Fault("crash", 5, at_op=40), Fault("stall", 9, at_op=3)))
    fast, slow = _both({"tp": 2, "pp": 2, "dp": 4}, 16, policy=policy, faults=faults)
    assert fast["verdict"] != "pass"
    assert fast == slow


def test_fast_path_stops_at_the_same_op_guard() -> None:
    """The guard checks every 65,536 work units: 128 ranks x 1,057 ops reach that check, where 60,000 stops them.
    The run ends in the step that trips it (``Sim.halt``), on either path: before, the other ranks woken in that
    step ran on, and every rank's remaining ops (137,651) ran before the error surfaced."""
    stopped = []
    for fast_path in (True, False):
        engine = _engine(
            {"tp": 2, "pp": 2, "dp": 32}, 128, policy="lazy-init", limits=Limits(max_ops=60_000), fast_path=fast_path
        )
        with pytest.raises(EngineGuardError) as err:
            engine.run()
        stopped.append((str(err.value), engine.guard.work))
    assert stopped[0][0] == stopped[1][0] == "simulation exceeded 60000 ops; a runaway program?"
    assert all(0x10000 <= work < 2 * 0x10000 for _, work in stopped), stopped  # the first check, no second


@pytest.mark.parametrize("policy", ["legacy", "lazy-init"])
def test_outsider_calls_walked_per_rank_do_not_grow_with_the_world(policy, monkeypatch) -> None:
    """Ranks share the walk (``Track``): the calls a rank still walks one by one are a few per membership, so
    they stay flat when the world, and with it every rank's outsider calls, doubles (world² work otherwise);
    the outcome still equals the ordinary path's."""
    from simnccl.engine.fast import outsiders

    walked = [0]
    real_walk = outsiders.Outsiders._walk

    def counting_walk(self, rt, world, stop, *table):  # type: ignore[no-untyped-def]
        before = rt.pc
        took = real_walk(self, rt, world, stop, *table)
        walked[0] += rt.pc - before
        return took

    monkeypatch.setattr(outsiders.Outsiders, "_walk", counting_walk)
    per_rank = {}
    for dp in (16, 32):
        walked[0] = 0
        engine = _engine({"tp": 2, "pp": 2, "dp": dp}, 4 * dp, policy=policy, fast_path=True)
        outcome = engine.run()
        assert outcome.verdict == "pass" and engine.fast.outsiders._tracks
        per_rank[dp] = (walked[0] / (4 * dp), outcome.ops_executed / (4 * dp))
        if dp == 16:
            slow = _engine({"tp": 2, "pp": 2, "dp": dp}, 4 * dp, policy=policy, fast_path=False)
            assert _facts(engine, outcome) == _facts(slow, slow.run())
    (walked_small, ops_small), (walked_large, ops_large) = per_rank[16], per_rank[32]
    assert ops_large > 1.8 * ops_small  # every rank makes about twice the calls ...
    assert walked_large < 1.2 * walked_small  # ... and walks no more of them


@pytest.mark.parametrize("replay_max", [None, 10**9])
def test_a_long_stretch_enters_the_history_tail_as_one_span(replay_max, monkeypatch) -> None:
    """A rank's stretch of outsider calls enters its history tail as one ``Span`` (not a copy of thousands of
    Steps), and its real history is the ordinary path's either way it is built: from the state's snapshot
    (the default for a long tail) or by replaying the tail, spans expanded (``replay_max`` forces replaying)."""
    from simnccl.engine.fast import histories

    if replay_max is not None:
        monkeypatch.setattr(histories, "_REPLAY_MAX", replay_max)
    knobs = {"tp": 2, "pp": 2, "dp": 16}
    engine = _engine(knobs, 64, policy="lazy-init", fast_path=True)
    outcome = engine.run()
    spans = [e for rt in outcome.ranks for e in rt.history_tail if isinstance(e, histories.Span)]
    assert spans and max(len(span) for span in spans) > 100
    assert sum(histories.tail_length(rt.history_tail) for rt in outcome.ranks) > sum(
        len(rt.history_tail) for rt in outcome.ranks
    )
    fast = _facts(engine, outcome)
    slow_engine = _engine(knobs, 64, policy="lazy-init", fast_path=False)
    assert fast == _facts(slow_engine, slow_engine.run())


def test_a_call_naming_a_device_is_planned_on_each_rank() -> None:
    """Outsiders share plans across bound devices (``outsider_key`` holds only whether the default group is
    bound), except for a call naming a ``device_id``: torch compares it with each rank's own bound device, so
    the ranks bound elsewhere raise even as outsiders. Same outcome as the ordinary path, which plans every rank."""
    from simnccl.ops import InitProcessGroup, NewGroup, SetDevice

    calls = [NewGroup(ranks=(r, r + 1), bind=f"pair{r}") for r in range(2, 14, 2)]  # outsider calls to share
    program = Program(
        (
            SetDevice(),
            InitProcessGroup(backend="nccl"),  # 2.15 binds the default group to the rank's device (LOCAL_RANK)
            *calls,
            NewGroup(ranks=(2, 3), bind="named", device_id=1),  # rank 1 (bound to 1) plans it first to share
            *calls,
        )
    )
    cluster = Cluster(get_gpu_kind("h100-80gb"), 2, 8)
    facts = []
    for fast_path in (True, False):
        config = SimConfig(
            cluster=cluster,
            release=get_release("2.15"),
            profile=find_profile(cluster.gpu.key, "2.15"),
            programs=(program,) * 16,
            policy=get_policy("lazy-init"),  # every call local and lazy: no block takes them, outsiders do
        )
        engine = Engine(config, keep_trace=True, fast_path=fast_path)
        facts.append(_facts(engine, engine.run()))
        if fast_path:
            shared = engine.fast.outsiders.plans
    fast, slow = facts
    assert fast == slow
    assert len(shared) == 1 and len(next(iter(shared.values()))) >= len(calls)  # one key for all 8 devices
    failed = sorted(error["rank"] for error in fast["errors"])
    assert failed == [r for r in range(16) if r % 8 != 1]  # bound to device 1: ranks 1 and 9 only

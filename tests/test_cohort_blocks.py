"""Cohort blocks (``engine/fast/cohorts.py``) against ranks that each run their own copy of the program.

Why: a block takes world-wide group-creation calls once for every rank. Besides the splits of the default group
it takes what lies between them: gloo twins and nccl-lazy primaries (a members-only bootstrap, which makes its
members late for the next split), one-rank and fake groups, lazy creations (local to a member), and calls a
policy answers by reuse, also before the block's first split. Ranks that run distinct Program objects never
form a block, so for a startup that passes they are the reference: the same events (as a multiset, times to
the nanosecond: a block sums its clock in another order than simpy's ``now``): allocations, bootstraps,
checkpoints, ends; the same groups made by the same ranks, ledgers, checkpoints, handles, counters, finishing
times, errors and policy explanations. Only the record of a path may differ (``_layout``). (Where a rank fails
inside a block, blocks and ranks on their own already differed before blocks took these calls; those runs are
checked against the previous engine by ``benchmarks/engine_gate.py``'s out-of-memory cases.)
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, SimConfig
from simnccl.ops import NewGroup, Program
from simnccl.policy import get_policy
from simnccl.profiles import find_profile
from simnccl.release import get_release
from simnccl.workloads import GENERATORS

_FLOAT = re.compile(r"\d+\.\d+(?:e[+-]?\d+)?")


def _nanoseconds(text: str) -> str:
    return _FLOAT.sub(lambda m: f"{float(m.group()):.9f}", text)


def _engine(knobs: dict[str, Any], world: int, policy: str | None, *, shared: bool) -> Engine:
    programs = GENERATORS["megatron"](knobs, world)
    if not shared:  # equal programs and ops, but distinct objects: no cohorts, every rank on its own
        programs = tuple(Program(tuple(replace(op) for op in p.ops)) for p in programs)
    cluster = Cluster(get_gpu_kind("h100-80gb"), world // 8, 8)
    config = SimConfig(
        cluster=cluster,
        release=get_release("2.15"),
        profile=find_profile(cluster.gpu.key, "2.15"),
        programs=programs,
        policy=get_policy(policy) if policy else None,
    )
    return Engine(config, keep_trace=True)


def _layout(event: tuple[Any, ...]) -> bool:
    """A record whose form depends on the path (not on what happened): a block's lines and meetings; a
    member's ``new_group`` (or ``split_group``) line, which a block writes when the split ends and a rank on its
    own when it arrives; the meeting of a split, which a block takes without one (its allocations and ids stay)."""
    if event[1] in ("cohort", "meet"):  # (time, "cohort", call, ...), (time, "meet", kind, key, size)
        return event[1] == "cohort" or event[2] in ("cohort", "split")
    # (time, rank, "new_group" or "split_group", name, ranks digest)
    return len(event) > 2 and event[2] in ("new_group", "split_group")


def _facts(engine: Engine) -> dict[str, Any]:
    outcome = engine.run()
    layout = sum(e[1] == "cohort" for e in outcome.trace)
    events = Counter(_nanoseconds(repr(e)) for e in outcome.trace if not _layout(e))
    created = Counter((e[1], e[3], e[4]) for e in outcome.trace if _layout(e) and e[1] not in ("cohort", "meet"))
    return {
        "verdict": outcome.verdict,
        "end": round(outcome.end_time_s, 9),
        "errors": outcome.errors,
        "hangs": outcome.hangs,
        "ops": outcome.ops_executed,
        "events": events,
        "created": created,
        "ledgers": {
            key: (ledger.used_bytes, sorted((repr(owner), held) for owner, held in ledger.by_owner.items()))
            for key, ledger in outcome.ledgers.items()
        },
        "checkpoints": {
            label: {d: (s.used_bytes, round(s.time_s, 9), s.rank) for d, s in snaps.items()}
            for label, snaps in outcome.checkpoints.items()
        },
        "ranks": [
            (
                rt.status,
                rt.pc,
                rt.counter,
                round(rt.finished_at or 0.0, 9),
                sorted((h, g if isinstance(g, int) else g.name) for h, g in rt.handles.items()),
                [(g.name, g.ranks, g.backend.requested, g.options, sorted(g.comms)) for g in rt.groups],
            )
            for rt in outcome.ranks
        ],
        "explanations": list(engine.explanations),
        "block_lines": layout,
    }


@pytest.mark.parametrize(
    "policy", [None, "dedupe", "skip-single-rank", "lazy-single-rank", "nccl-lazy-p2p", "budget(700)"]
)
def test_a_block_does_what_ranks_on_their_own_do(policy) -> None:
    knobs = {"tp": 2, "pp": 2, "dp": 4}  # gloo twins of dp on, as Megatron does by default
    blocked = _engine(knobs, 16, policy, shared=True)
    mine = _facts(blocked)
    theirs = _facts(_engine(knobs, 16, policy, shared=False))
    assert mine["verdict"] == "pass"
    assert theirs["block_lines"] == 0 and mine["block_lines"] > 0
    mine.pop("block_lines"), theirs.pop("block_lines")
    assert mine == theirs


def test_gloo_twins_fake_singletons_and_reuses_no_longer_cut_a_startup_into_blocks() -> None:
    """Megatron's gloo twins (a bootstrap of dp's members between two splits) used to end a block each; a
    policy's fake singletons and reuses ended one too, and could not start one. Now a 16-rank startup under
    torch's default, dedupe and skip-single-rank is one block from its first group on."""
    knobs = {"tp": 2, "pp": 2, "dp": 4}
    program = GENERATORS["megatron"](knobs, 16)[0]
    gloo = [op for op in program.ops if isinstance(op, NewGroup) and op.backend == "gloo" and len(op.ranks) > 1]
    assert gloo, "the startup has gloo twins"
    for policy in (None, "dedupe", "skip-single-rank"):
        engine = _engine(knobs, 16, policy, shared=True)
        assert engine.run().verdict == "pass"
        cohorts = engine.fast.cohorts
        live = [c for c in cohorts.by_start.values() if not c.broken]
        assert len(live) == 1, (policy, [(c.start, c.executed) for c in live])
        assert live[0].executed == sum(cohorts.block_starts[live[0].start :]), policy  # every call from there


def test_a_gloo_member_leaves_the_block_when_its_bootstrap_ends() -> None:
    """A block that ends with a gloo bootstrap releases its members when the bootstrap ends, the others when
    the last split ended: each rank's next event is where it would be on its own."""
    knobs = {"tp": 2, "pp": 2, "dp": 4}
    blocked = _engine(knobs, 16, None, shared=True)
    outcome = blocked.run()
    alone = _engine(knobs, 16, None, shared=False).run()
    assert [round(rt.finished_at or 0.0, 9) for rt in outcome.ranks] == [
        round(rt.finished_at or 0.0, 9) for rt in alone.ranks
    ]
    bootstraps = [e for e in outcome.trace if e[1] == "meet" and e[2] == "bootstrap" and not e[3][2]]
    assert bootstraps and all(e[4] > 1 for e in bootstraps)  # gloo bootstraps of the twins, met in the block


def test_every_call_is_explained_once_in_call_order_whoever_decides_first() -> None:
    """``--explain`` lists every decision. It used to list a call only when the group's first member was the
    first rank to decide it: a call a non-member decided first (on the ordinary path, or by a shared
    decision) was missing, so the list depended on the engine's path."""
    knobs = {"tp": 2, "pp": 2, "dp": 4}
    blocked = _engine(knobs, 16, "dedupe", shared=True)
    blocked.run()
    alone = _engine(knobs, 16, "dedupe", shared=False)
    alone.run()
    assert blocked.explanations == alone.explanations
    calls = [e["call"] for e in blocked.explanations]
    assert calls[0] == "init_process_group"
    numbers = [int(c.split("#")[1]) for c in calls[1:]]
    assert numbers == sorted(numbers)
    explained = {(int(e["call"].split("#")[1]), tuple(e["ranks"])) for e in blocked.explanations[1:]}
    assert len(explained) == len(numbers)  # once each
    program = GENERATORS["megatron"](knobs, 16)[0]
    assert len(numbers) == sum(isinstance(op, NewGroup) for op in program.ops)  # every call, reuses included


def _split_engine(split_ranks: tuple[tuple[int, ...], ...], *, shared: bool) -> Engine:
    """Four ranks on one node: init (nccl2, eager), ``split_group(split_ranks)``, an all_reduce on the child."""
    from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, SetDevice, SplitGroup

    ops = (
        SetDevice(),
        InitProcessGroup(backend="nccl"),
        SplitGroup(split_ranks=split_ranks, bind="s"),
        AllReduce(group="s", size_bytes=1024),
        Checkpoint(label="end"),
    )
    shared_program = Program(ops)
    programs = [shared_program if shared else Program(tuple(replace(op) for op in ops)) for _ in range(4)]
    cluster = Cluster(get_gpu_kind("h100-80gb"), 1, 4)
    profile = find_profile(cluster.gpu.key, "2.15")
    config = SimConfig(cluster=cluster, release=get_release("2.15"), profile=profile, programs=programs)
    return Engine(config, keep_trace=True)


def test_a_split_into_several_children_gives_each_child_its_own_communicator() -> None:
    """A block gave every child of ``split_group([[0, 1], [2, 3]])`` one identity, so the two children's
    all_reduces met as one collective (one meeting of [0, 1] where ranks on their own have two)."""
    mine = _facts(_split_engine(((0, 1), (2, 3)), shared=True))
    theirs = _facts(_split_engine(((0, 1), (2, 3)), shared=False))
    assert mine["block_lines"] > 0 and theirs["block_lines"] == 0
    mine.pop("block_lines"), theirs.pop("block_lines")
    assert mine == theirs
    collectives = [e for e in mine["events"].elements() if "'meet', 'collective'" in e]
    assert len(collectives) == 2, collectives


def test_overlapping_splits_leave_a_child_without_its_member_in_a_block_too() -> None:
    """Each rank takes the first split listing it (torch l.6979): in ``[[0, 1], [1, 2, 3]]`` rank 1 joins
    [0, 1], so ranks 2 and 3 wait for it in [1, 2, 3] for good (real gloo: a store timeout; found by a user's
    capture). Ranks on their own hung; a block gave every member its child and passed."""
    for shared in (True, False):
        outcome = _split_engine(((0, 1), (1, 2, 3)), shared=shared).run()
        assert outcome.verdict == "hang", shared
        assert sorted(h["rank"] for h in outcome.hangs) == [2, 3]
        assert all("ranks [2, 3] asked for group [1, 2, 3]" in h["explanation"] for h in outcome.hangs)

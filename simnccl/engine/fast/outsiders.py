"""Outsider calls: a rank's run of ``new_group`` calls it is not a member of, taken in place (DESIGN rule 8).

Why: a large startup is mostly such calls (Megatron TP8·PP4·DP16: ~2,900 per rank, ~20 of them memberships),
and where the default group is lazy or unbound (legacy, lazy-init) or the group's backend is not the default
group's (gloo twins, a policy's fake singletons) no cohort can take them. Their whole effect is the group
counter, a NON_GROUP_MEMBER handle and, under a policy, one history record, so they are applied here without
planning: the outsider plan once per ``outsider_key`` and call, the policy's decision once per shared history
state and call (``SharedHistories``), the record appended to the rank's ``history_tail``. Same trace, same
outcome (tests/test_outsiders.py).

Walking those calls one by one is still calls x world work, which grows as world² (the calls grow with the
world). So the walk is shared too: a ``Track`` holds, for ranks with the same outsider plans (and, under a
policy, the same history state at its start), what the run of calls from its first call does — the counter's
advance as a prefix sum, the history records, the handles bound. A rank takes the stretch up to its next
membership (``_next_membership``: a bisection in its list of memberships, built once per Program) in one step;
the track grows, on demand, exactly as far as some rank would have walked. Per rank the work is then a
constant per stretch, i.e. per membership, plus a copy of its history records (measured: the legacy column of
Megatron TP8·PP8·DP64, 4,096 ranks, from ~97 to ~5 CPU s). The walk remains for short runs (the one call
between two cohorts), for what a track does not cover (injected faults, a policy whose agreement is checked
per rank) and for the call at which the guard checks (every 65,536 work units).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

from simnccl.c10d import NON_GROUP_MEMBER, Group, TorchError, outsider_key, shares_outsider_plan
from simnccl.engine import init_barrier
from simnccl.engine.fast.calls import OutsiderEntry
from simnccl.engine.fast.cohorts import Cohorts
from simnccl.engine.fast.histories import HistoryNode, SharedHistories, Span, Step
from simnccl.engine.planning import Planner
from simnccl.engine.policy_gate import PolicyGate
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.faults import Fault
from simnccl.ops import NewGroup, Program

GUARD_EVERY = 0x10000  # the guard checks when its work count reaches a multiple of this (``Guard.tick``)
_WALK_FIRST = 8  # calls walked before a stretch is tried: short runs (between two cohorts) walk cheaper
_STRETCH_AT_ONCE = 64  # a rank more than this many calls from its next membership tries a stretch first
_SPAN_FROM = 16  # a stretch of more calls enters the rank's history tail as one Span, not a copy of its Steps
_TRACKS_MAX = 16  # tracks kept per program and outsider plans (the most recently used): a cache, not a limit
# Why a stretch stopped: at a call the walk stops at too (a membership ...), or short of the guard's check.
_AT_MEMBERSHIP, _AT_GUARD_CHECK = "membership", "guard"


@dataclass(slots=True, eq=False)
class Track:
    """The calls from ``lo`` on, as every rank with these outsider plans (and, under a policy, in history state
    ``nodes[0]`` at ``lo``) takes them: ``counters[i]``, the counter's advance over the first i calls;
    ``steps[i]``/``nodes[i + 1]``, the history record of call ``lo + i`` and the state after it; ``binds``, each
    handle name with the calls that bind it (ascending)."""

    lo: int
    nodes: list[HistoryNode | None]
    hi: int = -1  # the first call the track does not (yet) cover
    counters: list[int] = field(default_factory=lambda: [0])
    steps: list[Step | None] = field(default_factory=list)
    binds: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hi = self.lo


class Outsiders:
    def __init__(
        self,
        sim: Sim,
        histories: SharedHistories,
        planner: Planner,
        cohorts: Cohorts,
        op_faults: dict[tuple[int, int], Fault],
        policy_gate: PolicyGate,
    ) -> None:
        self.guard = sim.guard
        self.ranks = sim.ranks
        self.histories = histories
        self.calls = histories.calls
        self.planner = planner
        self.cohorts = cohorts
        self.op_faults = op_faults
        self.policy_active = policy_gate.active
        self.shares_decisions = policy_gate.shares
        self.gate = policy_gate
        # Outsider plans: per outsider_key, id(op torch receives) -> counter advance (None: not a plain call).
        self.plans: dict[tuple[object, ...], dict[int, int | None]] = {}
        self._keep: list[NewGroup] = []  # the ops those ids name, kept alive for the run
        # Per (program's call table, outsider plans): the tracks walked so far (see ``Track``).
        self._tracks: dict[tuple[int, int], list[Track]] = {}
        # Per call table: (the table, rank -> the calls it is a member of, ascending); built on first use.
        self._members: dict[int, tuple[list[OutsiderEntry | None], dict[int, list[int]]]] = {}
        self._sharers: Counter[int] | None = None  # ranks per Program object
        self._program: object = None  # the Program whose call table ``_table`` is (most ranks run one)
        self._table: list[OutsiderEntry | None] = []

    def take(self, rt: RankRuntime) -> bool:
        """Take, in place, the run of ``new_group`` calls at ``rt.pc`` this rank makes as an outsider that
        needs nothing: not a member, no NOCOLOR split, no error, no injected fault, no cohort waiting for it.

        The ordinary path records no trace event and never waits for such a call, so the trace and the order
        in which ranks run are unchanged. Each call taken counts for the guard as it would there.
        Returns whether any call was taken.
        """
        if init_barrier.KNOB in rt.ctx.env and init_barrier.wanted(rt.ctx.env):
            return False  # every new_group call ends in a barrier this rank must reach: none needs nothing
        program = rt.program
        start = rt.pc
        cohorts = self.cohorts
        if program is cohorts.program:
            cohort = cohorts.by_start.get(start)
            if cohort is None or not cohort.broken:
                # The first rank here decides whether a block starts; a live cohort is joined. (Every call an
                # outsider may take in the cohorts' program starts a block: checked first, as most calls there
                # are a live cohort's, and every way below would take nothing here too.)
                return False
        world = rt.world
        policy = self.policy_active
        if world is None or rt.pending or (policy and not self.shares_decisions):
            return False
        if self.op_faults or (policy and not self.gate.verified):
            return self._walk(rt, world, None)
        table = self._table if program is self._program else self._table_of(program)
        entry = table[start]
        if entry is None or rt.rank in entry[1]:
            return False
        if self._next_membership(rt, table, start) - start > _STRETCH_AT_ONCE:
            self._stretches(rt, world, table)  # a long run: walking its first calls would be wasted
            if rt.pc > start:
                return True
        if not self._walk(rt, world, start + _WALK_FIRST, table) or rt.pc < start + _WALK_FIRST:
            return rt.pc > start  # a short run (between two cohorts, say): walked, cheaper than a stretch
        self._stretches(rt, world, table)
        return True

    def _stretches(self, rt: RankRuntime, world: Group, table: list[OutsiderEntry | None]) -> None:
        """Stretches from ``rt.pc`` on, the guard's calls between them walked (as the walk takes them)."""
        while True:
            stopped = self._stretch(rt, world, table)
            if stopped is not _AT_GUARD_CHECK or not self._walk(rt, world, rt.pc + 1):
                break  # stopped where the walk stops too; else the guard's call, taken as the walk takes it

    def _table_of(self, program: Program) -> list[OutsiderEntry | None]:
        """The program's call table, remembered for the next call (saves a lookup per call taken)."""
        self._program, self._table = program, self.calls.table(program)
        return self._table

    # ---------------------------------------------------------------- a rank's stretch along a track

    def _stretch(self, rt: RankRuntime, world: Group, table: list[OutsiderEntry | None]) -> str:
        """Take the calls from ``rt.pc`` up to this rank's next membership in one step, as far as a track goes
        (grown first, as this rank's walk would) and short of the guard's next check; say why it stopped."""
        pc = rt.pc
        if table[pc] is None:
            return _AT_MEMBERSHIP
        cohorts = self.cohorts.by_start if rt.program is self.cohorts.program else None
        if cohorts is not None:
            cohort = cohorts.get(pc)
            if cohort is None or not cohort.broken:
                return _AT_MEMBERSHIP  # the first rank here decides whether a block starts; a live cohort is joined
        end = self._next_membership(rt, table, pc)
        if end == pc:
            return _AT_MEMBERSHIP
        node = self.histories.node(rt) if self.policy_active else None
        verdicts = self._verdicts(rt, world)
        guard = self.guard
        room = GUARD_EVERY - 1 - (guard.work & (GUARD_EVERY - 1))  # calls before the one the guard checks
        stopped = _AT_MEMBERSHIP
        if pc + room < end:
            end, stopped = pc + room, _AT_GUARD_CHECK
        if end == pc:
            return stopped
        track = self._track(rt, world, table, verdicts, pc, node, end)
        if track is None:
            return _AT_MEMBERSHIP
        if track.hi < end:
            end, stopped = track.hi, _AT_MEMBERSHIP
        first, last = pc - track.lo, end - track.lo
        taken = end - pc
        guard.work += taken
        guard.ops += taken
        rt.counter += track.counters[last] - track.counters[first]
        if node is not None:
            after = track.nodes[last]
            assert after is not None
            if taken > _SPAN_FROM:
                rt.history_tail.append(Span(track.steps, first, last, after))
            else:
                rt.history_tail += track.steps[first:last]
            rt.hnode = after
        handles = rt.handles
        if not track.binds.keys() <= handles.keys():
            # bound as the walk binds them: each name at its first call in the stretch, in call order
            bound = []
            for name, pcs in track.binds.items():
                if name in handles:
                    continue
                at = bisect_left(pcs, pc)
                if at < len(pcs) and pcs[at] < end:
                    bound.append((pcs[at], name))
            for _, name in sorted(bound):
                handles[name] = NON_GROUP_MEMBER
        rt.pc = end
        return stopped

    def _track(
        self,
        rt: RankRuntime,
        world: Group,
        table: list[OutsiderEntry | None],
        verdicts: dict[int, int | None],
        pc: int,
        node: HistoryNode | None,
        end: int,
    ) -> Track | None:
        """The track a rank at ``pc`` in history state ``node`` with these outsider plans is on, grown towards
        ``end`` (a new one starting here if none covers ``pc``); None when no call here can be shared yet."""
        tracks = self._tracks.setdefault((id(table), id(verdicts)), [])
        for at, track in enumerate(tracks):
            if track.lo <= pc <= track.hi and track.nodes[pc - track.lo] is node:
                if at:
                    tracks.insert(0, tracks.pop(at))  # the most recently used first
                break
        else:
            track = Track(pc, [node])
            self._grow(track, rt, world, table, verdicts, end)
            if track.hi == pc:
                return None
            tracks.insert(0, track)
            del tracks[_TRACKS_MAX:]
            return track
        if track.hi < end:
            self._grow(track, rt, world, table, verdicts, end)
        return track

    def _grow(
        self,
        track: Track,
        rt: RankRuntime,
        world: Group,
        table: list[OutsiderEntry | None],
        verdicts: dict[int, int | None],
        end: int,
    ) -> None:
        """Extend ``track`` towards ``end`` exactly as ``rt`` (an outsider of every call before ``end``) would
        walk it: stopping where a call is not a plain outsider call, a cohort is not broken, or nobody has
        decided the call on this history yet. What is settled stays settled (a cohort stays broken, a decision
        and an outsider plan, once made, are kept), so a track is never shortened."""
        cohorts = self.cohorts.by_start if rt.program is self.cohorts.program else None
        policy = self.policy_active
        keep = self._keep
        nodes, counters, steps, binds = track.nodes, track.counters, track.steps, track.binds
        node = nodes[-1]
        counter = counters[-1]
        pc = track.hi
        while pc < end:
            entry = table[pc]
            if entry is None:
                break
            op_id, _index, bind, op = entry
            if cohorts is not None:
                cohort = cohorts.get(pc)
                if cohort is None or not cohort.broken:
                    break
            step = None
            effective_id = op_id
            if policy:
                assert node is not None
                step = node.steps.get(op_id)
                if step is None:
                    break
                effective_id = step.effective_id
            advance = 0
            if effective_id:
                advance = verdicts.get(effective_id, -1)
                if advance == -1:
                    effective = op if step is None else step.effective
                    assert effective is not None
                    advance = verdicts[effective_id] = self._advance(rt, world, effective)
                    keep.append(effective)
                if advance is None:
                    break
            if step is not None:
                node = step.after
            counter += advance
            counters.append(counter)
            steps.append(step)
            nodes.append(node)
            if bind:
                binds.setdefault(bind, []).append(pc)
            pc += 1
        track.hi = pc

    def _next_membership(self, rt: RankRuntime, table: list[OutsiderEntry | None], pc: int) -> int:
        """The first call at or after ``pc`` this rank is a member of (the table's length if none)."""
        cached = self._members.get(id(table))
        if cached is None or cached[0] is not table:
            cached = (table, {})
            self._members[id(table)] = cached
            if self._shared(rt):  # every rank's memberships in one pass: O(memberships), once per Program
                by_rank = cached[1]
                for at, entry in enumerate(table):
                    if entry is not None:
                        for member in entry[1]:
                            by_rank.setdefault(member, []).append(at)
        by_rank = cached[1]
        pcs = by_rank.get(rt.rank)
        if pcs is None:
            if self._shared(rt):
                pcs = by_rank[rt.rank] = []
            else:  # a program of its own: only this rank's memberships
                rank = rt.rank
                pcs = by_rank[rank] = [at for at, entry in enumerate(table) if entry is not None and rank in entry[1]]
        at = bisect_left(pcs, pc)
        return pcs[at] if at < len(pcs) else len(table)

    def _shared(self, rt: RankRuntime) -> bool:
        """Whether other ranks run this rank's Program object too."""
        if self._sharers is None:
            self._sharers = Counter(id(r.program) for r in self.ranks)
        return self._sharers[id(rt.program)] > 1

    # ---------------------------------------------------------------- one call at a time

    def _walk(
        self, rt: RankRuntime, world: Group, stop: int | None, table: list[OutsiderEntry | None] | None = None
    ) -> bool:
        """Take the calls at ``rt.pc`` one by one (up to ``stop``, if given); ``table``: the program's, if known."""
        policy = self.policy_active
        program = rt.program
        if table is None:
            table = self._table if program is self._program else self._table_of(program)
        rank = rt.rank
        pc = start = rt.pc
        cohorts = self.cohorts.by_start if program is self.cohorts.program else None
        op_faults = self.op_faults
        node = None
        if policy:  # the rank's shared state (``SharedHistories.node``), its cached answer read here first
            node = rt.hnode
            cached_class = rt.policy_class
            if (
                node is None
                or cached_class is None
                or cached_class[0] is not rt.ctx
                or cached_class[1] is not rt.world
                or node.cls is not cached_class[2]
            ):
                node = None
        verdicts: dict[int, int | None] | None = None
        keep = self._keep
        setdefault = rt.handles.setdefault
        append = rt.history_tail.append
        guard = self.guard
        gate = self.gate
        verified = gate.verified
        work = guard.work
        taken = counter = 0
        end = len(table) if stop is None else min(stop, len(table))
        while pc < end:
            entry = table[pc]
            if entry is None or (op_faults and (rank, pc) in op_faults):
                break
            op_id, index, bind, op = entry
            if rank in index:
                break
            if cohorts is not None:
                cohort = cohorts.get(pc)
                if cohort is None or not cohort.broken:
                    break  # the first rank here decides whether a block starts; a live cohort is joined
            step = None
            effective_id = op_id
            if policy:
                if node is None:
                    node = self.histories.node(rt)
                step = node.steps.get(op_id)
                if step is None:
                    break  # nobody decided this call on this history yet: the ordinary path decides it
                if not verified and not gate.agrees(rt, op, step):
                    break  # this rank plans otherwise: the ordinary path reports the inconsistency
                effective_id = step.effective_id
            advance = 0
            if effective_id:  # 0: the policy reuses an identical group, no torch call at all
                if verdicts is None:
                    verdicts = self._verdicts(rt, world)
                advance = verdicts.get(effective_id, -1)
                if advance == -1:
                    effective = op if step is None else step.effective
                    assert effective is not None
                    advance = verdicts[effective_id] = self._advance(rt, world, effective)
                    keep.append(effective)  # ids stay valid while the verdict is kept
                if advance is None:
                    break
            taken += 1
            work += 1
            if work & 0xFFFF == 0:  # the guard's check, at the same count as on the ordinary path
                guard.work, guard.ops, rt.pc, rt.counter = work, guard.ops + taken, pc, rt.counter + counter
                taken = counter = 0
                guard.check()
            if step is not None:
                append(step)
                node = step.after
            counter += advance
            if bind:
                setdefault(bind, NON_GROUP_MEMBER)
            pc += 1
        guard.work = work
        guard.ops += taken
        rt.counter += counter
        rt.pc = pc
        if node is not None and pc > start:
            rt.hnode = node
        return pc > start

    def _verdicts(self, rt: RankRuntime, world: Group) -> dict[int, int | None]:
        """The outsider plans shared by every rank with this rank's ``outsider_key``; remembered per rank for
        as long as its context, default group and that group's cuda communicator (and its state) stay the same."""
        parent = world.comms.get("cuda")  # ``Group.comm_for``, without the call
        state = None if parent is None else parent.state
        cached = rt.outsider_verdicts
        if cached is not None:
            if cached[0] is rt.ctx and cached[1] is world and cached[2] is parent and cached[3] is state:
                return cached[4]  # the usual answer: the same objects as last time
            ctx, was_world, was_parent, was_state, verdicts = cached
            # as tuples compare: each by identity first, by value else
            if (
                (ctx is rt.ctx or ctx == rt.ctx)
                and (was_world is world or was_world == world)
                and (was_parent is parent or was_parent == parent)
                and (was_state is state or was_state == state)
            ):
                return verdicts
        verdicts = self.plans.setdefault(outsider_key(rt.ctx, world), {})
        rt.outsider_verdicts = (rt.ctx, world, parent, state, verdicts)
        return verdicts

    def _advance(self, rt: RankRuntime, world: Group, op: NewGroup) -> int | None:
        """How far an outsider's plain call advances the counter; None when it is not plain (it raises, or
        joins a NOCOLOR split, or names a device, ``shares_outsider_plan``): the ordinary path then runs it on
        every rank."""
        if not shares_outsider_plan(op.device_id):
            return None
        try:
            plan = self.planner.plan_new_group(rt, op, rt.counter)
        except (TorchError, ValueError):
            return None
        if plan.member or plan.nocolor_split_on is not None:
            return None
        return plan.counter_advance

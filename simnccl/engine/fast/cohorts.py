"""Cohorts: a block of world-wide group-creation calls taken once for every rank (DESIGN rule 8).

Precondition (checked): every rank runs this same Program object and arrives at the same pc with the same
group counter and nothing pending. Then each ``new_group``/``split_group`` of the block is, for every rank, one
of: a split of the bound default group (members split, everyone else NOCOLOR; it starts when the last rank is
there and takes ``split_s``); a bootstrap of one gloo or NCCL communicator among its members (a gloo twin, an
nccl-lazy primary: the members meet, each from its own time, and are late for the next split by
``comm_init_s``); a communicator made on its member alone (a fake backend's, a one-rank NCCL group's); a lazy
creation; or a call the policy answers by reuse. The block is applied in one pass: per-member work for members,
a constant for everyone else — the same outcome as running each rank through each call, without calls x world
work. Ranks wait for each other only at a split, so a block starts at one, or at a run of reuses and purely
local calls that ends in one (``_world_split_at``). Anything else (a bootstrap under a name in use, an error in
planning, a rank that is not eligible) ends the block, and ranks continue one by one from there; a member of
the block's last bootstrap leaves when that bootstrap ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from simnccl.backends import Comm, lifecycle
from simnccl.c10d import (
    NON_GROUP_MEMBER,
    CommPlan,
    Group,
    GroupPlan,
    Members,
    TorchError,
    plan_split_group,
    split_source,
    world_ranks,
)
from simnccl.engine import init_barrier
from simnccl.engine.comms import Comms
from simnccl.engine.fast.classes import RankClasses
from simnccl.engine.fast.histories import SharedHistories
from simnccl.engine.fast.stamps import SplitStamps
from simnccl.engine.groups import Groups
from simnccl.engine.memory import Memory
from simnccl.engine.planning import Planner
from simnccl.engine.policy_gate import PolicyGate, unchanged_decision
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import ProcessAbort, RankRuntime, Waiting, ranks_digest
from simnccl.meetings import Arrival, Meeting
from simnccl.memory import SimulatedOOM
from simnccl.ops import NO_OPTIONS, WORLD, NewGroup, Op, Program, SplitGroup
from simnccl.policy import GroupDecision, GroupRequest, History
from simnccl.release import Impl


@dataclass(slots=True, eq=False)
class Cohort:
    """All ranks taking one block of group-creation calls together (see ``Cohorts.run``)."""

    start: int
    counter: int
    meeting: Meeting
    broken: bool = False
    end: int = 0
    executed: int = 0
    splits: int = 0
    # Of ``splits``, those already counted on every rank's parent communicator (``Comm.splits``): a split_group
    # in the block names its child after that count, so the block's earlier splits are counted before it plans.
    splits_counted: int = 0
    binds: tuple[str, ...] = ()
    failures: dict[int, tuple[int, TorchError | SimulatedOOM]] = field(default_factory=dict)
    history: History | None = None
    counter_end: int = 0
    wait_pc: int = 0  # the block's first split, where its ranks wait (after reuses: see ``_world_split_at``)
    late: dict[int, tuple[float, int, Meeting, Op]] = field(default_factory=dict)


def starts_block(op: Op) -> bool:
    """Ops a cohort may take: world-wide group creation (local synchronization is members-only)."""
    if isinstance(op, NewGroup):
        return not op.use_local_synchronization
    return isinstance(op, SplitGroup) and op.parent == WORLD


def _split_children(op: SplitGroup) -> dict[int, int] | None:
    """Each rank's child of a ``split_group`` of the default group: rank -> the index of the first split listing
    it (torch l.6979: a rank takes the first), or None where a child lacks a member.

    Why: overlapping splits ([[0, 1], [1, 2, 3]]: rank 1 joins [0, 1]) leave [1, 2, 3] without rank 1, so on
    the ordinary path ranks 2 and 3 wait for it for good (``Comms._split_colors``); the block gave every member
    its child and passed. By index, not by member tuple: hashing each rank's tuple made a world-wide call
    quadratic in its members (16,384 ranks: +15 % on the engine benchmark)."""
    first: dict[int, int] = {}
    for index, split in enumerate(op.split_ranks):
        for rank in split:
            first.setdefault(rank, index)
    for index, split in enumerate(op.split_ranks):
        joined = [first[rank] == index for rank in split]
        if any(joined) and not all(joined):
            return None
    return first


def _is_split(plan: GroupPlan) -> bool:
    """Whether a rank's plan for a call is its part in a split of the default group (a member's child or a
    non-member's NOCOLOR): the world-wide step a block meets at."""
    return plan.nocolor_split_on is not None or any(c.split_from is not None for c in plan.comms)


def _harmless(comm_plan: CommPlan) -> bool:
    """A communicator made at a call without any effect that takes time or can fail: lazy (made at first use)
    or a fake backend's. Only such calls may come before a block's first split, where each rank is on its own
    time (a failure there would be raised at the wrong time)."""
    if comm_plan.split_from is not None:
        return False
    # a lazy gloo communicator writes its address to the store at creation (``Comms.publish``): not local
    return (not comm_plan.eager and comm_plan.pair.impl is not Impl.GLOO) or comm_plan.pair.impl is Impl.FAKE


def common_program(programs: Sequence[Program]) -> Program | None:
    """The one Program object every rank runs, if there is one: the precondition for cohorts."""
    first = programs[0] if programs else None
    return first if first is not None and all(p is first for p in programs) else None


class Cohorts:
    def __init__(
        self,
        sim: Sim,
        program: Program | None,
        rendezvous: Rendezvous,
        comms: Comms,
        memory: Memory,
        groups: Groups,
        planner: Planner,
        policy_gate: PolicyGate,
        histories: SharedHistories,
        classes: RankClasses,
    ) -> None:
        """``program``: the one Program every rank runs (None: no cohorts); ``classes`` plans the members."""
        self.sim = sim
        self.env = sim.env
        self.ranks = sim.ranks
        self.record = sim.trace.record
        self.guard = sim.guard
        self.rendezvous = rendezvous
        self.comms = comms
        self.memory = memory
        self.groups = groups
        self.planner = planner
        self.policy_gate = policy_gate
        self.histories = histories
        self.classes = classes
        self._probes: dict[int, GroupPlan] = {}  # arguments number -> rank 0's outsider plan in the current block
        self.program = program
        # Per op of the shared program, whether a cohort may take it (ops are immutable: decided once).
        self.block_starts = tuple(map(starts_block, program.ops)) if program else ()
        self.by_start: dict[int, Cohort] = {}
        self._world_ranks = world_ranks(sim.cluster.world_size)
        self._no_split = (0, -1)  # calls from which no block reaches a split (``_dead_end``)
        # Whether a split's members are made by stamps (``stamps``; only with rank classes on, so a run without
        # them takes the ordinary path for every member).
        self.stamps = True
        self.split_stamps = SplitStamps(sim, comms, memory, groups.watchdogs)

    def run(self, rt: RankRuntime) -> Waiting:
        """Run a block of world-wide group-creation calls for every rank at once (see the module's doc)."""
        if rt.pending:
            yield from self.rendezvous.settle(rt)
        start = rt.pc
        cohort = self.by_start.get(start)
        if cohort is None:
            world_seq = rt.world.comm_for("cuda").seq if rt.world and rt.world.comm_for("cuda") else 0
            meeting = self.rendezvous.meetings.open(("cohort", start), "split", "0", world_seq + 1, self._world_ranks)
            meeting.result = self.env.event()
            cohort = Cohort(start=start, counter=rt.counter, meeting=meeting, history=self.histories.history(rt))
            self.by_start[start] = cohort
            split_at = self._world_split_at(rt, start)
            if split_at is None:
                # Waiting for every rank is only right when the block reaches a world-wide call (a split of
                # the bound default group) before doing anything; a local or members-only creation must not
                # synchronise anyone.
                cohort.broken = True
            else:
                cohort.wait_pc = split_at
        if cohort.broken or not self._eligible(rt, cohort):
            self._break(cohort)
            yield from self._one_call(rt)
            return
        op = rt.program.ops[cohort.wait_pc]
        cohort.meeting.arrivals[rt.rank] = Arrival(rt.rank, self.env.now, ("split", None), op)
        if len(cohort.meeting.arrivals) == len(self._world_ranks):
            self._apply_block(cohort)
        rt.pc = cohort.wait_pc  # where the rank waits: the split, past reuses that need nobody
        yield from self.rendezvous.wait(rt, cohort.meeting, op)
        rt.pc = start
        if cohort.broken:
            yield from self._one_call(rt)
            return
        self._resume_from_block(rt, cohort)
        behind = cohort.late.get(rt.rank)
        if behind is not None:
            # Still in the bootstrap the block ended with, as on the ordinary path: blocked there until it ends.
            _done, rt.pc, meeting, op = behind
            yield from self.rendezvous.wait(rt, meeting, op)
        failure = cohort.failures.get(rt.rank)
        if failure is not None:
            rt.pc, err = failure
            raise err
        rt.pc = cohort.end

    def _world_split_at(self, rt: RankRuntime, start: int) -> int | None:
        """Where the block that would start at ``start`` meets every rank: the call that is, for this rank, a
        split of the default group (which every rank joins), or None when there is none to wait for.

        Calls that take no time and wait for nobody on any rank may come first: ones the policy answers by
        reuse (no torch call), and purely local creations (a fake group, a lazy communicator: no meeting, no
        memory) whose non-members do nothing. On the ordinary path every rank walks them at once and waits at
        that split all the same, so the block starts at the first of them (its ranks shown waiting at the
        split) and takes them in call order. That needs every rank's answer to be this rank's: no policy or one
        that answers alike on every rank (``verified``), and each such call checked for every member."""
        ops = rt.program.ops
        op = ops[start]
        if rt.world is None or rt.pending:
            return None
        if isinstance(op, SplitGroup):
            parent = rt.world.comm_for("cuda")
            if parent is None or not parent.ready:
                return None
            life = lifecycle(parent.impl)
            return start if life.communicates and life.split_is_collective else None  # gloo: members only
        assert isinstance(op, NewGroup)
        if split_source(self.sim.release, rt.world, rt.world.backend, NO_OPTIONS) is None:
            # The default group can't be split by any call (unbound, lazy, not ready): nothing this call could
            # decide or plan makes it a split, so skip deciding and planning it twice (the call runs next).
            return None
        if self._no_split[0] < start <= self._no_split[1]:
            return None
        gate = self.policy_gate
        alike = not gate.active or gate.verified
        history: History | None = None  # a copy the leading reuses are recorded in, made at the first one
        counter = rt.counter
        at = start
        while True:
            request = decision = None
            if gate.active:
                members = self.planner.members(op)
                if not isinstance(members, Members):
                    return None
                request = gate.group_request(rt, op, members.ranks, history=history)
                decision = gate.decide(request)
                # a reuse makes no torch call on any rank: nothing to plan
                effective = None if decision.reuse is not None else gate.effective_op(rt, op, members, decision) or op
            else:
                effective = op
            if effective is not None:
                try:
                    plan = self.planner.plan_new_group(rt, effective, counter)
                except TorchError:
                    return self._dead_end(start, at)
                if _is_split(plan):
                    return at
                if not alike or not self._local_everywhere(effective, counter, plan):
                    return self._dead_end(start, at)
                counter += plan.counter_advance
            elif not alike:
                return None
            if request is not None and decision is not None:
                if history is None:  # the next call is decided on a history that has this one
                    history = self.histories.history(rt).copy()
                history.record(request, decision)
            at += 1
            if at >= len(ops) or not self.block_starts[at] or not isinstance(ops[at], NewGroup):
                return self._dead_end(start, at - 1)
            op = ops[at]

    def _dead_end(self, start: int, at: int) -> None:
        """No block from ``start``: the calls up to ``at`` lead to no split. A block tried from any call
        between them would walk the same calls in the same state (counter and history advance alike on every
        path), so it is not tried (without this, a long run of local calls costs its length squared)."""
        self._no_split = (start, at)

    def _local_everywhere(self, op: NewGroup, counter: int, plan: GroupPlan) -> bool:
        """Whether ``op`` (``plan``: one rank's) is a purely local creation on every rank: its members create
        no communicator now that could fail or be seen (lazy, none, or a fake backend's), its non-members do
        nothing but count."""
        if plan.nocolor_split_on is not None or not all(map(_harmless, plan.comms)):
            return False
        members = self.planner.members(op)
        if not isinstance(members, Members):
            return False
        ranks = self.ranks
        if any(ranks[m].world is None or ranks[m].pending for m in members.ranks):
            return False  # a member not yet where this rank is: nothing to plan it by
        try:
            for _rank, mine in self.classes.member_plans(ranks, op, members, counter):
                if not all(map(_harmless, mine.comms)):
                    return False
            outsider = next((r for r in ranks if r.rank not in members.index), None)
            if outsider is not None:
                if outsider.world is None or outsider.pending:
                    return False
                theirs = self.planner.plan_new_group(outsider, op, counter)
                if theirs.nocolor_split_on is not None or theirs.comms:
                    return False
        except TorchError:
            return False
        return True

    def _one_call(self, rt: RankRuntime) -> Waiting:
        """The ordinary path for the op at pc, used when a cohort can't take it."""
        op = rt.program.ops[rt.pc]
        handler = self.groups.op_new_group if isinstance(op, NewGroup) else self.groups.op_split_group
        work = handler(rt, op)
        if work is not None:
            yield from work
        rt.pc += 1

    def _eligible(self, rt: RankRuntime, cohort: Cohort) -> bool:
        world = rt.world
        if world is None or rt.pending or rt.counter != cohort.counter:
            return False
        if init_barrier.KNOB in rt.ctx.env and init_barrier.wanted(rt.ctx.env):
            return False  # each call ends in torch's store-based barrier: the ordinary path has it
        if self.policy_gate.active:
            history = cohort.history
            assert history is not None
            calls, digest = self.histories.state(rt)
            same = (rt.history is history and not rt.history_tail) or (
                calls == history.calls and digest == history.digest
            )
            if not same or not self.policy_gate.verified:
                return False
        # A lazy (unbound) default group is fine: its new_groups are local lazy creations, which a block takes;
        # _block_plans stops the block at anything it cannot take (an eager fresh bootstrap).
        return True

    def _break(self, cohort: Cohort) -> None:
        if cohort.broken:
            return
        cohort.broken = True
        if not cohort.meeting.complete:
            cohort.meeting.completed_at = self.env.now
            cohort.meeting.result.succeed()

    def _apply_block(self, cohort: Cohort) -> None:
        """The leader's pass over the block: plan once per op, act per member, advance time per split."""
        program = self.program
        assert program is not None
        ops = program.ops
        ranks = self.ranks
        clock = self.env.now
        self._probes.clear()
        counter = cohort.counter
        pc = cohort.start
        executed = splits = 0
        binds: set[str] = set()
        failed = False
        # Members of a group the block bootstrapped (gloo or NCCL), until the next split waits for them: rank ->
        # (when it is done, the call, its meeting, the op). A rank still here at the block's end leaves then.
        late: dict[int, tuple[float, int, Meeting, Op]] = {}
        arrived = cohort.meeting.arrivals
        while pc < len(ops) and starts_block(ops[pc]) and not failed:
            op = ops[pc]
            decided: tuple[GroupRequest, GroupDecision] | None = None
            if self.policy_gate.active and isinstance(op, NewGroup):
                effective, decision, request = self._block_policy(cohort, op)
                if effective is None:  # reused by every caller: no torch call, no counter, no split
                    assert cohort.history is not None and request is not None
                    cohort.history.record(request, decision)
                    failed = not self._block_reuse(cohort, pc, op, decision)
                    if op.bind:
                        binds.add(op.bind)
                    executed += 1
                    pc += 1
                    continue
                op = effective
                decided = (request, decision) if request is not None else None
            if isinstance(op, SplitGroup) and splits > cohort.splits_counted:
                self._count_splits(splits - cohort.splits_counted)
                cohort.splits_counted = splits
            plans = self._block_plans(op, counter)
            if plans is None:
                if pc < cohort.wait_pc:  # every rank waited for a split the block does not reach
                    raise AssertionError(f"cohort at call {cohort.start}: call {pc} can't be taken before its split")
                # At the split itself the ranks go on one by one, as they would have from there: every rank
                # joins the split and its members wait for the last (the others settle before they next act).
                break  # nothing recorded: the ranks decide this call again, one by one
            if decided is not None:
                assert cohort.history is not None
                cohort.history.record(*decided)
            is_split = any(map(_is_split, plans.values()))
            if (pc == cohort.wait_pc) != is_split and pc <= cohort.wait_pc:
                raise AssertionError(f"cohort at call {cohort.start}: its first split is not call {cohort.wait_pc}")
            if is_split:
                # Every rank takes part in a split of the default group: it starts when the last one arrives,
                # which is later than the block's clock for a member still bootstrapping a group.
                if late:
                    clock = max(clock, max(at for at, _pc, _m, _op in late.values()))
                    late.clear()
                clock += self.sim.profile.timing.split_s
            child_of = self._child_ids(op, plans) if is_split else None
            joining: list[tuple[RankRuntime, Group, Comm, float]] = []
            if is_split and self.stamps and self.classes.enabled:
                # A split: every member is where the block's clock is (``late`` was emptied above).
                assert child_of is not None and not late
                stamps = self.split_stamps
                failures = cohort.failures
                member = self._apply_member_plan
                failed = (
                    stamps.make_members(ranks, plans.items(), op, child_of, pc, clock, member, failures, joining)
                    or failed
                )
            else:
                for rank, plan in plans.items():
                    if not plan.member:
                        continue
                    rt = ranks[rank]
                    rt.pc = pc
                    if pc < cohort.wait_pc:  # a call before the first split: each rank made it when it arrived
                        self.sim.clock = arrived[rank].time_s
                    else:
                        behind = late.get(rank)
                        self.sim.clock = clock if behind is None else behind[0]  # where this member is
                    try:
                        child = None if child_of is None else child_of(rank)
                        joined = self._apply_member_plan(rt, plan, op, child)
                    except (TorchError, SimulatedOOM, ProcessAbort) as err:
                        cohort.failures[rank] = (pc, err)  # re-raised in that rank's own process
                        failed = True
                        continue
                    if joined is not None:
                        joining.append((rt, *joined, self.sim.clock))
            if joining:
                meeting = self.comms.bootstrap_together(joining, op)
                done = meeting.completed_at if meeting.complete else math.inf  # inf: a member never came
                self.sim.clock = done
                for member, group, comm, _at in joining:
                    late[member.rank] = (done, pc, meeting, op)
                    if done == math.inf:
                        failed = True  # the block ends here: its members wait for the one that failed
                        continue
                    try:
                        self.comms.finish_together(member, group, comm, meeting, op)
                    except (TorchError, SimulatedOOM, ProcessAbort) as err:
                        cohort.failures[member.rank] = (pc, err)  # raised when its bootstrap ends
                        failed = True
            self.sim.clock = None
            self.record(clock, "cohort", pc, op.name, len(plans))
            self.guard.work += len(plans) + 1
            self.guard.check()
            if getattr(op, "bind", None):
                binds.add(op.bind)
            counter += 1
            executed += 1
            splits += int(is_split)
            pc += 1
        self.guard.ops += max(executed - 1, 0) * len(ranks)  # each rank's guard already counted the block's first op
        cohort.end = pc
        cohort.counter_end = counter
        cohort.executed = executed
        cohort.splits = splits
        cohort.binds = tuple(sorted(binds))
        cohort.late = late
        if executed == 0:
            self._break(cohort)
            return
        cohort.meeting.completed_at = clock
        self.record(clock, "meet", "cohort", cohort.meeting.key, executed)
        event = cohort.meeting.result
        self.env.timeout(clock - self.env.now).callbacks.append(lambda _ev: event.succeed())

    def _block_policy(self, cohort: Cohort, op: NewGroup) -> tuple[NewGroup | None, GroupDecision, GroupRequest | None]:
        """A rank-independent policy decides once for the whole block, on the history all ranks share.
        Recording is the caller's, once it knows the block takes the op."""
        members = self.planner.members(op)
        if not isinstance(members, Members):
            return op, unchanged_decision(op), None
        gate = self.policy_gate
        rt = self.ranks[members.ranks[0]]
        assert cohort.history is not None
        request = gate.group_request(rt, op, members.ranks, history=cohort.history)
        decision = gate.decide(request)
        gate.check_consistent(rt, request, decision)
        if decision.reuse is not None:
            return None, decision, request
        return gate.effective_op(rt, op, members, decision), decision, request

    def _block_reuse(self, cohort: Cohort, pc: int, op: NewGroup, decision: GroupDecision) -> bool:
        """Each member's handle bound to the group its reuse names; False when one has none (its error is
        raised in its own process, as the per-rank path raises it)."""
        members = self.planner.members(op)
        assert isinstance(members, Members)
        ok = True
        for rank in members.ranks:
            rt = self.ranks[rank]
            try:  # resolved without a handle too, as ``PolicyGate.effective_op`` does
                group = self.policy_gate.reused_group(rt, members.ranks, decision.backend, decision)
                if op.bind:
                    rt.handles[op.bind] = group
            except TorchError as err:
                cohort.failures[rank] = (pc, err)
                ok = False
        return ok

    def _count_splits(self, n: int) -> None:
        """Count ``n`` of the block's splits on every rank's default-group communicator, as each rank's
        ``Comms._split_meeting`` does on the ordinary path: a ``split_group`` the block plans next reads it (legacy
        names the child after it). Only before such a call, which plans every rank anyway."""
        for rt in self.ranks:
            parent = rt.world.comm_for("cuda") if rt.world is not None else None
            if parent is not None:
                parent.splits += n

    def _child_ids(self, op: NewGroup | SplitGroup, plans: dict[int, GroupPlan]) -> Callable[[int], int]:
        """A member's child communicator identity, by rank: one per child of a split call, numbered as
        ``Comms._split_colors`` numbers them (in the order of each child's lowest member). Why: a
        ``split_group`` of [[0, 1], [2, 3]] gave both children one identity, so their collectives met as one."""
        if not isinstance(op, SplitGroup):
            child = self.comms.registry.new_id()  # a new_group's one child
            return lambda _rank: child
        first = _split_children(op)
        assert first is not None  # ``_block_plans`` took the call
        used = sorted(
            {first[rank] for rank, plan in plans.items() if plan.member}, key=lambda i: min(op.split_ranks[i])
        )
        ids = {index: self.comms.registry.new_id() for index in used} or {-1: self.comms.registry.new_id()}
        return lambda rank: ids[first[rank]]

    def _block_plans(self, op: Op, counter: int) -> dict[int, GroupPlan] | None:
        """Every rank's plan that matters for this op, or None when the op can't be taken as a block.

        For ``new_group`` non-members are uniform (a NOCOLOR split, or nothing), so only members are planned;
        ``split_group`` (rare) is planned for every rank since each validates its own split.
        """
        ranks = self.ranks
        try:
            if isinstance(op, NewGroup):
                members = self.planner.members(op)
                if not self.classes.enabled or not isinstance(members, Members):
                    probe = self.planner.rules_plan(ranks[0], op, counter, members)
                    plans = {0: probe}
                    for rank in probe.ranks:
                        if rank != 0:
                            plans[rank] = self.planner.rules_plan(ranks[rank], op, counter, members)
                else:
                    plans = {} if 0 in members.index else {0: self._outsider_probe(op, counter)}
                    plans.update(self.classes.member_plans(ranks, op, members, counter))
            else:
                assert isinstance(op, SplitGroup)
                if op.parent != WORLD or self.policy_gate.active:
                    return None  # policies decide splits per call on each rank's own history
                plans = {}
                for rt in ranks:
                    assert rt.world is not None
                    parent = rt.world.comm_for("cuda")
                    if parent is None or not parent.ready:
                        return None  # not a split on this rank (legacy: raises, bootstraps fresh, or crashes)
                    plans[rt.rank] = plan_split_group(
                        self.sim.release,
                        rt.ctx,
                        counter,
                        rt.world,
                        op.split_ranks,
                        op.pg_options,
                        op.group_desc,
                        op.timeout_s,
                    )
                if _split_children(op) is None:
                    return None  # a member's split lists a rank that joined an earlier one: the ordinary path's hang
        except TorchError:
            return None
        for rank, plan in plans.items():
            comms = plan.comms
            if len(comms) == 1 and comms[0].split_from is not None:
                continue  # a split child (most members of a block): nothing fresh to bootstrap, no list made
            if any(not c.eager and c.pair.impl is Impl.GLOO for c in comms):
                return None  # a lazy gloo communicator publishes its address at creation: the ordinary path's
            fresh = [c for c in comms if c.eager and c.split_from is None]
            if not fresh or all(self.comms.creates_alone(plan, c) for c in fresh):
                continue
            if not (plan.member and self.comms.can_bootstrap_together(plan, ranks[rank].incarnation)):
                return None  # a bootstrap the block does not take (several communicators, a name in use)
        return plans

    def _outsider_probe(self, op: NewGroup, counter: int) -> GroupPlan:
        """Rank 0's plan for a call it is not a member of (whether it raises, whether it is a NOCOLOR split):
        within one block that depends only on the call's arguments, so it is planned once per arguments."""
        key = self.classes.arguments_number(op)
        probe = self._probes.get(key)
        if probe is None:
            probe = self._probes[key] = self.planner.plan_new_group(self.ranks[0], op, counter)
        return probe

    def _apply_member_plan(
        self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup, child_id: int | None
    ) -> tuple[Group, Comm] | None:
        """One member's group as planned; a communicator to bootstrap with the other members is returned (the
        block completes their meeting once all have arrived)."""
        group = self.groups.group_from_plan(rt, plan)
        if op.bind:
            rt.handles[op.bind] = group
        self.record(self.sim.now(), rt.rank, op.name, plan.name, ranks_digest(plan.ranks))
        joining = None
        for comm_plan in plan.comms:
            comm = self.comms.attach(group, plan, comm_plan)
            if comm_plan.split_from is None:
                if not comm_plan.eager:
                    continue  # lazy: created at first use
                if self.comms.creates_alone(plan, comm_plan):
                    self.comms.init_alone(rt, group, comm, op)
                else:  # _block_plans took it: a bootstrap with the other members (can_bootstrap_together)
                    self.comms.arrive_together(rt, group, comm, op)
                    joining = (group, comm)
                continue
            assert child_id is not None
            self.comms.split_child_ready(rt, group, comm, child_id, op)
        return joining

    def _resume_from_block(self, rt: RankRuntime, cohort: Cohort) -> None:
        """Bring one rank's own state to the end of the block (counter, parent sequence, handles, history); its
        position and any failure of its own are the caller's (after a bootstrap it is still in)."""
        rt.counter = cohort.counter_end
        if cohort.history is not None:
            rt.history = cohort.history  # equal content (checked on arrival): share one object again,
            rt.history_shared = True  # copied on this rank's next own record (the owner's too)
            rt.history_tail.clear()  # already in that content
            rt.hnode = None
        if cohort.splits:
            parent = rt.world.comm_for("cuda") if rt.world is not None else None
            if parent is not None:
                parent.seq += cohort.splits
                parent.splits += cohort.splits - cohort.splits_counted
        for bind in cohort.binds:
            rt.handles.setdefault(bind, NON_GROUP_MEMBER)

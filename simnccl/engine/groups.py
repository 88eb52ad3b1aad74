"""The group ops of a rank's program: ``init_process_group``, ``new_group``, ``split_group`` and
``destroy_process_group`` — what torch decides for the call (``simnccl.c10d``, after the policy gate), what the
rank's handles and groups become, and which communicators ``Comms`` creates or destroys for it.

Cost (DESIGN rule 8): a non-member ``new_group`` is O(1). Under a bound parent it is a NOCOLOR split the rank
joins without blocking (run-ahead); only members pay per-member work, so a startup's cost grows with
memberships, not with calls x world.
"""

from __future__ import annotations

from simnccl.c10d import (
    NON_GROUP_MEMBER,
    Group,
    GroupPlan,
    SplitNamesNoProcess,
    TorchError,
    plan_init,
    plan_split_group,
)
from simnccl.engine import init_barrier
from simnccl.engine.comms import Comms
from simnccl.engine.planning import Planner
from simnccl.engine.policy_gate import PolicyGate
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import NO_GROUP_TO_DESTROY, RankRuntime, Waiting, ranks_digest, require_world, resolve
from simnccl.engine.watchdogs import Watchdogs
from simnccl.meetings import Meeting
from simnccl.ops import WORLD, DestroyProcessGroup, InitProcessGroup, NewGroup, SplitGroup

_BARRIER_KNOB = init_barrier.KNOB


def _no_time(_meeting: Meeting) -> float:
    return 0.0  # a store round trip: no time the model resolves


class Groups:
    def __init__(
        self,
        sim: Sim,
        rendezvous: Rendezvous,
        comms: Comms,
        planner: Planner,
        policy_gate: PolicyGate,
        watchdogs: Watchdogs,
        sockets: GlooSockets,
    ) -> None:
        self.env = sim.env
        self.release = sim.release
        self.record = sim.trace.record
        self.sim = sim
        self.rendezvous = rendezvous
        self.comms = comms
        self.planner = planner
        self.policy_gate = policy_gate
        self.watchdogs = watchdogs
        self.sockets = sockets

    def op_init(self, rt: RankRuntime, op: InitProcessGroup) -> Waiting:
        yield from self.rendezvous.settle(rt)
        if rt.world is not None:
            raise TorchError("ValueError", "trying to initialize the default process group twice!")
        if self.policy_gate.active:
            op = self.policy_gate.init(rt, op)
        plan = plan_init(self.release, rt.ctx, op.backend, op.device_id, op.timeout_s, op.pg_options)
        group = self.group_from_plan(rt, plan)
        rt.world = group
        rt.handles[WORLD] = group
        self.watchdogs.default_group_made(rt)  # its watchdog (and heartbeat monitor) start now
        self.record(self.env.now, rt.rank, "init", plan.backend.requested, plan.bound_device)
        if rt.incarnation:
            self.comms.reinit.spawn_reinit(rt)
        yield from self.comms.create(rt, group, plan, op)

    def op_new_group(self, rt: RankRuntime, op: NewGroup) -> Waiting | None:
        require_world(rt)
        if self.policy_gate.active:
            decided = self.policy_gate.group(rt, op)
            if decided is None:
                return None  # reused an identical group: no torch call at all
            op = decided
        plan = self.planner.plan_new_group(rt, op, rt.counter)
        work = self._follow(rt, plan, op)
        if (
            _BARRIER_KNOB in rt.ctx.env
            and init_barrier.wanted(rt.ctx.env)
            and (plan.member or not op.use_local_synchronization)
        ):
            return self._store_barrier(rt, work, plan, op)
        return work

    def _store_barrier(self, rt: RankRuntime, work: Waiting | None, plan: GroupPlan, op: NewGroup) -> Waiting:
        """The call, then torch's store-based barrier under ``TORCH_DIST_INIT_BARRIER=1`` (``engine.init_barrier``):
        every rank of the world, or with local synchronization every member, must reach it."""
        if work is not None:
            yield from work
        yield from self.rendezvous.settle(rt)
        world = rt.world
        assert world is not None
        members = plan.ranks if op.use_local_synchronization else world.ranks
        key = ("store-barrier", rt.incarnation, plan.name, op.use_local_synchronization)
        meeting = self.rendezvous.open(key, init_barrier.KIND, world.name, 0, members)
        meeting.timeout_s = plan.timeout_s
        self.rendezvous.arrive(meeting, rt, ("store-barrier",), op, duration=_no_time)
        yield from self.rendezvous.wait(rt, meeting, op)
        self.record(self.env.now, rt.rank, init_barrier.KIND, plan.name)

    def op_split_group(self, rt: RankRuntime, op: SplitGroup) -> Waiting | None:
        require_world(rt)
        parent = resolve(rt, op.parent)
        if not isinstance(parent, Group):
            # torch l.6838-6861: the handle is NON_GROUP_MEMBER (-100), registered with the last group this rank
            # was left out of; the empty-list check comes first.
            if not op.split_ranks:
                raise TorchError("ValueError", "split_ranks cannot be None or empty")
            raise TorchError("ValueError", f"Global rank {rt.rank} is not part of the parent group {parent}")
        if self.policy_gate.active:
            decided = self.policy_gate.split(rt, op, parent)
            if decided is None:
                return None  # every split of the call reused an identical group: no torch call
            op = decided
        try:
            plan = plan_split_group(
                self.release,
                rt.ctx,
                rt.counter,
                parent,
                op.split_ranks,
                op.pg_options,
                op.group_desc,
                op.timeout_s,
                parent_is_default=parent is rt.world,
            )
        except SplitNamesNoProcess as err:
            if err.is_nccl:
                raise
            return self._wait_for_no_one(rt, op, err)
        return self._follow(rt, plan, op)

    def _wait_for_no_one(self, rt: RankRuntime, op: SplitGroup, err: SplitNamesNoProcess) -> Waiting:
        """A gloo split member whose split names ranks no process has (``SplitNamesNoProcess``): it waits in the
        child's bootstrap for them, and nobody comes. Told as a hang with its reason (the split's own timeout, 30
        minutes by default, ends the real run with a DistStoreError)."""
        yield from self.rendezvous.settle(rt)
        rt.counter += 1
        meeting = self.rendezvous.open(("no-process", rt.rank, rt.counter), "bootstrap", op.bind or "split", 0, ())
        meeting.problem = err.explanation()
        yield from self.rendezvous.wait(rt, meeting, op)

    def _follow(self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup) -> Waiting | None:
        """Act on the plan of a new_group or split_group: a member creates the group; a non-member only moves
        its counter and handle, and joins the parent's NOCOLOR split if there is one."""
        rt.counter += plan.counter_advance
        if not plan.member:
            if op.bind:
                # Frameworks keep a group only where they are members (``if rank in ranks: _TP = g``), so a
                # non-member result never overwrites a handle; an unbound one becomes NON_GROUP_MEMBER.
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            if plan.nocolor_split_on is not None:
                return self.comms.nocolor_split(rt, plan.nocolor_split_on, op)
            return None
        return self._create_member_group(rt, plan, op)

    def _create_member_group(self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup) -> Waiting:
        yield from self.rendezvous.settle(rt)
        group = self.group_from_plan(rt, plan)
        if op.bind:
            rt.handles[op.bind] = group
        self.record(self.env.now, rt.rank, op.name, plan.name, ranks_digest(plan.ranks))
        yield from self.comms.create(rt, group, plan, op)

    def group_from_plan(self, rt: RankRuntime, plan: GroupPlan) -> Group:
        """The rank's new Group (its communicators are made by ``Comms.create``)."""
        group = Group(
            name=plan.name,
            desc=plan.desc,
            ranks=plan.ranks,
            rank_in_group=plan.rank_in_group,
            backend=plan.backend,
            bound_device=plan.bound_device,
            timeout_s=plan.timeout_s,
            options=plan.options,
            bound_cpu=plan.bound_cpu,
            store_prefix=plan.store_prefix,
        )
        rt.groups.append(group)
        self.watchdogs.group_made(plan.timeout_s)
        if rt.fr is not None:
            rt.fr.group(plan.name, plan.desc, plan.ranks)
        return group

    def op_destroy(self, rt: RankRuntime, op: DestroyProcessGroup) -> Waiting:
        yield from self.rendezvous.settle(rt)
        if op.group == WORLD:
            if rt.world is None:  # before init, or a second destroy: torch finds no WORLD to destroy
                raise TorchError("AssertionError", NO_GROUP_TO_DESTROY)
            groups = list(rt.groups)
            if self.sockets.used:
                # gloo has no shutdown: a ProcessGroupGloo closes its sockets when freed. torch drops its last
                # reference to the default group here; subgroups live on in the program's handles (frameworks
                # keep them in globals, and so does real.driver), so peers waiting on those keep waiting.
                self.sockets.close(rt, list(rt.world.comms.values()))
            # a subgroup of this incarnation that lives on keeps its prefix store of rank 0's store: one not destroyed
            # (torch's group map holds it), or destroyed with its handle still bound (the program's variable holds it;
            # measured, 2.15 gloo under mp.spawn: a kept destroyed subgroup kept the store 2 runs of 2, a deleted one
            # did not)
            held = {id(handle) for handle in rt.handles.values() if isinstance(handle, Group)}
            if any(group is not rt.world and (not group.destroyed or id(group) in held) for group in groups):
                rt.stores_kept += (rt.incarnation,)
            else:
                self.comms.drop_store(rt)  # under spawn, rank 0's store goes with it
            rt.incarnation += 1  # a re-init's bootstraps reuse this incarnation's names (counter reset)
            rt.world_destroyed_at = self.env.now
            rt.world = None
            # the program's other handles live on (destroyed, each still the object torch gave it): on gloo an
            # all_reduce on one still runs (measured, 2.15: all_reduce, all_gather and barrier on a kept subgroup
            # after the world's destroy, 4 runs), a broadcast raises; the default group is gone
            rt.handles.pop(WORLD, None)
            rt.counter = 1
        else:
            target = resolve(rt, op.group)
            if not isinstance(target, Group):
                return
            if self.policy_gate.active and self.policy_gate.drops_handle(target):
                # a reuse gave this group another handle, which keeps it (``PolicyGate.drops_handle``)
                self.record(self.env.now, rt.rank, "destroy-handle", op.group)
                return
            groups = [target]
        if self.policy_gate.active:
            self.policy_gate.destroyed(rt, groups, world=op.group == WORLD)
        for group in sorted(groups, key=lambda g: g.name, reverse=True):
            self.comms.destroy(rt, group, op)
        self.record(self.env.now, rt.rank, "destroy", op.group)

"""Split stamps: the members of one world-wide split in a cohort block made alike, after the first.

Why: at a world-wide startup every member of every group is made by a split of the default group, and making
them one by one through the ordinary rooms (``Groups``, ``Comms``, ``MulticastSlots``, ``Memory``) asked the
same questions again for each member: which device types the communicator serves, which record the group
has, whether the device has its context and this process's first communicator, whether a fault waits. The
answers are the group's, or the rank's own state, never the call's order. So the block makes the call's first
member by the ordinary path (``Cohorts._apply_member_plan``), and a ``SplitStamp`` built from it makes each
later member: the same steps in the same order, with what is the group's taken from the first, and what
belongs to the member (its group rank, device, parent communicator, node's NVLS binding, pricing class,
ledger) its own. A member whose state differs in any way the stamp does not carry over (its device not yet
touched, no communicator there yet, an injected fault armed, another plan shape) goes by the ordinary path.

What a stamp must leave equal to the ordinary path, event for event: the trace, the ledgers, the group record,
the NVLS ledger, each rank's groups and handles; and a failure (an NVLS bind failure, an out-of-memory
charge, the cudaMallocAsync abort) raised at the same step with the same effects before it. The engine gate
checks it on thousands of simulations; ``tests/test_split_stamps.py`` on the cases a stamp must refuse.
"""

from __future__ import annotations

from simnccl.backends import Comm, CommState, lifecycle
from simnccl.c10d import CommPlan, Group, GroupPlan
from simnccl.engine.comms import Comms
from simnccl.engine.groups import Groups
from simnccl.engine.memory import Memory
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime, ranks_digest
from simnccl.ops import NewGroup, SplitGroup
from simnccl.release import Impl


class SplitStamp:
    """What one split call's first member decided that holds for every member: made by ``after``."""

    __slots__ = (
        "abort_possible",
        "bind",
        "child_id",
        "comm_plan",
        "comms",
        "device_types",
        "digest",
        "groups",
        "memory",
        "op",
        "plan",
        "record",
        "registry_members",
        "sim",
    )

    def __init__(
        self,
        sim: Sim,
        groups: Groups,
        comms: Comms,
        memory: Memory,
        op: NewGroup | SplitGroup,
        plan: GroupPlan,
        child_id: int,
        group: Group,
        comm: Comm,
    ) -> None:
        self.sim = sim
        self.groups = groups
        self.comms = comms
        self.memory = memory
        self.op = op
        self.plan = plan
        self.comm_plan = plan.comms[0]
        self.child_id = child_id
        self.bind = op.bind
        self.digest = ranks_digest(plan.ranks)
        self.device_types = tuple(p.device_type for p in plan.backend.pairs if p.name == self.comm_plan.pair.name)
        self.record = memory.group_record(group, comm)
        self.registry_members = comms.registry.members
        impl = comm.impl
        self.abort_possible = impl in (Impl.NCCL2, Impl.NCCL_LAZY) and sim.release.cudamallocasync_aborts

    @staticmethod
    def after(
        sim: Sim,
        groups: Groups,
        comms: Comms,
        memory: Memory,
        rt: RankRuntime,
        plan: GroupPlan,
        op: NewGroup | SplitGroup,
        child_id: int | None,
    ) -> SplitStamp | None:
        """The stamp of a call whose member ``rt`` was just made by the ordinary path from ``plan``, or None
        when the call is not one a stamp makes: a split child of an NCCL communicator that allocates memory,
        the plan's only communicator, on a bound device."""
        if child_id is None or len(plan.comms) != 1:
            return None
        comm_plan = plan.comms[0]
        impl = comm_plan.pair.impl
        if comm_plan.split_from is None or comm_plan.device is None or not impl.is_nccl:
            return None
        if not lifecycle(impl).allocates_gpu_memory or not lifecycle(comm_plan.split_from.impl).communicates:
            return None
        group = rt.groups[-1] if rt.groups else None
        if group is None or group.name != plan.name or group.ranks is not plan.ranks:
            return None
        comm = group.comms.get(comm_plan.pair.device_type)
        if comm is None or comm.comm_id != child_id or comm.state is not CommState.READY:
            return None
        return SplitStamp(sim, groups, comms, memory, op, plan, child_id, group, comm)

    def fits(self, rt: RankRuntime, plan: GroupPlan) -> bool:
        """Whether ``plan`` (``rt``'s, for this call) is the first member's relabelled and ``rt`` is steady
        (``Memory.is_steady``): else the member goes by the ordinary path."""
        if plan.ranks is not self.plan.ranks or plan.name != self.plan.name or len(plan.comms) != 1:
            return False
        comm_plan = plan.comms[0]
        first = self.comm_plan
        device = comm_plan.device
        return (
            comm_plan.pair is first.pair
            and comm_plan.split_from is not None
            and comm_plan.shared == first.shared
            and comm_plan.lazy_init == first.lazy_init
            and device is not None
            and plan.backend is self.plan.backend
            and plan.desc == self.plan.desc
            and plan.timeout_s == self.plan.timeout_s
            and plan.options is self.plan.options
            and self.memory.is_steady(rt, device)
        )

    def make(self, rt: RankRuntime, plan: GroupPlan) -> None:
        """``rt``'s group and split child, as the ordinary path makes them (``Groups.group_from_plan``,
        ``Comms.attach``, ``Comms.split_child_ready``), in the same order; ``fits`` was checked."""
        first = self.plan
        comm_plan: CommPlan = plan.comms[0]
        group = Group(
            first.name,
            first.desc,
            first.ranks,
            plan.rank_in_group,
            first.backend,
            plan.bound_device,
            first.timeout_s,
            first.options,
        )
        rt.groups.append(group)  # the watchdogs already know this timeout (the first member's group)
        if rt.fr is not None:
            rt.fr.group(first.name, first.desc, first.ranks)
        if self.bind:
            rt.handles[self.bind] = group
        sim = self.sim
        now = sim.now()
        sim.trace.record(now, rt.rank, self.op.name, first.name, self.digest)
        parent = comm_plan.split_from
        comm = Comm(
            impl=comm_plan.pair.impl,
            group=first.name,
            size=len(first.ranks),
            device=comm_plan.device,
            lazy_init=comm_plan.lazy_init,
            via_split=True,
            shared=comm_plan.shared,
            parent=parent,
        )
        for device_type in self.device_types:
            group.comms[device_type] = comm
        comms = self.comms
        comms.nvls.note_parent(comm, parent)
        comm.comm_id = self.child_id  # its members are the first member's (``registry.members``)
        if self.abort_possible:
            comms.abort_if_cudamallocasync(rt, comm)
        members = self.registry_members
        comms.nvls.reserve(rt, comm, group, members)
        comm.state = CommState.READY
        assert parent is not None
        parent_ranks = None if parent.comm_id is None else members.get(parent.comm_id)
        memory = self.memory
        steady = (memory.ledger(rt, comm_plan.device), self.record)
        memory.init_comm(rt, comm, group, self.op, parent_ranks=parent_ranks, steady=steady)

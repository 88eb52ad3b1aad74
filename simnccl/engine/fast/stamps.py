"""Split stamps: each member of a world-wide split in a cohort block made in one pass.

Why: at a world-wide startup every member of every group is made by a split of the default group, and making
each one through the ordinary rooms (``Groups.group_from_plan``, ``Comms.attach``, ``Comms.split_child_ready``,
``Memory.init_comm`` and ``charge``) asked, member after member, questions whose answers belong to the plan's
shape or to the call, not to the member: which device types the communicator serves (the backend's pairs),
whether this release can abort on it, whether the parent's lifecycle communicates, the group's record and
the trace's stand-in for its members. A stamp answers those once per plan shape (``_Shape``) and once per call,
and makes each member with the same steps in the same order, taking what is the member's own (its group rank,
device, parent communicator, its node's NVLS binding, its pricing class, its ledger) from the member. The
rules stay in their rooms: NVLS binding is ``MulticastSlots.reserve``, pricing ``Pricer.create``, booking
``Memory._book`` — the stamp only skips what ``Memory.is_steady`` proves does nothing for this member (its
device's first CUDA context, the process's first communicator there, an injected fault). A member that is not
steady, or whose plan is another shape (several communicators, a lazy or fresh one, a non-NCCL backend, no
bound device), goes by the ordinary path (``Cohorts._apply_member_plan``).

What a stamp must leave equal to the ordinary path, event for event: the trace, the ledgers, the group records,
the NVLS ledger, each rank's groups, handles and flight recorder; and a failure (an NVLS bind failure, an
out-of-memory charge, the cudaMallocAsync abort) raised at the same step with the same effects before it. The
engine gate checks it on thousands of simulations, ``tests/test_split_stamps.py`` on the cases that matter.
"""

from __future__ import annotations

from simnccl.backends import Comm, CommState, lifecycle
from simnccl.c10d import BackendConfig, Group, GroupPlan
from simnccl.engine.comms import Comms
from simnccl.engine.memory import Memory
from simnccl.engine.sim import Sim
from simnccl.engine.state import GroupRecord, RankRuntime, ranks_digest
from simnccl.engine.watchdogs import Watchdogs
from simnccl.ops import NewGroup, SplitGroup
from simnccl.release import Impl


class _Shape:
    """What a plan's shape decides for every member with it: the device types its communicator serves and
    whether this release's cudaMallocAsync defect can abort its init."""

    __slots__ = ("abort_possible", "backend", "device_types", "pair_name")

    def __init__(self, backend: BackendConfig, pair_name: str, impl: Impl, release_aborts: bool) -> None:
        self.backend = backend
        self.pair_name = pair_name
        self.device_types = tuple(p.device_type for p in backend.pairs if p.name == pair_name)
        self.abort_possible = impl in (Impl.NCCL2, Impl.NCCL_LAZY) and release_aborts


class SplitStamps:
    """The block's stamps: per plan shape and per call, what every member shares (see the module's doc)."""

    def __init__(self, sim: Sim, comms: Comms, memory: Memory, watchdogs: Watchdogs) -> None:
        self.sim = sim
        self.comms = comms
        self.memory = memory
        self.watchdogs = watchdogs
        self._shapes: dict[tuple[int, int], _Shape] = {}  # (id(backend), id(pair)) -> its shape
        # The call being made: its group's name and member tuple, their stand-in for the trace, its record, the
        # repr of its members' trace events after the time and rank, and the op.
        self._call: tuple[
            str, tuple[int, ...], tuple[int, int, int], GroupRecord | None, str | None, NewGroup | SplitGroup | None
        ] = ("", (), (0, 0, 0), None, None, None)
        self.made = 0  # members made by a stamp

    def fits(self, rt: RankRuntime, plan: GroupPlan) -> bool:
        """Whether a stamp makes ``rt``'s member ``plan`` of a split: one communicator, a split child, NCCL with
        device memory, on a bound device, and the member steady (``Memory.is_steady``)."""
        if len(plan.comms) != 1:
            return False
        comm_plan = plan.comms[0]
        parent = comm_plan.split_from
        device = comm_plan.device
        if parent is None or device is None:
            return False
        impl = comm_plan.pair.impl
        return impl.is_nccl and lifecycle(impl).allocates_gpu_memory and self.memory.is_steady(rt, device)

    def _shape(self, plan: GroupPlan) -> _Shape:
        pair = plan.comms[0].pair
        shape = self._shapes.get((id(plan.backend), id(pair)))
        if shape is None or shape.backend is not plan.backend or shape.pair_name != pair.name:
            shape = _Shape(plan.backend, pair.name, pair.impl, self.sim.release.cudamallocasync_aborts)
            self._shapes[(id(plan.backend), id(pair))] = shape
        return shape

    def make(self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup, child_id: int) -> None:
        """``rt``'s group and split child as the ordinary path makes them (``Groups.group_from_plan``,
        ``Comms.attach``, ``Comms.split_child_ready``), step for step; ``fits`` was checked."""
        shape = self._shape(plan)
        name, ranks, digest, record, tail, call_op = self._call
        if name != plan.name or ranks is not plan.ranks or call_op is not op:
            name, ranks, digest, record, tail = plan.name, plan.ranks, ranks_digest(plan.ranks), None, None
        group = Group(
            name,
            plan.desc,
            ranks,
            plan.rank_in_group,
            plan.backend,
            plan.bound_device,
            plan.timeout_s,
            plan.options,
        )
        rt.groups.append(group)
        self.watchdogs.group_made(plan.timeout_s)
        if rt.fr is not None:
            rt.fr.group(name, plan.desc, ranks)
        if op.bind:
            rt.handles[op.bind] = group
        sim = self.sim
        now = sim.now()
        trace = sim.trace
        rank = rt.rank
        if tail is None:
            tail = f"{op.name!r}, {name!r}, {digest!r})"
        trace.record_text(f"({trace.time_text(now)}, {rank!r}, {tail}", (now, rank, op.name, name, digest))
        comm_plan = plan.comms[0]
        parent = comm_plan.split_from
        assert parent is not None
        comm = Comm(
            impl=comm_plan.pair.impl,
            group=name,
            size=len(ranks),
            device=comm_plan.device,
            lazy_init=comm_plan.lazy_init,
            via_split=True,
            shared=comm_plan.shared,
            parent=parent,
        )
        for device_type in shape.device_types:
            group.comms[device_type] = comm
        memory = self.memory
        if record is None:  # the call's first member made here: its record is made (or found) where attach does
            record = memory.group_record(group, comm)
        self._call = (name, ranks, digest, record, tail, op)
        comms = self.comms
        comms.nvls.note_parent(comm, parent)
        comm.comm_id = child_id
        members = comms.registry.members
        members[child_id] = ranks
        if shape.abort_possible:
            comms.abort_if_cudamallocasync(rt, comm)
        comms.nvls.reserve(rt, comm, group, members)
        comm.state = CommState.READY
        parent_ranks = None if parent.comm_id is None else members.get(parent.comm_id)
        steady = (memory.ledger(rt, comm_plan.device), record)
        memory.init_comm(rt, comm, group, op, parent_ranks=parent_ranks, steady=steady)
        self.made += 1

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

_READY = CommState.READY


class _Shape:
    """What a plan's shape decides for every member with it: the device types its communicator serves, whether
    this release's cudaMallocAsync defect can abort its init, and whether its backend is one a stamp makes."""

    __slots__ = ("abort_possible", "backend", "device_types", "pair_name", "stampable")

    def __init__(self, backend: BackendConfig, pair_name: str, impl: Impl, release_aborts: bool) -> None:
        self.backend = backend
        self.pair_name = pair_name
        self.device_types = tuple(p.device_type for p in backend.pairs if p.name == pair_name)
        self.abort_possible = impl in (Impl.NCCL2, Impl.NCCL_LAZY) and release_aborts
        self.stampable = impl.is_nccl and lifecycle(impl).allocates_gpu_memory  # NCCL with device memory


class _Call:
    """The call being made, and what its members share: its group's name, members and their stand-in for the
    trace, the repr of its members' trace events after the time and rank, its record (made at its first member
    made here, where ``Comms.attach`` makes it), and the plan shape last met."""

    __slots__ = ("backend", "child_id", "digest", "name", "op", "pair", "ranks", "record", "shape", "tail")

    def __init__(self, name: str, ranks: tuple[int, ...], op: NewGroup | SplitGroup | None, child_id: int) -> None:
        self.name = name
        self.ranks = ranks
        self.op = op
        self.child_id = child_id
        self.digest = ranks_digest(ranks) if ranks else (0, 0, 0)
        self.tail = "" if op is None else f"{op.name!r}, {name!r}, {self.digest!r})"
        self.record: GroupRecord | None = None
        self.backend: BackendConfig | None = None
        self.pair: object = None
        self.shape: _Shape | None = None


class SplitStamps:
    """The block's stamps: per plan shape and per call, what every member shares (see the module's doc)."""

    def __init__(self, sim: Sim, comms: Comms, memory: Memory, watchdogs: Watchdogs) -> None:
        self.sim = sim
        self.comms = comms
        self.memory = memory
        self.watchdogs = watchdogs
        self._shapes: dict[tuple[int, int], _Shape] = {}  # (id(backend), id(pair)) -> its shape
        self._call = _Call("", (), None, -1)
        self.made = 0  # members made by a stamp

    def _shape(self, plan: GroupPlan) -> _Shape:
        pair = plan.comms[0].pair
        shape = self._shapes.get((id(plan.backend), id(pair)))
        if shape is None or shape.backend is not plan.backend or shape.pair_name != pair.name:
            shape = _Shape(plan.backend, pair.name, pair.impl, self.sim.release.cudamallocasync_aborts)
            self._shapes[(id(plan.backend), id(pair))] = shape
        return shape

    def make(self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup, child_id: int) -> bool:
        """``rt``'s group and split child as the ordinary path makes them (``Groups.group_from_plan``,
        ``Comms.attach``, ``Comms.split_child_ready``), step for step; False, having made nothing, when a stamp
        does not make this member: not one communicator, not a split child, not NCCL with device memory, no
        bound device, or the member not steady (``Memory.is_steady``). Why one method: the checks read what the
        making reads (the plan's communicator, its call and shape), once per member."""
        comm_plans = plan.comms
        if len(comm_plans) != 1:
            return False
        comm_plan = comm_plans[0]
        parent = comm_plan.split_from
        device = comm_plan.device
        if parent is None or device is None:
            return False
        call = self._call
        ranks = plan.ranks
        if call.op is not op or call.ranks is not ranks or call.child_id != child_id or call.name != plan.name:
            call = self._call = _Call(plan.name, ranks, op, child_id)  # a cache only: made for a misfit too
        pair = comm_plan.pair
        backend = plan.backend
        shape = call.shape
        if shape is None or call.backend is not backend or call.pair is not pair:
            shape = call.shape = self._shape(plan)
            call.backend = backend
            call.pair = pair
        memory = self.memory
        if not shape.stampable or not memory.is_steady(rt, device):
            return False
        name = call.name
        timeout_s = plan.timeout_s
        group = Group(name, plan.desc, ranks, plan.rank_in_group, backend, plan.bound_device, timeout_s, plan.options)
        rt.groups.append(group)
        watchdogs = self.watchdogs
        if timeout_s < watchdogs.min_timeout_s:
            watchdogs.group_made(timeout_s)
        if rt.fr is not None:
            rt.fr.group(name, plan.desc, ranks)
        if op.bind:
            rt.handles[op.bind] = group
        sim = self.sim
        now = sim.now()
        trace = sim.trace
        rank = rt.rank
        trace.record_text(f"({trace.time_text(now)}, {rank!r}, {call.tail}", (now, rank, op.name, name, call.digest))
        comm = Comm(
            impl=pair.impl,
            group=name,
            size=len(ranks),
            device=device,
            lazy_init=comm_plan.lazy_init,
            via_split=True,
            shared=comm_plan.shared,
            parent=parent,
        )
        group_comms = group.comms
        for device_type in shape.device_types:
            group_comms[device_type] = comm
        record = call.record
        if record is None:  # the call's first member made here: its record is made (or found) where attach does
            record = call.record = memory.group_record(group, comm)
        comms = self.comms
        if comm.shared:
            comms.nvls.note_parent(comm, parent)
        comm.comm_id = child_id
        members = comms.registry.members
        members[child_id] = ranks
        if shape.abort_possible and "PYTORCH_CUDA_ALLOC_CONF" in rt.ctx.env:  # without it, nothing to abort
            comms.abort_if_cudamallocasync(rt, comm)
        comms.nvls.reserve(rt, comm, group, members)
        comm.state = _READY
        parent_id = parent.comm_id
        parent_ranks = None if parent_id is None else members.get(parent_id)
        memory.init_comm(rt, comm, group, op, parent_ranks=parent_ranks, steady=(memory.ledger(rt, device), record))
        self.made += 1
        return True

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

from collections.abc import Callable, Iterable, Sequence

from simnccl.backends import Comm, CommState, lifecycle
from simnccl.c10d import BackendConfig, Group, GroupPlan, TorchError
from simnccl.comm_memory import MembersPricing
from simnccl.engine.comms import Comms
from simnccl.engine.memory import Memory
from simnccl.engine.nvls import CallSlots
from simnccl.engine.sim import Sim
from simnccl.engine.state import GroupRecord, ProcessAbort, RankRuntime, ranks_digest
from simnccl.engine.watchdogs import Watchdogs
from simnccl.memory import SimulatedOOM
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
    made here, where ``Comms.attach`` makes it), the plan shape last met, and its NVLS binding and pricing per
    call (``CallSlots``, ``MembersPricing``: made at its first member made here)."""

    __slots__ = (
        "backend",
        "child_id",
        "digest",
        "name",
        "op",
        "pair",
        "pricing",
        "ranks",
        "record",
        "shape",
        "slots",
        "tail",
    )

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
        self.slots: CallSlots | None = None
        self.pricing: MembersPricing | None = None


# What makes a member by the ordinary path (``Cohorts._apply_member_plan``): a communicator to bootstrap with the
# other members, if any.
Ordinary = Callable[[RankRuntime, GroupPlan, NewGroup | SplitGroup, int], "tuple[Group, Comm] | None"]


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

    def _fit(self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup, child_id: int) -> _Call | None:
        """The call ``rt``'s plan is a member of, with its shape, if a stamp makes this member; None when it does
        not: not one communicator, not a split child, not NCCL with device memory, no bound device, or the member
        not steady (``Memory.is_steady``)."""
        comm_plans = plan.comms
        if len(comm_plans) != 1:
            return None
        comm_plan = comm_plans[0]
        device = comm_plan.device
        if comm_plan.split_from is None or device is None:
            return None
        call = self._call
        ranks = plan.ranks
        if call.op is not op or call.ranks is not ranks or call.child_id != child_id or call.name != plan.name:
            call = self._call = _Call(plan.name, ranks, op, child_id)  # a cache only: made for a misfit too
        pair = comm_plan.pair
        backend = plan.backend
        if call.shape is None or call.backend is not backend or call.pair is not pair:
            call.shape = self._shape(plan)
            call.backend = backend
            call.pair = pair
        if not call.shape.stampable or not self.memory.is_steady(rt, device):
            return None
        return call

    def make_members(
        self,
        ranks: Sequence[RankRuntime],
        plans: Iterable[tuple[int, GroupPlan]],
        op: NewGroup | SplitGroup,
        child_of: Callable[[int], int],
        pc: int,
        clock: float,
        ordinary: Ordinary,
        failures: dict[int, tuple[int, TorchError | SimulatedOOM | ProcessAbort]],
        joining: list[tuple[RankRuntime, Group, Comm, float]],
    ) -> bool:
        """Every member of a split call (``plans``: each rank's plan, in order) at ``pc`` and ``clock``, as the
        block's member loop makes them: by a stamp where ``_fit`` says one makes it (asked only of a member whose
        plan is not the call's last one met, or that is not steady), else by ``ordinary`` (a
        communicator it returns joins ``joining``), in member order, so the trace is the ordinary path's. A
        member's failure is kept in ``failures`` (rank -> (pc, error)) and the next member is made. Whether one
        failed.

        A stamp makes its member as ``Groups.group_from_plan``, ``Comms.attach`` and ``Comms.split_child_ready``
        would, step for step; what is the same for every member of the call is asked once (its record, its
        trace text after the time and rank, its NVLS layout and activity, its pricing), not per member."""
        sim = self.sim
        trace = sim.trace
        comms = self.comms
        nvls = comms.nvls
        registry = comms.registry.members
        memory = self.memory
        watchdogs = self.watchdogs
        bind = op.bind
        is_steady = memory.is_steady
        failed = False
        for rank, plan in plans:
            if not plan.member:
                continue
            rt = ranks[rank]
            rt.pc = pc
            sim.clock = clock
            child_id = child_of(rank)
            try:
                # ``_fit``, with the call's shape asked again only where this member's plan is another one's.
                comm_plans = plan.comms
                comm_plan = comm_plans[0] if len(comm_plans) == 1 else None
                call = self._call
                if (
                    comm_plan is None
                    or call.ranks is not plan.ranks
                    or call.backend is not plan.backend
                    or call.pair is not comm_plan.pair
                    or call.name != plan.name
                    or call.op is not op
                    or call.child_id != child_id
                    or comm_plan.split_from is None
                    or (device := comm_plan.device) is None
                    or (shape := call.shape) is None
                    or not shape.stampable
                    or not is_steady(rt, device)
                ):
                    call = self._fit(rt, plan, op, child_id)
                    if call is None:
                        joined = ordinary(rt, plan, op, child_id)
                        if joined is not None:
                            joining.append((rt, *joined, sim.clock))
                        continue
                    comm_plan = plan.comms[0]
                    device = comm_plan.device
                    shape = call.shape
                    assert shape is not None
                parent = comm_plan.split_from
                assert parent is not None and device is not None
                name = call.name
                members = call.ranks
                desc = plan.desc
                timeout_s = plan.timeout_s
                group = Group(
                    name, desc, members, plan.rank_in_group, plan.backend, plan.bound_device, timeout_s, plan.options
                )
                rt.groups.append(group)
                if timeout_s < watchdogs.min_timeout_s:
                    watchdogs.group_made(timeout_s)
                if rt.fr is not None:
                    rt.fr.group(name, desc, members)
                if bind:
                    rt.handles[bind] = group
                trace.record_text(
                    f"({trace.time_text(clock)}, {rank!r}, {call.tail}", (clock, rank, op.name, name, call.digest)
                )
                comm = Comm(
                    comm_plan.pair.impl, name, len(members), device, comm_plan.lazy_init, True, comm_plan.shared
                )
                comm.parent = parent
                group_comms = group.comms
                for device_type in shape.device_types:
                    group_comms[device_type] = comm
                record = call.record
                if record is None:  # the call's first member made here: its record is made (or found) as attach does
                    record = call.record = memory.group_record(group, comm)
                    call.slots = CallSlots(nvls, members, registry)
                    call.pricing = memory.pricer.for_members(members)
                if comm.shared:
                    nvls.note_parent(comm, parent)
                comm.comm_id = child_id
                registry[child_id] = members
                if shape.abort_possible and "PYTORCH_CUDA_ALLOC_CONF" in rt.ctx.env:  # without it, nothing to abort
                    comms.abort_if_cudamallocasync(rt, comm)
                call.slots.reserve(rt, comm)
                comm.state = _READY
                parent_id = parent.comm_id
                parent_ranks = None if parent_id is None else registry.get(parent_id)
                # ``Memory.init_comm``, priced and paid as a steady member is (``is_steady``).
                comm.memory = call.pricing.create(
                    group.rank_in_group, rt.ctx.env, group.options, parent.memory, parent_ranks
                )
                memory.pay_steady_init(rt, comm, op, group, memory.ledger(rt, device), record)
                self.made += 1
            except (TorchError, SimulatedOOM, ProcessAbort) as err:
                failures[rank] = (pc, err)  # re-raised in that rank's own process
                failed = True
        return failed

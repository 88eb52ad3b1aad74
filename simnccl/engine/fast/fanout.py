"""Member fan-out: one call of a cohort block applied to all its members, what they share worked out once.

Why: at a world-wide startup every member of every group is applied one by one (``Cohorts._apply_member_plan``:
a Group, its communicator split from the member's default group, NVLS slots, init memory), and that was most of
a large run (16,384 ranks: ~80% of the CPU, ~110 µs per membership). The members of one call of one rank class
share everything but their rank, group rank, device and parent: the group's name and members, its record, the
child communicator's identity and members, the backend's lifecycle, the watchdog's shortest timeout. So a
call's members are applied here in one pass with those computed once, and each member's own effects (its
objects, its trace events, its ledger charges, in the order the one-by-one path makes them) done inline.

Falling back: a member this pass cannot take exactly as the ordinary path would — a communicator that is not a
plain split child, a device it has no CUDA context or NCCL communicator on yet (the first-touch charges), an
injected init fault, a release whose allocator hook aborts — is applied by the caller's one-by-one path, so
divergence costs exactly the ranks that diverge. ``Engine(fast_path=False)`` never fans out (tests compare).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from simnccl.backends import Comm, CommState
from simnccl.c10d import CommPlan, Group, GroupPlan, TorchError
from simnccl.engine.comms import Comms
from simnccl.engine.groups import Groups
from simnccl.engine.memory import Memory
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime, ranks_digest
from simnccl.memory import SimulatedOOM
from simnccl.ops import NewGroup, SplitGroup

# the one-by-one path for one member: (rank, its plan, the call, the split child); raises as it does
ApplyOne = Callable[[RankRuntime, GroupPlan, NewGroup | SplitGroup, int | None], None]
Fail = Callable[[RankRuntime, TorchError | SimulatedOOM], None]  # a member's error, re-raised in its process


class MemberFanout:
    def __init__(self, sim: Sim, groups: Groups, comms: Comms, memory: Memory) -> None:
        self.sim = sim
        self.record = sim.trace.record
        self.comms = comms
        self.memory = memory
        self.nvls = comms.nvls
        self.registry = comms.registry
        self.watchdogs = groups.watchdogs
        self.enabled = True  # tests turn it off to compare
        self.fanned = 0  # members applied here
        self.one_by_one = 0  # members handed to the one-by-one path

    def apply(
        self,
        members: Iterable[tuple[RankRuntime, GroupPlan]],
        op: NewGroup | SplitGroup,
        pc: int,
        child_id: int,
        now: float,
        one: ApplyOne,
        fail: Fail,
    ) -> None:
        """Apply call ``pc`` (``op``, split child ``child_id``) to each member in order, at ``now``: ``one``
        takes those this can't; a member's error goes to ``fail`` (the others go on, as one by one)."""
        record = self.record
        group_made = self.watchdogs.group_made
        group_record = self.memory.group_record
        init_comm = self.memory.init_comm
        nvls_reserve = self.nvls.reserve
        note_parent = self.nvls.note_parent
        registry_members = self.registry.members
        aborts = self.sim.release.cudamallocasync_aborts  # the 2.15 allocator-hook check, per member's env
        abort_if_cudamallocasync = self.comms.abort_if_cudamallocasync if aborts else None
        bind = op.bind
        name = op.name
        digests: dict[int, tuple[tuple[int, ...], tuple[int, int, int]]] = {}  # id(member tuple) -> its digest
        device_types: dict[int, tuple[object, object, tuple[str, ...]]] = {}  # id(backend) -> its pair's types

        def member(rt: RankRuntime, plan: GroupPlan, comm_plan: CommPlan) -> None:
            """``Groups.group_from_plan``, ``Comms.attach`` and ``Comms.split_child_ready``, in their order."""
            parent = comm_plan.split_from
            assert parent is not None
            ranks = plan.ranks
            group_name = plan.name
            timeout_s = plan.timeout_s
            backend = plan.backend
            group = Group(
                group_name, plan.desc, ranks, plan.rank_in_group, backend, plan.bound_device, timeout_s, plan.options
            )
            rt.groups.append(group)
            group_made(timeout_s)
            fr = rt.fr
            if fr is not None:
                fr.group(group_name, plan.desc, ranks)
            if bind:
                rt.handles[bind] = group
            digest = digests.get(id(ranks))
            if digest is None or digest[0] is not ranks:
                digest = digests[id(ranks)] = (ranks, ranks_digest(ranks))
            record(now, rt.rank, name, group_name, digest[1])
            pair = comm_plan.pair
            comm = Comm(
                pair.impl,
                group_name,
                len(ranks),
                comm_plan.device,
                comm_plan.lazy_init,
                True,
                comm_plan.shared,
                parent=parent,
            )
            types = device_types.get(id(backend))
            if types is None or types[0] is not backend or types[1] is not pair:
                types = device_types[id(backend)] = (
                    backend,
                    pair,
                    tuple(p.device_type for p in backend.pairs if p.name == pair.name),
                )
            group_comms = group.comms
            for device_type in types[2]:
                group_comms[device_type] = comm
            group_record(group, comm)
            if comm_plan.shared:
                note_parent(comm, parent)
            comm.comm_id = child_id
            registry_members[child_id] = ranks
            if abort_if_cudamallocasync is not None:
                abort_if_cudamallocasync(rt, comm)
            nvls_reserve(rt, comm, group, registry_members)
            comm.state = CommState.READY
            parent_ranks = None if parent.comm_id is None else registry_members.get(parent.comm_id)
            init_comm(rt, comm, group, op, parent_ranks=parent_ranks)

        for rt, plan in members:
            rt.pc = pc
            comms = plan.comms
            try:
                if len(comms) == 1 and comms[0].split_from is not None:
                    self.fanned += 1
                    member(rt, plan, comms[0])
                else:
                    self.one_by_one += 1
                    one(rt, plan, op, child_id)
            except (TorchError, SimulatedOOM) as err:
                fail(rt, err)

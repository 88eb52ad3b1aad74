"""Devices and memory: each device's ledger, each node's pinned host memory, CUDA contexts, what a
communicator costs at init and at the first use of each collective kind (and to which group record), and the
ops a rank runs on its own device (set_device, memory_check, raise, checkpoint; alloc, free and empty_cache are the
caching allocator's, ``simnccl.engine.caching_allocator``).

Why a room: every byte the simulator reports goes through ``charge`` or a local op here, tagged with its
owner, so a memory timeline per device and per owner falls out of the ledgers (``simnccl.memory``). What a
communicator costs comes from NCCL's mechanics plus the profile's measured overheads
(``simnccl.comm_memory``), never from code (DESIGN rules 4, 12). Each rank's communicator keeps its itemised
breakdown (``Comm.memory``, and ``"memory"`` in its group record's member entry). NVLS multicast slots are not
memory and not counted here: the per-node multicast ledger (``simnccl.engine.nvls``) owns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simnccl.backends import Charge, Comm, lifecycle
from simnccl.c10d import Group, TorchError
from simnccl.comm_memory import Pricer
from simnccl.engine.config import WorkloadFailure
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import GroupRecord, RankRuntime, Snapshot, Waiting, current_device, measured_device
from simnccl.memory import (
    DeviceLedger,
    HostLedger,
    Owner,
    SimulatedOOM,
    comm_holdings,
    oom_message,
    vllm_check_message,
    vllm_requested_bytes,
)
from simnccl.nccl import Part
from simnccl.ops import Checkpoint, MemoryCheck, Op, Raise, SetDevice
from simnccl.release import Impl

_new_tuple = tuple.__new__
_GLOO = Impl.GLOO.value  # a group record's implementation that its NCCL communicator replaces (``group_record``)

# The owner "group" of NCCL's once-per-process overheads: the process holds them, no communicator does.
PROCESS_OWNER = "(nccl process)"
# Its phases: the overhead of the process's first communicator on a device, and of its first collective there.
PROCESS_FIRST_COMM = "process-first-comm"
PROCESS_FIRST_COLLECTIVE = "process-first-collective"


def mib_bytes(mib: float) -> int:
    return round(mib * 1024 * 1024)


class RanksKey:
    """Wraps a member tuple with its hash computed once (tuples don't cache theirs)."""

    __slots__ = ("_hash", "ranks")

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self._hash = hash(ranks)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RanksKey) and (self.ranks is other.ranks or self.ranks == other.ranks)


# A group record member's ``phases`` and ``memory`` dicts are never changed in place, only replaced (here, and
# by readers such as ``simnccl.recovery``), so members that paid alike share one dict: at a world-wide startup
# the members of a call (one rank class) do, and two dicts per membership were a fifth of a run's memory.
_NO_PHASES: dict[str, float] = {}


class SharedEntries:
    """Replacement dicts for a member entry, the latest one kept to hand to the next member that pays alike."""

    __slots__ = ("_memories", "_phases")

    def __init__(self) -> None:
        self._phases: tuple[str, float, dict[str, float]] | None = None
        self._memories: tuple[str, object, dict[str, Any]] | None = None

    def phases(self, phases: dict[str, float], phase: str, now: float) -> dict[str, float]:
        """``phases`` with ``phase`` first paid at ``now`` added."""
        if phases:
            return {**phases, phase: now}
        last = self._phases
        if last is None or last[0] != phase or last[1] != now or type(last[1]) is not type(now):  # 0 is not 0.0
            last = self._phases = (phase, now, {phase: now})
        return last[2]

    def memories(self, memories: dict[str, Any] | None, name: str, memory: object) -> dict[str, Any]:
        """``memories`` with communicator ``name``'s breakdown set to ``memory``."""
        if memories:
            return {**memories, name: memory}
        last = self._memories
        if last is None or last[0] != name or last[1] is not memory:
            last = self._memories = (name, memory, {name: memory})
        return last[2]


class Memory:
    def __init__(self, sim: Sim, rendezvous: Rendezvous) -> None:
        self.sim = sim
        self.env = sim.env
        self.cluster = sim.cluster
        self.profile = sim.profile
        self.record = sim.trace.record
        self.rendezvous = rendezvous
        self.ledgers: dict[str, DeviceLedger] = {
            d.key: DeviceLedger(d.key, self.cluster.gpu.total_bytes) for d in self.cluster.devices()
        }
        self.checkpoints: dict[str, dict[str, Snapshot]] = {}
        # Labels some rank met more than once (a generated program's c0 twice): a check reading one moment at
        # such a label would read the last, silently (``within_budget``, ``used_mib`` refuse to judge them)
        self.repeated_checkpoints: set[str] = set()
        self._met: set[tuple[int, str]] = set()
        self.group_records: dict[tuple[str, RanksKey], GroupRecord] = {}
        # (group name, id(member tuple)) -> (the tuple, the group's record): one entry per group, not per member
        self._record_of_group: dict[tuple[str, int], tuple[tuple[int, ...], GroupRecord]] = {}
        self._totals: dict[int, tuple[tuple[Part, ...], int, int]] = {}  # id(parts) -> (parts, device, host bytes)
        self._ranks_keys: dict[int, RanksKey] = {}
        self._device_ledgers: dict[tuple[int, int], DeviceLedger] = {}  # (node, index) -> its ledger
        # Pinned host memory NCCL allocates (work FIFO, host-side connection buffers, network buffers without
        # GPUDirect RDMA): a ledger per node, unbounded (the host's memory is not modelled), never in the
        # device figures.
        self.host_ledgers: dict[str, HostLedger] = {}
        self._host_by_node: dict[int, HostLedger] = {}  # node -> its entry in host_ledgers
        self._shared = SharedEntries()
        # The last charge's (group name, phase, bytes) and the end of its trace text, reprs included: the members
        # of a call that pay alike share it, and repr-ing the three for each was a tenth of booking one.
        self._alloc_tail: tuple[str, str, int, str] = ("", "", 0, "")
        self.pricer = Pricer(self.profile, self.cluster.node_of, self.cluster.nodes_of, sim.node_counts)
        self._oom_at_init: set[int] = set()  # ranks whose next init charge fails (injected fault)
        self._collective_devices: set[tuple[int, int]] = set()  # (rank, device): its first collective was paid
        # Whether two ranks have made a CUDA context on one device: until then no NCCL communicator can have two
        # members on one GPU, and ``engine.shared_gpus`` looks at no member list.
        self.gpus_shared = False
        self._context_of: dict[str, int] = {}  # device -> the first rank that made a context on it

    def fail_next_init(self, rank: int) -> None:
        """Arm an ``oom-at-init`` fault: this rank's next communicator init runs out of memory."""
        self._oom_at_init.add(rank)

    def init_fault_armed(self, rank: int) -> bool:
        """Whether this rank's ``oom-at-init`` fault is still waiting for an init (it never acted)."""
        return rank in self._oom_at_init

    def ledger(self, rt: RankRuntime, index: int) -> DeviceLedger:
        """The ledger of device ``index`` on this rank's node (validated by the cluster on first use)."""
        key = (rt.node, index)
        ledger = self._device_ledgers.get(key)
        if ledger is None:
            if isinstance(index, int) and not 0 <= index < self.cluster.device_count:
                # A device the node does not have, reached by a call that takes one (set_device, a policy's
                # device_id on an unbound default group): what CUDA answers, not the simulator's own ClusterError
                raise TorchError("torch.AcceleratorError", "CUDA error: invalid device ordinal")
            ledger = self._device_ledgers[key] = self.ledgers[self.cluster.device(rt.node, index).key]
        return ledger

    def touch(self, rt: RankRuntime, index: int, op: Op) -> DeviceLedger:
        """Use a device from this process: the first touch creates its CUDA context."""
        ledger = self.ledger(rt, index)
        if index not in rt.contexts:
            rt.contexts.add(index)
            if self._context_of.setdefault(ledger.device, rt.rank) != rt.rank:
                self.gpus_shared = True
            ledger.allocate(
                Owner("cuda_context", rt.rank),
                self.cluster.gpu.cuda_context_bytes,
                time_s=self.sim.now(),
                op=op,
            )
            self.record(self.sim.now(), rt.rank, "context", ledger.device)
        return ledger

    # ---------------------------------------------------------------- communicator memory

    def init_comm(
        self,
        rt: RankRuntime,
        comm: Comm,
        group: Group,
        op: Op,
        parent_ranks: tuple[int, ...] | None = None,
        ranks: tuple[int, ...] | None = None,
        phase: str = "init",
    ) -> None:
        """Price a communicator that just finished its init (fresh or split) and charge what init allocates.

        ``parent_ranks``: the members of the communicator it was split from (``comm.parent``), which decides
        whether it shares; ``ranks``: the communicator's members when they are not the group's (a p2p pair).
        """
        if comm.device is None or not lifecycle(comm.impl).allocates_gpu_memory:
            return
        members = group.ranks if ranks is None else ranks
        parent = comm.parent.memory if comm.parent is not None else None
        index = group.rank_in_group if ranks is None else ranks.index(rt.rank)
        # A group's communicator (not a p2p pair's) may share its rank class's breakdown until its first use.
        memory = self.pricer.create(
            members, index, rt.ctx.env, group.options, parent, parent_ranks, shareable=ranks is None
        )
        comm.memory = memory
        self._pay(rt, comm, phase, memory.breakdown.parts, op, group)

    def is_steady(self, rt: RankRuntime, device: int) -> bool:
        """Whether charging a communicator on this rank's ``device`` now is only booking it (``_book``): the
        device has its CUDA context and this process's first communicator there, and no injected fault waits."""
        return device in rt.nccl_devices and device in rt.contexts and rt.rank not in self._oom_at_init

    def use_comm(
        self,
        rt: RankRuntime,
        comm: Comm,
        group: Group,
        op: Op,
        collective: str,
        nbytes: int,
        peer_index: int | None = None,
        phase: str = "connect",
    ) -> None:
        """The first call of a collective kind connects what its algorithm needs (NCCL_RUNTIME_CONNECT=1);
        later calls of that kind cost nothing. ``peer_index``: a send/recv peer's index in the communicator."""
        memory = comm.memory
        if memory is None:
            return
        if self.pricer.is_shared(memory):  # a class's shared breakdown: this rank's own copy connects its uses
            memory = comm.memory = self.pricer.own(memory, group.rank_in_group)
            record = self.group_record(group, comm).members.get(rt.rank)
            if record is not None and "memory" in record:
                record["memory"] = self._shared.memories(record["memory"], comm.group, memory)
        held = memory.uses, memory.breakdown, memory.exact
        paid = self.pricer.use(memory, collective, nbytes, peer_index)
        try:
            first = (rt.rank, comm.device)
            if first not in self._collective_devices:  # the profile's once-per-process cost at the first collective
                self._collective_devices.add(first)
                charged = self.pricer.process_first_collective_bytes
                self._process_charge(rt, comm, PROCESS_FIRST_COLLECTIVE, charged, op)
            if paid:
                self._pay(rt, comm, phase, paid, op, group)
        except SimulatedOOM:
            if paid:  # what ran out was never paid: the communicator holds what it held (its breakdown, the
                # report's nccl_paid_mib: a rank that died at the first all_reduce showed its NVLS buffers paid)
                memory.uses, memory.breakdown, memory.exact = held
                memory.use_keys.discard(self.pricer.use_key(collective, nbytes, peer_index))
            raise

    def _pay(
        self,
        rt: RankRuntime,
        comm: Comm,
        phase: str,
        parts: tuple[Part, ...],
        op: Op,
        group: Group,
        steady: tuple[DeviceLedger, GroupRecord] | None = None,
    ) -> None:
        """Charge parts of a breakdown: device bytes as one allocation tagged ``phase``, host bytes to the node.
        ``steady``: the device's ledger and the group's record, from a caller that checked ``is_steady``
        (``pay_steady_init``): the checks before a charge are then known to do nothing."""
        totals = self._totals.get(id(parts))
        if totals is None or totals[0] is not parts:  # summed once per breakdown (members of a class share one)
            totals = self._totals[id(parts)] = (
                parts,
                sum(p.total for p in parts if p.ledger == "device"),
                sum(p.total for p in parts if p.ledger == "host"),
            )
        _, device, host = totals
        # One object for the device and the host charge (built as ``Owner(...)`` is, in C: one per communicator).
        owner = _new_tuple(Owner, ("comm", rt.rank, comm.group, phase))
        if steady is None:
            self.charge(rt, comm, [Charge(phase, device)], op, group, owner)
        elif comm.device is not None and device:
            self._book_one(rt, comm, steady[0], owner, device, op, group, steady[1])
        if host:
            ledger = self._host_by_node.get(rt.node)
            if ledger is None:
                ledger = self._host_ledger(rt.node)
            ledger.allocate(owner, host, time_s=self.sim.now(), op=op)

    def pay_steady_init(
        self, rt: RankRuntime, comm: Comm, op: Op, group: Group, ledger: DeviceLedger, record: GroupRecord
    ) -> None:
        """A cohort stamp's charge of a priced communicator's init (on a device, ``is_steady``): ``_pay`` with the
        device's ledger and the group's record, so the charge's checks, known to do nothing, are skipped."""
        memory = comm.memory
        assert memory is not None
        self._pay(rt, comm, "init", memory.breakdown.parts, op, group, (ledger, record))

    def _host_ledger(self, node: int) -> HostLedger:
        """The node's pinned host memory ledger, made at its first charge."""
        key = f"n{node}:host"
        ledger = self.host_ledgers.get(key)
        if ledger is None:
            ledger = self.host_ledgers[key] = HostLedger(key, 2**62)
        self._host_by_node[node] = ledger
        return ledger

    def _process_charge(self, rt: RankRuntime, comm: Comm, phase: str, num_bytes: int, op: Op) -> None:
        """A profile's once-per-process overhead on ``comm``'s device: held by the process (``PROCESS_OWNER``),
        not by a group, so destroying the communicator that paid it frees nothing of it. Its OOM names ``comm``,
        whose init or first collective ran out (the backend that owns it decides the error torch raises)."""
        if num_bytes:
            assert comm.device is not None
            ledger = self.ledger(rt, comm.device)
            now = self.sim.now()
            owner = Owner("comm", rt.rank, PROCESS_OWNER, phase)
            try:
                ledger.allocate(owner, num_bytes, time_s=now, op=op, nccl=True)
            except SimulatedOOM as err:
                err.comm_group = comm.group
                raise
            self.record(now, rt.rank, "alloc", ledger.device, PROCESS_OWNER, phase, num_bytes)

    def charge(
        self,
        rt: RankRuntime,
        comm: Comm,
        charges: list[Charge],
        op: Op,
        group: Group | None,
        owner: Owner | None = None,
    ) -> None:
        """Charge ``charges`` to this rank's device, tagged with its communicator's group and each phase.
        ``owner``: the tag of a charge of its phase, made by the caller (which tags a host charge with it too:
        one object, not two equal ones, per communicator a large startup makes)."""
        if comm.device is None or not charges:
            return
        ledger = self.touch(rt, comm.device, op)
        first_comm = comm.device not in rt.nccl_devices and lifecycle(comm.impl).allocates_gpu_memory
        if rt.rank in self._oom_at_init and any(c.phase == "init" for c in charges):
            self._oom_at_init.discard(rt.rank)
            ledger = self.ledger(rt, comm.device)
            wanted = sum(c.num_bytes for c in charges)
            raise SimulatedOOM(
                oom_message(ledger.device, wanted, 0, ledger.total_bytes, nccl=True) + " (injected fault: oom-at-init)",
                ledger.device,
                wanted,
                0,
                comm_group=comm.group,
            )
        if first_comm:
            rt.nccl_devices.add(comm.device)
            self._process_charge(rt, comm, PROCESS_FIRST_COMM, self.pricer.process_bytes, op)
        self._book(rt, comm, ledger, charges, op, group, owner)

    def _book(
        self,
        rt: RankRuntime,
        comm: Comm,
        ledger: DeviceLedger,
        charges: Sequence[Charge],
        op: Op,
        group: Group | None,
        owner: Owner | None,
        record: GroupRecord | None = None,
    ) -> None:
        """The charges on the ledger, in the trace and in the group's record (``record``: it, if the caller has
        it): what ``charge`` does once its checks (context, first communicator, faults) are done."""
        for charge in charges:
            if charge.num_bytes:
                owned = owner is not None and owner.phase == charge.phase
                self._book_one(
                    rt,
                    comm,
                    ledger,
                    owner if owned else Owner("comm", rt.rank, comm.group, charge.phase),
                    charge.num_bytes,
                    op,
                    group,
                    record,
                )

    def _book_one(
        self,
        rt: RankRuntime,
        comm: Comm,
        ledger: DeviceLedger,
        owner: Owner,
        num_bytes: int,
        op: Op,
        group: Group | None,
        record: GroupRecord | None,
    ) -> None:
        """One charge (``owner``: its tag, phase included; ``num_bytes`` > 0) on the ledger, in the trace and in
        the group's record, and the rank's breakdown of its communicator there."""
        now = self.sim.now()  # no simulated time passes while charging
        ledger.allocate(owner, num_bytes, time_s=now, op=op, nccl=True)
        trace = self.sim.trace
        rank = rt.rank
        name = comm.group
        phase = owner.phase
        tail = self._alloc_tail
        if tail[0] != name or tail[1] != phase or tail[2] != num_bytes or type(num_bytes) is not int:
            tail = self._alloc_tail = (name, phase, num_bytes, f"{name!r}, {phase!r}, {num_bytes!r})")
        device = ledger.device
        trace.record_text(
            f"({trace.time_text(now)}, {rank!r}, 'alloc', {device!r}, {tail[3]}",
            (now, rank, "alloc", device, name, phase, num_bytes),
        )
        if group is None:
            return
        members = (record or self.group_record(group, comm)).members  # the record is created at a first charge
        member = members.get(rank)
        shared = self._shared
        memory = comm.memory
        if member is None:  # its first charge in the group: the entry as the steps below would leave it
            member = members[rank] = {
                "device": device,
                "bytes": num_bytes,
                "phases": shared.phases(_NO_PHASES, phase, now),
            }
            if memory is not None:
                member["memory"] = shared.memories(None, name, memory)
            return
        member["bytes"] += num_bytes
        if phase not in member["phases"]:
            member["phases"] = shared.phases(member["phases"], phase, now)
        if memory is not None:  # this rank's communicators of the group
            memories = member.get("memory")
            if memories is None or memories.get(name) is not memory:
                member["memory"] = shared.memories(memories, name, memory)

    def release_comm(self, rt: RankRuntime, comm: Comm, op: Op) -> None:
        """Free what this rank's part of a destroyed communicator (and its p2p pair communicators) holds."""
        if comm.device is None:
            return
        ledger = self.ledger(rt, comm.device)
        host = self.host_ledgers.get(f"n{rt.node}:host")
        for held in (ledger, host) if host is not None else (ledger,):
            for owner in [
                o
                for o in held.by_owner
                if o.rank == rt.rank
                and o.kind == "comm"
                and (o.group == comm.group or o.group.startswith(comm.group + "/p2p-"))
            ]:
                held.release_owner(owner, time_s=self.env.now, op=op)

    def group_record(self, group: Group, comm: Comm) -> GroupRecord:
        """The group's record; its implementation is its NCCL communicator's where it has one. Why: a
        ``"cpu:gloo,cuda:nccl"`` group attaches gloo first, and its record said gloo, no split, where the
        communicator that costs device memory is an eager nccl2 split (``cuda:nccl,cpu:gloo``: nccl2)."""
        ranks = group.ranks
        cached = self._record_of_group.get((group.name, id(ranks)))
        if cached is not None and cached[0] is ranks:
            record = cached[1]
        else:
            key = (group.name, self._ranks_key(ranks))
            record = self.group_records.get(key)
            if record is None:
                record = GroupRecord(group.name, group.desc, ranks, comm.impl.value, comm.via_split)
                self.group_records[key] = record
            # A group's name and members never change and records are never replaced: remember its record for
            # every member that holds this member tuple (a group's members share one).
            self._record_of_group[(group.name, id(ranks))] = (ranks, record)
        if record.impl == _GLOO and comm.impl.is_nccl:
            record.impl, record.via_split = comm.impl.value, comm.via_split
        return record

    def _ranks_key(self, ranks: tuple[int, ...]) -> RanksKey:
        """A member tuple as a dict key with its hash computed once per tuple object: every member of a
        group looks its record up, and rehashing a 16k-rank tuple per member is quadratic."""
        entry = self._ranks_keys.get(id(ranks))
        if entry is None or entry.ranks is not ranks:
            entry = self._ranks_keys[id(ranks)] = RanksKey(ranks)
        return entry

    # ---------------------------------------------------------------- local ops

    def op_set_device(self, rt: RankRuntime, op: SetDevice) -> Waiting:
        yield from self.rendezvous.settle(rt)
        index = rt.ctx.local_rank if op.device is None else op.device
        self.touch(rt, index, op)  # a device the node lacks: CUDA's invalid device ordinal (``ledger``)
        rt.current_device = index

    def op_memory_check(self, rt: RankRuntime, op: MemoryCheck) -> Waiting:
        yield from self.rendezvous.settle(rt)
        index = current_device(rt)
        ledger = self.touch(rt, index, op)
        free, total = ledger.mem_get_info()
        requested = vllm_requested_bytes(total, op.gpu_memory_utilization)
        self.record(self.env.now, rt.rank, "memory_check", ledger.device, free, requested)
        if free < requested:
            raise WorkloadFailure(
                vllm_check_message(f"cuda:{index}", free, total, op.gpu_memory_utilization, requested)
            )

    def op_raise(self, rt: RankRuntime, op: Raise) -> Waiting:
        """The framework's own failing check: the rank ends with its exception, holding what it made so far."""
        yield from self.rendezvous.settle(rt)
        raise WorkloadFailure(op.message, type_name=op.error_type)

    def op_checkpoint(self, rt: RankRuntime, op: Checkpoint) -> Waiting:
        yield from self.rendezvous.settle(rt)
        self.record(self.env.now, rt.rank, "checkpoint", op.label)
        met = (rt.rank, op.label)
        if met in self._met:
            self.repeated_checkpoints.add(op.label)
        self._met.add(met)
        per_device = self.checkpoints.setdefault(op.label, {})
        ledger = self.ledger(rt, measured_device(rt))
        per_device[ledger.device] = Snapshot(
            ledger.device, ledger.used_bytes, ledger.free_bytes, self.env.now, rt.rank, comm_holdings((ledger,))
        )

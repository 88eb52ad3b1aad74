"""Devices and memory: each device's ledger, CUDA contexts, what a communicator's lifecycle steps charge (and
to which group record), and the ops a rank runs on its own device (set_device, alloc, free, memory_check,
checkpoint).

Why a room: every byte the simulator reports goes through ``charge`` or a local op here, tagged with its
owner, so a memory timeline per device and per owner falls out of the ledgers (``simnccl.memory``). What a
step costs comes from the profile (``costs``), never from code (DESIGN rule 4).
"""

from __future__ import annotations

from typing import Any

from simnccl.backends import Charge, Comm, lifecycle
from simnccl.c10d import Group, TorchError
from simnccl.engine.config import WorkloadFailure
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import GroupRecord, RankRuntime, Snapshot, Waiting, current_device
from simnccl.memory import DeviceLedger, Owner, SimulatedOOM, oom_message, vllm_check_message, vllm_requested_bytes
from simnccl.ops import Alloc, Checkpoint, Free, MemoryCheck, Op, SetDevice
from simnccl.profiles import MAX_NCHANNELS_ENV, CommCosts


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
        self.group_records: dict[tuple[str, RanksKey], GroupRecord] = {}
        self._record_of_group: dict[int, tuple[Group, GroupRecord]] = {}  # id(group) -> (group, its record)
        self._ranks_keys: dict[int, RanksKey] = {}
        self._device_ledgers: dict[tuple[int, int], DeviceLedger] = {}  # (node, index) -> its ledger
        self._costs_by_channels: dict[str | None, CommCosts] = {}
        self._oom_at_init: set[int] = set()  # ranks whose next init charge fails (injected fault)

    def fail_next_init(self, rank: int) -> None:
        """Arm an ``oom-at-init`` fault: this rank's next communicator init runs out of memory."""
        self._oom_at_init.add(rank)

    def costs(self, rt: RankRuntime) -> CommCosts:
        """Profile costs under this process's environment (a policy may set NCCL_MAX_NCHANNELS)."""
        channels = rt.ctx.env.get(MAX_NCHANNELS_ENV)
        costs = self._costs_by_channels.get(channels)
        if costs is None:
            costs = self._costs_by_channels[channels] = self.profile.costs_for_env(rt.ctx.env)
        return costs

    def ledger(self, rt: RankRuntime, index: int) -> DeviceLedger:
        """The ledger of device ``index`` on this rank's node (validated by the cluster on first use)."""
        key = (rt.node, index)
        ledger = self._device_ledgers.get(key)
        if ledger is None:
            ledger = self._device_ledgers[key] = self.ledgers[self.cluster.device(rt.node, index).key]
        return ledger

    def touch(self, rt: RankRuntime, index: int, op: Op) -> DeviceLedger:
        """Use a device from this process: the first touch creates its CUDA context."""
        ledger = self.ledger(rt, index)
        if index not in rt.contexts:
            rt.contexts.add(index)
            ledger.allocate(
                Owner("cuda_context", rt.rank),
                self.cluster.gpu.cuda_context_bytes,
                time_s=self.sim.now(),
                op=op,
            )
            self.record(self.sim.now(), rt.rank, "context", ledger.device)
        return ledger

    def charge(self, rt: RankRuntime, comm: Comm, charges: list[Charge], op: Op, group: Group | None) -> None:
        if comm.device is None or not charges:
            return
        ledger = self.touch(rt, comm.device, op)
        if comm.device not in rt.nccl_devices and lifecycle(comm.impl).allocates_gpu_memory:
            rt.nccl_devices.add(comm.device)
            charges = [Charge("process-first-comm", mib_bytes(self.costs(rt).process_first_comm_mib)), *charges]
        if rt.rank in self._oom_at_init and any(c.phase == "init" for c in charges):
            self._oom_at_init.discard(rt.rank)
            ledger = self.ledger(rt, comm.device)
            raise SimulatedOOM(
                oom_message(ledger.device, mib_bytes(self.costs(rt).init_mib), 0, ledger.total_bytes, nccl=True)
                + " (injected fault: oom-at-init)",
                ledger.device,
                mib_bytes(self.costs(rt).init_mib),
                0,
            )
        now = self.sim.now()  # no simulated time passes while charging
        member: dict[str, Any] | None = None
        for charge in charges:
            if charge.num_bytes == 0:
                continue
            ledger.allocate(
                Owner("comm", rt.rank, comm.group, charge.phase),
                charge.num_bytes,
                time_s=now,
                op=op,
                nccl=True,
            )
            self.record(now, rt.rank, "alloc", ledger.device, comm.group, charge.phase, charge.num_bytes)
            if group is not None:
                if member is None:  # looked up at the first real charge, as the record is created only then
                    record = self.group_record(group, comm)
                    member = record.members.setdefault(rt.rank, {"device": ledger.device, "bytes": 0, "phases": {}})
                member["bytes"] += charge.num_bytes
                member["phases"].setdefault(charge.phase, now)

    def release_comm(self, rt: RankRuntime, comm: Comm, op: Op) -> None:
        """Free what this rank's part of a destroyed communicator (and its p2p pair communicators) holds."""
        if comm.device is None:
            return
        ledger = self.ledger(rt, comm.device)
        for owner in [
            o
            for o in ledger.by_owner
            if o.rank == rt.rank
            and o.kind == "comm"
            and (o.group == comm.group or o.group.startswith(comm.group + "/p2p-"))
        ]:
            ledger.release_owner(owner, time_s=self.env.now, op=op)

    def group_record(self, group: Group, comm: Comm) -> GroupRecord:
        cached = self._record_of_group.get(id(group))
        if cached is not None and cached[0] is group:
            return cached[1]
        key = (group.name, self._ranks_key(group.ranks))
        record = self.group_records.get(key)
        if record is None:
            record = GroupRecord(group.name, group.desc, group.ranks, comm.impl.value, comm.via_split)
            self.group_records[key] = record
        # A group's name and members never change and records are never replaced: remember its record.
        self._record_of_group[id(group)] = (group, record)
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
        if index < 0 or index >= self.cluster.device_count:
            raise TorchError("torch.AcceleratorError", "CUDA error: invalid device ordinal")
        rt.current_device = index
        self.touch(rt, index, op)

    def op_alloc(self, rt: RankRuntime, op: Alloc) -> Waiting:
        yield from self.rendezvous.settle(rt)
        ledger = self.touch(rt, current_device(rt), op)
        ledger.allocate(Owner("torch", rt.rank, phase=op.tag), mib_bytes(op.mib), time_s=self.env.now, op=op)
        self.record(self.env.now, rt.rank, "torch-alloc", ledger.device, op.mib)

    def op_free(self, rt: RankRuntime, op: Free) -> Waiting:
        yield from self.rendezvous.settle(rt)
        ledger = self.ledger(rt, current_device(rt))
        freed = ledger.release(Owner("torch", rt.rank, phase=op.tag), mib_bytes(op.mib), time_s=self.env.now, op=op)
        self.record(self.env.now, rt.rank, "torch-free", ledger.device, freed / (1024 * 1024))

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

    def op_checkpoint(self, rt: RankRuntime, op: Checkpoint) -> Waiting:
        yield from self.rendezvous.settle(rt)
        index = rt.current_device
        if index is None and rt.world is not None:
            index = rt.world.bound_device
        self.record(self.env.now, rt.rank, "checkpoint", op.label)
        per_device = self.checkpoints.setdefault(op.label, {})
        if index is None:
            return
        ledger = self.ledger(rt, index)
        per_device[ledger.device] = Snapshot(ledger.device, ledger.used_bytes, ledger.free_bytes, self.env.now, rt.rank)

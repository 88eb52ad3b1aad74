"""The nouns every room shares: a rank's runtime state, what a run returns, and how a rank stops.

Why one module: each room reads and moves a rank's state (its program counter, handles, groups, status), and
the rank loop turns the exceptions below into a rank's end; keeping them here lets every room import them
without importing another room.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import simpy

from simnccl.backends.gloo import PEER_CLOSED, barrier_race
from simnccl.c10d import Group, ProcessContext, TorchError
from simnccl.faults import Fault
from simnccl.flight_recorder import FlightRecorder
from simnccl.meetings import Meeting
from simnccl.memory import DeviceLedger
from simnccl.ops import WORLD, Op, Program
from simnccl.policy import History
from simnccl.watchdog import TimeoutAction

if TYPE_CHECKING:
    from simnccl.engine.fast.histories import HistoryNode, TailEntry

Waiting = Generator[simpy.Event, Any, None]


@dataclass(slots=True)
class Block:
    """Where a rank waits: the op (at ``pc``), the meeting, since when. Made at every wait, read only by a hang
    report, so the program's handle for the group is worked out when read."""

    op: Op
    pc: int
    meeting: Meeting
    since_s: float

    @property
    def handle(self) -> str:
        return handle_of(self.op)


@dataclass(slots=True)
class RankRuntime:
    """One process: its program counter, groups, handles, device and status."""

    rank: int
    program: Program
    ctx: ProcessContext
    node: int
    pc: int = 0
    status: str = "running"
    current_device: int | None = None
    contexts: set[int] = field(default_factory=set)
    world: Group | None = None
    handles: dict[str, Group | int] = field(default_factory=dict)
    counter: int = 1
    # How many default groups this rank destroyed: which incarnation its bootstraps belong to. Why: a re-init
    # reuses the destroyed incarnation's group names (destroy resets the counter), and whether its store still
    # holds their keys depends on the launcher (``ReinitStore.stale_writer``).
    incarnation: int = 0
    # When this rank last destroyed its default group (None: never). Why: under spawn rank 0 hosts the store and
    # its destroy drops it, so a peer re-initialising at that very instant races the drop
    # (``ReinitStore.spawn_reinit``).
    world_destroyed_at: float | None = None
    # Under spawn, a re-init before rank 0 destroyed the default group connects to rank 0's old store, for good
    # (``ReinitStore.spawn_reinit``): when this incarnation's init did so, or None.
    on_old_store: float | None = None
    # The incarnations whose default group this rank destroyed while it held a subgroup of it: under spawn rank 0's
    # store lives on in that subgroup's prefix store (``ReinitStore._kept_incarnations``). A tuple: one shared
    # empty one for the 131,072 ranks that never re-initialise.
    stores_kept: tuple[int, ...] = ()
    groups: list[Group] = field(default_factory=list)
    block: Block | None = None
    pending: list[tuple[Meeting, int]] = field(default_factory=list)
    error: TorchError | None = None
    error_op: str = ""
    error_kind: str = ""
    nccl_devices: set[int] = field(default_factory=set)
    history: History = field(default_factory=History)
    history_shared: bool = False
    # Owned by the fast paths (``engine/fast``): calls taken on shared decisions and not yet recorded in
    # ``history`` (the rank's real history is ``history`` + these); ``hnode`` is the shared state it is in
    # (None: not tracked); two per-rank caches of the outsider path.
    history_tail: list[TailEntry] = field(default_factory=list)
    hnode: HistoryNode | None = None
    policy_class: tuple[Any, ...] | None = None  # (ctx, world, class) cache for SharedHistories.policy_class
    outsider_verdicts: tuple[Any, ...] | None = None  # cache for Outsiders.verdicts
    fr: FlightRecorder | None = None
    timed_out: bool = False
    unhealthy: bool = False
    timeout_hang: dict[str, Any] | None = None
    # The hang entry of a timeout torch turned into the rank's error (a gloo op on a destroyed group's handle:
    # ``RankLoop._fail``), kept with that error: what the rank waited for, and why
    replaced_timeout: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    finished_at: float | None = None

    def group_named(self, name: str) -> Group | None:
        """The latest group named ``name`` this rank made. Why the latest: a re-init of the default group reuses
        names (destroy resets the counter), and the newest group of a name is the one a wait belongs to."""
        for group in reversed(self.groups):
            if group.name == name:
                return group
        return None


@dataclass(frozen=True, slots=True)
class Snapshot:
    device: str
    used_bytes: int
    free_bytes: int
    time_s: float
    rank: int
    # per rank on the device: (bytes its communicators hold, communicators that allocated at init or as a
    # pair): so ``simnccl cost`` reads its NCCL rows at the same moment as the device's use
    comms_by_rank: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class GroupRecord:
    """One group as the world sees it: its members and what each member's communicators cost.

    ``members[rank]``: ``device``, ``bytes`` (device bytes charged), ``phases`` (when each phase was first
    paid) and ``memory``: {communicator name: ``simnccl.comm_memory.CommMemory``}, the itemised breakdown of
    each of the rank's communicators of the group, as it stands now (its NVLS multicast slots are
    ``RunOutcome.slots_charged``).
    """

    name: str
    desc: str
    ranks: tuple[int, ...]
    impl: str
    via_split: bool
    members: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True, weakref_slot=True)  # weakref: the replay's record of recent runs must not keep them
class RunOutcome:
    verdict: str
    ranks: list[RankRuntime]
    ledgers: dict[str, DeviceLedger]
    checkpoints: dict[str, dict[str, Snapshot]]  # label -> device -> its last measurement there
    groups: dict[tuple[str, tuple[int, ...]], GroupRecord]
    hangs: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    event_count: int
    trace_hash: str
    end_time_s: float
    ops_executed: int
    trace: list[tuple[Any, ...]]
    fr_dumps: dict[int, dict[str, Any]] = field(default_factory=dict)
    slowdowns: list[dict[str, Any]] = field(default_factory=list)  # what each straggler fault cost (Timing)
    faults_unacted: list[str] = field(default_factory=list)  # scheduled faults that never acted, with why
    # Store-write races the simulated timing decided one way, which no hang or error carries (``Sim.races``): on
    # real gloo the outcome may differ (real compare compares only the verdict, or nothing, there).
    races: list[str] = field(default_factory=list)
    meetings: list[Meeting] = field(default_factory=list)  # with keep_trace: every rendezvous (Perfetto trace waits)
    # Pinned host memory NCCL holds, per node ("n0:host"): work FIFOs, host sides of connections, network
    # buffers without GPUDirect RDMA (simnccl.comm_memory; never in the device ledgers). Each is a HostLedger:
    # what each owner holds, the total and the peak, and no timeline (nothing reads one).
    host_ledgers: dict[str, DeviceLedger] = field(default_factory=dict)
    # NVLS multicast slots, as the per-node multicast ledger (simnccl.engine.nvls) charged them: held on each
    # node at the end ("n0": 20), and per (rank, communicator name) what that communicator took at its init (a
    # communicator that took none is absent: read ``slots_charged.get((rank, name), 0)``).
    multicast_slots: dict[str, int] = field(default_factory=dict)
    repeated_checkpoints: set[str] = field(default_factory=set)  # labels some rank met more than once
    slots_charged: dict[tuple[int, str], int] = field(default_factory=dict)


# ---------------------------------------------------------------------- a rank's state, read the same everywhere


def require_world(rt: RankRuntime) -> Group:
    if rt.world is None:
        raise TorchError(
            "ValueError",
            "Default process group has not been initialized, please make sure to call init_process_group.",
        )
    return rt.world


# torch 2.15's ``_get_default_group`` where no default group exists (distributed_c10d.py): what an op on the
# default group raises before ``init_process_group`` or after ``destroy_process_group()``.
# The statuses a rank ends in: its process returned (``Sim.ended`` counts the ranks that reached one).
ENDED_STATUSES = ("done", "error", "aborted")

DEFAULT_GROUP_MISSING = "Default process group has not been initialized, please make sure to call init_process_group."
# get_backend's error for a group torch no longer knows (l.2212-2215); the real text names the group's repr.
UNREGISTERED_GROUP = (
    "Process group <torch.distributed.distributed_c10d.ProcessGroup object> is not initialized in the world group "
    "map. Please initialize the group first."
)
# get_group_rank's error for a group torch no longer knows (l.1846-1849): a reduce's root after the world's destroy.
GROUP_NOT_REGISTERED = (
    "Group <torch.distributed.distributed_c10d.ProcessGroup object> is not registered, please create group with "
    "torch.distributed.new_group API"
)
# torch 2.15's ``destroy_process_group()`` where no default group exists (before init, or a second destroy): its
# check that the group it would destroy, ``GroupMember.WORLD``, is not None.
NO_GROUP_TO_DESTROY = "Process group cannot be None"


def resolve(rt: RankRuntime, handle: str) -> Group | int:
    """The group a program handle names on this rank (or NON_GROUP_MEMBER)."""
    try:
        target = rt.handles[handle]
    except KeyError:
        if handle == WORLD:  # torch's default group (``group=None``): none before init, none after its destroy
            raise TorchError("ValueError", DEFAULT_GROUP_MISSING) from None
        raise TorchError("NameError", f"group handle {handle!r} was never bound on rank {rt.rank}") from None
    if isinstance(target, Group) and target.destroyed:
        raise TorchError("ValueError", "Invalid process group specified")
    return target


def current_device(rt: RankRuntime) -> int:
    return 0 if rt.current_device is None else rt.current_device


def measured_device(rt: RankRuntime) -> int:
    """The device a rank's memory is read on (a checkpoint, ``simnccl cost``): the one it set, else its default
    group's bound device, else CUDA's current device of a process that never set one, 0 (where its allocations
    went: ``current_device``). Why not "none": a legacy or gloo rank that never called set_device recorded no
    device, and a memory expectation, ``used_mib`` and a sweep's cap read nothing: 60 GB on cuda:0 said ok."""
    if rt.current_device is not None:
        return rt.current_device
    if rt.world is not None and rt.world.bound_device is not None:
        return rt.world.bound_device
    return 0


def device_name(rt: RankRuntime, index: int) -> str:
    """The name a device's ledger goes by in an outcome ("n0:cuda:1"): node, then the index on it."""
    return f"n{rt.node}:cuda:{index}"


def handle_of(op: Op) -> str:
    """The program's name for the group an op concerns: the handle it binds or the one it uses."""
    return getattr(op, "bind", None) or getattr(op, "group", None) or ""


def ranks_digest(ranks: tuple[int, ...]) -> tuple[int, int, int]:
    """A cheap, deterministic stand-in for a member list in the trace (repr of a 16k-rank tuple per member
    would make tracing quadratic); the group's name is recorded beside it."""
    return len(ranks), ranks[0], ranks[-1]


def fire_once(event: simpy.Event) -> None:
    """Succeed an event unless something (an abort) already did."""
    if not event.triggered:
        event.succeed()


# ---------------------------------------------------------------------- how a rank stops (the rank loop catches)


class Crash(TorchError):
    """An injected process death (or, with ``stall``, a process that stops issuing ops)."""

    def __init__(self, fault: Fault, stall: bool = False) -> None:
        super().__init__("Crash", f"injected fault: {fault.describe()}")
        self.fault = fault
        self.stall = stall


class AsyncError(TorchError):
    def __init__(self, action: TimeoutAction) -> None:
        super().__init__(action.error_type or "DistBackendError", action.message)
        self.action = action


class ProcessAbort(TorchError):
    """The process dies of a signal (its type name): SIGABRT for torch's and gloo's aborts, SIGSEGV for a crash."""

    def __init__(self, message: str, signal: str = "SIGABRT") -> None:
        super().__init__(signal, message)


class PeerLost(TorchError):
    """A gloo operation towards a peer whose sockets are closed (it destroyed its groups, or died)."""

    def __init__(self, peer: int, op_name: str = "") -> None:
        super().__init__("RuntimeError", PEER_CLOSED.format(peer=peer) + barrier_race(op_name))

"""Communicator lifecycle: creating a group's communicators from its plan, bootstrapping them over the store,
splitting them from a parent, their identities, and destroying them.

Why a room: what a communicator *is* at each step (lazy, bootstrapping, split, ready, destroyed) and which
meeting each step is, keyed the way torch/NCCL match it: a bootstrap is a members-only meeting under the
group's name (two groups under one name collide); a split is the next op in the parent communicator's
sequence, where non-members join with NOCOLOR without waiting (run-ahead). What a communicator costs at init
is priced and charged through ``Memory`` (a split child with its parent, which decides sharing); how long a
step takes comes from ``Timing``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from simnccl.backends import Comm, CommState, lifecycle
from simnccl.backends.gloo import LAZY_SPLIT_NEVER_CONNECTS, SINGLETON_RACE
from simnccl.c10d import CommPlan, Group, GroupPlan
from simnccl.engine.memory import Memory
from simnccl.engine.nvls import MulticastSlots
from simnccl.engine.reinit_store import (
    DROPPED_BY_DEATH,
    DROPPED_BY_DESTROY,
    STORE_GONE_SPLIT,
    ReinitStore,
    bootstrap_key,
    store_name,
)
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.shared_gpus import SharedGpus
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import ProcessAbort, RankRuntime, Waiting, current_device
from simnccl.engine.store_collisions import CrossWiring, LateColliders, late_singleton_race, mark_complete_collision
from simnccl.engine.timing import Timing
from simnccl.meetings import Arrival, Meeting
from simnccl.ops import Op, SplitGroup
from simnccl.release import CUDAMALLOCASYNC_TRACKER, Impl
from simnccl.watchdog import TimeoutAction

# A legacy parent that passed ``isInitialized()`` on send/recv pair communicators alone has no communicator under the
# device key: 2.15's ``performNocolorSplit`` logs this (its own text) and calls ``NCCLComm::split`` on the null
# pointer, whose first act reads ``source->rank_`` (libtorch_cuda.so 2.15, disassembled: the null check only logs).
NOCOLOR_WITHOUT_PARENT = (
    "No parent communicator exists for nocolor split\n"
    "Segmentation fault: legacy ProcessGroupNCCL's performNocolorSplit called NCCLComm::split on a null parent "
    "communicator (this rank's only communicators of the parent group are send/recv pair communicators)"
)

# nccl-lazy names a pair communicator '<group>/p2p-<lo>-<hi>-<n>' of the pair's group ranks, n from
# LazyBackend::nextPairAttempt: one counter per process, keyed by those two group ranks alone, for every group.
LAZY_PAIR_ATTEMPTS = (
    "ranks {publisher} and {reader} name their nccl-lazy pair communicator differently, so they bootstrap under "
    "different store prefixes and never meet: rank {publisher} (pair rank 0, which publishes the unique id) "
    "'{name}/p2p-{glo}-{ghi}-{first}', rank {reader} (pair rank 1, which reads it) '{name}/p2p-{glo}-{ghi}-{second}'. "
    "The last number is LazyBackend::nextPairAttempt, a counter of the process keyed only by the pair's group ranks "
    "({glo}, {ghi}) and shared by every nccl-lazy group, never reset (not even by destroy_process_group): rank "
    "{publisher} made {first} pair communicator(s) for group ranks {glo} and {ghi} in other groups before this "
    "one, rank {reader} made {second}. Both processes must have made as many nccl-lazy pair communicators for "
    "these group ranks before this one"
)


def unique_id_stage(meeting: Meeting, rank: int, impl: Impl) -> str | None:
    """Where a member of an NCCL group's bootstrap that has not completed is, as torch 2.15 runs it: "store" (it
    still waits for the unique id there) or "init" (inside ``ncclCommInitRank``, waiting for the other members).

    Why: the bootstrap is one meeting, but its members are not in one place. Group rank 0 writes the unique id
    and never reads the store (legacy) or finds its own key at once (nccl2); the others read it once rank 0 wrote
    it. So only the members that never got the id (rank 0 not there yet, or their own store faulted) can time
    out in the store; the rest block in init. None: not an NCCL unique-id exchange modelled so (gloo's, or a key
    collision, whose members wait as before).

    A send/recv pair communicator's bootstrap (``"pair"``, legacy and nccl-lazy only: both NCCL) is the same
    exchange between two: its pair rank 0, ``expected[0]``, publishes and the other reads."""
    tag = meeting.key[0]
    if tag == "store-fault":
        faulted = True
    elif tag in ("bootstrap", "pair") and meeting.problem is None:
        faulted = False
    else:
        return None
    if tag != "pair" and not meeting.key[-1]:  # the key's last element: whether the communicator is an NCCL one
        return None
    root = meeting.expected[0]
    if rank == root:  # legacy's rank 0 only writes the id: a store that never answers leaves it in init
        return "store" if faulted and impl is not Impl.LEGACY else "init"
    return "store" if faulted or root not in meeting.arrivals else "init"


def bootstrap_group(meeting: Meeting) -> str:
    """The name of the group whose communicator a bootstrap meeting makes: a pair communicator's meeting is named
    after the pair (``<group>/p2p-<lo>-<hi>-<attempt>``, as nccl-lazy names it) and belongs to the group in its
    key. Why: the watchdog and the hang report find the group (its timeouts, its implementation) by this name."""
    return meeting.key[1] if meeting.key[0] == "pair" else meeting.group


def pair_in_group(meeting: Meeting, group_ranks: tuple[int, ...]) -> tuple[int, int, int] | None:
    """A pair communicator's bootstrap as torch names it: its two *group* ranks, lower first, and its attempt
    (None for any other meeting). Why: torch keys the pair by group ranks (legacy's ``getKeySendRecv``
    ``"lo:hi"``, nccl-lazy's ``p2p-lo-hi-N``); the meeting is keyed by global ranks."""
    if meeting.key[0] != "pair":
        return None
    _tag, _group, lo, hi, attempt = meeting.key[:5]  # a re-init's nccl-lazy key adds its incarnation
    a, b = sorted((group_ranks.index(lo), group_ranks.index(hi)))
    return a, b, attempt


class CommRegistry:
    """Communicator identities (what an ncclUniqueId names) and each one's members."""

    def __init__(self) -> None:
        self._next_id = 1
        self._meeting_ids: dict[int, int] = {}
        self.members: dict[int, tuple[int, ...]] = {}

    def new_id(self) -> int:
        comm_id = self._next_id
        self._next_id += 1
        return comm_id

    def id_for(self, meeting: Meeting) -> int:
        """The identity every member of a completed bootstrap shares (its ncclUniqueId)."""
        cid = self._meeting_ids.get(id(meeting))
        if cid is None:
            cid = self.new_id()
            self._meeting_ids[id(meeting)] = cid
        return cid


class Comms:
    def __init__(
        self,
        sim: Sim,
        rendezvous: Rendezvous,
        timing: Timing,
        memory: Memory,
        sockets: GlooSockets,
        registry: CommRegistry,
    ) -> None:
        self.sim = sim
        self.env = sim.env
        self.release = sim.release
        self.record = sim.trace.record
        self.rendezvous = rendezvous
        self.timing = timing
        self.memory = memory
        self.sockets = sockets
        self.registry = registry
        self.nvls = MulticastSlots(sim)  # NVLS multicast slots per node, bound at init, freed at destroy
        self.cross_wiring = CrossWiring(registry.members, sim)  # gloo bootstraps two groups joined by group rank
        self._split_results: dict[int, dict[tuple[int, ...], int | Meeting]] = {}
        self._store_timeout: set[tuple[int, int | None]] = set()  # (rank, op index or None: the next bootstrap)
        self.reinit = ReinitStore(sim, rendezvous)  # what a re-init finds in the store (a destroyed incarnation's)
        self.late_colliders = LateColliders(sim)  # gloo groups bootstrapping under a name another completed
        self.shared_gpus = SharedGpus(sim.profile.nccl_version)  # two members of a communicator on one GPU
        # (id(lazy gloo bootstrap meeting), rank) -> the first sends/recvs waiting for that rank's address
        self._address_waits: dict[tuple[int, int], list[simpy.Event]] = {}
        self._lazy_pairs: set[tuple[int, int, int]] = set()  # (id(meeting), rank, peer) connected by a send/recv

    def fail_store(self, rank: int, at_op: int | None) -> None:
        """Arm a ``store-timeout`` fault: that bootstrap of this rank never gets the unique id."""
        self._store_timeout.add((rank, at_op))

    def store_fault_armed(self, rank: int, at_op: int | None) -> bool:
        """Whether this ``store-timeout`` fault is still waiting for its bootstrap (it never acted)."""
        return (rank, at_op) in self._store_timeout

    # ---------------------------------------------------------------- creation and bootstrap

    def create(self, rt: RankRuntime, group: Group, plan: GroupPlan, op: Op) -> Waiting:
        """The group's communicators as planned: split now, bootstrap now (eager), or at first use (lazy)."""
        for comm_plan in plan.comms:
            comm = self.attach(group, plan, comm_plan)
            if comm_plan.split_from is not None:
                yield from self._member_split(rt, group, comm, comm_plan, op)
            elif comm_plan.eager:
                yield from self.init(rt, group, comm, op)
            elif comm.impl is Impl.GLOO:  # TORCH_GLOO_LAZY_INIT: the address now, the connections at first use
                yield from self.publish(rt, group, comm, op)

    def attach(self, group: Group, plan: GroupPlan, comm_plan: CommPlan) -> Comm:
        """A new communicator of the group, as planned, serving the device types of its backend pair."""
        comm = Comm(
            impl=comm_plan.pair.impl,
            group=group.name,
            size=group.size,
            device=comm_plan.device,
            lazy_init=comm_plan.lazy_init,
            via_split=comm_plan.split_from is not None,
            shared=comm_plan.shared,
            parent=comm_plan.split_from,
        )
        for pair in plan.backend.pairs:
            if pair.name == comm_plan.pair.name:
                group.comms[pair.device_type] = comm
        self.memory.group_record(group, comm)
        self.nvls.note_parent(comm, comm_plan.split_from)
        return comm

    def abort_if_cudamallocasync(self, rt: RankRuntime, comm: Comm) -> None:
        """2.15 defect (#203322): every nccl2 communicator registers an allocator hook cudaMallocAsync rejects."""
        if comm.impl not in (Impl.NCCL2, Impl.NCCL_LAZY) or not self.release.cudamallocasync_aborts:
            return
        conf = rt.ctx.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "backend:cudaMallocAsync" in conf.replace(" ", ""):
            raise ProcessAbort(
                "terminate called after throwing an instance of 'c10::Error'\n  what():  " + CUDAMALLOCASYNC_TRACKER
            )

    def init(self, rt: RankRuntime, group: Group, comm: Comm, op: Op) -> Waiting:
        """Bootstrap a communicator over the store: a members-only meeting keyed by the group's name. A lazy gloo
        communicator's member published its address when the group was made (``publish``): its first use waits
        for the others' there."""
        published = comm.published
        if published is not None:
            comm.published = None
            yield from self._finish_bootstrap(rt, group, comm, op, published)
            return
        life = lifecycle(comm.impl)
        if comm.impl is Impl.GLOO:
            self.sockets.used = True
        self._touch_device(rt, comm, op)
        if life.communicates and group.size > 1:
            meeting = yield from self._arrive_bootstrap(rt, group, comm, op)
            yield from self._finish_bootstrap(rt, group, comm, op, meeting)
            return
        if comm.impl is Impl.GLOO:
            self._gloo_singleton(rt, group, op)
        comm.comm_id = self.registry.new_id()
        self._ready(rt, group, comm, op)

    def publish(self, rt: RankRuntime, group: Group, comm: Comm, op: Op) -> Waiting:
        """A lazy gloo communicator (``TORCH_GLOO_LAZY_INIT``) made: the member writes its address to the store and
        goes on; its first collective waits for the other members' (``init``), a send/recv for its peer's only
        (``connect_lazy_pair``). Measured (torch 2.15 CPU, 3 ranks): ``new_group`` returns in milliseconds; a group
        a rank never makes passes if unused, and its first all_reduce raises the store's wait timeout after the
        group's timeout, naming the missing rank's key, as the eager bootstrap does in ``new_group``. A split child
        publishes on a meeting of its own that never completes (``LAZY_SPLIT_NEVER_CONNECTS``)."""
        self.sockets.used = True
        if group.size > 1 and isinstance(op, SplitGroup):  # a meeting of its own, which its problem keeps open
            meeting = self.rendezvous.open(
                ("gloo-lazy-split", group.name, rt.rank, rt.incarnation), "bootstrap", group.name, 0, group.ranks
            )
            meeting.problem = LAZY_SPLIT_NEVER_CONNECTS
            self.rendezvous.arrive(meeting, rt, group.ranks, op, duration=self.timing.gloo_bootstrap_s)
            comm.published = meeting
            return
        if group.size > 1:
            comm.published = yield from self._arrive_bootstrap(rt, group, comm, op)
            return
        self._gloo_singleton(rt, group, op)
        comm.comm_id = self.registry.new_id()
        self._ready(rt, group, comm, op)

    def connect_lazy_pair(self, rt: RankRuntime, group: Group, comm: Comm, op: Op, peer: int) -> Waiting:
        """A send's or recv's use of a lazy gloo communicator (``TORCH_GLOO_LAZY_INIT``) not connected yet: gloo's
        lazy context connects the pair alone, with the peer's address, so the rank waits for the peer to have made
        the group, not for every member (``init``: a collective's first use). Measured (torch 2.15 CPU, 3 ranks,
        ``/tmp`` experiment): ranks 0 and 1 make a group of [0, 1, 2] that rank 2 never makes and send/recv on it:
        both complete; the simulator had them wait for rank 2 until the timeout. The communicator stays
        unconnected: its first collective still waits for every member's address.

        Where the bootstrap met a problem or another group by group rank (a store-key collision, ``cross_wiring``),
        or is complete, the whole bootstrap is finished as before."""
        meeting = comm.published
        assert meeting is not None
        if meeting.complete or meeting.problem is not None or self.cross_wiring.joined(meeting):
            yield from self.init(rt, group, comm, op)
            return
        if peer not in meeting.arrivals:
            address = self.env.event()
            self._address_waits.setdefault((id(meeting), peer), []).append(address)
            yield from self.rendezvous.wait(rt, meeting, op, own=address)
        comm.comm_id = self.registry.id_for(meeting)  # the pair's channel: both ends name the same meeting
        pair = (id(meeting), rt.rank, peer)
        if pair not in self._lazy_pairs:  # one peer's connection, at gloo's measured pace (``gloo_bootstrap_s``)
            self._lazy_pairs.add(pair)
            yield self.env.timeout(self.timing.figures.gloo_bootstrap_per_peer_s)

    def _arrive_bootstrap(self, rt: RankRuntime, group: Group, comm: Comm, op: Op) -> Generator[Any, Any, Meeting]:
        """This member's arrival at its communicator's bootstrap meeting (what it writes to the store)."""
        key = bootstrap_key(store_name(group), comm.impl.is_nccl, rt.incarnation)
        meeting = self.rendezvous.open(key, "bootstrap", group.name, 0, group.ranks)
        if rt.rank in meeting.arrivals or meeting.complete:
            earlier, meeting = meeting, self._collision(meeting, rt, group, op)
            if comm.impl is Impl.GLOO:
                self.late_colliders.arrive(earlier, rt.rank, group.ranks, meeting)
        armed = (rt.rank, rt.pc) if (rt.rank, rt.pc) in self._store_timeout else (rt.rank, None)
        if armed in self._store_timeout:
            self._store_timeout.discard(armed)
            key = ("store-fault", rt.rank, group.name, comm.impl.is_nccl)
            meeting = self.rendezvous.open(key, "bootstrap", group.name, 0, group.ranks)
            meeting.problem = "injected fault: store-timeout — this rank's store never returns the unique id"
        elif rt.incarnation and meeting.problem is None:
            stale = self.reinit.stale_writer(rt, group, comm.impl.is_nccl)
            if stale is not None:
                yield from self.reinit.read_stale(rt, group, comm, meeting, stale)
            self.reinit.refuse_on_old_store(rt, group.name)
        if meeting.problem is None and (gone := self.reinit.store_gone(rt, group.name)) is not None:
            if not isinstance(op, SplitGroup):
                raise gone
            meeting = self._store_gone_split(meeting, rt, group, gone.message)
        payload = group.ranks  # or, gloo, the first group's: one that another joins by group rank
        self.note_device(meeting, rt, comm)
        if comm.impl is Impl.GLOO and meeting.problem is None and meeting.arrivals:
            payload = self.cross_wiring.payload(meeting, rt.rank, group.ranks)
        gloo = comm.impl is Impl.GLOO
        duration = self.timing.gloo_bootstrap_s if gloo else self.timing.bootstrap_s
        self.rendezvous.arrive(meeting, rt, payload, op, duration=duration)
        if comm.impl is Impl.GLOO:
            mark_complete_collision(meeting)
            for address in self._address_waits.pop((id(meeting), rt.rank), ()):  # pairs waiting for this address
                if not address.triggered:
                    address.succeed()
        return meeting

    def _finish_bootstrap(self, rt: RankRuntime, group: Group, comm: Comm, op: Op, meeting: Meeting) -> Waiting:
        """The member waits for its bootstrap meeting (``_arrive_bootstrap``) to complete, then the communicator is
        ready on it."""
        gloo = comm.impl is Impl.GLOO
        yield from self.rendezvous.wait(rt, meeting, op)
        if gloo:  # a connection near the timeout: the real host decides (``Timing.gloo_bootstrap_deadline``)
            self.timing.note_gloo_bootstrap_margin(meeting, group.timeout_s)
        comm.comm_id = self.registry.id_for(meeting)
        if gloo and self.cross_wiring.joined(meeting):
            self._ready(rt, group, comm, op)  # then its members are the ranks that met, not this group's
            self.cross_wiring.connect(meeting, rt.rank, group.name, comm.comm_id)
            return
        self._ready(rt, group, comm, op, meeting.devices)

    def drop_store(self, host: RankRuntime, *, died: bool = False) -> None:
        """Rank 0 (``host``) destroys its default group holding no subgroup of it, or dies (``died``), under spawn:
        the store it hosted is gone (``ReinitStore.store_dropped``; with the process, every incarnation's it kept),
        and the ranks on it waiting in a bootstrap fail now, as their TCPStore wait does (a gloo member, or an NCCL
        one still waiting for the unique id)."""
        if self.sim.config.launcher != "spawn" or host.rank != 0:
            return
        dropped = {host.incarnation, *host.stores_kept} if died else {host.incarnation}
        for incarnation in dropped:
            self.reinit.store_dropped(incarnation, DROPPED_BY_DEATH if died else DROPPED_BY_DESTROY)
        for rt in self.sim.ranks[1:]:
            block = rt.block
            if rt.incarnation not in dropped or rt.status != "blocked" or block is None or rt.timed_out:
                continue
            meeting = block.meeting
            if meeting.kind != "bootstrap" or meeting.complete:
                continue
            group = rt.group_named(bootstrap_group(meeting))
            comm = None if group is None else group.comm_for(self.sim.device_type)
            if comm is None or not (comm.impl is Impl.GLOO or unique_id_stage(meeting, rt.rank, comm.impl) == "store"):
                continue
            gone = self.reinit.store_gone(rt, bootstrap_group(meeting), waiting=True)
            if gone is not None and isinstance(block.op, SplitGroup):
                meeting.problem = meeting.problem or STORE_GONE_SPLIT.format(gone=gone.message)
            elif gone is not None:
                self.sim.procs[rt.rank].interrupt(
                    TimeoutAction("raise", False, 0.0, gone.type_name, gone.message, False, kind="peer-lost")
                )

    def _store_gone_split(self, meeting: Meeting, rt: RankRuntime, group: Group, gone: str) -> Meeting:
        """A split's bootstrap through a store rank 0 dropped (``ReinitStore.store_gone``): a wait that never ends
        (real gloo's split_group hangs there, where new_group's raises), explained."""
        stuck = self.rendezvous.open(("store-gone", *meeting.key, rt.rank), "bootstrap", group.name, 0, group.ranks)
        stuck.problem = STORE_GONE_SPLIT.format(gone=gone)
        return stuck

    def _touch_device(self, rt: RankRuntime, comm: Comm, op: Op) -> None:
        """An NCCL communicator's init binds it to the rank's current device, whose first touch creates the CUDA
        context (other backends use no device)."""
        if not comm.impl.is_nccl:
            return
        if comm.device is None:
            comm.device = current_device(rt)
        if comm.device is not None:
            self.memory.touch(rt, comm.device, op)

    def _ready(self, rt: RankRuntime, group: Group, comm: Comm, op: Op, devices: dict[int, str] | None = None) -> None:
        """What follows a communicator's init on one member, once it has its identity. ``devices``: each member's
        GPU, where its bootstrap exchanged them (an NCCL communicator of two or more members)."""
        assert comm.comm_id is not None
        self.registry.members[comm.comm_id] = group.ranks
        if devices is not None and self.memory.gpus_shared:
            self.refuse_shared_gpu(rt, group.ranks, devices, comm)
        self.abort_if_cudamallocasync(rt, comm)
        self.nvls.reserve(rt, comm, group, self.registry.members)
        comm.state = CommState.READY
        self.memory.init_comm(rt, comm, group, op)

    def note_device(self, meeting: Meeting, rt: RankRuntime, comm: Comm) -> None:
        """An NCCL member arriving at its bootstrap brings its GPU (NCCL's peer info carries its bus id); other
        backends' bootstraps carry none."""
        if not comm.impl.is_nccl or comm.device is None:
            return
        devices = meeting.devices
        if devices is None:
            devices = meeting.devices = {}
        devices[rt.rank] = self.memory.ledger(rt, comm.device).device

    def refuse_shared_gpu(self, rt: RankRuntime, members: tuple[int, ...], devices: dict[int, str], comm: Comm) -> None:
        """Raise what NCCL's init raises on ``rt`` when members of ``comm`` share a GPU (``engine.shared_gpus``)."""
        error = self.shared_gpus.failure(rt.rank, members, devices, rt.ctx.env, comm.impl)
        if error is not None:
            raise error

    def can_bootstrap_together(self, plan: GroupPlan, incarnation: int) -> bool:
        """Whether a cohort block may take this member plan's bootstrap (``arrive_together``, then
        ``bootstrap_together``): one gloo or NCCL communicator of two or more ranks, under a name no bootstrap
        has used (a collision is the ordinary path's to report), in the first incarnation of the default group
        (a re-init's may read a destroyed incarnation's keys: ``ReinitStore.stale_writer``)."""
        if incarnation or len(plan.comms) != 1 or len(plan.ranks) < 2:
            return False
        comm_plan = plan.comms[0]
        impl = comm_plan.pair.impl
        if not comm_plan.eager or comm_plan.split_from is not None or not lifecycle(impl).communicates:
            return False
        if impl is not Impl.GLOO and not impl.is_nccl:
            return False
        return self.rendezvous.meetings.get(bootstrap_key(store_name(plan), impl.is_nccl, 0)) is None

    def arrive_together(self, rt: RankRuntime, group: Group, comm: Comm, op: Op) -> None:
        """One member's side of a block's bootstrap, at its own time (``init`` before it meets the others):
        gloo opens sockets; NCCL binds the device, whose first touch creates the CUDA context."""
        if comm.impl is Impl.GLOO:
            self.sockets.used = True
        self._touch_device(rt, comm, op)

    def bootstrap_together(self, joining: list[tuple[RankRuntime, Group, Comm, float]], op: Op) -> Meeting:
        """The members of a block's bootstrap that arrived (``arrive_together``), each at its own time: the
        meeting ``init`` makes them meet at, completed when every member is there. A member that failed before
        arriving leaves it incomplete, and the others wait there for it, as on the ordinary path."""
        first, comm = joining[0][1], joining[0][2]
        key = bootstrap_key(store_name(first), comm.impl.is_nccl, 0)  # a block takes the first incarnation's only
        meeting = self.rendezvous.open(key, "bootstrap", first.name, 0, first.ranks)
        for rt, group, member_comm, at in joining:
            meeting.arrivals[rt.rank] = Arrival(rt.rank, at, group.ranks, op)
            self.note_device(meeting, rt, member_comm)
        if len(meeting.arrivals) == len(meeting.expected):
            duration = self.timing.gloo_bootstrap_s if comm.impl is Impl.GLOO else self.timing.bootstrap_s
            self.rendezvous.complete(meeting, duration(meeting))
        return meeting

    def finish_together(self, rt: RankRuntime, group: Group, comm: Comm, meeting: Meeting, op: Op) -> None:
        """What ``init`` does for one member after its completed bootstrap meeting (``bootstrap_together``)."""
        if comm.impl is Impl.GLOO:
            self.timing.note_gloo_bootstrap_margin(meeting, group.timeout_s)
        comm.comm_id = self.registry.id_for(meeting)
        self._ready(rt, group, comm, op, meeting.devices)

    @staticmethod
    def creates_alone(plan: GroupPlan, comm_plan: CommPlan) -> bool:
        """Whether a cohort block may create this eager communicator on its member alone (``init_alone``), as
        ``init`` does without a meeting: a fake backend's (a policy's fake singleton), or an NCCL one of a
        one-rank group."""
        if not comm_plan.eager or comm_plan.split_from is not None:
            return False
        impl = comm_plan.pair.impl
        return impl is Impl.FAKE or (impl.is_nccl and len(plan.ranks) == 1)

    def init_alone(self, rt: RankRuntime, group: Group, comm: Comm, op: Op) -> None:
        """``init`` for a communicator ``creates_alone`` allows: its device touched, a fresh identity."""
        assert not (lifecycle(comm.impl).communicates and group.size > 1) and comm.impl is not Impl.GLOO
        self._touch_device(rt, comm, op)
        comm.comm_id = self.registry.new_id()
        self._ready(rt, group, comm, op)

    def _gloo_singleton(self, rt: RankRuntime, group: Group, op: Op) -> None:
        """A one-rank ProcessGroupGloo still writes its address under the group's store prefix (measured: a
        ``new_group([0])`` adds one store key), though it waits for nobody. Under a name another group bootstraps
        with (diverged counters) the keys collide: record it, so both sides report the store-key race."""
        key = bootstrap_key(store_name(group), False, rt.incarnation)
        meeting = self.rendezvous.meetings.get(key)
        if meeting is None:
            meeting = self.rendezvous.open(key, "bootstrap", group.name, 0, group.ranks)
            meeting.arrivals[rt.rank] = Arrival(rt.rank, self.env.now, group.ranks, op)
            meeting.completed_at = self.env.now  # a later bootstrapper under this name collides with it
            meeting.result.succeed()
            return
        if not meeting.complete and meeting.problem is None and meeting.arrivals:
            first = next(iter(meeting.arrivals.values()))
            meeting.problem = (
                f"store key collision under group name {group.name!r}: ranks {list(meeting.arrivals)} bootstrap "
                f"ranks {list(first.payload)}, rank {rt.rank} wrote its one-rank group's key under that name; "
                f"{SINGLETON_RACE}"
            )
            self.record(self.env.now, rt.rank, "collision", group.name)
        elif (race := late_singleton_race(meeting, rt.rank, group.ranks, group.name, self.env.now)) is not None:
            self.sim.races.append(race)
            self.record(self.env.now, rt.rank, "collision-late", group.name)

    def _collision(self, meeting: Meeting, rt: RankRuntime, group: Group, op: Op) -> Meeting:
        """A second bootstrap under a name already used: a meeting that can never complete, explained."""
        first = next(iter(meeting.arrivals.values()))
        stuck = self.rendezvous.open(("collision", *meeting.key, rt.rank), "bootstrap", group.name, 0, group.ranks)
        stuck.problem = (
            f"store key collision under group name {group.name!r}: ranks {list(meeting.arrivals)} already "
            f"bootstrapped ranks {list(first.payload)} under that name; rank {rt.rank} waits for a peer "
            f"that will never come"
        )
        if len(first.payload) == 1:
            stuck.problem += f"; {SINGLETON_RACE}"
        return stuck

    # ---------------------------------------------------------------- splits

    def _split_meeting(self, parent: Comm) -> Meeting:
        """The next op in the parent communicator's sequence: splits and collectives share it, as in NCCL."""
        parent.seq += 1
        parent.splits += 1
        assert parent.comm_id is not None
        members = self.registry.members[parent.comm_id]
        return self.rendezvous.open(("coll", parent.comm_id, parent.seq), "split", parent.group, parent.seq, members)

    def nocolor_split(self, rt: RankRuntime, parent: Comm, op: Op) -> Waiting | None:
        """A non-member's ``perform_nocolor_split``: joins the parent's split without waiting (run-ahead).

        Run-ahead is limited to consecutive splits of one parent, so a pending split always completes before
        a later one on the same parent, and the rank's real position is its earliest incomplete split.
        """
        if parent.comm_id is None:
            raise ProcessAbort(NOCOLOR_WITHOUT_PARENT, signal="SIGSEGV")
        if rt.pending and rt.pending[-1][0].key[1] != parent.comm_id:
            return self._settled_nocolor_split(rt, parent, op)
        meeting = self._split_meeting(parent)
        self.rendezvous.arrive(meeting, rt, ("split", None), op, duration=self.timing.split_s, run_ahead=True)
        if not (meeting.complete and meeting.completed_at <= self.env.now):
            rt.pending.append((meeting, rt.pc))
        return None

    def _settled_nocolor_split(self, rt: RankRuntime, parent: Comm, op: Op) -> Waiting:
        yield from self.rendezvous.settle(rt)
        self.nocolor_split(rt, parent, op)

    def _member_split(self, rt: RankRuntime, group: Group, comm: Comm, plan: CommPlan, op: Op) -> Waiting:
        parent = plan.split_from
        assert parent is not None
        if not lifecycle(parent.impl).communicates:
            comm.comm_id = self.registry.new_id()
            comm.state = CommState.READY
            return
        meeting = self._split_meeting(parent)
        self.rendezvous.arrive(meeting, rt, ("split", group.ranks), op, duration=self.timing.split_s)
        yield from self.rendezvous.wait(rt, meeting, op)
        colors = self._split_colors(meeting)
        child = colors.get(group.ranks)
        if isinstance(child, Meeting):
            yield from self.rendezvous.wait(rt, child, op)  # never completes: an incomplete color
        assert isinstance(child, int)
        self.split_child_ready(rt, group, comm, child, op)

    def split_child_ready(self, rt: RankRuntime, group: Group, comm: Comm, child: int, op: Op) -> None:
        """A member's child communicator of a completed split: its identity, then its init memory."""
        comm.comm_id = child
        self.registry.members[child] = group.ranks
        self.abort_if_cudamallocasync(rt, comm)
        self.nvls.reserve(rt, comm, group, self.registry.members)
        comm.state = CommState.READY
        parent = comm.parent
        parent_ranks = None if parent is None or parent.comm_id is None else self.registry.members.get(parent.comm_id)
        self.memory.init_comm(rt, comm, group, op, parent_ranks=parent_ranks)

    def _split_colors(self, meeting: Meeting) -> dict[tuple[int, ...], int | Meeting]:
        """Assign child communicators per color once; an incomplete color becomes a stuck meeting."""
        colors = self._split_results.get(id(meeting))
        if colors is not None:
            return colors
        colors = {}
        presenters: dict[tuple[int, ...], list[int]] = {}
        for rank in sorted(meeting.arrivals):
            color = meeting.arrivals[rank].payload[1]
            if color is not None:
                presenters.setdefault(color, []).append(rank)
        for color, ranks in presenters.items():
            if tuple(sorted(ranks)) == tuple(sorted(color)):
                colors[color] = self.registry.new_id()
            else:
                key = ("color", *meeting.key, color)
                stuck = self.rendezvous.open(key, "split-color", meeting.group, meeting.seq, color)
                for r in ranks:
                    stuck.arrivals[r] = meeting.arrivals[r]
                elsewhere = [
                    f"rank {r} issued {meeting.arrivals[r].op.describe()}"
                    for r in color
                    if r in meeting.arrivals and r not in ranks
                ]
                stuck.problem = (
                    f"split {meeting.seq} of the parent communicator: ranks {ranks} asked for group {list(color)} "
                    f"but " + ("; ".join(elsewhere) or "its other members were not in this split")
                )
                colors[color] = stuck
        self._split_results[id(meeting)] = colors
        return colors

    # ---------------------------------------------------------------- teardown

    def destroy(self, rt: RankRuntime, group: Group, op: Op) -> None:
        """Mark the group destroyed and free this rank's part of each of its communicators."""
        group.destroyed = True
        for comm in {id(c): c for c in group.comms.values()}.values():
            comm.state = CommState.DESTROYED
            self.memory.release_comm(rt, comm, op)
            self.nvls.release(rt, comm)

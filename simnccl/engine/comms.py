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

from collections.abc import Callable
from typing import Any

from simnccl.backends import Comm, CommState, lifecycle
from simnccl.backends.gloo import SINGLETON_RACE, STALE_ADDRESS
from simnccl.c10d import CommPlan, Group, GroupPlan, TorchError
from simnccl.engine.memory import Memory
from simnccl.engine.nvls import MulticastSlots
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.shared_gpus import SharedGpus
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import ProcessAbort, RankRuntime, Waiting, current_device
from simnccl.engine.store_collisions import CrossWiring, LateColliders, late_singleton_race, mark_complete_collision
from simnccl.engine.timing import Timing
from simnccl.meetings import Arrival, Meeting
from simnccl.ops import Op
from simnccl.release import CUDAMALLOCASYNC_TRACKER, Impl

# A legacy parent that passed ``isInitialized()`` on send/recv pair communicators alone has no communicator under the
# device key: 2.15's ``performNocolorSplit`` logs this (its own text) and calls ``NCCLComm::split`` on the null
# pointer, whose first act reads ``source->rank_`` (libtorch_cuda.so 2.15, disassembled: the null check only logs).
NOCOLOR_WITHOUT_PARENT = (
    "No parent communicator exists for nocolor split\n"
    "Segmentation fault: legacy ProcessGroupNCCL's performNocolorSplit called NCCLComm::split on a null parent "
    "communicator (this rank's only communicators of the parent group are send/recv pair communicators)"
)

# A re-init's bootstrap that reads the destroyed incarnation's value under its store key (``Comms.stale_writer``).
STALE_RACE = (
    "whether a re-initialised group reads the destroyed incarnation's value or its peer's new one depends on the "
    "order of the store writes: the outcome is racy (ranks that re-initialise in lockstep may pass)"
)
STALE_KEY = (
    "stale store key: destroy_process_group resets the group counter, so the re-initialised default group and "
    "its new groups reuse the destroyed incarnation's names, and {store} still holds the value rank {writer} "
    "wrote under group name {name!r} for the destroyed incarnation's bootstrap ({what}); " + STALE_RACE
)
STORE_KEPT = {
    "torchrun": "torchrun's agent store, which outlives destroy_process_group,",
    "spawn": "rank 0's store, up until rank 0 destroys its default group,",
}
# A re-init under spawn at the instant rank 0 destroyed the default group whose store it hosts (``spawn_reinit``).
# Measured on 2.15 gloo (mp.spawn-style, a TCP store rank 0 hosts per init, both ranks re-initialising at once,
# then a split_group and an all_reduce on it): rank 1 failed in 2 runs of 6 with "DistNetworkError: Failed to recv,
# got 0 bytes", having reached the old store; in 1 run of 8 more rank 0's new store timed out waiting for rank 1
# ("1/2 clients joined").
SPAWN_STORE_RACE = (
    "under spawn rank 0 hosts the store and its destroy drops it, so whether a rank re-initialising then reaches "
    "the old store (and fails) or the one rank 0 hosts next is decided by timing"
)
SPAWN_REINIT_AT_DESTROY = (
    "{ranks} re-initialised the default group at {now:g} s, the instant rank 0 destroyed it; " + SPAWN_STORE_RACE + " "
    "(measured on torch 2.15 gloo, a re-init then a split with no delay: rank 1 reached the old store in 3 runs of "
    "14, failing with 'DistNetworkError: Failed to recv, got 0 bytes' or leaving rank 0's new store waiting for it)"
)
# A bootstrap of a rank whose re-init under spawn connected to rank 0's old store (``spawn_reinit``) that finds
# no key of the destroyed incarnation to read.
ON_OLD_STORE = (
    "rank {rank} re-initialised the default group at {since:g} s, before rank 0 destroyed it: under spawn rank 0 "
    "hosts the store until its destroy, so this rank's store client connected to the old store, which rank 0's "
    "destroy drops (a TCPStore client's wait then fails: 'DistNetworkError: Failed to recv, got 0 bytes', "
    "measured), while rank 0's next store waits for this rank to connect. What this bootstrap of group {name!r} "
    "reads there is not modelled"
)
# NCCL's bootstrap root (bootstrap.cc ``bootstrapRoot``) closes its listening socket once every rank checked in,
# so a stale unique id names a port nobody listens on: ``sendToRoot``'s ``ncclSocketConnect`` (socket.cc) retries
# ECONNREFUSED RETRY_REFUSED_TIMES (2e4) times, SLEEP_INT (1 ms) apart, then fails with ncclRemoteError, which
# torch's NCCL check raises as a DistBackendError.
NCCL_REFUSED_RETRY_S = 2e4 * 1e-3
NCCL_STALE_ID = (
    "NCCL error in: ProcessGroupNCCL.cpp, remote process exited or there was a network error, NCCL version "
    "{version}\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
    "prematurely.\nLast error:\nsocketStartConnect: exceeded retries (20000)\n{stale}"
)
STALE_WHAT = {
    True: "a unique id naming the destroyed communicator's bootstrap root, which no longer listens",
    False: "its gloo address, whose listener is gone",
}
# Legacy ProcessGroupNCCL's unbound send/recv publishes its pair communicator's unique id under getKeySendRecv
# ("<lo>:<hi>" of group ranks), a key without any counter, so a re-init's pair reuses it whatever it did before.
STALE_PAIR_WHAT = (
    "the unique id of the send/recv pair communicator of group ranks {lo} and {hi}, under store key '{lo}:{hi}', "
    "naming the destroyed communicator's bootstrap root, which no longer listens"
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


def bootstrap_key(name: str, is_nccl: bool, incarnation: int) -> tuple[Any, ...]:
    """The meeting key of a bootstrap under group ``name`` in the rank's ``incarnation`` of the default group.
    Why the incarnation: a re-init reuses names (destroy resets the group counter) for a new bootstrap, not a
    collision with the destroyed one's; the first incarnation's key keeps its old shape, and the last element
    says whether the communicator is an NCCL one (``unique_id_stage``)."""
    return ("bootstrap", name, is_nccl) if incarnation == 0 else ("bootstrap", name, incarnation, is_nccl)


def store_name(group: Group | GroupPlan) -> str:
    """The name a group's bootstrap is keyed by in the store: its name under its store prefix (a split of a
    non-default group: the parent's, ``plan_split_group``), so two groups of one name under different parents do
    not collide."""
    return group.store_prefix + group.name


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
        self._spawn_ties: dict[float, tuple[int, list[int]]] = {}  # instant -> (its entry in sim.races, ranks)
        self.late_colliders = LateColliders(sim)  # gloo groups bootstrapping under a name another completed
        self.shared_gpus = SharedGpus(sim.profile.nccl_version)  # two members of a communicator on one GPU

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
        """Bootstrap a communicator over the store: a members-only meeting keyed by the group's name."""
        life = lifecycle(comm.impl)
        if comm.impl is Impl.GLOO:
            self.sockets.used = True
        self._touch_device(rt, comm, op)
        if life.communicates and group.size > 1:
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
                stale = self.stale_writer(rt, group, comm.impl.is_nccl)
                if stale is not None:
                    yield from self.read_stale(rt, group, comm, meeting, stale)
                self.refuse_on_old_store(rt, group.name)
            payload = group.ranks  # or, gloo, the first group's: one that another joins by group rank
            self.note_device(meeting, rt, comm)
            if comm.impl is Impl.GLOO and meeting.problem is None and meeting.arrivals:
                payload = self.cross_wiring.payload(meeting, rt.rank, group.ranks)
            self.rendezvous.arrive(meeting, rt, payload, op, duration=self.timing.bootstrap_s)
            if comm.impl is Impl.GLOO:
                mark_complete_collision(meeting)
            yield from self.rendezvous.wait(rt, meeting, op)
            comm.comm_id = self.registry.id_for(meeting)
            if comm.impl is Impl.GLOO and self.cross_wiring.joined(meeting):
                self._ready(rt, group, comm, op)  # then its members are the ranks that met, not this group's
                self.cross_wiring.connect(meeting, rt.rank, group.name, comm.comm_id)
                return
            self._ready(rt, group, comm, op, meeting.devices)
            return
        if comm.impl is Impl.GLOO:
            self._gloo_singleton(rt, group, op)
        comm.comm_id = self.registry.new_id()
        self._ready(rt, group, comm, op)

    def spawn_reinit(self, rt: RankRuntime) -> None:
        """A re-init (``rt.incarnation`` > 0) of a rank other than rank 0 under spawn, against the store it reaches.

        Why: rank 0 hosts the store and its destroy drops it. A rank that re-initialises after that connects to
        rank 0's next store (the ordinary path); one that re-initialises before it connects to the old store, for
        good (``RankRuntime.on_old_store``): its bootstraps read the destroyed incarnation's keys there
        (``stale_writer``), and one that finds none is not modelled (``refuse_on_old_store``). At the very instant
        of rank 0's destroy, which store the rank reaches is timing: reported as a race (``SPAWN_STORE_RACE``)
        beside whatever the simulated order decided."""
        rt.on_old_store = None
        if self.sim.config.launcher != "spawn" or rt.rank == 0:
            return
        host = self.sim.ranks[0]
        now = self.env.now
        if host.incarnation < rt.incarnation:
            rt.on_old_store = now
        elif host.incarnation == rt.incarnation and host.world_destroyed_at == now:
            self._spawn_tie(rt.rank, now)

    def refuse_on_old_store(self, rt: RankRuntime, name: str) -> None:
        """A bootstrap on rank 0's old store (``spawn_reinit``) that read no destroyed incarnation's key: what the
        rank reads there before or after the store goes is not modelled, so a ``SimulatorLimit``, never a pass."""
        if rt.on_old_store is None:
            return
        text = ON_OLD_STORE.format(rank=rt.rank, since=rt.on_old_store, name=name)
        raise TorchError("SimulatorLimit", text)

    def _spawn_tie(self, rank: int, now: float) -> None:
        """Report ``rank``'s re-init at rank 0's destroy as a race: one entry per instant, naming every rank."""
        index, ranks = self._spawn_ties.setdefault(now, (len(self.sim.races), []))
        ranks.append(rank)
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        text = SPAWN_REINIT_AT_DESTROY.format(ranks=who, now=now)
        if index == len(self.sim.races):
            self.sim.races.append(text)
        else:
            self.sim.races[index] = text
        self.record(now, rank, "store-race", "default_pg")

    def stale_writer(self, rt: RankRuntime, group: Group, is_nccl: bool) -> int | None:
        """The rank whose value from a destroyed incarnation ``rt`` reads in this re-init's bootstrap, or None.

        Why: torch keys a bootstrap by group name ("default_pg/<name>/..."), and a re-init reuses the names. The
        keys last as long as the store: under torchrun the agent's store outlives every destroy (measured on 2.15
        with TORCHELASTIC_USE_AGENT_STORE); under spawn rank 0 hosts it and its destroy drops it, so only a rank
        re-initialising before rank 0 destroyed can read the old incarnation's keys. What is read: NCCL's
        group rank 0 publishes the unique id and never reads it, the others read group rank 0's key; gloo's
        every member reads every other member's address. The value read is taken as the old one whatever the
        arrival order (the new write may come first: a race the harness never resolves in the user's favour)."""
        index = group.ranks.index(rt.rank)
        if is_nccl and index == 0:
            return None
        if is_nccl:
            return self._stale_publisher(rt, lambda incarnation: bootstrap_key(store_name(group), True, incarnation))
        for incarnation in self._kept_incarnations(rt):
            old = self.rendezvous.meetings.get(bootstrap_key(store_name(group), False, incarnation))
            if old is None:
                continue
            writer = next((r for r in old.arrivals if old.expected.index(r) != index), None)
            if writer is not None:
                return writer
        return None

    def stale_pair_writer(self, rt: RankRuntime, group: Group, pair_ranks: tuple[int, int]) -> int | None:
        """The rank whose unique id from a destroyed incarnation ``rt`` reads in a re-init's legacy send/recv pair
        bootstrap (``Collectives._pair_comm``, ``pair_ranks`` in pair-rank order), or None.

        Why: legacy keys the pair's id by getKeySendRecv, "<lo>:<hi>" of group ranks with no counter, under the
        group's name, so a re-init's pair reads the very key its destroyed incarnation's pair used, for as long
        as the store keeps it (``stale_writer``). Pair rank 0 publishes and never reads; pair rank 1 reads. (The
        pair meeting is keyed by legacy's incarnation, ``pair_key``.)"""
        if rt.rank != pair_ranks[1]:
            return None
        lo, hi = sorted(pair_ranks)
        return self._stale_publisher(rt, lambda incarnation: ("pair", group.name, lo, hi, incarnation))

    def _stale_publisher(self, rt: RankRuntime, key_in: Callable[[int], tuple[Any, ...]]) -> int | None:
        """The publisher (expected first) of the newest bootstrap, among the incarnations whose keys ``rt``'s store
        still holds (``_kept_incarnations``), that its publisher reached: the unique id a reader finds under the
        key. ``key_in``: the bootstrap's meeting key in a given incarnation."""
        for incarnation in self._kept_incarnations(rt):
            old = self.rendezvous.meetings.get(key_in(incarnation))
            if old is not None and old.expected[0] in old.arrivals:
                return old.expected[0]
        return None

    def _kept_incarnations(self, rt: RankRuntime) -> range | tuple[int, ...]:
        """The destroyed incarnations whose store keys ``rt``'s re-init can still read, newest first: under torchrun
        the agent's store outlives every destroy; under spawn rank 0 hosts the store and its destroy drops it, so
        only rank 0's current incarnation, while ``rt`` is already past it."""
        if self.sim.config.launcher == "torchrun":
            return range(rt.incarnation - 1, -1, -1)
        host = self.sim.ranks[0].incarnation
        return (host,) if host < rt.incarnation else ()

    def read_stale(
        self, rt: RankRuntime, group: Group, comm: Comm, meeting: Meeting, writer: int, what: str | None = None
    ) -> Waiting:
        """A re-init's member that read a destroyed incarnation's value (``stale_writer``) fails as torch does.

        gloo: the address is the old ProcessGroupGloo's, whose listener is gone; connection refused comes back
        at once and gloo's connect loop retries at once, so ``connectFullMesh`` raises within the step (measured
        on 2.15: well before the timeout). NCCL: the unique id names the old bootstrap root; the connect retries
        for ``NCCL_REFUSED_RETRY_S`` and ``ncclCommInitRank`` fails; the members that read the new id wait for
        it in ``ncclCommInitRank`` with no timeout, and their hang report says why (``meeting.note``). ``what``:
        the value read, where not the group bootstrap's (a send/recv pair's unique id)."""
        launcher = self.sim.config.launcher
        store = STORE_KEPT.get(launcher, launcher)
        what = what or STALE_WHAT[comm.impl.is_nccl]
        stale = STALE_KEY.format(store=store, writer=writer, name=group.name, what=what)
        self.record(self.env.now, rt.rank, "stale-key", group.name, writer)
        meeting.note = meeting.note or stale  # a member that read the new values waits for this one in vain
        if not comm.impl.is_nccl:
            raise TorchError("RuntimeError", STALE_ADDRESS.format(peer=writer, stale=stale))
        yield self.env.timeout(NCCL_REFUSED_RETRY_S)
        message = NCCL_STALE_ID.format(version=self.sim.profile.nccl_version, stale=stale)
        raise TorchError("torch.distributed.DistBackendError", message)

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
        (a re-init's may read a destroyed incarnation's keys: ``stale_writer``)."""
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
            self.rendezvous.complete(meeting, self.timing.bootstrap_s(meeting))
        return meeting

    def finish_together(self, rt: RankRuntime, group: Group, comm: Comm, meeting: Meeting, op: Op) -> None:
        """What ``init`` does for one member after its completed bootstrap meeting (``bootstrap_together``)."""
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

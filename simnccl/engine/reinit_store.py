"""What a re-initialised default group finds in the store: a destroyed incarnation's keys, or a store on its way out.

Why a room: ``destroy_process_group`` resets torch's group counter, so a re-init and its new groups reuse the
destroyed incarnation's names; whether their bootstraps then read the old values depends on how long the store
lives (the launcher: torchrun's agent store outlives every destroy; under spawn rank 0 hosts it and its destroy
drops it) and on the order of the ranks' re-inits and rank 0's destroy. Each meeting of a re-init is keyed by its
incarnation (``bootstrap_key``), so what this room decides is only what a member reads there, and how it fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simnccl.backends import Comm
from simnccl.backends.gloo import STALE_ADDRESS
from simnccl.c10d import Group, GroupPlan, TorchError
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import PeerLost, RankRuntime, Waiting
from simnccl.meetings import Meeting

# A re-init's bootstrap that reads the destroyed incarnation's value under its store key (``ReinitStore.stale_writer``).
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
    "spawn": (
        "rank 0's store, which lives until rank 0 destroys its default group and holds no subgroup of it (a "
        "subgroup's store is a prefix of it; torch's TCPStore is multi-tenant, so rank 0's re-init reuses the live "
        "server and its keys),"
    ),
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
# Under spawn rank 0 hosts the store: its destroy of the default group, holding no subgroup of it, ends it for the
# ranks still on it, in that incarnation (``ReinitStore.store_gone``). Measured (torch 2.15 gloo, 3 ranks, an
# mp.spawn-style env:// rendezvous rank 0 hosts): rank 0 destroys at once; ranks 1 and 2 call new_group([1, 2]) 2 s
# later and both raise "DistNetworkError: Broken pipe" from TCPStore::doWait (3 runs of 3); a rank already waiting
# in that bootstrap when rank 0 destroys fails the same way.
STORE_GONE = (
    "Broken pipe (rank {rank}'s store client is connected to rank 0's store, which {how} at {at:g} s: under spawn "
    "rank 0 hosts the store, which goes with its destroy of the default group (holding no subgroup of it) or with "
    "its process; the bootstrap of group {name!r} reads and writes it)"
)
# Measured (2.15 gloo, spawn): ranks 1 and 2 split their group after rank 0 destroyed the default group: both hang
# in split_group (2 runs of 2, one watched for 40 s), where a new_group raises at once.
STORE_GONE_SPLIT = "this split's bootstrap waits on a store that never answers: {gone}"
DROPPED_BY_DESTROY = "rank 0's destroy_process_group ended"
DROPPED_BY_DEATH = "went with rank 0's process"
STORE_GONE_RACE = (
    "{ranks} began a bootstrap through rank 0's store at {now:g} s, the instant it went (spawn: rank 0's destroy of "
    "the default group or its death): whether the store answers first or is gone is decided by timing"
)
DIST_NETWORK_ERROR = "torch.distributed.DistNetworkError"


class StoreGone(PeerLost):
    """A store read or write whose server, rank 0's process's, is gone (``STORE_GONE``): a peer lost under the rank,
    as the real tier classifies "Broken pipe"."""

    def __init__(self, message: str) -> None:
        TorchError.__init__(self, DIST_NETWORK_ERROR, message)


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


class ReinitStore:
    """The stale-key and store-lifetime rules of re-inits, for ``Comms`` (group bootstraps) and ``Collectives``
    (legacy send/recv pair bootstraps)."""

    def __init__(self, sim: Sim, rendezvous: Rendezvous) -> None:
        self.sim = sim
        self.env = sim.env
        self.record = sim.trace.record
        self.rendezvous = rendezvous
        self._spawn_ties: dict[float, tuple[int, list[int]]] = {}  # instant -> (its entry in sim.races, ranks)
        self._dropped: dict[int, tuple[float, str]] = {}  # incarnation -> when and how rank 0's store went (spawn)
        self._gone_ties: dict[float, tuple[int, list[int]]] = {}  # as ``_spawn_ties``, for ``store_gone``

    def store_dropped(self, incarnation: int, how: str = DROPPED_BY_DESTROY) -> None:
        """Rank 0's store of ``incarnation`` is gone from now on, under spawn (``store_gone``): rank 0 destroyed
        its default group holding no subgroup of it, or its process died (``how``)."""
        self._dropped.setdefault(incarnation, (self.env.now, how))

    def store_gone(self, rt: RankRuntime, name: str, *, waiting: bool = False) -> StoreGone | None:
        """The error a store read or write of ``rt``'s bootstrap of group ``name`` raises because rank 0 dropped the
        store ``rt`` is connected to (``store_dropped``); None while the store is there. ``waiting``: the rank is
        already waiting on it as it goes (it fails then); a bootstrap that begins at the very instant of the drop is
        a race (reported) and goes on.

        Why: the re-init rules (``spawn_reinit``) covered a rank that re-initialised; a rank still in the destroyed
        incarnation whose next group needed the store simulated as a pass where real gloo raised (``STORE_GONE``)."""
        if self.sim.config.launcher != "spawn" or rt.rank == 0 or rt.on_old_store is not None:
            return None
        dropped = self._dropped.get(rt.incarnation)
        if dropped is None:
            return None
        at, how = dropped
        if at == self.env.now and not waiting:
            self._tie(self._gone_ties, rt.rank, STORE_GONE_RACE, "store-gone-race", name)
            return None
        return StoreGone(STORE_GONE.format(rank=rt.rank, how=how, at=at, name=name))

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
        elif (
            host.incarnation == rt.incarnation
            and host.world_destroyed_at == now
            and not self.store_survives(rt.incarnation - 1)  # a store that lives on is the same one either way
        ):
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
        self._tie(self._spawn_ties, rank, SPAWN_REINIT_AT_DESTROY, "store-race", "default_pg")

    def _tie(self, ties: dict[float, tuple[int, list[int]]], rank: int, text: str, event: str, name: str) -> None:
        """A race at rank 0's destroy, reported once per instant with every rank it concerns (``text`` takes them
        and the instant)."""
        now = self.env.now
        index, ranks = ties.setdefault(now, (len(self.sim.races), []))
        ranks.append(rank)
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        if index == len(self.sim.races):
            self.sim.races.append(text.format(ranks=who, now=now))
        else:
            self.sim.races[index] = text.format(ranks=who, now=now)
        self.record(now, rank, event, name)

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
        the agent's store outlives every destroy. Under spawn rank 0 hosts the store, and its destroy drops it
        unless a subgroup of that incarnation still holds it (``RankRuntime.stores_kept``): rank 0's current
        incarnation while ``rt`` is already past it, and every destroyed one rank 0's subgroups keep alive.

        Measured (torch 2.15 gloo, mp.spawn-style env:// rendezvous, a new_group kept in a variable across
        destroy_process_group, then a re-init): rank 0's re-init read rank 1's destroyed address and raised
        "Gloo connectFullMesh failed ... Connection refused" in 5 runs of 7; with the subgroup deleted, 7 of 7
        passed. The simulator had dropped the store at every destroy and passed both."""
        if self.sim.config.launcher == "torchrun":
            return range(rt.incarnation - 1, -1, -1)
        host = self.sim.ranks[0]
        kept = {i for i in host.stores_kept if i < rt.incarnation}
        if host.incarnation < rt.incarnation:
            kept.add(host.incarnation)
        return tuple(sorted(kept, reverse=True))

    def store_survives(self, incarnation: int) -> bool:
        """Whether rank 0's store of a destroyed ``incarnation`` lives on in a subgroup of it (``spawn``)."""
        return incarnation in self.sim.ranks[0].stores_kept

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

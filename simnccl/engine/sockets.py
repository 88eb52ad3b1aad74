"""gloo's sockets: who closed theirs, and which waiting peers fail with "Connection closed by peer".

Why a room: gloo has no shutdown — a ProcessGroupGloo closes its sockets when it is freed (destroyed, or the
process died), and a peer blocked in an operation that talks to it directly fails at once, while one that only
waits on it through others keeps waiting (``backends/gloo.py``). Nothing here costs anything until a gloo
communicator exists (``used``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simnccl.backends import Comm
from simnccl.backends.gloo import (
    PEER_CLOSED,
    PEER_RESET,
    WIRE_FAMILY,
    allreduce_waits,
    barrier_race,
    direct_peers,
)
from simnccl.dtypes import element_bytes
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.meetings import Meeting
from simnccl.release import Impl
from simnccl.watchdog import TimeoutAction


class GlooSockets:
    def __init__(self, sim: Sim, comm_members: Mapping[int, tuple[int, ...]]) -> None:
        self.sim = sim
        self.ranks = sim.ranks
        self.record = sim.trace.record
        self.comm_members = comm_members  # comm id -> its members (CommRegistry's)
        self.used = False  # set once a gloo communicator exists: the peer-closed model costs nothing else
        self.closed: dict[int, set[int]] = {}  # gloo comm id -> ranks whose sockets on it are closed
        self.peer_lost: set[int] = set()  # ranks interrupted with "Connection closed by peer", not yet failed

    def close(self, rt: RankRuntime, comms: Sequence[Comm]) -> None:
        """``rt`` closes its sockets on these gloo communicators (destroyed, or the process died): each member
        blocked in an operation that talks to ``rt`` directly fails at once with 'Connection closed by peer';
        members whose algorithm only waits on ``rt`` through others keep waiting (``backends/gloo.py``)."""
        for comm in comms:
            if comm.impl is not Impl.GLOO or comm.comm_id is None:
                continue
            closed = self.closed.setdefault(comm.comm_id, set())
            if rt.rank in closed:
                continue
            closed.add(rt.rank)  # not traced: only what it does to a waiting peer is (a closed idle socket is not)
            for member in self.comm_members.get(comm.comm_id, ()):
                if member != rt.rank:
                    self._fail_if_lost(member, comm.group)

    def recheck(self, meeting: Meeting) -> None:
        """An arrival at a gloo operation on a communicator with closed sockets (a size mismatch decided again,
        ``Rendezvous._decide``, or a ring member's neighbour joining, ``Rendezvous.arrive``): a member already
        blocked in it that now waits on a rank whose sockets closed earlier fails now, not at its timeout."""
        if self.closed.get(meeting.key[1]):
            for member in meeting.arrivals:
                self._fail_if_lost(member, meeting.group)

    def _fail_if_lost(self, member: int, group: str) -> None:
        other = self.ranks[member]
        if other.status != "blocked" or other.block is None or other.timed_out or member in self.peer_lost:
            return
        peer = self.closed_peer(member, other.block.meeting)
        if peer is not None:
            self.peer_lost.add(member)
            self.record(self.sim.now(), member, "peer-closed", peer, group)
            # a rank that aborted in a size mismatch dies with the data it refused unread: reset
            message = (PEER_RESET if other.block.meeting.fates else PEER_CLOSED).format(peer=peer)
            message += barrier_race(other.block.op.name)
            cause = TimeoutAction("raise", False, 0.0, "RuntimeError", message, False, kind="peer-lost")
            self.sim.procs[member].interrupt(cause)

    def closed_peer(self, rank: int, meeting: Meeting) -> int | None:
        """A peer ``rank``'s part of this gloo operation reads or writes directly that has closed its sockets
        and is not in the operation itself (None: none, or not a gloo collective/send/recv)."""
        if meeting.kind not in ("collective", "p2p") or meeting.key[0] not in ("coll", "p2p"):
            return None
        closed = self.closed.get(meeting.key[1])
        if meeting.fates is not None and rank in meeting.fates:  # a gloo size mismatch: the messages decided
            fate = meeting.fates[rank]  # who waits on whom (a member on another slot is not in them: below)
            lost = fate is not None and fate.kind == "peer-lost" and closed and fate.peer in closed
            return fate.peer if lost else None
        arrival = meeting.arrivals.get(rank)
        if not closed or arrival is None:
            return None
        expected = meeting.expected
        if meeting.kind == "p2p":
            peers: Sequence[int] = [r for r in expected if r != rank]
        elif WIRE_FAMILY.get(arrival.op.name) == "allreduce":
            # the ring waits on one neighbour at a time: a closed one fails it only once it waits on it, and it
            # never gets past a live neighbour that is not in the operation (``allreduce_waits``)
            # a neighbour that issued another algorithm at the tag (another slot) is not in the ring either
            _, nbytes, dtype = arrival.payload
            index = expected.index(rank)
            for i in allreduce_waits(nbytes, element_bytes(dtype), index, len(expected)):
                peer = expected[i]
                other = meeting.arrivals.get(peer)
                if other is None or WIRE_FAMILY.get(other.payload[0]) != "allreduce":
                    return peer if peer in closed else None
            return None
        else:
            op = arrival.op
            src = getattr(op, "src", None)
            root = expected.index(src) if src in expected else 0
            peers = [expected[i] for i in direct_peers(op.name, expected.index(rank), len(expected), root)]
        # a peer that issued another algorithm at the tag (another slot) is not in this one: it closing fails this
        # rank as a peer that never came would (a barrier beside an all_gather whose member aborted)
        family = WIRE_FAMILY.get(arrival.payload[0])
        arrivals = meeting.arrivals
        return next(
            (
                p
                for p in peers
                if p in closed and (p not in arrivals or WIRE_FAMILY.get(arrivals[p].payload[0]) != family)
            ),
            None,
        )

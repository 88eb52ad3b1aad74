"""Rendezvous: ranks arriving at meetings, meetings completing, ranks waiting for them.

Why this shape: every behaviour that can hang (bootstrap, split, collective, send/recv) is a meeting keyed the
way torch/NCCL match it (``simnccl.meetings``), so a hang is simply a meeting that can't complete, and the
report falls out of the registry: who is waiting where, for whom. This room owns the registry and time at a
meeting: an arrival is checked against the first (what torch/NCCL would trip on), the last arrival completes
the meeting after its duration (the caller says how long: ``Timing``), a waiting rank is blocked until then.
A non-member's NOCOLOR split is joined without waiting ("run-ahead"): the rank settles its pending splits
before it next does anything observable (``settle``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import simpy

from simnccl.backends.gloo import (
    ALLGATHER_SIZE_RACE,
    ALLREDUCE_SIZE_RACE,
    ALLTOALL_SIZE_RACE,
    SIZE_ENFORCE,
    Fate,
    mismatch_fates,
    p2p_fates,
    wire_family,
    wire_mismatch,
)
from simnccl.dtypes import element_bytes
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import Block, PeerLost, ProcessAbort, RankRuntime, Waiting
from simnccl.meetings import Arrival, Meeting, MeetingRegistry
from simnccl.ops import Op

_ROOTED = ("broadcast", "scatter", "reduce", "gather")  # payloads whose fourth item is the root, a group rank


def root_mismatch(meeting: Meeting, first: Arrival, this: Arrival) -> str:
    """Why a broadcast whose members named different roots is not one broadcast. gloo (measured): each member
    runs the binomial tree of its own root, so a rank whose parent sends elsewhere never receives and a rank
    whose child waits on another parent never completes its send (``broadcast_leavers`` says who gets out).
    NCCL: its ring or tree is laid out from the root each rank names, so ranks wait for data that is never sent;
    not measured on NCCL (no GPU lane run yet), reported as a hang of the members still in it."""
    backend = "gloo" if meeting.on_gloo else "NCCL"
    return (
        f"{first.payload[0]} root mismatch at sequence number {meeting.seq} of group {meeting.group!r}: rank "
        f"{first.rank} issued {first.op.describe()}, rank {this.rank} issued {this.op.describe()} — {backend} lays "
        f"the {first.payload[0]} out from the root each rank names, so ranks wait for data "
        + ("their parent never sends them" if first.payload[0] == "broadcast" else "that is never sent them")
    )


def _size_race(op_a: str, op_b: str, members: int) -> str:
    """What a gloo size mismatch's message adds where its outcome was measured to be timing (``real diff``
    compares only the verdict there): all_to_all, all_gather of two members and the ring allreduce of three or
    more; nothing elsewhere."""
    if op_a != op_b:
        return ""
    if op_a == "all_to_all":
        return f"; {ALLTOALL_SIZE_RACE}"
    if op_a == "all_gather" and members == 2:
        return f"; {ALLGATHER_SIZE_RACE}"
    if op_a in ("all_reduce", "reduce_scatter") and members >= 3:
        return f"; {ALLREDUCE_SIZE_RACE}"
    return ""


class Rendezvous:
    def __init__(self, sim: Sim, sockets: GlooSockets) -> None:
        self.env = sim.env
        self.record = sim.trace.record
        self.sockets = sockets
        self.meetings = MeetingRegistry()
        # id(meeting) -> member -> the event that releases that member on its own (a gloo broadcast's tree)
        self._releases: dict[int, dict[int, simpy.Event]] = {}

    def open(self, key: tuple[Any, ...], kind: str, group: str, seq: int, expected: tuple[int, ...]) -> Meeting:
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self.meetings.open(key, kind, group, seq, expected)
            meeting.result = self.env.event()
        return meeting

    def releases(self, meeting: Meeting) -> dict[int, simpy.Event]:
        """The per-member release events of a meeting whose members leave one by one (aborting it fires them)."""
        return self._releases.setdefault(id(meeting), {})

    def arrive(
        self,
        meeting: Meeting,
        rt: RankRuntime,
        payload: Any,
        op: Op,
        *,
        duration: Callable[[Meeting], float],
        run_ahead: bool = False,
    ) -> None:
        """Record an arrival; check it agrees with the first; complete the meeting when everyone is here."""
        after = None
        if run_ahead and rt.pending:
            after = rt.pending[-1][0]
        arrival = meeting.arrivals[rt.rank] = Arrival(rt.rank, self.env.now, payload, op, after)
        if meeting.problem is None:
            first = next(iter(meeting.arrivals.values()))
            # Equal payloads never disagree (every branch of ``_disagreement``); the identity test first, as a
            # bootstrap's payload is its member tuple, one object shared by every member of a large group.
            agree = first is arrival or first.payload is payload or first.payload == payload
            problem = None if agree else self._disagreement(meeting, first, arrival)
            if problem:
                meeting.problem = problem
                if meeting.on_gloo and problem.startswith("size mismatch"):
                    meeting.fates = {}
        beside = None  # a gloo size mismatch beside another algorithm: its members (``_mismatched_beside``)
        if meeting.problem is not None and meeting.on_gloo and meeting.kind == "collective":
            beside = self._mismatched_beside(meeting)
            if beside is not None:
                self._mismatch_beside_another_algorithm(meeting, beside)
        if meeting.fates is not None:
            self._decide(meeting, meeting.arrivals if beside is None else beside)
        elif meeting.problem is None and len(meeting.arrivals) == len(meeting.expected):
            self.complete(meeting, duration(meeting))
        elif self.sockets.closed:
            # a gloo ring member whose neighbour joins may go on to wait on a closed peer (``allreduce_waits``)
            self.sockets.recheck(meeting)

    def _disagreement(self, meeting: Meeting, first: Arrival, this: Arrival) -> str | None:
        """Why two arrivals at one key can't be the same operation (what torch/NCCL would trip on)."""
        if first is this:
            return None
        if meeting.kind == "bootstrap":
            if first.payload is not this.payload and first.payload != this.payload:
                return (
                    f"store key collision under group name {meeting.group!r}: rank {first.rank} bootstraps "
                    f"ranks {list(first.payload)}, rank {this.rank} bootstraps ranks {list(this.payload)}"
                )
            return None
        a, b = first.payload, this.payload
        if meeting.kind == "p2p" and a[3:] != b[3:]:  # their tags (``Collectives._post``)
            if meeting.on_gloo:
                return (
                    f"gloo send/recv tag mismatch between ranks {first.rank} and {this.rank} of group "
                    f"{meeting.group!r}: rank {first.rank} issued {first.op.describe()}, rank {this.rank} issued "
                    f"{this.op.describe()} — gloo matches a recv to a send by its tag, so neither completes: both "
                    "wait until the timeout"
                )
            a, b = a[:3], b[:3]  # NCCL ignores the tag
        if a[0] == b[0] and a[0] in _ROOTED and a[3:] != b[3:]:
            return root_mismatch(meeting, first, this)
        if meeting.on_gloo:  # gloo: what the wire does, not what the user meant (backends/gloo.py)
            how = wire_mismatch(a, b)
            if how is None:
                return None
            if how == "hang":
                return (
                    f"gloo collective mismatch at tag {meeting.seq} of group {meeting.group!r}: rank {first.rank} "
                    f"issued {first.op.describe()}, rank {this.rank} issued {this.op.describe()} — different gloo "
                    "algorithms send on different slots, so neither receives the other's messages: both wait "
                    "until the timeout"
                )
        if a[0] != b[0] and not meeting.on_gloo:
            return (
                f"operation mismatch at sequence number {meeting.seq} of group {meeting.group!r}: "
                f"rank {first.rank} issued {first.op.describe()}, rank {this.rank} issued {this.op.describe()}"
            )
        if a[0] != "split" and a[1:] != b[1:]:
            race = _size_race(a[0], b[0], len(meeting.expected)) if meeting.on_gloo else ""
            return (
                f"size mismatch at sequence number {meeting.seq} of group {meeting.group!r}: "
                f"rank {first.rank} {a[0]} of {a[1]} bytes ({a[2]}), rank {this.rank} {b[1]} bytes ({b[2]}){race}"
            )
        return None

    def _mismatch_beside_another_algorithm(self, meeting: Meeting, beside: dict[int, Arrival]) -> None:
        """A gloo collective whose members of one algorithm disagree on size while other members issued another
        algorithm at its tag: those members send on another slot, so to the first algorithm they are simply
        missing, and its size mismatch is decided per message as in any gloo size mismatch (``_decide``), not
        left to hang. Measured on torch 2.15 gloo, 4 ranks: 0 and 3 all_reduce or reduce_scatter at the tag of a
        broadcast from 1 of 96 B that rank 2 posts 48 B for: rank 2 aborts, rank 3 loses its ring neighbour 2,
        ranks 0 and 1 hang (4 runs of 4); ranks 0 to 2 all_gather 96, 192 and 96 B while rank 3 runs a barrier:
        rank 2 aborts, ranks 1 (its ring neighbour) and 3 (its barrier peer) lose it, rank 0 hangs. Members of a
        broadcast naming different roots stay ``Collectives._tree_ready``'s (no fates). ``beside``: the members of
        the algorithm that disagree on size (``_mismatched_beside``)."""
        casts = list(beside.values())
        if casts[0].payload[0] == "broadcast" and len({a.payload[3] for a in casts}) > 1:
            return
        larger = next(a for a in casts if a.payload[1] != casts[0].payload[1])
        other = next(a for r, a in meeting.arrivals.items() if r not in beside)
        name = casts[0].payload[0]
        among = "the broadcasters" if name == "broadcast" else f"the members of {name}"
        meeting.problem = (
            f"{self._disagreement(meeting, other, casts[0])}; and among {among}, "
            f"{self._disagreement(meeting, casts[0], larger)}"
        )
        if meeting.fates is None:
            meeting.fates = {}

    @staticmethod
    def _mismatched_beside(meeting: Meeting) -> dict[int, Arrival] | None:
        """The members of a gloo collective's one algorithm that disagree on size beside members that issued
        another algorithm at its tag (None: not that mix, or more than one algorithm disagreeing on size)."""
        families: dict[str, dict[int, Arrival]] = {}
        for r, a in meeting.arrivals.items():
            families.setdefault(wire_family(a.payload[0]), {})[r] = a
        if len(families) < 2:
            return None
        mismatched = [m for m in families.values() if len({a.payload[1] for a in m.values()}) > 1]
        return mismatched[0] if len(mismatched) == 1 else None

    def _decide(self, meeting: Meeting, arrivals: dict[int, Arrival]) -> None:
        """gloo enforces sizes per message, not per collective: run the algorithm's messages over the members in
        (``backends.gloo.wire_fates``) and release each rank that completes or aborts; the others keep waiting
        (on a rank not in yet, or until their timeout), and those waiting on a rank that aborts fail when its
        sockets close (``GlooSockets``). A decided rank keeps its fate: later arrivals only add messages.
        ``arrivals``: those whose messages decide it, all of them, or beside another algorithm the members of
        the algorithm that disagree on size only (``_mismatch_beside_another_algorithm``)."""
        first = next(iter(arrivals.values()))
        if meeting.kind == "p2p":
            src, dst = meeting.key[2], meeting.key[3]
            fates = p2p_fates(src, dst, {r: a.payload[1] for r, a in meeting.arrivals.items()})
        else:
            expected = meeting.expected
            src = getattr(first.op, "src", expected[0])
            payload = first.payload
            if payload[0] in _ROOTED and len(payload) > 3:
                root = payload[3]  # the root as a group rank (a gather's is no ``src``)
            else:
                root = expected.index(src) if src in expected else 0
            by_index = mismatch_fates(
                payload[0],
                {expected.index(r): a.payload[1] for r, a in arrivals.items()},
                len(expected),
                root,
                {expected.index(r): element_bytes(a.payload[2]) for r, a in arrivals.items()},
            )
            fates = {
                expected[i]: Fate(f.kind, None if f.peer is None else expected[f.peer], f.got, f.posted)
                for i, f in by_index.items()
            }
        old = meeting.fates or {}
        for rank, prev in old.items():
            if prev.kind in ("done", "abort"):
                fates[rank] = prev
        meeting.fates = fates
        releases = self.releases(meeting)
        for rank, fate in fates.items():
            if fate.kind == "abort" and meeting.fatal is None:
                meeting.fatal = SIZE_ENFORCE.format(got=fate.got, posted=fate.posted) + f" ({meeting.problem})"
                self.record(self.env.now, "abort-meeting", meeting.key)
            prev = old.get(rank)
            if fate.kind in ("done", "abort") and (prev is None or prev.kind != fate.kind):
                event = releases.get(rank)
                if event is None or event.triggered:
                    event = releases[rank] = self.env.event()
                event.succeed()
        if self.sockets.closed:
            self.sockets.recheck(meeting)
        if not meeting.result.triggered:
            meeting.result.succeed()  # wakes the members already waiting on the meeting: each checks its own fate

    def complete(self, meeting: Meeting, duration_s: float) -> None:
        done_at = max(self.env.now, meeting.ready_time()) + duration_s
        meeting.completed_at = done_at
        self.record(done_at, "meet", meeting.kind, meeting.key, len(meeting.expected))
        event = meeting.result
        delay = done_at - self.env.now
        self.env.timeout(delay).callbacks.append(lambda _ev: event.succeed())

    def wait(self, rt: RankRuntime, meeting: Meeting, op: Op, own: simpy.Event | None = None) -> Waiting:
        """Block until the meeting completes (or ``own``, this rank's release from it, fires); in a gloo size
        mismatch, until this rank's own fate is decided (``_decide``)."""
        if self.sockets.closed and not meeting.complete:
            peer = self.sockets.closed_peer(rt.rank, meeting)
            if peer is not None:
                raise PeerLost(peer, op.name)
        now = self.env.now
        if not (meeting.complete and meeting.completed_at <= now) and self._fate(meeting, rt.rank) is None:
            rt.status = "blocked"
            rt.block = Block(op, rt.pc, meeting, now)
            yield meeting.result if own is None else own
            while meeting.fates is not None and self._fate(meeting, rt.rank) is None:
                event = self.releases(meeting).get(rt.rank)
                if event is None or event.triggered:
                    event = self._releases[id(meeting)][rt.rank] = self.env.event()
                yield event
            rt.status = "running"
            rt.block = None
        fate = self._fate(meeting, rt.rank)
        if fate is not None and fate.kind == "abort":
            raise ProcessAbort(SIZE_ENFORCE.format(got=fate.got, posted=fate.posted) + f" ({meeting.problem})")

    @staticmethod
    def _fate(meeting: Meeting, rank: int) -> Fate | None:
        """This rank's decided way out of a gloo size mismatch (done or abort); None while it waits, or none."""
        fates = meeting.fates
        if fates is None:
            return None
        fate = fates.get(rank)
        return fate if fate is not None and fate.kind in ("done", "abort") else None

    def settle(self, rt: RankRuntime) -> Iterable[simpy.Event]:
        """Wait for this rank's run-ahead NOCOLOR splits before it does anything observable (``yield from``
        it). With nothing run ahead, as for most ops, it is an empty tuple: no generator is created per op."""
        return self._settle_pending(rt) if rt.pending else ()

    def _settle_pending(self, rt: RankRuntime) -> Waiting:
        last, pc = rt.pending[-1]
        if not (last.complete and last.completed_at <= self.env.now):
            # Report the earliest split that is not complete: that is where the rank really is.
            first_open = next(((m, p) for m, p in rt.pending if not m.complete), (last, pc))
            rt.status = "blocked"
            op = rt.program.ops[first_open[1]]
            rt.block = Block(op, first_open[1], first_open[0], self.env.now)
            yield last.result
            while not all(m.complete for m, _ in rt.pending):  # pragma: no cover - completion is ordered
                yield next(m for m, _ in rt.pending if not m.complete).result
            rt.status = "running"
            rt.block = None
        rt.pending.clear()

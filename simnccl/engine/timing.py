"""How long things take: a bootstrap, a split, a collective, a send/recv, a rank's own compute — and what the
straggler faults (a slow rank, a slow link) add, charged to them so reports name the slow part.

Why a room: durations come from the profile's timing figures (DESIGN rule 4), and a slowed link changes the
duration of every operation whose members span it; keeping both here means a new op asks one place how long it
takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime, Waiting
from simnccl.faults import Fault
from simnccl.meetings import Meeting
from simnccl.ops import PADDED, AllReduce, AllToAll, Barrier, Collective, Compute, Op, ReduceScatter
from simnccl.profiles import gloo_spread

_SEGMENTED = (AllReduce, ReduceScatter, Barrier)  # gloo's ring all_reduce: no one wait is for the whole message


@dataclass(slots=True, eq=False)
class SlowLink:
    """A ``link-straggler`` fault armed on the cluster: its two nodes (equal: the link joins two GPUs of one
    node), and what it has cost so far."""

    fault: Fault
    nodes: tuple[int, int]
    ops: int = 0
    extra_s: float = 0.0
    groups: list[str] = field(default_factory=list)
    spanned: int = 0  # the ops run over it, its own and those a slower link it shares a communicator with set

    @property
    def name(self) -> str:
        a, b = self.fault.rank, self.fault.peer
        if self.nodes[0] != self.nodes[1]:
            return f"between node {self.nodes[0]} and node {self.nodes[1]} (ranks {a} and {b})"
        return f"between the GPUs of ranks {a} and {b} on node {self.nodes[0]}"


def _all_in_at(meeting: Meeting, since_s: float, timeout_s: float) -> float | None:
    """When every member of a gloo meeting was in, for a member waiting since ``since_s``; None where its wait is
    for a member that is missing (or the meeting failed), or came past ``since + timeout``: it times out then."""
    if meeting.problem is not None or len(meeting.arrivals) < len(meeting.expected):
        return None
    ready = max(meeting.ready_time(), since_s)
    return ready if ready < since_s + timeout_s else None


class Timing:
    def __init__(self, sim: Sim, rendezvous: Rendezvous) -> None:
        self.env = sim.env
        self.ranks = sim.ranks
        self.record = sim.trace.record
        self.figures = sim.profile.timing  # the profile's timing figures
        self.races = sim.races
        self.spread = gloo_spread()
        self._raced: set[int] = set()  # ids of gloo meetings whose timeout was left to the host (recorded once)
        self.rendezvous = rendezvous
        self.slow: dict[int, float] = {}  # rank straggler -> its slowdown factor
        self.slow_extra_s: dict[int, float] = {}  # rank straggler -> local seconds it added
        self.slow_links: list[SlowLink] = []

    # ---------------------------------------------------------------- straggler faults (armed by Injection)

    def slow_rank(self, rank: int, factor: float) -> None:
        self.slow[rank] = factor

    def slow_link(self, fault: Fault, nodes: tuple[int, int]) -> None:
        self.slow_links.append(SlowLink(fault, nodes))

    # ---------------------------------------------------------------- durations of a meeting

    def bootstrap_s(self, meeting: Meeting) -> float:
        return self.figures.comm_init_s

    def gloo_bootstrap_s(self, meeting: Meeting) -> float:
        """A gloo communicator's bootstrap: each member connects to every other (gloo's full mesh), a measured
        figure per peer (``gloo_bootstrap_per_peer_s``), not the GPU profile's NCCL ``comm_init_s``."""
        return self.figures.gloo_bootstrap_per_peer_s * (len(meeting.expected) - 1)

    def gloo_bootstrap_deadline(self, meeting: Meeting, since_s: float, timeout_s: float) -> float | None:
        """When a member waiting since ``since_s`` in a gloo bootstrap times out; None: it does not.

        While a member is missing, the wait is for its address (``since + timeout``). Once every member is in,
        each connection to a peer is its own wait, bounded by the timeout: the bootstrap times out only where one
        peer's connection takes longer than it (a mesh of hundreds of ranks may take longer than the timeout in
        all), and near it the host's pace decides (recorded as a race, as ``gloo_deadline``)."""
        ready = _all_in_at(meeting, since_s, timeout_s)
        if ready is None:
            return since_s + timeout_s
        self.note_gloo_bootstrap_margin(meeting, timeout_s)
        return ready + timeout_s if self.figures.gloo_bootstrap_per_peer_s > timeout_s else None

    def note_gloo_bootstrap_margin(self, meeting: Meeting, timeout_s: float) -> None:
        """Record the run as decided by a race where one peer's connection in this gloo bootstrap takes within
        ``spread`` of the group's timeout (``gloo_bootstrap_deadline``); once per bootstrap, however it ended."""
        per_peer = self.figures.gloo_bootstrap_per_peer_s
        if self._near(meeting, per_peer, timeout_s):
            self.races.append(
                f"a gloo bootstrap of group {meeting.group!r} connects each peer in ~{per_peer:.3g} s at the modelled "
                f"host pace, within a factor {self.spread:g} of the group's {timeout_s:g} s timeout: whether it "
                "times out is decided by the real host's pace and load"
            )

    def _near(self, meeting: Meeting, seconds: float, timeout_s: float) -> bool:
        """Whether ``seconds`` of one wait of a gloo meeting lie within ``spread`` of its timeout, on either side, the
        first time it is asked for that meeting (a race is recorded once per meeting)."""
        if id(meeting) in self._raced or not timeout_s / self.spread < seconds < timeout_s * self.spread:
            return False
        self._raced.add(id(meeting))
        return True

    def split_s(self, meeting: Meeting) -> float:
        return self.figures.split_s

    def collective_s(self, meeting: Meeting) -> float:
        """Latency plus a ring's bus bytes over the bus bandwidth: NCCL's figures, or on a gloo communicator the
        host's (``gloo_*``: gloo moves CPU tensors over TCP, at a small fraction of NVLink's pace)."""
        timing = self.figures
        if meeting.on_gloo:
            latency, gbps = timing.gloo_collective_latency_s, timing.gloo_bus_bandwidth_gbps
        else:
            latency, gbps = timing.collective_latency_s, timing.bus_bandwidth_gbps
        size = next(iter(meeting.arrivals.values())).payload[1]
        if size == PADDED:  # torch pads each member's object to the largest
            size = max(arrival.op.size_bytes for arrival in meeting.arrivals.values())  # type: ignore[attr-defined]
        n = len(meeting.expected)
        if n <= 1:
            return latency
        bus_bytes = 2 * (n - 1) / n * size
        seconds = latency + bus_bytes / (gbps * 1e9)
        return self._over_links(meeting, seconds) if self.slow_links else seconds

    def p2p_s(self, meeting: Meeting) -> float:
        """Latency plus the message over the bandwidth (gloo: the host's figures, as ``collective_s``)."""
        timing = self.figures
        if meeting.on_gloo:
            latency, gbps = timing.gloo_p2p_latency_s, timing.gloo_p2p_bandwidth_gbps
        else:
            latency, gbps = timing.p2p_latency_s, timing.bus_bandwidth_gbps
        size = next(iter(meeting.arrivals.values())).payload[1]
        seconds = latency + size / (gbps * 1e9)
        return self._over_links(meeting, seconds) if self.slow_links else seconds

    def gloo_deadline(self, meeting: Meeting, op: Op, since_s: float, timeout_s: float) -> float | None:
        """When a rank waiting since ``since_s`` in a gloo collective or send/recv times out; None: it does not.

        gloo's timeout bounds each wait for one message, not the operation. Measured (torch 2.15 CPU, 2 ranks on
        loopback, 1 run each): a 1 GiB all_reduce under a 0.05 s timeout completes in 2.3 s (its ring moves
        small segments); a 2 GiB send/recv under 0.3 s times out on both sides at 0.31 s; a 1 GiB broadcast,
        all_gather and all_to_all_single under 0.2 s time out. So: while a member is missing, the wait is for
        it (``since + timeout``). Once every member is in, an all_reduce (a reduce_scatter is one on gloo, a
        barrier one of a few bytes) never outlasts it; the other ops time out where one message (a send's,
        a broadcast's or all_gather's whole input, an all_to_all's share) takes longer than the timeout.

        The model's pace is one host's, idle: where a message's time is within ``spread`` (gloo_transport.toml) of
        the timeout, on either side, a real host's pace and load decide, so the run is recorded as decided by a
        race (a pass that no check takes for one), whichever way the simulation went."""
        ready = _all_in_at(meeting, since_s, timeout_s)
        if ready is None:
            return since_s + timeout_s
        message = self._gloo_message(meeting, op)
        if message is None:
            return None
        self.note_gloo_margin(meeting, op, timeout_s)
        return ready + timeout_s if message[1] > timeout_s else None

    def _gloo_message(self, meeting: Meeting, op: Op) -> tuple[float, float] | None:
        """(bytes, modelled seconds) of the longest single message a member of this gloo op waits for; None for
        an all_reduce's ring (no one wait is for a whole message)."""
        timing = self.figures
        if meeting.kind == "p2p":
            nbytes = max(arrival.payload[1] for arrival in meeting.arrivals.values())
            return nbytes, nbytes / (timing.gloo_p2p_bandwidth_gbps * 1e9)
        if isinstance(op, _SEGMENTED):
            return None
        size = op.size_bytes if isinstance(op, Collective) else 0
        nbytes = size / len(meeting.expected) if isinstance(op, AllToAll) else size
        return nbytes, nbytes / (timing.gloo_bus_bandwidth_gbps * 1e9)

    def note_gloo_margin(self, meeting: Meeting, op: Op, timeout_s: float) -> None:
        """Record the run as decided by a race where one message of this gloo op takes within ``spread`` of the
        group's timeout (``gloo_deadline``); once per op, whether its members completed or timed out."""
        if id(meeting) in self._raced:
            return  # recorded already (the message is not worked out again)
        message = self._gloo_message(meeting, op)
        if message is None or not self._near(meeting, message[1], timeout_s):
            return
        nbytes, seconds = message
        self.races.append(
            f"a gloo {op.name} message of {round(nbytes):,} bytes in group {meeting.group!r} takes ~{seconds:.3g} s "
            f"at the modelled host pace, within a factor {self.spread:g} of the group's {timeout_s:g} s timeout: "
            "whether it times out is decided by the real host's pace and load (measured on one 2-core host: from "
            "1/3 to 4.7x the model's time)"
        )

    def _over_links(self, meeting: Meeting, seconds: float) -> float:
        """A communicator with a member on each end of a slowed link runs at that link's pace: the slowest
        such link sets the factor (a ring or tree is as fast as its slowest hop). The extra time is charged to
        that link so ``explain`` can name it."""
        worst: SlowLink | None = None
        for link in self.slow_links:
            if self.spans(link, meeting.expected):
                link.spanned += 1  # it acted, masked or not (``straggler_acted``)
                if worst is None or link.fault.factor > worst.fault.factor:
                    worst = link
        if worst is None:
            return seconds
        worst.ops += 1
        worst.extra_s += seconds * (worst.fault.factor - 1.0)
        if meeting.group and meeting.group not in worst.groups:
            worst.groups.append(meeting.group)
        self.record(self.env.now, "slow-link", worst.name, meeting.key)
        return seconds * worst.fault.factor

    def spans(self, link: SlowLink, members: tuple[int, ...]) -> bool:
        """Whether ``members`` put one rank on each end of ``link`` (nodes, or GPUs of one node)."""
        ends = [False, False]
        for r in members:
            end = self._link_end(link, r)
            if end is not None:
                ends[end] = True
                if ends[0] and ends[1]:
                    return True
        return False

    def _link_end(self, link: SlowLink, rank: int) -> int | None:
        node = self.ranks[rank].node
        if link.nodes[0] != link.nodes[1]:
            return 0 if node == link.nodes[0] else 1 if node == link.nodes[1] else None
        if node != link.nodes[0]:
            return None
        device = self._rank_device(rank)
        devices = self._rank_device(link.fault.rank), self._rank_device(link.fault.peer or 0)
        if devices[0] == devices[1]:
            return None  # both ends on one GPU: there is no wire between them to slow
        return 0 if device == devices[0] else 1 if device == devices[1] else None

    def _rank_device(self, rank: int) -> int:
        rt = self.ranks[rank]
        return rt.ctx.local_rank if rt.current_device is None else rt.current_device

    # ---------------------------------------------------------------- a rank's own time

    def op_compute(self, rt: RankRuntime, op: Compute) -> Waiting:
        yield from self.rendezvous.settle(rt)
        if op.seconds > 0:
            factor = self.slow.get(rt.rank, 1.0)
            if factor != 1.0:
                self.slow_extra_s[rt.rank] = self.slow_extra_s.get(rt.rank, 0.0) + op.seconds * (factor - 1.0)
            yield self.env.timeout(op.seconds * factor)

    # ---------------------------------------------------------------- report

    def straggler_acted(self, fault: Fault) -> bool:
        """Whether a straggler fault slowed anything (``Injection.unacted``): a rank's local work, or an op over the
        link. A slow link another link as slow or slower on the same communicator masked acted too: it was slow
        where it ran (a tie went to the link listed first, and the other was reported as never acted)."""
        if fault.kind == "straggler":
            return self.slow_extra_s.get(fault.rank, 0.0) > 0
        return any(link.spanned for link in self.slow_links if link.fault is fault)

    def slowdowns(self) -> list[dict[str, Any]]:
        """What each straggler fault cost, so reports name the slow rank or link rather than those who waited."""
        out: list[dict[str, Any]] = []
        for rank, factor in sorted(self.slow.items()):
            out.append(
                {
                    "kind": "straggler",
                    "rank": rank,
                    "factor": factor,
                    "extra_s": self.slow_extra_s.get(rank, 0.0),
                }
            )
        for link in self.slow_links:
            out.append(
                {
                    "kind": "link-straggler",
                    "link": link.name,
                    "ranks": [link.fault.rank, link.fault.peer],
                    "factor": link.fault.factor,
                    "ops": link.ops,
                    "extra_s": link.extra_s,
                    "groups": list(link.groups),
                }
            )
        return out

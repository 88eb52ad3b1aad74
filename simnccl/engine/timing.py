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
from simnccl.ops import Compute


@dataclass(slots=True, eq=False)
class SlowLink:
    """A ``link-straggler`` fault armed on the cluster: its two nodes (equal: the link joins two GPUs of one
    node), and what it has cost so far."""

    fault: Fault
    nodes: tuple[int, int]
    ops: int = 0
    extra_s: float = 0.0
    groups: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        a, b = self.fault.rank, self.fault.peer
        if self.nodes[0] != self.nodes[1]:
            return f"between node {self.nodes[0]} and node {self.nodes[1]} (ranks {a} and {b})"
        return f"between the GPUs of ranks {a} and {b} on node {self.nodes[0]}"


class Timing:
    def __init__(self, sim: Sim, rendezvous: Rendezvous) -> None:
        self.env = sim.env
        self.ranks = sim.ranks
        self.record = sim.trace.record
        self.figures = sim.profile.timing  # the profile's timing figures
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

    def split_s(self, meeting: Meeting) -> float:
        return self.figures.split_s

    def collective_s(self, meeting: Meeting) -> float:
        timing = self.figures
        size = next(iter(meeting.arrivals.values())).payload[1]
        n = len(meeting.expected)
        if n <= 1:
            return timing.collective_latency_s
        bus_bytes = 2 * (n - 1) / n * size
        seconds = timing.collective_latency_s + bus_bytes / (timing.bus_bandwidth_gbps * 1e9)
        return self._over_links(meeting, seconds) if self.slow_links else seconds

    def p2p_s(self, meeting: Meeting) -> float:
        timing = self.figures
        size = next(iter(meeting.arrivals.values())).payload[1]
        seconds = timing.p2p_latency_s + size / (timing.bus_bandwidth_gbps * 1e9)
        return self._over_links(meeting, seconds) if self.slow_links else seconds

    def _over_links(self, meeting: Meeting, seconds: float) -> float:
        """A communicator with a member on each end of a slowed link runs at that link's pace: the slowest
        such link sets the factor (a ring or tree is as fast as its slowest hop). The extra time is charged to
        that link so ``explain`` can name it."""
        worst: SlowLink | None = None
        for link in self.slow_links:
            if (worst is None or link.fault.factor > worst.fault.factor) and self.spans(link, meeting.expected):
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

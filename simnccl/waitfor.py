"""The wait-for graph of a hang: who waits on whom, in which call, and whether the waits close a cycle.

Why: "the straggler is rank 2" is the right story only when rank 2 is *behind* — stalled, dead, finished
without joining — so that everyone waiting on it would move once it arrived. When rank 2 itself waits on a
rank that waits on it, nobody is behind: the ranks issued their calls in different orders and no rank will
ever arrive (a circular wait, a deadlock). Users fix the two differently (find the slow rank vs. make the call
order the same on every rank), so the report must tell them apart; this module answers the question once, for
``simnccl explain``'s text and for its ``--plot`` picture.

The graph is read from the run's hang entries (``waiting_for`` is the set of ranks the meeting a rank is blocked
in still misses). A rank is a *sink* when it waits on nobody: it is not blocked in a meeting (it finished, died
or is stalled) or its meeting misses no one (a size mismatch). Sinks that others wait on are the stragglers.
Deterministic: ranks and edges are visited in sorted order, so the same hangs always name the same cycle.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_CYCLE_WAITS_SHOWN = 8
# an nccl-lazy pair communicator's bootstrap, '<group>/p2p-<lo>-<hi>-<attempt>': the call is the name less its attempt
PAIR_ATTEMPT = re.compile(r"(.*/p2p-\d+-\d+)-\d+")


@dataclass(frozen=True, slots=True)
class Wait:
    """One edge: ``waiter`` is blocked in ``op`` (a meeting of ``kind`` #``seq`` on ``group``) until
    ``waited_for`` arrives."""

    waiter: int
    waited_for: int
    op: str
    group: str
    kind: str
    seq: int
    since_s: float

    @property
    def place(self) -> tuple[str, str, int]:
        """The rendezvous the waiter is in: two waits at one place are ranks that are in the same call. An
        nccl-lazy pair's bootstrap is one call whatever attempt number each rank put in its name: two ranks whose
        process-wide counters differ wait in it under different names (a broken store key, not a call order)."""
        pair = PAIR_ATTEMPT.fullmatch(self.group) if self.kind == "bootstrap" else None
        return (self.group if pair is None else pair[1], self.kind, self.seq)

    def where(self) -> str:
        if self.group:
            return f"{self.op} ({self.kind} #{self.seq} on group {self.group!r})"
        return f"{self.op} ({self.kind})"


@dataclass(frozen=True, slots=True)
class Cycle:
    """Waits that lead back to their start: ``waits[i].waited_for == waits[i + 1].waiter``, cyclically."""

    waits: tuple[Wait, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(w.waiter for w in self.waits)

    @property
    def circular(self) -> bool:
        """A circular wait proper: the ranks wait in different calls (each for a call the next never makes).
        A cycle inside one rendezvous is ranks that are in the same call but cannot meet (a broken store key,
        a disagreement) — the meeting's own explanation says why, and nobody's call order is at fault."""
        return len({w.place for w in self.waits}) > 1

    def describe(self) -> str:
        """'rank 0 waits for rank 2 in X while rank 2 waits for rank 0 in Y' (long cycles elided)."""
        parts = [f"rank {w.waiter} waits for rank {w.waited_for} in {w.where()}" for w in self.waits]
        if len(parts) > MAX_CYCLE_WAITS_SHOWN:
            hidden = len(parts) - MAX_CYCLE_WAITS_SHOWN + 1
            parts = [*parts[: MAX_CYCLE_WAITS_SHOWN - 2], f"… {hidden} more waits …", parts[-1]]
        if len(parts) == 1:
            return parts[0]
        return ", ".join(parts[:-1]) + " while " + parts[-1]


class WaitForGraph:
    """Ranks as nodes, waits as edges, built from a run's hang entries (one graph per process lifetime: a
    recovery job's segments each get their own, see ``by_segment``)."""

    def __init__(self, waits: Iterable[Wait], blocked: Iterable[int] = ()) -> None:
        self.waits: tuple[Wait, ...] = tuple(sorted(set(waits), key=lambda w: (w.waiter, w.waited_for)))
        self._out: dict[int, list[Wait]] = {}
        for wait in self.waits:
            self._out.setdefault(wait.waiter, []).append(wait)
        self.blocked: tuple[int, ...] = tuple(sorted(set(blocked) | set(self._out)))
        self._cycles: list[Cycle] | None = None
        self._cycle_index: dict[int, int] = {}  # rank -> its cycle in ``cycles()``, for ranks in one

    @classmethod
    def from_hangs(cls, hangs: Iterable[Mapping[str, Any]]) -> WaitForGraph:
        waits = []
        blocked = []
        for hang in hangs:
            blocked.append(hang["rank"])
            for other in hang.get("waiting_for") or ():
                waits.append(
                    Wait(
                        waiter=hang["rank"],
                        waited_for=other,
                        op=hang.get("op", ""),
                        group=hang.get("group", ""),
                        kind=hang.get("kind", ""),
                        seq=hang.get("seq", 0),
                        since_s=hang.get("since_s", 0.0),
                    )
                )
        return cls(waits, blocked)

    @classmethod
    def by_segment(cls, hangs: Iterable[Mapping[str, Any]]) -> dict[int | None, WaitForGraph]:
        """One graph per segment of a recovery job (``segment`` key; None for an ordinary run): rank numbers
        name different processes in different segments, so their waits must not be joined."""
        groups: dict[int | None, list[Mapping[str, Any]]] = {}
        for hang in hangs:
            groups.setdefault(hang.get("segment"), []).append(hang)
        return {segment: cls.from_hangs(items) for segment, items in groups.items()}

    # ------------------------------------------------------------------ structure

    def waits_of(self, rank: int) -> tuple[Wait, ...]:
        return tuple(self._out.get(rank, ()))

    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.blocked) | {w.waited_for for w in self.waits}))

    def is_sink(self, rank: int) -> bool:
        """Waits on nobody: the end of every chain of waits that does not close into a cycle."""
        return rank not in self._out

    def cycles(self) -> list[Cycle]:
        """One cycle per group of ranks that all (transitively) wait on each other: the shortest cycle through
        the group's lowest rank. Ordered by that rank."""
        if self._cycles is None:
            components = sorted((c for c in self._components() if len(c) > 1), key=min)
            self._cycles = [self._shortest_cycle(min(c), c) for c in components]
            self._cycle_index = {rank: i for i, c in enumerate(components) for rank in c}
        return self._cycles

    def cycle_of(self, rank: int) -> Cycle | None:
        """The cycle whose group contains ``rank`` (it may wait in the group without being on the cycle named)."""
        cycles = self.cycles()
        index = self._cycle_index.get(rank)
        return None if index is None else cycles[index]

    def reaches(self, rank: int) -> tuple[tuple[int, ...], tuple[Cycle, ...]]:
        """What ``rank``'s waits end in: the sinks (stragglers) and the cycles reachable from it."""
        seen = {rank}
        queue = deque([rank])
        sinks: set[int] = set()
        cycles: list[Cycle] = []
        while queue:
            node = queue.popleft()
            cycle = self.cycle_of(node)
            if cycle is not None:
                if cycle not in cycles:
                    cycles.append(cycle)
                continue
            if self.is_sink(node):
                sinks.add(node)
                continue
            for wait in self._out[node]:
                if wait.waited_for not in seen:
                    seen.add(wait.waited_for)
                    queue.append(wait.waited_for)
        return tuple(sorted(sinks)), tuple(sorted(cycles, key=lambda c: min(c.ranks)))

    # ------------------------------------------------------------------ internals

    def _components(self) -> list[frozenset[int]]:
        """Strongly connected components (Tarjan, iterative: a 4,096-rank chain must not hit the recursion
        limit), visiting ranks and edges in sorted order."""
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        on_stack: set[int] = set()
        stack: list[int] = []
        components: list[frozenset[int]] = []
        counter = 0
        for root in self.nodes():
            if root in index:
                continue
            work: list[tuple[int, int]] = [(root, 0)]
            while work:
                node, edge = work.pop()
                if edge == 0:
                    index[node] = low[node] = counter
                    counter += 1
                    stack.append(node)
                    on_stack.add(node)
                out = self._out.get(node, [])
                if edge < len(out):
                    work.append((node, edge + 1))
                    nxt = out[edge].waited_for
                    if nxt not in index:
                        work.append((nxt, 0))
                    elif nxt in on_stack:
                        low[node] = min(low[node], index[nxt])
                    continue
                if low[node] == index[node]:
                    members = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        members.add(top)
                        if top == node:
                            break
                    components.append(frozenset(members))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
        return components

    def _shortest_cycle(self, start: int, component: frozenset[int]) -> Cycle:
        """Breadth-first from ``start`` inside its component, back to ``start``."""
        came_by: dict[int, Wait] = {}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for wait in self._out.get(node, []):
                nxt = wait.waited_for
                if nxt not in component:
                    continue
                if nxt == start:
                    path = [wait]
                    while path[0].waiter != start:
                        path.insert(0, came_by[path[0].waiter])
                    return Cycle(tuple(path))
                if nxt not in came_by:
                    came_by[nxt] = wait
                    queue.append(nxt)
        raise AssertionError(f"rank {start} is in a strongly connected component but on no cycle")

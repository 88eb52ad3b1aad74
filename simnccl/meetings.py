"""Meetings: the rendezvous every collective behaviour reduces to, and the registry that matches arrivals.

A communicator bootstrap, a collective, a split of a parent communicator, a send/recv pair — each is a set of
ranks that must all arrive at the same *key* before any of them proceeds. Keys are what real torch/NCCL would
match on (a store key under the group's name; a communicator identity plus a sequence number), so ranks that
disagree — different creation orders, a skipped call, a size mismatch — never meet, and the meeting records
why. The engine owns time; a meeting only records who came, when, with what, and what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Arrival:
    rank: int
    time_s: float
    payload: Any
    op: Any  # the Op; described only when a report needs it (describing every arrival is measurable)
    after: Meeting | None = None  # a run-ahead arrival: really arrives when this meeting completes


@dataclass(slots=True, eq=False)
class Meeting:
    """One rendezvous. ``expected`` are global ranks; ``problem`` explains why it can never complete."""

    key: tuple[Any, ...]
    kind: str
    group: str
    seq: int
    expected: tuple[int, ...]
    arrivals: dict[int, Arrival] = field(default_factory=dict)
    problem: str | None = None
    note: str | None = None  # why a member it waits for will never come, where that does not stop it completing
    fatal: str | None = None  # a mismatch the backend turns into a process abort (gloo), not a hang
    # a gloo communicator's op: a mismatch aborts the process rather than hanging (backends/gloo.py), a broadcast
    # is a tree, and it runs at the host's pace (the profile's gloo_* timing figures)
    on_gloo: bool = False
    timeout_s: float | None = None  # a store wait's own timeout (engine.init_barrier: the new group's)
    # gloo, members disagreeing on sizes: global rank -> how it leaves (backends.gloo.Fate), decided per arrival
    fates: dict[int, Any] | None = None
    completed_at: float | None = None
    result: Any = None
    # an NCCL bootstrap: global rank -> the GPU its communicator is on (``n0:cuda:0``), as NCCL's peer info
    # exchange carries it (``engine.shared_gpus``)
    devices: dict[int, str] | None = None

    @property
    def complete(self) -> bool:
        return self.completed_at is not None

    def missing(self) -> tuple[int, ...]:
        return tuple(r for r in self.expected if r not in self.arrivals)

    def ready_time(self) -> float:
        """When the last member really arrived (run-ahead arrivals count from their predecessor's end)."""
        latest = 0.0
        for arrival in self.arrivals.values():
            t = arrival.time_s
            after = arrival.after
            if after is not None and after.completed_at is not None and after.completed_at > t:
                t = after.completed_at
            if t > latest:
                latest = t
        return latest


class MeetingRegistry:
    """Every meeting of a run by key, with a count so the guard can bound them."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[Any, ...], Meeting] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: tuple[Any, ...]) -> Meeting | None:
        return self._by_key.get(key)

    def open(self, key: tuple[Any, ...], kind: str, group: str, seq: int, expected: tuple[int, ...]) -> Meeting:
        meeting = self._by_key.get(key)
        if meeting is None:
            meeting = Meeting(key=key, kind=kind, group=group, seq=seq, expected=expected)
            self._by_key[key] = meeting
        return meeting

    def all(self) -> list[Meeting]:
        """Every meeting, in the order they were opened."""
        return list(self._by_key.values())

    def pending(self) -> list[Meeting]:
        return [m for m in self._by_key.values() if not m.complete and m.arrivals]

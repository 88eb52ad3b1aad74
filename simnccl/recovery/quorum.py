"""The quorum, a pure function of what was observed: who trains next, and why (torchft's quorum_compute style)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from simnccl.cluster import Device


@dataclass(frozen=True, slots=True)
class StepSample:
    step: int
    at_s: float  # when the rank finished the step's local work: observable from then on
    local_s: float  # seconds of local work the step took on this rank (what a straggler slows)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the orchestrator knows about one rank of the current membership."""

    rank: int
    device: Device
    failed_at_s: float | None = None  # when its failure was detected
    failure: str = ""
    samples: tuple[StepSample, ...] = ()  # the steps since the last quorum


@dataclass(frozen=True, slots=True)
class QuorumState:
    replicas: int
    ranks: tuple[Observation, ...]  # indexed by rank
    spares: tuple[Device, ...]  # healthy idle GPUs
    slow_factor: float


@dataclass(frozen=True, slots=True)
class Exclusion:
    rank: int
    device: Device
    reason: str


@dataclass(frozen=True, slots=True)
class Replacement:
    rank: int
    old: Device
    new: Device


@dataclass(frozen=True, slots=True)
class Decision:
    """The next membership (``members[rank]`` is the rank's GPU), and why. ``ok`` False: no quorum can form."""

    time_s: float
    members: tuple[Device, ...]
    excluded: tuple[Exclusion, ...]
    replacements: tuple[Replacement, ...]
    explanation: str
    ok: bool = True

    @property
    def changed(self) -> bool:
        return bool(self.excluded)

    def plan(self) -> str:
        if not self.ok:
            return "no quorum"
        if not self.replacements:
            return "unchanged"
        return ", ".join(f"rank {r.rank}: {r.old.key} -> spare {r.new.key}" for r in self.replacements)


def quorum(time_s: float, state: QuorumState) -> Decision:
    """Who trains next, decided from what is known at ``time_s``: a pure function of its arguments.

    Excluded: a rank whose failure was detected by then, and a rank whose mean local step time (over the
    samples observable by then) exceeds ``slow_factor`` times the median of all healthy ranks. Each excluded
    rank moves to the first spare GPU (by node, then index) on its own node; none left means no quorum.
    """
    assert [o.rank for o in state.ranks] == list(range(len(state.ranks))), "observations are indexed by rank"
    excluded = [
        Exclusion(o.rank, o.device, o.failure)
        for o in state.ranks
        if o.failed_at_s is not None and o.failed_at_s <= time_s
    ]
    failed = {e.rank for e in excluded}
    means: dict[int, tuple[float, int, int]] = {}
    for o in state.ranks:
        seen = [s for s in o.samples if s.at_s <= time_s]
        if o.rank not in failed and seen:
            means[o.rank] = (sum(s.local_s for s in seen) / len(seen), seen[0].step, seen[-1].step)
    median = statistics.median(sorted(m for m, _, _ in means.values())) if means else 0.0
    if median > 0:
        for rank in sorted(means):
            mean, first, last = means[rank]
            if mean > state.slow_factor * median:
                steps = f"step {first}" if first == last else f"steps {first}-{last}"
                excluded.append(
                    Exclusion(
                        rank,
                        state.ranks[rank].device,
                        f"slow: {mean:.3f} s of local work per step over {steps}, {mean / median:.1f}x the "
                        f"median {median:.3f} s (limit {state.slow_factor:g}x)",
                    )
                )
    excluded.sort(key=lambda e: e.rank)
    head = f"t={time_s:.3f} s: "
    world = len(state.ranks)
    if not excluded:
        slowest = max((m for m, _, _ in means.values()), default=None)
        health = (
            f" (slowest {slowest:.3f} s of local work per step, median {median:.3f} s, limit {state.slow_factor:g}x)"
            if slowest is not None
            else ""
        )
        members = tuple(o.device for o in state.ranks)
        return Decision(time_s, members, (), (), f"{head}all {world} ranks healthy{health}; membership unchanged")
    pool = sorted(state.spares)
    members_list = [o.device for o in state.ranks]
    replacements: list[Replacement] = []
    for e in excluded:
        spare = next((d for d in pool if d.node == e.device.node), None)
        if spare is None:
            return Decision(
                time_s,
                (),
                tuple(excluded),
                tuple(replacements),
                f"{head}exclude rank {e.rank} on {e.device.key} ({e.reason}), but no spare GPU is left on node "
                f"{e.device.node}: no quorum of {world} ranks in {state.replicas} replicas can form",
                ok=False,
            )
        pool.remove(spare)
        members_list[e.rank] = spare
        replacements.append(Replacement(e.rank, e.device, spare))
    moves = "; ".join(
        f"exclude rank {e.rank} on {e.device.key} ({e.reason}) and bring in spare {r.new.key} as rank {r.rank}"
        for e, r in zip(excluded, replacements, strict=True)
    )
    size = world // state.replicas
    return Decision(
        time_s,
        tuple(members_list),
        tuple(excluded),
        tuple(replacements),
        f"{head}{moves}; quorum: {world} ranks in {state.replicas} replicas of {size}",
    )

"""Per-device GPU memory ledger: owner-tagged allocations, ``mem_get_info``-like free/total, a timeline.

Why owner tags: the question users bring is not "how full is the GPU" but "who filled it" — the CUDA context,
torch's caching allocator, or which communicator of which group in which lifecycle phase. NCCL's buffers never
show in ``torch.cuda.memory_allocated()``; like ``cudaMemGetInfo`` the ledger counts every process on the
device, so one rank's communicators eat another rank's startup margin when they share a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from simnccl.ops import MIB


class Owner(NamedTuple):
    """Who holds an allocation: a kind (cuda_context, torch, comm), the rank, and for comms the group/phase.

    A named tuple, not a frozen dataclass: a startup makes one per allocation and looks it up twice in the
    ledger's dict, and a tuple is built and hashed in C (a frozen dataclass's ``__init__`` and ``__hash__`` run
    Python code: measured ~10% of a large column's charging)."""

    kind: str
    rank: int
    group: str = ""
    phase: str = ""

    def label(self) -> str:
        parts = [self.kind, f"rank{self.rank}"]
        if self.group:
            parts.append(f"group {self.group}")
        if self.phase:
            parts.append(self.phase)
        return " ".join(parts)


class MemoryEvent(NamedTuple):
    """One change of a ledger (a named tuple for the same reason as ``Owner``: one per allocation)."""

    time_s: float
    device: str
    owner: Owner
    delta_bytes: int
    used_bytes: int
    op: Any  # the Op (described on demand: describing every allocation is measurable at scale)


# A named tuple's own constructor is Python code (``namedtuple`` makes its ``__new__`` from a lambda); where one
# is made per allocation, ``tuple.__new__`` builds the same object in C, at half the cost.
_new_tuple = tuple.__new__


class SimulatedOOM(RuntimeError):
    """The CUDA out-of-memory error a real process would get, raised at the op that caused it.

    ``comm_group``: the name of the communicator (``Comm.group``) whose NCCL allocation failed, None for a
    tensor's. Why: torch raises a tensor's OOM as ``torch.OutOfMemoryError`` but never an NCCL one: NCCL's failed
    calloc comes back as an NCCL error, whose Python type depends on the backend that owns the communicator
    (``simnccl.engine.ranks.oom_error``).
    """

    def __init__(
        self, message: str, device: str, requested_bytes: int, free_bytes: int, *, comm_group: str | None = None
    ) -> None:
        super().__init__(message)
        self.device = device
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes
        self.comm_group = comm_group


def to_mib(num_bytes: int | float) -> float:
    return num_bytes / MIB


def mib_to_bytes(mib: float) -> int:
    return round(mib * MIB)


@dataclass(slots=True)
class DeviceLedger:
    """One GPU's memory: what each owner holds, the running total, the peak and every change."""

    device: str
    total_bytes: int
    used_bytes: int = 0
    peak_bytes: int = 0
    by_owner: dict[Owner, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    timeline: list[MemoryEvent] = field(default_factory=list)
    # ``by_kind`` as it was at the peak (zeros dropped and sorted when read): ``by_kind`` itself while the ledger is
    # at its peak (``_at_peak``), copied only when a change leaves the peak — a startup's allocations each set a new
    # peak, and a copy each was ~2% of a world-wide startup.
    _peak_kinds: dict[str, int] = field(default_factory=dict, repr=False)
    _at_peak: bool = field(default=False, repr=False)
    keeps_timeline: ClassVar[bool] = True  # every change in ``timeline`` (a HostLedger keeps none)

    @property
    def peak_by_owner_kind(self) -> dict[str, int]:
        """What each kind of owner held when the device's use peaked (kinds holding nothing left out)."""
        kinds = self.by_kind if self._at_peak else self._peak_kinds
        return {kind: held for kind, held in sorted(kinds.items()) if held}

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) as ``torch.cuda.mem_get_info`` reports it: every process on the device counts."""
        return self.free_bytes, self.total_bytes

    def allocate(self, owner: Owner, num_bytes: int, *, time_s: float, op: Any, nccl: bool = False) -> None:
        """Charge ``num_bytes`` to ``owner``; raise the error the allocator (or NCCL) would raise if it can't."""
        if num_bytes < 0:
            raise ValueError(f"negative allocation {num_bytes} for {owner.label()}")
        if num_bytes == 0:
            return
        if num_bytes > self.total_bytes - self.used_bytes:  # free_bytes, without a property call per allocation
            raise SimulatedOOM(
                oom_message(self.device, num_bytes, self.free_bytes, self.total_bytes, nccl=nccl),
                self.device,
                num_bytes,
                self.free_bytes,
                comm_group=owner.group if nccl else None,
            )
        self._apply(owner, num_bytes, time_s, op)

    def move(self, source: Owner, target: Owner, num_bytes: int, *, time_s: float, op: Any) -> None:
        """Hand ``num_bytes`` that ``source`` holds to ``target`` (a cached block reused): the device's use does
        not change."""
        if not 0 < num_bytes <= self.by_owner.get(source, 0):
            raise ValueError(f"{source.label()} holds {self.by_owner.get(source, 0)} bytes, cannot move {num_bytes}")
        self._apply(source, -num_bytes, time_s, op)
        self._apply(target, num_bytes, time_s, op)

    def release_owner(self, owner: Owner, *, time_s: float, op: Any) -> int:
        """Free everything ``owner`` holds (communicator destroyed, process exited); returns bytes freed."""
        held = self.by_owner.get(owner, 0)
        if held:
            self._apply(owner, -held, time_s, op)
        return held

    def release(self, owner: Owner, num_bytes: int, *, time_s: float, op: Any) -> int:
        """Free up to ``num_bytes`` of what ``owner`` holds (never more); returns bytes freed."""
        freed = min(max(num_bytes, 0), self.by_owner.get(owner, 0))
        if freed:
            self._apply(owner, -freed, time_s, op)
        return freed

    def _apply(self, owner: Owner, delta: int, time_s: float, op: Any) -> None:
        by_owner = self.by_owner
        held = by_owner.get(owner, 0) + delta
        if held:
            by_owner[owner] = held
        else:
            by_owner.pop(owner, None)
        used = self.used_bytes = self.used_bytes + delta
        by_kind = self.by_kind
        if used > self.peak_bytes:
            self.peak_bytes = used
            self._at_peak = True
        elif self._at_peak:  # this change leaves the peak: keep what each kind held there
            self._peak_kinds = by_kind.copy()
            self._at_peak = False
        by_kind[owner.kind] = by_kind.get(owner.kind, 0) + delta
        if self.keeps_timeline:
            self.timeline.append(_new_tuple(MemoryEvent, (time_s, self.device, owner, delta, used, op)))

    def used_by_kind(self) -> dict[str, int]:
        return {kind: held for kind, held in sorted(self.by_kind.items()) if held}

    def used_by_group(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for owner, held in self.by_owner.items():
            if owner.kind == "comm":
                out[owner.group] = out.get(owner.group, 0) + held
        return out


@dataclass(slots=True)
class HostLedger(DeviceLedger):
    """A node's pinned host memory that NCCL holds: what each owner holds, the total and the peak, and no
    ``timeline`` (it stays empty). Reports give a node's host use and peak only, and a world-wide startup charges
    the host once per communicator: 2.85 million changes at 131,072 ranks that nothing read."""

    keeps_timeline: ClassVar[bool] = False


def comm_holdings(ledgers: Iterable[DeviceLedger]) -> dict[int, tuple[int, int]]:
    """Per rank, over ``ledgers``: the bytes its communicators hold, and how many communicators it holds that
    allocated at init or as a send/recv pair. One rule for what counts as a rank's communicators, read where
    ``simnccl cost`` reads its rows: at a checkpoint (``Snapshot.comms_by_rank``) or at the end of a run."""
    held_bytes: dict[int, int] = {}
    groups: dict[int, set[str]] = {}
    for ledger in ledgers:
        for owner, held in ledger.by_owner.items():
            if owner.kind != "comm":
                continue
            held_bytes[owner.rank] = held_bytes.get(owner.rank, 0) + held
            if owner.phase in ("init", "p2p-pair"):
                groups.setdefault(owner.rank, set()).add(owner.group)
    return {rank: (held, len(groups.get(rank, ()))) for rank, held in held_bytes.items()}


def oom_message(device: str, requested: int, free: int, total: int, *, nccl: bool) -> str:
    """The text a user sees: NCCL's failed cudaMalloc for communicator buffers, torch's OOM otherwise."""
    if nccl:
        return (
            f"NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
            f"Failed to CUDA calloc {requested} bytes on {device} (free {to_mib(free):.0f} MiB)"
        )
    return (
        f"CUDA out of memory. Tried to allocate {to_mib(requested):.2f} MiB. GPU {device} has a total capacity "
        f"of {total / 1024**3:.2f} GiB of which {to_mib(free):.2f} MiB is free."
    )


def vllm_requested_bytes(total_bytes: int, utilization: float) -> int:
    """vLLM's ``requested_memory = ceil(total * gpu_memory_utilization)``."""
    return math.ceil(total_bytes * utilization)


def vllm_check_message(device: str, free: int, total: int, utilization: float, requested: int) -> str:
    """vLLM's startup-check failure, in the shape quoted by pytorch#175666."""
    gib = 1024**3
    return (
        f"Free memory on device {device} ({free / gib:.2f}/{total / gib:.2f} GiB) on startup is less than "
        f"desired GPU memory utilization ({utilization}, {requested / gib:.2f} GiB). Decrease GPU memory "
        f"utilization or reduce GPU memory used by other processes."
    )


def distinct_figures(value: float, bound: float, least: int = 1, *, grouping: bool = True) -> tuple[str, str]:
    """``value`` and ``bound`` as text (thousands separated unless ``grouping`` is off), with the fewest decimals
    (at least ``least``, at most 6) at which they read differently where they differ. Why: a figure and the cap
    it was checked against, both shown to 0.1, read "2,719.9 > 2,719.9" and "704.6 used, expected 704.6 ± 0
    MiB": FAIL beside equal numbers."""
    sep = "," if grouping else ""
    decimals = least
    while decimals < 6 and value != bound and f"{value:{sep}.{decimals}f}" == f"{bound:{sep}.{decimals}f}":
        decimals += 1
    return f"{value:{sep}.{decimals}f}", f"{bound:{sep}.{decimals}f}"

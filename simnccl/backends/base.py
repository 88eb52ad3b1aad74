"""What every communicator lifecycle answers, and the per-rank communicator state the engine keeps.

Why a lifecycle object per implementation: the same ``new_group`` costs memory at creation under nccl2,
at first use under legacy, never under gloo. The c10d model decides *which* implementation and whether the
group is split or bootstrapped fresh; the lifecycle decides *when* a communicator exists (and whether it
allocates GPU memory at all); how much it costs comes from NCCL's mechanics (``simnccl.comm_memory``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from simnccl.release import Impl, Release

if TYPE_CHECKING:
    from simnccl.comm_memory import CommMemory


class CommState(StrEnum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    DESTROYED = "destroyed"


@dataclass(slots=True)
class Comm:
    """One rank's backend object for one group on one device type (torch keeps one per process).

    ``comm_id`` is the identity the members share once bootstrapped (the ncclUniqueId in life); collectives
    are matched on it, so two ranks that disagree about a group never meet in the same collective.
    """

    impl: Impl
    group: str
    size: int
    device: int | None
    lazy_init: bool = False
    via_split: bool = False
    shared: bool = False
    state: CommState = CommState.UNINITIALIZED
    comm_id: int | None = None
    connected: bool = False
    seq: int = 0
    pair_comms: dict[int, int] = field(default_factory=dict)
    pair_attempts: dict[int, int] = field(default_factory=dict)
    p2p_seq: dict[tuple[int, int], int] = field(default_factory=dict)
    # The communicator it was split from, and what this rank's communicator holds (simnccl.comm_memory):
    # its breakdown per NCCL mechanism, NVLS multicast slots, the uses connected so far. None until init.
    parent: Comm | None = None
    memory: CommMemory | None = None

    @property
    def ready(self) -> bool:
        return self.state is CommState.READY


@dataclass(frozen=True, slots=True)
class Charge:
    """A memory charge a lifecycle step asks for: the phase names the ledger owner tag."""

    phase: str
    num_bytes: int


class Lifecycle:
    """Defaults for an NCCL-family communicator; subclasses override what differs."""

    impl: Impl
    allocates_gpu_memory = True
    communicates = True
    # Whether ``split_group`` is an operation of the parent communicator that every parent rank joins
    # (ncclCommSplit, non-members with NOCOLOR) or, as for gloo, a fresh members-only bootstrap.
    split_is_collective = True

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        raise NotImplementedError

    def supports_splitting(self, comm: Comm) -> bool:
        return comm.ready

    def p2p_uses_pair_comm(self, comm: Comm, *, bound: bool) -> bool:
        return False

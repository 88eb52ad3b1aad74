"""What every communicator lifecycle answers, and the per-rank communicator state the engine keeps.

Why a lifecycle object per implementation: the same ``new_group`` costs memory at creation under nccl2,
at first use under legacy, never under gloo. The c10d model decides *which* implementation and whether the
group is split or bootstrapped fresh; the lifecycle decides *when* a communicator exists (and whether it
allocates GPU memory at all); how much it costs comes from NCCL's mechanics (``simnccl.comm_memory``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from simnccl.release import Impl, Release

if TYPE_CHECKING:
    from simnccl.comm_memory import CommMemory


class CommState(StrEnum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    DESTROYED = "destroyed"


class _NoneYet(Mapping[Any, int]):
    """What a communicator that never sent or received holds: one empty read-only mapping shared by all of them
    (hashable, so a dataclass takes it as a default). Why: a world-wide startup makes millions of communicators,
    almost none of which send, and an empty dict each was ~6% of its memory."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> int:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0


_NONE_YET = _NoneYet()
_READY = CommState.READY  # a module constant: an enum member looked up on its class costs ~0.1 us, asked per op


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
    # The ncclCommSplit calls this rank made on it, member and NOCOLOR alike: NCCLComm::ncclCommSplitCounter_
    # (NCCLUtils.hpp:364), which legacy's comm_split_count() sums to name a split_group child without a desc.
    splits: int = 0
    # Per send/recv peer: its 2-rank pair communicator's id; per (src, dst): the point-to-point calls so far.
    # Read-only and shared until the first one (``add_pair``, ``next_p2p_seq``).
    pair_comms: Mapping[int, int] = _NONE_YET
    p2p_seq: Mapping[tuple[int, int], int] = _NONE_YET
    # The communicator it was split from, and what this rank's communicator holds (simnccl.comm_memory):
    # its breakdown per NCCL mechanism, NVLS multicast slots, the uses connected so far. None until init.
    parent: Comm | None = None
    memory: CommMemory | None = None
    # A lazy gloo communicator's bootstrap meeting, where its member published its address when the group was
    # made (``engine.comms.Comms.publish``); its first use waits there. None otherwise.
    published: Any = None

    @property
    def ready(self) -> bool:
        return self.state is _READY

    def add_pair(self, peer: int, pair_id: int) -> None:
        """Record the pair communicator made for sends and receives with ``peer``."""
        pairs = self.pair_comms if isinstance(self.pair_comms, dict) else {}
        pairs[peer] = pair_id
        self.pair_comms = pairs

    def next_p2p_seq(self, src: int, dst: int) -> int:
        """The number of this point-to-point call from ``src`` to ``dst`` (1 for the first)."""
        seqs = self.p2p_seq if isinstance(self.p2p_seq, dict) else {}
        seqs[(src, dst)] = n = seqs.get((src, dst), 0) + 1
        self.p2p_seq = seqs
        return n


class Charge(NamedTuple):
    """A memory charge a lifecycle step asks for: the phase names the ledger owner tag. A named tuple (built in
    C): every communicator a startup makes charges one."""

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

"""What every communicator lifecycle answers, and the per-rank communicator state the engine keeps.

Why a lifecycle object per implementation: the same ``new_group`` costs memory at creation under nccl2,
at first use under legacy, never under gloo. The c10d model decides *which* implementation and whether the
group is split or bootstrapped fresh; the lifecycle decides *when* memory is charged and how much.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from simnccl.memory import mib_to_bytes
from simnccl.profiles import CommCosts
from simnccl.release import Impl, Release


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

    @property
    def ready(self) -> bool:
        return self.state is CommState.READY


@dataclass(frozen=True, slots=True)
class Charge:
    """A memory charge a lifecycle step asks for: the phase names the ledger owner tag."""

    phase: str
    num_bytes: int


def runtime_connect(env: Mapping[str, str]) -> bool:
    """NCCL_RUNTIME_CONNECT (default 1): connection buffers at the first collective instead of at init."""
    return env.get("NCCL_RUNTIME_CONNECT", "1") != "0"


def split_share(env: Mapping[str, str], option: bool | None) -> bool:
    """config.split_share wins over NCCL_COMM_SPLIT_SHARE_RESOURCES (unset means not shared)."""
    if option is not None:
        return option
    return env.get("NCCL_COMM_SPLIT_SHARE_RESOURCES") == "1"


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

    def init_charges(self, costs: CommCosts, comm: Comm, env: Mapping[str, str]) -> list[Charge]:
        if not self.allocates_gpu_memory:
            return []
        if comm.via_split and comm.shared:
            mib = costs.split_shared_init_mib
        elif comm.size == 1:
            mib = costs.single_rank_init_mib
        else:
            mib = costs.init_mib
        charges = [Charge("init", mib_to_bytes(mib))]
        if not runtime_connect(env):
            charges.append(Charge("connect", mib_to_bytes(self._connect_mib(costs, comm))))
        return charges

    def first_collective_charges(self, costs: CommCosts, comm: Comm, env: Mapping[str, str]) -> list[Charge]:
        if not self.allocates_gpu_memory or not runtime_connect(env):
            return []
        return [Charge("connect", mib_to_bytes(self._connect_mib(costs, comm)))]

    def pair_charges(self, costs: CommCosts) -> list[Charge]:
        if not self.allocates_gpu_memory:
            return []
        return [Charge("p2p-pair", mib_to_bytes(costs.p2p_pair_mib))]

    @staticmethod
    def _connect_mib(costs: CommCosts, comm: Comm) -> float:
        if comm.via_split and comm.shared:
            return costs.split_shared_first_collective_mib
        return costs.first_collective_mib

"""Legacy ``ProcessGroupNCCL`` (``nccl-legacy``, or ``nccl`` with TORCH_DIST_USE_NCCL2=0 on 2.15).

Lazy: a communicator per device at the first collective that uses it, unless the group is bound to a device
(``device_id``), in which case ``eager_connect_single_device`` creates it at creation and later groups are
split from it. Unbatched send/recv in lazy mode create one 2-rank communicator per peer pair; in eager mode
they ride the group's communicator, serialised with everything else (§B.4).
"""

from __future__ import annotations

from simnccl.backends.base import Comm, Lifecycle
from simnccl.release import Impl, Release


class LegacyLifecycle(Lifecycle):
    impl = Impl.LEGACY

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        # Legacy ignores lazy_init; only a bound device makes it eager.
        return bound

    def supports_splitting(self, comm: Comm) -> bool:
        # ProcessGroupNCCL.hpp:837-839: always true, initialised or not. Its lazy communicator is checked later,
        # by C++ ProcessGroup::splitGroup's isInitialized() (``c10d.check_split_parent_initialized``).
        return True

    def p2p_uses_pair_comm(self, comm: Comm, *, bound: bool) -> bool:
        return not bound

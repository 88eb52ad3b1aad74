"""``ProcessGroupNCCLLazy`` (``nccl-lazy``): an nccl2 primary plus a 2-rank communicator per p2p peer.

The primary is created like nccl2's (eager on 2.15 unless lazy_init) — which is why #199957's GB200 follow-up
measured the same 197 MiB per group for nccl-lazy as for the default. The first unbatched send/recv to each
peer bootstraps a pair communicator, a rendezvous with that peer. ``split()`` splits only the primary and
returns a plain nccl2 backend (§B.3).
"""

from __future__ import annotations

from simnccl.backends.base import Comm
from simnccl.backends.nccl2 import Nccl2Lifecycle
from simnccl.release import Impl


class NcclLazyLifecycle(Nccl2Lifecycle):
    impl = Impl.NCCL_LAZY

    def p2p_uses_pair_comm(self, comm: Comm, *, bound: bool) -> bool:
        return True

"""``ProcessGroupNCCL2`` (``nccl2``; ``nccl`` by default on 2.15).

2.15 creates the one communicator in the constructor, bound to ``_nccl2_device`` (PR #192895), unless
``Options.lazy_init`` defers it to the first op — and a lazy group can't be split from before that op
(``supportsSplitting() = !lazy_init || initialized``). 2.14's nccl2 was lazy unless bound. Send and recv use
the same communicator: no per-pair communicators (§B.2, §B.5).
"""

from __future__ import annotations

from simnccl.backends.base import Lifecycle
from simnccl.release import Impl, Release


class Nccl2Lifecycle(Lifecycle):
    impl = Impl.NCCL2

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        if release.nccl2_eager:
            return not lazy_init
        return bound

"""``ProcessGroupGloo``: no GPU memory; the members connect a full mesh over the store at construction."""

from __future__ import annotations

from simnccl.backends.base import Lifecycle
from simnccl.release import Impl, Release


class GlooLifecycle(Lifecycle):
    impl = Impl.GLOO
    allocates_gpu_memory = False

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        return True

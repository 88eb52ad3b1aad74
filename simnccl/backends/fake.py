"""torch's ``fake`` backend: no communication, no memory, no binding; every collective returns at once.

So nothing can hang under ``fake`` — a program that hangs on NCCL passes here, exactly as in torch (§F.1).
Splitting is supported and involves no collective.
"""

from __future__ import annotations

from simnccl.backends.base import Comm, Lifecycle
from simnccl.release import Impl, Release


class FakeLifecycle(Lifecycle):
    impl = Impl.FAKE
    allocates_gpu_memory = False
    communicates = False

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        return True

    def supports_splitting(self, comm: Comm) -> bool:
        return True

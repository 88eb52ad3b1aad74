"""Communicator lifecycles, one module per backend implementation."""

from __future__ import annotations

from simnccl.backends.base import Charge, Comm, CommState, Lifecycle
from simnccl.backends.fake import FakeLifecycle
from simnccl.backends.gloo import GlooLifecycle
from simnccl.backends.legacy import LegacyLifecycle
from simnccl.backends.nccl2 import Nccl2Lifecycle
from simnccl.backends.nccl_lazy import NcclLazyLifecycle
from simnccl.release import Impl

LIFECYCLES: dict[Impl, Lifecycle] = {
    Impl.NCCL2: Nccl2Lifecycle(),
    Impl.LEGACY: LegacyLifecycle(),
    Impl.NCCL_LAZY: NcclLazyLifecycle(),
    Impl.GLOO: GlooLifecycle(),
    Impl.FAKE: FakeLifecycle(),
}


def lifecycle(impl: Impl) -> Lifecycle:
    return LIFECYCLES[impl]


__all__ = [
    "LIFECYCLES",
    "Charge",
    "Comm",
    "CommState",
    "Lifecycle",
    "lifecycle",
]

"""A communicator's memory, itemised: what each part is, how many of it, on which ledger, and when it is paid.

Why a breakdown and not a number: users ask *why* a group costs 230 MiB and what a knob would save; the
engine needs *when* (init, or the first collective that needs an algorithm) and *where* (device, or pinned
host memory that torch never sees). Each part also says whether its figure is predicted from NCCL's
mechanics, measured, or fitted, and which NCCL source it follows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from simnccl.nccl.channels import Channels
from simnccl.nccl.layout import Layout

Ledger = Literal["device", "host"]
Figure = Literal["predicted", "measured", "fitted"]
INIT = "init"
SCHEMA_VERSION = 1
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Part:
    """``count`` x ``bytes_each`` of one mechanism, paid at ``paid_at`` (``init`` or ``first <call> (<algo>)``).

    ``suspendable``: NCCL tracks it as ncclMemOffload, so ncclCommSuspend releases it (channel and connection
    buffers do; the device communicator and NVLS buffers are ncclMemPersist and stay).
    """

    mechanism: str
    what: str
    ledger: Ledger
    count: int
    bytes_each: int
    paid_at: str
    suspendable: bool
    figure: Figure
    source: str
    multicast_objects: int = 0

    @property
    def total(self) -> int:
        return self.count * self.bytes_each

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "what": self.what,
            "ledger": self.ledger,
            "count": self.count,
            "bytes_each": self.bytes_each,
            "bytes": self.total,
            "mib": round(self.total / MIB, 4),
            "paid_at": self.paid_at,
            "suspendable": self.suspendable,
            "figure": self.figure,
            "source": self.source,
            "multicast_objects": self.multicast_objects,
        }


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Everything one rank's communicator costs up to ``phase``; see ``simnccl.nccl.communicator_bytes``."""

    parts: tuple[Part, ...]
    layout: Layout
    topology: str
    nccl_version: str
    channels: Channels
    runtime_connect: bool
    cumem: bool
    nvls_active: bool
    split_shared: bool
    nvls_shared: bool
    share_resources: bool
    connected: frozenset[tuple[int, int, str, int]]
    algorithms_connected: frozenset[str]
    nvls_buffers_paid: bool
    net_pools_paid: frozenset[str]  # the NET shared p2p pools allocated: 'send', 'recv' (one per direction)
    notes: tuple[str, ...] = field(default=())

    def bytes(self, ledger: Ledger = "device", paid_at: str | None = None) -> int:
        """Bytes on ``ledger``, all of them or only those paid at ``paid_at``."""
        return sum(p.total for p in self.parts if p.ledger == ledger and (paid_at is None or p.paid_at == paid_at))

    @property
    def device_bytes(self) -> int:
        return self.bytes("device")

    @property
    def host_bytes(self) -> int:
        return self.bytes("host")

    @property
    def init_device_bytes(self) -> int:
        return self.bytes("device", INIT)

    @property
    def suspendable_device_bytes(self) -> int:
        """What ncclCommSuspend(NCCL_SUSPEND_MEM) gives back (NCCL >= 2.29.7)."""
        return sum(p.total for p in self.parts if p.ledger == "device" and p.suspendable)

    @property
    def multicast_objects(self) -> int:
        """Multicast objects backing the NVLS memory priced here (credit region, buffers): NCCL's own count for
        these mechanisms only. Not the NVSwitch slots a communicator takes (~10, observed, with mechanisms not
        modelled): those are data (``nvls_multicast.toml``), charged by ``simnccl.engine.nvls``."""
        return sum(p.multicast_objects for p in self.parts)

    def mechanism_bytes(self, mechanism: str, ledger: Ledger = "device") -> int:
        return sum(p.total for p in self.parts if p.mechanism == mechanism and p.ledger == ledger)

    def by_paid_at(self, ledger: Ledger = "device") -> dict[str, int]:
        """Bytes per moment of payment, in the order the moments occur."""
        result: dict[str, int] = defaultdict(int)
        for part in self.parts:
            if part.ledger == ledger:
                result[part.paid_at] += part.total
        return dict(result)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "topology": self.topology,
            "nccl_version": self.nccl_version,
            "nranks": self.layout.nranks,
            "local_ranks": self.layout.local_ranks,
            "nodes": self.layout.nodes,
            "rank": self.layout.rank,
            "channels": {
                "coll": self.channels.coll,
                "p2p": self.channels.p2p,
                "p2p_per_peer": self.channels.p2p_per_peer,
                "nvls": self.channels.nvls,
                "initialized": self.channels.initialized,
                "steps": list(self.channels.steps),
            },
            "runtime_connect": self.runtime_connect,
            "cumem": self.cumem,
            "nvls_active": self.nvls_active,
            "split_shared": self.split_shared,
            "nvls_shared": self.nvls_shared,
            "device_bytes": self.device_bytes,
            "host_bytes": self.host_bytes,
            "init_device_bytes": self.init_device_bytes,
            "suspendable_device_bytes": self.suspendable_device_bytes,
            "multicast_objects": self.multicast_objects,
            "by_paid_at": self.by_paid_at(),
            "parts": [p.to_dict() for p in self.parts],
            "notes": list(self.notes),
        }

"""NCCL communicator memory from NCCL's own mechanics (no simpy, no torch).

``communicator_bytes(topology, nranks, local_ranks, nodes, nccl_version, env, options, phase, uses, ...)``
returns a ``Breakdown``: channels x allocations x the cuMem granule, connections x protocol buffers per
algorithm (ring, tree, PAT, NVLS, CollNet Direct, send/recv and the all-to-all fan-out), NVLS unicast buffers
and multicast slots, the NET shared pool (and the one-rank defect), split sharing, pinned host memory as its
own ledger, a measured fixed overhead, and when each part is paid. Every NCCL constant is data
(``simnccl/data/nccl_constants.toml``, with the NCCL source file and version); ``simnccl validate`` compares
the model with every published figure (``simnccl/data/nccl_published.toml``).

Unmeasured assumptions (nothing here was checked on a GPU by simnccl; each is a reading of NCCL's source or
of a public log, and each can be wrong on a given machine):

1. cuMem's allocation granularity is 2 MiB, and the multicast granularity NCCL uses is 2 MiB (evidence:
   NVIDIA/nccl#1685 and #2077 logs, not a measurement of ours).
2. The small allocations NCCL makes at init are the ones counted (2 for the device communicator, 3 per
   channel, 1 per NVLS channel); others (profiler counters, proxy state, symmetric-memory runtime) are
   assumed to be host memory or below a granule in total.
3. The ring search is NCCL's algorithm simplified to a node of identical GPUs with one bandwidth each;
   across nodes it is approximated by one ring per NIC (no multi-node figure validates it).
4. A GPU kind's topology (NVSwitch or not, NVLS multicast available, GPUDirect RDMA) is as written in
   ``gpu_kinds.toml``; the hardware of a published point is often not stated (see each point's conditions).
5. Which algorithm a call connects follows simnccl's documented rule (``simnccl.nccl.algorithms``), not
   NCCL's tuner; NCCL_PROTO changes no buffer (NCCL allocates every protocol).
6. PCIe peers use the P2P transport (not SHM through host memory); PXN, NVB preconnect, the NVLS tree's
   network connections, CollNet Chain and user-buffer registration are not modelled; CollNet Direct is
   modelled as P2P connections to the node's other ranks and is unvalidated.
7. Multi-node rings enter each node through a different GPU per channel (a rotation), and trees are binary
   over node heads; per-rank network connection counts follow from that.
8. NVLS multicast objects: the model counts the 2 behind the memory it prices (credit region, buffers;
   ``Part.multicast_objects``). NVIDIA/nccl#2077 saw ~10 slots per communicator on NCCL 2.29.7, from mechanisms
   not modelled here; that observed figure (``simnccl/data/nvls_multicast.toml``) is the slot count simnccl
   reports and enforces (``simnccl.engine.nvls``).
"""

from __future__ import annotations

import re

from simnccl.nccl.algorithms import COLLECTIVES, Use, algorithm_for
from simnccl.nccl.breakdown import Breakdown, Part
from simnccl.nccl.channels import Channels, channel_counts
from simnccl.nccl.constants import NcclInputError, constants
from simnccl.nccl.hardware import Topology, topology_for
from simnccl.nccl.knobs import NcclSettings, settings_from
from simnccl.nccl.layout import Layout
from simnccl.nccl.model import PHASES, communicator_bytes, shared_value
from simnccl.nccl.version import NcclVersion

# The numbered list above, one string per assumption (printed by ``simnccl validate``).
UNMEASURED_ASSUMPTIONS = tuple(
    " ".join(item.split())
    for item in re.split(r"\n\d+\. ", "\n" + (__doc__ or "").split("on a given machine):", 1)[1].strip())
    if item.strip()
)

__all__ = [
    "COLLECTIVES",
    "PHASES",
    "UNMEASURED_ASSUMPTIONS",
    "Breakdown",
    "Channels",
    "Layout",
    "NcclInputError",
    "NcclSettings",
    "NcclVersion",
    "Part",
    "Topology",
    "Use",
    "algorithm_for",
    "channel_counts",
    "communicator_bytes",
    "constants",
    "settings_from",
    "shared_value",
    "topology_for",
]

"""How many channels a communicator gets: ring/tree, send/recv, per send/recv peer, and NVLS.

Why it matters: nearly every byte NCCL allocates is per channel (init: three device allocations per channel;
connect: buffers per channel and connection), so memory is linear in these counts (NVIDIA/nccl#986).

The count follows NCCL's own steps (src/graph/search.cc, connect.cc, paths.cc, transport/nvls.cc, v2.30.7):

1. Ring search on one node: starting at the fastest speed of the architecture's speed table that fits, a
   GPU with bandwidth B carries ``min(32, floor(B / speed))`` rings; NCCL keeps the best ``channels x speed``
   and lowers the speed while the next speed is more than .49 of the best, stopping at a perfect solution
   (32 channels, or channels x speed >= B). A one-GPU communicator sees its own 5000 GB/s path: 32 rings.
2. Duplication (ncclTopoDupChannels): doubled unless the speed is below 25 GB/s, or compute capability > 80
   with speed below 50 and more than 4 channels.
3. Postset doubles again (max 64); multi-node Hopper+ doubles below 16; then NCCL_MAX_NCHANNELS / maxCTAs
   cap and NCCL_MIN_NCHANNELS / minCTAs raise; a split child sharing its parent never exceeds the parent.
4. Send/recv channels: the power of two above min(channels, NCCL_MAX_P2P_NCHANNELS); per peer, twice the
   NVLinks to the peer (2 over PCIe, one per 14 GB/s of NIC across nodes, or NCCL_NCHANNELS_PER_NET_PEER),
   rounded to a power of two; across nodes, halved until every peer fits one round of the p2p schedule, unless
   NCCL_NCHANNELS_PER_NET_PEER is set (src/graph/paths.cc ncclTopoGetNchannels, ncclTopoComputeP2pChannels).
5. NVLS channels: 16 on Hopper, 24 on Blackwell within a node, 32 across nodes; NCCL_NVLS_NCHANNELS overrides.

Across nodes the search is approximated (one ring per NIC at the NIC's speed; ASSUMPTION, unvalidated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simnccl.nccl.constants import NcclConstants, constants
from simnccl.nccl.hardware import Topology
from simnccl.nccl.knobs import NcclSettings
from simnccl.nccl.layout import Layout


@dataclass(frozen=True, slots=True)
class ParentChannels:
    """What a sharing parent imposes on its split child (src/graph/connect.cc, paths.cc)."""

    coll: int
    p2p: int
    nvls: int


@dataclass(frozen=True, slots=True)
class Channels:
    """A communicator's channel counts and how they were reached (``steps``, for the breakdown)."""

    search: int
    coll: int
    p2p: int
    p2p_per_peer: int
    nvls: int
    steps: tuple[str, ...]

    @property
    def initialized(self) -> int:
        """Channels initChannel sets up at init: every ring channel and every send/recv channel."""
        return max(self.coll, self.p2p)


def _pow2_up(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _speeds(cc: int) -> tuple[float, ...]:
    c = constants()
    if cc >= 100:
        return c.floats("channels.speeds_intra_sm100")
    if cc >= 90:
        return c.floats("channels.speeds_intra_sm90")
    return c.floats("channels.speeds_intra_default")


def search_channels(topology: Topology, layout: Layout) -> tuple[int, float, str]:
    """Rings NCCL's search finds for one node (after duplication): (channels, speed, explanation)."""
    c = constants()
    max_channels = c.integer("channels.ring_search_max_channels")
    if layout.nodes > 1:
        nics = max(1, topology.nics_per_node) * c.integer("channels.multinode_search_per_nic")
        count, speed = min(max_channels, nics), topology.nic_bw
        why = f"{count} ring(s) at {speed:g} GB/s (one per NIC, approximated)"
    else:
        total = c.number("channels.loc_bw") if layout.local_ranks == 1 else topology.intra_bw()
        speeds = _speeds(topology.compute_capability)
        index = next((i for i, s in enumerate(speeds) if s <= total), len(speeds) - 1)
        count, speed = 0, 0.0
        ratio = c.number("channels.search_stop_ratio")
        while True:
            trial = speeds[index]
            rings = min(max_channels, int(total / trial + 1e-9))
            if rings >= 1 and rings * trial > count * speed:
                count, speed = rings, trial
            perfect = count == max_channels or count * speed >= total
            if perfect or index + 1 >= len(speeds) or (count and speeds[index + 1] / speed <= ratio):
                break
            index += 1
        count = max(count, 1)
        why = f"{count} ring(s) at {speed:g} GB/s on a {total:g} GB/s GPU"
    cc = topology.compute_capability
    dup_skip = (
        cc > c.integer("channels.dup_skip_above_cc")
        and speed < c.number("channels.dup_skip_below_bw")
        and count > c.integer("channels.dup_skip_above_channels")
    )
    if speed >= c.number("channels.dup_min_bw") and not dup_skip:
        count = min(2 * count, max_channels)
        why += f", duplicated to {count}"
    return count, speed, why


def channel_counts(
    topology: Topology,
    layout: Layout,
    settings: NcclSettings,
    *,
    nvls_active: bool,
    parent: ParentChannels | None = None,
) -> Channels:
    """All channel counts of one communicator; ``parent`` only when the child shares the parent's resources.

    Remembered per inputs (``_COUNTS``): a pure function of the topology, the settings, the layout's counts (not
    the rank priced) and the parent's channels, asked again at every communicator priced afresh and at every
    first use a run has not priced before (the property benchmark's 2,000 programs asked it 13,804 times, for
    753 distinct inputs)."""
    c = constants()
    key = (
        id(topology),
        id(settings),
        id(c),
        layout.nranks,
        layout.nodes,
        layout.local_ranks,
        layout.max_local_ranks,
        nvls_active,
        parent,
    )
    kept = _COUNTS.get(key)
    if kept is not None and kept[0] is topology and kept[1] is settings and kept[2] is c:
        return kept[3]
    result = _channel_counts(c, topology, layout, settings, nvls_active, parent)
    if len(_COUNTS) >= _COUNTS_KEPT:
        _COUNTS.clear()
    _COUNTS[key] = (topology, settings, c, result)
    return result


# (ids of topology, settings, constants; the layout's counts; NVLS; parent) -> (those objects, the counts). The
# objects are kept beside the answer so an id reused by another object is never mistaken for it.
_COUNTS: dict[tuple[object, ...], tuple[Topology, NcclSettings, object, Channels]] = {}
_COUNTS_KEPT = 4096


def _channel_counts(
    c: NcclConstants,
    topology: Topology,
    layout: Layout,
    settings: NcclSettings,
    nvls_active: bool,
    parent: ParentChannels | None,
) -> Channels:
    max_channels = c.integer("channels.max_channels")
    search, _, why = search_channels(topology, layout)
    steps = [f"ring search: {why}"]
    coll = min(max_channels, search * c.integer("channels.postset_factor"))
    steps.append(f"postset x{c.integer('channels.postset_factor')}: {coll}")
    if layout.nodes > 1 and topology.compute_capability >= 90 and coll < c.integer("channels.multinode_double_below"):
        coll *= 2
        steps.append(f"multi-node Hopper+ doubling: {coll}")
    max_ctas = settings.max_ctas or max_channels
    cap = min(settings.max_nchannels or max_channels, max_ctas)
    if parent is not None:
        cap = min(cap, parent.coll)
    if coll > cap:
        coll = cap
        steps.append(f"capped by NCCL_MAX_NCHANNELS / maxCTAs{' / parent' if parent else ''}: {coll}")
    floor = max(settings.min_nchannels, settings.min_ctas)
    if parent is not None:
        floor = min(floor, parent.coll)
    if coll < floor:
        coll = floor
        steps.append(f"raised by NCCL_MIN_NCHANNELS / minCTAs: {coll}")

    p2p = min(coll, settings.max_p2p_nchannels or max_channels)
    p2p = max(p2p, settings.min_p2p_nchannels)
    if parent is not None:
        p2p = min(p2p, parent.p2p)
    p2p = min(_pow2_up(p2p), max_channels)
    steps.append(f"send/recv channels: {p2p}")

    needs = []  # NCCL takes the minimum over every rank's peers (allgathered), so any node with peers counts
    if layout.max_local_ranks > 1:
        if topology.interconnect == "pcie" or topology.nvlink_links == 0:
            needs.append(c.integer("channels.p2p_channels_pcie"))
        else:
            needs.append(c.integer("channels.p2p_channels_per_nvlink") * max(1, topology.nvlink_links))
    if layout.nodes > 1 and settings.nchannels_per_net_peer:
        needs.append(settings.nchannels_per_net_peer)
    elif layout.nodes > 1:
        per_channel = c.number("channels.p2p_per_channel_net_bw")
        nics = topology.nics_per_node
        fallback = c.integer("channels.p2p_channels_pcie")
        needs.append(max(nics, math.ceil(topology.nic_bw / per_channel)) if nics > 0 else fallback)
    per_peer = _pow2_up(min(needs) if needs else max_channels)
    if layout.nodes > 1 and not settings.nchannels_per_net_peer:  # NCCL skips this when the user set it
        batch = c.integer("channels.p2p_peers_per_batch")
        while per_peer * math.ceil(layout.nranks / batch) > p2p and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(p2p, per_peer)
    steps.append(f"send/recv channels per peer: {per_peer}")

    nvls = 0
    if nvls_active:
        cc = topology.compute_capability
        key = "nvls_sm90"
        if cc >= 100:
            key = "nvls_sm100_multi_node" if layout.nodes > 1 else "nvls_sm100_single_node"
        nvls = settings.nvls_ctas or c.integer(f"channels.{key}")
        nvls = max(settings.min_ctas, min(max_ctas, nvls))
        if parent is not None and parent.nvls:
            nvls = min(nvls, parent.nvls)
        steps.append(f"NVLS channels: {nvls}")
    return Channels(search=search, coll=coll, p2p=p2p, p2p_per_peer=per_peer, nvls=nvls, steps=tuple(steps))

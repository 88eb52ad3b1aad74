"""Bytes one side of one connection allocates, by transport, on the device and in pinned host memory.

Why: this is where the per-connection protocol buffers land (LL 512 KiB, LL128 4,915,200 B, Simple 4 MiB by
default: 9.19 MiB together), and whether they land on the GPU or in host memory, rounded how:

* P2P (same node; src/transport/p2p.cc): the receiver allocates ncclRecvMem + LL + LL128 + Simple, the sender
  ncclSendMem; with P2P read (Ampere over NVLink, paths.cc) Simple moves to the sender. Both sizes are rounded
  to CUDA_IPC_MIN (2 MiB), and under cuMem to the allocation granularity: 10 MiB + 2 MiB per connection pair
  on Hopper (NVIDIA/nccl#1685's 10,485,760 and 2,097,152 B), 6 + 6 MiB on Ampere.
* NET (across nodes; src/transport/net.cc): dedicated buffers for rings and trees. With GPUDirect RDMA the
  sender keeps LL128 + Simple on the GPU and LL in host memory, the receiver all three on the GPU; without
  it all of them are pinned host memory (9.19 MiB per connection, the DGX Spark figure). Send/recv over the
  network uses shared pools instead, one per proxy and direction (nChannels x 16 x p2p chunk each).
"""

from __future__ import annotations

from dataclasses import dataclass

from simnccl.nccl.connections import Connection
from simnccl.nccl.constants import constants
from simnccl.nccl.hardware import Topology
from simnccl.nccl.knobs import NcclSettings


@dataclass(frozen=True, slots=True)
class ProtocolBuffers:
    """Per-connection buffer sizes of the three protocols, after NCCL_*BUFFSIZE overrides."""

    ll: int
    ll128: int
    simple: int

    @property
    def total(self) -> int:
        return self.ll + self.ll128 + self.simple


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one connection side costs: device bytes (already rounded) and pinned host bytes."""

    device: int
    host: int


def protocol_buffers(settings: NcclSettings) -> ProtocolBuffers:
    c = constants()
    return ProtocolBuffers(
        ll=settings.ll_buffsize or c.integer("buffers.ll_bytes"),
        ll128=settings.ll128_buffsize or c.integer("buffers.ll128_bytes"),
        simple=settings.buffsize or c.integer("buffers.simple_bytes"),
    )


def round_up(size: int, granule: int) -> int:
    return -(-size // granule) * granule if size > 0 else 0


def p2p_read(topology: Topology) -> bool:
    """NCCL enables P2P read by default only between Ampere GPUs over NVLink (src/graph/paths.cc)."""
    return topology.compute_capability == 80 and topology.interconnect != "pcie"


def connection_allocation(conn: Connection, topology: Topology, buffers: ProtocolBuffers, *, cumem: bool) -> Allocation:
    """This rank's side of ``conn`` (a send/recv over the network gets only its headers: the pool is shared)."""
    c = constants()
    send_mem, recv_mem = c.integer("buffers.send_mem_bytes"), c.integer("buffers.recv_mem_bytes")
    granule = max(c.integer("buffers.ipc_align_bytes"), topology.granularity_bytes if cumem else 0)
    if conn.transport == "p2p":
        read = p2p_read(topology)
        if conn.direction == "send":
            return Allocation(round_up(send_mem + (buffers.simple if read else 0), granule), 0)
        size = recv_mem + buffers.ll + buffers.ll128 + (0 if read else buffers.simple)
        return Allocation(round_up(size, granule), 0)
    headers = send_mem + recv_mem
    if conn.conn_index == 1:
        return Allocation(0, headers)
    if not topology.gdr:
        return Allocation(0, buffers.total + headers)
    if conn.direction == "send":
        return Allocation(round_up(buffers.ll128 + buffers.simple, granule), buffers.ll + headers)
    return Allocation(round_up(buffers.total, granule), headers)


def p2p_chunk_bytes(topology: Topology, nranks: int, nodes: int, buffers: ProtocolBuffers) -> int:
    """src/init.cc computeBuffSizes: the send/recv chunk, which sizes the NET shared pool."""
    c = constants()
    if nodes > 1:
        arm_blackwell = topology.cpu_arm and topology.compute_capability >= 100
        ratio = c.integer("buffers.p2p_net_chunk_arm_ratio") if arm_blackwell else 1
        chunk = ratio * c.integer("buffers.p2p_net_chunk_bytes")
    elif nranks == 1 or topology.interconnect != "pcie":  # isAllNvlink: true for a lone GPU
        chunk = c.integer("buffers.p2p_nvl_chunk_bytes")
    else:
        chunk = c.integer("buffers.p2p_pci_chunk_bytes")
    steps = c.integer("buffers.steps")
    return min(chunk, buffers.simple // steps)


def net_shared_pool_bytes(p2p_channels: int, chunk: int) -> int:
    """src/transport/net.cc sharedNetBuffersInit: nChannels x NCCL_SHARED_STEPS x p2pChunkSize."""
    return p2p_channels * constants().integer("buffers.net_shared_steps") * chunk

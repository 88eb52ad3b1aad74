"""Which connections each algorithm makes for one rank: per channel, to which peer, in which direction.

Why: a connection is where NCCL's protocol buffers live, and NCCL makes each (channel, peer, direction,
connIndex) at most once (src/transport.cc ncclTransportP2pConnect skips a connected one and the rank itself).
So a 2-rank tree needs nothing the ring has not made, while a 4-rank chain's head adds one receive per
channel (NVIDIA/nccl#964: 544 vs 688 MB). Enumerating concrete connections, then removing duplicates, gets
both right. Mirrors src/transport/generic.cc (ring, tree, PAT), src/enqueue.cc (p2p), v2.30.7.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from simnccl.nccl.layout import Layout

Direction = Literal["send", "recv"]
Transport = Literal["p2p", "net"]


@dataclass(frozen=True, slots=True, order=True)
class Connection:
    """One side (this rank's) of a connection: ``conn_index`` 0 for collectives, 1 for send/recv."""

    channel: int
    peer: int
    direction: Direction
    conn_index: int
    transport: Transport

    @property
    def key(self) -> tuple[int, int, str, int]:
        """What NCCL dedups on (channel->peers[peer]->send/recv[connIndex].connected)."""
        return (self.channel, self.peer, self.direction, self.conn_index)


def _both_ways(layout: Layout, channel: int, peers: Iterable[int], conn_index: int = 0) -> list[Connection]:
    result = []
    for peer in peers:
        if peer == layout.rank:
            continue
        transport: Transport = "p2p" if layout.same_node(peer, layout.rank) else "net"
        result.append(Connection(channel, peer, "recv", conn_index, transport))
        result.append(Connection(channel, peer, "send", conn_index, transport))
    return result


def ring(layout: Layout, channels: int) -> list[Connection]:
    """Per channel: receive from the previous rank, send to the next (ncclTransportRingConnect)."""
    result = []
    me = layout.rank
    for c in range(channels):
        prev, nxt = layout.ring_neighbours(c)
        for peer, direction in ((prev, "recv"), (nxt, "send")):
            if peer != me:
                transport: Transport = "p2p" if layout.same_node(peer, me) else "net"
                result.append(Connection(c, peer, direction, 0, transport))  # type: ignore[arg-type]
    return result


def tree_neighbours(layout: Layout, channel: int, max_children: int) -> list[int]:
    """This rank's tree parent and children: a chain inside the node, a binary tree over node heads."""
    return next(_tree_neighbours(layout, range(channel, channel + 1), max_children))[1]


def _tree_neighbours(layout: Layout, channels: Iterable[int], max_children: int) -> Iterator[tuple[int, list[int]]]:
    """``tree_neighbours`` for each of ``channels``, with what does not depend on the channel found once.

    Why arithmetic: the chain is the node's order in the channel (``Layout.node_order``, a rotation of the
    node's ranks), so the rank's place in it and its neighbours need no list built and searched, and the head of
    another node is its order's first rank; a sharing world prices every one of its ranks on its own
    (``simnccl.comm_memory``), each over every channel (32 on H100): 131,072 orders for 4,096 ranks."""
    me, multi = layout.rank, layout.nodes > 1
    node = layout.node_of(me)
    first, size = layout.node_first(node), layout.sizes[node]
    nodes = []  # the nodes whose heads this node's head talks to: its parent node, then its children
    if multi:
        nodes = [(node - 1) // 2] if node > 0 else []
        nodes += [child for child in (2 * node + 1, 2 * node + 2) if child < layout.nodes][:max_children]
    heads = [(layout.node_first(other), layout.sizes[other]) for other in nodes]
    for channel in channels:
        shift = channel % size if multi else 0
        at = (me - first - shift) % size  # my index in the node's order
        neighbours = []
        if at > 0:
            neighbours.append(first + (at - 1 + shift) % size)
        if at + 1 < size:
            neighbours.append(first + (at + 1 + shift) % size)
        if at == 0:  # the node's head talks to the heads of its parent and child nodes (only across nodes)
            neighbours += [head + channel % count for head, count in heads]
        yield channel, neighbours


def tree(layout: Layout, channels: int, max_children: int = 2) -> list[Connection]:
    """Per channel: both directions with the tree parent and each child (ncclTransportTreeConnect).

    ``_both_ways`` written out, the node table looked up once: this runs for every rank of a sharing world."""
    me = layout.rank
    nodes_of = layout.nodes_by_rank()
    mine = nodes_of[me]
    result = []
    for c, neighbours in _tree_neighbours(layout, range(channels), max_children):
        for peer in neighbours:
            if peer == me:
                continue
            transport: Transport = "p2p" if nodes_of[peer] == mine else "net"
            result.append(Connection(c, peer, "recv", 0, transport))
            result.append(Connection(c, peer, "send", 0, transport))
    return result


def pat(layout: Layout, channels: int) -> list[Connection]:
    """PAT (one GPU per node): per channel, both directions with the ranks at distance 1, 2, 4, ...."""
    n, me = layout.nranks, layout.rank
    peers: list[int] = []
    mask = 1
    while mask < n:
        peers += [(me + mask) % n, (me - mask) % n]
        mask <<= 1
    unique = list(dict.fromkeys(peers))
    return [conn for c in range(channels) for conn in _both_ways(layout, c, unique)]


def collnet_direct(layout: Layout, channels: int, max_arity: int) -> list[Connection]:
    """CollNet Direct: per channel, both directions with up to ``max_arity`` other ranks of the node."""
    node = layout.node_of(layout.rank)
    local = [r for r in layout.node_order(node, 0) if r != layout.rank][:max_arity]
    return [conn for c in range(channels) for conn in _both_ways(layout, c, local)]


def point_to_point(
    layout: Layout,
    peers: Iterable[int],
    per_peer: int,
    p2p_channels: int,
    directions: tuple[Direction, ...] = ("recv", "send"),
) -> list[Connection]:
    """Send/recv (connIndex 1): ``per_peer`` channels to each peer, in the ``directions`` the calls need.

    NCCL connects each direction on its own (src/enqueue.cc: a send marks ``connectSend[peer]``, a receive
    ``connectRecv[peer]``): a send alone connects no receive; an all-to-all both, to every peer."""
    result = []
    for peer in sorted(set(peers)):
        if peer == layout.rank:
            continue  # NCCL copies to itself
        base = (peer * per_peer) % p2p_channels
        for part in range(per_peer):
            conns = _both_ways(layout, (base + part) % p2p_channels, [peer], conn_index=1)
            result += [conn for conn in conns if conn.direction in directions]
    return result


def unique(connections: Iterable[Connection], already: Iterable[tuple[int, int, str, int]] = ()) -> list[Connection]:
    """Connections not yet made, in a stable order; the first algorithm that makes one pays for it."""
    seen = set(already)
    result = []
    for conn in connections:
        if conn.key not in seen:
            seen.add(conn.key)
            result.append(conn)
    return result

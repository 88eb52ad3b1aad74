"""Where a communicator's ranks sit: how many, how many per node, how many nodes, and which one we price.

Why: NCCL's memory is per rank and depends on the rank's neighbours (a ring's previous and next rank, a
tree's parent and children, a node's network head), so the model computes one concrete rank of one concrete
layout. Ranks are numbered node by node (ranks ``n*L .. n*L+L-1`` on node ``n``), as torch's launchers do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from simnccl.nccl.constants import NcclInputError


@dataclass(frozen=True, slots=True)
class Layout:
    """``nranks`` ranks on ``nodes`` nodes; ``rank`` is the one being priced, ``local_ranks`` its node's count.

    Uneven groups (torch's ``new_group([0, 1, 2, 8])``: three ranks on one node, one on another) give
    ``node_sizes`` (ranks per node, in rank order); even ones leave it empty (``local_ranks`` on every node).
    """

    nranks: int
    local_ranks: int
    nodes: int
    rank: int = 0
    node_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("nranks", "local_ranks", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NcclInputError(f"layout.{name}: expected an integer >= 1, got {value!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.nranks:
            raise NcclInputError(f"layout.rank: expected 0 <= rank < {self.nranks}, got {self.rank!r}")
        if not self.node_sizes:
            if self.local_ranks * self.nodes != self.nranks:
                raise NcclInputError(
                    f"layout: nranks ({self.nranks}) must equal local_ranks ({self.local_ranks}) x nodes ({self.nodes})"
                    " (give node_sizes for an uneven group)"
                )
            return
        sizes = self.node_sizes
        if len(sizes) != self.nodes or sum(sizes) != self.nranks or any(n < 1 for n in sizes):
            raise NcclInputError(
                f"layout.node_sizes: expected {self.nodes} counts >= 1 summing to {self.nranks}, got {list(sizes)}"
            )
        if sizes[self.node_of(self.rank)] != self.local_ranks:
            raise NcclInputError(
                f"layout.local_ranks: rank {self.rank}'s node holds {sizes[self.node_of(self.rank)]} ranks "
                f"(node_sizes {list(sizes)}), got {self.local_ranks}"
            )

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.node_sizes or _even_sizes(self.local_ranks, self.nodes)

    @property
    def max_local_ranks(self) -> int:
        return max(self.sizes)

    def node_of(self, rank: int) -> int:
        nodes = _tables(self.sizes)[2]
        if rank < len(nodes):
            return nodes[rank] if rank >= 0 else 0
        raise NcclInputError(f"layout: rank {rank} is outside 0..{self.nranks - 1}")

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def nodes_by_rank(self) -> tuple[int, ...]:
        """Each rank's node, by rank: one table for a caller asking about many ranks (``node_of`` finds the
        table on every question)."""
        return _tables(self.sizes)[2]

    def node_first(self, node: int) -> int:
        """The lowest rank on ``node``."""
        return _tables(self.sizes)[1][node]

    def node_order(self, node: int, channel: int) -> list[int]:
        """The node's ranks in channel ``channel``'s ring order.

        On one node every channel uses rank order (NVIDIA/nccl#964's rank-0 figure is the chain head's); across
        nodes each channel enters a node through a different GPU (one per NIC), modelled as a rotation by
        ``channel mod ranks on the node``.
        """
        first, size = self.node_first(node), self.sizes[node]
        shift = channel % size if self.nodes > 1 else 0
        return [first + (i + shift) % size for i in range(size)]

    def ring(self, channel: int) -> list[int]:
        return [r for node in range(self.nodes) for r in self.node_order(node, channel)]

    def ring_neighbours(self, channel: int) -> tuple[int, int]:
        """The priced rank's previous and next rank in channel ``channel``'s ring (``ring``), without building it.

        Why: ``ring`` lists every rank, so asking each member of a group for its neighbours was quadratic in the
        group (an uneven 4,095-rank group under ``NCCL_RUNTIME_CONNECT=0`` took 435 s to price, one rank after
        another). The ring is the nodes' orders one after the other, each a rotation of its node's ranks, so a
        rank's neighbours are found from its node and place: the same answer in constant time."""
        sizes = self.sizes
        firsts = _tables(sizes)[1]
        me = self.rank
        node = self.node_of(me)
        size = sizes[node]
        rotated = self.nodes > 1
        shift = channel % size if rotated else 0
        at = (me - firsts[node] - shift) % size  # my index in my node's order
        if at > 0:
            prev = firsts[node] + (at - 1 + shift) % size
        else:  # the last of the previous node's order (the last node's, from the first)
            other = (node - 1) % self.nodes
            other_size = sizes[other]
            prev = firsts[other] + (other_size - 1 + (channel % other_size if rotated else 0)) % other_size
        if at + 1 < size:
            nxt = firsts[node] + (at + 1 + shift) % size
        else:  # the first of the next node's order (the first node's, from the last)
            other = (node + 1) % self.nodes
            other_size = sizes[other]
            nxt = firsts[other] + (channel % other_size if rotated else 0) % other_size
        return prev, nxt


# Tables by node sizes, built once per process: the connection enumeration asks for a rank's node hundreds of
# thousands of times in a property run.


@functools.lru_cache(maxsize=1024)
def _even_sizes(local_ranks: int, nodes: int) -> tuple[int, ...]:
    return (local_ranks,) * nodes


@functools.lru_cache(maxsize=1024)
def _firsts(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The first rank of each node (and, last, the rank count)."""
    firsts = [0]
    for size in sizes:
        firsts.append(firsts[-1] + size)
    return tuple(firsts)


@functools.lru_cache(maxsize=1024)
def _nodes_of(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Each rank's node, by rank."""
    return tuple(node for node, size in enumerate(sizes) for _ in range(size))


_TABLES_KEPT = 1024
_TABLES: dict[int, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}


def _tables(sizes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(``sizes``, ``_firsts``, ``_nodes_of``) looked up by the tuple's identity: a layout asks for a rank's node
    once per connection it prices, and the caches above hash the whole tuple each time (tuples don't keep their
    hash), which made each question cost the group's node count (a 2,048-node group: 2,048 hashed items a
    question). The entry holds the tuple, so its id is not reused while the entry lives."""
    entry = _TABLES.get(id(sizes))
    if entry is None or entry[0] is not sizes:
        if len(_TABLES) >= _TABLES_KEPT:
            _TABLES.clear()
        entry = _TABLES[id(sizes)] = (sizes, _firsts(sizes), _nodes_of(sizes))
    return entry

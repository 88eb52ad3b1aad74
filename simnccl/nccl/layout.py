"""Where a communicator's ranks sit: how many, how many per node, how many nodes, and which one we price.

Why: NCCL's memory is per rank and depends on the rank's neighbours (a ring's previous and next rank, a
tree's parent and children, a node's network head), so the model computes one concrete rank of one concrete
layout. Ranks are numbered node by node (ranks ``n*L .. n*L+L-1`` on node ``n``), as torch's launchers do.
"""

from __future__ import annotations

from dataclasses import dataclass

from simnccl.nccl.constants import NcclInputError


@dataclass(frozen=True, slots=True)
class Layout:
    """``nranks`` ranks on ``nodes`` nodes, ``local_ranks`` per node; ``rank`` is the one being priced."""

    nranks: int
    local_ranks: int
    nodes: int
    rank: int = 0

    def __post_init__(self) -> None:
        for name in ("nranks", "local_ranks", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NcclInputError(f"layout.{name}: expected an integer >= 1, got {value!r}")
        if self.local_ranks * self.nodes != self.nranks:
            raise NcclInputError(
                f"layout: nranks ({self.nranks}) must equal local_ranks ({self.local_ranks}) x nodes ({self.nodes})"
            )
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.nranks:
            raise NcclInputError(f"layout.rank: expected 0 <= rank < {self.nranks}, got {self.rank!r}")

    def node_of(self, rank: int) -> int:
        return rank // self.local_ranks

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def node_order(self, node: int, channel: int) -> list[int]:
        """The node's ranks in channel ``channel``'s ring order.

        On one node every channel uses rank order (NVIDIA/nccl#964's rank-0 figure is the chain head's); across
        nodes each channel enters a node through a different GPU (one per NIC), modelled as a rotation by
        ``channel mod local_ranks``.
        """
        first = node * self.local_ranks
        shift = channel % self.local_ranks if self.nodes > 1 else 0
        return [first + (i + shift) % self.local_ranks for i in range(self.local_ranks)]

    def ring(self, channel: int) -> list[int]:
        return [r for node in range(self.nodes) for r in self.node_order(node, channel)]

"""A communicator layout's ring neighbours (``Layout.ring_neighbours``) are the ring's (``Layout.ring``)."""

from __future__ import annotations

import itertools

from simnccl.nccl.connections import ring
from simnccl.nccl.layout import Layout


def _layouts(max_nodes: int, max_size: int):
    """Every even and uneven layout up to ``max_nodes`` nodes of up to ``max_size`` ranks each."""
    for nodes in range(1, max_nodes + 1):
        for sizes in itertools.product(range(1, max_size + 1), repeat=nodes):
            even = len(set(sizes)) == 1
            yield sizes, even


def test_ring_neighbours_are_the_rings_for_every_rank_and_channel() -> None:
    checked = 0
    for sizes, even in _layouts(4, 4):
        nranks = sum(sizes)
        for rank in range(nranks):
            node = next(n for n in range(len(sizes)) if rank < sum(sizes[: n + 1]))
            layout = Layout(nranks, sizes[node], len(sizes), rank, () if even else sizes)
            for channel in range(9):
                order = layout.ring(channel)
                at = order.index(rank)
                expected = (order[at - 1], order[(at + 1) % len(order)])
                assert layout.ring_neighbours(channel) == expected, (sizes, rank, channel)
                checked += 1
    assert checked > 10_000


def test_ring_connections_of_a_large_uneven_group_are_made_without_listing_the_ring() -> None:
    """Each member asks for its neighbours: listing the whole ring per channel made a group's pricing quadratic.
    Pinned by counting, not timing: ``Layout.ring`` is not called."""
    sizes = (8,) * 511 + (7,)
    calls = []
    original = Layout.ring

    def counting(self: Layout, channel: int) -> list[int]:
        calls.append(channel)
        return original(self, channel)

    Layout.ring = counting  # type: ignore[method-assign]
    try:
        connections = ring(Layout(sum(sizes), 7, len(sizes), sum(sizes) - 1, sizes), 32)
    finally:
        Layout.ring = original  # type: ignore[method-assign]
    assert calls == []
    assert {(c.peer, c.direction, c.transport) for c in connections if c.channel == 0} == {
        (sum(sizes) - 2, "recv", "p2p"),
        (0, "send", "net"),
    }

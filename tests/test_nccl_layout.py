"""A communicator layout's ring neighbours (``Layout.ring_neighbours``) are the ring's (``Layout.ring``); a rank's
tree neighbours are its node chain's and the node heads' (``Layout.node_order``)."""

from __future__ import annotations

import itertools

import pytest

from simnccl.nccl.connections import ring, tree, tree_neighbours
from simnccl.nccl.layout import Layout


def _layouts(max_nodes: int, max_size: int):
    """Every even and uneven layout up to ``max_nodes`` nodes of up to ``max_size`` ranks each, as seen by each of
    its ranks: (node sizes, rank, that rank's Layout)."""
    for nodes in range(1, max_nodes + 1):
        for sizes in itertools.product(range(1, max_size + 1), repeat=nodes):
            even = len(set(sizes)) == 1
            nranks = sum(sizes)
            for rank in range(nranks):
                node = next(n for n in range(len(sizes)) if rank < sum(sizes[: n + 1]))
                yield sizes, rank, Layout(nranks, sizes[node], len(sizes), rank, () if even else sizes)


def test_ring_neighbours_are_the_rings_for_every_rank_and_channel() -> None:
    checked = 0
    for sizes, rank, layout in _layouts(4, 4):
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


def _tree_neighbours_by_the_orders(layout: Layout, channel: int, max_children: int) -> list[int]:
    """The definition: the chain of the node's order in ``channel``, and a node head's parent and child heads."""
    me = layout.rank
    node = layout.node_of(me)
    order = layout.node_order(node, channel)
    at = order.index(me)
    out = order[at - 1 : at] if at > 0 else []
    out += order[at + 1 : at + 2]
    if at == 0 and layout.nodes > 1:
        nodes = [(node - 1) // 2] if node > 0 else []
        nodes += [child for child in (2 * node + 1, 2 * node + 2) if child < layout.nodes][:max_children]
        out += [layout.node_order(other, channel)[0] for other in nodes]
    return out


def test_tree_neighbours_are_the_node_orders_for_every_rank_and_channel() -> None:
    checked = 0
    for sizes, rank, layout in _layouts(4, 4):
        for channel in range(9):
            for max_children in (0, 1, 2):
                expected = _tree_neighbours_by_the_orders(layout, channel, max_children)
                assert tree_neighbours(layout, channel, max_children) == expected, (sizes, rank, channel)
                checked += 1
    assert checked > 30_000


def test_tree_connections_are_made_without_building_a_node_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharing world prices each of its ranks on its own, over every channel: building a node's order (and
    searching it) per channel and per neighbour was most of a 4,096-rank world's first barrier. Pinned by
    counting, not timing: ``Layout.node_order`` is not called, and the connections are the definition's."""
    layouts = [Layout(64, 8, 8, rank) for rank in range(64)] + [Layout(11, 3, 4, 9, (4, 2, 2, 3))]
    expected = {}
    for layout in layouts:
        wanted = []
        for c in range(32):
            for peer in _tree_neighbours_by_the_orders(layout, c, 2):
                transport = "p2p" if layout.same_node(peer, layout.rank) else "net"
                wanted += [(c, peer, "recv", 0, transport), (c, peer, "send", 0, transport)]
        expected[layout] = wanted
    calls = []
    monkeypatch.setattr(Layout, "node_order", lambda self, node, channel: calls.append(node))
    for layout in layouts:
        made = [(c.channel, c.peer, c.direction, c.conn_index, c.transport) for c in tree(layout, 32)]
        assert made == expected[layout], layout
    assert calls == []

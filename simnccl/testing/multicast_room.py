"""Whether a generated program stays within a node's NVLS multicast slots, whatever the policy.

A *valid* generated program is one every policy should pass: it is correct torch usage and fits the hardware.
Memory always fits (programs are small next to a GPU's capacity), but multicast slots are scarcer: an 8-GPU
H200 node holds 128, a communicator with NVLS takes about 10 (``simnccl/data/nvls_multicast.toml``), so a
program that creates a 13th communicator spanning two or more GPUs of one node fails at creation on NCCL >= 2.29
— in real life (pytorch/pytorch#187155) and in the simulator. Such a program tests the hardware, not the policy,
so ``cases()`` rejects it. The count is an upper bound that holds under every policy (no policy makes more
communicators than the program's groups, its world group and its send/recv pairs), and it counts a
communicator on a node when at least two of its members sit there, whether or not NCCL would turn NVLS on.
"""

from __future__ import annotations

from collections.abc import Sequence

from simnccl.engine.nvls import multicast_data, slots_per_node
from simnccl.ops import WORLD, NewGroup, Op, PointToPoint, SplitGroup


def communicators_per_node(programs: Sequence[Sequence[Op]], gpus_per_node: int) -> dict[int, int]:
    """Per node: the most communicators with two or more members on it that the programs can create (a
    ``split_group`` child counts as a group: a communicator of its own, split from its parent's)."""
    world = len(programs)
    # (what, its members, what tells it from another of the same members)
    groups: set[tuple[object, tuple[int, ...], object]] = {(WORLD, tuple(range(world)), 0)}
    for rank, program in enumerate(programs):
        seen: dict[tuple[object, ...], int] = {}
        members: dict[str | None, tuple[int, ...]] = {WORLD: tuple(range(world))}  # this rank's groups, by handle
        for op in program:
            made: tuple[int, ...] | None = None
            if isinstance(op, NewGroup):
                made = tuple(range(world)) if op.ranks is None else tuple(op.ranks)
            elif isinstance(op, SplitGroup) and op.parent in members:
                parent = members[op.parent]
                mine = next((s for s in op.split_ranks if parent.index(rank) in s), None)
                if mine is not None and all(0 <= r < len(parent) for r in mine):
                    made = tuple(parent[r] for r in mine)
            if made is not None:
                ranks = tuple(sorted(made))
                if rank in ranks:
                    members[op.bind] = made
                key = (op.bind, ranks)
                seen[key] = seen.get(key, 0) + 1
                groups.add((op.bind, ranks, seen[key]))  # the same handle re-made with the same ranks: another
            elif isinstance(op, PointToPoint):
                groups.add((f"p2p on {op.group}", tuple(sorted((rank, op.peer))), "p2p"))
    counts: dict[int, int] = {}
    for _, members, _ in groups:
        local: dict[int, int] = {}
        for member in members:
            local[member // gpus_per_node] = local.get(member // gpus_per_node, 0) + 1
        for node, n in local.items():
            if n >= 2:
                counts[node] = counts.get(node, 0) + 1
    return counts


def most_communicators_per_node(gpu: str) -> int | None:
    """How many NVLS communicators one node of this kind holds (None: the data sets no limit)."""
    slots = slots_per_node(gpu)
    if slots is None:
        return None
    return slots // multicast_data().integer("per_communicator.slots")


def within_multicast_slots(programs: Sequence[Sequence[Op]], gpu: str, gpus_per_node: int) -> bool:
    most = most_communicators_per_node(gpu)
    if most is None:
        return True
    return all(n <= most for n in communicators_per_node(programs, gpus_per_node).values())

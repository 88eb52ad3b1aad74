"""Generated valid programs stay within a node's NVLS multicast slots (simnccl.testing.multicast_room).

An 8-GPU H200 node holds 128 multicast slots and an NVLS communicator takes ~10, so torch 2.15's eager groups
fail at the 13th communicator (the world group plus 12 groups). Before the bound, `cases()` drew such programs
(3-4 in 2,000 of `benchmarks/property.py`'s draws), and "a valid program passes under any policy" failed on them.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, Op, SetDevice, SplitGroup
from simnccl.testing import invariants as inv
from simnccl.testing.multicast_room import (
    communicators_per_node,
    most_communicators_per_node,
    within_multicast_slots,
)
from simnccl.testing.replay import SimCase
from simnccl.testing.strategies import cases


def _world_groups(count: int, world: int = 8) -> tuple[tuple[Op, ...], ...]:
    ops: tuple[Op, ...] = (SetDevice(), InitProcessGroup(backend="nccl"))
    ops += tuple(NewGroup(ranks=tuple(range(world)), bind=f"g{i}") for i in range(count))
    return (ops,) * world


def test_h200_holds_twelve_communicators_per_node() -> None:
    assert most_communicators_per_node("h200-141gb") == 12
    assert most_communicators_per_node("h100-80gb") is None  # no measured limit: nothing rejected


def test_the_bound_sits_where_the_simulator_fails() -> None:
    fits, too_many = _world_groups(11), _world_groups(12)  # + the world group: 12 and 13 communicators
    assert communicators_per_node(fits, 8) == {0: 12} and communicators_per_node(too_many, 8) == {0: 13}
    assert within_multicast_slots(fits, "h200-141gb", 8)
    assert not within_multicast_slots(too_many, "h200-141gb", 8)
    assert within_multicast_slots(too_many, "h100-80gb", 8)
    ran = {n: SimCase(programs=p, gpu="h200-141gb", gpus_per_node=8).run() for n, p in ((11, fits), (12, too_many))}
    assert inv.passes(ran[11])
    verdict = inv.passes(ran[12])
    # NCCL >= 2.29's failed multicast bind, as torch reports it, at the 12th group (the 13th communicator)
    assert not verdict and "bind='g11'" in verdict.explanation and "unhandled cuda error" in verdict.explanation


def test_groups_of_one_member_per_node_take_no_slot_there() -> None:
    world = 16  # 2 nodes of 8: a group of one rank per node has no NVLS on either node
    ops: tuple[Op, ...] = (SetDevice(), InitProcessGroup(backend="nccl"))
    ops += tuple(NewGroup(ranks=(i, 8 + i), bind=f"x{i}") for i in range(8))
    assert communicators_per_node((ops,) * world, 8) == {0: 1, 1: 1}  # the world group only


def test_split_group_children_take_slots_as_groups_do() -> None:
    """A split_group child is a communicator of its own: cases() draws splits, and a program of splits past the
    slots was not rejected (counted as the world group alone), then failed under every policy."""
    ops: tuple[Op, ...] = (SetDevice(), InitProcessGroup(backend="nccl"), AllReduce())
    ops += tuple(SplitGroup(split_ranks=((0, 1, 2, 3), (4, 5, 6, 7)), bind=f"s{i}") for i in range(12))
    assert communicators_per_node((ops,) * 8, 8) == {0: 25}  # the world group + 12 x two children
    assert not within_multicast_slots((ops,) * 8, "h200-141gb", 8)
    family = NewGroup(ranks=(0, 1, 2, 3), bind="f")  # a family's part splits into its own children
    split = SplitGroup(split_ranks=((0, 1),), parent="f", bind="c")
    lower = (SetDevice(), InitProcessGroup(backend="nccl"), family, AllReduce(group="f"), split)
    assert communicators_per_node((lower,) * 4, 8) == {0: 3}  # world, f, c = (0, 1); 2 and 3 are no members


@given(cases(gpu="h200-141gb", min_world=8, max_world=8, policy=st.none()))
def test_generated_h200_programs_pass_under_torch_defaults(case: SimCase) -> None:
    out = case.run()
    assert (v := inv.passes(out)), v.explanation

"""The real driver's data check (``simnccl.real.data_check``): what each rank's data names, what a result names,
which element types can carry the check. The real runs that use it: ``tests/test_real_gloo_semantics.py``
(cross-wired groups, and every other probe, whose data must not be flagged)."""

from __future__ import annotations

from typing import Any

import pytest

from simnccl.real.data_check import MOVES, SUMS, largest, senders, value_of

torch = pytest.importorskip("torch")

from simnccl.real.data_check import foreign_senders, sample, unchecked_reason  # noqa: E402


def test_a_sum_of_distinct_ranks_is_the_mask_of_the_ranks_summed() -> None:
    assert [value_of(r, SUMS) for r in range(4)] == [1, 2, 4, 8]
    assert senders(value_of(1, SUMS) + value_of(2, SUMS), 4, SUMS) == {1, 2}
    assert largest(4, SUMS) == 15


def test_moved_data_names_its_sender_and_zero_names_no_one() -> None:
    assert [value_of(r, MOVES) for r in range(3)] == [1, 2, 3]
    assert [senders(v, 3, MOVES) for v in (0.0, 1.0, 3.0)] == [set(), {0}, {2}]


@pytest.mark.parametrize("value", [-1.0, 0.5, 16.0, 2.5])
def test_a_value_no_encoding_makes_names_no_one(value: float) -> None:
    assert senders(value, 4, SUMS) == set()
    assert senders(value, 4, MOVES) == set()


def test_a_result_holding_data_of_a_rank_outside_the_group_names_it() -> None:
    # rank 2 of group [0, 2], cross-wired: its all_reduce summed ranks 1 and 2
    result = torch.full((24,), float(value_of(1, SUMS) + value_of(2, SUMS)))
    assert foreign_senders(result, 2, [0, 2], 4, SUMS) == [1]
    # an all_gather whose second half came from rank 3
    gathered = torch.cat([torch.full((4,), float(value_of(0, MOVES))), torch.full((4,), float(value_of(3, MOVES)))])
    assert foreign_senders(gathered, 0, [0, 2], 4, MOVES, chunks=2) == [3]


def test_members_data_partial_sums_and_unwritten_outputs_are_not_flagged() -> None:
    members = [0, 2]
    assert foreign_senders(torch.full((8,), 5.0), 2, members, 4, SUMS) == []  # ranks 0 and 2 summed
    assert foreign_senders(torch.full((8,), 4.0), 2, members, 4, SUMS) == []  # rank 2's own value only
    assert foreign_senders(torch.zeros(8), 2, members, 4, MOVES) == []


def test_garbage_without_a_wrong_connections_signature_is_not_read_as_one() -> None:
    # rank 0's value summed twice (2 = 1 + 1) reads as rank 1's: a misaligned sum of members, not a wrong peer
    assert foreign_senders(torch.full((8,), 2.0), 0, [0, 2], 4, SUMS) == []
    # a sum of the wrong size (ranks 0, 1 and 3 for a group of two), or one without the receiver
    assert foreign_senders(torch.full((8,), 11.0), 0, [0, 2], 4, SUMS) == []
    assert foreign_senders(torch.full((8,), 10.0), 0, [0, 2], 4, SUMS) == []
    # a chunk that is not one value throughout (a partly written output)
    partial = torch.cat([torch.full((4,), float(value_of(3, MOVES))), torch.zeros(4)])
    assert foreign_senders(partial, 0, [0, 2], 4, MOVES) == []


def test_the_sample_reads_each_members_chunk_at_both_ends_and_its_middle() -> None:
    # eight chunks of 1,000 elements: three elements each, whatever the size (no copy, no sort)
    result = torch.arange(8_000, dtype=torch.float32)
    assert sample(result, chunks=8) == [[1000.0 * i, 1000.0 * i + 500, 1000.0 * i + 999] for i in range(8)]
    assert sample(torch.full((5,), 3.0)) == [[3.0, 3.0, 3.0]]
    assert sample(torch.full((1,), 3.0)) == [[3.0]]
    assert sample(torch.zeros(0)) == []
    assert sample(torch.full((4,), 2 + 0j, dtype=torch.complex64)) == [[2.0, 2.0, 2.0]]


@pytest.mark.parametrize(
    ("dtype", "world", "kind", "checked"),
    [
        ("float32", 8, SUMS, True),
        ("bfloat16", 8, SUMS, True),  # 255: eight significant bits, bfloat16's all
        ("bfloat16", 9, SUMS, False),
        ("int8", 7, SUMS, True),
        ("int8", 8, SUMS, False),  # 255 overflows
        ("int8", 8, MOVES, True),
        ("bool", 2, MOVES, False),
        ("float8_e8m0fnu", 4, SUMS, False),
        ("complex64", 8, SUMS, True),
    ],
)
def test_which_element_types_carry_the_check(dtype: str, world: int, kind: str, checked: bool) -> None:
    reason = unchecked_reason(torch, getattr(torch, dtype), world, kind)
    assert (reason is None) == checked, reason
    if reason is not None:
        assert reason.startswith("data not checked:") and str(largest(world, kind)) in reason


def _driver(rank: int, world_size: int) -> Any:
    from simnccl.ops import Program
    from simnccl.real.driver import Driver, Progress, RankSpec

    return Driver(RankSpec(rank=rank, world_size=world_size, program=[]), Program(()), Progress(""))


class _Group:
    """What the driver reads of a process group for the check: its name (members come from its own record)."""

    group_name = "3"


def test_the_driver_fills_each_input_with_its_ranks_value_and_each_output_with_zeros() -> None:
    driver = _driver(rank=2, world_size=4)
    assert torch.equal(driver._tensor(16, "Float", kind=SUMS), torch.full((4,), 4.0))
    assert torch.equal(driver._tensor(16, "Float", kind=MOVES), torch.full((4,), 3.0))
    assert torch.equal(driver._tensor(16, "Float"), torch.zeros(4))
    assert torch.equal(driver._tensor(4, "Bool", kind=MOVES), torch.ones(4, dtype=torch.bool))  # cannot carry it


def test_the_driver_stops_a_rank_whose_result_holds_another_groups_data_and_says_where_it_did_not_check() -> None:
    from simnccl.backends.gloo import FOREIGN_RANKS
    from simnccl.ops import AllReduce
    from simnccl.real.data_check import FOREIGN_DATA_TYPE
    from simnccl.real.driver import CheckFailure

    driver = _driver(rank=0, world_size=4)
    group = _Group()
    driver.members[id(group)] = [0, 2]
    op = AllReduce(group="g", size_bytes=16)
    mine = torch.full((4,), float(value_of(0, SUMS) + value_of(2, SUMS)))
    assert driver._check_data(op, group, mine, SUMS) == ""
    with pytest.raises(CheckFailure) as caught:
        driver._check_data(op, group, torch.full((4,), float(value_of(0, SUMS) + value_of(3, SUMS))), SUMS)
    assert caught.value.type_name == FOREIGN_DATA_TYPE
    assert caught.value.facts == {FOREIGN_RANKS: [3]}  # written beside the message into the final record
    assert "all_reduce on group '3' of ranks [0, 2] returned data sent by ranks [3]" in str(caught.value)
    unchecked = driver._check_data(op, group, torch.ones(4, dtype=torch.bool), SUMS)
    assert unchecked.startswith("; data not checked: torch.bool cannot hold 15 exactly")
    driver._check_data(op, group, torch.ones(4, dtype=torch.bool), SUMS)
    assert driver.notes == [unchecked[2:]]  # once, for the run's report

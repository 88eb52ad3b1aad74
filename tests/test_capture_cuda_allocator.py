"""torch's CUDA caching allocator as ``simnccl.capture.cuda_allocator`` models it: rounding, pools, segments,
best-fit reuse, splitting, coalescing and ``empty_cache`` (c10/cuda/CUDACachingAllocator.cpp, torch 2.15.0)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")  # simnccl.capture, the package, drives real torch
from simnccl.capture.cuda_allocator import Block, CachingAllocator, allocator_sizes

MIB = 1024 * 1024


def test_the_shipped_sizes_are_torchs_defaults() -> None:
    sizes = allocator_sizes()
    assert (sizes.min_block, sizes.small_size, sizes.small_buffer) == (512, MIB, 2 * MIB)
    assert (sizes.large_buffer, sizes.min_large_alloc, sizes.round_large) == (20 * MIB, 10 * MIB, 2 * MIB)


def test_requests_round_to_512_bytes_and_small_ones_share_a_2_mib_segment() -> None:
    allocator = CachingAllocator()
    blocks = [allocator.malloc(0, n) for n in (1, 512, 513, MIB)]
    assert [b.size for b in blocks if b] == [512, 512, 1024, MIB]
    assert allocator.allocated == {0: 512 + 512 + 1024 + MIB} and allocator.reserved == {0: 2 * MIB}
    allocator.malloc(0, MIB)  # no longer fits the first segment's rest: a second one
    assert allocator.reserved == {0: 4 * MIB}


def test_segment_sizes_follow_get_allocation_size() -> None:
    # the request is rounded first: 10 MiB - 1 byte is a 10 MiB request, at kMinLargeAlloc
    cases = [(MIB + 1, 20 * MIB), (10 * MIB - 512, 20 * MIB), (10 * MIB - 1, 10 * MIB), (11 * MIB, 12 * MIB)]
    for request, segment in cases:
        allocator = CachingAllocator()
        allocator.malloc(0, request)
        assert allocator.reserved == {0: segment}, request


def test_a_large_block_keeps_a_remainder_of_at_most_1_mib_unsplit() -> None:
    allocator = CachingAllocator()
    block = allocator.malloc(0, 19 * MIB + MIB // 2)  # a 20 MiB segment; 0.5 MiB left is not split off
    assert block is not None and block.size == 20 * MIB and allocator.allocated == {0: 20 * MIB}
    allocator.malloc(0, 12 * MIB)  # nothing cached to reuse: its own 12 MiB segment
    assert allocator.reserved == {0: 32 * MIB}


def test_the_smallest_cached_block_that_fits_is_reused() -> None:
    allocator = CachingAllocator()
    keep = [allocator.malloc(0, 12 * MIB), allocator.malloc(0, 16 * MIB)]  # their own 12 and 16 MiB segments
    for block in keep:
        assert block is not None
        allocator.free(block)
    again = allocator.malloc(0, 11 * MIB)
    assert again is not None and again.address == keep[0].address  # the 12 MiB block, not the 16 MiB one
    assert allocator.reserved == {0: 28 * MIB}


def test_freed_neighbours_coalesce_so_empty_cache_returns_the_segment() -> None:
    allocator = CachingAllocator()
    parts = [allocator.malloc(0, 4 * MIB) for _ in range(3)]  # one 20 MiB segment, split three times
    assert allocator.reserved == {0: 20 * MIB}
    for block in (parts[1], parts[0]):
        assert block is not None
        allocator.free(block)
    allocator.empty_cache()
    assert allocator.reserved == {0: 20 * MIB}  # parts[2] still lives in it
    assert parts[2] is not None
    allocator.free(parts[2])
    allocator.empty_cache()
    assert allocator.reserved == {0: 0} and allocator.allocated == {0: 0}


def test_zero_bytes_take_no_block() -> None:
    allocator = CachingAllocator()
    assert allocator.malloc(0, 0) is None and allocator.reserved == {}


def _segments(allocator: CachingAllocator, live: list[Block]) -> dict[tuple[int, int], int]:
    """Every block (live or cached) by (device, address): the allocator's whole address space."""
    blocks = {(b.device, b.address): b.size for b in live}
    blocks.update({key: block.size for key, block in allocator._free.items()})
    return blocks


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("malloc"), st.integers(0, 1), st.integers(1, 24 * MIB)),
            st.tuples(st.just("free"), st.integers(0, 50), st.just(0)),
            st.tuples(st.just("empty"), st.just(0), st.just(0)),
        ),
        max_size=60,
    )
)
def test_blocks_tile_the_reserved_segments_and_allocated_never_exceeds_reserved(steps) -> None:
    allocator = CachingAllocator()
    live: list[Block] = []
    for action, a, b in steps:
        if action == "malloc":
            block = allocator.malloc(a, b)
            assert block is not None and block.size >= b
            live.append(block)
        elif action == "free" and live:
            allocator.free(live.pop(a % len(live)))
        elif action == "empty":
            allocator.empty_cache()
        for device in (0, 1):
            assert allocator.allocated.get(device, 0) == sum(x.size for x in live if x.device == device)
            tiles = sum(size for (d, _), size in _segments(allocator, live).items() if d == device)
            assert tiles == allocator.reserved.get(device, 0)  # no byte lost or counted twice
            assert allocator.allocated.get(device, 0) <= allocator.reserved.get(device, 0)
    for block in live:
        allocator.free(block)
    allocator.empty_cache()
    assert allocator.total_reserved == 0

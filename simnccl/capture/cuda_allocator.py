"""torch's CUDA caching allocator, for what a captured rank's CUDA tensors reserve on each device.

Why: what a device has free (``cudaMemGetInfo``, and so NCCL's own ``cudaMalloc`` when a communicator is created)
is the device minus the segments torch's allocator reserved, not minus the bytes tensors hold. torch rounds every
request up to 512 bytes, packs requests up to 1 MiB into 2 MiB segments, gives requests under 10 MiB a 20 MiB
segment and rounds larger ones to 2 MiB; freed blocks stay reserved (cached) and are reused best-fit. A tiny
model's hundred small parameters reserve a few 2 MiB segments, a 12 MiB buffer reserves 20 MiB: charging live
bytes instead would tell a user their startup fits when the real allocator would not leave NCCL the room.

What is modelled, after torch 2.15's ``c10/cuda/CUDACachingAllocator.cpp`` with its default configuration
(sizes in ``simnccl/data/cuda_caching_allocator.toml``): ``round_size``; the small and large pools;
``get_allocation_size``; ``get_free_block`` (the smallest free block of the pool that fits, lowest address on a
tie); ``should_split``; coalescing a freed block with free neighbours of its segment; ``empty_cache`` releasing
the segments that are wholly free. Addresses are a per-device counter (segments in creation order), standing in
for ``cudaMalloc``'s pointers, which torch only compares.

Not modelled: streams (a capture runs on one stream, ``record_stream`` is a no-op there);
``PYTORCH_CUDA_ALLOC_CONF`` options (``expandable_segments`` and ``garbage_collection_threshold`` reserve less,
``max_split_size_mb`` and ``roundup_power2_divisions`` can reserve more); the retry after freeing the cache when
``cudaMalloc`` fails (a capture has no capacity: the simulator, which charges these segments, decides what
fits); the ``cudaMallocAsync`` backend.
"""

from __future__ import annotations

import bisect
import functools
import importlib.resources
from dataclasses import dataclass

from simnccl.nccl.constants import parse_constants

DATA_FILE = "cuda_caching_allocator.toml"


@dataclass(frozen=True, slots=True)
class AllocatorSizes:
    """The allocator's size rules (bytes), from the data file."""

    min_block: int
    small_size: int
    small_buffer: int
    large_buffer: int
    min_large_alloc: int
    round_large: int

    def round_size(self, nbytes: int) -> int:
        """``round_size``: every request up to a multiple of the minimum block."""
        return max(self.min_block, -(-nbytes // self.min_block) * self.min_block)

    def is_small(self, size: int) -> bool:
        return size <= self.small_size

    def allocation_size(self, size: int) -> int:
        """``get_allocation_size``: the segment ``cudaMalloc``'d for a request no cached block serves."""
        if size <= self.small_size:
            return self.small_buffer
        if size < self.min_large_alloc:
            return self.large_buffer
        return -(-size // self.round_large) * self.round_large

    def should_split(self, block_size: int, size: int, small: bool) -> bool:
        """``should_split``: a small block splits if a minimum block remains, a large one if more than a small
        allocation's worth remains."""
        remaining = block_size - size
        return remaining >= self.min_block if small else remaining > self.small_size


@functools.cache
def allocator_sizes() -> AllocatorSizes:
    """The shipped sizes (read once), validated like NCCL's constants."""
    resource = importlib.resources.files("simnccl") / "data" / DATA_FILE
    data = parse_constants(resource.read_text(encoding="utf-8"), str(resource))
    return AllocatorSizes(
        min_block=data.integer("sizes.min_block_bytes"),
        small_size=data.integer("sizes.small_size_bytes"),
        small_buffer=data.integer("sizes.small_buffer_bytes"),
        large_buffer=data.integer("sizes.large_buffer_bytes"),
        min_large_alloc=data.integer("sizes.min_large_alloc_bytes"),
        round_large=data.integer("sizes.round_large_bytes"),
    )


class Block:
    """A piece of a segment, allocated or free; neighbours linked as torch links them (for coalescing)."""

    __slots__ = ("address", "device", "free", "next", "prev", "size", "small")

    def __init__(self, device: int, small: bool, address: int, size: int) -> None:
        self.device = device
        self.small = small
        self.address = address
        self.size = size
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None

    @property
    def whole_segment(self) -> bool:
        return self.prev is None and self.next is None


class CachingAllocator:
    """One rank's allocator: ``malloc``/``free``/``empty_cache``, allocated and reserved bytes per device."""

    def __init__(self, sizes: AllocatorSizes | None = None) -> None:
        self.sizes = sizes or allocator_sizes()
        self.allocated: dict[int, int] = {}  # device -> bytes in allocated blocks (torch's memory_allocated)
        self.reserved: dict[int, int] = {}  # device -> bytes in segments (torch's memory_reserved)
        self.total_reserved = 0
        self._next_address: dict[int, int] = {}
        # (device, small) -> free blocks as sorted (size, address) keys; (device, address) -> the free block
        self._pools: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        self._free: dict[tuple[int, int], Block] = {}

    def malloc(self, device: int, nbytes: int) -> Block | None:
        """A block for ``nbytes`` on ``device`` (None for zero bytes: torch hands back a null pointer)."""
        if nbytes <= 0:
            return None
        sizes = self.sizes
        size = sizes.round_size(nbytes)
        small = sizes.is_small(size)
        block = self._take_free(device, small, size) or self._new_segment(device, small, sizes.allocation_size(size))
        if sizes.should_split(block.size, size, small):
            rest = Block(device, small, block.address + size, block.size - size)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._add_free(rest)
        block.free = False
        self.allocated[device] = self.allocated.get(device, 0) + block.size
        return block

    def free(self, block: Block) -> None:
        """The block back to its pool (still reserved), merged with free neighbours of its segment."""
        self.allocated[block.device] -= block.size
        block.free = True
        before, after = block.prev, block.next
        if before is not None and before.free:
            self._remove_free(before)
            block.address, block.size, block.prev = before.address, block.size + before.size, before.prev
            if before.prev is not None:
                before.prev.next = block
        if after is not None and after.free:
            self._remove_free(after)
            block.size, block.next = block.size + after.size, after.next
            if after.next is not None:
                after.next.prev = block
        self._add_free(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: every wholly free segment goes back to the device."""
        for block in [b for b in self._free.values() if b.whole_segment]:
            self._remove_free(block)
            self.reserved[block.device] -= block.size
            self.total_reserved -= block.size

    def _take_free(self, device: int, small: bool, size: int) -> Block | None:
        pool = self._pools.get((device, small))
        if not pool:
            return None
        at = bisect.bisect_left(pool, (size, -1))
        if at == len(pool):
            return None
        _, address = pool.pop(at)
        return self._free.pop((device, address))

    def _new_segment(self, device: int, small: bool, size: int) -> Block:
        address = self._next_address.get(device, 0)
        self._next_address[device] = address + size
        self.reserved[device] = self.reserved.get(device, 0) + size
        self.total_reserved += size
        return Block(device, small, address, size)

    def _add_free(self, block: Block) -> None:
        bisect.insort(self._pools.setdefault((block.device, block.small), []), (block.size, block.address))
        self._free[(block.device, block.address)] = block

    def _remove_free(self, block: Block) -> None:
        pool = self._pools[(block.device, block.small)]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]
        del self._free[(block.device, block.address)]

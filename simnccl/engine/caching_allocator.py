"""torch's CUDA caching allocator, as far as NCCL's memory cares: ``alloc``, ``free``, ``empty_cache`` on a device.

Why a room: a freed tensor's block stays reserved by torch (``memory_reserved``), cached for torch's next
allocation; NCCL allocates with its own ``cudaMalloc`` and sees only what the device has free. So a
communicator created in the middle of a training step (lazy creation: its first collective) can fail to
allocate while torch holds gigabytes it would itself have given back (modelscope/ms-swift PR #9602: "Failed to
CUDA calloc async" at the iteration-1 peak). torch's policy, from ``CUDACachingAllocator``: a request reuses the
smallest cached block that fits (splitting it); else it takes new memory from the device; when the device is
short it releases its cached blocks and tries once more; only then is it out of memory.

Every block is kept per (rank, device): live blocks by the ``alloc`` tag that made them, cached blocks in a list.
The ledger holds live blocks under ``Owner("torch", rank, phase=tag)`` and cached ones under phase ``cached``.
"""

from __future__ import annotations

from simnccl.engine.memory import Memory, mib_bytes
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime, Waiting, current_device
from simnccl.memory import DeviceLedger, Owner
from simnccl.ops import Alloc, EmptyCache, Free, Op

CACHED = "cached"


class CachingAllocator:
    def __init__(self, sim: Sim, rendezvous: Rendezvous, memory: Memory) -> None:
        self.sim = sim
        self.record = sim.trace.record
        self.rendezvous = rendezvous
        self.memory = memory
        self._live: dict[tuple[int, int, str], list[int]] = {}  # (rank, device, tag) -> block sizes
        self._cached: dict[tuple[int, int], list[int]] = {}  # (rank, device) -> cached block sizes

    def op_alloc(self, rt: RankRuntime, op: Alloc) -> Waiting:
        yield from self.rendezvous.settle(rt)
        index = current_device(rt)
        ledger = self.memory.touch(rt, index, op)
        size = mib_bytes(op.mib)
        owner = Owner("torch", rt.rank, phase=op.tag)
        if size > 0 and not self._reuse(rt, ledger, index, owner, size, op):
            if size > ledger.free_bytes:
                self._empty_cache(rt, ledger, index, op)
            ledger.allocate(owner, size, time_s=self.sim.now(), op=op)
        if size > 0:
            self._live.setdefault((rt.rank, index, op.tag), []).append(size)
        self.record(self.sim.now(), rt.rank, "torch-alloc", ledger.device, op.mib)

    def op_free(self, rt: RankRuntime, op: Free) -> Waiting:
        """``del`` the tensors tagged ``op.tag``: their blocks become torch's cache (still reserved)."""
        yield from self.rendezvous.settle(rt)
        index = current_device(rt)
        blocks = self._live.pop((rt.rank, index, op.tag), [])
        if not blocks:
            return
        ledger = self.memory.ledger(rt, index)
        cached = Owner("torch", rt.rank, phase=CACHED)
        ledger.move(Owner("torch", rt.rank, phase=op.tag), cached, sum(blocks), time_s=self.sim.now(), op=op)
        self._cached.setdefault((rt.rank, index), []).extend(blocks)
        self.record(self.sim.now(), rt.rank, "torch-free", ledger.device, op.tag, sum(blocks))

    def op_empty_cache(self, rt: RankRuntime, op: EmptyCache) -> Waiting:
        """``empty_cache`` after the tag's tensors died: ``op.mib`` of the tag's live blocks returned to the
        device, latest first (a block partly given back keeps its remainder), never more than the tag holds."""
        yield from self.rendezvous.settle(rt)
        index = current_device(rt)
        blocks = self._live.get((rt.rank, index, op.tag), [])
        left = mib_bytes(op.mib)
        freed = 0
        while left > 0 and blocks:
            last = blocks.pop()
            taken = min(last, left)
            if last > taken:
                blocks.append(last - taken)
            left -= taken
            freed += taken
        if not freed:
            return
        ledger = self.memory.ledger(rt, index)
        ledger.release(Owner("torch", rt.rank, phase=op.tag), freed, time_s=self.sim.now(), op=op)
        self.record(self.sim.now(), rt.rank, "torch-give-back", ledger.device, op.tag, freed)

    def _reuse(self, rt: RankRuntime, ledger: DeviceLedger, index: int, owner: Owner, size: int, op: Op) -> bool:
        """The smallest cached block that fits serves the request (its remainder stays cached)."""
        blocks = self._cached.get((rt.rank, index))
        fitting = [b for b in blocks or () if b >= size]
        if not blocks or not fitting:
            return False
        best = min(fitting)
        blocks.remove(best)
        if best > size:
            blocks.append(best - size)
        ledger.move(Owner("torch", rt.rank, phase=CACHED), owner, size, time_s=self.sim.now(), op=op)
        return True

    def _empty_cache(self, rt: RankRuntime, ledger: DeviceLedger, index: int, op: Op) -> None:
        """The device is short: torch gives its cached blocks back (``release_cached_blocks``) before retrying."""
        blocks = self._cached.pop((rt.rank, index), [])
        if blocks:
            ledger.release_owner(Owner("torch", rt.rank, phase=CACHED), time_s=self.sim.now(), op=op)
            self.record(self.sim.now(), rt.rank, "torch-empty-cache", ledger.device, sum(blocks))

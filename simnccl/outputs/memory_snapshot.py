"""A run's device memory as a torch CUDA memory snapshot, for ``torch.cuda._memory_viz`` and pytorch.org/memory_viz.

Why: people who debug GPU memory already know torch's snapshot viewer (``torch.cuda.memory._dump_snapshot``):
an allocation timeline per device with a stack per allocation. A real snapshot only shows torch's caching
allocator, so NCCL's buffers — the memory this simulator is about — are invisible in it. This one is written
from the simulated ledger: every charge is its own allocator segment with one block, so a communicator's
buffers, torch's allocations and each process's CUDA context appear side by side, each with "frames" that
say who holds it (rank, group, lifecycle phase, the call that caused it). Totals per device equal the ledger's
used memory (what ``cudaMemGetInfo`` reports), not only ``torch.cuda.memory_allocated()``.

Shape: the dict ``torch.cuda.memory._snapshot()`` returns — ``segments`` (live at the end of the run) and
``device_traces`` (one list per device, in the order of the run's ledgers: segment_alloc + alloc per charge,
free_requested + free_completed + segment_free per release, ``time_us`` in simulated time). Only builtins are
pickled, so loading it needs neither simnccl nor torch, and writing it imports no torch.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simnccl.memory import MemoryEvent, Owner
from simnccl.result import ScenarioResult, VariantResult

SEGMENT_ALIGN_BYTES = 2 * 1024 * 1024  # addresses on 2 MiB boundaries, like the caching allocator's large segments
DEVICE_BASE_ADDRESS = 0x7F00_0000_0000
DEVICE_ADDRESS_SPAN = 1 << 40  # per device, so addresses never collide across devices
POOL_OF_KIND = {"torch": (0, 0), "comm": (1, 0), "cuda_context": (2, 0)}  # a pool id per owner kind, to tell apart


def write_snapshots(results: Sequence[ScenarioResult], path: Path) -> list[Path]:
    """One pickle per variant: ``path`` itself for a single variant, else ``<stem>-<scenario>-<variant><suffix>``
    (the scenario part only when there are several scenarios). Returns the paths written."""
    variants = [(r.scenario, v) for r in results for v in r.variants]
    several_scenarios = len({s for s, _ in variants}) > 1
    written = []
    for scenario, variant in variants:
        target = path
        if len(variants) > 1:
            parts = [scenario, variant.name] if several_scenarios else [variant.name]
            target = path.with_name(f"{path.stem}-{'-'.join(_safe(p) for p in parts)}{path.suffix}")
        with target.open("wb") as handle:
            pickle.dump(build_snapshot(variant), handle, protocol=pickle.HIGHEST_PROTOCOL)
        written.append(target)
    return written


def build_snapshot(variant: VariantResult) -> dict[str, Any]:
    """The snapshot dict for one variant (see the module docstring)."""
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    for index, ledger in enumerate(variant.outcome.ledgers.values()):
        device_segments, trace = _device(index, ledger.device, ledger.timeline)
        segments.extend(device_segments)
        traces.append(trace)
    return {"segments": segments, "device_traces": traces}


def _device(index: int, device: str, timeline: list[MemoryEvent]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    next_address = DEVICE_BASE_ADDRESS + index * DEVICE_ADDRESS_SPAN
    live: dict[Owner, list[tuple[int, int, list[dict[str, Any]]]]] = {}
    trace: list[dict[str, Any]] = []
    for event in timeline:
        time_us = round(event.time_s * 1_000_000)
        if event.delta_bytes > 0:
            address, size = next_address, event.delta_bytes
            next_address += -(-size // SEGMENT_ALIGN_BYTES) * SEGMENT_ALIGN_BYTES
            frames = _frames(device, event)
            live.setdefault(event.owner, []).append((address, size, frames))
            for action in ("segment_alloc", "alloc"):
                trace.append(_entry(action, address, size, frames, time_us))
        elif event.delta_bytes < 0:
            # The ledger releases an owner all at once (a communicator destroyed, a process gone).
            for address, size, frames in live.pop(event.owner, []):
                for action in ("free_requested", "free_completed", "segment_free"):
                    trace.append(_entry(action, address, size, frames, time_us))
    segments = [
        _segment(index, address, size, frames, owner.kind)
        for owner, blocks in live.items()
        for address, size, frames in blocks
    ]
    segments.sort(key=lambda s: s["address"])
    return segments, trace


def _entry(action: str, address: int, size: int, frames: list[dict[str, Any]], time_us: int) -> dict[str, Any]:
    return {"action": action, "addr": address, "size": size, "stream": 0, "frames": frames, "time_us": time_us}


def _segment(device: int, address: int, size: int, frames: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return {
        "device": device,
        "address": address,
        "total_size": size,
        "allocated_size": size,
        "active_size": size,
        "requested_size": size,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": POOL_OF_KIND.get(kind, (0, 0)),
        "is_expandable": False,
        "frames": frames,
        "blocks": [
            {"address": address, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
        ],
    }


def _frames(device: str, event: MemoryEvent) -> list[dict[str, Any]]:
    """Who holds the memory, innermost first as torch writes stacks: the holder, then the call that caused it."""
    owner = event.owner
    if owner.kind == "comm":
        holder = f"NCCL communicator buffers of group {owner.group!r} ({owner.phase}), rank {owner.rank}"
        filename = "simnccl:nccl"
    elif owner.kind == "cuda_context":
        holder = f"CUDA context of rank {owner.rank} (not allocator memory; counted by cudaMemGetInfo)"
        filename = "simnccl:cuda"
    else:
        holder = f"torch allocation{f' {owner.phase!r}' if owner.phase else ''}, rank {owner.rank}"
        filename = "simnccl:torch"
    describe = getattr(event.op, "describe", None)
    call = describe() if callable(describe) else str(event.op)
    return [
        {"filename": filename, "line": 0, "name": holder},
        {"filename": f"simnccl:{device}", "line": 0, "name": f"rank {owner.rank}: {call} at t={event.time_s:.6f} s"},
    ]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

"""A per-rank flight recorder that writes dumps in torch 2.15's format, so torch's own analyzer reads them.

Why imitate torch exactly: in production the artifact a team debugs a hang with is the set of
``TORCH_FR_DUMP_TEMP_FILE<rank>`` pickles and ``python -m torch.distributed.flight_recorder.fr_trace``. A
rehearsal is only worth it if it produces the same artifact. Format: torch 2.15 ``FlightRecorderDetail.hpp``
(version "2.10"), summarised in the reference §E.3; the pitfalls of §E.5 are respected (``pg_config`` keyed
by the group names the entries use; every entry carries dtypes, ``time_created_ns`` and ``is_p2p``).

Who records (§E.1): legacy NCCL and gloo natively, nccl2 and nccl-lazy through the FlightRecorderHook,
``fake`` nothing. States: an op that completed is ``completed`` (nccl2's hook has a completion hook; legacy
reports completion through its CUDA events); one that never finished stays ``scheduled``.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simnccl.dtypes import element_bytes
from simnccl.release import Impl

FR_VERSION = "2.10"
DEFAULT_BUFFER_SIZE = 2000
DEFAULT_DUMP_WAIT_MS = 15_000
RECORDING_IMPLS = (Impl.NCCL2, Impl.NCCL_LAZY, Impl.LEGACY, Impl.GLOO)


def buffer_size(env: Mapping[str, str]) -> int:
    """``TORCH_FR_BUFFER_SIZE``, then ``TORCH_NCCL_TRACE_BUFFER_SIZE``, default 2000; <= 0 disables."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = env.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                return DEFAULT_BUFFER_SIZE
    return DEFAULT_BUFFER_SIZE


def dump_wait_ms(env: Mapping[str, str]) -> int:
    """How long the abort hook waits for the dump (``TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC`` or its NCCL alias)."""
    for name in ("TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"):
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return DEFAULT_DUMP_WAIT_MS


def dump_on_timeout(env: Mapping[str, str]) -> bool:
    value = env.get("TORCH_FR_DUMP_ON_TIMEOUT", env.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")).strip().lower()
    return value not in ("0", "false")


def dump_prefix(env: Mapping[str, str]) -> str:
    """``TORCH_FR_DUMP_TEMP_FILE`` (alias ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), default as torch's (§E.2)."""
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        if env.get(name):
            return env[name]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "~"), ".cache")
    return os.path.join(cache, "torch", "comm_lib_trace_rank_")


@dataclass(slots=True)
class Entry:
    record_id: int
    pg_id: int
    process_group: tuple[str, str]
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    time_created_ns: int
    input_sizes: list[list[int]]
    output_sizes: list[list[int]]
    dtype: str
    timeout_ms: int
    is_p2p: bool
    state: str = "scheduled"
    time_discovered_completed_ns: int | None = None
    duration_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        completed = self.state == "completed"
        return {
            "record_id": self.record_id,
            "pg_id": self.pg_id,
            "process_group": self.process_group,
            "thread_name": "simnccl",
            "thread_id": "0",
            "collective_seq_id": self.collective_seq_id,
            "p2p_seq_id": self.p2p_seq_id,
            "op_id": self.op_id,
            "profiling_name": self.profiling_name,
            "time_created_ns": self.time_created_ns,
            "duration_ms": self.duration_ms,
            "input_sizes": self.input_sizes,
            "output_sizes": self.output_sizes,
            "input_dtypes": [self.dtype] * len(self.input_sizes),
            "output_dtypes": [self.dtype] * len(self.output_sizes),
            "state": self.state,
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": self.time_discovered_completed_ns,
            "retired": completed,
            "timeout_ms": self.timeout_ms,
            "is_p2p": self.is_p2p,
            "frames": [],
        }


@dataclass(slots=True)
class GroupTrace:
    """The hook's per-group counters."""

    pg_id: int
    name: str
    desc: str
    ranks: tuple[int, ...]
    collective_seq_id: int = 0
    p2p_seq_id: int = 0
    op_id: int = 0


@dataclass(slots=True)
class FlightRecorder:
    """One process's ring buffer of collective and p2p entries, and its groups' configuration."""

    rank: int
    capacity: int = DEFAULT_BUFFER_SIZE
    comm_lib_version: str = "2.30.7"
    entries: deque[Entry] = field(default_factory=deque)
    groups: dict[str, GroupTrace] = field(default_factory=dict)
    next_record_id: int = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def group(self, name: str, desc: str, ranks: tuple[int, ...]) -> GroupTrace:
        trace = self.groups.get(name)
        if trace is None:
            trace = self.groups[name] = GroupTrace(len(self.groups), name, desc, ranks)
        return trace

    def record(
        self,
        trace: GroupTrace,
        backend_name: str,
        op: str,
        *,
        numel: int,
        dtype: str,
        p2p: bool,
        time_s: float,
        timeout_s: float,
    ) -> Entry | None:
        """Record an op as the hook does at issue: collective or p2p sequence number, op id, state scheduled."""
        if not self.enabled:
            return None
        if p2p:
            trace.p2p_seq_id += 1
        else:
            trace.collective_seq_id += 1
        entry = Entry(  # positionally, in field order: every collective of a run records one (keywords cost ~50%)
            self.next_record_id,  # record_id
            trace.pg_id,
            (trace.name, trace.desc),  # process_group
            trace.collective_seq_id,
            trace.p2p_seq_id,
            trace.op_id,
            _profiling_name(backend_name, op),  # profiling_name
            round(time_s * 1e9),  # time_created_ns (``_ns``)
            [[numel]],  # input_sizes
            [[numel]],  # output_sizes
            dtype,
            round(timeout_s * 1000),  # timeout_ms
            p2p,  # is_p2p
        )
        trace.op_id += 1
        self.next_record_id += 1
        self.entries.append(entry)
        while len(self.entries) > self.capacity:
            self.entries.popleft()
        return entry

    @staticmethod
    def complete(entry: Entry | None, time_s: float) -> None:
        if entry is None:
            return
        entry.state = "completed"
        done = entry.time_discovered_completed_ns = round(time_s * 1e9)  # ``_ns``, inline: once per collective
        entry.duration_ms = max(0.0, (done - entry.time_created_ns) / 1e6)

    def dump(self) -> dict[str, Any]:
        """The pickle payload torch 2.15 writes (``_dump_fr_trace``)."""
        status: dict[str, dict[str, int]] = {}
        for trace in self.groups.values():
            mine = [e for e in self.entries if e.pg_id == trace.pg_id and not e.is_p2p]
            done = [e.collective_seq_id for e in mine if e.state == "completed"]
            status[str(trace.pg_id)] = {
                "last_enqueued_collective": max((e.collective_seq_id for e in mine), default=-1),
                "last_started_collective": max(done, default=-1),
                "last_completed_collective": max(done, default=-1),
            }
        return {
            "version": FR_VERSION,
            "comm_lib_version": self.comm_lib_version,
            "pg_config": {
                t.name: {"name": t.name, "desc": t.desc, "ranks": str(list(t.ranks))} for t in self.groups.values()
            },
            "pg_status": status,
            "entries": [e.to_dict() for e in self.entries],
        }


# Both are asked once per collective a run records, for a handful of distinct arguments (backends x op names and
# p2p labels; programs' sizes): remembered, bounded. An unknown dtype raises every time (nothing is kept for it).
@functools.lru_cache(maxsize=4096)
def _profiling_name(backend_name: str, op: str) -> str:
    return f"{backend_name}:{op}"


@functools.lru_cache(maxsize=4096)
def numel(size_bytes: int, dtype: str) -> int:
    """Elements of ``size_bytes`` of ``dtype`` (at least one)."""
    return max(1, size_bytes // element_bytes(dtype))


def write_dumps(dumps: Mapping[int, Mapping[str, Any]], directory: str | Path, prefix: str = "rank_") -> list[Path]:
    """Write one pickle per rank as ``<dir>/<prefix><rank>`` (what ``fr_trace <dir>`` reads)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, payload in sorted(dumps.items()):
        path = out / f"{prefix}{rank}"
        with path.open("wb") as handle:
            pickle.dump(dict(payload), handle)
        paths.append(path)
    return paths


def _ns(time_s: float) -> int:
    return round(time_s * 1e9)

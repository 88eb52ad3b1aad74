"""Run one rank's Program with real torch.distributed calls.

Imports ``simnccl.ops`` and ``simnccl.policy`` only (never the simulator engine): group creation goes through
``simnccl.torch_apply.apply(policy)`` — the code path users run in production — for the whole program.

Per op the driver writes a progress record *before* starting it (so a launcher that must kill a hung rank knows
where it was) and one after it (outcome, wall times, measurement). What each op does:

* ``set_device``: ``torch.cuda.set_device`` (GPU lane); skipped on the CPU lane.
* ``init_process_group``: over the launcher's store (its store host's TCPStore, or torchrun's env:// store), with the
  run's torch timeout when one is set (CPU lane), or the op's own where that is shorter.
* ``new_group`` / ``split_group``: handles are bound only on members, like the simulator: a member's result
  overwrites the handle; a non-member's ``NON_GROUP_MEMBER`` never overwrites an existing one.
  ``purpose``/``traffic`` go to the policy through ``apply``.
* collectives: tensors of ``size_bytes`` of ``dtype`` (rounded up to a multiple of the group size where torch
  needs it); ``all_gather`` is ``all_gather_into_tensor``, ``reduce_scatter`` is ``reduce_scatter_tensor``,
  ``all_to_all`` is ``all_to_all_single``; on a ``NON_GROUP_MEMBER`` handle nothing is called (torch only warns).
  Every element a rank sends names it and every result is read back (``data_check``): data of a rank outside
  the group stops the rank with a ``check`` failure (a cross-wired group, which torch runs without an error).
* ``send``/``recv``: unbatched, ``peer`` is a global rank; the receiver checks the data as above.
* ``destroy_process_group``: the world handle tears everything down and clears the handles.
* ``compute``: sleeps ``seconds * compute_scale`` capped at ``compute_cap_s`` (defaults: CPU lane 0, i.e.
  skipped; GPU lane 0.01, capped at 2 s) — recorded in the op's detail.
* ``alloc``: ``torch.empty`` of that many MiB on the current device (GPU lane); skipped on the CPU lane.
* ``memory_check``: vLLM's startup check against ``mem_get_info`` (GPU lane); skipped on the CPU lane, recorded.
* ``raise``: the framework's failing check; the rank ends as a ``check`` failure with the op's type and message.
* ``checkpoint``: a measurement under the checkpoint's label.

Every group a rank creates stays referenced until the process ends (``Driver.kept``): ``destroy_process_group``
then closes the default group's gloo sockets only (a peer waiting on this rank there fails with "Connection
closed by peer", as the simulator models), never a subgroup's.

After its program a rank *parks*: it reports ``final`` and keeps its process (and sockets) alive until the
launcher releases it, so a peer still waiting on it stays blocked — a hang, as in the simulator — instead of
failing with "connection reset by peer".
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simnccl.backends.gloo import FOREIGN_RANKS
from simnccl.dtypes import dtypes
from simnccl.ops import (
    NCCL_CONFIG_FIELDS,
    WORLD,
    AllGather,
    Alloc,
    AllReduce,
    AllToAll,
    Barrier,
    BatchIsendIrecv,
    Broadcast,
    Checkpoint,
    Collective,
    Compute,
    DestroyProcessGroup,
    EmptyCache,
    Free,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Op,
    PgOptions,
    PointToPoint,
    Program,
    Raise,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.real.data_check import (
    FOREIGN_DATA,
    FOREIGN_DATA_TYPE,
    MOVES,
    SUMS,
    foreign_senders,
    unchecked_reason,
    value_of,
)
from simnccl.real.lanes import lane_policy
from simnccl.real.measure import Measurer, classify
from simnccl.real.programs import program_from_list
from simnccl.torch_apply import apply as apply_policy

NON_MEMBER = "NON_GROUP_MEMBER"


class CheckFailure(Exception):
    """The workload's own check failed on this rank (vLLM's startup memory check, a ``raise`` op).

    ``type_name``: the exception the real framework raises there (vLLM's check: ``ValueError``; a ``raise`` op:
    its ``error_type``), reported as the rank's error type, as the simulator's ``WorkloadFailure`` does: this
    class's own name would say nothing about which check failed and differ from the simulated side."""

    def __init__(self, message: str, type_name: str = "ValueError", facts: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.facts = facts  # what the check found, written into the rank's final record beside its message


@dataclass
class RankSpec:
    """Everything a rank process needs, JSON-able (it crosses a pipe to the zygote)."""

    rank: int
    world_size: int
    program: list[dict[str, Any]]
    lane: str = "cpu"
    policy: str = "torch-default"
    # The simnccl GPU kind handed to ``apply(policy, gpu=...)`` (GPU lane): its profile prices an eager NCCL group
    # for ``budget(X)``, which without it cannot decide (PolicyError) where the simulation can.
    gpu: str | None = None
    # The profile file that prices it (``apply(profile=...)``): the variant's own where it is not the kind's
    # built-in one (a calibrated profile), so the real ranks decide as the simulation that was proven.
    profile: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    local_rank: int = 0
    local_world_size: int = 1
    node: int = 0
    set_launcher_env: bool = True
    store: dict[str, Any] = field(default_factory=dict)
    torch_timeout_s: float | None = None
    init_timeout_s: float | None = None
    compute_scale: float = 0.0
    compute_cap_s: float = 2.0
    progress: str = ""
    release_file: str = ""
    park_max_s: float = 600.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        return cls(**json.loads(text))


class Progress:
    """Append-only JSON lines, flushed per record: survives the process being killed mid-op."""

    def __init__(self, path: str, extra: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._file = open(path, "a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
        self._extra = extra

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        if self._extra is not None:
            self._extra(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Driver:
    """One rank's interpreter of a Program over real torch.distributed."""

    def __init__(self, spec: RankSpec, program: Program, progress: Progress) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.spec = spec
        self.program = program
        self.progress = progress
        self.gpu = spec.lane == "gpu"
        self.measurer = Measurer(self.gpu, spec.node)
        self.handles: dict[str, Any] = {}
        # Every group this rank created, alive until the process ends, as frameworks keep theirs in module
        # globals: a ProcessGroupGloo closes its sockets only when freed (gloo has no shutdown), so without this
        # whether a peer waiting on a destroyed subgroup fails or waits would hang on Python reference counts.
        self.kept: list[Any] = []
        self.seq: dict[int, int] = {}
        # Each group's members, read while it is registered: torch forgets a destroyed group's (a KeyError in
        # get_process_group_ranks), while a program may still call a collective on its handle, which torch runs.
        self.members: dict[int, list[int]] = {}
        self.unchecked: dict[tuple[str, str], str | None] = {}  # (dtype, data_check kind) -> why not checked
        self.p2p_seq: dict[tuple[int, int, int], int] = {}
        self.allocations: dict[str, list[Any]] = {}  # alloc tag -> its live tensors
        self.notes: list[str] = []
        self.applied: Any = None
        self.store: Any = None

    # ------------------------------------------------------------------ helpers

    def _timeout(self, op_timeout_s: float | None, init: bool = False) -> datetime.timedelta | None:
        """The run's torch timeout when it sets one (CPU lane), else the op's own (None: torch's default); the
        op's own where it is shorter. Why: the run's is a safety net for ops that name none or a long one, while a
        short one is the program's behaviour (its ranks end with gloo's timeout, and its peers see what that
        does), which the simulated side runs too."""
        seconds = self.spec.torch_timeout_s if self.spec.torch_timeout_s is not None else op_timeout_s
        if seconds is not None and op_timeout_s is not None:
            seconds = min(seconds, op_timeout_s)
        if init and self.spec.init_timeout_s is not None and seconds is not None:
            seconds = max(seconds, self.spec.init_timeout_s)
        return None if seconds is None else datetime.timedelta(seconds=seconds)

    def _device(self) -> Any:
        if self.gpu:
            return self.torch.device("cuda", self.torch.cuda.current_device())
        return self.torch.device("cpu")

    def _group(self, handle: str) -> Any:
        """The torch group for a handle: None for the world, NON_MEMBER, or a ProcessGroup."""
        if handle == WORLD:
            if WORLD not in self.handles:
                raise ValueError("Default process group has not been initialized (no init_process_group ran)")
            return None
        if handle not in self.handles:
            raise NameError(f"group handle {handle!r} was never bound on rank {self.spec.rank}")
        return self.handles[handle]

    def _group_info(self, handle: str) -> dict[str, Any]:
        """Name, members and next sequence number of the group behind a handle (for progress and hang reports)."""
        try:
            group = self._group(handle)
        except (ValueError, NameError):
            return {"handle": handle}
        if group is NON_MEMBER:
            return {"handle": handle, "group": NON_MEMBER}
        pg = group if group is not None else self.dist.distributed_c10d._get_default_group()
        return {
            "handle": handle,
            "group": _group_name(pg),
            "members": self._members(pg),
            "seq": self.seq.get(id(pg), 0) + 1,
        }

    def _tensor(self, size_bytes: int, dtype_name: str, multiple: int = 1, kind: str | None = None) -> Any:
        """The op's input of ``size_bytes``: every element this rank's value for an op of ``kind``
        (``data_check.value_of``) where the dtype can carry the data check, else ones; ``kind`` None: zeros (an
        output, or a recv's buffer, whose elements name no rank until written)."""
        torch = self.torch
        dtype = getattr(torch, dtypes()[dtype_name].torch)  # ops carry known names only (simnccl.ops)
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = math.ceil(size_bytes / itemsize)  # 0 bytes: an empty tensor, as the op says (gloo then sends nothing)
        numel = math.ceil(numel / multiple) * multiple
        if kind is None:
            return torch.zeros(numel, dtype=dtype, device=self._device())
        if self._unchecked(dtype, kind) is not None:
            return torch.ones(numel, dtype=dtype, device=self._device())
        return torch.full((numel,), value_of(self.spec.rank, kind), dtype=dtype, device=self._device())

    def _unchecked(self, dtype: Any, kind: str) -> str | None:
        """``data_check.unchecked_reason`` for this world, once per dtype and kind."""
        key = (str(dtype), kind)
        if key not in self.unchecked:
            reason = self.unchecked[key] = unchecked_reason(self.torch, dtype, self.spec.world_size, kind)
            if reason is not None:
                self.notes.append(reason)  # the run's report says so, not only the op's record
        return self.unchecked[key]

    def _check_data(self, op: Collective | PointToPoint, pg: Any, result: Any, kind: str, chunks: int = 1) -> str:
        """Raise the data check's failure where ``result`` holds data of a rank outside ``pg`` (``data_check``);
        else what the op's record says of the check: nothing where it was made, why where it was not."""
        reason = self._unchecked(result.dtype, kind)
        if reason is not None:
            return f"; {reason}"
        members = self._members(pg)
        if len(members) == self.spec.world_size:
            return ""  # the whole world: no rank outside it
        foreign = foreign_senders(result, self.spec.rank, members, self.spec.world_size, kind, chunks)
        if foreign:
            message = FOREIGN_DATA.format(op=op.name, name=_group_name(pg), members=members, foreign=foreign)
            raise CheckFailure(message, type_name=FOREIGN_DATA_TYPE, facts={FOREIGN_RANKS: foreign})
        return ""

    def _members(self, pg: Any) -> list[int]:
        """A group's members as torch lists them (global ranks), read once per group."""
        if id(pg) not in self.members:
            self.members[id(pg)] = list(self.dist.get_process_group_ranks(pg))
        return self.members[id(pg)]

    def _nccl_options(self, options: PgOptions, backend: str | None) -> Any:
        """torch's ProcessGroupNCCL.Options for a PgOptions (GPU lane, NCCL-family backends only)."""
        if not self.gpu or options == PgOptions():
            return None
        result = self.dist.ProcessGroupNCCL.Options()
        for name, value in options.to_dict().items():  # every field the program sets, by torch's own names
            target = result.config if name in NCCL_CONFIG_FIELDS else result
            try:
                setattr(target, name, int(value) if name == "split_share" else value)
            except (AttributeError, TypeError) as err:  # a field this torch build lacks or types differently
                note = (
                    f"pg_options.{name}={value!r} not passed: this torch's ProcessGroupNCCL.Options refuses it ({err})"
                )
                if note not in self.notes:
                    self.notes.append(note)
        return result

    # ------------------------------------------------------------------ ops

    def op_set_device(self, op: SetDevice) -> str:
        if not self.gpu:
            return "skipped: CPU lane"
        index = self.spec.local_rank if op.device is None else op.device
        self.measurer.note_baseline(index)
        self.torch.cuda.set_device(index)
        # Create the primary context now (the simulator charges it here) without touching the caching allocator.
        self.torch.cuda.synchronize(index)
        return f"cuda:{index}"

    def op_init(self, op: InitProcessGroup) -> str:
        dist = self.dist
        kwargs: dict[str, Any] = {"rank": self.spec.rank, "world_size": self.spec.world_size}
        if self.store is None:  # a spawn launcher's rendezvous: a store of this init's own, rank 0 hosting it
            kwargs["init_method"] = f"tcp://{self.spec.store['host']}:{int(self.spec.store['port'])}"
        else:
            kwargs["store"] = self.store
        timeout = self._timeout(op.timeout_s, init=True)
        if timeout is not None:
            kwargs["timeout"] = timeout
        if op.device_id is not None:
            kwargs["device_id"] = (
                self.torch.device("cuda", op.device_id)
                if isinstance(op.device_id, int)
                else self.torch.device(op.device_id)
            )
            if kwargs["device_id"].type == "cuda":
                self.measurer.note_baseline(kwargs["device_id"].index)
        options = self._nccl_options(op.pg_options, op.backend)
        if options is not None:
            kwargs["pg_options"] = options
        dist.init_process_group(op.backend, **kwargs)
        self.handles = {WORLD: None}
        return f"backend={dist.get_backend()}"

    def _bind(self, bind: str | None, group: Any, member: bool) -> None:
        if member:
            self.kept.append(group)
            self.members[id(group)] = list(self.dist.get_process_group_ranks(group))
        if not bind:
            return
        if member:
            self.handles[bind] = group
        else:
            self.handles.setdefault(bind, NON_MEMBER)

    def op_new_group(self, op: NewGroup) -> str:
        dist = self.dist
        if WORLD not in self.handles:
            raise ValueError(
                "Default process group has not been initialized, please make sure to call init_process_group."
            )
        kwargs: dict[str, Any] = {
            "ranks": None if op.ranks is None else list(op.ranks),
            "use_local_synchronization": op.use_local_synchronization,
        }
        if op.backend is not None:
            kwargs["backend"] = op.backend
        timeout = self._timeout(op.timeout_s)
        if timeout is not None:
            kwargs["timeout"] = timeout
        if op.group_desc is not None:
            kwargs["group_desc"] = op.group_desc
        if op.device_id is not None:
            kwargs["device_id"] = self.torch.device("cuda", op.device_id)
        options = self._nccl_options(op.pg_options, op.backend)
        if options is not None:
            kwargs["pg_options"] = options
        if self.applied is not None:
            kwargs["purpose"] = op.purpose
            kwargs["traffic"] = op.traffic
        group = dist.new_group(**kwargs)
        member = group is not dist.GroupMember.NON_GROUP_MEMBER and group is not None
        self._bind(op.bind, group if member else NON_MEMBER, member)
        if not member:
            return "non-member: NON_GROUP_MEMBER"
        return f"group {group.group_name} ranks {dist.get_process_group_ranks(group)}"

    def op_split_group(self, op: SplitGroup) -> str:
        dist = self.dist
        parent = self._group(op.parent)
        if parent is NON_MEMBER:
            parent = dist.GroupMember.NON_GROUP_MEMBER  # what the program holds: torch raises its own error
        kwargs: dict[str, Any] = {"parent_pg": parent, "split_ranks": [list(s) for s in op.split_ranks]}
        timeout = self._timeout(op.timeout_s)
        if timeout is not None:
            kwargs["timeout"] = timeout
        if op.group_desc is not None:
            kwargs["group_desc"] = op.group_desc
        options = self._nccl_options(op.pg_options, None)
        if options is not None:
            kwargs["pg_options"] = options
        if self.applied is not None:
            kwargs["purpose"] = op.purpose
            kwargs["traffic"] = op.traffic
        group = dist.split_group(**kwargs)
        member = group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER
        self._bind(op.bind, group if member else NON_MEMBER, member)
        if not member:
            return "non-member"
        return f"group {group.group_name} ranks {dist.get_process_group_ranks(group)}"

    def op_collective(self, op: Collective) -> str:
        dist = self.dist
        group = self._group(op.group)
        if group is NON_MEMBER:
            return f"not a member of {op.group!r}: torch warns and returns (no call)"
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        size = dist.get_world_size(pg)
        self.seq[id(pg)] = self.seq.get(id(pg), 0) + 1
        torch = self.torch
        kind = SUMS if isinstance(op, (AllReduce, ReduceScatter)) else MOVES
        result = None  # the tensor this rank received into: its data is checked (``data_check``)
        call = getattr(op, "call", "")
        if getattr(op, "padded", False):  # an object collective's data: torch pads each rank's to the largest
            self._object_gather(op, group, size)
        elif call:  # the torch call the op stands for (``ops.CALLS``), run as such; its data is not checked
            self._called(op, call, group, size)
        elif isinstance(op, Barrier):
            dist.barrier(group=group)
        elif isinstance(op, AllReduce):
            result = self._tensor(op.size_bytes, op.dtype, kind=kind)
            dist.all_reduce(result, group=group)
        elif isinstance(op, Broadcast):
            result = self._tensor(op.size_bytes, op.dtype, kind=kind)
            dist.broadcast(result, src=op.src, group=group)
        elif isinstance(op, AllGather):
            t = self._tensor(op.size_bytes, op.dtype, kind=kind)
            result = torch.zeros(t.numel() * size, dtype=t.dtype, device=t.device)
            dist.all_gather_into_tensor(result, t, group=group)
        elif isinstance(op, ReduceScatter):
            t = self._tensor(op.size_bytes, op.dtype, multiple=size, kind=kind)
            result = torch.zeros(t.numel() // size, dtype=t.dtype, device=t.device)
            dist.reduce_scatter_tensor(result, t, group=group)
        elif isinstance(op, AllToAll):
            t = self._tensor(op.size_bytes, op.dtype, multiple=size, kind=kind)
            result = torch.zeros_like(t)
            dist.all_to_all_single(result, t, group=group)
        else:  # pragma: no cover - every Collective subclass is handled above
            raise TypeError(f"unknown collective {op.name}")
        detail = f"seq {self.seq[id(pg)]} on {size} ranks"
        if result is None:
            return detail
        chunks = size if isinstance(op, (AllGather, AllToAll)) else 1  # one chunk per member's data
        return detail + self._check_data(op, pg, result, kind, chunks)

    def _object_gather(self, op: Collective, group: Any, size: int) -> None:
        """A padded gather (``AllGather.padded``) as torch makes it: ``all_gather_object`` (or ``gather_object``) of
        an object this rank's size, whose own size gather lets torch pad every rank's to the largest."""
        dist = self.dist
        obj = bytes(op.size_bytes)
        if getattr(op, "call", "") == "gather":
            root = op.root  # type: ignore[attr-defined]
            gathered = [None] * size if dist.get_rank() == root else None
            dist.gather_object(obj, gathered, dst=root, group=group)
        else:
            dist.all_gather_object([None] * size, obj, group=group)

    def _called(self, op: Collective, call: str, group: Any, size: int) -> None:
        """``reduce``, ``gather``, ``scatter`` or ``monitored_barrier``, as a captured program recorded it."""
        dist, torch = self.dist, self.torch
        if call == "monitored_barrier":
            seconds = getattr(op, "timeout_s", None)
            dist.monitored_barrier(
                group=group, timeout=None if seconds is None else datetime.timedelta(seconds=seconds)
            )
            return
        t = self._tensor(op.size_bytes, op.dtype, kind=MOVES)
        if call == "reduce":
            dist.reduce(t, dst=op.root, group=group)  # type: ignore[attr-defined]
        elif call == "gather":
            root = op.root  # type: ignore[attr-defined]
            outputs = [torch.zeros_like(t) for _ in range(size)] if dist.get_rank() == root else None
            dist.gather(t, outputs, dst=root, group=group)
        elif call == "scatter":
            src = op.src  # type: ignore[attr-defined]
            chunks = [torch.zeros_like(t) for _ in range(size)] if dist.get_rank() == src else None
            dist.scatter(t, chunks, src=src, group=group)
        else:  # pragma: no cover - ops.CALLS names every call
            raise TypeError(f"unknown call {call}")

    def op_p2p(self, op: PointToPoint) -> str:
        dist = self.dist
        group = self._group(op.group)
        if group is NON_MEMBER:
            return f"not a member of {op.group!r}: torch warns and returns (no call)"
        detail = f"{op.name} {{}} bytes, peer {op.peer}"
        if isinstance(op, Send):
            t = self._tensor(op.size_bytes, op.dtype, kind=MOVES)
            dist.send(t, dst=op.peer, group=group, tag=op.tag)
            return detail.format(t.numel() * t.element_size())
        t = self._tensor(op.size_bytes, op.dtype)  # zeros until the peer's data lands
        dist.recv(t, src=op.peer, group=group, tag=op.tag)
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        return detail.format(t.numel() * t.element_size()) + self._check_data(op, pg, t, MOVES)

    def op_batch_p2p(self, op: BatchIsendIrecv) -> str:
        """``batch_isend_irecv`` of the op's sends and recvs, in its order, then every request waited on; each recv's
        data checked as an unbatched recv's is."""
        dist = self.dist
        group = self._group(op.group)
        if group is NON_MEMBER:
            return f"not a member of {op.group!r}: torch warns and returns (no call)"
        items = op.items()
        # a recv's buffer is zeros until the peer's data lands
        tensors = [self._tensor(size, op.dtype, kind=MOVES if kind is Send else None) for kind, _, size in items]
        p2p = [
            dist.P2POp(dist.isend if kind is Send else dist.irecv, t, peer, group)
            for t, (kind, peer, _) in zip(tensors, items, strict=True)
        ]
        for request in dist.batch_isend_irecv(p2p):
            request.wait()
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        checks = "".join(
            self._check_data(Recv(peer=peer, group=op.group, size_bytes=size, dtype=op.dtype), pg, t, MOVES)
            for t, (kind, peer, size) in zip(tensors, items, strict=True)
            if kind is Recv
        )
        return f"{len(op.sends)} sends, {len(op.recvs)} recvs" + checks

    def op_destroy(self, op: DestroyProcessGroup) -> str:
        dist = self.dist
        if op.group == WORLD:
            dist.destroy_process_group()
            self.handles.pop(WORLD, None)  # the program's subgroups live on in its variables, as in torch
            self.seq.clear()
            return "destroyed every group"
        group = self._group(op.group)
        if group is NON_MEMBER:
            return "non-member: nothing to destroy"
        dist.destroy_process_group(group)
        return f"destroyed {op.group!r}"

    def op_compute(self, op: Compute) -> str:
        seconds = min(op.seconds * self.spec.compute_scale, self.spec.compute_cap_s)
        if seconds > 0:
            time.sleep(seconds)
            return f"slept {seconds:.3f}s (scale {self.spec.compute_scale}, cap {self.spec.compute_cap_s}s)"
        return "skipped (compute_scale 0)" if op.seconds > 0 else "no-op"

    def op_alloc(self, op: Alloc) -> str:
        if not self.gpu:
            return "skipped: CPU lane"
        self.allocations.setdefault(op.tag, []).append(
            self.torch.empty(int(op.mib * 1024 * 1024), dtype=self.torch.uint8, device=self._device())
        )
        return f"{op.mib} MiB ({op.tag})"

    def op_free(self, op: Free) -> str:
        """``del`` the tag's tensors: their blocks go to torch's cache."""
        if not self.gpu:
            return "skipped: CPU lane"
        freed = self.allocations.pop(op.tag, [])  # the last references: the blocks go back to torch's cache
        return f"freed {len(freed)} tensor(s) tagged {op.tag!r} into torch's cache"

    def op_empty_cache(self, op: EmptyCache) -> str:
        """Drop the tag's latest tensors until ``op.mib`` is given back (a partly freed one re-allocated at its
        remaining size), then ``torch.cuda.empty_cache()``."""
        if not self.gpu:
            return "skipped: CPU lane"
        held = self.allocations.get(op.tag, [])
        left = int(op.mib * 1024 * 1024)
        while left > 0 and held:
            last = held.pop()
            if last.numel() > left:
                held.append(self.torch.empty(last.numel() - left, dtype=last.dtype, device=last.device))
            left -= last.numel()
            del last
        self.torch.cuda.empty_cache()
        return f"{op.mib} MiB ({op.tag}) given back"

    def op_memory_check(self, op: MemoryCheck) -> str:
        if not self.gpu:
            return "skipped: CPU lane (no device memory to check)"
        torch = self.torch
        index = torch.cuda.current_device()
        torch.cuda.synchronize(index)
        free, total = torch.cuda.mem_get_info(index)
        requested = math.ceil(total * op.gpu_memory_utilization)
        if free < requested:
            gib = 1024**3
            raise CheckFailure(
                f"Free memory on device cuda:{index} ({free / gib:.2f}/{total / gib:.2f} GiB) on startup is less than "
                f"desired GPU memory utilization ({op.gpu_memory_utilization}, {requested / gib:.2f} GiB). Decrease "
                "GPU memory utilization or reduce GPU memory used by other processes."
            )
        return f"free {free / 2**20:.0f} MiB >= requested {requested / 2**20:.0f} MiB"

    def op_raise(self, op: Raise) -> str:
        raise CheckFailure(op.message, type_name=op.error_type)

    def op_checkpoint(self, op: Checkpoint) -> str:
        return f"checkpoint {op.label!r}"

    # ------------------------------------------------------------------ the loop

    def dispatch(self, op: Op) -> str:
        table: dict[type, Callable[[Any], str]] = {
            SetDevice: self.op_set_device,
            InitProcessGroup: self.op_init,
            NewGroup: self.op_new_group,
            SplitGroup: self.op_split_group,
            DestroyProcessGroup: self.op_destroy,
            BatchIsendIrecv: self.op_batch_p2p,
            Compute: self.op_compute,
            Alloc: self.op_alloc,
            Free: self.op_free,
            EmptyCache: self.op_empty_cache,
            MemoryCheck: self.op_memory_check,
            Raise: self.op_raise,
            Checkpoint: self.op_checkpoint,
        }
        handler = table.get(type(op))
        if handler is not None:
            return handler(op)
        if isinstance(op, Collective):
            return self.op_collective(op)
        if isinstance(op, PointToPoint):
            return self.op_p2p(op)
        raise TypeError(f"the driver has no rule for op {op.name!r}")

    def _start_record(self, index: int, op: Op) -> dict[str, Any]:
        record: dict[str, Any] = {"e": "start", "i": index, "name": op.name, "op": op.describe(), "t": time.time()}
        if isinstance(op, (Collective, PointToPoint)):
            record.update(self._group_info(op.group))
            if isinstance(op, PointToPoint):
                src, dst = (self.spec.rank, op.peer) if isinstance(op, Send) else (op.peer, self.spec.rank)
                record["members"] = [src, dst]
        elif isinstance(op, BatchIsendIrecv):
            record.update(self._group_info(op.group))
            record["members"] = sorted({self.spec.rank, *op.sends, *op.recvs})
        elif isinstance(op, NewGroup):
            record.update(
                handle=op.bind or "",
                members=list(op.ranks) if op.ranks is not None else list(range(self.spec.world_size)),
            )
        elif isinstance(op, InitProcessGroup):
            record.update(handle=WORLD, group="0", members=list(range(self.spec.world_size)))
        elif isinstance(op, SplitGroup):
            record.update(handle=op.bind or "", parent=op.parent)
        if isinstance(op, (InitProcessGroup, NewGroup, SplitGroup)):
            timeout = self._timeout(op.timeout_s, init=isinstance(op, InitProcessGroup))
            record["timeout_s"] = None if timeout is None else timeout.total_seconds()
        elif self.spec.torch_timeout_s is not None:
            record["timeout_s"] = self.spec.torch_timeout_s
        return record

    def run(self) -> dict[str, Any]:
        """Run the program; return the final record (``status`` done/error)."""
        final: dict[str, Any] = {"e": "final", "status": "done"}
        index = -1
        op: Op | None = None
        try:
            policy = lane_policy(self.spec.policy, self.spec.lane)
            with apply_policy(policy, gpu=self.spec.gpu, profile=self.spec.profile) as applied:
                self.applied = applied
                for index, op in enumerate(self.program.ops):
                    self.progress.write(self._start_record(index, op))
                    detail = self.dispatch(op)
                    end: dict[str, Any] = {"e": "end", "i": index, "outcome": "ok", "detail": detail}
                    end["measure"] = self.measurer.measure()
                    end["t"] = time.time()
                    if isinstance(op, Checkpoint):
                        end["label"] = op.label
                    self.progress.write(end)
                final["decisions"] = [_decision_text(call) for call in applied.decisions]
        except BaseException as exc:
            kind = "check" if isinstance(exc, CheckFailure) else classify(exc)
            type_name = exc.type_name if isinstance(exc, CheckFailure) else _qualified(exc)
            self.progress.write(
                {
                    "e": "end",
                    "i": index,
                    "outcome": kind,
                    "detail": f"{type_name}: {str(exc)[:2000]}",
                    "t": time.time(),
                }
            )
            final.update(
                status="error",
                kind=kind,
                type=type_name,
                message=str(exc)[:2000],
                op=op.describe() if op is not None else "",
                traceback=traceback.format_exc()[-4000:],
            )
            if isinstance(exc, CheckFailure) and exc.facts:
                final.update(exc.facts)
            if self.applied is not None:
                final["decisions"] = [_decision_text(call) for call in self.applied.decisions]
        final["notes"] = self.notes + self.measurer.notes
        final["t"] = time.time()
        return final


def _group_name(pg: Any) -> str:
    """A process group's name, or "" where torch no longer gives one."""
    try:
        return str(pg.group_name)
    except Exception:
        return ""


def _qualified(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return cls.__name__ if module in ("builtins", "simnccl.real.driver") else f"{module}.{cls.__name__}"


def _decision_text(call: Any) -> dict[str, Any]:
    decision = call.decision
    describe = getattr(decision, "describe", None)
    return {
        "call": call.kind,
        "ranks": None if call.ranks is None else list(call.ranks),
        "plan": describe() if callable(describe) else repr(decision),
        "explanation": getattr(decision, "explanation", "") or "as requested",
        "torch_called": call.torch_called,
    }


# ---------------------------------------------------------------------------------------------- entry points


def make_store(spec: RankSpec) -> Any:
    """The rendezvous store: the local launcher's agent store (``agent``: a TCPStore its store host holds, every
    rank a client, reached through torch's env:// rendezvous as a torchrun worker reaches its agent's), a FileStore,
    a TCPStore, or torchrun's env:// store; None for ``per-init`` (a spawn launcher's: each init_process_group makes
    its own TCPStore, hosted by rank 0, which ``destroy_process_group`` drops with the default group, as
    ``init_method="tcp://..."`` does)."""
    import torch.distributed as dist

    kind = spec.store.get("kind", "file")
    if kind == "per-init":
        return None
    timeout = datetime.timedelta(seconds=spec.store.get("timeout_s", 60.0))
    prefix = spec.store.get("prefix", "real")
    if kind == "file":
        store = dist.FileStore(spec.store["path"], spec.world_size)
        store.set_timeout(timeout)
    elif kind == "tcp":
        store = dist.TCPStore(
            spec.store["host"],
            int(spec.store["port"]),
            spec.world_size,
            is_master=spec.rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
    elif kind == "env":
        store, _, _ = next(dist.rendezvous("env://", spec.rank, spec.world_size, timeout=timeout))
    elif kind == "agent":  # what torchrun's agent exports to its workers (torch/distributed/rendezvous.py)
        os.environ["MASTER_ADDR"] = spec.store["host"]
        os.environ["MASTER_PORT"] = str(int(spec.store["port"]))
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = str(True)
        store, _, _ = next(dist.rendezvous("env://", spec.rank, spec.world_size, timeout=timeout))
    else:
        raise ValueError(f"unknown store kind {kind!r}")
    return dist.PrefixStore(prefix, store)


def store_host_main(spec: dict[str, Any]) -> int:
    """The local launcher's store host, a process of its own as torchrun's agent is: it holds the run's TCPStore
    (on loopback, a port the kernel picks), writes the port to ``port_file`` (whole, by a rename) and stays until
    the run's ``release_file`` appears or ``park_max_s`` passes.

    Why not a FileStore (what the launcher used): its waits are polls that ran late, so on the real side a peer
    1.8 s late under a 1 s ``new_group``/``split_group`` timeout got through, and a 0.3 s timeout became ~1 s: a
    false DISAGREE with a simulator that models torchrun's TCPStore. Why not rank 0 hosting it: a rank that ends
    would take its peers' store with it, which torchrun's agent store does not."""
    import torch.distributed as dist

    store = dist.TCPStore(
        spec["host"], 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=spec["timeout_s"])
    )
    partial = spec["port_file"] + ".partial"
    with open(partial, "w", encoding="utf-8") as out:
        out.write(str(store.port))
    os.replace(partial, spec["port_file"])
    deadline = time.monotonic() + spec["park_max_s"]
    while time.monotonic() < deadline and not os.path.exists(spec["release_file"]):
        time.sleep(0.05)
    del store
    return 0


def prepare_env(spec: RankSpec) -> None:
    """The process environment the rank runs under: the variant's env, plus what a launcher sets."""
    os.environ.update(spec.env)
    os.environ["RANK"] = str(spec.rank)
    os.environ["WORLD_SIZE"] = str(spec.world_size)
    if spec.set_launcher_env:  # torchrun sets these; a plain spawn launcher does not (nccl2's device fallback)
        os.environ["LOCAL_RANK"] = str(spec.local_rank)
        os.environ["LOCAL_WORLD_SIZE"] = str(spec.local_world_size)


def park(spec: RankSpec) -> None:
    """Keep the process (and its sockets) alive until released, so peers waiting on it stay blocked."""
    deadline = time.monotonic() + spec.park_max_s
    while time.monotonic() < deadline:
        if spec.release_file and os.path.exists(spec.release_file):
            return
        time.sleep(0.02)


def child_main(spec: RankSpec, extra: Callable[[dict[str, Any]], None] | None = None) -> int:
    """A rank process's whole life: env, store, program, final record, park. Returns the exit code."""
    prepare_env(spec)
    progress = Progress(spec.progress, extra)
    progress.write({"e": "hello", "rank": spec.rank, "pid": os.getpid(), "t": time.time()})
    program = program_from_list(spec.program)
    try:
        import torch  # noqa: F401
    except ImportError as err:  # pragma: no cover - the launcher checks first
        progress.write({"e": "final", "status": "error", "kind": "error", "type": "ImportError", "message": str(err)})
        return 2
    driver = Driver(spec, program, progress)
    try:
        driver.store = make_store(spec)
    except BaseException as exc:
        final = {
            "e": "final",
            "status": "error",
            "kind": classify(exc),
            "type": _qualified(exc),
            "message": f"store rendezvous failed: {exc}"[:2000],
            "op": "<store>",
            "t": time.time(),
        }
        progress.write(final)
        park(spec)
        return 1
    final = driver.run()
    progress.write(final)
    park(spec)
    progress.close()
    return 0 if final["status"] == "done" else 1

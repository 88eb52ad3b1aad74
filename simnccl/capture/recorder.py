"""One rank's recorder, and which recorder is active.

Why a module of its own: the stand-in backend, the call wrappers and the per-rank installation all record into
whichever recorder is active; the active one is process state, read through ``active()`` so no module holds a
stale copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.distributed import distributed_c10d as c10d

from simnccl.capture.fake_devices import TensorMemory
from simnccl.capture.result import Call
from simnccl.capture.values import _plain
from simnccl.limits import current as current_limits
from simnccl.limits import exceeded
from simnccl.ops import (
    WORLD,
    Checkpoint,
    MemoryCheck,
    NewGroup,
    Op,
    SetDevice,
)

UNRECORDED = "unrecorded"  # the handle of a group whose creation was not seen (never silently "world")


_STANDIN_DEVICES = (torch.device("cpu"), torch.device("cuda"))  # the device types every stand-in registers for


class _Recorder:
    """One rank's ops and calls, group families, and the ProcessGroup -> handle map.

    ``ops`` and ``calls`` may hold a ``new_group`` call in compact form (``record_new_group``); ``built_ops`` and
    ``built_calls`` turn them into the Ops and Calls they stand for.
    """

    def __init__(self, rank: int, local_rank: int, checkpoints: bool, world_size: int = 0) -> None:
        self.rank = rank
        self.world_size = world_size  # the capture's world (0: not known, as in the fork server's preload)
        self.local_rank = local_rank
        self.checkpoints = checkpoints
        self.ops: list[Op | tuple[Any, ...]] = []  # a tuple: a compact new_group (record_new_group)
        self.calls: list[Call | tuple[dict[str, Any], str]] = []
        self.notes: list[str] = []
        # The torch call the next barrier the stand-in records stands for (``ops.CALLS``): monitored_barrier runs
        # its group's barrier, which must be recorded as the monitored one it is.
        self.barrier_call = ""
        self.barrier_timeout_s: float | None = None  # a monitored_barrier's own timeout, while it runs
        # Inside all_gather_object or gather_object (``environment._object_gather``): the gather of the pickled
        # objects (bytes) is recorded ``padded``, as torch pads every rank's to the largest.
        self.padding = False
        self.handles: dict[int, str] = {}  # id(ProcessGroup) -> handle
        self.groups: list[Any] = []  # keep the ProcessGroups alive so ids stay unique
        # open families: key (desc or backend) -> (handle, union of ranks so far)
        self.families: dict[str, tuple[str, set[int]]] = {}
        self.family_count: dict[str, int] = {}
        self.inits = 0  # init_process_group calls that made a default group: each one's checkpoint is its own
        self.renamed: str | None = None  # why a later group call is refused (``intercept._unrecord``)
        # CUDA's current device as the rank's code sees it (``environment._FakeCuda`` sets it): a collective on a
        # tensor of another device is recorded on that device (``standin._on_tensor_device``)
        self.current_device: Callable[[], int] = lambda: 0
        # os.environ as the rank's first init_process_group began (``intercept``): the NCCL knobs its code set
        # by then are the ones simulated (``ranks.knobs_set_by_code``); None: no init yet
        self.env_at_init: dict[str, str] | None = None
        # os.environ as the rank's first call naming torch's "nccl" backend began (``intercept._names_nccl``):
        # where torch reads TORCH_DIST_USE_NCCL2 (``ranks.branch_knobs_set_by_code``); None: no such call
        self.env_at_nccl: dict[str, str] | None = None
        # os.environ as the rank's first collective, send or recv began (``communicating``): where a lazy
        # communicator is made, and NCCL reads its knobs (most once per process)
        self.env_at_first_op: dict[str, str] | None = None
        # A batch_isend_irecv in progress: its sends and recvs as the stand-in sees them, recorded as one op at its
        # end (``intercept._batch_wrapper``): (is a send, peer's global rank, bytes, dtype, group handle) each.
        self.batch: list[tuple[bool, int, int, str, str]] | None = None
        self.memory = TensorMemory()  # the rank's emulated CUDA tensors (simnccl.capture.fake_devices)
        self.max_ops = current_limits().max_program_ops  # a Program's bound, checked as the rank records

    def set_device_op(self, index: int) -> SetDevice:
        """``set_device(index)`` as a Program holds it: ``SetDevice()`` means "this process's LOCAL_RANK", so ranks
        that each set their own device share one Program."""
        return SetDevice(device=None if index == self.local_rank else index)

    def communicating(self) -> None:
        """The rank issues a collective, send or recv: the environment then is kept, once (``env_at_first_op``)."""
        if self.env_at_first_op is None:
            self.env_at_first_op = dict(os.environ)

    def add(self, op: Op | None, name: str, args: Mapping[str, Any], handle: str | None = None) -> None:
        self.calls.append(Call(name, {k: _plain(v) for k, v in args.items()}, handle))
        if op is not None:
            self.append(op)

    def record(self, op: Op, call: Call) -> None:
        """``add`` for a call whose arguments are plain already (the recording fast path)."""
        self.calls.append(call)
        self.append(op)

    def record_new_group(self, fields: tuple[Any, ...], args: dict[str, Any], handle: str) -> None:
        """``record`` of a ``NewGroup`` and its ``new_group`` Call, kept as their values: ``fields`` (NewGroup's
        field values in order) and ``(args, handle)``. Why: Megatron makes ~2,900 such calls per rank at 512
        ranks; building two frozen objects per call, then pickling them back to the parent, cost a fifth of a
        rank's CPU, and every rank but the first sends the parent a list it already has (``ranks._Results``
        builds each distinct list once)."""
        self.calls.append((args, handle))
        self.append(fields)

    def append(self, op: Op | tuple[Any, ...]) -> None:
        """Append ``op`` after the tensor memory reserved since the last op (``alloc``/``empty_cache`` ops)."""
        self.ops.extend(self.memory.changes())
        self.ops.append(op)
        if len(self.ops) > self.max_ops:
            raise TooManyOps(
                f"rank {self.rank}: the captured code issued more ops than a Program may hold: "
                + exceeded("max_program_ops", f"{len(self.ops)} ops", self.max_ops)
            )

    def finish(self) -> None:
        """Charge the tensor memory reserved after the last recorded call."""
        self.ops.extend(self.memory.changes())
        devices = self.memory.devices()
        if len(devices) > 1:
            shown = ", ".join(f"cuda:{index}" for index in devices)
            self.notes.append(
                f"rank {self.rank} placed tensors on {shown}: all of them are charged to its current device"
            )

    def family(self, stem: str, ranks: Sequence[int] | None, world_size: int) -> str:
        members = range(world_size) if ranks is None else ranks
        open_family = self.families.get(stem)
        if open_family is not None and open_family[1].isdisjoint(members):
            open_family[1].update(members)
            return open_family[0]
        count = self.family_count.get(stem, 0) + 1
        self.family_count[stem] = count
        handle = f"{stem}.{count}"
        self.families[stem] = (handle, set(members))
        return handle

    def bind(self, pg: Any, handle: str) -> None:
        """Remember ``pg``'s handle and tell its stand-in backends, which record collectives under it."""
        if not isinstance(pg, c10d.ProcessGroup):
            return
        self.handles[id(pg)] = handle
        self.groups.append(pg)
        from simnccl.capture.standin import StandInBackend  # the backend module records into this one

        for device in _STANDIN_DEVICES:  # every stand-in (``_device_types`` shows a GPU host's, not theirs)
            try:
                backend = pg._get_backend(device)
            except RuntimeError:  # a device type without a backend
                continue
            if isinstance(backend, StandInBackend):
                backend.handle = handle

    def handle_of(self, pg: Any) -> str:
        if pg is None or pg is c10d.GroupMember.WORLD:
            return WORLD
        return self.handles.get(id(pg), UNRECORDED)


def built_ops(items: Iterable[Any]) -> tuple[Op, ...]:
    """A recorder's ``ops`` as Ops (a compact ``new_group`` entry, a tuple, becomes its ``NewGroup``)."""
    return tuple(NewGroup(*item) if type(item) is tuple else item for item in items)


def built_calls(items: Iterable[Any]) -> tuple[Call, ...]:
    """A recorder's ``calls`` as Calls (a compact ``new_group`` entry, a tuple, becomes its ``Call``)."""
    return tuple(Call("new_group", *item) if type(item) is tuple else item for item in items)


class TooManyOps(BaseException):
    """A rank recorded more ops than ``max_program_ops``: a loop of group calls or collectives that would grow
    the rank's record (and the parent's) without bound. A BaseException, so the captured code's own ``except
    Exception`` cannot swallow it and loop on; the capture reports it as the rank's failure (exit 2)."""


_ACTIVE: _Recorder | None = None


def active() -> _Recorder | None:
    """The recorder of the rank running now, or None outside a capture."""
    return _ACTIVE


def set_active(recorder: _Recorder | None) -> None:
    """Make ``recorder`` the one every wrapper and stand-in backend records into (None: stop recording)."""
    global _ACTIVE
    _ACTIVE = recorder


def checkpoint(label: str) -> None:
    """Mark a memory measurement point in the captured program (a no-op when not capturing).

    Code under capture may call it, e.g. ``simnccl.capture.checkpoint("startup")`` after building its groups;
    the simulator reports used/free memory per device there.
    """
    if _ACTIVE is not None:
        _ACTIVE.add(Checkpoint(label), "checkpoint", {"label": label})


def memory_check(gpu_memory_utilization: float = 0.9) -> None:
    """Mark a vLLM-style startup memory check in the captured program (a no-op when not capturing).

    The simulated rank fails there, as vLLM does, when the device's free memory (its tensors, CUDA context and
    communicators, every process on the GPU) is below ``ceil(total * gpu_memory_utilization)``; placed after a
    captured training step, it asks whether step 1's peak left the headroom a second job or phase needs.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization: expected a fraction in (0, 1], got {gpu_memory_utilization!r}")
    if _ACTIVE is not None:
        op = MemoryCheck(gpu_memory_utilization=float(gpu_memory_utilization))
        _ACTIVE.add(op, "memory_check", {"gpu_memory_utilization": gpu_memory_utilization})

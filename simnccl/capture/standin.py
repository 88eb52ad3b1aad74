"""The stand-in c10d backend: registered under every backend name, records collectives, communicates nothing.

Outputs are still written, deterministically (``collective_values``: as if every rank held this rank's data).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Backend as C10dBackend
from torch._C._distributed_c10d import _create_work_from_future

from simnccl.c10d import ProcessContext, _binds_device, nccl_device_fallback
from simnccl.capture import collective_values as values
from simnccl.capture.fake_devices import placed_device
from simnccl.capture.recorder import UNRECORDED, _Recorder, active
from simnccl.capture.values import _dtype, _nbytes
from simnccl.ops import (
    WORLD,
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    Broadcast,
    Op,
    Recv,
    ReduceScatter,
    Send,
)
from simnccl.release import DeviceBackend, Impl, get_release

# What a rank that received a broadcast holds here (``collective_values``: its own values, zeros in what torch made
# with ``empty``): code that branches on received values takes this rank's branch, not the one rank src's data
# would take (a config broadcast from rank 0; ``broadcast_object_list`` then unpickles nothing: EOFError).
BROADCAST_RECEIVED = (
    "a broadcast's or scatter's receivers kept their own values (a capture has no other rank's data): code that "
    "branches on what it received followed the receiver's values, and broadcast_object_list or scatter_object_list "
    "cannot unpickle the source's objects (EOFError)"
)


def _shape_text(shape: Sequence[int]) -> str:
    """A shape as ProcessGroupGloo prints one in its errors: ``(4)``, ``(2, 3)``."""
    return "(" + ", ".join(str(n) for n in shape) + ")"


class StandInBackend(C10dBackend):
    """A torch Backend that records each collective and completes it at once, communicating nothing."""

    def __init__(
        self, rank: int, size: int, name: str, global_ranks: Sequence[int], timeout: timedelta, lazy: bool = False
    ) -> None:
        super().__init__(rank, size)
        self._name = name
        # nccl2's supportsSplitting(): ``!lazy_init || initialized`` (reference §B.5): a lazy_init group is no
        # split source until its first collective, so split_group on it raises torch's own error, as on a GPU.
        self._lazy = lazy
        self._global = list(global_ranks) or list(range(size))
        self._options = C10dBackend.Options(name, timeout)
        self.handle = WORLD if not global_ranks else UNRECORDED

    # Every bool property and ``options`` must be defined on a PyBackend subclass: the C++ trampoline looks
    # the attribute up on the class, finds the base property, calls the C++ getter, which calls back here.
    @property
    def options(self) -> Any:
        return self._options

    @property
    def supports_splitting(self) -> bool:
        return not self._lazy

    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def _supports_time_estimate(self) -> bool:
        return False

    @property
    def supports_shrinking(self) -> bool:
        return False

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    def getBackendName(self) -> str:
        return self._name

    def eager_connect_single_device(self, device: Any) -> None:
        return None

    def perform_nocolor_split(self, device: Any) -> None:
        return None

    def split(self, store: Any, ranks: Sequence[int], opts: Any) -> StandInBackend | None:
        own = self._global[self.rank()]
        members = [self._global[r] for r in ranks]
        if own not in members:
            return None
        return StandInBackend(members.index(own), len(members), self._name, members, self._options._timeout)

    # ------------------------------------------------------------------ collectives

    def _done(self, result: Any) -> Any:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(result)
        return _create_work_from_future(future)

    def _record(self, op_type: type[Op], name: str, tensors: Sequence[torch.Tensor], **extra: Any) -> None:
        self._lazy = False  # the first collective initialises a lazy_init communicator
        recorder = active()
        if recorder is None:
            return
        recorder.communicating()
        dtype = _dtype(tensors[0]) if tensors else "Float"
        _check_bound(recorder, self.handle, name)
        if recorder.padding and op_type is AllGather and dtype == "Byte":
            extra = {**extra, "padded": True}  # an object collective's data: each rank's padded to the largest
        op = op_type(group=self.handle, size_bytes=_nbytes(tensors), dtype=dtype, **extra)
        args = {"group": self.handle, "tensors": list(tensors), **extra}
        with _on_tensor_device(recorder, tensors):
            recorder.add(op, name, args, self.handle)

    def _gloo_refuses(self, opts: Any, tensors: Sequence[torch.Tensor]) -> None:
        """What ProcessGroupGloo refuses on the calling rank before anything is sent (its reduce function's
        checks): the stand-in completed such a call, and the capture passed what real gloo raises on (a tester,
        torch 2.15 CPU: every rank's error, 3 runs of 3; the texts are real gloo's)."""
        if self._name != "gloo":
            return
        kind = getattr(getattr(opts, "reduceOp", None), "op", None)
        ops = torch.distributed.ReduceOp
        if kind == ops.PREMUL_SUM:
            raise RuntimeError("Cannot use ReduceOp.PREMUL_SUM with Gloo")
        bitwise = {ops.BAND: "BAND", ops.BOR: "BOR", ops.BXOR: "BXOR"}
        if kind in bitwise and any(t.is_floating_point() or t.is_complex() for t in tensors):
            raise RuntimeError(f"Cannot use ReduceOp.{bitwise[kind]} with non-integral dtype")

    def _gloo_gather_lists(
        self,
        outputs: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor] = (),
        *,
        coalesced: bool = False,
    ) -> None:
        """ProcessGroupGloo's allgather checks each output list holds one tensor per member; its
        allgather_coalesced, that there is one output list per member (real gloo's texts)."""
        if self._name != "gloo":
            return
        size = self.size()
        if coalesced:
            if len(outputs) != size:
                raise RuntimeError("ProcessGroupGloo::allgather_coalesced: output lists should be equal to world size")
            return
        for index, slots in enumerate(outputs):
            if len(slots) != size:
                raise RuntimeError(
                    f"ProcessGroupGloo::allgather: invalid output tensor list at index {index} (expected length "
                    f"{size}, got {len(slots)})"
                )
            for slot_index, slot in enumerate(slots):
                if inputs and slot.shape != inputs[index].shape:
                    raise RuntimeError(
                        f"ProcessGroupGloo::allgather: invalid tensor size at index {slot_index} (expected "
                        f"{_shape_text(inputs[index].shape)}, got {_shape_text(slot.shape)})"
                    )

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._gloo_refuses(opts, tensors)
        self._record(AllReduce, "all_reduce", tensors)
        return self._done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._gloo_refuses(opts, tensors)
        self._record(AllReduce, "all_reduce_coalesced", tensors)
        return self._done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._gloo_refuses(opts, tensors)
        # Run as an all-reduce (same members and payload), recorded as the reduce it is, with its root: ranks that
        # name different roots, or mix it with an all_reduce, do not run one collective (``ops.CALLS``).
        self._record(AllReduce, "reduce", tensors, call="reduce", root=self._global[opts.rootRank])
        return self._done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        src = self._global[opts.rootRank]
        self._record(Broadcast, "broadcast", tensors, src=src)
        self._note_received(src)
        return self._done(tensors)

    def _note_received(self, src: int) -> None:
        """A receiver of a rooted transfer (``BROADCAST_RECEIVED``), said once."""
        recorder = active()
        if recorder is not None and src != self._global[self.rank()] and BROADCAST_RECEIVED not in recorder.notes:
            recorder.notes.append(BROADCAST_RECEIVED)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._gloo_gather_lists(outputs, inputs)
        return self._allgather(outputs, inputs)

    def _allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> Any:
        self._record(AllGather, "all_gather", inputs)
        for slots, tensor in zip(outputs, inputs, strict=False):
            values.gather_into_slots(slots, tensor)
        return self._done(outputs)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._gloo_gather_lists(outputs, coalesced=True)
        return self._allgather(outputs, inputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._record(AllGather, "all_gather_into_tensor", [input])
        values.gather_into(output, input)
        return self._done([output])

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllGather, "all_gather_into_tensor_coalesced", inputs)
        for output, tensor in zip(outputs, inputs, strict=False):
            values.gather_into(output, tensor)
        return self._done(outputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        # Run as an all-gather (same members and per-rank payload), recorded as the gather it is, with its root.
        if self._name == "gloo" and outputs and len(outputs[0]) != self.size():  # the root's list, gloo's check
            raise RuntimeError(
                f"ProcessGroupGloo::gather: Incorrect output list size {len(outputs[0])}. Output list size should be "
                f"{self.size()}, same as size of the process group."
            )
        self._record(AllGather, "gather", inputs, call="gather", root=self._global[opts.rootRank])
        for slots, tensor in zip(outputs, inputs, strict=False):  # the root's slots (empty elsewhere)
            values.gather_into_slots(slots, tensor)
        return self._done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        # Run as a broadcast (a rooted one-to-all transfer), recorded as the scatter it is.
        if self._name == "gloo" and inputs and len(inputs[0]) != self.size():  # the root's list, gloo's check
            raise RuntimeError(
                f"ProcessGroupGloo::scatter: Incorrect input list size {len(inputs[0])}. Input list size should be "
                f"{self.size()}, same as size of the process group."
            )
        src = self._global[opts.rootRank]
        self._record(Broadcast, "scatter", outputs, src=src, call="scatter")
        for output, chunks in zip(outputs, inputs or [[] for _ in outputs], strict=False):
            values.own_chunk_of_list(output, chunks, self.rank())  # the root's own chunk; zeros elsewhere
        self._note_received(src)
        return self._done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        self._record(ReduceScatter, "reduce_scatter", [t for chunk in inputs for t in chunk])
        for output, chunks in zip(outputs, inputs, strict=False):
            values.own_chunk_of_list(output, chunks, self.rank())
        return self._done(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._record(ReduceScatter, "reduce_scatter_tensor", [input])
        values.own_chunk(output, input, self.rank())
        return self._done([output])

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        self._record(ReduceScatter, "reduce_scatter_tensor_coalesced", inputs)
        for output, tensor in zip(outputs, inputs, strict=False):
            values.own_chunk(output, tensor, self.rank())
        return self._done(outputs)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any,
    ) -> Any:
        self._record(AllToAll, "all_to_all_single", [input])
        values.exchange(output, input, self.rank(), self.size(), list(output_splits) + list(input_splits))
        return self._done([output])

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllToAll, "all_to_all", inputs)
        values.exchange_list(outputs, inputs, self.rank())
        return self._done(outputs)

    def barrier(self, opts: Any) -> Any:
        self._lazy = False
        recorder = active()
        if recorder is not None:
            recorder.communicating()
            _check_bound(recorder, self.handle, "barrier")
            call = recorder.barrier_call
            op = Barrier(group=self.handle, call=call, timeout_s=recorder.barrier_timeout_s if call else None)
            recorder.add(op, call or "barrier", {"group": self.handle}, self.handle)
        return self._done(None)

    def _p2p(self, op_type: type[Op], name: str, tensors: list[torch.Tensor], peer: int, tag: int = 0) -> Any:
        if not 0 <= peer < len(self._global):  # a peer outside the group: the rank's error, as the simulator says
            raise ValueError(f"Invalid peer rank {peer} for {name}: the group has {len(self._global)} ranks")
        if tag < 0 and self._name == "gloo":  # ProcessGroupGloo's own check (real gloo: every such rank raises)
            raise RuntimeError("Tag must be nonnegative")
        self._lazy = False
        recorder = active()
        if recorder is not None:
            recorder.communicating()
            dtype = _dtype(tensors[0]) if tensors else "Float"
            peer_rank = self._global[peer]
            _check_bound(recorder, self.handle, name)
            if recorder.batch is not None and tag:
                raise NotImplementedError(
                    "simnccl capture cannot record the tag of a batch_isend_irecv op (a simulated batch has none; "
                    "gloo matches its sends and recvs by tag): capture this code with untagged P2POps"
                )
            if recorder.batch is not None:  # one op of a batch_isend_irecv: the batch is recorded at its end
                recorder.batch.append((op_type is Send, peer_rank, _nbytes(tensors), dtype, self.handle))
                return self._done(tensors)
            op = op_type(peer=peer_rank, group=self.handle, size_bytes=_nbytes(tensors), dtype=dtype, tag=tag)
            with _on_tensor_device(recorder, tensors):
                recorder.add(op, name, {"group": self.handle, "peer": peer_rank, "tensors": tensors}, self.handle)
        return self._done(tensors)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p(Send, "send", tensors, dst, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """``recv`` without ``src``: gloo runs it (real, 3 runs of 3), but a Program's recv names its sender and the
        simulator matches it to that one send, so the capture says what it lacks instead of torch's "Backend gloo
        does not support recvAnysource" (false, and it read as the code's own error)."""
        raise NotImplementedError(
            "simnccl capture cannot record a recv without src (from any rank): a simulated recv names its sender; "
            "give src to capture this code"
        )

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        values.zeros(tensors)
        return self._p2p(Recv, "recv", tensors, src, tag)


@contextlib.contextmanager
def _on_tensor_device(recorder: _Recorder, tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Record the op inside as run on its tensors' CUDA device: between a ``set_device`` to it and one back, where it
    is not the current device.

    Why: torch runs a collective on its tensor's device, not the current one (legacy ProcessGroupNCCL keys its
    communicator by it; nccl2 checks it against the bound device), and the simulator reads the current device. A
    tensor on cuda:0 on every rank, each rank's current device its own, captured as a pass where legacy NCCL finds
    every rank on one GPU; and a tensor on the bound device with no set_device at all (current device 0) as
    nccl2's wrong-device error. The switch costs what the tensor cost there: the device's CUDA context."""
    device = placed_device(recorder.memory, tensors[0]) if tensors else None
    current = recorder.current_device()
    if device is None or device == current:
        yield
        return
    recorder.append(recorder.set_device_op(device))
    yield
    recorder.append(recorder.set_device_op(current))


def _check_bound(recorder: _Recorder, handle: str, call: str) -> None:
    if handle == UNRECORDED:
        note = (
            f"{call} on a group created outside init_process_group/new_group/split_group: recorded on handle "
            f"{UNRECORDED!r}, which a replay rejects"
        )
        if note not in recorder.notes:
            recorder.notes.append(note)


def _creator(name: str, release_key: str, world_size: int, gpus_per_node: int) -> Callable[..., Any]:
    """torch's extended-API creator for ``name``: binds the device where the emulated release would.

    Whether and where are the simulator's own rules (``simnccl.c10d``), so capture and simulation cannot drift.
    """
    release = get_release(release_key)

    def create(opts: Any, backend_options: Any) -> StandInBackend:
        if name == "fake" and not 0 <= opts.group_rank < opts.group_size:
            # torch's FakeProcessGroup constructor checks this (fake_pg's ``init_process_group("fake")`` with no
            # rank or world reaches it with -1 and -1: torch 2.15 takes no rendezvous for "fake"). Without it the
            # capture recorded a world of -1 ranks and failed later, at a call real torch never reaches.
            raise RuntimeError(
                f"Cannot init process group where rank ({opts.group_rank}) >= world_size ({opts.group_size})"
            )
        # The rank's environment now (its env, plus the knobs a policy set before init_process_group).
        impl = release.impl_for_name(name, os.environ)
        binds = _binds_device(release, DeviceBackend("cuda", name, impl))
        pg = opts.process_group
        if pg is not None:
            bound = pg.bound_device_id
            if bound is not None and bound.type != "cpu":
                pg.bound_device_id = torch.device("cpu", 0 if bound.index is None else bound.index)
            elif bound is None and binds and not opts.enable_reconfigure:
                # torch 2.15 _nccl2_device, written back; the rank is this rank's (the creator runs on it).
                ranks = list(opts.global_ranks_in_group)
                rank = ranks[opts.group_rank] if ranks else opts.group_rank
                local = int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else rank % gpus_per_node
                ctx = ProcessContext(rank, world_size, local, gpus_per_node, os.environ)
                pg.bound_device_id = torch.device("cpu", nccl_device_fallback(ctx, os.environ))
        lazy = impl in (Impl.NCCL2, Impl.NCCL_LAZY) and bool(getattr(backend_options, "lazy_init", False))
        return StandInBackend(
            opts.group_rank, opts.group_size, impl.cpp_name, list(opts.global_ranks_in_group), opts.timeout, lazy
        )

    return create

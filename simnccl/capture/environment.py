"""What one rank runs inside: stand-in backends registered, fake CUDA, peerless rendezvous, the active recorder."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.distributed import distributed_c10d as c10d

from simnccl.capture.backend_devices import cpu_backend, group_backend, group_serves
from simnccl.capture.fake_devices import FakeCuda, driver_call_message, invalid_ordinal
from simnccl.capture.recorder import _Recorder, active, set_active
from simnccl.capture.result import CaptureError
from simnccl.capture.standin import _creator
from simnccl.cluster import get_gpu_kind
from simnccl.release import KNOWN_BACKEND_NAMES

DEFAULT_GPU = "h100-80gb"  # the GPU kind captured code is told it runs on, and CapturedRun.simulate's default


class _FakeCuda:
    """Stand-ins for the ``torch.cuda``/``torch.accelerator`` queries startup code makes, per rank."""

    def __init__(self, recorder: _Recorder, gpus_per_node: int, gpu: str = DEFAULT_GPU) -> None:
        self.recorder = recorder
        self.count = gpus_per_node
        self.current: int | None = None
        recorder.current_device = self.current_index
        # CUDA tensors, RNG, streams and memory statistics on the CPU (simnccl.capture.fake_devices)
        self.tensors = FakeCuda(recorder.memory, gpus_per_node, self.current_index, get_gpu_kind(gpu))

    def set_device(self, device: Any) -> None:
        """``torch.cuda.set_device``: its own argument rules (``_get_device_index``: "cuda" with no index and "cpu"
        raise ValueError, a negative index is a no-op), then the switch, recorded."""
        from torch.cuda._utils import _get_device_index

        index = _get_device_index(device)
        if index < 0:
            return
        if index >= self.count:
            raise invalid_ordinal(index, self.count)
        self.current = index
        self.recorder.add(self.recorder.set_device_op(index), "set_device", {"device": index})

    def current_index(self) -> int:
        return 0 if self.current is None else self.current

    def exchange_device(self, index: int) -> int:
        """``torch.cuda._exchange_device`` (what ``with torch.cuda.device(i)`` calls): switch, return the old.

        A switch to another device is recorded as ``set_device`` is (and the switch back on leaving the block):
        the simulator reads the current device where torch does (nccl2's binding at init, a barrier's device, the
        memory a rank's tensors take). Unrecorded, a collective inside the block ran on the device before it."""
        old = self.current_index()
        if index >= 0 and index != old:
            if index >= self.count:
                raise invalid_ordinal(index, self.count)
            self.current = index
            self.recorder.append(self.recorder.set_device_op(index))
        return old

    def patches(self) -> list[tuple[Any, str, Any]]:
        """The stand-ins, also where ``torch.cuda.random`` imported torch.cuda's functions by name."""
        own = self._patches()
        random = torch.cuda.random
        return own + [(random, attr, value) for obj, attr, value in own if obj is torch.cuda and hasattr(random, attr)]

    def _patches(self) -> list[tuple[Any, str, Any]]:
        return [
            (torch.cuda, "is_available", lambda: True),
            (torch.cuda, "device_count", lambda: self.count),
            (torch.cuda, "set_device", self.set_device),
            (torch.cuda, "current_device", self.current_index),
            (torch.cuda, "synchronize", lambda device=None: None),
            (torch.cuda, "_exchange_device", self.exchange_device),
            (torch.cuda, "_maybe_exchange_device", self.exchange_device),
            (torch.accelerator, "is_available", lambda: True),
            (torch.accelerator, "device_count", lambda: self.count),
            (torch.accelerator, "set_device_index", self.set_device),
            (torch.accelerator, "current_device_index", self.current_index),
            *self.tensors.patches(),
        ]


def _split_without_nonmembers(split_group: Callable[..., Any]) -> Callable[..., Any]:
    """``ProcessGroup.split_group`` answering None, as torch's C++ does, for a rank outside ``ranks``.

    Why: torch hands a rank in no split its first split's ranks (``split_ranks=[[0, 1]]`` on ranks 2 and 3, a
    valid call torch documents), and ``ProcessGroup::splitGroup`` then asks each backend to split; gloo's and
    NCCL's answer nullptr, and ``split_group`` returns ``NON_GROUP_MEMBER``. A Python backend's None is not
    converted to nullptr: the stand-in's answer crashed the process (SIGSEGV)."""

    def split(self: Any, ranks: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        if self.rank() not in ranks:
            return None
        return split_group(self, ranks, *args, **kwargs)

    return split


def _peerless_store(*args: Any, **kwargs: Any) -> Any:
    """What a rendezvous makes instead of its store (``_create_c10d_store``, ``FileStore``): ``_fake_store``."""
    return _fake_store()


def _fake_store() -> Any:
    """torch's no-op store; torch 2.15 exports it from its testing module only (not as ``dist.FakeStore``)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def _cuda_tensors_routed(original: Callable[..., None]) -> Callable[..., None]:
    """``BackendConfig.__init__`` that also routes the cpu device type to a group's cuda backend where it has none
    (``init_process_group()``: the accelerator's only; ``"cuda:nccl"``). Why: the capture's CUDA tensors are CPU
    tensors underneath, and torch picks a group's backend by that device, so such a group's first collective
    raised "No backend type associated with device type cpu" where a GPU host runs it. The function mode then
    checks the device each tensor of a call stands for against the group's real device types
    (``backend_devices.check_group_devices``), so a real CPU tensor there still fails as it does on a GPU host."""

    def init(self: Any, backend: Any) -> None:
        original(self, backend)
        mapping = self.device_backend_map
        if "cuda" in mapping and "cpu" not in mapping:
            mapping["cpu"] = mapping["cuda"]

    return init


MONITORED_BARRIER = (
    "monitored_barrier is simulated as a barrier of its group that only monitored barriers meet, waiting its own "
    "timeout"
)


def _monitored_barrier_as_gloo_runs_it(pg: Any, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
    """``ProcessGroup.monitored_barrier``: its group's cpu backend runs it, and only gloo's can; here a barrier
    of the group (the stand-ins have no ``monitoredBarrier``, whose C++ default named gloo as the backend that
    does not support it). On a group whose cpu backend is not gloo, or that has none, torch's error."""
    backend = group_backend(pg)
    name = None if backend is None else cpu_backend(backend)
    if backend is not None and name is None:  # torch's own check (l.6682) refuses such a group first
        raise ValueError("monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO).")
    if name is not None and name != "gloo":
        raise RuntimeError(f"Backend {name} does not support monitoredBarrier, only GLOO supports monitored barrier.")
    recorder = active()
    if recorder is None:
        return pg.barrier()
    if MONITORED_BARRIER not in recorder.notes:
        recorder.notes.append(MONITORED_BARRIER)
    recorder.barrier_call = "monitored_barrier"  # on real gloo it is rank 0's sends and recvs, not gloo's barrier
    # torch resolved it before this call (l.6687: the backend's default where none was given): the wait's own
    recorder.barrier_timeout_s = timeout.total_seconds() if hasattr(timeout, "total_seconds") else None
    try:
        return pg.barrier()
    finally:
        recorder.barrier_call = ""
        recorder.barrier_timeout_s = None


def _object_gather(gather: Callable[..., Any]) -> Callable[..., Any]:
    """``all_gather_object``/``gather_object``: each rank's pickled object is padded to the largest the size
    gather found, so every rank gathers as many bytes. The stand-ins fill that size gather with the rank's own size,
    so each padded to its own and the simulator saw a size mismatch real torch never has (a tester: objects of
    34 and 134 bytes failed; real gloo, 3 runs of 3: passed). Its data gather is recorded ``padded``."""

    @functools.wraps(gather)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = active()
        if recorder is None:
            return gather(*args, **kwargs)
        recorder.padding = True
        try:
            return gather(*args, **kwargs)
        finally:
            recorder.padding = False

    return wrapper


def _device_types_as_torch_has_them() -> property:
    """``ProcessGroup._device_types`` as a GPU host's torch has them (``served_device_types``): every stand-in
    registers for cpu and cuda, so an nccl group showed cpu too, and what torch decides from it went the CPU way
    (``_get_pg_default_device``: DCP's ``set_model_state_dict(broadcast_from_rank0=True)`` broadcast CPU tensors
    over nccl; ``_get_object_coll_device``: ``all_gather_object``'s tensors on cpu; ``monitored_barrier`` accepted
    an nccl group)."""
    original = c10d.ProcessGroup._device_types

    def device_types(pg: Any) -> list[Any]:
        devices = original.__get__(pg)
        serves = group_serves(pg)
        return devices if serves is None else [device for device in devices if device.type in serves]

    return property(device_types)


@contextlib.contextmanager
def _installed(
    recorder: _Recorder, release: str, world_size: int, gpus_per_node: int, cuda: bool, gpu: str = DEFAULT_GPU
) -> Iterator[None]:
    """Stand-in backends, fake CUDA, peerless rendezvous and the active recorder, for one rank; undone on exit.

    The call wrappers are not installed here but once per ``capture()`` (``_intercepted``): they record into
    whichever recorder this makes active.
    """
    import torch.testing._internal.distributed.fake_pg  # registers "fake" first, so ours wins

    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    backend_cls = c10d.Backend
    saved_backend = {
        "_plugins": dict(backend_cls._plugins),
        "backend_type_map": dict(backend_cls.backend_type_map),
        "backend_capability": dict(backend_cls.backend_capability),
        "default_device_backend_map": dict(backend_cls.default_device_backend_map),
        "backend_list": list(backend_cls.backend_list),
    }
    saved_attrs = {k: v for k, v in vars(backend_cls).items() if k.isupper()}
    saved_handlers = dict(rendezvous._rendezvous_handlers)
    fake_cuda = _FakeCuda(recorder, gpus_per_node, gpu)
    patches = fake_cuda.patches() if cuda else []
    patches.append((c10d.ProcessGroup, "split_group", _split_without_nonmembers(c10d.ProcessGroup.split_group)))
    patches.append((c10d.ProcessGroup, "monitored_barrier", _monitored_barrier_as_gloo_runs_it))
    for name in ("all_gather_object", "gather_object"):
        padded = _object_gather(getattr(c10d, name))
        patches += [(c10d, name, padded), (torch.distributed, name, padded)]
    if cuda:
        patches.append((c10d.BackendConfig, "__init__", _cuda_tensors_routed(c10d.BackendConfig.__init__)))
        patches.append((c10d.ProcessGroup, "_device_types", _device_types_as_torch_has_them()))
    # torch's own env://, tcp:// and file:// rendezvous, with its checks (env:// without RANK, tcp:// without a
    # rank: torch's ValueError), each making a store that needs no peer instead of its TCPStore or FileStore.
    # Handlers of our own had taken a rank and world from wherever they found one, 0 and 1 at worst.
    patches += [(rendezvous, "_create_c10d_store", _peerless_store), (rendezvous, "FileStore", _peerless_store)]
    originals = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    types = {"nccl": c10d.ProcessGroup.BackendType.NCCL, "gloo": c10d.ProcessGroup.BackendType.GLOO}
    try:
        for name in KNOWN_BACKEND_NAMES:  # every name the emulated releases know, so every one is a stand-in
            c10d.Backend.register_backend(
                name,
                _creator(name, release, world_size, gpus_per_node),
                extended_api=True,
                devices=["cpu", "cuda"],
                _backend_type=types.get(name),
            )
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        set_active(recorder)
        with fake_cuda.tensors.modes() if cuda else contextlib.nullcontext():
            try:
                yield
            except Exception as err:
                if isinstance(err, CaptureError):  # said already (``process_end``: a thread that reached CUDA)
                    raise
                message = driver_call_message(err, recorder.rank) if cuda else None
                if message is None:
                    raise
                raise CaptureError(message) from None
    finally:
        set_active(None)
        for obj, attr, value in originals:
            setattr(obj, attr, value)
        rendezvous._rendezvous_handlers.clear()
        rendezvous._rendezvous_handlers.update(saved_handlers)
        for key, value in saved_backend.items():
            current = getattr(backend_cls, key)
            current.clear()
            current.update(value) if isinstance(current, dict) else current.extend(value)
        for key in [k for k in vars(backend_cls) if k.isupper() and k not in saved_attrs]:
            delattr(backend_cls, key)

"""CUDA without a GPU while capturing: CUDA tensors live on the CPU, are sized per device, and never call a driver.

Why this shape (torch 2.15.0, a CUDA build on a machine without a driver): a tensor that *reports* a CUDA
device cannot take part in autograd here — autograd's ``InputMetadata`` asks the CUDA runtime for the device's
current stream and the process aborts — so FakeTensorMode or a wrapper subclass with ``device="cuda"`` can run
startup code but not a training step. Instead, torch's own extension points are used in two layers:

* ``_CudaAsCpu`` (a ``TorchFunctionMode``, seen before any C++ argument parsing, so no CUDA guard runs):
  a factory call with ``device="cuda[:N]"`` (or an int), ``Tensor.to("cuda")``, ``.cuda()``, ``Module.to``/
  ``Module.cuda`` (they call those) run on the CPU inside a placement on device N; ``.cpu()``/``.to("cpu")``
  copy, as on a GPU; and Python code reading ``tensor.device``/``tensor.is_cuda`` sees ``cuda:N`` for a tensor
  placed there, so framework code takes its GPU branches, while C++ sees consistent CPU tensors and autograd,
  optimizers and collectives (the stand-in backend is registered for ``cpu`` too) just run. Values are real
  (``.item()`` works), so the models captured must fit in host memory: capture tiny configurations.
* ``_Placement`` (a ``TorchDispatchMode``, below autograd, so it sees forward, backward and optimizer ops):
  every storage created inside a placement, or by an op reading a placed storage, is placed on that device
  and counted; a ``weakref.finalize`` on the storage (torch preserves a storage's Python object while the
  storage lives) uncounts it when freed. ``TensorMemory`` keeps live and peak bytes per device, which the
  recorder turns into ``alloc``/``empty_cache`` ops between recorded calls, so the simulator charges them.

CUDA RNG: ``torch.cuda.default_generators`` becomes one generator per device (``cuda_generator``: torch's
16-byte Philox state over a CPU generator, which DTensor's RNG tracker reads and moves) and
``torch.cuda.is_initialized`` answers True while a rank runs, so torch's own ``torch.cuda.manual_seed``/
``manual_seed_all``/``get_rng_state``/``set_rng_state``/``seed``/``initial_seed`` run unmodified against them,
and ``_lazy_call`` runs each callback at once instead of queueing it for a later real ``_lazy_init`` (which used
to fail with "CUDA driver version is insufficient"). Megatron's ``model_parallel_cuda_manual_seed`` and its
``_CUDA_RNG_STATE_TRACKER`` use exactly those paths. Streams, events and the allocator's statistics are small
stand-ins (``memory_allocated`` answers from ``TensorMemory``).

Memory is what torch's caching allocator would reserve (``cuda_allocator``: 512-byte rounding, 2 MiB and 20 MiB
segments, best-fit reuse and splitting, ``empty_cache``); ``memory_allocated`` counts rounded blocks and
``memory_reserved``/``mem_get_info`` the segments, as torch's do.

A storage resized in place (FSDP2 frees an unsharded parameter with
``untyped_storage().resize_(0)`` and re-allocates it so) frees its block and takes one of the new size.

Wrapper subclasses (DTensor): ``_Placement`` declines their ops (``NotImplemented``, as FakeTensorMode does), so
the subclass's own dispatch runs with the mode still active and its local tensors are placed and counted.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_leaves

from simnccl.capture.backend_devices import check_functional_devices, check_group_devices
from simnccl.capture.cuda_allocator import Block, CachingAllocator
from simnccl.capture.cuda_generator import PhiloxStateGenerator
from simnccl.cluster import GpuKind
from simnccl.ops import MIB, Alloc, EmptyCache, Op
from simnccl.visible_text import error_text

TENSOR_TAG = "tensors"  # the ledger phase the captured tensor memory is charged under
_CPU = torch.device("cpu")
_DEVICE_PROPERTY = torch.Tensor.device
_IS_CUDA_PROPERTY = torch.Tensor.is_cuda
# Tensor methods that take a device to move to, and the ones that pin host memory (CUDA calls on a real GPU).
_MOVES = frozenset({"to", "cuda"})
_PINNING = frozenset({"pin_memory"})
# Factories that draw random numbers (their dispatcher overload without a generator hides the draw from the
# placement mode): given the device's generator here.
_RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "normal"})
_EMPTY_FACTORIES = frozenset(
    {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like, torch.ops.aten.new_empty}
)
_C10D = "torch.distributed.distributed_c10d"  # the module of torch.distributed's collectives and send/recv


class TensorMemory:
    """Emulated CUDA tensor memory of one rank: allocated and reserved bytes per device, and what is charged.

    Every storage placed on a device is a ``malloc`` of torch's caching allocator (``cuda_allocator``), freed
    when the storage dies. What the device (and NCCL) sees used is what the allocator reserves: segments, kept
    after their tensors die until ``torch.cuda.empty_cache()``. ``changes()`` turns what happened since it was
    last asked into ops — ``alloc`` when the reserved bytes rose above what is charged, ``empty_cache`` when the
    cache gave segments back — so the simulator charges the high-water mark between recorded calls exactly.
    """

    def __init__(self) -> None:
        self.allocator = CachingAllocator()
        self.live = self.allocator.allocated  # device -> allocated bytes (torch's memory_allocated)
        self.peak: dict[int, int] = {}  # device -> highest allocated bytes (max_memory_allocated)
        self.reserved_peak: dict[int, int] = {}  # device -> highest reserved bytes (max_memory_reserved)
        self._storages: dict[int, tuple[int, Block | None]] = {}  # storage _cdata -> (device index, its block)
        self._reserved = 0  # bytes (all devices) the ops so far leave charged
        self._window_peak = 0  # highest reserved total since the last changes() or empty_cache()
        self._pending: list[Op] = []  # ops an empty_cache() settled, not yet handed out

    @property
    def reserved(self) -> dict[int, int]:
        return self.allocator.reserved

    def device_of(self, storage: Any) -> int | None:
        entry = self._storages.get(storage._cdata)
        return None if entry is None else entry[0]

    def devices(self) -> list[int]:
        return sorted(index for index, peak in self.reserved_peak.items() if peak)

    def place(self, storage: Any, index: int) -> None:
        key = storage._cdata
        if key in self._storages:
            return
        block = self.allocator.malloc(index, int(storage.nbytes()))
        self._storages[key] = (index, block)
        weakref.finalize(storage, self._release, key)
        if block is not None:
            self._grown(index)

    def resize(self, storage: Any, nbytes: int) -> None:
        """``UntypedStorage.resize_`` of a placed storage (FSDP2 frees an unsharded parameter with ``resize_(0)``
        after use and re-allocates it before the next): as torch's ``resize_bytes``, the new block is taken
        before the old one is freed (the bytes are copied across)."""
        key = storage._cdata
        entry = self._storages.get(key)
        if entry is None:
            return
        index, old = entry
        new = self.allocator.malloc(index, nbytes)
        self._storages[key] = (index, new)
        if new is not None:
            self._grown(index)
        if old is not None:
            self.allocator.free(old)

    def _grown(self, index: int) -> None:
        """After a block was taken on device ``index``: the peaks and the window's high-water mark."""
        if self.live[index] > self.peak.get(index, 0):
            self.peak[index] = self.live[index]
        reserved = self.allocator.reserved[index]
        if reserved > self.reserved_peak.get(index, 0):
            self.reserved_peak[index] = reserved
        self._window_peak = max(self._window_peak, self.allocator.total_reserved)

    def _release(self, key: int) -> None:
        entry = self._storages.pop(key, None)
        if entry is not None and entry[1] is not None:
            self.allocator.free(entry[1])

    def reset_peaks(self, index: int) -> None:
        """``torch.cuda.reset_peak_memory_stats``: the peaks start again from what is held now."""
        self.peak[index] = self.live.get(index, 0)
        self.reserved_peak[index] = self.reserved.get(index, 0)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: the high-water mark so far is charged, then the freed segments given back."""
        self._pending = self._settle()
        self.allocator.empty_cache()
        now = self.allocator.total_reserved
        if now < self._reserved:
            self._pending.append(EmptyCache(mib=(self._reserved - now) / MIB, tag=TENSOR_TAG))
            self._reserved = now
        self._window_peak = now

    def changes(self) -> list[Op]:
        """The ``alloc``/``empty_cache`` ops (MiB, exact) that bring the charge to what is reserved now."""
        if not self._pending and self._window_peak <= self._reserved:
            # Nothing to charge (asked after every recorded call: most calls place no tensor).
            return []
        return self._settle()

    def _settle(self) -> list[Op]:
        """``changes()`` computed in full."""
        out, self._pending = self._pending, []
        if self._window_peak > self._reserved:
            out.append(Alloc(mib=(self._window_peak - self._reserved) / MIB, tag=TENSOR_TAG))
            self._reserved = self._window_peak
        self._window_peak = self.allocator.total_reserved
        return out


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Plain tensors in ``value`` (a wrapper subclass such as DTensor: its inner tensors)."""
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            if is_traceable_wrapper_subclass(leaf):
                names, _ = leaf.__tensor_flatten__()
                yield from _tensors([getattr(leaf, name) for name in names])
            else:
                yield leaf


def placed_device(memory: TensorMemory, tensor: Any) -> int | None:
    """The CUDA device ``memory`` placed ``tensor`` on (a wrapper subclass such as DTensor: its first inner
    tensor's; None: host memory, or not a tensor)."""
    if not isinstance(tensor, torch.Tensor):
        return None
    for plain in _tensors(tensor):
        storage = _storage(plain)
        return None if storage is None else memory.device_of(storage)
    return None


def invalid_ordinal(index: int, count: int) -> RuntimeError:
    """CUDA's error for a device index past the node's GPUs (the capture's own count)."""
    return RuntimeError(f"CUDA error: invalid device ordinal {index} (capturing with {count} GPUs)")


def _storage(tensor: torch.Tensor) -> Any:
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
        return None


_UNSET = object()
_RANDOM: dict[Any, bool] = {}  # OpOverload -> whether it takes a generator


def _draws_random(func: Any) -> bool:
    known = _RANDOM.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = _RANDOM[func] = schema is not None and any(a.name == "generator" for a in schema.arguments)
    return known


class _Placement(TorchDispatchMode):
    """Places every storage created inside a placement, or by an op reading a placed one, on its device."""

    def __init__(
        self, memory: TensorMemory, generators: tuple[PhiloxStateGenerator, ...], current: Callable[[], int]
    ) -> None:
        super().__init__()
        self.memory = memory
        self.generators = generators
        self.current = current
        self.target: Any = _UNSET  # _UNSET: follow the inputs; None: host memory; an int: that device

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # A wrapper subclass's op (DTensor's): its own dispatch runs first, with this mode still on the stack,
            # so the local ops it issues (and their factories, copies and random draws) are placed here.
            return NotImplemented
        kwargs = kwargs or {}
        if func.namespace == "_c10d_functional":
            check_functional_devices(func, args, kwargs, self.placed)
        index = self.target
        device = kwargs.get("device")
        if isinstance(device, torch.device) and device.type == "cuda":
            # A factory that reached the dispatcher with a CUDA device (code running with torch-function
            # handling disabled, e.g. under torch.compiler.disable): made on the CPU, placed on that device.
            index = self.current() if device.index is None else device.index
            kwargs = {**kwargs, "device": _CPU}
        elif index is _UNSET:
            index = None
            for tensor in _tensors((args, kwargs)):
                storage = _storage(tensor)
                index = None if storage is None else self.memory.device_of(storage)
                if index is not None:
                    break
        drawing = None
        if index is not None and kwargs.get("generator") is None and _draws_random(func):
            # A random op on device N draws from device N's generator (torch.cuda.manual_seed's), not the CPU's.
            drawing = self.generators[index]
            kwargs = {**kwargs, "generator": drawing}
        out = func(*args, **kwargs)
        if func.overloadpacket in _EMPTY_FACTORIES:
            # uninitialised memory (a receive buffer torch makes with ``empty``: broadcast_object_list's sizes):
            # zeros, or the capture differed from run to run (a 94 TB "object" on one run, 139 TB on the next)
            for tensor in _tensors(out):
                tensor.zero_()
        if drawing is not None:
            drawing.advance_past(_tensors(out))
        if index is not None:
            for tensor in _tensors(out):
                storage = _storage(tensor)
                if storage is not None:
                    self.memory.place(storage, index)
        return out

    def placed(self, tensor: Any) -> int | None:
        """The device ``tensor`` is placed on (``placed_device``)."""
        return placed_device(self.memory, tensor)

    @contextlib.contextmanager
    def placing(self, index: int | None) -> Iterator[None]:
        saved, self.target = self.target, index
        try:
            yield
        finally:
            self.target = saved


class _CudaAsCpu(TorchFunctionMode):
    """Runs CUDA-bound calls on the CPU inside a placement; shows placed tensors as ``cuda:N`` to Python."""

    def __init__(self, placement: _Placement, current: Callable[[], int], count: int) -> None:
        super().__init__()
        self.placement = placement
        self.memory = placement.memory
        self.current = current
        self.count = count

    def _index(self, device: Any) -> int | None:
        """The CUDA index ``device`` names (None: not CUDA); an invalid ordinal raises CUDA's error."""
        if device is None or isinstance(device, bool):
            return None
        if isinstance(device, int):
            index: int | None = device
        else:
            try:
                parsed = torch.device(device)
            except (RuntimeError, TypeError):
                return None
            if parsed.type != "cuda":
                return None
            index = parsed.index
        index = self.current() if index is None else index
        if not 0 <= index < self.count:
            raise invalid_ordinal(index, self.count)
        return index

    def _placed(self, tensor: Any) -> int | None:
        """The device ``tensor`` is placed on (``_Placement.placed``)."""
        return self.placement.placed(tensor)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == _C10D:
            check_group_devices(func, args, kwargs, self._placed)
        owner = getattr(func, "__self__", None)
        if owner is _DEVICE_PROPERTY or owner is _IS_CUDA_PROPERTY:
            index = self._placed(args[0])
            if index is not None:
                return torch.device("cuda", index) if owner is _DEVICE_PROPERTY else True
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _MOVES and args and isinstance(args[0], torch.Tensor):
            return self._move(func, name, args, kwargs)
        if name == "type" and len(args) == 1 and not kwargs and self._placed(args[0]) is not None:
            return func(*args).replace("torch.", "torch.cuda.", 1)  # "torch.cuda.FloatTensor", as on a GPU
        if name in _PINNING and args and isinstance(args[0], torch.Tensor):
            return args[0]  # pinned host memory needs the driver; unpinned host memory is the same bytes
        if name == "is_pinned" and args and isinstance(args[0], torch.Tensor):
            return False
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        if name == "cpu" and args and isinstance(args[0], torch.Tensor) and self._placed(args[0]) is not None:
            with self.placement.placing(None):
                return func(*args, **kwargs).clone()
        if "device" in kwargs:
            index = self._index(kwargs["device"])
            if index is not None:
                moved = {**kwargs, "device": _CPU}
                drawing = None
                if name in _RANDOM_FACTORIES and moved.get("generator") is None:
                    drawing = moved["generator"] = self.placement.generators[index]  # the device's, as on a GPU
                with self.placement.placing(index):
                    made = func(*args, **moved)
                if drawing is not None:
                    drawing.advance_past(_tensors(made))
                return made
        return func(*args, **kwargs)

    def _move(self, func: Any, name: str, args: Any, kwargs: Any) -> Any:
        tensor = args[0]
        if name == "cuda":
            device = args[1] if len(args) > 1 else kwargs.get("device")
            index = self._index("cuda" if device is None else device)
            dtype, rest = None, {}
        else:
            device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
            other = args[1] if len(args) > 1 else kwargs.get("other")
            # .to(other): other's device as Python sees it (C++ sees the CPU for every tensor here)
            index = self._placed(other) if isinstance(other, torch.Tensor) else self._index(device)
            rest = {"memory_format": memory_format} if memory_format is not None else {}
        placed = self._placed(tensor)
        if index is None:
            if placed is not None and device is not None and torch.device(device).type == "cpu":
                # (``.to(other)`` with an unplaced other lands here too: its device is the host)
                with self.placement.placing(None):  # device -> host: a copy, as on a GPU
                    return tensor.to(dtype=dtype or tensor.dtype, copy=True, **rest)
            return func(*args, **kwargs)
        if placed == index and (dtype is None or dtype == tensor.dtype) and not kwargs.get("copy", False):
            return tensor
        with self.placement.placing(index):
            return tensor.to(dtype=dtype or tensor.dtype, copy=True, **rest)


class _Stream:
    """``torch.cuda.Stream`` without a driver: work is already done when it is queued."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device("cuda", 0 if device is None else torch.device(device).index or 0)
        self.priority = priority
        self.cuda_stream = 0

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Event:
    """``torch.cuda.Event`` without a driver."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, other: Any) -> float:
        return 0.0


@dataclass(frozen=True)
class _DeviceProperties:
    """``torch.cuda.get_device_properties``: what simnccl's GPU kind knows (``simnccl/data/gpu_kinds.toml``)."""

    name: str
    total_memory: int

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(
            f"torch.cuda.get_device_properties().{attr}: not known while capturing without a GPU (simnccl's GPU "
            f"kinds give name and total_memory only)"
        )


@dataclass
class FakeCuda:
    """Everything a rank's CUDA use is replaced by while it is captured: the modes and the patched API.

    ``gpu``: the GPU kind the captured code is told it runs on (``get_device_properties``, ``mem_get_info``);
    code that sizes buffers from the free memory it sees takes that GPU's branches.
    """

    memory: TensorMemory
    count: int
    current: Callable[[], int]
    gpu: GpuKind

    def __post_init__(self) -> None:
        # torch.cuda.default_generators: one per device, so torch's own torch.cuda.random functions run on them
        self.generators = tuple(PhiloxStateGenerator() for _ in range(self.count))

    def patches(self) -> list[tuple[Any, str, Any]]:
        """(object, attribute, stand-in) for torch.cuda's RNG, stream, event and memory-statistics API."""
        generators = self.generators
        default_stream = _Stream()
        memory = self.memory

        def index_of(device: Any) -> int:
            return self.current() if device is None else _ordinal(device)

        def allocated(device: Any = None) -> int:
            return memory.live.get(index_of(device), 0)

        def reserved(device: Any = None) -> int:
            return memory.reserved.get(index_of(device), 0)

        def peak(device: Any = None) -> int:
            return memory.peak.get(index_of(device), 0)

        def reserved_peak(device: Any = None) -> int:
            return memory.reserved_peak.get(index_of(device), 0)

        def reset_peak(device: Any = None) -> None:
            memory.reset_peaks(index_of(device))

        resize_storage = torch.UntypedStorage.resize_

        def resize(storage: Any, size: int) -> Any:
            result = resize_storage(storage, size)
            memory.resize(storage, int(size))
            return result

        gpu = self.gpu
        properties = _DeviceProperties(gpu.display, gpu.total_bytes)

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            return gpu.total_bytes - reserved(device), gpu.total_bytes

        cuda = torch.cuda
        return [
            (cuda, "get_device_properties", lambda device=None: properties),
            (cuda, "get_device_name", lambda device=None: gpu.display),
            (cuda, "mem_get_info", mem_get_info),
            (cuda, "is_initialized", lambda: True),  # _lazy_init returns at once; _lazy_call runs callbacks now
            (cuda, "default_generators", generators),
            (cuda, "Stream", _Stream),
            (cuda, "Event", _Event),
            (cuda, "current_stream", lambda device=None: default_stream),
            (cuda, "default_stream", lambda device=None: default_stream),
            (cuda, "set_stream", lambda stream: None),
            (cuda, "stream", lambda stream=None: contextlib.nullcontext(stream)),
            (cuda, "memory_allocated", allocated),
            (cuda, "memory_reserved", reserved),
            (cuda, "max_memory_allocated", peak),
            (cuda, "max_memory_reserved", reserved_peak),
            (cuda, "reset_peak_memory_stats", reset_peak),
            (cuda, "reset_max_memory_allocated", reset_peak),
            (cuda, "empty_cache", memory.empty_cache),
            (cuda, "is_current_stream_capturing", lambda: False),
            # parsed before torch-function handling (it wants a real stream); the stand-in streams are done
            (torch.Tensor, "record_stream", lambda tensor, stream: None),
            (torch.UntypedStorage, "resize_", resize),  # FSDP2's free_storage/alloc_storage
            (torch.accelerator, "current_stream", lambda device=None: default_stream),
            (torch.accelerator, "set_stream", lambda stream: None),
            (torch.accelerator, "synchronize", lambda device=None: None),
        ]

    @contextlib.contextmanager
    def modes(self) -> Iterator[None]:
        """The placement (dispatch) and CUDA-as-CPU (function) modes, for the rank's lifetime."""
        placement = _Placement(self.memory, self.generators, self.current)
        with placement, _CudaAsCpu(placement, self.current, self.count):
            yield


# What torch says when a call reaches the CUDA runtime or driver on a machine without a GPU.
_DRIVER_ERRORS = ("CUDA driver version is insufficient", "Found no NVIDIA driver", "cudaErrorNoDevice")
COVERED = (
    "CUDA tensors and factories, .to/.cuda/.cpu, Module.to/cuda/to_empty, torch.cuda RNG functions, Stream, Event, "
    "current_stream, memory statistics, get_device_properties (name, total_memory), mem_get_info"
)


def reached_the_driver(err: BaseException) -> bool:
    """Whether ``err`` means the code reached a CUDA call the fake devices do not cover (the real driver's
    answer on a machine without one)."""
    text = error_text(err)
    return any(marker in text for marker in _DRIVER_ERRORS)


def driver_call_message(err: BaseException, rank: int) -> str | None:
    """A clear refusal for an error that means the code reached a CUDA call the fake devices do not cover."""
    if not reached_the_driver(err):
        return None
    text = error_text(err)
    import traceback

    frames = traceback.format_exception(type(err), err, err.__traceback__)
    where = "".join(frames[-4:-1]).rstrip()
    return (
        f"rank {rank}: the captured code called CUDA where simnccl's GPU-less CUDA does not stand in "
        f"({type(err).__name__}: {text.splitlines()[0]}); covered while capturing: {COVERED}. "
        f"Code that needs a real GPU here (CUDA graphs, CUDA generators, custom kernels) cannot be captured.\n{where}"
    )


def _ordinal(device: Any) -> int:
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0

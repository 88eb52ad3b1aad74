"""Which device types a process group has a backend for on a GPU host, as real torch 2.15 builds it.

Why a module of its own: the capture registers every stand-in backend for cpu and cuda both (its CUDA tensors are
CPU tensors underneath, and torch picks a group's backend by a tensor's C++ device), so torch's own answer to
"does this group serve that device" is the stand-ins', not a GPU host's. A CPU tensor's all_reduce on an ``nccl``
group captured and simulated as a pass, where a GPU host raises "No backend type associated with device type
cpu". The capture's function and dispatch modes (``fake_devices``) and its corrected ``ProcessGroup._device_types``
and ``monitored_barrier`` (``environment``) ask this instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# torch 2.15's ``Backend.backend_capability`` as torch ships it (distributed_c10d.py l.601-608).
TORCH_DEVICES = {"gloo": ("cpu", "cuda"), "nccl": ("cuda",), "fake": ("cpu", "cuda"), "ucc": ("cpu", "cuda")}


def served_device_types(backend: str) -> frozenset[str] | None:
    """The device types a group made with ``backend`` (as torch's world records it, ``_world.pg_map``) has a
    backend for on a GPU host, as ``BackendConfig`` builds them: ``"undefined"`` the accelerator's only,
    ``"cpu:gloo,cuda:nccl"`` each named one, a bare name its capability (``nccl``, and simnccl's names of its
    implementations: cuda only). None: a name not known here (not checked)."""
    text = backend.lower()
    if text == "undefined":
        return frozenset({"cuda"})
    if ":" in text:
        return frozenset(part.split(":", 1)[0].strip() for part in text.split(","))
    devices = TORCH_DEVICES.get("nccl" if text.startswith("nccl") else text)
    return None if devices is None else frozenset(devices)


def group_backend(pg: Any) -> str | None:
    """The backend a process group torch's world knows was made with (``_world.pg_map``), or None."""
    import torch.distributed.distributed_c10d as c10d

    registered = c10d._world.pg_map.get(pg)
    return None if registered is None else str(registered[0])


def group_serves(pg: Any) -> frozenset[str] | None:
    """``served_device_types`` of a process group torch's world knows (None: one it does not, or a backend name
    not known here)."""
    backend = group_backend(pg)
    return None if backend is None else served_device_types(backend)


def missing_backend(kind: str) -> RuntimeError:
    """torch's error for a tensor on a device type its group has no backend for (ProcessGroup::getBackend)."""
    return RuntimeError(f"No backend type associated with device type {kind}")


def cpu_backend(backend: str) -> str | None:
    """The backend name a group made with ``backend`` uses for cpu tensors on a GPU host, or None (none)."""
    text = backend.lower()
    if ":" in text:
        pairs = dict(part.strip().split(":", 1) for part in text.split(",") if ":" in part)
        return pairs.get("cpu")
    served = served_device_types(text)
    return text if served is not None and "cpu" in served else None


_UNSEEN = object()
_SIGNATURES: dict[Any, inspect.Signature | None] = {}  # a c10d function -> its signature (None: it takes no group)


def _group_signature(func: Any) -> inspect.Signature | None:
    signature = _SIGNATURES.get(func, _UNSEEN)
    if signature is _UNSEEN:
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):
            signature = None
        if signature is not None and "group" not in signature.parameters:
            signature = None
        _SIGNATURES[func] = signature
    return signature  # type: ignore[return-value]


def check_group_devices(func: Any, args: Any, kwargs: Any, placed: Callable[[Any], int | None]) -> None:
    """A collective or send/recv of ``torch.distributed`` (``func``, called with ``args``/``kwargs``) on a tensor
    whose device its group has no backend for on a GPU host raises torch's error: a CPU tensor's all_reduce on an
    ``nccl`` group, a CUDA one on ``cpu:gloo``. ``placed``: the CUDA device a tensor stands for, or None (host).

    Why at the Python call: Python shows each tensor's device, torch's C++ sees every one as cpu, and every
    stand-in serves both; torch's own calls that bypass Python (DDP's) are consistent by construction. A call of
    a rank outside its group is left to torch (it returns before it dispatches)."""
    signature = _group_signature(func)
    if signature is None:
        return
    try:
        arguments = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return  # torch raises its own error for these arguments
    import torch.distributed.distributed_c10d as c10d

    group = arguments.get("group")
    if group is None:
        if not c10d.is_initialized():
            return
        group = c10d._get_default_group()
    if not isinstance(group, c10d.ProcessGroup) or c10d._rank_not_in_group(group):
        return
    _refuse_unserved(group, list(arguments.values()), placed)


def check_functional_devices(func: Any, args: Any, kwargs: Any, placed: Callable[[Any], int | None]) -> None:
    """``check_group_devices`` for a functional collective (``torch.ops._c10d_functional``: funcol, DTensor's
    redistributions), which names its group by ``group_name`` and reaches the backend without the Python
    ``torch.distributed`` call: a CPU tensor's ``funcol.all_reduce`` on an nccl group captured as a pass."""
    names = [argument.name for argument in func._schema.arguments]
    if "group_name" not in names:
        return
    at = names.index("group_name")
    name = args[at] if at < len(args) else kwargs.get("group_name")
    import torch.distributed.distributed_c10d as c10d

    try:
        group = c10d._resolve_process_group(name)
    except (KeyError, RuntimeError, ValueError):
        return  # torch raises its own error for a group it does not know
    _refuse_unserved(group, [args[:at], [v for k, v in kwargs.items() if k != "group_name"]], placed)


def _refuse_unserved(group: Any, values: Any, placed: Callable[[Any], int | None]) -> None:
    """torch's error for the first tensor in ``values`` whose device ``group`` has no backend for."""
    import torch
    from torch.utils._pytree import tree_leaves

    serves = group_serves(group)
    if serves is None:
        return
    for tensor in tree_leaves(values):
        if isinstance(tensor, torch.Tensor):
            kind = "cpu" if placed(tensor) is None else "cuda"
            if kind not in serves:
                raise missing_backend(kind)

"""Converting torch's call arguments (timeouts, devices, options, tensors) into plain simnccl values.

Why: the recorded Program must hold plain, comparable values, never torch objects that pin the process's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import distributed_c10d as c10d

from simnccl.dtypes import by_torch_attribute
from simnccl.ops import (
    NO_OPTIONS,
    PgOptions,
)
from simnccl.torch_apply import modelled_options

# torch dtype -> the name simnccl ops carry (the c10 ScalarType name torch's flight recorder prints)
_DTYPE_NAMES = {getattr(torch, attribute): name for attribute, name in by_torch_attribute().items()}


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _device(device: Any) -> int | str | None:
    """``device_id`` as simnccl spells it: a CUDA index, or a ``"cpu:N"`` string."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type == "cuda":
        return 0 if device.index is None else device.index
    return str(device)


def _options(pg_options: Any) -> PgOptions:
    """Every field a ``ProcessGroupNCCL.Options`` sets (its NCCLConfig too); other options objects carry none.

    The fields are read as ``simnccl.torch_apply`` reads them (one reading for both directions of the torch
    boundary); ``is_high_priority_stream`` marks an object with NCCL fields (gloo's Options has none of them).
    """
    if pg_options is None or not hasattr(pg_options, "is_high_priority_stream"):
        return NO_OPTIONS
    return modelled_options(pg_options)


_BACKEND_NAMES: dict[str, str] = {}  # torch's spelling of each backend string seen (asked once per string)


def _backend_name(backend: Any) -> str | None:
    if backend is None:
        return None
    text = str(backend)
    if text not in _BACKEND_NAMES:
        _BACKEND_NAMES[text] = str(c10d.Backend(text))  # raises ValueError for a bad name, every time
    return _BACKEND_NAMES[text]


_SCALARS = frozenset({type(None), bool, int, float, str})
_INT_ONLY = frozenset({int})


def _plain(value: Any) -> Any:
    """An argument as JSON-able data (for ``Call.args``).

    The exact-type checks first are the recording fast path (a rank list of plain ints is most arguments);
    everything else, subclasses included, takes the general branches below.
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if (kind is list or kind is tuple) and set(map(type, value)) <= _INT_ONLY:
        return list(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": _dtype(value)}
    if hasattr(value, "is_high_priority_stream"):
        return _options(value).to_dict()
    return repr(value)


def _dtype(tensor: torch.Tensor) -> str:
    return _DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)

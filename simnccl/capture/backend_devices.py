"""Which device types a process group has a backend for on a GPU host, as real torch 2.15 builds it.

Why a module of its own: the capture registers every stand-in backend for cpu and cuda both (its CUDA tensors are
CPU tensors underneath, and torch picks a group's backend by a tensor's C++ device), so torch's own answer to
"does this group serve that device" is the stand-ins', not a GPU host's. A CPU tensor's all_reduce on an ``nccl``
group captured and simulated as a pass, where a GPU host raises "No backend type associated with device type
cpu". The function mode (``fake_devices``) and the object-collective device (``environment``) ask this instead.
"""

from __future__ import annotations

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

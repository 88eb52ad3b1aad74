"""torch release rules: which implementation a backend name selects, defaults, features and known defects.

One module owns every fact that differs between torch releases, so the c10d model and the backends ask
questions ("does this release create nccl2 communicators eagerly?") instead of comparing version strings.
Facts are from the 2.15.0 / 2.14.0 wheels (see ../shared/reference/torch-2.15-process-groups.md §A) and are
probed against the installed torch by ``tests/test_torch_probes.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Impl(StrEnum):
    """A backend *implementation* (a C++ class), as opposed to the name the user asked for."""

    NCCL2 = "nccl2"  # c10d::nccl2::ProcessGroupNCCL (ProcessGroupNCCL2)
    LEGACY = "legacy"  # c10d::ProcessGroupNCCL
    NCCL_LAZY = "nccl-lazy"  # c10d::LazyBackend<nccl2::ProcessGroupNCCL>
    GLOO = "gloo"
    FAKE = "fake"

    # Plain attributes of each member, set below (not members: annotated only). They are asked per collective, and
    # a property on an enum member cost ~0.4 us a question.
    is_nccl: bool  # one of the NCCL implementations
    cpp_name: str  # what ``pg._get_backend(dev).name()`` returns (the C++ ``getBackendName()``)


_CPP_NAMES = {"nccl2": "nccl2", "legacy": "nccl", "nccl-lazy": "nccl-lazy", "gloo": "gloo", "fake": "fake"}
for _impl in Impl:
    _impl.is_nccl = _impl in (Impl.NCCL2, Impl.LEGACY, Impl.NCCL_LAZY)
    _impl.cpp_name = _CPP_NAMES[_impl.value]
del _impl

NCCL_FAMILY_NAMES = ("nccl", "nccl2", "nccl-legacy", "nccl-lazy")
KNOWN_BACKEND_NAMES = (*NCCL_FAMILY_NAMES, "gloo", "fake")

# torch's Backend.backend_capability for the names we model [W distributed_c10d.py].
DEVICE_CAPABILITY: dict[str, tuple[str, ...]] = {
    "nccl": ("cuda",),
    "nccl2": ("cuda",),
    "nccl-legacy": ("cuda",),
    "nccl-lazy": ("cuda",),
    "gloo": ("cpu", "cuda"),
    "fake": ("cpu", "cuda", "hpu", "xpu"),
}
DEFAULT_DEVICE_BACKEND = {"cpu": "gloo", "cuda": "nccl"}

DEFAULT_PG_TIMEOUT_S = 30 * 60.0  # torch.distributed.constants.default_pg_timeout
DEFAULT_PG_NCCL_TIMEOUT_S = 10 * 60.0  # default_pg_nccl_timeout

# Error texts users get, verbatim from torch (probed in tests/test_torch_probes.py where a CPU can).
NCCL2_NO_CUDA = "nccl2 requires at least one CUDA device"
LEGACY_NO_CUDA = "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"
MISMATCHED_BOUND_DEVICE = "Mismatched bound device between new pg and the default pg."
NO_SPLIT_PARENT = "No backend for the parent process group or its backend does not support splitting"
SPLIT_PARENT_NOT_INITIALIZED = (
    "Parent process group backend is not initialized; pass device_id when creating it or run a collective before "
    "split_group"
)
CUDAMALLOCASYNC_TRACKER = (
    "cudaMallocAsync does not yet support attachAllocatorTraceTracker. If you need it, please file an issue "
    "describing your use case."
)


class ReleaseError(ValueError):
    """An unknown release or backend name (bad input, not a simulated torch error)."""


@dataclass(frozen=True, slots=True)
class Release:
    """Everything that differs between the torch builds simnccl models.

    ``nccl2_device_fallback``: 2.15's ``_nccl2_device`` picks a device when none is given and writes it back
    to ``bound_device_id`` (so every nccl2 group is bound); 2.14's nccl2 bound only with ``device_id``.
    ``nccl_env_rule`` is the pair (value, implementation): ``"nccl"`` resolves to that implementation only
    when ``TORCH_DIST_USE_NCCL2`` equals the value *exactly*; otherwise to the other NCCL implementation.
    """

    key: str
    version: str
    nccl_env_value: str
    nccl_env_selects: Impl
    nccl2_eager: bool
    nccl2_device_fallback: bool
    lazy_init_option: bool
    split_source_matches_name: bool
    nccl_timeout_names: tuple[str, ...]
    cudamallocasync_aborts: bool
    single_rank_lazy: bool
    notes: str

    @property
    def nccl_default_impl(self) -> Impl:
        """What ``"nccl"`` selects when TORCH_DIST_USE_NCCL2 is unset."""
        return Impl.LEGACY if self.nccl_env_selects is Impl.NCCL2 else Impl.NCCL2

    def nccl_impl(self, env: Mapping[str, str]) -> Impl:
        """The implementation ``"nccl"`` selects, reading TORCH_DIST_USE_NCCL2 with this release's rule.

        torch reads the variable once, at the first use of ``"nccl"`` in the process; the simulator passes
        the process environment as it was at that moment.
        """
        if env.get("TORCH_DIST_USE_NCCL2") == self.nccl_env_value:
            return self.nccl_env_selects
        return self.nccl_default_impl

    def impl_for_name(self, name: str, env: Mapping[str, str]) -> Impl:
        if name == "nccl":
            return self.nccl_impl(env)
        try:
            return {
                "nccl2": Impl.NCCL2,
                "nccl-legacy": Impl.LEGACY,
                "nccl-lazy": Impl.NCCL_LAZY,
                "gloo": Impl.GLOO,
                "fake": Impl.FAKE,
            }[name]
        except KeyError:
            raise ReleaseError(
                f"unknown backend name {name!r}; expected one of {', '.join(KNOWN_BACKEND_NAMES)}"
            ) from None

    def default_timeout_s(self, backend_name: str) -> float:
        """torch's ``_get_default_timeout``: NCCL names get 10 minutes, everything else 30."""
        return DEFAULT_PG_NCCL_TIMEOUT_S if backend_name in self.nccl_timeout_names else DEFAULT_PG_TIMEOUT_S


_R215 = dict(
    nccl_env_value="0",
    nccl_env_selects=Impl.LEGACY,
    nccl2_eager=True,
    nccl2_device_fallback=True,
    lazy_init_option=True,
    split_source_matches_name=True,
    nccl_timeout_names=NCCL_FAMILY_NAMES,
    cudamallocasync_aborts=True,
    single_rank_lazy=False,
)

RELEASES: dict[str, Release] = {
    r.key: r
    for r in (
        Release(
            key="2.14",
            version="2.14.0",
            nccl_env_value="1",
            nccl_env_selects=Impl.NCCL2,
            nccl2_eager=False,
            nccl2_device_fallback=False,
            lazy_init_option=False,
            split_source_matches_name=False,
            nccl_timeout_names=("nccl",),
            cudamallocasync_aborts=False,
            single_rank_lazy=False,
            notes="legacy is the default; nccl2 opt-in with TORCH_DIST_USE_NCCL2=1 and lazy at first collective",
        ),
        Release(
            key="2.15",
            version="2.15.0",
            notes="nccl2 is the default and eager (PR #192281, #192895); rollback with TORCH_DIST_USE_NCCL2=0",
            **_R215,
        ),
        Release(
            key="2.15-dev",
            version="2.15.0.dev20261002",
            notes="the nightly pytorch#199957 was filed against; same rules as 2.15.0",
            **_R215,
        ),
        Release(
            key="2.15a0",
            version="2.15.0a0",
            notes="internal 2.15 build of the vLLM startup-check report; same rules as 2.15.0",
            **_R215,
        ),
        Release(
            key="2.16-dev",
            version="2.16.0.dev20261006",
            notes=(
                "the GB200 follow-up of #199957: same group-creation rules as 2.15 (nothing on 2.16 is known "
                "from a wheel); the cudaMallocAsync defect is not assumed fixed or present: modelled as present"
            ),
            **_R215,
        ),
    )
}


def get_release(key: str) -> Release:
    try:
        return RELEASES[key]
    except KeyError:
        raise ReleaseError(f"unknown torch release {key!r}; expected one of {', '.join(RELEASES)}") from None


@dataclass(frozen=True, slots=True)
class DeviceBackend:
    """One (device type, backend) pair of a group: the registered name and the implementation behind it."""

    device_type: str
    name: str
    impl: Impl


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """torch's ``BackendConfig``: the name ``get_backend`` returns and one backend per device type."""

    requested: str
    pairs: tuple[DeviceBackend, ...]

    def for_device(self, device_type: str) -> DeviceBackend | None:
        for pair in self.pairs:
            if pair.device_type == device_type:
                return pair
        return None

    @property
    def accelerator(self) -> DeviceBackend | None:
        """The backend that owns GPU memory, if any (the cuda pair)."""
        return self.for_device("cuda")


def resolve_backend(
    release: Release, requested: str | None, env: Mapping[str, str], *, has_cuda: bool = True
) -> BackendConfig:
    """Parse a backend string the way torch's ``BackendConfig`` does; see ``_resolve``.

    Only TORCH_DIST_USE_NCCL2 of ``env`` matters, so answers are cached on it: a startup resolves the same
    few strings thousands of times.
    """
    return _resolve(release, requested, env.get("TORCH_DIST_USE_NCCL2"), has_cuda)


@functools.lru_cache(maxsize=256)
def _resolve(release: Release, requested: str | None, use_nccl2: str | None, has_cuda: bool) -> BackendConfig:
    """Single names and ``dev:name`` lists.

    ``None`` is torch's "undefined": only the *available* accelerator's default backend, i.e. ``cuda:nccl`` on
    the CUDA host simnccl models (torch 2.15 ``BackendConfig.__init__``, distributed_c10d.py l.1056-1069; a
    CUDA-less host gets ``cpu:gloo``). There is no cpu pair: pass ``"cpu:gloo,cuda:nccl"`` for both.
    """
    env = {} if use_nccl2 is None else {"TORCH_DIST_USE_NCCL2": use_nccl2}
    text = "undefined" if requested is None else requested
    lowered = text.lower()
    if lowered == "undefined":
        device = "cuda" if has_cuda else "cpu"
        pairs = [(device, DEFAULT_DEVICE_BACKEND[device])]  # probed: tests/test_torch_probes.py
    elif ":" not in lowered:
        if lowered not in DEVICE_CAPABILITY:
            raise ReleaseError(
                f"unknown backend name {text!r}; expected one of {', '.join(KNOWN_BACKEND_NAMES)} "
                "or a 'device:backend,...' list"
            )
        pairs = [(device, lowered) for device in DEVICE_CAPABILITY[lowered] if device in ("cpu", "cuda")]
    else:
        pairs = []
        for item in lowered.split(","):
            parts = item.split(":")
            if len(parts) != 2 or not parts[0] or not parts[1]:
                raise ReleaseError(f"invalid device:backend pairing {item!r} in backend string {text!r}")
            device, name = parts
            if any(device == seen for seen, _ in pairs):
                raise ReleaseError(f"duplicate device type {device!r} in backend string {text!r}")
            if device not in ("cpu", "cuda"):
                raise ReleaseError(f"device type {device!r} in {text!r} is not modelled; expected cpu or cuda")
            pairs.append((device, name))
    return BackendConfig(
        requested=lowered,
        pairs=tuple(DeviceBackend(device, name, release.impl_for_name(name, env)) for device, name in pairs),
    )

"""Calibration profiles: what must be *measured* about one GPU kind's NCCL memory and timings, with provenance.

Why profiles hold so little memory: a communicator's bytes are predicted from NCCL's own mechanics
(``simnccl.nccl``: channels x connections x protocol buffers, NVLS, network shared buffers, when each is
connected, split sharing) for the hardware the profile maps to (``topology``: the GPU kind's NVLink/NVSwitch,
multicast, NICs from ``gpu_kinds.toml``, with the profile's ``[topology]`` changes) and its ``nccl_version``.
A profile keeps only the fixed overheads the mechanics cannot name (``FixedOverheads``: per communicator, per
process), the timings, and for each figure the data it was fitted to (``[derivation]``; DESIGN rules 4, 12).
The CUDA context is the GPU kind's (``gpu_kinds.toml``). The real tier writes the same format when it
calibrates on a GPU (``simnccl real calibrate`` fits only these overheads).

Which *lifecycle* pays (eager nccl2 at ``new_group``, legacy at the first collective) is torch's, and lives in
``simnccl.release`` and the backends. Files are untrusted input: parsed with ``tomllib``, validated field by
field, and every error names the file, the key and what was expected (rule 9).
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from simnccl.cluster import ClusterError, GpuKind, get_gpu_kind, gpu_kinds
from simnccl.limits import current as current_limits
from simnccl.limits import number_text
from simnccl.nccl.constants import NcclInputError
from simnccl.nccl.hardware import Topology, parse_topology, topology_for
from simnccl.nccl.knobs import settings_from
from simnccl.nccl.version import NcclVersion
from simnccl.release import RELEASES
from simnccl.table_keys import check_keys

_TOP_KEYS = (
    "name",
    "gpu",
    "torch_build",
    "releases",
    "nccl_version",
    "source",
    "measured",
    "comm",
    "timing",
    "derivation",
    "topology",
)
_REQUIRED_TOP_KEYS = tuple(key for key in _TOP_KEYS if key != "topology")
# Facts of a GPU kind's topology a profile may change (all but its name and source).
TOPOLOGY_FIELDS = tuple(f.name for f in fields(Topology) if f.name not in ("name", "source"))
_OPTIONAL_TOPOLOGY = ("pcie_bw", "cumem_granularity_bytes")  # 0 in a Topology means "not given"


class ProfileError(ValueError):
    """A bad profile file, name or lookup, or an environment knob it rejects (bad input, not a simulated
    failure); ``knob`` names the environment variable when one is at fault."""

    def __init__(self, message: str, knob: str = "") -> None:
        super().__init__(message)
        self.knob = knob


@dataclass(frozen=True, slots=True)
class FixedOverheads:
    """What a profile must *measure* about NCCL's device memory, in MiB per GPU; everything else is predicted
    from NCCL's mechanics (``simnccl.nccl``: channels x connections x protocol buffers, NVLS, network shared
    buffers, when each is connected, split sharing).

    ``comm_fixed_mib``: per communicator, paid at its init, beyond the mechanics (allocations the model does not
    itemise). ``process_mib``: once per process and device, with the process's first NCCL communicator (NCCL's
    kernels and proxy state: sglang#35538's world group cost 82 MiB more than a later one).
    ``process_first_collective_mib``: once per process and device, at its first NCCL collective or send/recv
    (what a published absolute figure taken after collectives holds beyond the model and the context: torch's
    tensors and allocator blocks, lazily loaded kernels, the context estimate's error). Each profile's
    ``[derivation]`` says which data each was fitted to.
    """

    comm_fixed_mib: float
    process_mib: float
    process_first_collective_mib: float


@dataclass(frozen=True, slots=True)
class Timing:
    """Simulated seconds per step. ``bus_bandwidth_gbps`` is NCCL-tests bus bandwidth in GB/s.

    The ``gloo_*`` figures time a gloo communicator's bootstrap, collectives and send/recvs: gloo connects and
    moves CPU tensors over TCP at the host's pace, not the GPU's. A profile may set them (measured on its host);
    where it does not, they are ``simnccl/data/gloo_transport.toml``'s (``gloo_defaults``)."""

    comm_init_s: float
    split_s: float
    nocolor_split_s: float
    collective_latency_s: float
    bus_bandwidth_gbps: float
    p2p_latency_s: float
    cuda_context_s: float
    gloo_collective_latency_s: float
    gloo_bus_bandwidth_gbps: float
    gloo_p2p_latency_s: float
    gloo_p2p_bandwidth_gbps: float
    gloo_bootstrap_per_peer_s: float


_COMM_KEYS = tuple(f.name for f in fields(FixedOverheads))
_TIMING_KEYS = tuple(f.name for f in fields(Timing))
_GLOO_TIMING_KEYS = tuple(name for name in _TIMING_KEYS if name.startswith("gloo_"))
_REQUIRED_TIMING_KEYS = tuple(name for name in _TIMING_KEYS if name not in _GLOO_TIMING_KEYS)
_BANDWIDTH_KEYS = ("bus_bandwidth_gbps", "gloo_bus_bandwidth_gbps", "gloo_p2p_bandwidth_gbps")
GLOO_DATA_FILE = "gloo_transport.toml"


@functools.cache
def _gloo_data() -> tuple[_Reader, dict[str, Any]]:
    """``simnccl/data/gloo_transport.toml``, read once: a reader naming the file in errors, and its tables."""
    resource = importlib.resources.files("simnccl") / "data" / GLOO_DATA_FILE
    return _Reader(str(resource)), tomllib.loads(resource.read_text(encoding="utf-8"))


@functools.cache
def gloo_defaults() -> dict[str, float]:
    """The shipped gloo figures (``[gloo]`` of the data file, checked as a profile's are), keyed as a profile's
    ``[timing]`` names them."""
    r, data = _gloo_data()
    names = {key.removeprefix("gloo_"): key for key in _GLOO_TIMING_KEYS}
    table = r.table("gloo", data.get("gloo"), (*names,), (*names,))
    bounds = _timing_bounds()
    return {key: r.number(f"gloo.{name}", table[name], **bounds[key]) for name, key in names.items()}


@functools.cache
def gloo_spread() -> float:
    """``[margin] spread`` of the data file: the factor within which a gloo message's modelled time and its
    timeout leave the real outcome to the host (``engine.timing.Timing.gloo_deadline``)."""
    r, data = _gloo_data()
    table = r.table("margin", data.get("margin"), ("spread",), ("spread",))
    return r.number("margin.spread", table["spread"], minimum=1.0, maximum=1000.0)


@dataclass(frozen=True, slots=True)
class Profile:
    """One calibration: costs and timings for one GPU kind, on the torch releases listed in ``releases``."""

    name: str
    gpu: str
    torch_build: str
    releases: tuple[str, ...]
    nccl_version: str
    source: str
    measured: str
    derivation: dict[str, str] = field(hash=False)
    comm: FixedOverheads
    timing: Timing
    path: str
    topology_changes: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def gpu_kind(self) -> GpuKind:
        return get_gpu_kind(self.gpu)

    @property
    def topology(self) -> Topology:
        """The hardware NCCL's memory model prices on: the GPU kind's topology (``gpu_kinds.toml``) with this
        profile's ``[topology]`` changes (what its measurement implies about the machine it was taken on)."""
        base = topology_for(self.gpu)
        return base.with_changes(**self.topology_changes) if self.topology_changes else base

    def check_env(self, env: Mapping[str, str]) -> None:
        """Raise ProfileError naming the knob (``knob``) when an NCCL_* variable of ``env`` has a value NCCL's
        memory model rejects (the engine prices every communicator under its process's environment)."""
        try:
            settings_from(env)
        except NcclInputError as err:
            message = str(err)
            knob = message.split(":", 1)[0] if message.startswith("NCCL_") else ""
            raise ProfileError(message, knob=knob) from None


# ---------------------------------------------------------------------------------------------- loading


class _Reader:
    """Field-by-field validation that names the file and the dotted key in every error."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, expected: str, value: Any) -> ProfileError:
        return ProfileError(f"{self.path}: {key}: expected {expected}, got {value!r}")

    def table(self, key: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict:
        check_keys(value, allowed=allowed, required=required, file=self.path, path=key, error=ProfileError)
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string", value)
        return value.strip()

    def number(
        self, key: str, value: Any, *, positive: bool = False, maximum: float = math.inf, minimum: float = 0.0
    ) -> float:
        # bool is an int subclass: `init_mib = true` must not read as 1.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, "a number", value)
        if value != value or value in (float("inf"), float("-inf")):
            raise self.fail(key, "a finite number", value)
        if value < 0 or (positive and value == 0):
            raise self.fail(key, "a positive number" if positive else "a non-negative number", value)
        if value > maximum or value < minimum:  # e.g. 1e308 MiB overflowed converting to bytes (exit 70)
            raise self.fail(key, f"a number from {number_text(minimum)} to {number_text(maximum)}", value)
        return float(value)

    def integer(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, "an integer", value)
        if value < minimum:
            raise self.fail(key, f"an integer >= {minimum}", value)
        return value


def _parse_comm(r: _Reader, value: Any) -> FixedOverheads:
    table = r.table("comm", value, _COMM_KEYS, _COMM_KEYS)
    most = current_limits().max_alloc_mib  # no overhead larger than the largest allocation a scenario may make
    return FixedOverheads(**{name: r.number(f"comm.{name}", table[name], maximum=most) for name in _COMM_KEYS})


def _parse_topology(r: _Reader, gpu: str, value: Any) -> dict[str, Any]:
    """``[topology]``: facts of the GPU kind's topology this profile's machine differs in (validated whole)."""
    if not isinstance(value, dict):
        raise r.fail("topology", "a table of topology facts (as in gpu_kinds.toml)", value)
    if "source" in value:
        raise ProfileError(f"{r.path}: topology.source: the reason goes in derivation.topology")
    base = topology_for(gpu)
    merged = {f: getattr(base, f) for f in TOPOLOGY_FIELDS if getattr(base, f) or f not in _OPTIONAL_TOPOLOGY}
    check_keys(value, allowed=TOPOLOGY_FIELDS, file=r.path, path="topology", error=ProfileError)
    merged.update(value)
    try:
        parse_topology(f"{r.path}: topology", gpu, {**merged, "source": base.source})
    except NcclInputError as err:
        raise ProfileError(str(err)) from None
    return dict(value)


def _parse_timing(r: _Reader, value: Any) -> Timing:
    table = r.table("timing", value, _TIMING_KEYS, _REQUIRED_TIMING_KEYS)
    bounds = _timing_bounds()
    figures = {name: r.number(f"timing.{name}", table[name], **bounds[name]) for name in table}
    return Timing(**{**gloo_defaults(), **figures})


def _timing_bounds() -> dict[str, dict[str, Any]]:
    """Each timing figure's sanity bounds (``Reader.number``'s keywords)."""
    # The data file's limits, not this run's overrides: a sanity bound on a machine's figures, not a run's budget
    # (SIMNCCL_LIMIT_MAX_SIM_TIME_S=100 made a shipped 10 GB/s profile "out of range" and every run exit 2; the
    # engine's own guard holds a run to the limits the user set).
    limits = current_limits({})
    # Bandwidth divides message sizes: zero would mean an infinite collective, and one so small that the largest
    # message a scenario may send outlasts the longest simulated run is no machine's (1e-320 "hung" every
    # collective). Every step's seconds stay within that run.
    slowest = limits.max_message_mib * 2**20 / 1e9 / limits.max_sim_time_s
    return {
        name: {"positive": True, "minimum": slowest} if name in _BANDWIDTH_KEYS else {"maximum": limits.max_sim_time_s}
        for name in _TIMING_KEYS
    }


def _parse_derivation(r: _Reader, value: Any, comm: FixedOverheads, topology: Mapping[str, Any]) -> dict[str, str]:
    allowed = (*_COMM_KEYS, *_TIMING_KEYS, "topology")
    table = r.table("derivation", value, allowed, ())
    derivation = {key: r.text(f"derivation.{key}", text) for key, text in table.items()}
    needed = [name for name in _COMM_KEYS if getattr(comm, name) != 0]
    if topology:
        needed.append("topology")
    missing = [name for name in needed if name not in derivation]
    if missing:
        raise ProfileError(
            f"{r.path}: missing key(s) {', '.join('derivation.' + m for m in missing)}; every non-zero overhead "
            "and every topology change must say how it was derived"
        )
    return derivation


def _parse_releases(r: _Reader, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise r.fail("releases", f"a non-empty list of release keys from {', '.join(RELEASES)}", value)
    releases: list[str] = []
    for i, item in enumerate(value):
        if item not in RELEASES:
            raise r.fail(f"releases[{i}]", f"one of {', '.join(RELEASES)}", item)
        if item in releases:
            raise r.fail(f"releases[{i}]", "each release listed once", item)
        releases.append(item)
    return tuple(releases)


def parse_profile(text: str, path: str) -> Profile:
    """Parse and validate one profile document; ``path`` names it in errors and is kept on the profile."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    r = _Reader(path)
    r.table("", data, _TOP_KEYS, _REQUIRED_TOP_KEYS)
    name = r.text("name", data["name"])
    if any(ch.isspace() for ch in name):
        raise r.fail("name", "a name without spaces", name)
    gpu = r.text("gpu", data["gpu"])
    if gpu not in gpu_kinds():
        raise r.fail("gpu", f"a GPU kind, one of {', '.join(gpu_kinds())}", gpu)
    comm = _parse_comm(r, data["comm"])
    topology = _parse_topology(r, gpu, data["topology"]) if "topology" in data else {}
    nccl_version = r.text("nccl_version", data["nccl_version"])
    try:
        NcclVersion.parse(nccl_version)
    except NcclInputError as err:
        raise ProfileError(f"{path}: {err}") from None
    return Profile(
        name=name,
        gpu=gpu,
        torch_build=r.text("torch_build", data["torch_build"]),
        releases=_parse_releases(r, data["releases"]),
        nccl_version=nccl_version,
        source=r.text("source", data["source"]),
        measured=r.text("measured", data["measured"]),
        derivation=_parse_derivation(r, data["derivation"], comm, topology),
        comm=comm,
        timing=_parse_timing(r, data["timing"]),
        path=path,
        topology_changes=topology,
    )


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Load a profile file (a built-in one, or one the real tier wrote)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{file}: cannot read profile: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{file}: not UTF-8 text: {exc}") from None
    return parse_profile(text, str(file))


@functools.cache
def _load_builtin() -> dict[str, Profile]:
    profiles: dict[str, Profile] = {}
    resources = importlib.resources.files(__name__)
    for resource in sorted(resources.iterdir(), key=lambda res: res.name):
        if not resource.name.endswith(".toml"):
            continue
        profile = parse_profile(resource.read_text(encoding="utf-8"), str(resource))
        stem = resource.name.removesuffix(".toml")
        if profile.name != stem:
            # get_profile(name) must find the file a reader would open.
            raise ProfileError(f"{profile.path}: name: expected {stem!r} (the file name), got {profile.name!r}")
        profiles[profile.name] = profile
    return profiles


def builtin_profiles() -> dict[str, Profile]:
    """Every ``simnccl/profiles/*.toml``, by name (a fresh dict each call over one cached load)."""
    return dict(_load_builtin())


def find_profile(gpu: str, release: str) -> Profile:
    """The built-in profile for this GPU kind that lists this release; exactly one must match."""
    try:
        get_gpu_kind(gpu)
    except ClusterError as exc:
        raise ProfileError(str(exc)) from None
    if release not in RELEASES:
        raise ProfileError(f"unknown torch release {release!r}; expected one of {', '.join(RELEASES)}")
    profiles = _load_builtin()
    matches = [p for p in profiles.values() if p.gpu == gpu and release in p.releases]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        for_gpu = [f"{p.name} ({', '.join(p.releases)})" for p in profiles.values() if p.gpu == gpu]
        have = "; ".join(for_gpu) if for_gpu else "none"
        raise ProfileError(
            f"no built-in profile for GPU kind {gpu!r} on release {release!r}. Profiles for {gpu!r}: {have}. "
            "Name a profile file explicitly, or calibrate one with the real tier."
        )
    names = ", ".join(p.name for p in matches)
    raise ProfileError(f"several built-in profiles cover GPU kind {gpu!r} on release {release!r}: {names}; name one")


def get_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """A built-in profile by name, or any profile file by path (anything ending in ``.toml``)."""
    text = os.fspath(name_or_path)
    profiles = _load_builtin()
    if text in profiles:
        return profiles[text]
    if text.endswith(".toml") or os.sep in text:
        return load_profile(text)
    raise ProfileError(
        f"unknown profile {text!r}; expected a built-in name ({', '.join(profiles)}) or a .toml file path"
    )

"""Calibration profiles: the bytes and seconds each NCCL communicator lifecycle step costs, with provenance.

Why profiles are data: the costs belong to NCCL on one GPU kind (buffer sizes, channel counts), not to our
code, and they come from someone's measurement. A profile names the GPU, the torch build, the NCCL version,
what exactly was measured, where it was published, and - for every non-zero cost - how the number was
derived (DESIGN rule 4). The real tier writes the same format when it calibrates on a GPU.

Which *lifecycle* pays these costs (eager nccl2 at ``new_group``, legacy at the first collective, split
children sharing their parent's resources) is torch's, and lives in ``simnccl.release`` and the backends; a
profile only prices the steps. Files are untrusted input: parsed with ``tomllib``, validated field by field,
and every error names the file, the key and what was expected (rule 9).
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from simnccl.cluster import ClusterError, GpuKind, get_gpu_kind, gpu_kinds
from simnccl.release import RELEASES

MAX_NCHANNELS_ENV = "NCCL_MAX_NCHANNELS"

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
)


class ProfileError(ValueError):
    """A bad profile file, name or lookup (bad input, not a simulated failure)."""


@dataclass(frozen=True, slots=True)
class CommCosts:
    """Device memory, in MiB per GPU, that each communicator lifecycle step allocates.

    ``init_mib``: a communicator's init (fresh, or a split child that does not share resources), at
    ``default_nchannels``. ``first_collective_mib``: connection buffers NCCL allocates at the communicator's
    first collective (NCCL_RUNTIME_CONNECT=1, the default). ``split_shared_*``: the same two steps for a split
    child under NCCL_COMM_SPLIT_SHARE_RESOURCES=1 / ``config.split_share``. ``p2p_pair_mib``: a 2-rank pair
    communicator created lazily for an unbatched send/recv, init and connect together.
    ``single_rank_init_mib``: a 1-rank communicator. ``process_first_comm_mib``: a one-time per-process NCCL
    overhead, charged with the process's first communicator. ``init_mib_at_max_nchannels``: measured init
    figures at NCCL_MAX_NCHANNELS=n.
    """

    init_mib: float
    first_collective_mib: float
    split_shared_init_mib: float
    split_shared_first_collective_mib: float
    p2p_pair_mib: float
    single_rank_init_mib: float
    process_first_comm_mib: float
    default_nchannels: int
    init_mib_at_max_nchannels: dict[int, float] = field(default_factory=dict, hash=False)

    def eager_group_mib(self, *, connect_at_init: bool) -> float:
        """The most one eagerly created group charges a member at creation (what a memory budget prices).

        The largest of a fresh, a single-rank and a shared-split init; with NCCL_RUNTIME_CONNECT=0
        (``connect_at_init``) the connection buffers come at init too, so the largest connect charge is added.
        """
        init = max(self.init_mib, self.single_rank_init_mib, self.split_shared_init_mib)
        if not connect_at_init:
            return init
        return init + max(self.first_collective_mib, self.split_shared_first_collective_mib)


# The MiB costs that scale with the channel count (everything but the channel fields themselves).
_SCALED_COSTS = tuple(
    f.name for f in fields(CommCosts) if f.name not in ("default_nchannels", "init_mib_at_max_nchannels")
)


@dataclass(frozen=True, slots=True)
class Timing:
    """Simulated seconds per step. ``bus_bandwidth_gbps`` is NCCL-tests bus bandwidth in GB/s."""

    comm_init_s: float
    split_s: float
    nocolor_split_s: float
    collective_latency_s: float
    bus_bandwidth_gbps: float
    p2p_latency_s: float
    cuda_context_s: float


_COMM_KEYS = tuple(f.name for f in fields(CommCosts))
_TIMING_KEYS = tuple(f.name for f in fields(Timing))


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
    comm: CommCosts
    timing: Timing
    path: str

    @property
    def gpu_kind(self) -> GpuKind:
        return get_gpu_kind(self.gpu)

    def costs_for_env(self, env: Mapping[str, str]) -> CommCosts:
        """The costs in effect under ``env``'s NCCL_MAX_NCHANNELS (memory is linear in the channel count).

        A measured figure at exactly that cap replaces ``init_mib`` and ``single_rank_init_mib`` (the figures
        published so far were measured on single-rank groups, sglang#35538); everything else scales by
        ``min(n, default_nchannels) / default_nchannels`` (a cap above the default changes nothing).
        """
        raw = env.get(MAX_NCHANNELS_ENV)
        if raw is None:
            return self.comm
        text = raw.strip()
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise ProfileError(
                f"{self.path}: {MAX_NCHANNELS_ENV}={raw!r} in the environment; expected a positive integer"
            )
        requested = int(text)
        default = self.comm.default_nchannels
        effective = min(requested, default)
        factor = effective / default
        scaled: dict[str, Any] = {name: getattr(self.comm, name) * factor for name in _SCALED_COSTS}
        measured = self.comm.init_mib_at_max_nchannels.get(requested)
        if measured is not None:
            scaled["init_mib"] = measured
            scaled["single_rank_init_mib"] = measured
        return replace(self.comm, default_nchannels=effective, **scaled)


# ---------------------------------------------------------------------------------------------- loading


class _Reader:
    """Field-by-field validation that names the file and the dotted key in every error."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, expected: str, value: Any) -> ProfileError:
        return ProfileError(f"{self.path}: {key}: expected {expected}, got {value!r}")

    def table(self, key: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, "a table", value)
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            where = f"{key}." if key else ""
            raise ProfileError(
                f"{self.path}: unknown key(s) {', '.join(where + u for u in unknown)}; expected {', '.join(allowed)}"
            )
        missing = [name for name in required if name not in value]
        if missing:
            where = f"{key}." if key else ""
            raise ProfileError(f"{self.path}: missing key(s) {', '.join(where + m for m in missing)}")
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string", value)
        return value.strip()

    def number(self, key: str, value: Any, *, positive: bool = False) -> float:
        # bool is an int subclass: `init_mib = true` must not read as 1.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, "a number", value)
        if value != value or value in (float("inf"), float("-inf")):
            raise self.fail(key, "a finite number", value)
        if value < 0 or (positive and value == 0):
            raise self.fail(key, "a positive number" if positive else "a non-negative number", value)
        return float(value)

    def integer(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, "an integer", value)
        if value < minimum:
            raise self.fail(key, f"an integer >= {minimum}", value)
        return value


def _parse_comm(r: _Reader, value: Any) -> CommCosts:
    table = r.table("comm", value, _COMM_KEYS, _COMM_KEYS)
    costs: dict[str, Any] = {name: r.number(f"comm.{name}", table[name]) for name in _SCALED_COSTS}
    nchannels = r.integer("comm.default_nchannels", table["default_nchannels"], 1)
    at_n = table["init_mib_at_max_nchannels"]
    if not isinstance(at_n, dict):
        raise r.fail("comm.init_mib_at_max_nchannels", "a table of channel count = MiB", at_n)
    measured: dict[int, float] = {}
    for raw_n, mib in at_n.items():
        key = f"comm.init_mib_at_max_nchannels.{raw_n}"
        if not (raw_n.isascii() and raw_n.isdigit()) or int(raw_n) < 1:
            raise r.fail(key, "a positive integer channel count as the key", raw_n)
        measured[int(raw_n)] = r.number(key, mib)
    return CommCosts(**costs, default_nchannels=nchannels, init_mib_at_max_nchannels=measured)


def _parse_timing(r: _Reader, value: Any) -> Timing:
    table = r.table("timing", value, _TIMING_KEYS, _TIMING_KEYS)
    # Bandwidth divides message sizes: zero would mean an infinite collective.
    return Timing(
        **{
            name: r.number(f"timing.{name}", table[name], positive=name == "bus_bandwidth_gbps")
            for name in _TIMING_KEYS
        }
    )


def _parse_derivation(r: _Reader, value: Any, comm: CommCosts) -> dict[str, str]:
    allowed = _COMM_KEYS + _TIMING_KEYS
    table = r.table("derivation", value, allowed, ())
    derivation = {key: r.text(f"derivation.{key}", text) for key, text in table.items()}
    needed = [name for name in _SCALED_COSTS if getattr(comm, name) != 0]
    needed.append("default_nchannels")
    if comm.init_mib_at_max_nchannels:
        needed.append("init_mib_at_max_nchannels")
    missing = [name for name in needed if name not in derivation]
    if missing:
        raise ProfileError(
            f"{r.path}: missing key(s) {', '.join('derivation.' + m for m in missing)}; every non-zero cost "
            "must say how it was derived"
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
    r.table("", data, _TOP_KEYS, _TOP_KEYS)
    name = r.text("name", data["name"])
    if any(ch.isspace() for ch in name):
        raise r.fail("name", "a name without spaces", name)
    gpu = r.text("gpu", data["gpu"])
    if gpu not in gpu_kinds():
        raise r.fail("gpu", f"a GPU kind, one of {', '.join(gpu_kinds())}", gpu)
    comm = _parse_comm(r, data["comm"])
    return Profile(
        name=name,
        gpu=gpu,
        torch_build=r.text("torch_build", data["torch_build"]),
        releases=_parse_releases(r, data["releases"]),
        nccl_version=r.text("nccl_version", data["nccl_version"]),
        source=r.text("source", data["source"]),
        measured=r.text("measured", data["measured"]),
        derivation=_parse_derivation(r, data["derivation"], comm),
        comm=comm,
        timing=_parse_timing(r, data["timing"]),
        path=path,
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

"""Capture unmodified torch.distributed code into simnccl Programs, one simulated rank at a time.

Why: the framework generators (``simnccl.workloads``) cover the startups we could read; for anything else the
honest source of a Program is what the code really calls. ``capture(fn, world_size)`` runs ``fn`` once per
simulated rank against a ``simnccl`` stand-in backend and records every ``init_process_group``,
``new_group``, ``split_group``, ``destroy_process_group``, ``torch.cuda.set_device``, collective and
point-to-point call, with its arguments, as the ops of ``simnccl.ops``. ``python -m simnccl.capture --world 8
-m module`` (or ``script.py``) does the same for a program and prints a summary, optionally simulating it and
writing a scenario TOML or a JSON programs file.

How each piece works, and why it is done that way (torch 2.15.0, CPU only):

* **The backend.** A Python ``torch._C._distributed_c10d.Backend`` subclass registered through torch's own
  ``Backend.register_backend(name, creator, extended_api=True, devices=["cpu", "cuda"])`` under ``nccl``,
  ``nccl2``, ``nccl-legacy``, ``nccl-lazy``, ``gloo`` and ``fake`` (so ``"cpu:gloo,cuda:nccl"`` maps work
  too), keeping torch's ``BackendType`` for ``nccl`` and ``gloo``. Every collective returns a completed
  Work (``_create_work_from_future``); nothing is communicated, outputs keep valid shapes (all-gathers copy
  the input into every slot, which is what torch's own ``fake`` backend does). It reports
  ``getBackendName()`` as the implementation the emulated release selects (``nccl2`` for ``"nccl"`` on 2.15,
  ``nccl`` under ``TORCH_DIST_USE_NCCL2=0``), because DeviceMesh compares that name. A PyBackend subclass must
  define *every* bool property and ``options``: torch's trampoline otherwise recurses forever.
* **Device binding.** Real 2.15 nccl2 writes the device it picks back to ``bound_device_id`` even without
  ``device_id`` (``_nccl2_device``), and code branches on it (DeviceMesh takes ``split_group`` when the default
  group is bound). The stand-in does the same for the implementations that do it on the emulated release,
  but binds ``cpu:<index>`` (same index): torch creates tensors on the bound device (``barrier``), and there
  is no CUDA here. Limit: ``new_group(device_id=cuda:N)`` then trips torch's "Mismatched bound device".
* **CUDA.** ``torch.cuda.is_available``/``device_count``/``set_device``/``current_device``/
  ``is_initialized``/``synchronize`` and ``torch.accelerator.is_available``/``device_count`` are replaced
  while a rank runs, so ``init_device_mesh("cuda", ...)`` and ``device_id=cuda:N`` work; ``set_device`` is
  recorded. Tensors must still live on the CPU (there is no CUDA memory to hold them): code that allocates
  CUDA tensors cannot be captured.
* **Rendezvous.** ``env://``, ``tcp://`` and ``file://`` rendezvous yield torch's no-op ``FakeStore`` (the
  store torch's own fake mode uses), so no rank waits for a peer. A store the code builds itself
  (``TCPStore(...)``) is not intercepted: it waits for peers that never come, and the rank times out.
* **Recording.** A non-member's ``new_group`` never reaches any backend, yet every rank's call must be
  recorded, so ``init_process_group``/``new_group``/``split_group``/``destroy_process_group`` are wrapped
  wherever a loaded module holds them (DeviceMesh and user modules bind them at import; ``sys.setprofile``
  would need no patching but made a first DeviceMesh build 20x slower), once per capture, by wrappers that
  record into the running rank's recorder (a module one rank imports records every rank). Collectives are
  recorded by the backend itself, so functional collectives are seen too.
* **One rank at a time.** torch's world (``_World``) is process-global, and real code keeps rank state in
  module globals and reads ``LOCAL_RANK`` from ``os.environ``. torch 2.15's ``multi_threaded_pg``
  (``_install_threaded_pg``: a thread-local ``_World``) swaps the world per thread, but not the environment,
  the CUDA current device or the user's globals, so threads cannot give each rank its own process.
  ``mode="fork"`` (default on Linux) forks one child per rank from this process (torch is imported once and
  its lazy imports are paid once, by a throw-away warm-up; a fork then starts in milliseconds), each under a
  timeout, killed and reaped when it overruns. ``mode="inline"`` runs the ranks one after another in this
  process (``destroy_process_group`` and the environment are reset between ranks); the target must then keep
  no state of its own between runs.

Options: every ``pg_options`` field torch receives (``ProcessGroupNCCL.Options`` and its ``NCCLConfig``: Megatron's
``cga_cluster_size``/``max_ctas``/``min_ctas``/``net_name``, ``is_high_priority_stream``, ``lazy_init``,
``split_share`` ...) is kept in the op's ``PgOptions`` under torch's name, and in the TOML and JSON written from
it; the fields the simulator does not use yet are named in the run's notes and in the TOML's header.

Group handles: a program refers to groups by handle (``simnccl.ops``). The default group is ``"world"``. Each
group-creation call gets a family handle: consecutive calls with the same ``group_desc`` (else backend) and
disjoint rank sets share one handle, like a framework's ``for ranks in groups: g = new_group(ranks)`` loop
assigning one variable; a call whose ranks overlap the family starts a new one (``mesh_tp.1``,
``mesh_tp.2``...). A rank is a member of at most one group per handle, so a collective's handle always names
the group it ran on, and ranks with the same calls share one Program (DESIGN rule 8).

Variants: a captured Program is one branch of the code, decided by the release, the environment
(``TORCH_DIST_USE_NCCL2``) and the policy it ran under: 2.15's nccl2 binds the default group, so DeviceMesh
takes ``split_group``; legacy and 2.14 leave it unbound, so DeviceMesh loops ``new_group``. The run records
those settings and what they decided (``BranchSettings``: in the summary, the JSON and the TOML's header), and
``simulate``/``--simulate`` under settings that decide differently raise ``BranchMismatch`` saying how to
re-capture, instead of replaying calls real torch would not make. ``capture(..., policy=...)`` runs each rank
under ``simnccl.torch_apply.apply(policy)``, so the Programs hold the policy's decisions; the stand-in models
nccl2's ``supportsSplitting`` (a ``lazy_init`` group is no split source until its first collective), so a
lazy-init DeviceMesh over an unused bound default group fails in capture with torch's own error, as on a GPU.

Scaling: a captured Program is what the code did at that world size. "Replay at a larger world" means
capturing the same code again with a larger ``world_size`` (the code is what scales); ``capture_scaled``
does exactly that.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import inspect
import io
import json
import os
import pickle
import runpy
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed import distributed_c10d as c10d

from simnccl.c10d import ProcessContext, _binds_device, nccl_device_fallback
from simnccl.capture_cli import DEFAULT_TIMEOUT_S, MODES
from simnccl.ops import (
    NO_OPTIONS,
    OPTION_FIELDS,
    WORLD,
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    Broadcast,
    Checkpoint,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    Program,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.release import KNOWN_BACKEND_NAMES, DeviceBackend, Impl, ReleaseError, get_release
from simnccl.tags import current_tags
from simnccl.torch_apply import modelled_options

MASTER_PORT = "29500"
UNRECORDED = "unrecorded"  # the handle of a group whose creation was not seen (never silently "world")

# torch dtype -> the c10 ScalarType name torch's flight recorder prints (and simnccl ops use).
_DTYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}


class CaptureError(RuntimeError):
    """The capture could not produce Programs: bad arguments, or the code failed or hung on a rank."""


NO_POLICY = "torch-default"  # the scenario files' name for "no policy"


def _plain_policy(policy: str | None) -> str | None:
    return None if policy in (None, "", NO_POLICY) else policy


class BranchMismatch(CaptureError, ValueError):
    """A replay under a release/env/policy that would have changed what the captured code saw (and did)."""


# ---------------------------------------------------------------------------------------------- branches


@dataclass(frozen=True, slots=True)
class BranchSettings:
    """What captured code can branch on, decided by release, env and policy before any group exists.

    Why these: DeviceMesh takes ``split_group`` when the default group has a ``bound_device_id`` (2.15's nccl2
    binds one even without ``device_id``; legacy and 2.14 don't) and loops ``new_group`` otherwise; it compares
    ``getBackendName()`` (``nccl2`` vs ``nccl``); and a ``lazy_init`` default group is no split source. The
    simulator's own rules (``simnccl.c10d``, ``simnccl.release``) answer each, so capture and replay agree.
    """

    default_backend: str  # the implementation the default group's accelerator leg reports
    default_bound: bool  # the default group has a bound_device_id
    default_lazy: bool  # the default group is lazy_init (and the release has the option)
    nccl_names: tuple[tuple[str, str, bool], ...]  # (name, implementation, binds) for every NCCL-family name

    def __str__(self) -> str:
        bound = "bound (DeviceMesh: split_group)" if self.default_bound else "unbound (DeviceMesh: new_group loop)"
        lazy = ", lazy_init" if self.default_lazy else ""
        return f"default group {self.default_backend}, {bound}{lazy}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "default_backend": self.default_backend,
            "default_bound": self.default_bound,
            "default_lazy": self.default_lazy,
            "nccl_names": {name: {"impl": impl, "binds": binds} for name, impl, binds in self.nccl_names},
        }

    def differences(self, other: BranchSettings) -> list[str]:
        """What ``other`` changes, in words (for the refusal)."""
        out = []
        if self.default_bound != other.default_bound:
            out.append(
                f"the default group would be {'bound' if other.default_bound else 'unbound'} instead of "
                f"{'bound' if self.default_bound else 'unbound'} (DeviceMesh takes "
                f"{'split_group' if other.default_bound else 'the new_group loop'} there)"
            )
        if self.default_backend != other.default_backend:
            new, old = other.default_backend, self.default_backend
            out.append(f"the default group would report backend {new!r}, not {old!r}")
        if self.default_lazy != other.default_lazy:
            out.append(f"the default group would {'' if other.default_lazy else 'not '}be lazy_init")
        if not out:
            changed = [a[0] for a, b in zip(self.nccl_names, other.nccl_names, strict=True) if a != b]
            out.append(f"backend {', '.join(changed)} would resolve or bind differently")
        return out


def branch_settings(
    release: str, env: Mapping[str, str], policy: str | None, init: InitProcessGroup | None
) -> BranchSettings:
    """The ``BranchSettings`` of ``init`` (the first recorded ``init_process_group``) under these settings.

    The policy's ``on_init`` is applied to the recorded call (its env knobs, backend, device_id, lazy_init),
    as ``simnccl.torch_apply`` would before torch runs it.
    """
    from simnccl.policy import InitRequest, PolicyError, get_policy
    from simnccl.release import NCCL_FAMILY_NAMES, resolve_backend

    try:
        rel = get_release(release)
    except ReleaseError as err:
        raise CaptureError(f"release: {err}") from None
    env_ = dict(env)
    backend = init.backend if init is not None else None
    device_id = init.device_id if init is not None else None
    options = init.pg_options if init is not None else NO_OPTIONS
    if policy is not None and init is not None:
        try:
            chosen = get_policy(policy)
        except PolicyError as err:
            raise CaptureError(f"policy: {err}") from None
        plan = chosen.on_init(InitRequest(0, 1, release, env_, backend, device_id, options))
        env_.update(plan.env)
        backend, device_id, options = plan.backend, plan.device_id, plan.pg_options
    names = []
    for name in NCCL_FAMILY_NAMES:
        try:
            impl = rel.impl_for_name(name, env_)
        except (KeyError, ValueError, ReleaseError):
            names.append((name, "unknown", False))
            continue
        names.append((name, str(impl.cpp_name), _binds_device(rel, DeviceBackend("cuda", name, impl))))
    try:
        leg = resolve_backend(rel, backend, env_).for_device("cuda")
    except Exception:  # a backend this release rejects: the replay reports torch's error itself
        leg = None
    reported = "none" if leg is None else str(leg.impl.cpp_name)
    bound = (device_id is not None and not str(device_id).startswith("cpu")) or _binds_device(rel, leg)
    lazy = bool(options.lazy_init) and rel.lazy_init_option
    return BranchSettings(reported, bool(bound), lazy, tuple(names))


def _first_init(programs: Sequence[Program]) -> InitProcessGroup | None:
    for program in programs[:1]:
        for op in program.ops:
            if isinstance(op, InitProcessGroup):
                return op
    return None


def _settings_text(release: str, env: Mapping[str, str], policy: str | None) -> str:
    parts = [f"torch {release}", *(f"{k}={v}" for k, v in sorted(env.items()))]
    parts.append(f"policy {policy}" if policy else "no policy")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded torch call on one rank: its name, its arguments as plain values, and its group handle."""

    name: str
    args: Mapping[str, Any]
    handle: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.name, "args": dict(self.args), "handle": self.handle}


@dataclass(frozen=True, slots=True)
class RankCapture:
    """What one simulated rank called."""

    rank: int
    ops: tuple[Op, ...]
    calls: tuple[Call, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CapturedRun:
    """Every rank's Program (identical ones shared), the calls behind them, and how they were captured."""

    world_size: int
    gpus_per_node: int
    release: str
    env: Mapping[str, str]
    programs: tuple[Program, ...]
    calls: tuple[tuple[Call, ...], ...]
    notes: tuple[str, ...] = ()
    mode: str = "fork"
    wall_s: float = 0.0
    policy: str | None = None  # the policy the ranks ran under (simnccl.torch_apply.apply), None: plain torch

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    def simulate(
        self,
        *,
        gpu: str = "h100-80gb",
        release: str | None = None,
        env: Mapping[str, str] | None = None,
        policy: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Replay the Programs in the simulator on ``nodes x gpus_per_node`` GPUs of kind ``gpu``.

        Refused (``BranchMismatch``) when ``release``/``env``/``policy`` would have changed what the captured code
        saw (``check_replay``): the Programs are one branch of the code, not the code.
        """
        from simnccl.testing import simulate

        self.check_replay(release=release, env=env, policy=policy)
        if self.world_size % self.gpus_per_node:
            raise CaptureError(
                f"cannot replay a world of {self.world_size} on nodes of {self.gpus_per_node} GPUs: "
                "capture with a gpus_per_node that divides the world size"
            )
        return simulate(
            [p.ops for p in self.programs],  # the same tuple for ranks sharing a Program: shared in the engine
            gpu=gpu,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            release=release or self.release,
            env=dict(self.env if env is None else env),
            policy=policy,
            **kwargs,
        )

    def captured_under(self) -> BranchSettings:
        """What the captured code could branch on, under the settings it was captured with."""
        return branch_settings(self.release, self.env, self.policy, _first_init(self.programs))

    def check_replay(
        self, *, release: str | None = None, env: Mapping[str, str] | None = None, policy: str | None = None
    ) -> None:
        """Raise ``BranchMismatch`` when replaying under these settings would not be what real torch runs.

        ``None`` keeps the capture's own release/env; ``policy=None`` replays without a policy (the Programs
        already hold what the capture's policy decided).
        """
        rel = release or self.release
        env_ = dict(self.env if env is None else env)
        policy = _plain_policy(policy)
        wanted = branch_settings(rel, env_, policy, _first_init(self.programs))
        have = self.captured_under()
        if wanted == have:
            return
        why = "; ".join(have.differences(wanted))
        asked = _settings_text(rel, env_, policy)
        cli = " ".join([f"--release {rel}", *(f"--env {k}={v}" for k, v in sorted(env_.items()))])
        cli += f" --policy {policy}" if policy else ""
        raise BranchMismatch(
            f"refusing to simulate a capture made under {_settings_text(self.release, self.env, self.policy)} "
            f"as {asked}: {why}, so real torch would run other calls than the captured ones; re-capture under "
            f"those settings for an honest answer: capture(..., release={rel!r}, env={dict(sorted(env_.items()))!r}"
            f"{f', policy={policy!r}' if policy else ''}) or simnccl capture {cli}"
        )

    def summary(self) -> str:
        """Per distinct program: the ranks running it and what they call."""
        lines = [
            f"captured {self.world_size} ranks ({self.nodes} node(s) x {self.gpus_per_node} GPUs), "
            f"emulating torch {self.release}, {self.mode} mode, {self.wall_s:.2f} s",
            f"  captured under {_settings_text(self.release, self.env, self.policy)}: {self.captured_under()}",
        ]
        for program, ranks in _program_ranks(self.programs):
            counts: dict[str, int] = {}
            for op in program.ops:
                counts[op.name] = counts.get(op.name, 0) + 1
            shown = ", ".join(f"{n} {k}" for k, n in counts.items())
            lines.append(f"  ranks {_ranks_text(ranks)}: {len(program.ops)} ops ({shown})")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """Programs (one entry per distinct program, with its ranks) and every rank's calls, as plain data."""
        return {
            "world_size": self.world_size,
            "gpus_per_node": self.gpus_per_node,
            "release": self.release,
            "env": dict(self.env),
            "policy": self.policy,
            "captured_under": self.captured_under().to_dict(),
            "programs": [
                {"ranks": ranks, "ops": program.to_list()} for program, ranks in _program_ranks(self.programs)
            ],
            "calls": [[c.to_dict() for c in calls] for calls in self.calls],
            "notes": list(self.notes),
        }

    def to_scenario_toml(self, name: str = "captured", *, gpu: str = "h100-80gb", description: str = "") -> str:
        """A scenario file (``simnccl run`` reads it) whose explicit steps expand to exactly these Programs.

        Ops every program starts with are written once; each distinct program's remaining ops follow with
        ``on_ranks`` (steps append to each rank's list in file order, so this is exact).
        """
        groups = _program_ranks(self.programs)
        prefix = _common_prefix([p.ops for p, _ in groups])
        lines = [
            "# Captured by simnccl.capture: every rank's torch.distributed calls as explicit steps.",
            f"# Captured under {_settings_text(self.release, self.env, self.policy)}: {self.captured_under()}.",
            "# Another release, TORCH_DIST_USE_NCCL2 or policy can change those branches: re-capture under it.",
            "[scenario]",
            f"name = {_toml(name)}",
        ]
        if self.policy is not None:  # the Programs hold its decisions; running it again keeps replays honest
            lines.append(f"policy = {_toml(self.policy)}")
        if description:
            lines.append(f"description = {_toml(description)}")
        lines += [
            "",
            "[cluster]",
            f"gpu = {_toml(gpu)}",
            f"nodes = {self.nodes}",
            f"gpus_per_node = {self.gpus_per_node}",
            "",
            "[torch]",
            f"release = {_toml(self.release)}",
        ]
        if self.env:
            pairs = ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in sorted(self.env.items()))
            lines.append(f"env = {{ {pairs} }}")
        unmodelled = unmodelled_options(self.programs)
        if unmodelled:
            lines += ["", f"# {_unmodelled_text(unmodelled)}"]
        lines += ["", "[workload]", "steps = ["]
        for op in groups[0][0].ops[:prefix]:
            lines.append(f"  {_step(op, None)},")
        for program, ranks in groups:
            on_ranks = None if len(groups) == 1 else ranks
            for op in program.ops[prefix:]:
                lines.append(f"  {_step(op, on_ranks)},")
        lines.append("]")
        return "\n".join(lines) + "\n"


def _program_ranks(programs: Sequence[Program]) -> list[tuple[Program, list[int]]]:
    """Distinct programs in first-rank order, each with the ranks that run it."""
    out: dict[int, tuple[Program, list[int]]] = {}
    for rank, program in enumerate(programs):
        out.setdefault(id(program), (program, []))[1].append(rank)
    return list(out.values())


def unmodelled_options(programs: Sequence[Program]) -> list[str]:
    """The pg_options fields these programs set that the simulator does not use yet, in field order."""
    seen: set[str] = set()
    for program in {id(p): p for p in programs}.values():
        for op in program.ops:
            options = getattr(op, "pg_options", NO_OPTIONS)
            if options is not NO_OPTIONS:
                seen.update(options.unmodelled())
    return [name for name in OPTION_FIELDS if name in seen]


def _unmodelled_text(names: Sequence[str]) -> str:
    return (
        f"pg_options recorded but not modelled by the simulator yet: {', '.join(names)} "
        "(kept in the Programs; they change nothing in a simulation)"
    )


def _common_prefix(op_lists: Sequence[Sequence[Op]]) -> int:
    if len(op_lists) == 1:
        return len(op_lists[0])
    n = min(len(ops) for ops in op_lists)
    for i in range(n):
        if any(ops[i] != op_lists[0][i] for ops in op_lists[1:]):
            return i
    return n


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")  # pragma: no cover - ops hold plain values only


def _step(op: Op, on_ranks: Sequence[int] | None) -> str:
    fields = op.to_dict()
    name = fields.pop("op")
    items = [f"op = {_toml(name)}"]
    for key, value in fields.items():
        if key == "pg_options":
            items += [f"{k} = {_toml(v)}" for k, v in value.items()]
        elif key == "label":
            items.append(f"name = {_toml(value)}")
        else:
            items.append(f"{key} = {_toml(value)}")
    if on_ranks is not None:
        items.append(f"on_ranks = {_toml(list(on_ranks))}")
    return "{ " + ", ".join(items) + " }"


# ---------------------------------------------------------------------------------------------- argument conversion


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


def _backend_name(backend: Any) -> str | None:
    return None if backend is None else str(c10d.Backend(str(backend)))


def _plain(value: Any) -> Any:
    """An argument as JSON-able data (for ``Call.args``)."""
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


# ---------------------------------------------------------------------------------------------- the recorder


class _Recorder:
    """One rank's ops and calls, group families, and the ProcessGroup -> handle map."""

    def __init__(self, rank: int, local_rank: int, checkpoints: bool) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.checkpoints = checkpoints
        self.ops: list[Op] = []
        self.calls: list[Call] = []
        self.notes: list[str] = []
        self.handles: dict[int, str] = {}  # id(ProcessGroup) -> handle
        self.groups: list[Any] = []  # keep the ProcessGroups alive so ids stay unique
        # open families: key (desc or backend) -> (handle, union of ranks so far)
        self.families: dict[str, tuple[str, set[int]]] = {}
        self.family_count: dict[str, int] = {}

    def add(self, op: Op | None, name: str, args: Mapping[str, Any], handle: str | None = None) -> None:
        self.calls.append(Call(name, {k: _plain(v) for k, v in args.items()}, handle))
        if op is not None:
            self.ops.append(op)

    def family(self, stem: str, ranks: Sequence[int] | None, world_size: int) -> str:
        members = set(range(world_size) if ranks is None else ranks)
        open_family = self.families.get(stem)
        if open_family is not None and not (open_family[1] & members):
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
        for device in pg._device_types:
            try:
                backend = pg._get_backend(device)
            except RuntimeError:  # pragma: no cover - a device type without a backend
                continue
            if isinstance(backend, StandInBackend):
                backend.handle = handle

    def handle_of(self, pg: Any) -> str:
        if pg is None or pg is c10d.GroupMember.WORLD:
            return WORLD
        return self.handles.get(id(pg), UNRECORDED)


_ACTIVE: _Recorder | None = None


def checkpoint(label: str) -> None:
    """Mark a memory measurement point in the captured program (a no-op when not capturing).

    Code under capture may call it, e.g. ``simnccl.capture.checkpoint("startup")`` after building its groups;
    the simulator reports used/free memory per device there.
    """
    if _ACTIVE is not None:
        _ACTIVE.add(Checkpoint(label), "checkpoint", {"label": label})


# ---------------------------------------------------------------------------------------------- the backend


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
        recorder = _ACTIVE
        if recorder is None:
            return
        dtype = _dtype(tensors[0]) if tensors else "Float"
        _check_bound(recorder, self.handle, name)
        op = op_type(group=self.handle, size_bytes=_nbytes(tensors), dtype=dtype, **extra)
        args = {"group": self.handle, "tensors": list(tensors), **extra}
        recorder.add(op, name, args, self.handle)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllReduce, "all_reduce", tensors)
        return self._done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllReduce, "all_reduce_coalesced", tensors)
        return self._done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        # No reduce op in the vocabulary: same members and payload as an all-reduce.
        self._record(AllReduce, "reduce", tensors)
        return self._done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._record(Broadcast, "broadcast", tensors, src=self._global[opts.rootRank])
        return self._done(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllGather, "all_gather", inputs)
        for slots, tensor in zip(outputs, inputs, strict=False):
            for slot in slots:
                slot.copy_(tensor)
        return self._done(outputs)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self.allgather(outputs, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._record(AllGather, "all_gather_into_tensor", [input])
        if input.numel() and output.numel() % input.numel() == 0:
            output.view(-1, input.numel()).copy_(input.reshape(1, -1))
        return self._done([output])

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllGather, "all_gather_into_tensor_coalesced", inputs)
        return self._done(outputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        # No gather op in the vocabulary: same members and per-rank payload as an all-gather.
        self._record(AllGather, "gather", inputs)
        return self._done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        # No scatter op in the vocabulary: a rooted one-to-all transfer like a broadcast.
        self._record(Broadcast, "scatter", outputs, src=self._global[opts.rootRank])
        return self._done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        self._record(ReduceScatter, "reduce_scatter", [t for chunk in inputs for t in chunk])
        return self._done(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._record(ReduceScatter, "reduce_scatter_tensor", [input])
        return self._done([output])

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        self._record(ReduceScatter, "reduce_scatter_tensor_coalesced", inputs)
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
        return self._done([output])

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._record(AllToAll, "all_to_all", inputs)
        return self._done(outputs)

    def barrier(self, opts: Any) -> Any:
        self._lazy = False
        recorder = _ACTIVE
        if recorder is not None:
            _check_bound(recorder, self.handle, "barrier")
            recorder.add(Barrier(group=self.handle), "barrier", {"group": self.handle}, self.handle)
        return self._done(None)

    def _p2p(self, op_type: type[Op], name: str, tensors: list[torch.Tensor], peer: int) -> Any:
        self._lazy = False
        recorder = _ACTIVE
        if recorder is not None:
            dtype = _dtype(tensors[0]) if tensors else "Float"
            peer_rank = self._global[peer]
            _check_bound(recorder, self.handle, name)
            op = op_type(peer=peer_rank, group=self.handle, size_bytes=_nbytes(tensors), dtype=dtype)
            recorder.add(op, name, {"group": self.handle, "peer": peer_rank, "tensors": tensors}, self.handle)
        return self._done(tensors)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p(Send, "send", tensors, dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._p2p(Recv, "recv", tensors, src)


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


# ---------------------------------------------------------------------------------------------- installation


RECORDED_FUNCTIONS = ("init_process_group", "new_group", "split_group", "destroy_process_group")
# Read once, at import: binding each call's arguments is per call, inspecting torch's signatures need not be.
_SIGNATURES = {name: inspect.signature(getattr(c10d, name)) for name in RECORDED_FUNCTIONS}

# Recorded calls in progress (process-wide, like the recorder): a call torch makes from inside a recorded call
# (``init_device_mesh`` calling ``new_group``) is torch's, not the user's, and passes through unrecorded.
_DEPTH = 0


def _holders(values: Iterable[Any]) -> list[tuple[Any, str, Any]]:
    """Every (module, attribute, value) of a loaded module whose value is one of ``values`` (~25-70 ms)."""
    wanted = {id(value) for value in values}  # the values are alive (the caller holds them): ids are unique
    out = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            out.extend((module, attr, value) for attr, value in list(namespace.items()) if id(value) in wanted)
    return out


@contextlib.contextmanager
def _intercepted() -> Iterator[None]:
    """Torch's group-lifecycle functions swapped for recording wrappers wherever a loaded module holds them.

    Every module attribute that *is* one of torch's functions is swapped (DeviceMesh and user modules bind
    ``new_group``/``split_group`` at import, so patching ``torch.distributed`` alone would miss them; a module
    imported later binds the wrapper from wherever it imports it). ``capture()`` does this once, before ranks
    run inline or fork: the wrappers record into whichever rank's recorder is active (``_ACTIVE``) and pass
    straight through when none is, so a module that one inline rank imports (binding a wrapper) records every
    later rank's calls too. On exit torch's functions are back everywhere, in modules imported meanwhile too.
    (``sys.setprofile`` would see every call without patching, but costs ~20x on torch's lazy imports of a
    first DeviceMesh build; wrapping costs nothing.)
    """
    originals = {name: getattr(c10d, name) for name in RECORDED_FUNCTIONS}
    wrappers = {name: _wrapper(name, fn) for name, fn in originals.items()}
    wrapper_of = {id(originals[name]): wrappers[name] for name in RECORDED_FUNCTIONS}
    original_of = {id(wrappers[name]): originals[name] for name in RECORDED_FUNCTIONS}
    patched = _holders(originals.values())
    try:
        for module, attr, value in patched:
            setattr(module, attr, wrapper_of[id(value)])
        yield
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)
        for module, attr, wrapper in _holders(wrappers.values()):
            setattr(module, attr, original_of[id(wrapper)])


def _wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for torch's ``name`` that records entry into the active recorder and binds the result."""
    signature = _SIGNATURES[name]

    def recorded(*args: Any, **kwargs: Any) -> Any:
        global _DEPTH
        recorder = _ACTIVE
        if recorder is None or _DEPTH:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch raises its own error for bad arguments
        bound.apply_defaults()
        _DEPTH += 1
        try:
            try:
                handle = _enter(recorder, name, bound.arguments)
            except (TypeError, ValueError) as err:  # arguments torch will reject itself, just below
                handle = None
                recorder.notes.append(f"{name}: arguments not recorded ({err})")
            result = original(*args, **kwargs)
        finally:
            _DEPTH -= 1
        _leave(recorder, name, handle, result)
        return result

    recorded.__wrapped__ = original  # type: ignore[attr-defined]
    recorded.__name__ = name
    recorded.__doc__ = original.__doc__
    return recorded


def _enter(rec: _Recorder, name: str, args: Mapping[str, Any]) -> str | None:
    """Record the call, before torch runs it; returns the handle its group will be bound to."""
    if name == "init_process_group":
        op = InitProcessGroup(
            backend=_backend_name(args.get("backend")),
            device_id=_device(args.get("device_id")),
            timeout_s=_seconds(args.get("timeout")),
            pg_options=_options(args.get("pg_options")),
        )
        keys = ("backend", "init_method", "timeout", "device_id", "pg_options")
        rec.add(op, name, _call_args(args, keys), WORLD)
        return WORLD
    world_size = dist.get_world_size() if dist.is_initialized() else 0
    purpose, traffic = current_tags()  # production code's simnccl.tags.group_tags around the call
    if name == "new_group":
        raw = args.get("ranks")
        ranks = None if raw is None else [int(r) for r in raw]
        if ranks is not None and args.get("sort_ranks", True):
            ranks = sorted(ranks)
        backend = _backend_name(args.get("backend"))
        desc = args.get("group_desc")
        handle = rec.family(desc or backend or "group", ranks, world_size)
        op = NewGroup(
            ranks=None if ranks is None else tuple(ranks),
            bind=handle,
            backend=backend,
            pg_options=_options(args.get("pg_options")),
            use_local_synchronization=bool(args.get("use_local_synchronization", False)),
            group_desc=desc,
            device_id=_device(args.get("device_id")),  # type: ignore[arg-type]
            timeout_s=_seconds(args.get("timeout")),
            purpose=purpose,
            traffic=traffic,
        )
        keys = ("ranks", "timeout", "backend", "pg_options", "use_local_synchronization", "group_desc")
        rec.add(op, name, _call_args(args, (*keys, "device_id", "sort_ranks")), handle)
        return handle
    if name == "split_group":
        split = tuple(tuple(int(r) for r in s) for s in args.get("split_ranks") or ())
        desc = args.get("group_desc")
        handle = rec.family(desc or "split", None, world_size)
        rec.families.pop(desc or "split", None)  # one split_group call is one family
        if args.get("backend") is not None:
            rec.notes.append(f"split_group(backend={args['backend']!r}): not expressible in a Program; dropped")
        op = SplitGroup(
            split_ranks=split,
            parent=rec.handle_of(args.get("parent_pg")),
            bind=handle,
            pg_options=_options(args.get("pg_options")),
            group_desc=desc,
            timeout_s=_seconds(args.get("timeout")),
            purpose=purpose,
            traffic=traffic,
        )
        keys = ("parent_pg", "split_ranks", "timeout", "pg_options", "group_desc", "backend")
        rec.add(op, name, _call_args(args, keys), handle)
        return handle
    group = args.get("group")
    handle = rec.handle_of(group)
    rec.add(DestroyProcessGroup(group=handle), name, {"group": handle}, handle)
    return None


def _leave(rec: _Recorder, name: str, handle: str | None, result: Any) -> None:
    """Bind the group torch returned (or the default group it created) to its handle."""
    if name == "init_process_group" and dist.is_initialized():
        rec.bind(c10d._get_default_group(), WORLD)
        if rec.checkpoints:
            rec.ops.append(Checkpoint("after_init"))
    elif handle is not None and isinstance(result, c10d.ProcessGroup):
        rec.bind(result, handle)


def _call_args(args: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    out = {k: args[k] for k in keys if k in args and args[k] is not None}
    if "parent_pg" in out:
        out["parent_pg"] = _ACTIVE.handle_of(out["parent_pg"]) if _ACTIVE is not None else None
    return out


class _FakeCuda:
    """Stand-ins for the ``torch.cuda``/``torch.accelerator`` queries startup code makes, per rank."""

    def __init__(self, recorder: _Recorder, gpus_per_node: int) -> None:
        self.recorder = recorder
        self.count = gpus_per_node
        self.current: int | None = None

    def set_device(self, device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        if index is None:
            index = 0
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} (capturing with {self.count} GPUs)")
        self.current = index
        # SetDevice() means "this process's LOCAL_RANK": spelled that way, ranks share one Program.
        recorded = None if index == self.recorder.local_rank else index
        self.recorder.add(SetDevice(device=recorded), "set_device", {"device": index})

    def patches(self) -> list[tuple[Any, str, Any]]:
        return [
            (torch.cuda, "is_available", lambda: True),
            (torch.cuda, "device_count", lambda: self.count),
            (torch.cuda, "set_device", self.set_device),
            (torch.cuda, "current_device", lambda: 0 if self.current is None else self.current),
            (torch.cuda, "is_initialized", lambda: self.current is not None),
            (torch.cuda, "synchronize", lambda device=None: None),
            (torch.accelerator, "is_available", lambda: True),
            (torch.accelerator, "device_count", lambda: self.count),
            (torch.accelerator, "set_device_index", self.set_device),
            (torch.accelerator, "current_device_index", lambda: 0 if self.current is None else self.current),
        ]


def _fake_rendezvous(url: str, *args: Any, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """A rendezvous that needs no peer: rank and world from the URL's query or the environment."""
    from urllib.parse import parse_qs, urlparse

    query = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    rank = int(query.get("rank", os.environ.get("RANK", "0")))
    world = int(query.get("world_size", os.environ.get("WORLD_SIZE", "1")))
    yield _fake_store(), rank, world


def _fake_store() -> Any:
    """torch's no-op store; torch 2.15 exports it from its testing module only (not as ``dist.FakeStore``)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


@contextlib.contextmanager
def _installed(recorder: _Recorder, release: str, world_size: int, gpus_per_node: int, cuda: bool) -> Iterator[None]:
    """Stand-in backends, fake CUDA, peerless rendezvous and the active recorder, for one rank; undone on exit.

    The call wrappers are not installed here but once per ``capture()`` (``_intercepted``): they record into
    whichever recorder this makes active.
    """
    global _ACTIVE
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers "fake" first, so ours wins

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
    fake_cuda = _FakeCuda(recorder, gpus_per_node)
    patches = fake_cuda.patches() if cuda else []
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
        for scheme in ("env", "tcp", "file"):
            rendezvous._rendezvous_handlers[scheme] = _fake_rendezvous
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        _ACTIVE = recorder
        yield
    finally:
        _ACTIVE = None
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


# ---------------------------------------------------------------------------------------------- running one rank


@dataclass(frozen=True)
class _Spec:
    """Everything a rank needs: what to run, and the world it runs in."""

    target: Callable[[], Any]
    world_size: int
    gpus_per_node: int
    release: str
    env: Mapping[str, str]
    init_backend: str | None
    cuda: bool
    checkpoints: bool
    final_checkpoint: str | None
    timeout_s: float
    policy: str | None = None

    def rank_env(self, rank: int) -> dict[str, str]:
        local = rank % self.gpus_per_node
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(self.gpus_per_node),
            "GROUP_RANK": str(rank // self.gpus_per_node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": MASTER_PORT,
            "TORCH_FR_BUFFER_SIZE": "0",  # no flight-recorder hooks: nothing to record, less noise
            **self.env,
        }


def _run_rank(spec: _Spec, rank: int) -> RankCapture:
    """Run the target as ``rank`` in this process and return what it called (the environment is restored)."""
    recorder = _Recorder(rank, rank % spec.gpus_per_node, spec.checkpoints)
    saved_env = dict(os.environ)
    saved_hook = sys.excepthook  # init_process_group installs a "[rankN]" excepthook; keep the process's own
    os.environ.update(spec.rank_env(rank))
    try:
        with (
            _installed(recorder, spec.release, spec.world_size, spec.gpus_per_node, spec.cuda),
            _policy_applied(spec.policy, spec.release),
        ):
            if spec.init_backend is not None:
                dist.init_process_group(backend=spec.init_backend)
            try:
                spec.target()
            except SystemExit as exit_:  # a script ending with sys.exit(0) finished normally
                if exit_.code not in (None, 0):
                    raise CaptureError(f"rank {rank}: the captured code exited with status {exit_.code}") from None
            if spec.final_checkpoint is not None:
                recorder.ops.append(Checkpoint(spec.final_checkpoint))
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        with contextlib.suppress(Exception):
            from torch.distributed import device_mesh

            device_mesh._mesh_resources.__init__()  # type: ignore[misc]
        os.environ.clear()
        os.environ.update(saved_env)
        sys.excepthook = saved_hook
    return RankCapture(rank, tuple(recorder.ops), tuple(recorder.calls), tuple(recorder.notes))


@contextlib.contextmanager
def _policy_applied(policy: str | None, release: str) -> Iterator[None]:
    """Route the rank's group creation through ``simnccl.torch_apply.apply(policy)`` (production's path).

    Installed inside the rank, on top of the recording wrappers: torch's functions as the policy calls them are
    what gets recorded, so the Program is what real torch runs under that policy (its backend, device_id,
    pg_options such as ``lazy_init``, the groups it reuses instead of creating).
    """
    if policy is None:
        yield
        return
    from simnccl.torch_apply import apply

    with apply(policy, release=release):
        yield


def _describe_failure(rank: int, err: BaseException) -> str:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:]).rstrip()
    return f"rank {rank}: the captured code raised {type(err).__name__}: {err}\n{text}"


def _set_pdeathsig() -> None:
    """Die with the capturing process (Linux ``PR_SET_PDEATHSIG``); a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):  # non-Linux: no prctl
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _fork_rank(spec: _Spec, rank: int, log_path: str) -> tuple[int, int]:
    """Fork a child that runs ``rank`` and writes a pickled ``(ok, RankCapture | message)`` to a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(read_fd)
            _set_pdeathsig()
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
            sys.stderr = sys.stdout
            try:
                payload: tuple[bool, Any] = (True, _run_rank(spec, rank))
            except CaptureError as err:
                payload = (False, str(err))
            except BaseException as err:
                payload = (False, _describe_failure(rank, err))
            data = pickle.dumps(payload)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    tail = text.strip().splitlines()[-lines:]
    return ("\n  output:\n    " + "\n    ".join(tail)) if tail else ""


_WARM = False


def _warm_up() -> None:
    """Pay torch's lazy imports once, here, instead of once per forked rank.

    DeviceMesh slicing imports ``torch._dynamo`` (~900 modules, sympy among them: ~2 s of CPU), and the first
    group creation a few more. The warm-up imports the former and captures a 2-rank DeviceMesh build inline as
    rank 0, throwing it away; it never runs the user's code.
    """
    global _WARM
    if _WARM:
        return
    importlib.import_module("torch._dynamo")

    def startup() -> None:
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("nccl")
        mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("world",))
        mesh._unflatten(0, (1, 2), ("a", "b"), backend_override={"a": "fake"})["a", "b"]._flatten("ab")
        dist.new_group([0], backend="gloo")
        dist.all_reduce(torch.zeros(1))
        dist.barrier()

    spec = _Spec(startup, 2, 2, "2.15", {}, None, True, False, None, DEFAULT_TIMEOUT_S)
    with contextlib.redirect_stderr(io.StringIO()), _warnings_silenced():
        _run_rank(spec, 0)
    _WARM = True


@contextlib.contextmanager
def _warnings_silenced() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _run_forked(spec: _Spec, jobs: int, log_dir: str) -> list[RankCapture]:
    """Every rank in its own forked child, at most ``jobs`` at a time, each under ``spec.timeout_s``.

    Runs inside ``_intercepted()``: the children inherit the wrapped functions, and scan nothing themselves.
    """
    _warm_up()
    results: dict[int, RankCapture] = {}
    pending = list(range(spec.world_size))
    running: dict[int, tuple[int, int, float, bytearray, str]] = {}  # fd -> (rank, pid, deadline, data, log)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                rank = pending.pop(0)
                log = os.path.join(log_dir, f"rank_{rank}.log")
                pid, fd = _fork_rank(spec, rank, log)
                running[fd] = (rank, pid, time.monotonic() + spec.timeout_s, bytearray(), log)
            now = time.monotonic()
            wait_s = max(0.0, min(entry[2] for entry in running.values()) - now)
            ready, _, _ = select.select(list(running), [], [], min(wait_s, 1.0))
            for fd in ready:
                rank, pid, _, data, log = running[fd]
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    data.extend(chunk)
                    continue
                del running[fd]
                os.close(fd)
                _reap(pid)
                if not data:
                    raise CaptureError(f"rank {rank}: the capture process died without a result{_log_tail(log)}")
                ok, value = pickle.loads(bytes(data))
                if not ok:
                    raise CaptureError(f"{value}{_log_tail(log)}")
                results[rank] = value
            now = time.monotonic()
            for rank, _, deadline, _, log in list(running.values()):
                if now > deadline:
                    raise CaptureError(
                        f"rank {rank}: no result within {spec.timeout_s:g} s (the code waits for something "
                        f"that never comes: a peer, a store, or input); killed{_log_tail(log)}"
                    )
    finally:
        for fd, (_, pid, _, _, _) in running.items():
            os.close(fd)
            _reap(pid)
    return [results[r] for r in range(spec.world_size)]


class _Alarm(BaseException):
    """Raised in the main thread when an inline rank overruns its timeout.

    A BaseException, so the captured code's own ``except Exception`` cannot swallow it and run on.
    """


@contextlib.contextmanager
def _deadline(seconds: float, rank: int) -> Iterator[None]:
    """Interrupt the rank after ``seconds`` (main thread on POSIX; elsewhere it runs to completion)."""
    # Imported here: simnccl.testing pulls in the simulator, which only inline capture and simulate() need.
    from simnccl.testing.replay import _alarm

    try:
        with _alarm(seconds, f"rank {rank}", _Alarm):
            yield
    except _Alarm:
        raise CaptureError(f"rank {rank}: no result within {seconds:g} s; interrupted") from None


def _run_inline(spec: _Spec) -> list[RankCapture]:
    out = []
    for rank in range(spec.world_size):
        try:
            with _deadline(spec.timeout_s, rank):
                out.append(_run_rank(spec, rank))
        except CaptureError:
            raise
        except Exception as err:
            raise CaptureError(_describe_failure(rank, err)) from None
    return out


# ---------------------------------------------------------------------------------------------- the API


def capture(
    target: Callable[[], Any],
    world_size: int,
    *,
    gpus_per_node: int | None = None,
    release: str = "2.15",
    env: Mapping[str, str] | None = None,
    backend: str | None = None,
    device_type: str = "cuda",
    mode: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    jobs: int | None = None,
    checkpoints: bool = True,
    final_checkpoint: str | None = "end",
    policy: str | None = None,
) -> CapturedRun:
    """Run ``target()`` once per simulated rank of a ``world_size`` world and return every rank's Program.

    ``gpus_per_node`` (default: the largest divisor of ``world_size`` up to 8) sets ``LOCAL_RANK`` and the
    CUDA device count. Each rank sees the environment torchrun would give it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) plus ``env``. ``backend``: call
    ``init_process_group(backend)`` before ``target`` (for code that expects an initialised world); None:
    the target initialises it. ``release``/``env`` pick the emulated torch release's device binding and
    backend names (``TORCH_DIST_USE_NCCL2``). ``device_type="cuda"`` stands in for the CUDA queries (``"cpu"``:
    leave torch.cuda alone). ``checkpoints`` adds ``after_init`` after ``init_process_group``; a
    ``final_checkpoint`` is appended after the target returns. ``policy`` (a spec such as ``"lazy-init"``):
    each rank runs under ``simnccl.torch_apply.apply(policy)``, so the Programs are what real torch runs
    under it; the run remembers the release, env and policy its branches depended on (``check_replay``).
    """
    if not callable(target):
        raise CaptureError(f"expected a callable to capture, got {type(target).__name__} {target!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CaptureError(f"world_size: expected an integer >= 1, got {world_size!r}")
    per_node = max(d for d in range(1, 9) if world_size % d == 0) if gpus_per_node is None else gpus_per_node
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise CaptureError(f"gpus_per_node: expected an integer >= 1, got {gpus_per_node!r}")
    if world_size % per_node:
        raise CaptureError(
            f"gpus_per_node: expected a divisor of the world size {world_size} (whole nodes), got {per_node}"
        )
    try:
        get_release(release)
    except ReleaseError as err:
        raise CaptureError(f"release: {err}") from None
    if device_type not in ("cuda", "cpu"):
        raise CaptureError(f"device_type: expected 'cuda' or 'cpu', got {device_type!r}")
    chosen = mode or ("fork" if hasattr(os, "fork") else "inline")
    if chosen not in MODES:
        raise CaptureError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise CaptureError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    policy = _plain_policy(policy)
    if policy is not None:
        from simnccl.policy import PolicyError, get_policy

        try:
            get_policy(policy)
        except PolicyError as err:
            raise CaptureError(f"policy: {err}") from None
    if dist.is_initialized():
        raise CaptureError("a default process group already exists in this process; destroy it before capturing")
    spec = _Spec(
        target=target,
        world_size=world_size,
        gpus_per_node=per_node,
        release=release,
        env=dict(env or {}),
        init_backend=backend,
        cuda=device_type == "cuda",
        checkpoints=checkpoints,
        final_checkpoint=final_checkpoint,
        timeout_s=float(timeout_s),
        policy=policy,
    )
    started = time.monotonic()
    try:
        with _intercepted():  # once, for every rank and either mode (see _intercepted)
            if chosen == "fork":
                import tempfile

                with tempfile.TemporaryDirectory(prefix="simnccl-capture-") as log_dir:
                    ranks = _run_forked(spec, max(1, jobs or os.cpu_count() or 1), log_dir)
            else:
                ranks = _run_inline(spec)
    except CaptureError as err:
        if policy is None:
            raise
        raise CaptureError(
            f"{err}\n  note: the ranks ran under policy {policy!r} (simnccl.torch_apply.apply, as production "
            f"would), emulating torch {release}: the captured code meets what real torch does under that policy"
        ) from None
    return _assemble(spec, ranks, chosen, time.monotonic() - started)


def capture_scaled(target: Callable[[], Any], world_sizes: Sequence[int], **kwargs: Any) -> dict[int, CapturedRun]:
    """Capture the same code at several world sizes: the code is what scales, so each world is re-run."""
    return {w: capture(target, w, **kwargs) for w in world_sizes}


def _assemble(spec: _Spec, ranks: Sequence[RankCapture], mode: str, wall_s: float) -> CapturedRun:
    """The run: ranks with identical ops share one Program object (DESIGN rule 8), as in a generated case."""
    from simnccl.testing.replay import share_identical  # see _deadline: the simulator, imported when needed

    shared: dict[int, Program] = {}
    programs = tuple(shared.setdefault(id(ops), Program(ops)) for ops in share_identical([r.ops for r in ranks]))
    notes: list[str] = []
    for r in ranks:
        for note in r.notes:
            if note not in notes:
                notes.append(note)
    if not any(isinstance(op, InitProcessGroup) for p in shared.values() for op in p.ops):
        notes.append("no rank called init_process_group: nothing distributed was captured")
    unmodelled = unmodelled_options(list(shared.values()))
    if unmodelled:
        notes.append(_unmodelled_text(unmodelled))
    return CapturedRun(
        world_size=spec.world_size,
        gpus_per_node=spec.gpus_per_node,
        release=spec.release,
        env=dict(spec.env),
        programs=programs,
        calls=tuple(r.calls for r in ranks),
        notes=tuple(notes),
        mode=mode,
        wall_s=wall_s,
        policy=spec.policy,
    )


# ---------------------------------------------------------------------------------------------- command line


def script_target(module: str | None, path: str | None, argv: Sequence[str]) -> Callable[[], None]:
    """A target running ``-m module`` or ``script.py`` as ``__main__`` with ``argv`` (fresh in each rank)."""

    def run() -> None:
        saved = sys.argv[:]
        try:
            if module is not None:
                sys.argv = [module, *argv]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                assert path is not None
                sys.argv = [path, *argv]
                runpy.run_path(path, run_name="__main__")
        finally:
            sys.argv = saved

    return run


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simnccl.capture``: the same command as ``simnccl capture`` (``simnccl.capture_cli``)."""
    from simnccl.capture_cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

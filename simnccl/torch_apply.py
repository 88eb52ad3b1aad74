"""Apply a simnccl policy to real ``torch.distributed`` in this process.

This is the production entry point: it imports torch at module level, so nothing on ``import simnccl``'s path
imports it (``simnccl.policy`` is pure and does not know this module: no import circle).

Usage::

    from simnccl.tags import group_tags
    from simnccl.torch_apply import apply

    with apply("dedupe+lazy-single-rank") as applied:   # installed here, uninstalled on exit
        dist.init_process_group("nccl", device_id=local_device)
        with group_tags(purpose="tp"):
            tp = dist.new_group(tp_ranks)
        with group_tags(purpose="pp", traffic="p2p"):       # the same code runs without apply()
            pp = dist.new_group(pp_ranks)
    print(applied.decisions)

``install(policy)`` / ``uninstall(applied)`` (or ``applied.uninstall()``) do the same without a ``with``
block; ``apply`` *is* ``install`` plus context-manager exit, so ``applied = apply(...)`` alone also installs.
One policy at a time per process: installing while one is installed raises ``ApplyError``.

What is routed, and how (the same semantics as the simulator's ``simnccl.engine.policy_gate.PolicyGate``
``init``, ``group``, ``effective_op``):

* ``init_process_group``: an ``InitRequest`` (release from ``torch.__version__``, env = ``os.environ``, the
  caller's backend / device_id / pg_options); the plan's env knobs are set in ``os.environ`` *before* the
  original runs (``TORCH_DIST_USE_NCCL2`` is read once, at the first use of ``"nccl"`` in the process), and
  restored on uninstall; torch receives the plan's backend, device_id and pg_options.
* ``new_group``: a ``GroupRequest`` (ranks sorted as torch sorts them, this rank, world size, the
  process's ``History``), ``decide_group``, ``History.record``; then either the earlier identical group is
  returned without calling torch (``reuse``), or the original runs with exactly the decision's backend,
  pg_options, use_local_synchronization and device_id, the caller's other arguments untouched. Invalid rank
  lists and non-members of a ``use_local_synchronization`` group go straight to torch (torch raises, or
  returns ``NON_GROUP_MEMBER``, before anything a policy could change) and are not recorded.
* ``split_group``: the policy decides each split of the call in order (every parent rank sees every split,
  so every rank's history stays identical), all are recorded, and the caller gets its own split's decision
  (``split_ranks[0]``'s when it is in none, as torch does). ``split_group`` is collective over the parent
  and keeps the parent's backend, so: a changed backend, ``use_local_synchronization`` or ``device_id`` is
  not expressible there and is reverted (the explanation says so); ``reuse`` returns earlier groups only
  when *every* split of the call is reused, otherwise the reused splits are created anew.

Tags (``simnccl.tags``): production code says what a group is for with ``with group_tags(purpose=...,
traffic=...)`` around the plain torch call (or ``simnccl.tags.new_group``), which runs unchanged without this
module. The wrapped functions also accept them as extra keyword arguments, stripped before torch sees them
(only while a policy is installed; plain torch rejects them):
``purpose=`` (free tag: ``"tp"``, ``"pp"``, ``"dp"`` …; ``nccl-lazy-p2p`` treats ``pp``/``pipeline``/``p2p``/
``embedding`` as point-to-point) and ``traffic=`` (``"collectives"``, ``"p2p"`` or ``"none"``: what the caller
will do on the group). Both become ``GroupRequest.purpose`` / ``.traffic``.

pg_options: the policy speaks ``simnccl.ops.PgOptions`` (``lazy_init``, ``split_share``,
``is_high_priority_stream``). When the decision equals what the caller asked for, the caller's own object is
passed through untouched; otherwise, for an NCCL-family backend (``nccl``, ``nccl2``, ``nccl-lazy``,
``nccl-legacy``, or a device string with such a leg) a fresh ``ProcessGroupNCCL.Options`` is built (other
fields copied from the caller's Options, if any); a non-NCCL backend has no such fields: the caller's object
is passed through untouched, or none at all when the policy changed the backend (to ``fake``, ``gloo``).

The request's backend is the backend torch will really use: the caller's, else the default group's
(``"undefined"`` resolved through ``BackendConfig`` when it names one backend). A device string such as
``"cpu:gloo,cuda:nccl"`` stays as is, which built-in policies leave alone.

Not checked here (the simulator checks it): that all members reach the same plan. A policy whose members
disagree hangs or crashes real torch.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from simnccl.comm_memory import Pricer, nccl_env
from simnccl.ops import BOOL_OPTION_FIELDS, MIB, NCCL_CONFIG_FIELDS, NO_OPTIONS, OPTION_FIELDS, PgOptions
from simnccl.policy import (
    NCCL_NAMES,
    GroupDecision,
    GroupRequest,
    History,
    InitPlan,
    InitRequest,
    Policy,
    ask_init,
    decide_group,
    decide_split,
    get_policy,
    reused_group_among,
)
from simnccl.profiles import Profile, find_profile, get_profile
from simnccl.release import RELEASES
from simnccl.tags import check_traffic, current_tags

__all__ = [
    "PATCHED_FUNCTIONS",
    "Applied",
    "AppliedCall",
    "ApplyError",
    "apply",
    "current",
    "install",
    "modelled_options",
    "release_key",
    "uninstall",
]

PATCHED_FUNCTIONS = ("init_process_group", "new_group", "split_group", "destroy_process_group")
# Modules whose attribute is the original function (callers use all of them; device_mesh binds the names
# at import, which happens inside ``import torch.distributed``).
PATCHED_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d", "torch.distributed.device_mesh")
EXTRA_KWARGS = ("purpose", "traffic")
NCCL_CONFIG_UNDEF_INT = -2147483648  # NCCL_CONFIG_UNDEF_INT: ncclConfig_t field left to NCCL / its env var

_LOCK = threading.Lock()
_INSTALLED: Applied | None = None


class ApplyError(RuntimeError):
    """The policy cannot be applied (unknown torch release, already installed, a plan torch can't express)."""


def release_key(version: str | None = None) -> str:
    """The simnccl release key of a torch version string: ``2.14.x`` → ``"2.14"``, ``2.15.x`` (incl. dev and
    alpha builds) → ``"2.15"``, ``2.16.x`` → ``"2.16-dev"``."""
    text = torch.__version__ if version is None else version
    match = re.match(r"^(\d+)\.(\d+)", str(text))
    key = {(2, 14): "2.14", (2, 15): "2.15", (2, 16): "2.16-dev"}.get(
        (int(match.group(1)), int(match.group(2))) if match else (-1, -1)
    )
    if key is None:
        raise ApplyError(f"torch {text} is not a release simnccl models; expected 2.14.x, 2.15.x or 2.16.x")
    return key


@dataclass(frozen=True, slots=True)
class AppliedCall:
    """One routed call: what the policy decided, and whether torch was called at all."""

    kind: str  # "init_process_group" | "new_group" | "split_group"
    ranks: tuple[int, ...] | None  # None for init
    decision: GroupDecision | InitPlan
    torch_called: bool


@dataclass(eq=False)
class Applied:
    """An installed policy: the process's ``History``, the decisions made, what was patched and set."""

    policy: Policy
    release: str
    gpu: str | None = None  # simnccl GPU kind: its profile prices an eager group for cost-aware policies
    # The profile that prices it (``install(profile=...)``, a calibrated one say); None: the kind's built-in one.
    profile: Profile | None = None
    history: History = field(default_factory=History)
    decisions: list[AppliedCall] = field(default_factory=list)
    # env knob -> the value before this installation first set it (None: it was unset)
    env_set: dict[str, str | None] = field(default_factory=dict)
    active: bool = False
    originals: dict[tuple[str, str], Callable[..., Any]] = field(default_factory=dict)
    wrappers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    # ((ranks, backend or "", PgOptions), the group torch returned or NON_GROUP_MEMBER), in creation order
    groups: list[tuple[tuple[tuple[int, ...], str, PgOptions], Any]] = field(default_factory=list)
    # a group a reuse returned -> how many calls it was returned to beyond the one that created it (its handles)
    extra_handles: dict[Any, int] = field(default_factory=dict)
    _env_values: dict[str, str] = field(default_factory=dict)
    # (ranks per node, NCCL environment) -> (its pricer, that environment as a mapping): ``eager_group_mib``
    _pricers: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Pricer, dict[str, str]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def uninstall(self) -> None:
        """Restore the original functions and the environment; idempotent."""
        global _INSTALLED
        with _LOCK:
            if not self.active:
                return
            self.active = False
            for (module_name, attr), original in self.originals.items():
                module = _module(module_name)
                # Restore only where our wrapper is still in place: a later patch on top stays (our wrapper,
                # now inactive, passes straight through to the original).
                if module is not None and getattr(module, attr, None) is self.wrappers[attr]:
                    setattr(module, attr, original)
            for name, before in self.env_set.items():
                if os.environ.get(name) != self._env_values[name]:
                    continue  # changed by someone else since: leave it
                if before is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = before
            if _INSTALLED is self:
                _INSTALLED = None

    def eager_group_mib(
        self, ranks: Sequence[int] = (0,), options: PgOptions = NO_OPTIONS, world_size: int = 1
    ) -> float | None:
        """What an eager creation of a group of ``ranks`` costs its most expensive member's device, by the GPU
        kind's profile (``Pricer.eager_group_bytes``), the ranks laid out ``LOCAL_WORLD_SIZE`` to a node as a
        launcher (torchrun, ``simnccl.real``) sets it, the whole world on one node when unset (None: no kind)."""
        if self.gpu is None:
            return None
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        except ValueError:
            local = max(1, world_size)
        # One pricer per (node size, NCCL environment): os.environ changes in place, so the pricer is handed a
        # mapping of its NCCL part that stays as it was.
        key = (local, nccl_env(os.environ))
        known = self._pricers.get(key)
        if known is None:
            profile = self.profile if self.profile is not None else find_profile(self.gpu, self.release)
            pricer = Pricer(profile, lambda rank: rank // local)
            known = self._pricers[key] = (pricer, dict(key[1]))
        pricer, env = known
        return pricer.eager_group_bytes(tuple(ranks), env, options) / MIB

    def original(self, name: str) -> Callable[..., Any]:
        return self.originals[("torch.distributed.distributed_c10d", name)]

    # ------------------------------------------------------------------ init_process_group

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        original = self.original("init_process_group")
        if not self.active:
            return original(*args, **kwargs)
        bound = _SIGNATURES["init_process_group"].bind(*args, **kwargs)
        given = bound.arguments
        backend = given.get("backend")
        device_id = given.get("device_id")
        caller_options = given.get("pg_options")
        request = InitRequest(
            rank=_int_or(given.get("rank", -1), os.environ.get("RANK")),
            world_size=_int_or(given.get("world_size", -1), os.environ.get("WORLD_SIZE")),
            release=self.release,
            env=os.environ,
            backend=None if backend is None else str(backend),
            device_id=_device_key(device_id),
            pg_options=modelled_options(caller_options),
        )
        plan = ask_init(self.policy, request)  # a user's policy that raises or answers no plan is named
        for name, value in plan.env.items():
            if name not in self.env_set:
                self.env_set[name] = os.environ.get(name)
            os.environ[name] = value
            self._env_values[name] = value
        if plan.backend != request.backend:
            given["backend"] = plan.backend
        if plan.device_id != request.device_id:
            given["device_id"] = _init_device(plan.device_id)
        if plan.backend == "fake":
            _register_fake()
        target = _init_backend_name(given.get("backend"), given.get("device_id"))
        given["pg_options"] = _options_for(
            target,
            plan.pg_options,
            request.pg_options,
            caller_options,
            backend_changed=plan.backend != request.backend,
        )
        self.decisions.append(AppliedCall("init_process_group", None, plan, True))
        return original(*bound.args, **bound.kwargs)

    # ------------------------------------------------------------------ new_group

    def new_group(self, *args: Any, purpose: str | None = None, traffic: str | None = None, **kwargs: Any) -> Any:
        original = self.original("new_group")
        if not self.active:
            return original(*args, **kwargs)
        purpose, traffic = _tags(purpose, traffic)
        if not dist.is_initialized():
            return original(*args, **kwargs)  # torch raises its own error
        bound = _SIGNATURES["new_group"].bind(*args, **kwargs)
        given = bound.arguments
        _kept_once(given, "ranks")
        rank = dist.get_rank()
        world_size = dist.get_world_size()
        members = _members(given.get("ranks"), world_size, given.get("sort_ranks", True))
        if members is None:
            return original(*bound.args, **bound.kwargs)  # invalid ranks: torch raises before a policy could matter
        local_sync = bool(given.get("use_local_synchronization", False))
        if local_sync and rank not in members:
            return original(*bound.args, **bound.kwargs)  # NON_GROUP_MEMBER before anything a policy changes
        caller_backend = given.get("backend")
        default_backend = str(c10d._world.pg_map[c10d._get_default_group()][0])
        request_backend = _resolved(str(c10d.Backend(caller_backend)) if caller_backend else default_backend)
        caller_options = given.get("pg_options")
        request = GroupRequest(
            kind="new_group",
            ranks=members,
            rank=rank,
            world_size=world_size,
            release=self.release,
            env=os.environ,
            backend=request_backend,
            pg_options=modelled_options(caller_options),
            use_local_synchronization=local_sync,
            purpose=purpose,
            traffic=traffic,
            history=self.history,
            eager_group_mib=self.eager_group_mib(members, modelled_options(caller_options), world_size),
        )
        decision = decide_group(self.policy, request)
        self.history.record(request, decision)
        if decision.reuse is not None:
            self.decisions.append(AppliedCall("new_group", members, decision, False))
            return self._reused(decision, rank)
        backend_changed = decision.backend != request.backend
        if backend_changed:
            given["backend"] = decision.backend
        if decision.backend == "fake":
            _register_fake()
        given["pg_options"] = _options_for(
            decision.backend or request_backend,
            decision.pg_options,
            request.pg_options,
            caller_options,
            backend_changed=backend_changed,
        )
        if decision.use_local_synchronization != local_sync:
            given["use_local_synchronization"] = decision.use_local_synchronization
        if decision.device_id is not None:
            given["device_id"] = _group_device(decision.device_id)
        self.decisions.append(AppliedCall("new_group", members, decision, True))
        group = original(*bound.args, **bound.kwargs)
        self.groups.append((_group_key(members, decision), group))
        return group

    def _reused(self, decision: GroupDecision, rank: int) -> Any:
        ranks = decision.reuse
        assert ranks is not None
        if rank not in ranks:
            return dist.GroupMember.NON_GROUP_MEMBER
        # By the simulator's rule (``reused_group_among``), over the live groups this process made with those ranks.
        _, backend, options = _group_key(ranks, decision)
        live = ((name, opts, g) for (members, name, opts), g in self.groups if members == ranks and _live(g))
        group = reused_group_among(live, backend, options)
        if group is None:
            raise ApplyError(
                f"policy {self.policy.name!r} reuses group {list(ranks)} ({decision.explanation}), but this process "
                "holds no live group with those ranks created under this policy (destroyed, or created before "
                "the policy was installed)"
            )
        self.extra_handles[group] = self.extra_handles.get(group, 0) + 1
        return group

    # ------------------------------------------------------------------ destroy_process_group

    def destroy_process_group(self, *args: Any, **kwargs: Any) -> None:
        """torch's destroy, except for a group a reuse returned to more than one call: destroying one of those
        handles only drops it, and the group is destroyed with its last one. A destroy that happens is recorded
        in the ``History`` (``record_destroy``), so a policy never reuses the group. As the simulator's
        ``PolicyGate.drops_handle`` and ``destroyed``.

        Why: under torch's default each of those calls made its own group, so a program may destroy one and keep
        using another; torch's destroy of the shared object broke that program, and the policy, deciding on a
        history that kept the destroyed group, reused it (ApplyError) where torch's default made a new one."""
        original = self.original("destroy_process_group")
        if not self.active or not dist.is_initialized():
            return original(*args, **kwargs)
        group = _SIGNATURES["destroy_process_group"].bind(*args, **kwargs).arguments.get("group")
        world = group is None or group is c10d._get_default_group()
        if not world and (group is dist.GroupMember.NON_GROUP_MEMBER or group not in c10d._world.pg_map):
            return original(*args, **kwargs)  # torch returns or raises its own error
        extra = 0 if world else self.extra_handles.get(group, 0)
        if extra:
            self.extra_handles[group] = extra - 1
            return None
        result = original(*args, **kwargs)
        if world:
            self.extra_handles.clear()
            self.history.record_destroy(None)
        else:
            self.extra_handles.pop(group, None)
            ranks = next((key[0] for key, made in self.groups if made is group), None)
            if ranks is not None:  # a group made before the policy was installed is none of its history's
                self.history.record_destroy(ranks)
        return result

    # ------------------------------------------------------------------ split_group

    def split_group(self, *args: Any, purpose: str | None = None, traffic: str | None = None, **kwargs: Any) -> Any:
        original = self.original("split_group")
        if not self.active:
            return original(*args, **kwargs)
        purpose, traffic = _tags(purpose, traffic)
        if not dist.is_initialized():
            return original(*args, **kwargs)
        bound = _SIGNATURES["split_group"].bind(*args, **kwargs)
        given = bound.arguments
        _kept_once(given, "split_ranks")
        default_pg = c10d._get_default_group()
        parent = given.get("parent_pg") or default_pg
        splits = _global_splits(parent, given.get("split_ranks"), default_pg.size())
        if splits is None:
            return original(*bound.args, **bound.kwargs)  # torch raises its own error
        rank = dist.get_rank()
        own = next((i for i, split in enumerate(splits) if rank in split), None)
        caller_backend = given.get("backend")
        parent_backend = str(c10d._world.pg_map[parent][0])
        request_backend = _resolved(str(c10d.Backend(caller_backend)) if caller_backend else parent_backend)
        caller_options = given.get("pg_options")
        requested = modelled_options(caller_options)
        world_size = dist.get_world_size()
        requests = [
            GroupRequest(
                kind="split_group",
                ranks=split,
                rank=rank,
                world_size=world_size,
                release=self.release,
                env=os.environ,
                backend=request_backend,
                pg_options=requested,
                use_local_synchronization=False,
                purpose=purpose,
                traffic=traffic,
                history=self.history,
                eager_group_mib=self.eager_group_mib(split, requested, world_size),
            )
            for split in splits
        ]
        decisions = decide_split(self.policy, requests)
        all_reused = all(d.reuse is not None for d in decisions)
        for r, d in zip(requests, decisions, strict=True):
            self.history.record(r, d)
        mine = decisions[0 if own is None else own]
        ranks = splits[0 if own is None else own]
        if all_reused:
            self.decisions.append(AppliedCall("split_group", ranks, mine, False))
            return self._reused(mine, rank)
        given["pg_options"] = _options_for(
            request_backend, mine.pg_options, requested, caller_options, backend_changed=False
        )
        self.decisions.append(AppliedCall("split_group", ranks, mine, True))
        group = original(*bound.args, **bound.kwargs)
        if own is not None:
            self.groups.append((_group_key(ranks, mine), group))
        return group


# ---------------------------------------------------------------------------------------------------------
# install / uninstall


def install(
    policy: Policy | str,
    *,
    release: str | None = None,
    gpu: str | None = None,
    profile: Profile | str | os.PathLike[str] | None = None,
) -> Applied:
    """Route ``init_process_group``, ``new_group`` and ``split_group`` through ``policy`` in this process.

    ``release`` overrides the simnccl release key derived from ``torch.__version__``; ``gpu`` names the simnccl
    GPU kind whose profile prices an eager group (``budget(X)``); ``profile`` (a ``Profile``, a built-in name or a
    profile file, such as one ``simnccl real calibrate`` wrote) prices it instead of the kind's built-in profile,
    and names the kind. Why ``profile``: a simulation run with a calibrated profile decides ``budget(X)`` by its
    prices; production pricing by the built-in one could decide otherwise, so the run that was proven would not
    be the run made. Raises ``ApplyError`` when a policy is already installed, when no profile models ``gpu`` on
    this release, or when ``profile`` cannot be read, is for another kind than ``gpu``, or does not cover the
    release.
    """
    global _INSTALLED
    if not dist.is_available():
        raise ApplyError("torch.distributed is not available in this torch build")
    resolved = get_policy(policy)  # an object or a class is checked as a loaded spec is (PolicyError)
    if release is not None and release not in RELEASES:
        raise ApplyError(f"apply(release={release!r}): expected one of {', '.join(RELEASES)}")
    if profile is not None and not isinstance(profile, Profile | str | os.PathLike):
        raise ApplyError(f"apply(profile={profile!r}): expected a Profile, a built-in profile name or a file path")
    key = release_key() if release is None else release
    with _LOCK:
        if _INSTALLED is not None:
            raise ApplyError(
                f"policy {_INSTALLED.policy.name!r} is already installed in this process; uninstall it first "
                f"(applied.uninstall()) before installing {resolved.name!r}"
            )
        pricing = None if profile is None else _pricing_profile(profile, gpu, key)
        if pricing is not None:
            gpu = pricing.gpu
        elif gpu is not None:
            try:
                find_profile(gpu, key)
            except ValueError as err:
                raise ApplyError(f"apply(gpu={gpu!r}): {err}") from None
        applied = Applied(policy=resolved, release=key, gpu=gpu, profile=pricing)
        applied.wrappers = {name: _wrapper(applied, name) for name in PATCHED_FUNCTIONS}
        for name in PATCHED_FUNCTIONS:
            original = getattr(c10d, name)
            for module_name in PATCHED_MODULES:
                module = _module(module_name)
                if module is not None and getattr(module, name, None) is original:
                    applied.originals[(module_name, name)] = original
                    setattr(module, name, applied.wrappers[name])
            applied.originals.setdefault(("torch.distributed.distributed_c10d", name), original)
        applied.active = True
        _INSTALLED = applied
    return applied


def _pricing_profile(profile: Profile | str | os.PathLike[str], gpu: str | None, release: str) -> Profile:
    """``install``'s ``profile``, read and checked as a scenario's ``[torch] profile`` is (ApplyError)."""
    if isinstance(profile, Profile):
        found = profile
    else:
        try:
            found = get_profile(profile)
        except ValueError as err:
            raise ApplyError(f"apply(profile={os.fspath(profile)!r}): {err}") from None
    if gpu is not None and found.gpu != gpu:
        raise ApplyError(f"apply(gpu={gpu!r}, profile=...): profile {found.name!r} is for GPU {found.gpu!r}")
    if release not in found.releases:
        raise ApplyError(
            f"apply(profile=...): profile {found.name!r} does not cover torch release {release!r} "
            f"(it covers {', '.join(found.releases)})"
        )
    return found


def uninstall(applied: Applied | None = None) -> None:
    """Uninstall ``applied`` (default: the installed one, if any). Idempotent."""
    target = applied if applied is not None else _INSTALLED
    if target is not None:
        target.uninstall()


def apply(
    policy: Policy | str,
    *,
    release: str | None = None,
    gpu: str | None = None,
    profile: Profile | str | os.PathLike[str] | None = None,
) -> Applied:
    """``install(policy)``, returned as a context manager that uninstalls on exit."""
    return install(policy, release=release, gpu=gpu, profile=profile)


def current() -> Applied | None:
    """The installed policy of this process, if any."""
    return _INSTALLED


def _wrapper(applied: Applied, name: str) -> Callable[..., Any]:
    method = getattr(applied, name)
    original = getattr(c10d, name)

    def routed(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    routed.__name__ = name
    routed.__qualname__ = name
    routed.__doc__ = f"simnccl policy {applied.policy.name!r} routing of torch.distributed.{name}.\n\n" + (
        original.__doc__ or ""
    )
    routed.__wrapped__ = original  # type: ignore[attr-defined]
    return routed


def _module(name: str) -> Any:
    return sys.modules.get(name)


# ---------------------------------------------------------------------------------------------------------
# helpers: requests


_SIGNATURES = {name: inspect.signature(getattr(c10d, name)) for name in PATCHED_FUNCTIONS}


def _tags(purpose: str | None, traffic: str | None) -> tuple[str | None, str | None]:
    """The call's own tag arguments, else those of the enclosing ``simnccl.tags.group_tags`` block."""
    check_traffic(traffic)
    around_purpose, around_traffic = current_tags()
    return (purpose if purpose is not None else around_purpose, traffic if traffic is not None else around_traffic)


def _int_or(value: Any, fallback: str | None) -> int:
    if isinstance(value, int) and value >= 0:
        return value
    try:
        return int(fallback) if fallback is not None else -1
    except ValueError:
        return -1


def _device_key(device_id: Any) -> int | str | None:
    """A torch device as the policy sees it: an int stays an int, a ``torch.device`` becomes ``"cuda:0"``."""
    if device_id is None or isinstance(device_id, int):
        return device_id
    return str(device_id)


def _init_device(device_id: int | str | None) -> Any:
    if device_id is None or isinstance(device_id, int):
        return device_id
    return torch.device(device_id)


def _kept_once(given: dict[str, Any], name: str) -> None:
    """Argument ``name`` as a list when the caller passed a one-pass iterator (``map(int, ranks)``, a generator):
    the policy's reading of it must not leave torch an exhausted one. Why: ``new_group(map(int, ["0"]))``, which
    torch takes, raised "Group rank must be specified" under the no-op policy. Anything that can be read twice
    (a list, a range, an array) reaches torch as given; for ``split_ranks``, each split the same way."""
    value = given.get(name)
    if _one_pass(value):
        value = given[name] = list(value)
    if name == "split_ranks" and isinstance(value, list | tuple) and any(map(_one_pass, value)):
        given[name] = [list(split) if _one_pass(split) else split for split in value]


def _one_pass(value: object) -> bool:
    """Whether ``value`` is an iterator: reading it once leaves nothing for the next reader."""
    try:
        return iter(value) is value  # type: ignore[call-overload]
    except TypeError:
        return False


def _group_device(index: int | str) -> torch.device:
    """``new_group`` takes a ``torch.device``; an index is on the default group's device type, a string is a
    device torch names (``"cuda:0"``: a decision may give either, as the simulator takes either)."""
    if isinstance(index, str):
        return torch.device(index)
    bound = c10d._get_default_group().bound_device_id
    if bound is not None:
        return torch.device(bound.type, index)
    accelerator = torch.accelerator.current_accelerator()
    return torch.device(accelerator.type if accelerator is not None else "cpu", index)


def _members(ranks: Sequence[int] | None, world_size: int, sort_ranks: bool) -> tuple[int, ...] | None:
    """The group's global ranks as torch orders them, or None where torch will raise."""
    if ranks is None:
        return tuple(range(world_size))
    try:
        members = [int(r.__index__()) for r in ranks]
    except (TypeError, AttributeError):
        return None
    if sort_ranks:
        members.sort()
    if not members or len(set(members)) != len(members) or len(members) > world_size:
        return None
    if any(r < 0 or r >= world_size for r in members):
        return None
    return tuple(members)


def _global_splits(parent: Any, split_ranks: Any, world_size: int) -> list[tuple[int, ...]] | None:
    """Every split of a ``split_group`` call in global ranks (order kept), or None where torch will raise."""
    if not split_ranks:
        return None
    to_group = c10d._world.pg_group_ranks.get(parent)
    if to_group is None or dist.get_rank() not in to_group:
        return None
    to_global = {group_rank: global_rank for global_rank, group_rank in to_group.items()}
    splits: list[tuple[int, ...]] = []
    for split in split_ranks:
        try:
            ranks = tuple(to_global[int(r.__index__())] for r in split)
        except (TypeError, AttributeError, KeyError):
            return None
        if not ranks or len(ranks) > world_size or len(set(ranks)) != len(ranks):
            return None
        splits.append(ranks)
    return splits


def _resolved(backend: str) -> str:
    """``"undefined"`` is what BackendConfig makes of it when that is one backend; anything else as given."""
    if backend != c10d.Backend.UNDEFINED:
        return backend
    names = set(c10d.BackendConfig(c10d.Backend(backend)).get_device_backend_map().values())
    return str(next(iter(names))) if len(names) == 1 else backend


def _init_backend_name(backend: Any, device_id: Any) -> str:
    """The backend ``init_process_group`` will build, as far as pg_options are concerned."""
    if backend:
        return _resolved(str(c10d.Backend(str(backend))))
    if device_id is not None:
        accelerator = torch.accelerator.current_accelerator()
        if isinstance(device_id, int):
            device_type = accelerator.type if accelerator is not None else "cpu"
        else:
            device_type = torch.device(device_id).type
        return str(c10d.Backend.default_device_backend_map.get(device_type, c10d.Backend.UNDEFINED))
    return _resolved(c10d.Backend.UNDEFINED)


def _nccl_family(backend: str | None) -> bool:
    if not backend:
        return False
    if ":" not in backend:
        return backend in NCCL_NAMES
    return any(pair.partition(":")[2] in NCCL_NAMES for pair in backend.split(","))


def _group_key(ranks: tuple[int, ...], decision: GroupDecision) -> tuple[tuple[int, ...], str, PgOptions]:
    return (ranks, decision.backend or "", decision.pg_options)


def _live(group: Any) -> bool:
    return group is not None and group in c10d._world.pg_map


# ---------------------------------------------------------------------------------------------------------
# helpers: pg_options


def modelled_options(options: Any) -> PgOptions:
    """The ``PgOptions`` view of a caller's pg_options object (None: the defaults): every field it sets.

    Public because ``simnccl.capture`` records pg_options with it: one reading of torch's Options for both.
    Fields are read by their torch names from the Options object or its ``.config`` (NCCLConfig); an NCCLConfig
    field left at ``NCCL_CONFIG_UNDEF_INT`` (or ``None``) is "not set". A field this torch build lacks is unset.
    """
    if options is None:
        return NO_OPTIONS
    if isinstance(options, PgOptions):
        return options
    config = getattr(options, "config", None)
    values: dict[str, Any] = {}
    for name in OPTION_FIELDS:
        source = config if name in NCCL_CONFIG_FIELDS else options
        raw = getattr(source, name, None)
        if raw is None or raw == NCCL_CONFIG_UNDEF_INT or not isinstance(raw, bool | int | str):
            continue
        values[name] = bool(raw) if name in BOOL_OPTION_FIELDS else raw
    return PgOptions(**values)


_COPIED_FIELDS = ("_timeout", "config", "enable_reconfigure", "use_pg_for_symm_mem_rendezvous")


def _nccl_options(options: PgOptions, base: Any) -> Any:
    """A fresh ``ProcessGroupNCCL.Options`` with the plan's fields (others copied from the caller's)."""
    nccl_options = dist.ProcessGroupNCCL.Options()
    if isinstance(base, dist.ProcessGroupNCCL.Options):
        for name in _COPIED_FIELDS:
            try:
                setattr(nccl_options, name, getattr(base, name))
            except (AttributeError, TypeError):  # a field this build lacks
                continue
    nccl_options.lazy_init = options.lazy_init
    nccl_options.is_high_priority_stream = options.is_high_priority_stream
    nccl_options.config.split_share = NCCL_CONFIG_UNDEF_INT if options.split_share is None else int(options.split_share)
    for name, value in options.to_dict().items():  # every other field the plan sets (max_ctas, net_name ...)
        setattr(nccl_options.config if name in NCCL_CONFIG_FIELDS else nccl_options, name, value)
    return nccl_options


def _options_for(
    backend: str | None,
    decided: PgOptions,
    requested: PgOptions,
    caller_options: Any,
    *,
    backend_changed: bool,
) -> Any:
    """The pg_options object torch receives for a decision on ``backend``."""
    if _nccl_family(backend):
        if decided == requested:
            return caller_options  # untouched (torch judges a foreign options object itself)
        if decided == NO_OPTIONS and caller_options is None:
            return None
        return _nccl_options(decided, caller_options)
    # gloo, fake, ...: PgOptions are ProcessGroupNCCL.Options fields, which these backends don't have (lazy-init
    # asks for lazy_init on any default group). The caller's own object stays; a policy-chosen backend gets none.
    return None if backend_changed else caller_options


def _register_fake() -> None:
    """torch registers the ``fake`` backend only when its testing module is imported (reference §F.1)."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

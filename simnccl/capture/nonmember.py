"""``new_group`` for a rank outside the new group: exactly what torch does there, without torch's bookkeeping.

Why: a world of W ranks makes every rank call ``new_group`` for every group of every family (Megatron-Core at
TP8·PP4·DP16: ~2,900 calls per rank), and a rank belongs to a few dozen of them. For each of the others torch
2.15 walks ~15 small functions (``_new_group_with_tag``, ``_new_process_group_helper``, ``_get_split_source``,
``_get_default_group`` five times...) to end where it began: half a captured rank's CPU, for a result known
after the membership test. This module does what that path leaves behind and nothing else.

What torch 2.15 observably does for a non-member (``distributed_c10d.py``, ``new_group`` →
``_new_group_with_tag`` → ``_new_process_group_helper``), and what this does instead:

* validates its arguments (default group, device, backend, timeout, ranks: ints, no duplicates, in range) —
  checked here too; any call torch would reject, warn about or treat differently goes to torch itself;
* names the group after ``_world.group_count`` (refusing a name already taken) and increments the count —
  done here, the name checked the same way;
* when the default group is bound to a device and the options are not ``lazy_init``, looks up the split
  source (``_get_backend`` on the bound device: an idempotent cache in C++) and, when it splits, asks it for a
  no-colour split — done here up to the lookup; the split is skipped only where it is the stand-in backend's,
  which does nothing (``StandInBackend.perform_nocolor_split``); any other backend goes to torch;
* sets ``_world.pg_group_ranks[GroupMember.NON_GROUP_MEMBER]`` to the group's global → group rank map — done;
* runs a store barrier when ``TORCH_DIST_INIT_BARRIER=1`` — such calls go to torch;
* counts the call on the ``pytorch.wait_counter.c10d.new_group`` wait counter — done;
* returns ``GroupMember.NON_GROUP_MEMBER`` — returned.

A member's call, ``use_local_synchronization``, an explicit ``device_id``, a timeout that is not a timedelta,
ranks that are not a list/tuple/range, a default group with its own ``new_group``, a patched torch function:
all go to torch. The shortcut applies only to the torch whose code it was checked against: the digest of
those functions' source must be the one ``simnccl/data/torch_checked.toml`` records (a different torch, even
one line changed, gets torch's own path, only slower). ``tests/test_capture_nonmember.py`` pins it: the same
calls with the shortcut on and off leave torch's state and the captured Program identical.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import inspect
import operator
import os
import tomllib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from torch.distributed import c10d_logger
from torch.distributed import distributed_c10d as c10d
from torch.monitor import _WaitCounter

from simnccl.capture.standin import StandInBackend

DATA_FILE = "simnccl/data/torch_checked.toml"
TORCH = object()  # "not a call the shortcut covers: call torch"

# torch's functions on a non-member's new_group path, by name in distributed_c10d: the digest covers their
# source, and each call checks that none of them was replaced since (a patch would not run under the shortcut).
CHECKED_FUNCTIONS = (
    "_new_group_with_tag",
    "_new_process_group_helper",
    "_process_group_name",
    "_get_split_source",
    "_get_default_group",
    "_is_barrier_after_init",
    "_check_valid_timeout",
    "is_initialized",
)

_COUNTER = _WaitCounter("pytorch.wait_counter.c10d.new_group")  # what torch's _time_logger counts the call on
_enabled = True  # tests switch the shortcut off to compare with torch's own path


def source_digest() -> str:
    """sha256 of the source of torch's non-member ``new_group`` path (``CHECKED_FUNCTIONS``, ``new_group``
    itself, its ``_time_logger`` wrapper, ``Backend.__new__``), as the installed torch has it."""
    parts = [
        c10d.new_group.__wrapped__,  # type: ignore[attr-defined]
        c10d_logger._time_logger,
        c10d.Backend.__new__,
        *(getattr(c10d, name) for name in CHECKED_FUNCTIONS),
    ]
    digest = hashlib.sha256()
    for function in parts:
        digest.update(inspect.getsource(function).encode("utf-8"))
    return digest.hexdigest()


@functools.cache
def _checked_digests() -> frozenset[str]:
    text = (importlib.resources.files("simnccl") / "data" / "torch_checked.toml").read_text(encoding="utf-8")
    return frozenset(entry["sha256"] for entry in tomllib.loads(text)["new_group_non_member"])


@functools.cache
def _applies_to_installed_torch() -> bool:
    try:
        return source_digest() in _checked_digests()
    except (OSError, TypeError, AttributeError):  # no source to read (a frozen or stripped torch)
        return False


def shortcut_for(original: Callable[..., Any]) -> Callable[[Mapping[str, Any], list[int] | None], Any] | None:
    """The shortcut for calls to ``original`` (``new_group_outside``), or None: ``original`` is not torch's own
    ``new_group``, or the installed torch is not the one checked. Called once per capture, before any fork."""
    if original is not getattr(c10d, "new_group", None) or not _applies_to_installed_torch():
        return None
    current = operator.attrgetter(*CHECKED_FUNCTIONS)
    expected = current(c10d)

    def shortcut(arguments: Mapping[str, Any], ranks: list[int] | None = None) -> Any:
        if not _enabled or current(c10d) != expected:  # functions compare by identity
            return TORCH
        return new_group_outside(arguments, ranks)

    return shortcut


def new_group_outside(arguments: Mapping[str, Any], ranks: list[int] | None = None) -> Any:
    """``GroupMember.NON_GROUP_MEMBER`` after torch's side effects, when ``new_group(**arguments)`` (every
    parameter bound) is a call this rank is outside of and the shortcut covers; ``TORCH`` otherwise.

    ``ranks``: ``arguments["ranks"]`` as torch reads them (``operator.index`` of each, sorted when
    ``sort_ranks``), when the caller has them already (the recorder does); None: read here."""
    try:
        ranks = _outside(arguments, ranks)
    except Exception:  # whatever torch would raise, torch raises (the checks change nothing)
        return TORCH
    if ranks is None:
        return TORCH
    world = c10d._world
    with _COUNTER.guard():
        world.group_count += 1
        # (zip without strict=True: the lengths are equal by construction, and the keyword costs ~0.8 us a call)
        world.pg_group_ranks[c10d.GroupMember.NON_GROUP_MEMBER] = dict(zip(ranks, range(len(ranks))))  # noqa: B905
    return c10d.GroupMember.NON_GROUP_MEMBER


class _DefaultGroup:
    """What a non-member's path reads of the default group, read once per group (and bound device): its rank
    and size never change, and whether its split source's no-colour split is the stand-in's no-op is asked of
    torch once (``_get_backend`` only fills an idempotent C++ cache)."""

    __slots__ = ("bound", "covered", "pg", "rank", "size", "split_is_noop")

    def __init__(self, pg: Any, bound: Any) -> None:
        self.pg = pg
        self.bound = bound
        self.rank = pg.rank()
        self.size = pg.size()
        # torch delegates to a default group's own new_group; a bound device without an index raises
        self.covered = not hasattr(pg, "new_group") and (bound is None or bound.index is not None)
        self.split_is_noop: bool | None = None if bound else True

    def split_covered(self) -> bool:
        """Whether torch's split-source lookup ends in nothing or the stand-in's no-op no-colour split."""
        if self.split_is_noop is None:
            source = self.pg._get_backend(self.bound)  # torch's _get_split_source's first step
            noop = StandInBackend.perform_nocolor_split
            self.split_is_noop = not source or type(source).perform_nocolor_split is noop
        return self.split_is_noop


_default: _DefaultGroup | None = None

# os.environ's own dict (CPython's _Environ keeps it in step with every change): a missing key costs
# ``os.environ.__contains__`` a KeyError raised and caught, once per call; a dict lookup does not.
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_BARRIER_KEY = os.environ.encodekey("TORCH_DIST_INIT_BARRIER") if isinstance(_ENVIRON_DATA, dict) else None


def _barrier_set() -> bool:
    """Whether ``TORCH_DIST_INIT_BARRIER`` is in the environment (torch's barrier-after-init switch)."""
    if _BARRIER_KEY is not None:
        return _BARRIER_KEY in _ENVIRON_DATA  # type: ignore[operator]
    return "TORCH_DIST_INIT_BARRIER" in os.environ


def _outside(arguments: Mapping[str, Any], indexed: list[int] | None = None) -> list[int] | None:
    """The group's ranks (sorted as torch sorts them) when the call is a covered non-member one, else None.

    Reads torch's state and changes none of it (``_get_backend`` fills a C++ cache torch's path fills too)."""
    global _default
    world = c10d._world
    default_pg = world.default_pg
    raw, timeout, backend = arguments["ranks"], arguments["timeout"], arguments["backend"]
    if (
        default_pg is None
        or arguments["device_id"] is not None
        or arguments["use_local_synchronization"]
        or type(raw) not in (list, tuple, range)
        or not isinstance(timeout, timedelta)
        or (backend and type(backend) is not str and type(backend) is not c10d.Backend)  # Backend() may raise
        or (_barrier_set() and int(os.environ["TORCH_DIST_INIT_BARRIER"]) == 1)
    ):
        return None
    bound = default_pg.bound_device_id
    facts = _default
    if facts is None or facts.pg is not default_pg or facts.bound != bound:
        facts = _default = _DefaultGroup(default_pg, bound)
    if not facts.covered or default_pg not in world.pg_map:
        return None
    if indexed is None:
        ranks = list(map(operator.index, raw))
        if arguments["sort_ranks"]:
            ranks.sort()
    else:
        ranks = indexed
    size = facts.size
    if not ranks or facts.rank in ranks or len(ranks) > size or len(set(ranks)) != len(ranks):
        return None
    if min(ranks) < 0 or max(ranks) >= size or str(world.group_count) in world.pg_names.values():
        return None
    if facts.split_is_noop or getattr(arguments["pg_options"], "lazy_init", False) or facts.split_covered():
        return ranks
    return None  # a real backend's no-colour split: torch's path

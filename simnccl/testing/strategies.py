"""Hypothesis strategies: clusters, releases, env knobs, policies, and valid SPMD programs built constructively.

Why constructive: a program is valid by the way it is built, not by filtering random op lists (heavy filtering
ends in ``Unsatisfiable`` and shrinks badly; reference/testing-practices.md). A program is first a *layout*
(``simnccl.testing.layout``) — ``Family`` steps (a partition of the world, created by every rank in the same
order, one ``new_group`` per part, all parts bound to one handle as frameworks do) and ``Use`` steps (a
collective on a handle, a matched send/recv pair, a checkpoint) — and then rendered into one op list per rank.
Every step involves either every rank (group creation, SPMD collectives) or the two ranks of a pair, and each
rank runs its projection of one global step order, so no rank can wait for a step another rank has not
reached: valid programs cannot deadlock.

Why coarse draws: hypothesis pays per choice (a span, a choice-tree node, a mutation candidate), and a case
used to be ~50 small choices -- a quarter of a property test's time went to drawing it. A case is now ~15
choices, each picking among all the options of one decision at once (``_choose``: several small decisions
read as the digits of one integer of at most ``_RADIX`` values, where hypothesis draws uniformly). Every
program the fine draws could make can still be made, and each choice shrinks towards its first option, so a
failing case still shrinks to the smallest cluster, no knobs, the first policy, fewer families and uses.

Why nearly every program makes a group: a program that makes none tests no group-creation policy, yet counts
as an example passed, and a third of the draws were such programs. The family count is drawn with its simplest
value at *one* family (so shrinking still ends on one small group) and no family as its last, rare option;
all-zero choices are not only what shrinking ends on but also how hypothesis completes a share of its early
examples (a novel prefix, then the simplest choices), so a zero meaning "no group" kept one example in ten
groupless whatever the odds.

Why timeouts and computes: a rare straggler (one rank computing alone, ``Use("compute")``) and rare
per-family and ``init_process_group`` timeouts put watchdog timeouts and time-dependent waits into generated
programs (a short group timeout that never fired went unseen by thousands of generated cases that had neither).
Why they never fire by default: a program whose own timeouts fire fails in production under any policy, so it
is no counterexample to a user's policy, and a suite asserting ``passes`` on ``cases()`` must not fail for it.
So a default draw's stragglers compute ``STRAGGLER_BUDGET_S`` at most in all, and it draws only timeouts of
``SAFE_TIMEOUT_S`` or more, twice that plus ``invariants.INTRINSIC_WAIT_S`` (torch's shortest default, 600 s,
is too): ``invariants.may_time_out`` is false for every one. ``timeouts_may_fire=True`` also draws short timeouts that
fire on a straggler (simnccl's own property tests: ``may_time_out``, ``passes_or_times_out``);
``timing=False`` draws neither timeouts nor stragglers.

Why splits: a policy decides ``split_group`` calls too (``decide_split``), and a program that never split left
a policy that mishandles them unexercised. A ``Split`` is a use: every rank calls it (torch requires every
parent rank to), on the world or a family once a collective ran on it (torch requires the parent initialized:
``_splittable``), and later uses take its child's handle like a family's, or destroy it: any live child, also one
another handle has the ranks of, and a later split may make its ranks again (destroy-then-recreate).

Mutations (``mutants``) break a valid program in one known way and name the rank to blame, for tests that
check the simulator *finds* the defect and *names* the culprit (see ``simnccl.testing.mutations``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from simnccl.cluster import get_gpu_kind, gpu_kinds
from simnccl.ops import MIB, WORLD
from simnccl.policy import BUILTIN, ComposedPolicy, get_policy
from simnccl.release import RELEASES
from simnccl.testing.hypothesis_profiles import load_profile, register_profiles, untouched
from simnccl.testing.invariants import INTRINSIC_WAIT_S
from simnccl.testing.layout import (
    CHECKPOINT_END,
    CHECKPOINT_GROUPS,
    CHECKPOINT_INIT,
    COLLECTIVES,
    FAMILY_KINDS,
    PURPOSE,
    Family,
    Layout,
    Split,
    Step,
    Use,
    family_parts,
    first_use_is_collective,
    mesh_parts,
    mesh_shapes,
    render,
    split_children,
    split_patterns,
    traffic_of,
)
from simnccl.testing.multicast_room import within_multicast_slots
from simnccl.testing.replay import SimCase, generated

# Public: the strategies and what they draw from; the layout's names (``simnccl.testing.layout``) stay
# importable from here, where users' tests found them.
__all__ = [
    "BUDGET_MIB",
    "CHECKPOINT_END",
    "CHECKPOINT_GROUPS",
    "CHECKPOINT_INIT",
    "COLLECTIVES",
    "COMPUTE_SECONDS",
    "DESTROY_WEIGHT",
    "ENV_KNOBS",
    "FAMILY_KINDS",
    "GPU_KINDS",
    "GROUP_TIMEOUTS_S",
    "INIT_TIMEOUTS_S",
    "NON_BUDGET",
    "PURPOSE",
    "RELEASE_KEYS",
    "SAFE_TIMEOUT_S",
    "SINGLE_POLICIES",
    "SIZES_BYTES",
    "SPLIT_WEIGHT",
    "STRAGGLER_BUDGET_S",
    "ClusterSpec",
    "Family",
    "Layout",
    "Split",
    "Step",
    "Use",
    "budgets",
    "cases",
    "clusters",
    "draw_case",
    "draw_cluster",
    "draw_env",
    "draw_family",
    "draw_layout",
    "draw_mesh_shape",
    "draw_policy",
    "draw_use",
    "envs",
    "family_parts",
    "first_use_is_collective",
    "gpu_kind_names",
    "layouts",
    "mesh_parts",
    "mesh_shapes",
    "mutants",
    "policies",
    "releases",
    "render",
    "single_policies",
    "split_children",
    "split_patterns",
    "traffic_of",
]

ENV_KNOBS: dict[str, tuple[str, ...]] = {
    "TORCH_DIST_USE_NCCL2": ("0", "1"),
    "NCCL_COMM_SPLIT_SHARE_RESOURCES": ("0", "1"),
    "NCCL_RUNTIME_CONNECT": ("0", "1"),
}

SIZES_BYTES = (4 * MIB, 4, 1024, MIB, 64 * MIB)

# Rare timing draws (see the module docstring). A straggler computes for one of COMPUTE_SECONDS; a family's
# groups take a drawn timeout with probability 1/4 (else the backend's default), and so does init_process_group.
# With timeouts_may_fire, one of GROUP_TIMEOUTS_S or INIT_TIMEOUTS_S: 1 s and 30 s fire on a 5 s or 45 s
# straggler (and 1 s may on a slow communicator init), 1800 s never does. By default only those of them at least
# SAFE_TIMEOUT_S, and a program's stragglers compute STRAGGLER_BUDGET_S at most in all: no wait reaches a timeout.
COMPUTE_SECONDS = (0.5, 5.0, 45.0)
GROUP_TIMEOUTS_S = (1800.0, 30.0, 1.0)
INIT_TIMEOUTS_S = (1800.0, 30.0)
STRAGGLER_BUDGET_S = 6 * max(COMPUTE_SECONDS)
# Twice what may_time_out allows for: 550 s, under torch's shortest default (600 s), so a default stays safe too.
SAFE_TIMEOUT_S = 2 * (STRAGGLER_BUDGET_S + INTRINSIC_WAIT_S)


@functools.cache
def _timeout_menu(timeouts: tuple[float, ...], may_fire: bool) -> tuple[float | None, ...]:
    """The backend's default (None) three times as often as a drawn timeout, the default first (shrinking ends
    on it); without ``may_fire``, only the timeouts of ``timeouts`` at least ``SAFE_TIMEOUT_S``."""
    kept = timeouts if may_fire else tuple(t for t in timeouts if t >= SAFE_TIMEOUT_S)
    return (*[None] * (3 * len(kept)), *kept)


# How many of a use's options each handle a split may be made of stands for (see ``_use_menu``): a handle offers
# about 40 other uses, so about one use in ten where one parent is ready is a split.
SPLIT_WEIGHT = 10
# Likewise for destroying a split child: with one entry, 5 of 1,500 cases destroyed one (seed 0), so a policy's
# handling of destroys (dedupe's reuse, handles sharing a group, destroy-then-recreate) was all but never met.
DESTROY_WEIGHT = 20

# With no lower bound, each family count from one up is drawn this many times as often as no family at all.
_FAMILY_COUNT_WEIGHT = 6

NON_BUDGET = tuple(name for name in BUILTIN if name != "budget")

T = TypeVar("T")


# ---------------------------------------------------------------------- hypothesis profiles

# Test modules build their ``@given``/``@settings`` when imported, so the profile is loaded when they import
# these strategies — unless a profile is loaded already (hypothesis' ``--hypothesis-profile``, or the plugin
# honouring $SIMNCCL_HYPOTHESIS_PROFILE).
register_profiles()
if untouched():
    load_profile()


# ---------------------------------------------------------------------- environment


@dataclass(frozen=True)
class ClusterSpec:
    gpu: str
    nodes: int
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


GPU_KINDS = tuple(sorted(gpu_kinds()))
RELEASE_KEYS = tuple(RELEASES)
BUDGET_MIB = (0, 231, 500, 1024, 2048, 100000)
SINGLE_POLICIES = (*NON_BUDGET, *(f"budget({mib})" for mib in BUDGET_MIB))


def gpu_kind_names() -> st.SearchStrategy[str]:
    return st.sampled_from(GPU_KINDS)


@st.composite
def clusters(draw: st.DrawFn, *, min_world: int = 1, max_world: int = 8, gpu: str | None = None) -> ClusterSpec:
    """1-2 nodes of 1-8 GPUs of one kind, at most ``max_world`` ranks (one rank per GPU)."""
    return draw_cluster(draw, min_world=min_world, max_world=max_world, gpu=gpu)


def draw_cluster(draw: st.DrawFn, *, min_world: int = 1, max_world: int = 8, gpu: str | None = None) -> ClusterSpec:
    """One choice: the node count, GPUs per node and (unless given) the GPU kind together."""
    if gpu is not None and gpu not in GPU_KINDS:
        get_gpu_kind(gpu)  # a kind simnccl knows but does not draw is fine; an unknown one is its error, here
    shapes = _node_shapes(min_world, max_world)
    kinds = GPU_KINDS if gpu is None else (gpu,)
    shape, kind = _choose(draw, len(shapes), len(kinds))
    nodes, per_node = shapes[shape]
    return ClusterSpec(kinds[kind], nodes, per_node)


@functools.cache
def _node_shapes(min_world: int, max_world: int) -> tuple[tuple[int, int], ...]:
    """(nodes, GPUs per node) of 1-2 nodes of 1-8 GPUs with ``min_world`` to ``max_world`` ranks (the fewest
    nodes, the fewest GPUs first). Why exactly: ``max_world=3`` drew 2 x 2 = 4 ranks, ``max_world=5`` 6, and
    ``min_world=12`` one node of 12 GPUs; a bound a test states must hold, or it is refused."""
    for name, value in (("min_world", min_world), ("max_world", max_world)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"cases(): {name} must be an integer, got {value!r}")
    if max_world > 16:  # drew at most 16 ranks while the test said up to max_world: a bound that did not hold
        raise InvalidArgument(
            f"cases(): max_world={max_world}: clusters are 1-2 nodes of 1-8 GPUs, at most 16 ranks; for larger "
            "worlds use a framework workload (simnccl.workloads) or a scenario"
        )
    out = [
        (nodes, per_node) for nodes in (1, 2) for per_node in range(1, 9) if min_world <= nodes * per_node <= max_world
    ]
    if not out:
        raise InvalidArgument(
            f"cases(): no cluster of 1-2 nodes of 1-8 GPUs has {min_world} to {max_world} ranks "
            "(min_world <= max_world, between 1 and 16)"
        )
    return tuple(out)


def releases() -> st.SearchStrategy[str]:
    return st.sampled_from(RELEASE_KEYS)


@st.composite
def envs(draw: st.DrawFn, knobs: Sequence[str] = tuple(ENV_KNOBS)) -> dict[str, str]:
    """Each knob unset or set to one of its values (swarm-style: most runs leave most knobs alone)."""
    return draw_env(draw, knobs)


def draw_env(draw: st.DrawFn, knobs: Sequence[str] = tuple(ENV_KNOBS)) -> dict[str, str]:
    """One choice for all the knobs (each unset -- its first option -- or one of its values)."""
    if isinstance(knobs, str) or not all(isinstance(k, str) and k in ENV_KNOBS for k in knobs):
        shown = repr(knobs) if isinstance(knobs, str) else ", ".join(repr(k) for k in knobs if k not in ENV_KNOBS)
        drawn = ", ".join(ENV_KNOBS)
        raise InvalidArgument(f"envs(knobs=...): expected a list of the knobs it draws ({drawn}); got {shown}")
    options = [(None, *ENV_KNOBS[knob]) for knob in knobs]
    picked = _choose(draw, *map(len, options))
    return {knob: values[i] for knob, values, i in zip(knobs, options, picked, strict=True) if i}  # type: ignore[misc]


def budgets() -> st.SearchStrategy[str]:
    return st.sampled_from(tuple(f"budget({mib})" for mib in BUDGET_MIB))


def single_policies() -> st.SearchStrategy[str]:
    return st.sampled_from(SINGLE_POLICIES)


@st.composite
def policies(draw: st.DrawFn, *, max_parts: int = 3, custom: Sequence[Any] = (), builtins: bool = True) -> Any:
    """A built-in policy name, ``budget(X)``, a team's own policy, or a composition ``a+b[+c]`` of distinct parts.

    ``custom``: the team's own policies (objects, or any spec ``get_policy`` accepts, e.g. ``"acme.policies:Safe"``),
    drawn alongside the built-ins (or alone with ``builtins=False``). The result is a spec string when every
    part is one, else a ``ComposedPolicy`` (or the single object) -- either is what ``cases(policy=...)``,
    ``SimCase`` and ``simulate`` take.
    """
    return draw_policy(draw, max_parts=max_parts, custom=custom, builtins=builtins)


def draw_policy(draw: st.DrawFn, *, max_parts: int = 3, custom: Sequence[Any] = (), builtins: bool = True) -> Any:
    if isinstance(max_parts, bool) or not isinstance(max_parts, int) or max_parts < 1:
        raise InvalidArgument(f"policies(max_parts=...): expected an integer >= 1, got {max_parts!r}")
    pool: tuple[Any, ...] = (*(SINGLE_POLICIES if builtins else ()), *custom)
    if not pool:
        raise ValueError("policies(): no policies to draw from (builtins=False and no custom ones)")
    # The first part and how many parts are tried, in one choice: each further part with probability 1/2, as
    # a coin per part would (the trailing one bits of ``more``); the extra parts in one more choice.
    extra = max(0, max_parts - 1)
    first, more = _choose(draw, len(pool), 2**extra)
    tries = 0
    while tries < extra and more >> tries & 1:
        tries += 1
    parts = [pool[first]]
    for i in _choose(draw, *([len(pool)] * tries)) if tries else ():
        part = pool[i]
        if _policy_kind(part) not in {_policy_kind(p) for p in parts}:
            parts.append(part)
    if all(isinstance(part, str) for part in parts):
        return "+".join(parts)
    if len(parts) == 1:
        return parts[0]
    return ComposedPolicy(tuple(get_policy(part) for part in parts))


def _policy_kind(part: Any) -> Any:
    """What makes two parts "the same policy" for composition: the name before arguments, or the object."""
    return part.split("(")[0] if isinstance(part, str) else part


# ---------------------------------------------------------------------- layouts


_INTS: dict[tuple[int, int], st.SearchStrategy[int]] = {}
_BOOLS = st.booleans()

# How many values one choice may range over. Hypothesis draws a bounded integer uniformly only while the range
# stays within its distribution's uniform core ([-256, 256] in hypothesis 6.1xx: beyond, small values are
# favoured), and a choice read as several decisions must keep each one uniform.
_RADIX = 256


def _int(draw: st.DrawFn, low: int, high: int) -> int:
    """``draw(st.integers(low, high))`` with one strategy object per range: building and validating a fresh
    strategy per draw was most of the generation time (measured with cProfile)."""
    strategy = _INTS.get((low, high))
    if strategy is None:
        strategy = _INTS[(low, high)] = st.integers(low, high)
    return draw(strategy)


def _pick(draw: st.DrawFn, items: Sequence[T]) -> T:
    """``draw(st.sampled_from(items))``, shrinking towards the first item."""
    return items[_index(draw, len(items))]


def _index(draw: st.DrawFn, n: int) -> int:
    """A uniform index below ``n``, shrinking towards 0: one choice up to ``_RADIX`` values, else one per
    base-``_RADIX`` digit (the top digit last, a value past ``n`` folded back)."""
    if n <= _RADIX:
        return _int(draw, 0, n - 1) if n > 1 else 0
    value, scale = 0, 1
    while scale * _RADIX < n:
        value += _int(draw, 0, _RADIX - 1) * scale
        scale *= _RADIX
    value += _int(draw, 0, -(-n // scale) - 1) * scale
    return value % n


def _choose(draw: st.DrawFn, *sizes: int) -> tuple[int, ...]:
    """One uniform index below each of ``sizes``, as few choices as possible: consecutive decisions whose
    option counts multiply to at most ``_RADIX`` are the mixed-radix digits of one choice (the first decision
    the least significant digit). Zero is every first option, so shrinking a choice shrinks its decisions."""
    out: list[int] = []
    i = 0
    while i < len(sizes):
        group, product = i, 1
        while group < len(sizes) and (group == i or product * sizes[group] <= _RADIX):
            product *= sizes[group]
            group += 1
        value = _index(draw, product)
        for size in sizes[i:group]:
            value, digit = divmod(value, size)
            out.append(digit)
        i = group
    return tuple(out)


def draw_mesh_shape(draw: st.DrawFn, world: int) -> tuple[int, int, int]:
    return _pick(draw, mesh_shapes(world))


def draw_family(
    draw: st.DrawFn,
    world: int,
    index: int,
    shape: tuple[int, int, int],
    earlier: Sequence[Family] = (),
    *,
    multi_rank: bool = False,
    timing: bool = False,
    timeouts_may_fire: bool = False,
) -> Family:
    """One family. ``duplicate`` re-creates an earlier family's parts under a new handle (DeviceMesh does);
    ``multi_rank`` asks for a family with a part of two or more ranks (when the world has two ranks);
    ``timing`` draws its timeout (rarely one of ``GROUP_TIMEOUTS_S``, only a safe one unless
    ``timeouts_may_fire``) in one more choice."""
    kinds = [k for k in FAMILY_KINDS if k != "duplicate" or earlier]
    if multi_rank and world > 1:
        kinds = [k for k in kinds if k not in ("singletons", "duplicate")]
    # The kind and, for a duplicate, its source in one choice; a colour split's colours four ranks a choice.
    pick, source = _choose(draw, len(kinds), max(1, len(earlier)))
    timeout_s = _pick(draw, _timeout_menu(GROUP_TIMEOUTS_S, timeouts_may_fire)) if timing else None
    kind = kinds[pick]
    if kind == "duplicate":
        dup = earlier[source]
        return Family(f"{dup.purpose}{index}", dup.parts, dup.purpose, timeout_s)
    colors = list(_choose(draw, *([4] * world))) if kind == "colors" else []
    parts = family_parts(kind, world, shape, colors)
    if multi_rank and world > 1 and all(len(p) == 1 for p in parts):
        parts = family_parts("world", world, shape)
    return Family(f"{PURPOSE[kind]}{index}", parts, PURPOSE[kind], timeout_s)


def draw_use(
    draw: st.DrawFn,
    world: int,
    fams: Sequence[Family | Split],
    *,
    p2p: bool = True,
    timing: bool = False,
    splittable: Sequence[str] = (),
    destroyable: Sequence[str] = (),
    splits: int = 0,
    timeouts_may_fire: bool = False,
    recreatable: Sequence[Split] = (),
) -> Use | Split:
    """A collective on a family handle or the world, a send/recv pair inside one part, a checkpoint, (with
    ``timing``, rarely) one rank's compute before a barrier on a handle (``draw_layout`` adds the barrier),
    a ``split_group`` of a handle of ``splittable`` (the world's or a family's; the ``splits``-th), the same split
    again as one of ``recreatable`` (destroyed children whose parent is splittable: destroy-then-recreate) or a
    ``destroy_process_group`` of a split child of ``destroyable``."""
    targets: list[Family | Split | None] = [*fams, None]  # None: the world handle
    menu = _use_menu(world, tuple(targets), p2p, timing, tuple(splittable), tuple(destroyable), len(recreatable))
    target, kind, size = menu[_index(draw, len(menu))]
    if kind == "checkpoint":
        return Use("checkpoint", label=f"c{size}")
    if kind == "compute":  # the straggler and the handle its peers then wait on, in one more choice
        src, on = _choose(draw, world, len(targets))
        handle = WORLD if targets[on] is None else targets[on].handle  # type: ignore[union-attr]
        return Use("compute", handle, src=src, seconds=COMPUTE_SECONDS[size])
    handle = WORLD if target is None else target.handle
    if kind == "split":  # how the parent splits and (with timing) the child's timeout, in one more choice
        return _draw_split(draw, world, target, splits, timing, timeouts_may_fire)
    if kind == "resplit":  # a destroyed child's split made again, under a handle of its own
        old = recreatable[size]
        return Split(f"split{splits}", old.parent, old.split_ranks, old.parts, timeout_s=old.timeout_s)
    if kind == "destroy":
        return Use("destroy", handle)
    if kind == "p2p":  # an ordered pair of distinct ranks of one part, in one more choice
        pairs = _p2p_pairs((tuple(range(world)),) if target is None else target.parts)
        src, dst = pairs[_index(draw, len(pairs))]
        return Use("p2p", handle, size, src=src, dst=dst)
    return Use(kind, handle, size)


def _draw_split(
    draw: st.DrawFn, world: int, parent: Family | None, index: int, timing: bool, timeouts_may_fire: bool
) -> Split:
    """A split of ``parent`` (None: the world) by one of ``split_patterns`` of its smallest part, so that every
    split names ranks of every part (a rank past it would be torch's error, not the policy's)."""
    parts = (tuple(range(world)),) if parent is None else parent.parts
    patterns = split_patterns(min(map(len, parts)))
    menu = _timeout_menu(GROUP_TIMEOUTS_S, timeouts_may_fire) if timing else (None,)
    pattern, timeout = _choose(draw, len(patterns), len(menu))
    split_ranks = patterns[pattern]
    return Split(
        f"split{index}",
        WORLD if parent is None else parent.handle,
        split_ranks,
        split_children(parts, split_ranks),
        timeout_s=menu[timeout],
    )


# A few menus: one is reused within an example only, and a menu is a tuple per entry (4,096 of them kept 234,000
# tuples alive over a 2,000-case run, walked by every full collection of the cyclic GC).
@functools.lru_cache(maxsize=32)
def _use_menu(
    world: int,
    targets: tuple[Family | Split | None, ...],
    p2p: bool,
    timing: bool = False,
    splittable: tuple[str, ...] = (),
    destroyable: tuple[str, ...] = (),
    resplits: int = 0,
) -> tuple[tuple[Any, str, int], ...]:
    """Every (target, kind, size) a use may be, in one list: a collective (broadcast on the world handle only, a
    barrier of 4 bytes) or a send/recv (where a part has two ranks) of each size, or a checkpoint (its label
    number in the size's place), a split (``SPLIT_WEIGHT`` entries, of a ``splittable`` handle) or a destroy (of
    a ``destroyable`` one), a split made again (``SPLIT_WEIGHT`` entries for each of ``resplits`` destroyed children,
    the index in the size's place), and with ``timing`` a compute of each of ``COMPUTE_SECONDS`` (its index in the
    size's place; once, not per target: rare, and last). Target first, all-reduce of ``SIZES_BYTES[0]`` first:
    what shrinking ends on."""
    menu: list[tuple[Any, str, int]] = []
    for target in targets:
        handle = WORLD if target is None else target.handle
        parts = (tuple(range(world)),) if target is None else target.parts
        kinds = [k for k in COLLECTIVES if k != "broadcast" or target is None]
        if p2p and any(len(p) > 1 for p in parts):
            kinds.append("p2p")
        for kind in kinds:
            menu += [(target, kind, 4 if kind == "barrier" else size) for size in SIZES_BYTES]
        menu += [(target, "checkpoint", label) for label in range(4)]
        if handle in splittable:
            menu += [(target, "split", i) for i in range(SPLIT_WEIGHT)]
        if handle in destroyable:
            menu += [(target, "destroy", 0)] * DESTROY_WEIGHT
    menu += [(None, "resplit", i) for i in range(resplits) for _ in range(2 * SPLIT_WEIGHT)]
    if timing:
        menu += [(None, "compute", i) for i in range(len(COMPUTE_SECONDS))]
    return tuple(menu)


@functools.lru_cache(maxsize=4096)
def _p2p_pairs(parts: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, int], ...]:
    """Every (src, dst) of two distinct ranks of one part."""
    return tuple((src, dst) for part in parts if len(part) > 1 for src in part for dst in part if dst != src)


@st.composite
def layouts(
    draw: st.DrawFn,
    world: int,
    *,
    max_ops: int = 30,
    max_families: int | None = None,
    min_families: int = 0,
    max_uses: int = 12,
    p2p: bool = True,
    use_all: bool = False,
    annotate: bool | None = None,
    multi_rank_first: bool = False,
    timing: bool = True,
    timeouts_may_fire: bool = False,
    splits: bool = True,
) -> Layout:
    """Families first, then uses: the ``groups`` checkpoint sits between (used by the budget invariant).

    ``use_all`` ends with one all_reduce on every family handle and on the world, so every group communicates
    (the eager-vs-lazy memory property). At most ``max_ops`` ops per rank. ``timing=False`` draws no timeout
    and no straggler's compute; ``timeouts_may_fire=True`` draws short timeouts a straggler may outlast (see
    the module docstring). ``splits=False`` draws no ``split_group`` (and so no destroy of a split child).
    """
    return draw_layout(
        draw,
        world,
        max_ops=max_ops,
        max_families=max_families,
        min_families=min_families,
        max_uses=max_uses,
        p2p=p2p,
        use_all=use_all,
        annotate=annotate,
        multi_rank_first=multi_rank_first,
        timing=timing,
        timeouts_may_fire=timeouts_may_fire,
        splits=splits,
    )


DEFAULT_MAX_FAMILIES = 5  # a layout's families when ``max_families`` is not given (more if ``min_families`` asks)


def _check_layout_bounds(
    world: int, max_ops: int, min_families: int, max_families: int, max_uses: int, use_all: bool
) -> None:
    """The bounds a layout is drawn within, each one it can keep (``InvalidArgument`` otherwise): a bound it
    could not keep was overridden silently (``max_ops=1`` drew five-op programs)."""
    for name, value, least in (
        ("world", world, 1),
        ("max_ops", max_ops, 0),
        ("min_families", min_families, 0),
        ("max_families", max_families, 0),
        ("max_uses", max_uses, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidArgument(f"cases(): {name}: expected an integer >= {least}, got {value!r}")
    if min_families > max_families:
        raise InvalidArgument(f"cases(): min_families={min_families} > max_families={max_families}")
    # the prologue, two checkpoints, and with use_all the world's all_reduce, plus each family's one call at
    # least (and its all_reduce with use_all). One family at least, unless max_families=0 asks for none: a bound
    # that leaves no room for a group drew only programs without one, and every policy passed them (found by a
    # tester: cases(max_ops=5) drew no group in 200 examples, and two wrong policies passed)
    families = max(min_families, 1 if max_families > 0 else 0)
    least_ops = 5 + (1 if use_all else 0) + families * (2 if use_all else 1)
    if max_ops < least_ops:
        raise InvalidArgument(
            f"cases(): max_ops={max_ops} is too few for a program with {families} famil"
            f"{'y' if families == 1 else 'ies'}{' used by all' if use_all else ''}: at least {least_ops}"
            + ("" if min_families else " (a program without a group tests no policy: max_families=0 asks for that)")
        )


def draw_layout(
    draw: st.DrawFn,
    world: int,
    *,
    max_ops: int = 30,
    max_families: int | None = None,
    min_families: int = 0,
    max_uses: int = 12,
    p2p: bool = True,
    use_all: bool = False,
    annotate: bool | None = None,
    multi_rank_first: bool = False,
    timing: bool = True,
    timeouts_may_fire: bool = False,
    splits: bool = True,
) -> Layout:
    """``layouts``, drawn inside the caller's own strategy (no strategy object built per case): the mesh shape,
    whether traffic is annotated in one choice, the family count and the init timeout in one, one per family
    (two with ``timing``), the use count, one per use (two for a send/recv pair, a compute or a split)."""
    if timeouts_may_fire and not timing:
        raise InvalidArgument("cases(): timeouts_may_fire=True needs timing=True (timing=False draws no timeout)")
    if max_families is None:  # not given: up to five, or as many as the minimum asks
        max_families = max(min_families, DEFAULT_MAX_FAMILIES) if isinstance(min_families, int) else min_families
    _check_layout_bounds(world, max_ops, min_families, max_families, max_uses, use_all)
    shapes = mesh_shapes(world)
    counts = _family_counts(min_families, max_families)
    init_menu = _timeout_menu(INIT_TIMEOUTS_S, timeouts_may_fire) if timing else (None,)
    # Two choices whatever the world: one whose size follows the world (the mesh shape), one that does not (the
    # family count, 31 values, and the init timeout). Why: when shrinking changes the cluster, a choice
    # that packed both split in two for one world and not for another, every later choice read another
    # decision, and a send found on 2 x 2 ranks no longer shrank to 1 x 4.
    # Without timing (mutants), the one choice as before, so that their draws and shrinking stay as they were.
    if timing:
        shape_i, annotated = _choose(draw, len(shapes), 2 if annotate is None else 1)
        count_i, init_i = _choose(draw, len(counts), len(init_menu))
    else:
        shape_i, count_i, annotated = _choose(draw, len(shapes), len(counts), 2 if annotate is None else 1)
        init_i = 0
    shape = shapes[shape_i]
    if annotate is None:
        annotate = bool(annotated)
    fams: list[Family] = []
    # prologue (3) + groups checkpoint + end checkpoint + the world's use_all all_reduce
    fixed = 5 + (1 if use_all else 0)
    tail = 1 if use_all else 0
    calls = 0
    wanted = counts[count_i]
    if wanted == 0 and counts[0] > 0:
        # No family, drawn as one family's choices thrown away. Why: hypothesis ranks a shorter list of
        # choices simpler, so without them "no family" (the last count) outranked "one family" (the first),
        # and shrinking ended on no group again, or stalled on the way.
        draw_family(draw, world, 0, shape, timing=timing, timeouts_may_fire=timeouts_may_fire)
    while len(fams) < wanted:
        fam = draw_family(
            draw,
            world,
            len(fams),
            shape,
            fams,
            multi_rank=multi_rank_first and not fams,
            timing=timing,
            timeouts_may_fire=timeouts_may_fire,
        )
        if fixed + calls + len(fam.parts) + tail > max_ops:
            if len(fams) >= min_families:
                break
            fam = Family(f"world{len(fams)}", family_parts("world", world, shape), "world")
        fams.append(fam)
        calls += len(fam.parts) + tail
    budget = max(0, max_ops - fixed - calls)
    steps: list[Step] = []
    initialized: set[str] = set()
    children: list[Split] = []  # split children not destroyed: handles later uses may take
    destroyed: list[Split] = []  # split children destroyed: a later split may make them again
    computed = 0.0
    for _ in range(_int(draw, 0, max(0, min(max_uses, budget)))):
        splittable = _splittable(fams, initialized) if splits else ()
        destroyable = tuple(c.handle for c in children)
        use = draw_use(
            draw,
            world,
            (*fams, *children),
            p2p=p2p,
            timing=timing,
            splittable=splittable,
            destroyable=destroyable,
            splits=len([s for s in steps if isinstance(s, Split)]),
            timeouts_may_fire=timeouts_may_fire,
            recreatable=[s for s in destroyed if s.parent in splittable],
        )
        if isinstance(use, Split):
            steps.append(use)
            children.append(use)
            continue
        if use.kind == "destroy":
            steps.append(use)
            destroyed += [c for c in children if c.handle == use.handle]
            children = [c for c in children if c.handle != use.handle]
            continue
        if use.kind == "compute" and not timeouts_may_fire:
            if computed + use.seconds > STRAGGLER_BUDGET_S:  # drawn, not kept: its wait might reach a timeout
                continue
            computed += use.seconds
        steps += first_use_is_collective(steps, initialized, use)
        if use.kind == "compute":  # a straggler is waited for where it next meets its peers: under that timeout
            steps += first_use_is_collective(steps, initialized, Use("barrier", use.handle, 4))
    steps = steps[:budget]
    while use_all and len(steps) + len(_live_children(steps)) > budget:  # room for their all_reduce at the end
        steps.pop()
    last = steps[-1] if steps else None
    if isinstance(last, Use) and last.kind == "compute":  # cut from its barrier: nobody would wait for the straggler
        steps.pop()
    if use_all:
        live = _live_children(steps)
        steps += [Use("all_reduce", f.handle, MIB) for f in (*fams, *live)]
        steps.append(Use("all_reduce", WORLD, MIB))
    return Layout(world, (*fams, *steps), annotate, init_menu[init_i])


def _splittable(fams: Sequence[Family], initialized: set[str]) -> tuple[str, ...]:
    """The handles a ``split_group`` may split now: the world's and the families', once a collective ran on them.

    Why a collective first: torch requires the parent to be initialized (its docstring: "communicators are
    initialized"). A lazy parent (2.14's legacy default, nccl2 on 2.14, ``lazy_init``, a policy's lazy group)
    has no communicator before its first collective: legacy refuses the split ("Parent process group backend
    is not initialized"), a lazy nccl2 one does not support splitting. After one, every release and backend
    splits it. Split children are no parents here: their non-members hold NON_GROUP_MEMBER, and a split is
    every parent rank's call."""
    return tuple(h for h in (WORLD, *(f.handle for f in fams)) if h in initialized)


def _live_children(steps: Sequence[Step]) -> list[Split]:
    destroyed = {s.handle for s in steps if isinstance(s, Use) and s.kind == "destroy"}
    return [s for s in steps if isinstance(s, Split) and s.handle not in destroyed]


@functools.cache
def _family_counts(low: int, high: int) -> tuple[int, ...]:
    """The family counts a choice's values stand for, the simplest first. With ``low`` 0: one family first,
    each count up to ``high`` ``_FAMILY_COUNT_WEIGHT`` times, no family once, last (why: the module
    docstring); with a lower bound, each count from ``low`` to ``high`` once, as before."""
    if low > 0 or high == 0:
        return tuple(range(low, high + 1))
    return (*(n for n in range(1, high + 1) for _ in range(_FAMILY_COUNT_WEIGHT)), 0)


# ---------------------------------------------------------------------- cases


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    min_world: int = 1,
    max_world: int = 8,
    gpu: str | None = None,
    release: str | st.SearchStrategy[str] | None = None,
    env: dict[str, str] | st.SearchStrategy[dict[str, str]] | None = None,
    policy: Any = None,
    **layout_options: object,
) -> SimCase:
    """A whole simulation case: cluster, release, env knobs, policy, and a valid program for every rank.

    Fixed values are used as given; strategies are drawn from; ``None`` draws from the full range (for
    ``policy``: ``None`` draws a built-in policy; pass ``st.none()`` for torch's defaults, a team's own policy
    object or spec to fix it, or ``policies(custom=[...])`` to draw it among the built-ins).

    Timeouts and stragglers are drawn so that no wait can reach a timeout: a correct policy ``passes`` every
    case. ``timeouts_may_fire=True`` also draws short timeouts a straggler may outlast (assert
    ``invariants.passes_or_times_out`` where ``invariants.may_time_out``); ``timing=False`` draws neither
    timeouts nor stragglers. Other ``layout_options``: see ``layouts``.
    """
    return draw_case(
        draw,
        min_world=min_world,
        max_world=max_world,
        gpu=gpu,
        release=release,
        env=env,
        policy=policy,
        **layout_options,
    )


def draw_case(
    draw: st.DrawFn,
    *,
    min_world: int = 1,
    max_world: int = 8,
    gpu: str | None = None,
    release: str | st.SearchStrategy[str] | None = None,
    env: dict[str, str] | st.SearchStrategy[dict[str, str]] | None = None,
    policy: Any = None,
    **layout_options: Any,
) -> SimCase:
    """``cases``, drawn inside the caller's own strategy: the cluster in one choice, the release and env knobs
    in one, the policy in one or two, then the layout (``draw_layout``)."""
    cluster = draw_cluster(draw, min_world=min_world, max_world=max_world, gpu=gpu)
    knobs = tuple(ENV_KNOBS) if env is None else ()
    options = [(None, *ENV_KNOBS[knob]) for knob in knobs]
    picked = _choose(draw, len(RELEASE_KEYS) if release is None else 1, *map(len, options))
    chosen_release = RELEASE_KEYS[picked[0]] if release is None else _value(draw, release)
    if env is None:
        chosen_env = {knob: values[i] for knob, values, i in zip(knobs, options, picked[1:], strict=True) if i}
    else:
        chosen_env = _value(draw, env)
        if not isinstance(chosen_env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in chosen_env.items()
        ):
            wanted = "a dict of strings (or a strategy of them)"
            raise InvalidArgument(f"cases(env=...): expected {wanted}, got {chosen_env!r}")
    chosen_policy = draw_policy(draw) if policy is None else _value(draw, policy)
    layout = draw_layout(draw, cluster.world_size, **layout_options)
    programs = layout.render()
    if not within_multicast_slots(programs, cluster.gpu, cluster.gpus_per_node):
        reject()  # it would test the node's multicast slots, not the policy (simnccl.testing.multicast_room)
    case = SimCase(
        programs=programs,
        gpu=cluster.gpu,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        release=chosen_release,
        env=tuple(sorted(chosen_env.items())),
        policy=chosen_policy,
    )
    return generated(case)


def _value(draw: st.DrawFn, given: Any) -> Any:
    if isinstance(given, st.SearchStrategy):
        return draw(given)
    return given


# ---------------------------------------------------------------------- mutations


@st.composite
def mutants(draw: st.DrawFn, kind: str | st.SearchStrategy[str] | None = None, **case_options: Any):
    """A valid case broken by one mutation: ``(case, mutation)`` where ``mutation.culprits`` are to blame.

    The base case has two or more ranks (three for ``member_only``, which needs a group that is neither one
    rank nor the world), a family with a multi-rank part (two families where a mutation needs two groups),
    and uses every group at its end, so that targets
    exist and the defect is observable (see ``simnccl.testing.mutations``). A ``member_only`` mutant draws
    its policy from ``MEMBER_ONLY_POLICIES`` unless one is given.
    """
    from simnccl.testing import mutations

    mutation_kind = _pick(draw, mutations.KINDS) if kind is None else _value(draw, kind)
    # No timing draws: a straggler's timeout would blame the straggler, not the mutation's culprit.
    options: dict[str, Any] = {
        "min_world": 2,
        "use_all": True,
        "min_families": 1,
        "multi_rank_first": True,
        "timing": False,
        "splits": False,  # a mutation breaks new_group calls; its base keeps the draws it had
    }
    if mutation_kind in ("reorder_new_groups", "member_only"):  # two groups to swap, or one to mix with
        options["min_families"] = 2
    if mutation_kind == "member_only":
        options["min_world"] = 3
        if case_options.get("policy") is None:
            options["policy"] = _MEMBER_ONLY_POLICY
    needed = options["min_world"]
    options.update({k: v for k, v in case_options.items() if v is not None})
    if options.get("max_world", 8) < needed:
        raise InvalidArgument(
            f"mutants({mutation_kind!r}): needs a world of at least {needed} ranks; max_world={options['max_world']!r}"
        )
    options["min_world"] = max(options["min_world"], needed)
    base = draw_case(draw, **options)
    targets = mutations.targets(mutation_kind, base.programs)
    if not targets:
        reject()
    target = _pick(draw, targets)
    mutated = mutations.apply(mutation_kind, base.programs, target)
    return base.with_(programs=mutated.programs, note=mutated.describe()), mutated


def _member_only_policy(draw: st.DrawFn) -> str:
    from simnccl.testing.mutations import MEMBER_ONLY_POLICIES

    parts = [_pick(draw, MEMBER_ONLY_POLICIES)]
    if draw(_BOOLS):
        extra = _pick(draw, MEMBER_ONLY_POLICIES)
        if extra not in parts:
            parts.append(extra)
    return "+".join(parts)


_MEMBER_ONLY_POLICY = st.composite(_member_only_policy)()

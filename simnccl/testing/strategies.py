"""Hypothesis strategies: clusters, releases, env knobs, policies, and valid SPMD programs built constructively.

Why constructive: a program is valid by the way it is built, not by filtering random op lists (heavy filtering
ends in ``Unsatisfiable`` and shrinks badly; reference/testing-practices.md). A program is first a *layout* —
``Family`` steps (a partition of the world, created by every rank in the same order, one ``new_group`` per
part, all parts bound to one handle as frameworks do) and ``Use`` steps (a collective on a handle, a matched
send/recv pair, a checkpoint) — and then rendered into one op list per rank. Every step involves either every
rank (group creation, SPMD collectives) or the two ranks of a pair, and each rank runs its projection of one
global step order, so no rank can wait for a step another rank has not reached: valid programs cannot deadlock.

Mutations (``mutants``) break a valid program in one known way and name the rank to blame, for tests that
check the simulator *finds* the defect and *names* the culprit (see ``simnccl.testing.mutations``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import reject
from hypothesis import strategies as st

from simnccl.cluster import gpu_kinds
from simnccl.ops import (
    MIB,
    WORLD,
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    Broadcast,
    Checkpoint,
    Collective,
    InitProcessGroup,
    NewGroup,
    Op,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
)
from simnccl.policy import BUILTIN, ComposedPolicy, get_policy
from simnccl.release import RELEASES
from simnccl.testing.hypothesis_profiles import load_profile, register_profiles, untouched
from simnccl.testing.multicast_room import within_multicast_slots
from simnccl.testing.replay import SimCase

ENV_KNOBS: dict[str, tuple[str, ...]] = {
    "TORCH_DIST_USE_NCCL2": ("0", "1"),
    "NCCL_COMM_SPLIT_SHARE_RESOURCES": ("0", "1"),
    "NCCL_RUNTIME_CONNECT": ("0", "1"),
}

COLLECTIVES: dict[str, type[Collective]] = {
    "all_reduce": AllReduce,
    "all_gather": AllGather,
    "reduce_scatter": ReduceScatter,
    "all_to_all": AllToAll,
    "barrier": Barrier,
    "broadcast": Broadcast,  # on the world handle only: its src is a global rank, which an SPMD op must share
}
SIZES_BYTES = (4 * MIB, 4, 1024, MIB, 64 * MIB)

# Group families, by how their parts are computed from the rank (a 3-axis mesh: outer x mid x inner).
FAMILY_KINDS = ("tp", "dp", "pp", "ep", "cp", "pairs", "singletons", "world", "colors", "duplicate")

CHECKPOINT_INIT = "init"  # after init_process_group: context + world communicator
CHECKPOINT_GROUPS = "groups"  # after the last group family (before any later use, in ``layouts``)
CHECKPOINT_END = "end"

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
    nodes = _int(draw, 1, min(2, max_world))
    low = max(1, -(-min_world // nodes))
    per_node = _int(draw, low, max(low, min(8, max_world // nodes)))
    kind = gpu if gpu is not None else _pick(draw, GPU_KINDS)
    return ClusterSpec(kind, nodes, per_node)


def releases() -> st.SearchStrategy[str]:
    return st.sampled_from(RELEASE_KEYS)


@st.composite
def envs(draw: st.DrawFn, knobs: Sequence[str] = tuple(ENV_KNOBS)) -> dict[str, str]:
    """Each knob unset or set to one of its values (swarm-style: most runs leave most knobs alone)."""
    return draw_env(draw, knobs)


def draw_env(draw: st.DrawFn, knobs: Sequence[str] = tuple(ENV_KNOBS)) -> dict[str, str]:
    env: dict[str, str] = {}
    for knob in knobs:
        value = _pick(draw, (None, *ENV_KNOBS[knob]))
        if value is not None:
            env[knob] = value
    return env


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
    pool: tuple[Any, ...] = (*(SINGLE_POLICIES if builtins else ()), *custom)
    if not pool:
        raise ValueError("policies(): no policies to draw from (builtins=False and no custom ones)")
    parts = [_pick(draw, pool)]
    for _ in range(max_parts - 1):
        if not draw(_BOOLS):
            break
        part = _pick(draw, pool)
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


@dataclass(frozen=True)
class Family:
    """One group family: a partition of the world, created part by part by every rank, bound to ``handle``."""

    handle: str
    parts: tuple[tuple[int, ...], ...]
    purpose: str

    def part_of(self, rank: int) -> tuple[int, ...]:
        return next(p for p in self.parts if rank in p)


@dataclass(frozen=True)
class Use:
    """A step after group creation: ``kind`` is a collective name, ``"p2p"`` (src sends to dst) or
    ``"checkpoint"``."""

    kind: str
    handle: str = WORLD
    size_bytes: int = 4 * MIB
    src: int = -1
    dst: int = -1
    label: str = ""


Step = Family | Use


@dataclass(frozen=True)
class Layout:
    """An SPMD program before rendering: the world size and the steps in their one global order."""

    world_size: int
    steps: tuple[Step, ...]
    annotate: bool = True  # NewGroup.traffic says what the program does on each handle

    @property
    def families(self) -> tuple[Family, ...]:
        return tuple(s for s in self.steps if isinstance(s, Family))

    def render(self) -> tuple[tuple[Op, ...], ...]:
        return render(self)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_parts(world: int, shape: tuple[int, int, int], axes: str) -> tuple[tuple[int, ...], ...]:
    """Groups along ``axes`` (subset of "omi": outer, mid, inner) of a row-major outer x mid x inner mesh."""
    outer, mid, inner = shape
    assert outer * mid * inner == world
    groups: dict[tuple[int, int, int], list[int]] = {}
    for rank in range(world):
        o, rest = divmod(rank, mid * inner)
        m, i = divmod(rest, inner)
        key = (-1 if "o" in axes else o, -1 if "m" in axes else m, -1 if "i" in axes else i)
        groups.setdefault(key, []).append(rank)
    return tuple(sorted(tuple(g) for g in groups.values()))


def family_parts(
    kind: str, world: int, shape: tuple[int, int, int], colors: Sequence[int] = ()
) -> tuple[tuple[int, ...], ...]:
    if kind == "tp":
        return mesh_parts(world, shape, "i")
    if kind == "pp":
        return mesh_parts(world, shape, "m")
    if kind == "dp":
        return mesh_parts(world, shape, "o")
    if kind == "ep":
        return mesh_parts(world, shape, "mi")
    if kind == "cp":
        return mesh_parts(world, shape, "oi")
    if kind == "pairs":
        return tuple(tuple(range(r, min(r + 2, world))) for r in range(0, world, 2))
    if kind == "singletons":
        return tuple((r,) for r in range(world))
    if kind == "world":
        return (tuple(range(world)),)
    if kind == "colors":
        groups: dict[int, list[int]] = {}
        for rank in range(world):
            groups.setdefault(colors[rank] if rank < len(colors) else 0, []).append(rank)
        return tuple(sorted(tuple(g) for g in groups.values()))
    raise ValueError(f"unknown family kind {kind!r}")


PURPOSE = {
    "tp": "tp",
    "pp": "pp",
    "dp": "dp",
    "ep": "ep",
    "cp": "cp",
    "pairs": "pp",
    "singletons": "single",
    "world": "world",
    "colors": "custom",
}


_INTS: dict[tuple[int, int], st.SearchStrategy[int]] = {}
_BOOLS = st.booleans()


def _int(draw: st.DrawFn, low: int, high: int) -> int:
    """``draw(st.integers(low, high))`` with one strategy object per range: building and validating a fresh
    strategy per draw was most of the generation time (measured with cProfile)."""
    strategy = _INTS.get((low, high))
    if strategy is None:
        strategy = _INTS[(low, high)] = st.integers(low, high)
    return draw(strategy)


def _pick(draw: st.DrawFn, items: Sequence[T]) -> T:
    """``draw(st.sampled_from(items))``, shrinking towards the first item."""
    return items[_int(draw, 0, len(items) - 1)]


def draw_mesh_shape(draw: st.DrawFn, world: int) -> tuple[int, int, int]:
    inner = _pick(draw, _divisors(world))
    mid = _pick(draw, _divisors(world // inner))
    return (world // (inner * mid), mid, inner)


def draw_family(
    draw: st.DrawFn,
    world: int,
    index: int,
    shape: tuple[int, int, int],
    earlier: Sequence[Family] = (),
    *,
    multi_rank: bool = False,
) -> Family:
    """One family. ``duplicate`` re-creates an earlier family's parts under a new handle (DeviceMesh does);
    ``multi_rank`` asks for a family with a part of two or more ranks (when the world has two ranks)."""
    kinds = [k for k in FAMILY_KINDS if k != "duplicate" or earlier]
    if multi_rank and world > 1:
        kinds = [k for k in kinds if k not in ("singletons", "duplicate")]
    kind = _pick(draw, kinds)
    if kind == "duplicate":
        source = _pick(draw, earlier)
        return Family(f"{source.purpose}{index}", source.parts, source.purpose)
    colors = [_int(draw, 0, 3) for _ in range(world)] if kind == "colors" else []
    parts = family_parts(kind, world, shape, colors)
    if multi_rank and world > 1 and all(len(p) == 1 for p in parts):
        parts = family_parts("world", world, shape)
    return Family(f"{PURPOSE[kind]}{index}", parts, PURPOSE[kind])


def draw_use(draw: st.DrawFn, world: int, fams: Sequence[Family], *, p2p: bool = True) -> Use:
    """A collective on a family handle or the world, a send/recv pair inside one part, or a checkpoint."""
    target: Family | None = _pick(draw, [*fams, None])  # None: the world handle
    handle = WORLD if target is None else target.handle
    parts = (tuple(range(world)),) if target is None else target.parts
    kinds = [k for k in COLLECTIVES if k != "broadcast" or target is None]
    multi = [p for p in parts if len(p) > 1]
    if p2p and multi:
        kinds.append("p2p")
    kinds.append("checkpoint")
    kind = _pick(draw, kinds)
    size = _pick(draw, SIZES_BYTES)
    if kind == "checkpoint":
        return Use("checkpoint", label=f"c{_int(draw, 0, 3)}")
    if kind == "p2p":
        part = _pick(draw, multi)
        i = _int(draw, 0, len(part) - 1)
        j = _int(draw, 0, len(part) - 2)
        j = j if j < i else j + 1
        return Use("p2p", handle, size, src=part[i], dst=part[j])
    if kind == "barrier":
        size = 4
    return Use(kind, handle, size)


def first_use_is_collective(steps: Sequence[Step], initialized: set[str], step: Use) -> list[Step]:
    """``step``, preceded by a barrier on its handle when its first use would otherwise be a send/recv.

    Why: a lazily created communicator (the ``lazy-init`` policy, 2.14's nccl2, a lazy default group) is a
    rendezvous of *every* member at its first op (reference §B.5: "every member must issue some op on it").
    A send/recv first use would wait for members that never come, or that come only after waiting on the
    sender elsewhere. Frameworks meet this by warming groups up with a collective; so do valid programs here.
    """
    out: list[Step] = []
    if step.kind == "p2p" and step.handle not in initialized:
        out.append(Use("barrier", step.handle, 4))
    if step.kind != "checkpoint":
        initialized.add(step.handle)
    out.append(step)
    return out


@st.composite
def layouts(
    draw: st.DrawFn,
    world: int,
    *,
    max_ops: int = 30,
    max_families: int = 5,
    min_families: int = 0,
    max_uses: int = 12,
    p2p: bool = True,
    use_all: bool = False,
    annotate: bool | None = None,
    multi_rank_first: bool = False,
) -> Layout:
    """Families first, then uses: the ``groups`` checkpoint sits between (used by the budget invariant).

    ``use_all`` ends with one all_reduce on every family handle and on the world, so every group communicates
    (the eager-vs-lazy memory property). At most ``max_ops`` ops per rank.
    """
    shape = draw_mesh_shape(draw, world)
    fams: list[Family] = []
    # prologue (3) + groups checkpoint + end checkpoint + the world's use_all all_reduce
    fixed = 5 + (1 if use_all else 0)
    tail = 1 if use_all else 0
    calls = 0
    wanted = _int(draw, min_families, max(min_families, max_families))
    while len(fams) < wanted:
        fam = draw_family(draw, world, len(fams), shape, fams, multi_rank=multi_rank_first and not fams)
        if fixed + calls + len(fam.parts) + tail > max_ops:
            if len(fams) >= min_families:
                break
            fam = Family(f"world{len(fams)}", family_parts("world", world, shape), "world")
        fams.append(fam)
        calls += len(fam.parts) + tail
    budget = max(0, max_ops - fixed - calls)
    steps: list[Step] = []
    initialized: set[str] = set()
    for _ in range(_int(draw, 0, max(0, min(max_uses, budget)))):
        steps += first_use_is_collective(steps, initialized, draw_use(draw, world, fams, p2p=p2p))
    steps = steps[:budget]
    if use_all:
        steps += [Use("all_reduce", f.handle, MIB) for f in fams]
        steps.append(Use("all_reduce", WORLD, MIB))
    if annotate is None:
        annotate = draw(_BOOLS)
    return Layout(world, (*fams, *steps), annotate)


def traffic_of(layout: Layout) -> dict[str, str]:
    """What the program does on each family handle: collectives, p2p only, or nothing."""
    seen: dict[str, set[str]] = {f.handle: set() for f in layout.families}
    for step in layout.steps:
        if isinstance(step, Use) and step.handle in seen and step.kind != "checkpoint":
            seen[step.handle].add("p2p" if step.kind == "p2p" else "collectives")
    return {h: "collectives" if "collectives" in k else ("p2p" if k else "none") for h, k in seen.items()}


def render(layout: Layout) -> tuple[tuple[Op, ...], ...]:
    """One op tuple per rank; ranks with equal programs share one tuple object.

    Every step but a send/recv pair is every rank's, so a rank's program is the common op list with its own
    sends and recvs slotted in: ranks without any share the common tuple, and ranks with the same sends and
    recvs at the same places share one (built once) -- equal programs, one object, without comparing
    programs op by op."""
    world = layout.world_size
    traffic = traffic_of(layout) if layout.annotate else {}
    common: list[Op] = [SetDevice(), InitProcessGroup(backend="nccl"), Checkpoint(label=CHECKPOINT_INIT)]
    own: dict[int, list[tuple[int, Op]]] = {}  # rank -> (how many common ops precede it, its send or recv)
    last_family = max((i for i, s in enumerate(layout.steps) if isinstance(s, Family)), default=-1)
    if last_family < 0:
        common.append(Checkpoint(label=CHECKPOINT_GROUPS))
    for i, step in enumerate(layout.steps):
        if isinstance(step, Family):
            for part in step.parts:
                common.append(
                    NewGroup(ranks=part, bind=step.handle, purpose=step.purpose, traffic=traffic.get(step.handle))
                )
        elif step.kind == "checkpoint":
            common.append(Checkpoint(label=step.label))
        elif step.kind == "p2p":
            at = len(common)
            own.setdefault(step.src, []).append(
                (at, Send(peer=step.dst, group=step.handle, size_bytes=step.size_bytes))
            )
            own.setdefault(step.dst, []).append(
                (at, Recv(peer=step.src, group=step.handle, size_bytes=step.size_bytes))
            )
        else:
            common.append(COLLECTIVES[step.kind](group=step.handle, size_bytes=step.size_bytes))
        if i == last_family:
            common.append(Checkpoint(label=CHECKPOINT_GROUPS))
    common.append(Checkpoint(label=CHECKPOINT_END))
    shared = tuple(common)
    built: dict[tuple[tuple[int, Op], ...], tuple[Op, ...]] = {}
    programs = []
    for rank in range(world):
        mine = own.get(rank)
        if mine is None:
            programs.append(shared)
            continue
        key = tuple(mine)
        program = built.get(key)
        if program is None:
            merged: list[Op] = []
            done = 0
            for at, op in mine:
                merged += common[done:at]
                merged.append(op)
                done = at
            merged += common[done:]
            program = built[key] = tuple(merged)
        programs.append(program)
    return tuple(programs)


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
    """
    cluster = draw_cluster(draw, min_world=min_world, max_world=max_world, gpu=gpu)
    chosen_release = _pick(draw, RELEASE_KEYS) if release is None else _value(draw, release)
    chosen_env = draw_env(draw) if env is None else _value(draw, env)
    chosen_policy = draw_policy(draw) if policy is None else _value(draw, policy)
    layout = draw(layouts(cluster.world_size, **layout_options))  # type: ignore[arg-type]
    programs = layout.render()
    if not within_multicast_slots(programs, cluster.gpu, cluster.gpus_per_node):
        reject()  # it would test the node's multicast slots, not the policy (simnccl.testing.multicast_room)
    return SimCase(
        programs=programs,
        gpu=cluster.gpu,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        release=chosen_release,
        env=tuple(sorted(chosen_env.items())),
        policy=chosen_policy,
    )


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
    options: dict[str, Any] = {"min_world": 2, "use_all": True, "min_families": 1, "multi_rank_first": True}
    if mutation_kind in ("reorder_new_groups", "member_only"):  # two groups to swap, or one to mix with
        options["min_families"] = 2
    if mutation_kind == "member_only":
        options["min_world"] = 3
        if case_options.get("policy") is None:
            options["policy"] = _MEMBER_ONLY_POLICY
    options.update({k: v for k, v in case_options.items() if v is not None})
    base = draw(cases(**options))
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

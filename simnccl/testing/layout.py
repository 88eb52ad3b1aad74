"""A valid SPMD program before rendering: group families and their uses in one global order, and its rendering
into one op list per rank.

Why apart from the strategies: what a program skeleton *is* (a partition of the world per family, a use per
step, the checkpoints between) and how it becomes ops is plain data, read by the strategies that draw it
(``simnccl.testing.strategies``), by ``GrowingProgram`` that grows one rule by rule, and by the mutations; no
hypothesis here. Every step involves either every rank (group creation, SPMD collectives), the two ranks of
a pair or one straggler's compute, and each rank runs its projection of one global step order, so no rank can
wait for a step another rank has not reached: rendered programs cannot deadlock (though a wait for a straggler
may outlast a short timeout: ``simnccl.testing.invariants.may_time_out``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

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
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Op,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
    SplitGroup,
)

COLLECTIVES: dict[str, type[Collective]] = {
    "all_reduce": AllReduce,
    "all_gather": AllGather,
    "reduce_scatter": ReduceScatter,
    "all_to_all": AllToAll,
    "barrier": Barrier,
    "broadcast": Broadcast,  # on the world handle only: its src is a global rank, which an SPMD op must share
}
# Group families, by how their parts are computed from the rank (a 3-axis mesh: outer x mid x inner).
FAMILY_KINDS = ("tp", "dp", "pp", "ep", "cp", "pairs", "singletons", "world", "colors", "duplicate")

CHECKPOINT_INIT = "init"  # after init_process_group: context + world communicator
CHECKPOINT_GROUPS = "groups"  # after the last group family (before any later use, in ``layouts``)
CHECKPOINT_END = "end"


@dataclass(frozen=True)
class Family:
    """One group family: a partition of the world, created part by part by every rank, bound to ``handle``.

    ``timeout_s``: every part's ``new_group(timeout=...)`` (None: the backend's default), as a framework passes
    one timeout to each group of a kind."""

    handle: str
    parts: tuple[tuple[int, ...], ...]
    purpose: str
    timeout_s: float | None = None

    def part_of(self, rank: int) -> tuple[int, ...]:
        return next(p for p in self.parts if rank in p)


@dataclass(frozen=True)
class Use:
    """A step after group creation: ``kind`` is a collective name, ``"p2p"`` (src sends to dst), ``"compute"``
    (rank ``src`` alone works for ``seconds``: a straggler the others wait for at their next shared step),
    ``"destroy"`` (``destroy_process_group`` of the handle on every rank; the handle is not used after) or
    ``"checkpoint"``."""

    kind: str
    handle: str = WORLD
    size_bytes: int = 4 * MIB
    src: int = -1
    dst: int = -1
    label: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Split:
    """One ``split_group`` call of every rank: each group bound to ``parent`` (the world, or each rank's part of
    a family) split into ``split_ranks`` (ranks *of the parent group*, as torch takes them, the same on every
    rank), the child bound to ``handle``. ``parts`` are the children in global ranks (every parent part's
    splits); a rank in none of them gets ``NON_GROUP_MEMBER`` for ``handle``, as torch returns it.

    Why every rank: torch requires every rank of the parent to enter the call (NCCL's ncclCommSplit is a
    collective over the parent; a rank in no split joins with NOCOLOR), and a family's parts cover the world."""

    handle: str
    parent: str
    split_ranks: tuple[tuple[int, ...], ...]
    parts: tuple[tuple[int, ...], ...]
    purpose: str = "split"
    timeout_s: float | None = None


Step = Family | Use | Split


@dataclass(frozen=True)
class Layout:
    """An SPMD program before rendering: the world size and the steps in their one global order."""

    world_size: int
    steps: tuple[Step, ...]
    annotate: bool = True  # NewGroup.traffic says what the program does on each handle
    init_timeout_s: float | None = None  # init_process_group(timeout=...); None: the backend's default

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


@functools.cache
def mesh_shapes(world: int) -> tuple[tuple[int, int, int], ...]:
    """Every outer x mid x inner mesh of ``world`` ranks, (world, 1, 1) first (the one shrinking ends on)."""
    return tuple(
        (world // (inner * mid), mid, inner) for inner in _divisors(world) for mid in _divisors(world // inner)
    )


def split_children(
    parent_parts: Sequence[tuple[int, ...]], split_ranks: Sequence[tuple[int, ...]]
) -> tuple[tuple[int, ...], ...]:
    """The child groups, in global ranks, of splitting each of ``parent_parts`` into ``split_ranks`` (parent
    group ranks, each child in its split's order: a position is a group rank). A split naming a rank past a
    part's size is no child of that part (``Split`` draws only splits within every part)."""
    return tuple(
        tuple(part[r] for r in split) for part in parent_parts for split in split_ranks if max(split) < len(part)
    )


def split_patterns(size: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Every ``split_ranks`` a ``Split`` of a parent of ``size`` ranks may take, the simplest first: for each
    block size dividing ``size`` (largest first), contiguous blocks, strided blocks, the first block alone (the
    other ranks join as non-members) and contiguous blocks in reversed order (a position is a group rank)."""
    out: list[tuple[tuple[int, ...], ...]] = []
    for block in sorted(_divisors(size), reverse=True):
        count = size // block
        blocks = tuple(tuple(range(i * block, (i + 1) * block)) for i in range(count))
        strided = tuple(tuple(range(j, size, count)) for j in range(count))
        for pattern in (blocks, strided, blocks[:1], tuple(b[::-1] for b in blocks)):
            if pattern not in out:
                out.append(pattern)
    return tuple(out)


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
    if step.kind not in ("checkpoint", "compute", "destroy"):  # none makes a communicator ready
        initialized.add(step.handle)
    out.append(step)
    return out


def traffic_of(layout: Layout) -> dict[str, str]:
    """What the program does on each family's and split child's handle: collectives, p2p only, or nothing."""
    seen: dict[str, set[str]] = {s.handle: set() for s in layout.steps if isinstance(s, Family | Split)}
    for step in layout.steps:
        if isinstance(step, Use) and step.handle in seen and step.kind not in ("checkpoint", "compute", "destroy"):
            seen[step.handle].add("p2p" if step.kind == "p2p" else "collectives")
    return {h: "collectives" if "collectives" in k else ("p2p" if k else "none") for h, k in seen.items()}


def render(layout: Layout) -> tuple[tuple[Op, ...], ...]:
    """One op tuple per rank; ranks with equal programs share one tuple object.

    Every step but a send/recv pair or a straggler's compute is every rank's, so a rank's program is the common
    op list with its own sends, recvs and computes slotted in: ranks without any share the common tuple, and
    ranks with the same own ops at the same places share one (built once) -- equal programs, one object,
    without comparing programs op by op."""
    world = layout.world_size
    traffic = traffic_of(layout) if layout.annotate else {}
    init = InitProcessGroup(backend="nccl", timeout_s=layout.init_timeout_s)
    common: list[Op] = [SetDevice(), init, Checkpoint(label=CHECKPOINT_INIT)]
    own: dict[int, list[tuple[int, Op]]] = {}  # rank -> (how many common ops precede it, its send or recv)
    last_family = max((i for i, s in enumerate(layout.steps) if isinstance(s, Family)), default=-1)
    if last_family < 0:
        common.append(Checkpoint(label=CHECKPOINT_GROUPS))
    for i, step in enumerate(layout.steps):
        if isinstance(step, Family):
            for part in step.parts:
                common.append(
                    NewGroup(
                        ranks=part,
                        bind=step.handle,
                        timeout_s=step.timeout_s,
                        purpose=step.purpose,
                        traffic=traffic.get(step.handle),
                    )
                )
        elif isinstance(step, Split):
            common.append(
                SplitGroup(
                    split_ranks=step.split_ranks,
                    parent=step.parent,
                    bind=step.handle,
                    timeout_s=step.timeout_s,
                    purpose=step.purpose,
                    traffic=traffic.get(step.handle),
                )
            )
        elif step.kind == "checkpoint":
            common.append(Checkpoint(label=step.label))
        elif step.kind == "destroy":
            common.append(DestroyProcessGroup(group=step.handle))
        elif step.kind == "compute":  # the straggler's own op, slotted in as a send or recv is
            own.setdefault(step.src, []).append((len(common), Compute(seconds=step.seconds)))
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

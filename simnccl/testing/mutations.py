"""Mutations that break a valid SPMD program in one known way, naming the rank(s) to blame.

Each mutation class is a pure function of (programs, target); ``targets`` lists the places it applies where
the defect is *observable* by any policy, so a test can demand that the simulator finds every mutant:

``skip_new_group``      a rank skips one new_group call of a multi-rank group it is a member of and uses.
``reorder_new_groups``  a rank swaps two new_group calls of distinct, first-seen, multi-rank groups it is in and
                        uses: its split order, or the names its lazy groups bootstrap under, diverge.
``member_only``         every non-member drops one multi-rank new_group call (``if rank in ranks: new_group()``)
                        whose rank set is not repeated, and a later created, used group mixes members and
                        non-members, so their counters disagree.
``size_mismatch``       one rank's collective on a multi-rank group gets another size.
``skip_collective``     one rank skips a collective on a multi-rank group it is a member of.

Why the observability conditions: a call a dedupe policy answers by reuse never reaches torch, and a lazily
created group nobody uses never communicates, so dropping or swapping such calls is *harmless* in real torch
too. A mutation must break something a real job would trip on, or "not found" would be a false alarm.

``member_only`` stays policy-dependent: dropping a call hurts only if the call needed the non-members (a
NOCOLOR split of the bound default group) or if a later name-keyed bootstrap (lazy or fresh) mixes members
and non-members. A policy that makes the dropped group lazy or fresh while later groups split (``budget``
past its limit, ``nccl-lazy-p2p`` on a pipeline group) makes the mutant harmless in real torch as well;
``MEMBER_ONLY_POLICIES`` lists the policies under which every such mutant must be found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simnccl.ops import WORLD, Barrier, Collective, NewGroup, Op, PointToPoint
from simnccl.testing.replay import share_identical

# Policies under which a member_only mutant is always observable (see the module docstring).
MEMBER_ONLY_POLICIES = (
    "torch-default",
    "legacy",
    "lazy-init",
    "dedupe",
    "share-resources",
    "lazy-single-rank",
    "skip-single-rank",
)

KINDS = ("skip_new_group", "reorder_new_groups", "member_only", "size_mismatch", "skip_collective")

Programs = Sequence[Sequence[Op]]


@dataclass(frozen=True)
class Mutation:
    kind: str
    target: tuple[int, ...]
    culprits: tuple[int, ...]
    programs: tuple[tuple[Op, ...], ...]
    detail: str

    @property
    def culprit(self) -> int:
        """The rank to blame (the lowest, when a whole set of ranks misbehaves alike)."""
        return self.culprits[0]

    def describe(self) -> str:
        return f"mutation {self.kind}: {self.detail}"


def _group_size(program: Sequence[Op], rank: int, upto: int, handle: str, world: int) -> int:
    """Members of the group ``handle`` names on this rank at op ``upto`` (0 when not a member)."""
    if handle == WORLD:
        return world
    size = 0
    for op in program[:upto]:
        if isinstance(op, NewGroup) and op.bind == handle and op.ranks is not None and rank in op.ranks:
            size = len(op.ranks)
    return size


def _used_after(program: Sequence[Op], index: int, handle: str | None) -> bool:
    return handle is not None and any(
        isinstance(op, Collective | PointToPoint) and op.group == handle for op in program[index + 1 :]
    )


def _first_seen(program: Sequence[Op], index: int) -> bool:
    """Whether this new_group's rank set appears for the first time (a dedupe policy would reuse a repeat)."""
    ranks = frozenset(program[index].ranks or ())  # type: ignore[attr-defined]
    return not any(isinstance(op, NewGroup) and frozenset(op.ranks or ()) == ranks for op in program[:index])


def _member_of_used(program: Sequence[Op], index: int, rank: int) -> bool:
    """The rank is in this multi-rank new_group and uses its handle afterwards."""
    op = program[index]
    return (
        isinstance(op, NewGroup)
        and bool(op.ranks)
        and rank in op.ranks  # type: ignore[operator]
        and len(op.ranks) > 1  # type: ignore[arg-type]
        and _used_after(program, index, op.bind)
    )


def _only_once(program: Sequence[Op], index: int) -> bool:
    """Whether this new_group's rank set appears nowhere else: under a dedupe policy, a rank that skipped the
    first call would create a later repeat itself, which realigns its counter with everyone else's."""
    ranks = frozenset(program[index].ranks or ())  # type: ignore[attr-defined]
    return sum(isinstance(op, NewGroup) and frozenset(op.ranks or ()) == ranks for op in program) == 1


def _new_group_indices(program: Sequence[Op]) -> list[int]:
    return [i for i, op in enumerate(program) if isinstance(op, NewGroup)]


def targets(kind: str, programs: Programs) -> list[tuple[int, ...]]:
    """Every place ``kind`` applies observably, earliest first (hypothesis shrinks towards the first)."""
    world = len(programs)
    found: list[tuple[int, ...]] = []
    if kind == "skip_new_group":
        for rank, program in enumerate(programs):
            found += [(rank, i) for i in _new_group_indices(program) if _member_of_used(program, i, rank)]
    elif kind == "reorder_new_groups":
        for rank, program in enumerate(programs):
            calls = [
                i for i in _new_group_indices(program) if _first_seen(program, i) and _member_of_used(program, i, rank)
            ]
            for a_pos, i in enumerate(calls):
                for j in calls[a_pos + 1 :]:
                    if set(program[i].ranks or ()) != set(program[j].ranks or ()):  # type: ignore[attr-defined]
                        found.append((rank, i, j))
    elif kind == "member_only":
        # The k-th new_group call is the same call on every rank (group creation is SPMD).
        sequences = [_new_group_indices(p) for p in programs]
        reference = programs[0]
        for k, i in enumerate(sequences[0]):
            op = reference[i]
            assert isinstance(op, NewGroup)
            members = set(op.ranks or range(world))
            if len(members) == world or len(members) < 2 or not _only_once(reference, i):
                continue
            for later_k in range(k + 1, len(sequences[0])):
                other = reference[sequences[0][later_k]]
                assert isinstance(other, NewGroup)
                ranks = set(other.ranks or range(world))
                if (
                    _first_seen(reference, sequences[0][later_k])
                    and len(ranks) > 1
                    and ranks & members
                    and ranks - members
                    and all(_used_after(programs[r], sequences[r][later_k], other.bind) for r in ranks)
                ):
                    found.append((k,))
                    break
    elif kind in ("size_mismatch", "skip_collective"):
        for rank, program in enumerate(programs):
            for i, op in enumerate(program):
                if not isinstance(op, Collective) or (kind == "size_mismatch" and isinstance(op, Barrier)):
                    continue
                if _group_size(program, rank, i, op.group, world) > 1:
                    found.append((rank, i))
    else:
        raise ValueError(f"unknown mutation kind {kind!r}; expected one of {', '.join(KINDS)}")
    return found


def apply(kind: str, programs: Programs, target: tuple[int, ...]) -> Mutation:
    """The mutated programs (unchanged ranks keep their shared tuples) and who is to blame."""
    out = [list(p) for p in programs]
    if kind == "skip_new_group":
        rank, i = target
        op = out[rank].pop(i)
        culprits = (rank,)
        detail = f"rank {rank} skips op #{i} {op.describe()}"
    elif kind == "reorder_new_groups":
        rank, i, j = target
        out[rank][i], out[rank][j] = out[rank][j], out[rank][i]
        culprits = (rank,)
        detail = f"rank {rank} swaps op #{i} {programs[rank][i].describe()} and op #{j} {programs[rank][j].describe()}"
    elif kind == "member_only":
        (k,) = target
        reference = programs[0]
        op = reference[_new_group_indices(reference)[k]]
        assert isinstance(op, NewGroup)
        members = set(op.ranks or ())
        culprits = tuple(r for r in range(len(programs)) if r not in members)
        for r in culprits:
            del out[r][_new_group_indices(programs[r])[k]]
        detail = f"only members call new_group #{k + 1} {op.describe()}; ranks {list(culprits)} skip it"
    elif kind == "size_mismatch":
        rank, i = target
        op = out[rank][i]
        assert isinstance(op, Collective)
        out[rank][i] = type(op)(**{**_fields(op), "size_bytes": op.size_bytes * 2 + 4})
        culprits = (rank,)
        detail = f"rank {rank} issues op #{i} {out[rank][i].describe()} instead of {op.describe()}"
    elif kind == "skip_collective":
        rank, i = target
        op = out[rank].pop(i)
        culprits = (rank,)
        detail = f"rank {rank} skips op #{i} {op.describe()}"
    else:
        raise ValueError(f"unknown mutation kind {kind!r}; expected one of {', '.join(KINDS)}")
    return Mutation(kind, tuple(target), culprits, share_identical(out), detail)


def _fields(op: Op) -> dict[str, object]:
    from dataclasses import fields

    return {f.name: getattr(op, f.name) for f in fields(op)}

"""Differential testing on the CPU lane: small generated programs on real gloo and in the simulator.

Each case is a world of 2–4 ranks, at most 12 ops per rank, built from one global step order (so the unmutated
program is valid SPMD and must pass): ``init_process_group("gloo")``, group families created by every rank in
the same order (``new_group`` per part; members bind the handle), members-only ``use_local_synchronization``
groups (some with a short timeout), ``split_group`` of the world or of a group whose parts are one size (called by
the parent's members only, as torch 2.15 requires; each part splits its own group by the same group ranks),
collectives on the world or a family handle (sometimes also issued by non-members, which torch turns into a
warning) of a drawn size, element type and broadcast root, send/recv pairs on the world or within one group, a
group's destroy by its members, a straggling rank (a short ``Compute``), and a final ``destroy_process_group``.
Not every
unmutated program passes: a members-only ``use_local_synchronization`` group advances the group counter on its
members only (torch 2.15 ``_process_group_name``), so a later world-wide ``new_group`` gets different names on
members and non-members — a real hang both sides must find (a split of a group advances it on the parent's members
only, alike).

About half the cases are then broken in one known way on one rank (the *mutation classes*):

* ``skip-collective``: the rank leaves out one of its collectives;
* ``swap-collectives``: the rank issues two adjacent collectives on *different* groups in the opposite order
  (each group's own order is unchanged, so nothing mismatches — ranks wait on each other);
* ``skip-new-group``: the rank leaves out one ``new_group`` call (its later group names shift);
* ``swap-creation``: the rank creates two adjacent groups in the opposite order (the creation-order bug);
* ``skip-recv``: the receiving rank of a send/recv pair leaves out its ``recv``;
* ``resize``: the rank issues one of its collectives or sends with twice the bytes (gloo's size-mismatch fates);
* ``wrong-root``: the rank names another member as one broadcast's root;
* ``raise``: the rank raises (a Python error, as a failed check would) before one of its ops;
* ``use-after-destroy``: a rank that destroyed a subgroup issues an all_reduce on its handle afterwards;
* ``wrong-group``: the rank issues one of its collectives on another group it is a member of.

Both sides must agree on the ranks that did not finish (hang/no-hang per rank); ``classify`` sorts each case
into: ``agree`` (verdict and blocked/stuck ranks), ``racy`` (a store-key collision: real gloo connects whichever
colliding peer comes first, so only pass/no-pass is compared — and not even that when the collision is with a
one-rank group's key, where the order of two store writes decides whether the bootstrap succeeds),
``known-gap`` (a difference explained by a documented gap, ``simnccl.real.compare.KNOWN_GAPS``) and
``disagree``. A case is identified by
``(seed, index)``; ``describe`` prints it as a replayable program and ``python -m simnccl.real diff --seed S --only I``
runs it again.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from simnccl.dtypes import element_bytes
from simnccl.ops import (
    WORLD,
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    Broadcast,
    Collective,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Op,
    PointToPoint,
    Program,
    Raise,
    Recv,
    ReduceScatter,
    Send,
    SplitGroup,
)
from simnccl.real.programs import share_identical

MAX_OPS = 12
SIZE_BYTES = 96  # 24 floats: divisible by every group size up to 4, so no rank rounds differently
# Sizes a collective or send/recv is drawn with: each a multiple of 12 bytes (3 floats x 4 ranks), so none rounds
# differently on any group of up to 4 ranks; 96 most often, as before.
SIZES_BYTES = (96, 96, 96, 48, 192, 9600)
# Element types a collective or send/recv is drawn with (gloo runs each of them, measured): float32 most often, as
# before. An 8-byte type takes 96 bytes where 48 was drawn (6 elements would round on a group of 4).
DTYPES = ("Float",) * 10 + ("Double", "Half", "BFloat16", "Int", "Long", "Byte")
# A short torch timeout some new_group families are drawn with: below real diff's stall windows (5 s in the tests,
# 10 s in a sweep), so a rank that waits in the group ends with gloo's timeout, and peers see what that does.
GROUP_TIMEOUT_S = 2.0
STRAGGLER_S = (0.2, 0.5)  # a rank's Compute before a step: well under the real side's stall window
MUTATIONS = (
    "skip-collective",
    "swap-collectives",
    "skip-new-group",
    "swap-creation",
    "skip-recv",
    "resize",
    "wrong-root",
    "raise",
    "use-after-destroy",
    "wrong-group",
)
COLLECTIVE_KINDS: dict[str, type[Collective]] = {
    "all_reduce": AllReduce,
    "broadcast": Broadcast,
    "all_gather": AllGather,
    "reduce_scatter": ReduceScatter,
    "all_to_all": AllToAll,
    "barrier": Barrier,
}


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    world_size: int
    programs: tuple[Program, ...]
    steps: tuple[str, ...]
    mutation: str | None = None
    mutated_rank: int | None = None
    mutation_detail: str = ""
    # Every group handle the program made, with its parts (global ranks): what a mutation needs to know of a
    # group (``wrong-root`` picks another member of the root's part).
    handle_parts: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()

    def part_of(self, handle: str, rank: int) -> tuple[int, ...]:
        """The part of ``handle`` that ``rank`` is in (empty when it is in none)."""
        if handle == WORLD:
            return tuple(range(self.world_size))
        parts = dict(self.handle_parts).get(handle, ())
        return next((p for p in parts if rank in p), ())

    @property
    def name(self) -> str:
        return f"seed{self.seed}-case{self.index}"

    def describe(self) -> str:
        lines = [
            f"case {self.name}: {self.world_size} ranks, steps: {', '.join(self.steps)}",
            f"  mutation: {self.mutation or 'none'}"
            + (f" on rank {self.mutated_rank} ({self.mutation_detail})" if self.mutation else ""),
        ]
        for rank, program in enumerate(self.programs):
            lines.append(f"  rank {rank}:")
            for i, op in enumerate(program.ops):
                lines.append(f"    #{i} {op.describe()}")
        lines.append(f"  replay: python -m simnccl.real diff --seed {self.seed} --only {self.index}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {
                "seed": self.seed,
                "index": self.index,
                "mutation": self.mutation,
                "mutated_rank": self.mutated_rank,
                "programs": [p.to_list() for p in self.programs],
            }
        )


def _partitions(rng: random.Random, n: int) -> list[tuple[tuple[int, ...], ...]]:
    ranks = list(range(n))
    options = [tuple((r,) for r in ranks), (tuple(ranks),)]
    if n >= 2:
        half = n // 2
        options.append((tuple(ranks[:half]), tuple(ranks[half:])))
    if n == 4:
        options.append(((0, 2), (1, 3)))
        options.append(((0, 1), (2, 3)))
    if n == 3:
        options.append(((0, 2), (1,)))
    return options


def _payload(rng: random.Random) -> tuple[int, str]:
    """A drawn size and element type; the size stays a multiple of 4 elements (no group of <= 4 rounds it)."""
    size = rng.choice(SIZES_BYTES)
    dtype = rng.choice(DTYPES)
    if size % (element_bytes(dtype) * 4):
        size = SIZE_BYTES
    return size, dtype


def _dtype_note(dtype: str) -> str:
    return "" if dtype == "Float" else f" {dtype}"


def generate(seed: int, index: int, mutate: bool | None = None) -> Case:
    """One case, a pure function of ``(seed, index)``."""
    rng = random.Random(seed * 100_003 + index)
    n = rng.choice((2, 3, 4, 4))
    per_rank: list[list[Op]] = [[InitProcessGroup(backend="gloo")] for _ in range(n)]
    steps = ["init"]
    # handle -> its parts (tuples of global ranks), while the group lives; ``made``: every handle ever made
    handles: dict[str, tuple[tuple[int, ...], ...]] = {WORLD: (tuple(range(n)),)}
    made: dict[str, tuple[tuple[int, ...], ...]] = {}
    # handle -> the ranks that called its creating op (a non-member among them holds NON_GROUP_MEMBER; one that
    # never called holds nothing, and a collective on the handle would be a NameError, not a program to compare)
    callers_of: dict[str, tuple[int, ...]] = {WORLD: tuple(range(n))}
    counter = 0

    def room(cost: dict[int, int]) -> bool:
        return all(len(per_rank[r]) + c <= MAX_OPS - 1 for r, c in cost.items())

    for _ in range(rng.randint(3, 9)):
        kind = rng.choices(
            ("family", "local", "split", "collective", "p2p", "destroy", "straggler"),
            weights=(3, 1, 1, 6, 2, 1, 1),
        )[0]
        if kind == "family":
            parts = rng.choice(_partitions(rng, n))
            if not room(dict.fromkeys(range(n), len(parts))):
                continue
            counter += 1
            handle = f"g{counter}"
            timeout = GROUP_TIMEOUT_S if rng.random() < 0.15 else None
            for part in parts:
                op = NewGroup(ranks=part, bind=handle, timeout_s=timeout)
                for r in range(n):
                    per_rank[r].append(op)
            handles[handle] = parts
            callers_of[handle] = tuple(range(n))
            steps.append(f"family {handle}={[list(p) for p in parts]}" + (f" timeout {timeout:g} s" if timeout else ""))
        elif kind == "local":
            size = rng.randint(1, n)
            members = tuple(sorted(rng.sample(range(n), size)))
            if not room(dict.fromkeys(members, 1)):
                continue
            counter += 1
            handle = f"l{counter}"
            op = NewGroup(ranks=members, bind=handle, use_local_synchronization=True)
            for r in members:
                per_rank[r].append(op)
            handles[handle] = (members,)
            callers_of[handle] = members
            steps.append(f"local {handle}={list(members)}")
        elif kind == "split":
            # Of the world, or of a group whose parts are all one size: torch 2.15's split_group is called by
            # the parent's members only (a non-member's handle raises), each part splitting its own group by the
            # same group ranks.
            parents = [h for h in sorted(handles) if h != WORLD and len({len(p) for p in handles[h]}) == 1]
            parent = rng.choice(parents) if parents and rng.random() < 0.4 else WORLD
            parent_parts = handles[parent]
            split = rng.choice(_partitions(rng, len(parent_parts[0])))
            callers = sorted(r for p in parent_parts for r in p)
            if not room(dict.fromkeys(callers, 1)):
                continue
            counter += 1
            handle = f"s{counter}"
            op = SplitGroup(split_ranks=split, parent=parent, bind=handle)
            for r in callers:
                per_rank[r].append(op)
            handles[handle] = tuple(tuple(p[i] for i in s) for p in parent_parts for s in split)
            callers_of[handle] = tuple(callers) if parent != WORLD else tuple(range(n))
            steps.append(f"split {handle}={[list(p) for p in split]}" + ("" if parent == WORLD else f" of {parent}"))
        elif kind == "collective":
            handle = rng.choice(sorted(handles))
            parts = handles[handle]
            name = rng.choice(sorted(COLLECTIVE_KINDS))
            members = sorted(r for p in parts for r in p)
            issuers = members if rng.random() < 0.7 else list(callers_of[handle])
            size, dtype = _payload(rng)
            root = rng.randrange(4)  # each part's root: its member at this index (modulo its size)
            if not room(dict.fromkeys(issuers, 1)):
                continue
            for r in issuers:
                part = next((p for p in parts if r in p), None)
                if name == "broadcast":
                    src = part[root % len(part)] if part else 0
                    op: Op = Broadcast(group=handle, size_bytes=size, dtype=dtype, src=src)
                else:
                    op = COLLECTIVE_KINDS[name](group=handle, size_bytes=size, dtype=dtype)
                per_rank[r].append(op)
            steps.append(
                f"{name}({handle}, {size} B{_dtype_note(dtype)})" + ("" if issuers == members else " incl. non-members")
            )
        elif kind == "p2p":
            # On the world, or within one part of a group (peers are global ranks, as torch takes them).
            within = [(h, p) for h in sorted(handles) for p in handles[h] if len(p) >= 2]
            handle, part = rng.choice(within) if rng.random() < 0.4 else (WORLD, tuple(range(n)))
            src, dst = rng.sample(part, 2)
            size, dtype = _payload(rng)
            if not room({src: 1, dst: 1}):
                continue
            per_rank[src].append(Send(peer=dst, group=handle, size_bytes=size, dtype=dtype))
            per_rank[dst].append(Recv(peer=src, group=handle, size_bytes=size, dtype=dtype))
            steps.append(f"send {src}->{dst}" + ("" if handle == WORLD else f" on {handle}") + _dtype_note(dtype))
        elif kind == "destroy":
            subgroups = sorted(h for h in handles if h != WORLD)
            if not subgroups:
                continue
            handle = rng.choice(subgroups)
            holders = sorted(r for p in handles[handle] for r in p)  # members only: a non-member holds no group
            if not room(dict.fromkeys(holders, 1)):
                continue
            for r in holders:
                per_rank[r].append(DestroyProcessGroup(group=handle))
            made[handle] = handles.pop(handle)
            steps.append(f"destroy {handle}")
        else:
            rank = rng.randrange(n)
            seconds = rng.choice(STRAGGLER_S)
            if not room({rank: 1}):
                continue
            per_rank[rank].append(Compute(seconds=seconds))
            steps.append(f"rank {rank} straggles {seconds} s")
    if rng.random() < 0.3:
        for r in range(n):
            per_rank[r].append(DestroyProcessGroup())
        steps.append("destroy")
    made.update((h, p) for h, p in handles.items() if h != WORLD)
    case = Case(
        seed,
        index,
        n,
        share_identical([Program(tuple(ops)) for ops in per_rank]),
        tuple(steps),
        handle_parts=tuple(sorted(made.items())),
    )
    if mutate is None:
        mutate = rng.random() < 0.55
    if mutate:
        order = list(MUTATIONS)
        rng.shuffle(order)
        for mutation in order:
            mutated = _MUTATORS[mutation](case, rng)
            if mutated is not None:
                return mutated
    return case


def _with(case: Case, rank: int, ops: list[Op], mutation: str, detail: str) -> Case:
    programs = list(case.programs)
    programs[rank] = Program(tuple(ops))
    return Case(
        case.seed,
        case.index,
        case.world_size,
        share_identical(programs),
        case.steps,
        mutation,
        rank,
        detail,
        case.handle_parts,
    )


def _pick(
    rng: random.Random, case: Case, predicate: Callable[[list[Op], int], bool]
) -> tuple[int, int, list[Op]] | None:
    """A spot ``predicate`` accepts, drawn at random: the rank, the op's index and a copy of that rank's ops for the
    mutator to change (None: no spot)."""
    programs = [list(p.ops) for p in case.programs]
    spots = [(r, i) for r, ops in enumerate(programs) for i in range(len(ops)) if predicate(ops, i)]
    if not spots:
        return None
    r, i = rng.choice(spots)
    return r, i, programs[r]


def _skip_collective(case: Case, rng: random.Random) -> Case | None:
    spot = _pick(rng, case, lambda ops, i: isinstance(ops[i], Collective))
    if spot is None:
        return None
    r, i, ops = spot
    removed = ops.pop(i)
    return _with(case, r, ops, "skip-collective", f"left out #{i} {removed.describe()}")


def _swap_collectives(case: Case, rng: random.Random) -> Case | None:
    def ok(ops: list[Op], i: int) -> bool:
        return (
            i + 1 < len(ops)
            and isinstance(ops[i], Collective)
            and isinstance(ops[i + 1], Collective)
            and ops[i].group != ops[i + 1].group  # type: ignore[attr-defined]
        )

    spot = _pick(rng, case, ok)
    if spot is None:
        return None
    r, i, ops = spot
    ops[i], ops[i + 1] = ops[i + 1], ops[i]
    return _with(case, r, ops, "swap-collectives", f"swapped #{i} and #{i + 1}")


def _skip_new_group(case: Case, rng: random.Random) -> Case | None:
    spot = _pick(rng, case, lambda ops, i: isinstance(ops[i], NewGroup) and not ops[i].use_local_synchronization)
    if spot is None:
        return None
    r, i, ops = spot
    removed = ops.pop(i)
    return _with(case, r, ops, "skip-new-group", f"left out #{i} {removed.describe()}")


def _swap_creation(case: Case, rng: random.Random) -> Case | None:
    def ok(ops: list[Op], i: int) -> bool:
        return (
            i + 1 < len(ops)
            and isinstance(ops[i], NewGroup)
            and isinstance(ops[i + 1], NewGroup)
            and not ops[i].use_local_synchronization
            and not ops[i + 1].use_local_synchronization  # type: ignore[attr-defined]
            and ops[i].ranks != ops[i + 1].ranks  # type: ignore[attr-defined]
        )

    spot = _pick(rng, case, ok)
    if spot is None:
        return None
    r, i, ops = spot
    ops[i], ops[i + 1] = ops[i + 1], ops[i]
    return _with(case, r, ops, "swap-creation", f"swapped #{i} and #{i + 1}")


def _skip_recv(case: Case, rng: random.Random) -> Case | None:
    spot = _pick(rng, case, lambda ops, i: isinstance(ops[i], Recv))
    if spot is None:
        return None
    r, i, ops = spot
    removed = ops.pop(i)
    return _with(case, r, ops, "skip-recv", f"left out #{i} {removed.describe()}")


def _resize(case: Case, rng: random.Random) -> Case | None:
    spot = _pick(rng, case, lambda ops, i: isinstance(ops[i], Collective | Send) and ops[i].name != "barrier")
    if spot is None:
        return None
    r, i, ops = spot
    op = ops[i]
    assert isinstance(op, Collective | PointToPoint)
    ops[i] = replace(op, size_bytes=op.size_bytes * 2)
    return _with(case, r, ops, "resize", f"#{i} {op.describe()} with {op.size_bytes * 2} bytes")


def _wrong_root(case: Case, rng: random.Random) -> Case | None:
    def ok(ops: list[Op], i: int) -> bool:
        op = ops[i]
        return (
            isinstance(op, Broadcast)
            and len(case.part_of(op.group, op.src)) > 1
            and op.src in case.part_of(op.group, op.src)
        )

    spot = _pick(rng, case, ok)
    if spot is None:
        return None
    r, i, ops = spot
    op = ops[i]
    assert isinstance(op, Broadcast)
    others = [m for m in case.part_of(op.group, op.src) if m != op.src]
    src = rng.choice(others)
    ops[i] = replace(op, src=src)
    return _with(case, r, ops, "wrong-root", f"#{i} {op.describe()} rooted at {src}")


def _raise(case: Case, rng: random.Random) -> Case | None:
    spot = _pick(rng, case, lambda ops, i: i > 0)  # after init: a rank that never joins is another test
    if spot is None:
        return None
    r, i, ops = spot
    ops.insert(i, Raise(error_type="AssertionError", message="injected by real diff"))
    return _with(case, r, ops[:MAX_OPS], "raise", f"raises before #{i}")


def _use_after_destroy(case: Case, rng: random.Random) -> Case | None:
    """A rank that destroyed a subgroup issues an all_reduce on its handle afterwards (before any world destroy)."""

    def ok(ops: list[Op], i: int) -> bool:
        op = ops[i]
        return isinstance(op, DestroyProcessGroup) and op.group != WORLD and len(ops) < MAX_OPS

    spot = _pick(rng, case, ok)
    if spot is None:
        return None
    r, i, ops = spot
    destroyed = ops[i]
    assert isinstance(destroyed, DestroyProcessGroup)
    end = next((j for j in range(i + 1, len(ops)) if ops[j] == DestroyProcessGroup()), len(ops))
    at = rng.randint(i + 1, end)
    ops.insert(at, AllReduce(group=destroyed.group, size_bytes=SIZE_BYTES))
    return _with(case, r, ops, "use-after-destroy", f"all_reduce on {destroyed.group!r} at #{at}, destroyed at #{i}")


def _live_handles(case: Case, rank: int, ops: Sequence[Op], i: int) -> list[str]:
    """The handles naming a group of ``rank`` (a member) that is alive at its op ``i``."""
    live = [WORLD]
    for op in ops[:i]:
        if isinstance(op, NewGroup | SplitGroup) and op.bind and case.part_of(op.bind, rank):
            live.append(op.bind)
        elif isinstance(op, DestroyProcessGroup):
            live = [] if op.group == WORLD else [h for h in live if h != op.group]
    return sorted(set(live))


def _wrong_group(case: Case, rng: random.Random) -> Case | None:
    """The rank issues one of its collectives on another group it is a member of (a broadcast keeps its root's
    index in the part, so the root is a member of the new group)."""
    spots = [
        (r, i, h)
        for r, p in enumerate(case.programs)
        for i, op in enumerate(p.ops)
        if isinstance(op, Collective)
        for h in _live_handles(case, r, p.ops, i)
        if h != op.group
    ]
    if not spots:
        return None
    r, i, handle = rng.choice(spots)
    ops = list(case.programs[r].ops)
    op = ops[i]
    assert isinstance(op, Collective)
    if isinstance(op, Broadcast):
        old = case.part_of(op.group, r) or (op.src,)
        new = case.part_of(handle, r)
        ops[i] = replace(op, group=handle, src=new[old.index(op.src) % len(new)] if op.src in old else new[0])
    else:
        ops[i] = replace(op, group=handle)
    return _with(case, r, ops, "wrong-group", f"#{i} {op.describe()} on {handle!r}")


_MUTATORS: dict[str, Callable[[Case, random.Random], Case | None]] = {
    "skip-collective": _skip_collective,
    "swap-collectives": _swap_collectives,
    "skip-new-group": _skip_new_group,
    "swap-creation": _swap_creation,
    "skip-recv": _skip_recv,
    "resize": _resize,
    "wrong-root": _wrong_root,
    "raise": _raise,
    "use-after-destroy": _use_after_destroy,
    "wrong-group": _wrong_group,
}


def cases(seed: int, count: int, mutations: Sequence[str] = MUTATIONS) -> list[Case]:
    """``count`` cases of ``seed`` whose mutation (if any) is in ``mutations``."""
    out: list[Case] = []
    index = 0
    while len(out) < count and index < count * 20:
        case = generate(seed, index)
        if case.mutation is None or case.mutation in mutations:
            out.append(case)
        index += 1
    return out


# ---------------------------------------------------------------------------------------------- running


def simulate_case(case: Case, inherited: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The simulator's Result-shaped dict for a case, with gloo semantics on a CPU-less-agnostic cluster.

    ``inherited``: the knobs the real ranks inherit from the launcher's environment; those simnccl can run are
    run here too (``simulated_knobs``)."""
    from simnccl.cluster import Cluster, get_gpu_kind
    from simnccl.engine import Engine, SimConfig
    from simnccl.policy import BasePolicy
    from simnccl.profiles import find_profile
    from simnccl.real.launch import installed_release, simulated_knobs
    from simnccl.release import get_release
    from simnccl.result import VariantResult

    release_key = installed_release() or "2.15"
    env = simulated_knobs(inherited)
    gpu = get_gpu_kind("h100-80gb")
    config = SimConfig(
        cluster=Cluster(gpu, 1, case.world_size, None),
        release=get_release(release_key),
        profile=find_profile("h100-80gb", release_key),
        programs=case.programs,
        launcher="spawn",
        policy=BasePolicy(),
        env=env,
    )
    engine = Engine(config)
    outcome = engine.run()
    return VariantResult(
        name=case.name,
        description="",
        release=release_key,
        torch_version=get_release(release_key).version,
        profile=config.profile.name,
        env=env,
        policy="torch-default",
        outcome=outcome,
    ).to_dict()


@dataclass
class CaseResult:
    case: Case
    comparison: Any  # simnccl.real.compare.VariantComparison

    @property
    def agree(self) -> bool:
        return bool(self.comparison.agree)

    def describe(self) -> str:
        from simnccl.real.compare import render_comparison

        report = {
            "scenario": self.case.name,
            "source": "generated",
            "lane": "cpu",
            "ok": self.agree,
            "variants": [self.comparison.to_dict(full=True)],
        }
        return self.case.describe() + "\n" + render_comparison(report)


def classify(result: CaseResult) -> str:
    """``agree`` | ``racy`` | ``known-gap`` | ``disagree`` (see the module docstring)."""
    c = result.comparison
    if c.agree and not c.racy:
        return "agree"
    if c.racy:
        return "racy" if c.finished_agree or c.verdict_racy else "disagree"
    if c.known_gap is not None:
        return "known-gap"
    return "disagree"


def summary(results: Sequence[CaseResult]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[classify(r)] = counts.get(classify(r), 0) + 1
    gaps: dict[str, int] = {}
    for r in results:
        if classify(r) == "known-gap":
            gap = str(r.comparison.known_gap)
            gaps[gap] = gaps.get(gap, 0) + 1
    parts = [f"{k} {counts[k]}" for k in ("agree", "racy", "known-gap", "disagree") if k in counts]
    text = f"{len(results)} cases: " + ", ".join(parts)
    if gaps:
        text += " (known gaps: " + ", ".join(f"{k} x{v}" for k, v in sorted(gaps.items())) + ")"
    return text


def run_cases(
    case_list: Sequence[Case],
    *,
    launcher: Any = None,
    settings: Any = None,
    parallel: int = 3,
) -> list[CaseResult]:
    """Each case on real gloo and in the simulator; worlds run ``parallel`` at a time (hung ranks idle)."""
    from simnccl.real.compare import compare_variant
    from simnccl.real.launch import Launcher, RunSettings

    settings = settings or RunSettings.for_lane("cpu", stall_s=5.0, timeout_s=30.0)
    own = launcher is None
    launcher = launcher or Launcher()

    def one(case: Case) -> CaseResult:
        real = launcher.run_programs(case.programs, settings, name=case.name, release="")
        sim = simulate_case(case, launcher.inherited_env())
        return CaseResult(case, compare_variant(case.name, "cpu", sim, real, case.world_size, 0.0))

    try:
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return list(pool.map(one, case_list))
    finally:
        if own:
            launcher.close()

"""Faults as data: a schedule generated from one seed, printed in full before the run, replayed exactly.

Why data (testing-practices §1-3): a fault run is only useful if it can be replayed bit for bit, so the seed
is the whole identity of the schedule, every random choice comes from one ``random.Random(seed)``, and the
expanded schedule is printed first. Swarm testing: each generated schedule switches whole fault classes on
or off, instead of always mixing everything.

Two kinds of fault: those that *rewrite a rank's program* (``skip`` a collective, a size ``mismatch``) and
those the engine *injects while running* (``crash``/``gpu-crash`` at an op or a time, ``stall``,
``straggler``, ``oom-at-init``, ``store-timeout``, ``nccl-error``, ``link-straggler``, ``watchdog-stuck``).
The cudaMallocAsync abort is the ``PYTORCH_CUDA_ALLOC_CONF`` environment, not a fault: it is the 2.15 defect
itself.

Stragglers come in two kinds because they are found in different places: a ``straggler`` *rank* runs its own
local work ``factor`` times slower (the others wait for it at the next collective), a ``link-straggler``
slows the wire between two ranks' endpoints — their two nodes when the ranks sit on different nodes, their two
GPUs when they share a node — so every collective or point-to-point whose communicator has a member on each
end takes ``factor`` times longer, while every rank's local work stays on time. ``watchdog-stuck`` is a
process whose NCCL watchdog thread (and main thread) blocks inside a CUDA/NCCL call — a hung
``cudaEventQuery`` or ``ncclCommAbort``: only legacy's heartbeat monitor notices (see ``simnccl.watchdog``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from simnccl.ops import Barrier, Collective, Compute, NewGroup, Op, Program

PROGRAM_FAULTS = ("skip", "mismatch")
RUNTIME_FAULTS = (
    "crash",
    "gpu-crash",
    "stall",
    "straggler",
    "oom-at-init",
    "store-timeout",
    "nccl-error",
    "link-straggler",
    "watchdog-stuck",
)
# Faults that need a time or an op to happen at; the others hold from the start (stragglers) or arm on the
# rank's next communicator (oom-at-init, store-timeout).
TIMED_FAULTS = ("crash", "gpu-crash", "stall", "nccl-error", "watchdog-stuck")
# Faults that slow a rank or a link by ``factor`` for the whole run.
STRAGGLER_FAULTS = ("straggler", "link-straggler")
FAULT_KINDS = PROGRAM_FAULTS + RUNTIME_FAULTS
# The optional fields each kind acts on. Anything else given is refused, not ignored: a crash with a factor, an
# oom-at-init at an op (it fails the rank's next communicator init, whenever that is), a store-timeout at a time
# (its at_op picks which bootstrap) would otherwise read as a fault the run never had.
FAULT_FIELDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(PROGRAM_FAULTS, ("at_op",)),
    **dict.fromkeys(TIMED_FAULTS, ("at_op", "at_s")),
    "straggler": ("factor",),
    "link-straggler": ("factor", "peer"),
    "oom-at-init": (),
    "store-timeout": ("at_op",),
}


class FaultError(ValueError):
    """A malformed fault (unknown kind, a rank or op index that does not exist)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault. ``at_op`` is an index into the rank's program; ``at_s`` a simulated time; ``peer`` the
    other end of a ``link-straggler``'s link (a rank: the link is between the two ranks' nodes, or between
    their GPUs when both sit on one node)."""

    kind: str
    rank: int
    at_op: int | None = None
    at_s: float | None = None
    factor: float = 1.0
    peer: int | None = None

    def describe(self) -> str:
        where = []
        if self.at_op is not None:
            where.append(f"at op {self.at_op}")
        if self.at_s is not None:
            where.append(f"at t={self.at_s:g}s")
        if self.kind in STRAGGLER_FAULTS:
            where.append(f"x{self.factor:g} slower")
        who = f"rank {self.rank}" if self.peer is None else f"link rank {self.rank}<->rank {self.peer}"
        return f"{self.kind} {who}" + (f" {' '.join(where)}" if where else "")


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    seed: int | None
    classes: tuple[str, ...]
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        """The schedule, first line then one line per fault. Only a generated schedule has a seed of its own
        ([faults] seed); an injected-only one says so instead of printing ``seed=None`` next to the run's
        header ``seed=0`` (the scenario's seed, a different thing)."""
        if self.seed is None:
            head = f"fault schedule: {len(self.faults)} injected, none generated (no [faults] seed)"
        else:
            head = f"fault schedule seed={self.seed} classes={','.join(self.classes) or '-'}"
        return "\n".join([head, *(f"  {i}: {f.describe()}" for i, f in enumerate(self.faults))])

    def runtime(self) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.kind in RUNTIME_FAULTS)


NO_FAULTS = FaultSchedule(None, (), ())


def validate(fault: Fault, programs: Sequence[Program]) -> None:
    if fault.kind not in FAULT_KINDS:
        raise FaultError(f"unknown fault kind {fault.kind!r}; expected one of {', '.join(FAULT_KINDS)}")
    if not 0 <= fault.rank < len(programs):
        raise FaultError(f"fault {fault.describe()}: rank {fault.rank} outside the world of {len(programs)}")
    ops = programs[fault.rank].ops
    if fault.at_op is not None and not 0 <= fault.at_op < len(ops):
        raise FaultError(f"fault {fault.describe()}: rank {fault.rank}'s program has {len(ops)} ops")
    if fault.kind in PROGRAM_FAULTS and (fault.at_op is None or not isinstance(ops[fault.at_op], Collective)):
        raise FaultError(f"fault {fault.describe()}: needs at_op pointing at a collective of that rank")
    if fault.kind == "mismatch":
        why = cannot_mismatch(ops[fault.at_op])  # type: ignore[index]
        if why is not None:
            raise FaultError(f"fault {fault.describe()}: {why}")
    if fault.kind in STRAGGLER_FAULTS:
        if not (fault.factor >= 1 and math.isfinite(fault.factor)):
            raise FaultError(f"fault {fault.describe()}: a straggler's factor must be a finite number >= 1")
        if fault.at_op is not None or fault.at_s is not None:
            raise FaultError(
                f"fault {fault.describe()}: a straggler is slow from the start; at_op/at_s are not supported"
            )
    if fault.kind in TIMED_FAULTS and fault.at_op is None and fault.at_s is None:
        raise FaultError(f"fault {fault.describe()}: needs at_op or at_s")
    if fault.at_op is not None and fault.at_s is not None:
        raise FaultError(f"fault {fault.describe()}: give at_op or at_s, not both")
    if fault.at_s is not None and not (fault.at_s >= 0 and math.isfinite(fault.at_s)):
        raise FaultError(f"fault {fault.describe()}: at_s must be a time >= 0 and finite")
    if fault.kind == "link-straggler":
        if fault.peer is None or not 0 <= fault.peer < len(programs) or fault.peer == fault.rank:
            raise FaultError(
                f"fault {fault.describe()}: a link-straggler needs peer, another rank of the world of {len(programs)}"
            )
    elif fault.peer is not None:
        raise FaultError(f"fault {fault.describe()}: peer is only meaningful for a link-straggler")
    unused = unused_fields(fault.kind, given_fields(fault))
    if unused:
        raise FaultError(f"fault {fault.describe()}: {unused[0]} is not used by a fault of kind {fault.kind!r}")


def cannot_mismatch(op: Op) -> str | None:
    """Why a size ``mismatch`` on ``op`` could change nothing, or None.

    Why refused at load rather than run: the rewrite doubles the op's bytes, and on these the doubled op is the same
    op, so the run passed with a fault that never acted (found by a tester: trace hash identical to the run
    without it). A barrier's size is torch's own one-element tensor, which no program sets; 0 bytes doubled is 0."""
    if isinstance(op, Barrier):
        return "a barrier has no size a program sets (torch's own one-element tensor): nothing to mismatch"
    if isinstance(op, Collective) and op.size_bytes == 0:
        return "the collective moves 0 bytes, and twice 0 is 0: nothing to mismatch"
    return None


def given_fields(fault: Fault) -> tuple[str, ...]:
    """The optional fields a fault sets (a factor of 1 is the default: not set)."""
    values = {"at_op": fault.at_op, "at_s": fault.at_s, "peer": fault.peer}
    return tuple(name for name, value in values.items() if value is not None) + (
        ("factor",) if fault.factor != 1.0 else ()
    )


def unused_fields(kind: str, given: Sequence[str]) -> list[str]:
    """The fields of ``given`` that a fault of ``kind`` does not act on (``FAULT_FIELDS``)."""
    uses = FAULT_FIELDS.get(kind, ())
    return [name for name in given if name not in uses]


def check_program_faults_distinct(faults: Sequence[Fault]) -> None:
    """At most one program fault (skip, mismatch) per rank and op: both rewrite that op, and a skipped
    collective has no size left to mismatch. Likewise at most one timed fault (crash, stall, nccl-error, ...)
    per rank and op: the engine acts out one fault before an op (``Injection.op_faults``), so a second one
    silently replaced the first while the printed schedule still showed both."""
    seen: dict[tuple[str, int, int | None], Fault] = {}
    for fault in faults:
        if fault.kind in PROGRAM_FAULTS:
            where = "program"
        elif fault.kind in TIMED_FAULTS and fault.at_op is not None:
            where = "timed"
        elif fault.kind in ONCE_PER_RANK:
            where = fault.kind
        else:
            continue
        first = seen.setdefault((where, fault.rank, fault.at_op), fault)
        if first is fault:
            continue
        if where in ONCE_PER_RANK:
            raise FaultError(f"faults {first.describe()} and {fault.describe()} {ONCE_PER_RANK[where]}")
        raise FaultError(f"faults {first.describe()} and {fault.describe()} hit the same op of one rank")


# Faults of which a rank holds one: a second one was accepted and silently had no effect of its own.
ONCE_PER_RANK = {
    "straggler": "both slow one rank: only one factor would apply",
    "oom-at-init": "both fail one rank's next communicator init: it fails once",
    "store-timeout": "both time out the same bootstrap of one rank: it times out once",
}


def apply_to_programs(schedule: FaultSchedule, programs: Sequence[Program]) -> list[Program]:
    """Rewrite the programs of the ranks a program fault hits (only those get their own copy)."""
    out = list(programs)
    check_program_faults_distinct(schedule.faults)
    for fault in schedule.faults:
        validate(fault, programs)
        if fault.kind not in PROGRAM_FAULTS:
            continue
        assert fault.at_op is not None
        ops = list(out[fault.rank].ops)
        target = ops[fault.at_op]
        if fault.kind == "skip":
            ops[fault.at_op] = Compute(seconds=0.0)  # keeps later op indexes stable
        else:
            assert isinstance(target, Collective)
            ops[fault.at_op] = replace(target, size_bytes=target.size_bytes * 2)
        out[fault.rank] = Program(tuple(ops))
    return out


def generate(
    seed: int,
    programs: Sequence[Program],
    *,
    classes: Sequence[str] | None = None,
    max_faults: int = 2,
) -> FaultSchedule:
    """A swarm schedule: pick enabled classes (each on with probability 1/2 unless given), then faults."""
    if max_faults < 0:
        raise FaultError(f"max_faults must be >= 0, got {max_faults}")
    rng = random.Random(seed)
    pool = list(classes) if classes is not None else [k for k in FAULT_KINDS if rng.random() < 0.5]
    for kind in pool:
        if not isinstance(kind, str) or kind not in FAULT_KINDS:
            raise FaultError(f"unknown fault class {kind!r}; expected one of {', '.join(FAULT_KINDS)}")
    # A set of classes: drawn from in FAULT_KINDS' order whatever order they were given in (["crash", "stall",
    # "skip"] and ["skip", "stall", "crash"] drew two schedules under one seed, and the header printed both alike)
    pool = [kind for kind in FAULT_KINDS if kind in pool]
    faults: list[Fault] = []
    world = len(programs)
    for _ in range(rng.randint(0, max_faults) if pool else 0):
        kind = rng.choice(pool)
        rank = rng.randrange(world)
        ops = programs[rank].ops
        collectives = [i for i, op in enumerate(ops) if isinstance(op, Collective)]
        if kind in PROGRAM_FAULTS:
            if not collectives:
                continue
            at_op = rng.choice(collectives)
            if any(f.kind in PROGRAM_FAULTS and (f.rank, f.at_op) == (rank, at_op) for f in faults):
                continue  # one rewrite per op (check_program_faults_distinct)
            if kind == "mismatch" and cannot_mismatch(ops[at_op]) is not None:
                continue  # validate refuses it; dropped after the draw, so the stream of draws stays as it was
            faults.append(Fault(kind, rank, at_op=at_op))
        elif kind == "straggler":
            factor = round(rng.uniform(1.5, 10.0), 2)  # drawn first: the stream of draws stays as it was
            if any(f.kind == kind and f.rank == rank for f in faults):
                continue  # one factor per rank (check_program_faults_distinct)
            faults.append(Fault(kind, rank, factor=factor))
        elif kind == "link-straggler":
            if world < 2:
                continue
            peer = rng.choice([r for r in range(world) if r != rank])
            faults.append(Fault(kind, rank, factor=round(rng.uniform(1.5, 10.0), 2), peer=peer))
        elif kind in ("oom-at-init", "store-timeout"):
            if any(f.kind == kind and f.rank == rank for f in faults):
                continue  # it acts once per rank (check_program_faults_distinct)
            faults.append(Fault(kind, rank))
        else:
            candidates = [i for i, op in enumerate(ops) if isinstance(op, (Collective, NewGroup))] or [0]
            at_op = rng.choice(candidates)
            if any(f.kind in TIMED_FAULTS and (f.rank, f.at_op) == (rank, at_op) for f in faults):
                continue  # one timed fault per op (check_program_faults_distinct)
            faults.append(Fault(kind, rank, at_op=at_op))
    return FaultSchedule(seed, tuple(sorted(pool)), tuple(faults))

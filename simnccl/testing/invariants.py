"""Invariant checkers: one function per property, each returning a ``Verdict`` with a human explanation.

Why a verdict and not an assert: the same checks run in hypothesis properties, in the stateful test after
every step, and in users' own suites; a ``Verdict`` says *what* broke in words a failure report can print
(torchft style), and ``assert verdict, verdict.explanation`` is all a test needs.

Every checker can fail: ``tests/test_invariants.py`` feeds each one an outcome that breaks it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from simnccl.c10d import NON_GROUP_MEMBER, Group
from simnccl.comm_memory import Pricer, eager_group_mib
from simnccl.engine import RunOutcome
from simnccl.engine.memory import PROCESS_FIRST_COMM, PROCESS_OWNER
from simnccl.engine.outcome import devices_short_of, pass_decided_by_race
from simnccl.memory import mib_to_bytes
from simnccl.ops import WORLD, Collective, Compute, InitProcessGroup, NewGroup, Op, PointToPoint, SplitGroup
from simnccl.profiles import find_profile
from simnccl.release import DEFAULT_PG_NCCL_TIMEOUT_S, DEFAULT_PG_TIMEOUT_S
from simnccl.visible_text import one_line

MIB = 2**20


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    explanation: str

    def __bool__(self) -> bool:
        return self.ok


def _ok(text: str) -> Verdict:
    return Verdict(True, text)


def _fail(text: str) -> Verdict:
    return Verdict(False, text)


def _replayable(check: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """A checker whose failure on a generated case is noted for the case file, so that ``python -m
    simnccl.testing.replay`` re-runs this check (not only the simulation). ``__wrapped__`` is the bare check."""

    @functools.wraps(check)
    def noted(outcome: RunOutcome, *args: Any, **kwargs: Any) -> Verdict:
        verdict = check(outcome, *args, **kwargs)
        if not verdict:
            from simnccl.testing import replay

            replay.note_failed_check(outcome, check.__name__, args, kwargs, verdict.explanation)
        return verdict

    return noted


def _hang_text(h: Mapping[str, Any]) -> str:
    return f"rank {h['rank']} hangs in {h['op']} (op #{h.get('op_index')}) waiting for {h['waiting_for']}: " + str(
        h["explanation"]
    )


def _error_text(e: Mapping[str, Any]) -> str:
    return f"rank {e['rank']} {e['kind']} in {e['op']}: {e['type']}: {str(e['message']).splitlines()[0]}"


# ---------------------------------------------------------------------- liveness


@_replayable
def passes(outcome: RunOutcome) -> Verdict:
    """A valid program runs to completion on every rank: verdict ``pass``, no hang, no error, and not by a race
    the simulated timing decided (``pass_decided_by_race``: real runs may take the other order and fail)."""
    if outcome.verdict == "pass" and not outcome.hangs and not outcome.errors:
        raced = pass_decided_by_race(outcome)
        return _ok("every rank finished its program") if raced is None else _fail(raced)
    lines = [f"verdict {outcome.verdict!r}"]
    lines += [_hang_text(h) for h in outcome.hangs[:4]]
    lines += [_error_text(e) for e in outcome.errors[:4]]
    return _fail("; ".join(lines))


# A bound on how long a rank of a generated program waits for its peers when none of them computes: every rank
# issues the same steps, so a wait is another rank's op still running (communicator inits, bootstraps, store
# barriers: measured under 1 s in generated programs of up to 16 ranks, where 0.1 s timeouts fire), not a
# straggler's work. Generous on purpose: it only decides which programs ``may_time_out``.
INTRINSIC_WAIT_S = 5.0

# The shortest timeout torch gives a group created without one (``_get_default_timeout``: 10 minutes for NCCL).
_SHORTEST_DEFAULT_TIMEOUT_S = min(DEFAULT_PG_NCCL_TIMEOUT_S, DEFAULT_PG_TIMEOUT_S)


def may_time_out(programs: Sequence[Sequence[Op]]) -> bool:
    """Whether some wait in ``programs`` might outlast a timeout: the shortest timeout any group or
    ``init_process_group`` was given (a default one counts as 10 minutes) is no longer than every rank's
    computes together plus ``INTRINSIC_WAIT_S``.

    Why a bound and not a prediction: which op a rank waits at for a straggler, and under which group's
    timeout, depends on the policy (lazy creation moves the wait) and on which ranks share a part. A program
    that cannot time out must pass (``passes``); one that may must pass, or be stopped by timeouts alone and
    pass without them (``passes_or_times_out``)."""
    computes = sum(op.seconds for program in programs for op in program if isinstance(op, Compute))
    timeouts = [
        op.timeout_s
        for program in programs
        for op in program
        if isinstance(op, InitProcessGroup | NewGroup | SplitGroup) and op.timeout_s is not None
    ]
    return min((*timeouts, _SHORTEST_DEFAULT_TIMEOUT_S)) <= computes + INTRINSIC_WAIT_S


def without_timeouts(programs: Sequence[Sequence[Op]]) -> tuple[tuple[Op, ...], ...]:
    """``programs`` with every group's and ``init_process_group``'s timeout back at its default (ranks that
    shared a program still share one): what a program that timed out must do instead, pass."""
    done: dict[int, tuple[Op, ...]] = {}
    out = []
    for program in programs:
        if id(program) not in done:
            done[id(program)] = tuple(
                replace(op, timeout_s=None) if isinstance(op, InitProcessGroup | NewGroup | SplitGroup) else op
                for op in program
            )
        out.append(done[id(program)])
    return tuple(out)


# What a watchdog, a timed-out wait or the heartbeat monitor files: the errors of a wait that outlasted its
# timeout, on the rank that waited and on the ranks its abort left waiting.
_TIMEOUT_KINDS = frozenset({"timeout", "heartbeat"})


def passes_or_times_out(outcome: RunOutcome, untimed: RunOutcome) -> Verdict:
    """A valid program that ``may_time_out`` passes, or is stopped by timeouts alone: every error a timed-out
    wait's, and ``untimed`` -- the same run with every timeout at its default (``without_timeouts``) -- passes.

    Why the second run: a deadlock's ranks time out too (their watchdogs file the same errors), so the errors
    alone cannot tell a straggler outlasting a short timeout from a policy that broke the program."""
    if verdict := passes(outcome):
        return verdict
    if (raced := pass_decided_by_race(outcome)) is not None:
        return _fail(raced)
    other = [e for e in outcome.errors if e["kind"] not in _TIMEOUT_KINDS]
    if other or not outcome.errors:
        lines = [f"verdict {outcome.verdict!r}, not stopped by timeouts alone"]
        lines += [_error_text(e) for e in other[:4]] or [_hang_text(h) for h in outcome.hangs[:4]]
        return _fail("; ".join(lines))
    if not (v := passes(untimed)):
        return _fail(f"it timed out, and with its timeouts at their defaults it does not pass either: {v.explanation}")
    return _ok(f"stopped by timeouts alone ({_error_text(outcome.errors[0])}); passes with default timeouts")


def blamed_ranks(outcome: RunOutcome) -> set[int]:
    """The ranks a report points at, where a person would look first.

    * a rank that failed on its own (an error that is not the watchdog's verdict on a hang: the rank has no
      hang entry) — e.g. the NameError of a rank that never bound the handle;
    * the ranks a hung rank is ``waiting_for`` (the stragglers, not the ranks that are ahead);
    * ``rank N`` named by a hang explanation (a size or split mismatch names the rank that disagreed), or
      the subject ``ranks [...]`` of a clause ("ranks [1, 3] already bootstrapped ... under that name").

    Watchdog timeouts are symptoms: every hung rank gets one, so counting them would blame everybody. So is a
    gloo peer-lost error: the peer it names, whose sockets closed (it aborted, or destroyed its groups early), is
    the one to look at; counting the rank itself made every neighbour of a rank that died a "culprit".
    """
    hung = {h["rank"] for h in outcome.hangs}
    timed_out = {e["rank"] for e in outcome.errors if e["rank"] in hung or e["kind"] in ("timeout", "peer-lost")}
    named: set[int] = {e["rank"] for e in outcome.errors if e["rank"] not in timed_out}
    for e in outcome.errors:
        if e["kind"] == "peer-lost":
            named.update(int(r) for r in _PEER.findall(str(e["message"])))
    for h in outcome.hangs:
        named.update(h["waiting_for"])
        for clause in str(h["explanation"]).split("; "):
            died = _DIED.match(clause)
            if died and int(died.group(1)) in timed_out:
                continue  # "rank N died: / raised <watchdog timeout>" is a symptom of the same hang
            named.update(int(r) for r in _RANK.findall(clause))
            for listed in _RANKS_SUBJECT.findall(clause):
                named.update(int(r) for r in listed.split(",") if r.strip())
    return named


_RANK = re.compile(r"\brank (\d+)\b")
_PEER = re.compile(r"\(rank (\d+)\)")  # gloo's "Read error (rank 1): Connection reset by peer" (the closed peer)
_DIED = re.compile(r"^rank (\d+) (?:died: |raised )")
_RANKS_SUBJECT = re.compile(r"(?:^|: )ranks \[([0-9, ]+)\]")  # "...: ranks [1, 3] already bootstrapped ..."


@_replayable
def names_culprit(outcome: RunOutcome, culprits: Iterable[int]) -> Verdict:
    """A broken program does not pass, and the report blames a culprit (see ``blamed_ranks``)."""
    blamed = tuple(culprits)
    if outcome.verdict == "pass":
        return _fail(f"the defect went unnoticed: verdict 'pass' (culprits {list(blamed)})")
    hit = sorted(blamed_ranks(outcome) & set(blamed))
    if hit:
        return _ok(f"verdict {outcome.verdict!r} names culprit rank(s) {hit}")
    details = "; ".join([_hang_text(h) for h in outcome.hangs[:3]] + [_error_text(e) for e in outcome.errors[:3]])
    return _fail(f"verdict {outcome.verdict!r} but no culprit of {list(blamed)} is named: {details}")


# ---------------------------------------------------------------------- memory


@_replayable
def within_capacity(outcome: RunOutcome) -> Verdict:
    """No device's peak use ever exceeds its capacity, and no device ends with negative or over-full use; and no
    rank ran out of memory. Why the last: the simulated allocator raises before a device goes past its capacity
    (as CUDA's does), so a peak above it never happens, and an OOM was the only way to exceed it: the check passed
    runs where a rank asked for 200 GB on an 80 GB device.

    It judges the memory the run reached: a run that hung or failed before allocating the rest holds here for
    what it never allocated, so assert ``passes`` beside it (its success text says so where the run did not pass;
    found by a tester: it held on a run whose every rank raised at its first op)."""
    bad = [f"rank {e['rank']}: {e['type']}: {one_line(e['message'])}" for e in outcome.errors if e["kind"] == "oom"]
    for device, ledger in sorted(outcome.ledgers.items()):
        if ledger.peak_bytes > ledger.total_bytes:
            bad.append(
                f"{device}: peak {ledger.peak_bytes / MIB:.1f} MiB > capacity {ledger.total_bytes / MIB:.1f} MiB"
            )
        if not 0 <= ledger.used_bytes <= ledger.peak_bytes:
            bad.append(f"{device}: used {ledger.used_bytes} B outside [0, peak {ledger.peak_bytes} B]")
    if bad:
        return _fail("; ".join(bad))
    reached = "" if outcome.verdict == "pass" else f" as far as the run got (it ended {outcome.verdict})"
    return _ok(f"{len(outcome.ledgers)} device(s) within capacity{reached}")


def eager_group_bytes(gpu: str, release: str, env: Mapping[str, str]) -> int:
    """The most a one- or two-rank group on one node charges a member at an eager creation, on this profile and
    env (``simnccl.comm_memory.eager_group_mib``): the least ``budget(X)`` prices a group at, and what it prices
    every group at where connections are made at first use (the default)."""
    return mib_to_bytes(eager_group_mib(find_profile(gpu, release), env))


def group_creation_bytes(
    programs: Sequence[Sequence[Op]], *, gpu: str, release: str, env: Mapping[str, str], gpus_per_node: int
) -> int:
    """The most any ``new_group`` of ``programs`` charges one of its members at an eager creation, by the model:
    the ``group_bytes`` to give ``within_budget`` where ``eager_group_bytes`` does not bound every group (with
    ``NCCL_RUNTIME_CONNECT=0`` a group of more ranks, or on more nodes, costs more at init)."""
    pricer = Pricer(find_profile(gpu, release), lambda rank: rank // gpus_per_node)
    world = tuple(range(len(programs)))
    calls = {
        (world if op.ranks is None else tuple(op.ranks), op.pg_options)
        for program in programs
        for op in program
        if isinstance(op, NewGroup)
    }
    return max((pricer.most_init_bytes(ranks, env, options) for ranks, options in calls), default=0)


@_replayable
def within_budget(
    outcome: RunOutcome,
    *,
    budget_mib: float,
    per_group_mib: float,
    group_bytes: int,
    before: str = "init",
    after: str = "groups",
) -> Verdict:
    """What ``budget(X, per)`` promises, stated exactly.

    BudgetPolicy makes a ``new_group`` eager only while every member's count of eager NCCL groups created by
    ``new_group`` stays within ``floor(X / per)``; the rest get ``lazy_init``. Eager groups are the only ones
    that allocate at creation, each at most ``group_bytes`` per member: ``eager_group_bytes`` while
    connections are made at first use (the default); with ``NCCL_RUNTIME_CONNECT=0`` a larger group costs more
    at init, so pass the most one of the program's groups costs (``group_creation_bytes``). So between the
    checkpoint ``before`` (after ``init_process_group``: CUDA context + world communicator) and ``after``
    (after group creation, before any use) every device may grow by at most::

        floor(X / per) * group_bytes

    which is ``<= X`` MiB exactly when ``per`` is at least the profile's per-group cost: the promise
    "context + world + X" holds only for a per-group estimate calibrated to the GPU. ``budget(X)`` without
    ``per`` prices each group by its layout (``Pricer.eager_group_bytes``, never below ``eager_group_bytes``),
    which keeps this count bound (pass ``per_group_mib = eager_group_bytes / MiB``) and promises more: no device
    grows by more than X MiB, whatever the layouts and NCCL_RUNTIME_CONNECT. NCCL's once-per-process
    overhead is the world's, not a group's: where a lazy default group leaves it to the first group creation,
    it is not counted as growth.
    """
    for name, value in (("budget_mib", budget_mib), ("per_group_mib", per_group_mib)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}: expected a finite number of MiB >= 0, got {value!r}")
    if per_group_mib == 0:
        raise ValueError("per_group_mib: expected a per-group cost > 0 (floor(budget / per) groups are eager)")
    allowed_groups = math.floor(budget_mib / per_group_mib + 1e-9)
    allowed = allowed_groups * group_bytes
    repeated = sorted({before, after} & outcome.repeated_checkpoints)
    if repeated:  # it read the last of several moments: a budget of one group passed six between 'init's
        return _fail(f"checkpoint {repeated[0]!r} was met more than once by a rank: name each moment once")
    start = outcome.checkpoints.get(before, {})
    end = outcome.checkpoints.get(after, {})
    if not end:
        return _fail(f"no checkpoint {after!r} was reached (verdict {outcome.verdict!r})")
    bad = [
        f"{device}: no {after!r} checkpoint (rank {', '.join(map(str, ranks))} ended before it)"
        for device, ranks in sorted(devices_short_of(outcome, after).items())
        if device not in end
    ]
    for device, snap in sorted(end.items()):
        base = start.get(device)
        if base is None:
            bad.append(f"{device}: no {before!r} checkpoint")
            continue
        grown = snap.used_bytes - base.used_bytes - _process_overhead_at_group_creation(outcome, device)
        if grown > allowed:
            bad.append(
                f"{device}: grew {grown / MIB:.1f} MiB between {before!r} and {after!r} > {allowed_groups} eager "
                f"group(s) x {group_bytes / MIB:.1f} MiB = {allowed / MIB:.1f} MiB (budget {budget_mib:g} MiB at "
                f"{per_group_mib:g} MiB per group)"
            )
    if bad:
        return _fail("; ".join(bad))
    return _ok(f"every device grew by at most {allowed_groups} x {group_bytes / MIB:.1f} MiB")


def _process_overhead_at_group_creation(outcome: RunOutcome, device: str) -> int:
    """NCCL's once-per-process overhead on ``device`` when a group creation paid it, not the default group's
    init: with a lazy default group (``TORCH_DIST_USE_NCCL2=0``, ``lazy-init``) the process's first
    communicator is a group's, and its overhead lands between ``init`` and ``groups`` although it is no group's
    cost. Found by the thorough profile (470.6 MiB = one 388.6 MiB group + 82 MiB of process overhead)."""
    ledger = outcome.ledgers.get(device)
    if ledger is None:
        return 0
    return sum(
        event.delta_bytes
        for event in ledger.timeline
        if event.owner.group == PROCESS_OWNER
        and event.owner.phase == PROCESS_FIRST_COMM
        and isinstance(event.op, NewGroup | SplitGroup)
    )


def _used_handles(programs: Sequence[Sequence[Op]], rank: int) -> set[str]:
    return {op.group for op in programs[rank] if isinstance(op, Collective | PointToPoint)}


@_replayable
def lazy_unused_allocate_nothing(outcome: RunOutcome, programs: Sequence[Op] | Sequence[Sequence[Op]]) -> Verdict:
    """Under ``lazy-init``, a group that never communicates allocates nothing on any member. ``programs``: what
    ``simulate`` was given (one op list for every rank, or one per rank).

    A group is unused on a rank when no handle the rank uses (in a collective or send/recv) is bound to it
    on that rank (a dedupe policy may bind two handles to one group); the default group counts too, since
    ``lazy-init`` makes it lazy as well. Checked against the ledgers' whole
    timelines, so an allocation that was freed again still counts.

    A ``split_group`` child is no such group: ncclCommSplit makes its communicator at the call, whatever
    ``lazy_init`` says (``simnccl.c10d.plan_split_group``), so no policy can leave it unallocated.
    """
    programs = _per_rank(programs, len(outcome.ranks))
    split_handles = {op.bind for program in programs for op in program if isinstance(op, SplitGroup) and op.bind}
    unused: dict[int, dict[str, Group]] = {}
    for rt in outcome.ranks:
        used = {id(rt.handles[h]) for h in _used_handles(programs, rt.rank) if h in rt.handles}
        used |= {id(rt.handles[h]) for h in split_handles if h in rt.handles}
        for group in rt.groups:
            if id(group) in used:
                continue
            unused.setdefault(rt.rank, {})[group.name] = group
    bad = []
    for ledger in outcome.ledgers.values():
        for event in ledger.timeline:
            owner = event.owner
            groups = unused.get(owner.rank, {})
            name = owner.group.split("/p2p-")[0]
            if owner.kind == "comm" and name in groups and event.delta_bytes > 0:
                bad.append(
                    f"rank {owner.rank} allocated {event.delta_bytes / MIB:.1f} MiB ({owner.phase}) for unused group "
                    f"{name!r} ranks {list(groups[name].ranks)} on {ledger.device}"
                )
    for record in outcome.groups.values():
        for rank, member in record.members.items():
            if record.name in unused.get(rank, {}) and member.get("bytes", 0) > 0:
                bad.append(f"groups table: rank {rank} holds {member['bytes']} B for unused group {record.name!r}")
    if bad:
        return _fail("; ".join(sorted(set(bad))[:6]))
    count = sum(len(g) for g in unused.values())
    return _ok(f"{count} unused (rank, group) pair(s) allocated nothing")


def final_used_bytes(outcome: RunOutcome) -> dict[str, int]:
    return {device: ledger.used_bytes for device, ledger in sorted(outcome.ledgers.items())}


def same_final_memory(eager: RunOutcome, lazy: RunOutcome) -> Verdict:
    """pytorch#199957's property: once every group has communicated, creating communicators eagerly or
    lazily ends at the same memory on every device (laziness moves the cost, it doesn't remove it)."""
    a, b = final_used_bytes(eager), final_used_bytes(lazy)
    diff = {d: (a.get(d, 0), b.get(d, 0)) for d in sorted(set(a) | set(b)) if a.get(d, 0) != b.get(d, 0)}
    if diff:
        text = "; ".join(f"{d}: eager {x / MIB:.1f} MiB vs lazy {y / MIB:.1f} MiB" for d, (x, y) in diff.items())
        return _fail(f"final memory differs: {text}")
    return _ok(f"{len(a)} device(s) end at the same memory")


def membership(outcome: RunOutcome) -> dict[int, dict[str, tuple[int, ...] | int]]:
    """Per rank: each bound handle's member ranks, or NON_GROUP_MEMBER (-100)."""
    out: dict[int, dict[str, tuple[int, ...] | int]] = {}
    for rt in outcome.ranks:
        handles: dict[str, tuple[int, ...] | int] = {}
        for handle, target in sorted(rt.handles.items()):
            handles[handle] = target.ranks if isinstance(target, Group) else int(target)
        out[rt.rank] = handles
    return out


def same_membership(
    reference: RunOutcome,
    other: RunOutcome,
    *,
    handles: Iterable[str] | None = None,
    names: tuple[str, str] = ("reference", "other"),
) -> Verdict:
    """Two runs of one program (e.g. under two policies) bind every handle to the same members on every rank
    (a dedupe policy's reuse binds an identical group, so it passes too). ``handles``: only these; each must be
    bound on some rank of either run (ValueError otherwise: a misspelt handle was "agreed on", never compared)."""
    a, b = membership(reference), membership(other)
    wanted = None
    if handles is not None:
        if isinstance(handles, str):
            raise TypeError(f"handles: expected a list of handle names, got the string {handles!r}")
        wanted = set(handles)
        bound = {key for run in (a, b) for held in run.values() for key in held}
        if not wanted:
            raise ValueError("handles: empty, so nothing would be compared; give None to compare every handle")
        unknown = sorted(map(repr, wanted - bound))
        if unknown:
            raise ValueError(
                f"handles: {', '.join(unknown)} bound on no rank of either run; bound: {', '.join(sorted(bound))}"
            )
    bad = []
    for rank in sorted(set(a) | set(b)):
        ha, hb = a.get(rank, {}), b.get(rank, {})
        keys = sorted(set(ha) | set(hb)) if wanted is None else sorted(wanted)
        for key in keys:
            if ha.get(key) != hb.get(key):
                bad.append(
                    f"rank {rank} handle {key!r}: {names[0]} {_members(ha.get(key))}, "
                    f"{names[1]} {_members(hb.get(key))}"
                )
    if bad:
        return _fail("; ".join(bad[:6]))
    which = "every handle" if wanted is None else f"handle(s) {', '.join(sorted(wanted))}"
    return _ok(f"{len(a)} rank(s) agree on {which}")


def _members(value: object) -> str:
    if value is None:
        return "unbound"
    if value == NON_GROUP_MEMBER:
        return "NON_GROUP_MEMBER"
    return str(list(value))  # type: ignore[call-overload]


def deterministic(first: RunOutcome, second: RunOutcome) -> Verdict:
    """The same case simulated twice gives the same event trace (hash), verdict and final memory."""
    bad = []
    if first.trace_hash != second.trace_hash:
        bad.append(
            f"trace hash {first.trace_hash} != {second.trace_hash} ({first.event_count} vs {second.event_count} events)"
        )
    if first.verdict != second.verdict:
        bad.append(f"verdict {first.verdict!r} != {second.verdict!r}")
    if final_used_bytes(first) != final_used_bytes(second):
        bad.append("final memory differs")
    if bad:
        return _fail("; ".join(bad))
    return _ok(f"trace hash {first.trace_hash} reproduced")


def handles_created(programs: Sequence[Sequence[Op]]) -> list[str]:
    """Every handle a program binds with new_group, in order, plus the world."""
    seen = [WORLD]
    for program in programs:
        for op in program:
            if isinstance(op, NewGroup) and op.bind and op.bind not in seen:
                seen.append(op.bind)
    return seen


def _per_rank(programs: Sequence[Op] | Sequence[Sequence[Op]], world_size: int) -> Sequence[Sequence[Op]]:
    """One op list per rank from what ``simulate`` takes (one list for every rank, or one per rank); a count of
    lists other than the run's ranks is a ValueError (a rank without its list went unchecked)."""
    if programs and isinstance(programs[0], Op):
        return [programs] * world_size  # type: ignore[list-item]
    if len(programs) != world_size:
        raise ValueError(f"programs: {len(programs)} op lists for a run of {world_size} ranks")
    return programs  # type: ignore[return-value]

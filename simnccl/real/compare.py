"""Simulated vs real, side by side: verdicts and stuck ranks (CPU lane), and memory per checkpoint (GPU lane).

CPU lane: the simulator runs the same gloo-rewritten programs (``simnccl.real.lanes.cpu_programs``) under the same
wrapped policy (``CpuLanePolicy``) at the installed torch release, without the scenario's fault injection — so
both sides answer the same question. Agreement means: the same verdict, the same set of ranks that did not finish
(stuck or failed), for a hang the same stuck ranks, no rank that raised on one side and is stuck on the other
(``status_differences``), for each rank that failed on both sides the same error kind and exception type
(``error_differences``), and for each rank stuck on both sides the same op (``stuck_op_differences``; what
inside the op it waits for, the hang's kind, is printed but not compared: the real run cannot see it). Where
each rank stopped (op index) is printed for both and marked when it differs. Where the simulator reports a
store-key collision (``racy``) only the verdict counts (``verdict_racy``: not even that): which rank of a
colliding gloo bootstrap wins the race is decided by timing in real life (see ``KNOWN_DIFFERENCES``).

Why kind and type: a simulator that names an exception torch never raises there (``torch.OutOfMemoryError``
where NCCL's failure is a ``RuntimeError``), or calls a peer's lost connection an abort, would otherwise pass
compare with the same verdict. Error messages are not compared, not even in part: the real ones carry socket
addresses, PIDs, times and torch's build paths, and the simulator's say what failed in its own words; what a
message decides (an OOM, a timeout, a lost peer) is already in the kind the real side classifies it by. The
backends cannot differ between the sides: the CPU lane gives both gloo (NCCL names rewritten alike), the GPU lane
both the scenario's NCCL, so a type is compared as written; the one naming difference, a process death, is
translated explicitly (``real_error_type``).

GPU lane: the scenario's own programs; per checkpoint and device, simulated MiB, measured MiB and the error in
percent; a value outside ``tolerance_pct`` is a disagreement, as is a different verdict.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from simnccl.backends.gloo import (
    ALLGATHER_SIZE_RACE,
    ALLREDUCE_SIZE_RACE,
    ALLTOALL_SIZE_RACE,
    BARRIER_PEER_RACE,
    COMPLETE_COLLISION_RACE,
    CROSS_WIRED_TYPE,
    FOREIGN_RANKS,
    SINGLETON_RACE,
    TIMEOUT_TIE_RACE,
)
from simnccl.cli_guard import wall_clock
from simnccl.engine.reinit_store import SPAWN_STORE_RACE, STALE_RACE
from simnccl.limits import current as current_limits
from simnccl.ops import Program
from simnccl.real.lanes import lane_policy
from simnccl.real.launch import (
    Launcher,
    RunSettings,
    inherited_note,
    installed_release,
    lane_programs,
    run_variant_real,
    simulated_knobs,
)
from simnccl.real.measure import verdict_of
from simnccl.real.report import describe_outcome, rank_outcomes
from simnccl.scenario import Scenario, Variant

KNOWN_DIFFERENCES = (
    "gloo bootstrap collision (two groups under one name): real gloo rendezvouses by group name and group rank "
    "only. Where each group-rank key is written once (groups of one size whose members' group ranks differ) the "
    "simulator connects the writers as gloo does and stops a rank at its first op on that group (its own check: "
    "real gloo runs the op on the wrong ranks' data); where a key is written twice it parks the later "
    "bootstrapper forever, and a real colliding rank may connect to the other group's peer, finish that "
    "new_group (with the wrong peers) and get stuck later, or not at all.",
)


def simulate(
    scenario: Scenario,
    variant: Variant,
    lane: str,
    programs: Sequence[Program] | None = None,
    inherited: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The simulator's Result-shaped variant dict for what the lane runs (CPU: gloo semantics).

    ``inherited``: the knobs the real ranks inherit from the launcher's environment (``Launcher.inherited_env``);
    those simnccl can run are run here too, under the variant's own (``simulated_knobs``)."""
    from simnccl.engine import Engine
    from simnccl.faults import NO_FAULTS
    from simnccl.release import RELEASES, get_release
    from simnccl.result import VariantResult
    from simnccl.runner import config_for

    release = installed_release()
    if release is None or release not in RELEASES:
        release = variant.release
    chosen = replace(variant, release=release)
    config = config_for(scenario, chosen)
    if programs is None:
        programs = lane_programs(scenario, lane)[0]
    env = {**simulated_knobs(inherited), **config.env}
    config = replace(
        config, programs=tuple(programs), policy=lane_policy(variant.policy, lane), faults=NO_FAULTS, env=env
    )
    engine = Engine(config)
    outcome = engine.run()
    result = VariantResult(
        name=variant.name,
        description=variant.description,
        release=release,
        torch_version=get_release(release).version,
        profile=variant.profile.name,
        env=env,
        policy=variant.policy,
        outcome=outcome,
        explanations=engine.explanations,
    )
    return result.to_dict()


@dataclass
class VariantComparison:
    name: str
    lane: str
    sim: dict[str, Any]
    real: dict[str, Any]
    agree: bool
    reasons: list[str] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    racy: bool = False  # a race (``race``): which ranks finish depends on timing in the real run
    race: str | None = None  # what the race is, as the comparison's description names it
    verdict_racy: bool = False  # ... with a one-rank group's key: the real verdict itself depends on timing
    blocked_agree: bool = False  # the same ranks did not finish
    finished_agree: bool = False  # both passed, or neither did
    known_gap: str | None = None  # a verdict difference explained by KNOWN_GAPS
    excused: list[int] = field(default_factory=list)  # ranks an init race compares as the simulation has them

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        out = {
            "name": self.name,
            "lane": self.lane,
            "agree": self.agree,
            "reasons": self.reasons,
            "racy": self.racy,
            "race": self.race,
            "verdict_racy": self.verdict_racy,
            "blocked_agree": self.blocked_agree,
            "known_gap": self.known_gap,
            "excused": self.excused,
            "sim_verdict": self.sim["verdict"],
            "real_verdict": self.real["verdict"],
            "ranks": self.ranks,
            "memory": self.memory,
        }
        if full:
            out["sim"] = self.sim
            out["real"] = self.real
        return out


def unfinished(outcomes: Mapping[int, Mapping[str, Any]]) -> list[int]:
    return [r for r, o in outcomes.items() if o["status"] != "done"]


def stuck(outcomes: Mapping[int, Mapping[str, Any]]) -> list[int]:
    return [r for r, o in outcomes.items() if o["status"] == "hang"]


# ... and a gloo all_to_all, two-member all_gather or ring allreduce of three or more of mismatched sizes: whether
# the member that sent too much completes is timing (each race's measurement stands beside it in backends.gloo);
# and a gloo barrier a member left for good: whether the others fail or wait is timing (seed27-case3: rank 2 lost
# its peer in 3 runs of 6 and hung in 3). A re-init that reads a destroyed incarnation's store keys, or that
# comes under spawn at the instant rank 0 destroyed the store's group: which value or store it gets is timing.
RACE_TEXTS = (
    "store key collision",
    ALLTOALL_SIZE_RACE,
    ALLGATHER_SIZE_RACE,
    ALLREDUCE_SIZE_RACE,
    BARRIER_PEER_RACE,
    STALE_RACE,
    SPAWN_STORE_RACE,
)
# Members of a gloo operation timing out together: whether each times out or sees a peer's closed socket first is
# timing (seed3-case41: both timed out in 4 runs of 7, one lost the peer in 3); only where the real run went on
# until its timeouts fired (it ended by itself): one the stall detector stopped before saw no timeout fire.
TIMEOUT_RACE_TEXTS = (TIMEOUT_TIE_RACE,)
# A collision with a one-rank gloo group's key, or one where every colliding group is complete under the name:
# even whether the colliding bootstraps succeed is decided by the order of the store writes, so not even
# pass/no-pass is comparable. The engine appends these texts whole. A re-init whose bootstrap reads the
# destroyed incarnation's value under a reused name (the store outlived the destroy): which value a rank reads
# is decided by the order of the store writes, so is the verdict. A re-init under spawn at the instant rank 0
# destroyed the default group: which store the rank reaches is timing, so is the verdict.
VERDICT_RACE_TEXTS = (SINGLETON_RACE, COMPLETE_COLLISION_RACE, STALE_RACE, SPAWN_STORE_RACE)


def _texts(sim: Mapping[str, Any]) -> list[str]:
    """What the simulator said of its hangs, errors and races, where it names a race. Not a workload's own
    check (kind "check": a ``raise`` op's message, vLLM's memory check): that text is the user's, and a ``raise``
    quoting a race's words made compare call the variant racy, so "ALL AGREE" and exit 0 where the two sides
    disagreed."""
    return (
        [h.get("explanation", "") for h in sim.get("hangs", [])]
        + [e.get("message", "") for e in sim.get("errors", []) if e.get("kind") != "check"]
        + list(sim.get("races", []))
    )


def _mentions(sim: Mapping[str, Any], needles: Sequence[str]) -> bool:
    """Whether any hang explanation or error message of the simulator's result contains one of ``needles``."""
    return any(t in text for text in _texts(sim) for t in needles)


# A real rank that failed on a lost peer, or hung bootstrapping, in init_process_group, where the simulator had it
# past init (and not done): gloo's init does not hold a rank until its peers are out of it (a peer's connection is
# accepted by the kernel before the peer's process gets to it), so a peer that left early (died in its first
# collective, closed its sockets) overtook a rank the load starved. Every rank called init on both sides (the
# simulator's got past it), so nothing but timing stops one there. Seen: once in CI (2026-12-06), and 3 times in
# 15 runs of the probes of tests/test_real_gloo_semantics.py as they were then, under three times CI's load.
INIT_OVERTAKEN_RACE = (
    "gloo's init_process_group does not hold a rank until its peers are out of it: a rank still bootstrapping "
    "when a peer left early fails or waits in init_process_group, which the machine's load decides"
)
# What the comparison's description says of each race the simulator names (its own text, else this).
_RACE_NAMES = {
    "store key collision": "store-key collision: which colliding ranks finish depends on connection order in real gloo",
    STALE_RACE: "stale store key: which value a re-initialised group reads depends on the order of the store writes",
    SPAWN_STORE_RACE: "re-init at rank 0's destroy under spawn: which store a rank reaches is timing",
}


def race(sim: Mapping[str, Any], real: Mapping[str, Any] | None = None) -> str | None:
    """The race that makes which ranks finish a matter of timing, or None: the simulator found two groups
    bootstrapping under one store name (real gloo then connects whichever peers come first), a gloo all_to_all,
    two-member all_gather or ring allreduce of three or more members of mismatched sizes (whether the member that
    sent too much completes, or loses its peer), or a gloo barrier a member left for good (whether each other
    member fails or waits); or, where the ``real`` run ended by itself, members of a gloo operation timing out
    together (whether each times out or first sees a closed peer); or the real run stopped a rank in
    init_process_group that the simulator had past it (``INIT_OVERTAKEN_RACE``)."""
    for needle in RACE_TEXTS:
        if _mentions(sim, (needle,)):
            return _RACE_NAMES.get(needle, needle)
    if real is None:
        return None
    if real.get("end_reason") == "finished" and _mentions(sim, TIMEOUT_RACE_TEXTS):
        return TIMEOUT_TIE_RACE
    return INIT_OVERTAKEN_RACE if overtaken_in_init(sim, real) else None


def racy(sim: Mapping[str, Any], real: Mapping[str, Any] | None = None) -> bool:
    """Whether there is a ``race``."""
    return race(sim, real) is not None


def overtaken_in_init(sim: Mapping[str, Any], real: Mapping[str, Any]) -> list[int]:
    """The real ranks that lost a peer, or hung bootstrapping, in init_process_group, where the simulated one got
    past init and did not finish either (``INIT_OVERTAKEN_RACE``): a simulated pass is never excused. Only where a
    real peer got out of that very init (the same call of the program: its n-th init_process_group, by the
    driver's op records) — the peer that left early and overtook the rank. Where none did, nothing overtook
    anyone: ranks all stuck in one init (a frozen or starved machine, a network setting that fails every
    bootstrap, a re-init no one got out of) are compared as they are; so is a rank whose records do not say
    which init it is in. Found by a tester: a peer that never called init, or failed before it, or a rank's own
    earlier init, counted as the peer that got out."""
    real_ranks = rank_outcomes(real)
    sim_ranks = rank_outcomes(sim)
    calls = {rank: _init_calls(real, rank) for rank in real_ranks}
    overtaken = []
    for rank, ran in real_ranks.items():
        if not str(ran.get("op", "")).startswith("init_process_group"):
            continue
        if (ran["status"], ran.get("kind")) not in (("error", "peer-lost"), ("hang", "bootstrap")):
            continue
        simulated = sim_ranks.get(rank)
        if simulated is None or simulated["status"] == "done" or not _past_init(simulated):
            continue
        started, ended = calls[rank]
        if started > ended and any(done >= started for peer, (_, done) in calls.items() if peer != rank):
            overtaken.append(rank)
    return overtaken


def _records(real: Mapping[str, Any], rank: int) -> list[Mapping[str, Any]]:
    """The driver's op records of a real rank (each op it started, with ``outcome`` once it ended), or none."""
    return next((r.get("ops") for r in real.get("ranks") or [] if r.get("rank") == rank), None) or []


def _init_calls(real: Mapping[str, Any], rank: int) -> tuple[int, int]:
    """(init_process_group calls the real rank started, those of them that ended), by the driver's op records."""
    inits = [r for r in _records(real, rank) if r.get("name") == "init_process_group"]
    return len(inits), sum(1 for r in inits if r.get("outcome") == "ok")


def _past_init(outcome: Mapping[str, Any]) -> bool:
    """Whether a rank's outcome (``rank_outcomes``) is past init_process_group: done, or stopped in another op."""
    return outcome["status"] == "done" or not str(outcome.get("op", "")).startswith("init_process_group")


def stopped_in_first_init(real: Mapping[str, Any], rank: int, outcome: Mapping[str, Any]) -> bool:
    """Whether a real rank did not finish and never got out of its first init_process_group: it stopped in one, or
    between ops, and its op records (the driver's, where the result has them) show no init_process_group ended.

    Why: every race compare excuses happens in or after a group's bootstrap, which needs the world's store and
    the default group first; a rank that never got that far was stopped by something else (a frozen process, a
    child that failed to start, ``GLOO_SOCKET_IFNAME`` naming no interface), which no race explains."""
    if outcome["status"] == "done":
        return False
    op = str(outcome.get("op", ""))
    if op and not op.startswith(("init_process_group", "<between ops>")):
        return False
    return _init_calls(real, rank)[1] == 0  # no records: none seen to end


def never_initialised(sim: Mapping[str, Any], real: Mapping[str, Any], world_size: int) -> list[int]:
    """The ranks the real run stopped before the end of their first init_process_group (``stopped_in_first_init``)
    where the simulated rank got past it: no race excuses them (a race's comparison compares them as usual)."""
    sim_ranks = rank_outcomes(sim, world_size)
    return [
        rank
        for rank, ran in rank_outcomes(real, world_size).items()
        if stopped_in_first_init(real, rank, ran) and _past_init(sim_ranks[rank])
    ]


def _as_simulated(real: dict[str, Any], sim: Mapping[str, Any], ranks: Sequence[int]) -> dict[str, Any]:
    """The real result with ``ranks``' errors and hangs replaced by the simulation's: an init race's overtaken ranks,
    compared as the simulation has them while every other rank is compared as it is."""
    view = dict(real)
    for key in ("errors", "hangs"):
        kept = [e for e in real.get(key, []) if int(e["rank"]) not in ranks]
        view[key] = sorted(kept + [e for e in sim.get(key, []) if int(e["rank"]) in ranks], key=lambda e: e["rank"])
    if ranks:  # the verdict of what is compared: an excused rank's own outcome decided the real one (a tester's)
        view["verdict"] = verdict_of(view["errors"], view["hangs"])
    return view


def verdict_racy(sim: Mapping[str, Any]) -> bool:
    """Whether the collision is with a one-rank gloo group's key: then the verdict itself is decided by timing."""
    return _mentions(sim, VERDICT_RACE_TEXTS)


def real_error_type(error: Mapping[str, Any]) -> str:
    """The exception type of a real rank's error, named as the simulator names it.

    The one class of legitimate difference: a process that died without a final record is the launcher's own
    record, typed ``signal`` (or ``exit`` for an exit code) with the code in ``exit_code``; the simulator names a
    process death by its signal (``SIGABRT`` for gloo's ``EnforceNotMet`` or NCCL's watchdog abort). So a signal
    becomes its name; ``exit`` stays ``exit``, which the simulator never reports: a disagreement, as it should be.
    Every other type is compared as written (both sides qualify it alike: ``torch.distributed.DistBackendError``,
    ``torch.OutOfMemoryError``, a builtin bare)."""
    kind = str(error.get("type", ""))
    code = error.get("exit_code")
    if kind != "signal" or not isinstance(code, int) or code >= 0:
        return kind
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def error_differences(sim: Mapping[str, Any], real: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per rank that failed on both sides, where the error kind or exception type differ: ``{"rank", "sim_kind",
    "sim_type", "real_kind", "real_type"}``.

    Failed means an error that is not a hang on either side: a rank stuck on one side is compared as a hang
    (``stuck``), because which timeout ends it — the group's timeout in the simulator, ``--torch-timeout`` or
    the stall detector in the real run — depends on the run's settings, not on what the simulator models. A rank
    that failed on one side and finished on the other is a difference in the ranks that did not finish; one that
    failed on one side and hung on the other is a difference of its own (``status_differences``)."""
    hung = {int(h["rank"]) for side in (sim, real) for h in side.get("hangs", [])}
    sim_errors = {int(e["rank"]): e for e in sim.get("errors", [])}
    real_errors = {int(e["rank"]): e for e in real.get("errors", [])}
    out = []
    for rank in sorted((sim_errors.keys() & real_errors.keys()) - hung):
        s, r = sim_errors[rank], real_errors[rank]
        found = {
            "rank": rank,
            "sim_kind": str(s.get("kind", "")),
            "sim_type": str(s.get("type", "")),
            "real_kind": str(r.get("kind", "")),
            "real_type": real_error_type(r),
        }
        if (found["sim_kind"], found["sim_type"]) != (found["real_kind"], found["real_type"]):
            out.append(found)
    return out


def wiring_differences(sim: Mapping[str, Any], real: Mapping[str, Any]) -> list[str]:
    """A reason per rank that both sides stopped on the cross-wired check where the real data came from a rank
    the simulator did not wire it to: the simulator names the ranks outside the group that gloo connected
    (``FOREIGN_RANKS``), the real driver's data check the ranks outside the group whose data reached the rank
    (a broadcast or recv reads one of them, the other ops all), so the second must be among the first.

    Why: the verdict, the kind and the type agree whatever ranks the model wired; this is what checks the wiring
    itself, the mechanism ``engine.store_collisions`` models, on every real run that cross-wires."""
    sim_errors = {int(e["rank"]): e for e in sim.get("errors", [])}
    out = []
    for error in real.get("errors", []):
        rank = int(error["rank"])
        simulated = sim_errors.get(rank)
        if simulated is None or FOREIGN_RANKS not in error or FOREIGN_RANKS not in simulated:
            continue
        if simulated.get("type") != CROSS_WIRED_TYPE or real_error_type(error) != CROSS_WIRED_TYPE:
            continue
        wired, seen = list(simulated[FOREIGN_RANKS]), list(error[FOREIGN_RANKS])
        if not seen or not set(seen) <= set(wired):
            out.append(f"rank {rank} cross-wired: simulated to ranks {wired} outside its group, real data from {seen}")
    return out


def status_differences(
    sim_ranks: Mapping[int, Mapping[str, Any]], real_ranks: Mapping[int, Mapping[str, Any]]
) -> list[str]:
    """A reason per rank that raised on one side and is stuck on the other.

    Why its own check: the verdict and the set of ranks that did not finish can match while two ranks swap how
    they ended (say, a verdict of error with rank 0 failed and rank 1 stuck in the simulation, the other way
    round for real); ``error_differences`` skips a rank stuck on either side and the stuck ranks are compared
    only when both verdicts are a hang, so nothing else notices. A rank done on one side only is already a
    difference in the ranks that did not finish."""
    out = []
    for rank, s in sim_ranks.items():
        r = real_ranks[rank]
        if {s["status"], r["status"]} == {"error", "hang"}:
            out.append(f"rank {rank}: simulated {describe_outcome(s)}, real {describe_outcome(r)}")
    return out


def stuck_op_differences(
    sim_ranks: Mapping[int, Mapping[str, Any]], real_ranks: Mapping[int, Mapping[str, Any]]
) -> list[str]:
    """A reason per rank stuck on both sides in a different op of its program (by index: both sides run the same
    programs, so the same index is the same op).

    Why the op and not the hang's kind: the real run records the op a rank started and did not end (the driver
    synchronizes the device after each op, so an NCCL collective cannot run ahead of its record), and that is
    all it can see; its kind is read off the op's name (``measure.OP_KIND``). The simulator's kind says what
    inside the op the rank waits for: a ``bootstrap`` inside a collective on a lazily initialized communicator,
    inside ``split_group`` on gloo (a members-only bootstrap, which real gloo reports as ``split``), a ``split``
    inside ``new_group``, ``ncclCommInitRank`` or the store in an NCCL bootstrap. Comparing kinds would call
    those disagreements; both kinds are printed. Which timeout ends the hang is a setting of the run (see
    ``error_differences``)."""
    out = []
    for rank, s in sim_ranks.items():
        r = real_ranks[rank]
        if s["status"] == r["status"] == "hang" and s.get("op_index") != r.get("op_index"):
            out.append(f"rank {rank} stuck in another op: simulated {_stuck_in(s)}, real {_stuck_in(r)}")
    return out


def _stuck_in(outcome: Mapping[str, Any]) -> str:
    index = outcome.get("op_index")
    where = outcome.get("op") or "?"
    return (where if index is None else f"#{index} {where}") + (f" [{outcome['kind']}]" if outcome.get("kind") else "")


def describe_error_difference(found: Mapping[str, Any]) -> str:
    return (
        f"rank {found['rank']} error: simulated {found['sim_kind']} {found['sim_type'] or '-'}, "
        f"real {found['real_kind']} {found['real_type'] or '-'}"
    )


def known_gap(sim: Mapping[str, Any], real: Mapping[str, Any]) -> str | None:
    """A difference explained by a documented gap between the simulator and real gloo (see KNOWN_GAPS), else None.

    Only called for what differs; each rule matches one gap's signature, so anything else stays a disagreement.
    """
    sim_stuck = {int(h["rank"]) for h in sim.get("hangs", [])}
    real_stuck = {int(h["rank"]) for h in real.get("hangs", [])}
    if (
        sim_stuck == real_stuck
        and sim["verdict"] == real["verdict"]
        and not error_differences(sim, real)
        and _statuses(sim) == _statuses(real)  # a rank failed on one side, done on the other: a difference too
        and not wiring_differences(sim, real)
    ):
        return None
    return next((gap for gap, rule in _GAP_RULES.items() if rule(sim, real)), None)


def _statuses(variant: Mapping[str, Any]) -> dict[int, str]:
    return {rank: outcome["status"] for rank, outcome in rank_outcomes(variant).items()}


# Closed gaps, now modelled in simnccl.backends.gloo and the engine and pinned by tests/test_gloo_semantics.py
# (simulator) and tests/test_real_gloo_semantics.py (real gloo):
# - gloo-split-rendezvous: split_group on gloo is a members-only bootstrap keyed by the hashed name;
# - gloo-mismatch-abort: only one algorithm with different sizes aborts (EnforceNotMet); different algorithms
#   wait on different slots (a hang); all_reduce vs reduce_scatter of one size completes;
# - gloo-peer-closed: destroying the default group, or dying, closes the rank's sockets; peers whose algorithm
#   talks to it directly fail at once with "Connection closed by peer";
# - gloo-partial-collective: broadcast is a binomial tree; members whose ancestors and children are in complete.
# - gloo-mismatch-survivor: gloo checks sizes per message; only a rank receiving more than it posted aborts, a
#   rank still waiting on it fails as peer-lost, and the others complete or wait (backends.gloo.wire_fates).
#
# Open: one difference the real run cannot always show, not a gap in the model.
KNOWN_GAPS: dict[str, str] = {
    "gloo-cross-wired": (
        "an op on a gloo group that another group's members joined by group rank under one store name (each "
        "group-rank key written once): real gloo runs it between the wrong ranks without an error. The real "
        "driver's data check (simnccl.real.data_check) stops a rank whose result holds another rank's data, as "
        "the simulator's check does; where nothing comes back to check (a barrier) or the dtype cannot carry the "
        "check, the real rank goes on where the simulator stops it"
    ),
}


def _cross_wired_check(sim: Mapping[str, Any], real: Mapping[str, Any]) -> bool:
    """Every simulated error (a hang's timeout aside) is the cross-wired check (``backends.gloo.CROSS_WIRED``); at
    each, the real rank either ran the op (it finished, or stopped at another op) or stopped there on the data
    check's error of the same type (``data_check.FOREIGN_DATA_TYPE``) with data from ranks the simulator wired it
    to, and at least one ran it; every other rank ended alike on both sides. The simulator's verdict is ``fail``,
    never a pass."""
    hung = {int(h["rank"]) for h in sim.get("hangs", [])}  # a hang's timeout is listed under errors too
    errors = [e for e in sim.get("errors", []) if int(e["rank"]) not in hung]
    if not errors or any(e.get("type") != CROSS_WIRED_TYPE for e in errors) or wiring_differences(sim, real):
        return False
    real_errors = {int(e["rank"]): e for e in real.get("errors", [])}
    real_ranks = rank_outcomes(real)
    checked = {int(e["rank"]) for e in errors}
    others = [(r, s) for r, s in rank_outcomes(sim).items() if r not in checked]
    if any(s["status"] != real_ranks.get(r, {}).get("status") for r, s in others):
        return False
    done = {"status": "done"}
    ran_on = 0
    for e in errors:
        rank = int(e["rank"])
        ran = real_ranks.get(rank, done)
        if ran["status"] == "done" or ran.get("op") != e.get("op"):
            ran_on += 1
        elif ran["status"] != "error" or real_error_type(real_errors[rank]) != CROSS_WIRED_TYPE:
            return False
    return ran_on > 0


_GAP_RULES: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], bool]] = {
    "gloo-cross-wired": _cross_wired_check,
}


def stuck_until_timeout(sim: dict[str, Any], real: Mapping[str, Any]) -> dict[str, Any]:
    """``sim`` with each error torch raised in place of a timeout (an error's ``replaced_timeout``: a gloo op on a
    destroyed group's handle) turned back into the hang it was until then, where the real run left that rank
    stuck; the verdict follows (``measure.verdict_of``). ``sim`` itself where there is none.

    Why: the simulator always runs to the group's timeout, and there torch raises a ValueError (an error); the
    real run may stop the rank first (the stall detector, ``--torch-timeout``), and then saw it stuck. Which
    timeout ends a wait is a setting of the run, not something the simulator models (``error_differences``), so
    a rank stuck in the real run is compared as stuck; one that raised there is compared by its error."""
    real_stuck = {int(h["rank"]) for h in real.get("hangs", [])}
    back = [e for e in sim.get("errors", []) if e.get("replaced_timeout") and int(e["rank"]) in real_stuck]
    if not back:
        return sim
    errors = [e for e in sim["errors"] if not any(e is b for b in back)]
    hangs = sorted([*sim.get("hangs", []), *(e["replaced_timeout"] for e in back)], key=lambda h: int(h["rank"]))
    return {**sim, "errors": errors, "hangs": hangs, "verdict": verdict_of(errors, hangs)}


def compare_variant(
    name: str, lane: str, sim: dict[str, Any], real: dict[str, Any], world_size: int, tolerance_pct: float
) -> VariantComparison:
    """Agreement: the same verdict, the same ranks blocked (not finished) and stuck, each rank failed on both
    sides or stuck on both (``status_differences``), the same error kind and type on each rank that failed on
    both (``error_differences``) and the same op on each rank stuck on both (``stuck_op_differences``) — except
    where the simulator reports a store-key collision (``racy``), whose real outcome depends on connection
    order. A simulated error that replaced a timeout counts as the hang it was where the real rank is stuck
    (``stuck_until_timeout``)."""
    sim = stuck_until_timeout(sim, real)
    found_race = race(sim, real)
    shown = real
    excused: list[int] = []
    if found_race == INIT_OVERTAKEN_RACE:  # only its overtaken ranks are excused, each as the simulation has it
        excused = overtaken_in_init(sim, real)
        real = _as_simulated(real, sim, excused)
    stranded = never_initialised(sim, real, world_size)
    # A race compares less (the verdict, or nothing) than the ranks; it cannot excuse a rank no race reached.
    is_racy = found_race is not None and found_race != INIT_OVERTAKEN_RACE and not stranded
    sim_ranks = rank_outcomes(sim, world_size)
    real_ranks = rank_outcomes(real, world_size)
    reasons = []
    if stranded and found_race is not None:
        reasons.append(
            f"rank(s) {stranded} did not get out of init_process_group in the real run, where the simulation got "
            f"past it: no race explains that (the simulator names: {found_race})"
        )
    if sim["verdict"] != real["verdict"]:
        reasons.append(f"verdict: simulated {sim['verdict']}, real {real['verdict']}")
    blocked_sim, blocked_real = unfinished(sim_ranks), unfinished(real_ranks)
    if blocked_sim != blocked_real:
        reasons.append(f"ranks that did not finish: simulated {blocked_sim}, real {blocked_real}")
    if sim["verdict"] == real["verdict"] == "hang" and stuck(sim_ranks) != stuck(real_ranks):
        reasons.append(f"stuck ranks: simulated {stuck(sim_ranks)}, real {stuck(real_ranks)}")
    differing = error_differences(sim, real)
    reasons += [describe_error_difference(found) for found in differing]
    reasons += status_differences(sim_ranks, real_ranks)
    reasons += wiring_differences(sim, real)
    reasons += stuck_op_differences(sim_ranks, real_ranks)
    ranks = []
    seen = rank_outcomes(shown, world_size)  # what the real run did, an excused rank's included
    for rank in range(world_size):
        s, r = sim_ranks[rank], real_ranks[rank]
        ranks.append(
            {
                "rank": rank,
                "sim": describe_outcome(s),
                "real": describe_outcome(seen[rank]),
                "same_status": s["status"] == r["status"],
                "same_op": s.get("op_index") == r.get("op_index"),
                "same_error": all(found["rank"] != rank for found in differing),
            }
        )
    memory = []
    if lane == "gpu":
        memory = memory_rows(sim, real, tolerance_pct)
        for row in memory:
            if not row["within"]:
                reasons.append(
                    f"checkpoint {row['checkpoint']} {row['device']}: simulated {row['sim_mib']} MiB, measured "
                    f"{row['real_mib']} MiB ({row['error_pct']}% > {tolerance_pct}%)"
                )
    comparison = VariantComparison(name, lane, sim, shown, False, reasons, ranks, memory)
    comparison.racy = is_racy
    comparison.race = found_race
    comparison.excused = excused
    comparison.verdict_racy = is_racy and verdict_racy(sim)
    comparison.blocked_agree = blocked_sim == blocked_real
    comparison.finished_agree = (sim["verdict"] == "pass") == (real["verdict"] == "pass")
    comparison.known_gap = known_gap(sim, real)
    verdict_ok = sim["verdict"] == real["verdict"]
    memory_ok = all(row["within"] for row in memory)
    if comparison.verdict_racy:
        comparison.agree = memory_ok
    elif is_racy:
        comparison.agree = verdict_ok and memory_ok
    else:
        comparison.agree = not reasons
    return comparison


def memory_rows(sim: Mapping[str, Any], real: Mapping[str, Any], tolerance_pct: float) -> list[dict[str, Any]]:
    sim_points = {(c["name"], d["device"]): d for c in sim.get("checkpoints", []) for d in c["devices"]}
    rows = []
    for checkpoint in real.get("checkpoints", []):
        for device in checkpoint["devices"]:
            predicted = sim_points.get((checkpoint["name"], device["device"]))
            sim_mib = None if predicted is None else predicted["used_mib"]
            real_mib = device["used_mib"]
            if sim_mib is None:
                error = None
            elif sim_mib == 0:
                error = 0.0 if real_mib == 0 else float("inf")
            else:
                error = round((real_mib - sim_mib) / sim_mib * 100.0, 2)
            rows.append(
                {
                    "checkpoint": checkpoint["name"],
                    "device": device["device"],
                    "sim_mib": sim_mib,
                    "real_mib": real_mib,
                    "non_torch_mib": device.get("non_torch_mib"),
                    "error_pct": error,
                    "within": error is not None and abs(error) <= tolerance_pct,
                }
            )
    return rows


def compare_scenario(
    scenario: Scenario,
    settings: RunSettings,
    *,
    variants: Sequence[str] | None = None,
    tolerance_pct: float = 10.0,
    launcher: Launcher | None = None,
) -> dict[str, Any]:
    """Run sim and real on every chosen variant; the comparison report (``ok`` only when all agree)."""
    chosen = [scenario.variant(n) for n in variants] if variants else list(scenario.variants)
    programs, substitutions, notes = lane_programs(scenario, settings.lane, settings)
    own = launcher is None
    launcher = launcher or Launcher()
    comparisons = []
    try:
        for variant in chosen:
            with _simulated_side():
                sim = simulate(scenario, variant, settings.lane, programs, launcher.inherited_env(variant.env))
            # raises a user policy's error on the real ranks: the simulation asked it first, not with the real env
            real = run_variant_real(launcher, scenario, variant, programs, settings, substitutions, notes)
            comparison = compare_variant(variant.name, settings.lane, sim, real, len(programs), tolerance_pct)
            if settings.lane == "cpu":
                with _simulated_side():
                    disagreement = policy_disagreement(scenario, variant)
                if disagreement is not None:
                    comparison.reasons.append(disagreement)
                    comparison.agree = False
            comparisons.append(comparison)
    finally:
        if own:
            launcher.close()
    return {
        "scenario": scenario.name,
        "source": scenario.source,
        "lane": settings.lane,
        "tolerance_pct": tolerance_pct,
        "substitutions": substitutions,
        "notes": notes,
        "known_differences": list(KNOWN_DIFFERENCES),
        "ok": all(c.agree for c in comparisons),
        "variants": [c.to_dict(full=True) for c in comparisons],
    }


def _simulated_side() -> AbstractContextManager[None]:
    """The simulated side of a comparison under the commands' wall-clock limit (``max_wall_s``): ``--timeout``
    bounds the real ranks only, and a policy that never returns in this process made the comparison run until
    killed."""
    return wall_clock(current_limits().max_wall_s, "the simulated side of the comparison")


def policy_disagreement(scenario: Scenario, variant: Variant) -> str | None:
    """Where the variant's policy makes the members of a call decide differently under NCCL semantics (what
    ``simnccl run`` reports as PolicyInconsistency), that, as a reason the comparison cannot agree; else None.

    Why: the CPU lane gives the policy's plans to gloo without their NCCL options and device (``CpuLanePolicy``),
    so a policy that sets ``lazy_init`` on one rank only looked alike on every rank, passed in both gloo and the
    simulation of it, and ``real compare`` said ALL AGREE for a policy that hangs NCCL."""
    from simnccl.policy import decides_alike_on_every_rank, get_policy

    if variant.policy is None or decides_alike_on_every_rank(get_policy(variant.policy)):
        return None  # torch's defaults, and simnccl's built-ins, decide alike on every rank: nothing to simulate
    from simnccl.runner import run_variant

    outcome = run_variant(scenario, variant).outcome
    first = next((e for e in outcome.errors if e["type"] == "PolicyInconsistency"), None)
    if first is None:
        return None
    return (
        f"the policy's members disagree under NCCL (simnccl run: rank {first['rank']}: PolicyInconsistency: "
        f"{first['message']}); the CPU lane drops NCCL options and devices, so gloo cannot show it"
    )


def render_comparison(report: Mapping[str, Any]) -> str:
    lines = [render_comparison_header(report)]
    lines += [render_comparison_variant(variant) for variant in report["variants"]]
    lines.append("")
    lines.append("ALL AGREE" if report["ok"] else "DISAGREEMENT")
    return "\n".join(lines)


def render_comparison_header(report: Mapping[str, Any]) -> str:
    lines = [f"compare {report['scenario']} ({report['source']}) — {report['lane']} lane"]
    if report["lane"] == "cpu":
        lines.append("  simulator run with gloo semantics (the same substitutions as the real run)")
    for text in report.get("substitutions", []):
        lines.append(f"  substituted: {text}")
    for text in report.get("notes", []):
        lines.append(f"  note: {text}")
    return "\n".join(lines)


def render_comparison_variant(variant: Mapping[str, Any]) -> str:
    """One variant's comparison, starting with an empty line (printed as soon as the variant is compared)."""
    lines = []
    mark = "AGREE" if variant["agree"] else "DISAGREE"
    if variant["agree"] and variant.get("verdict_racy"):
        mark = "NOT COMPARED (racy)"  # no disagreement to report, and no agreement either
    lines.append("")
    lines.append(
        f"variant {variant['name']}: sim {variant['sim_verdict']} | real {variant['real_verdict']}  -> {mark}"
        f"  (real {variant['real'].get('wall_s', '?')}s, {variant['real'].get('end_reason', '')})"
    )
    width = max([len(r["sim"]) for r in variant["ranks"]] + [9])
    lines.append(f"  {'rank':>4}  {'simulated':<{width}}  real")
    for row in variant["ranks"]:
        flag = "" if row["same_status"] and row["same_op"] else ("  (op differs)" if row["same_status"] else "  <>")
        if not row.get("same_error", True):
            flag += "  (error differs)"
        lines.append(f"  {row['rank']:>4}  {row['sim']:<{width}}  {row['real']}{flag}")
    if variant["memory"]:
        lines.append(f"  {'checkpoint':<20} {'device':<12} {'sim MiB':>10} {'real MiB':>10} {'error %':>8}")
        for row in variant["memory"]:
            sim_mib = "-" if row["sim_mib"] is None else f"{row['sim_mib']:.1f}"
            error = "-" if row["error_pct"] is None else f"{row['error_pct']:+.1f}"
            flag = "" if row["within"] else "  outside tolerance"
            lines.append(
                f"  {row['checkpoint']:<20} {row['device']:<12} {sim_mib:>10} {row['real_mib']:>10.1f} {error:>8}{flag}"
            )
    note = inherited_note(variant["real"].get("inherited_env") or {}, variant["sim"].get("env") or {})
    if note:
        lines.append(f"  note: {note}")
    for reason in variant["reasons"]:
        lines.append(f"  ! {reason}")
    if variant.get("verdict_racy"):
        lines.append(f"  ~ {variant.get('race') or 'a race'}: which way it ends is timing; nothing is compared")
    elif variant.get("racy"):
        lines.append(f"  ~ {variant.get('race') or 'a race'}; only the verdict is compared")
    elif variant.get("excused"):
        lines.append(
            f"  ~ {variant.get('race') or 'a race'}: rank(s) {variant['excused']} compared as the simulation has them"
        )
    if variant.get("known_gap"):
        lines.append(f"  ~ known gap {variant['known_gap']}: {KNOWN_GAPS[variant['known_gap']]}")
    return "\n".join(lines)

"""Recovery orchestration, torchft-style and simulated: exclude a crashed or slow GPU, bring in a spare, go on.

Why this module: the rewritten backend exists for the "one bad GPU" problem, so a team must be able to rehearse
the whole loop on a laptop — a worker dies or drags, something notices, a quorum decides who trains next, the
process groups are re-created (through the active policy, so their memory cost is the one the team will pay),
and training resumes from the last committed step. Everything below is deterministic: no wall clock, no
unordered iteration, a bounded number of recoveries.

Shape (the engine stays the only simpy user, DESIGN rule 3):

* A scenario with a ``[recovery]`` table runs a data-parallel training loop. The cluster's ``ranks_per_node``
  workers per node run the job (rank ``r`` starts on GPU ``r % ranks_per_node`` of its node); the node's other
  GPUs are spares. ``replicas`` splits the ranks into replica groups (handle ``replica``) and, across replicas,
  data-parallel groups of the same position (handle ``dp``); the default group is ``world``.
* ``[workload] steps`` is the body of ONE training step on every rank (e.g. compute, then all_reduce on
  ``replica`` and on ``dp``). The orchestrator generates each rank's program: ``set_device`` on its GPU, a fresh
  ``init_process_group`` and the ``new_group`` calls (the variant's policy decides how they are made), then the
  steps from the first uncommitted one, a commit (a ``world`` barrier, i.e. every member agrees the step
  succeeded, as torchft's ``should_commit``) every ``commit_every`` steps and after the last.
* A *segment* is one engine run with one membership. The orchestrator reads its outcome — which commits every
  member passed, each rank's local (pre-collective) time per step, crashed processes, watchdog timeouts — and
  takes decisions in time order: a quorum at every commit, and one when a failure is detected. The first
  decision that changes the membership ends the segment at that time: what the engine simulated after it never
  happened for the orchestrator (causality: nothing later changes anything earlier in a deterministic run).
* ``quorum(time_s, state)`` is a pure function returning the decision *and* its explanation (torchft's
  ``quorum_compute`` style): failed ranks and stragglers out, a spare on the same node in, or a clear refusal.
* The next segment starts from the last committed step, so no committed step is ever lost; steps finished
  after that commit are re-done and reported as lost.

Faults come from ``[faults]`` and apply to the first segment only (ranks are first-segment ranks; ``at_op``
counts ops of that rank's generated program — the scenario parser also bounds it by the ``[workload]`` length,
so files normally use ``at_s``). Detection: a crashed process is seen by the launcher at its next poll
(``monitor_interval_s``, torchrun's ``--monitor-interval`` default 0.1 s); a live but stuck rank (a stall) only
through the watchdog of the ranks waiting for it (the group timeout plus the flight-recorder dump wait).

Simplified on purpose: a replacement comes from the failed GPU's own node (the launcher model keeps
``ranks_per_node`` equal on every node); every process restarts at a recovery (torchft restarts only the
failed replica and heals it from a peer); a step's local time is what a straggler slows; a rank's own error
(OOM, a torch error, an abort) is not routed around, since the same programs would fail again.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from simnccl.cluster import Cluster, Device
from simnccl.engine import Engine, RunOutcome, SimConfig, Snapshot
from simnccl.faults import NO_FAULTS, FaultError, apply_to_programs
from simnccl.limits import InputLimits, exceeded
from simnccl.limits import current as current_limits
from simnccl.ops import (
    WORLD,
    Barrier,
    Checkpoint,
    Collective,
    InitProcessGroup,
    NewGroup,
    Op,
    PointToPoint,
    Program,
    SetDevice,
)
from simnccl.scenario import Scenario, ScenarioError
from simnccl.scenario.reader import Reader, finite

REPLICA, DP = "replica", "dp"
START = "start"
# The markers segment_programs puts in every rank's program (expectations may name them): see its docstring.
MARKER_LABEL = re.compile(rf"{START}|(ready|done|commit):[1-9][0-9]*")


# ---------------------------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """The ``[recovery]`` table: the training loop and the orchestrator's knobs."""

    replicas: int
    steps: int
    commit_every: int
    slow_factor: float = 2.0  # a rank whose local step time exceeds this multiple of the median is excluded
    timeout_s: float | None = None  # every process group's timeout (None: torch's default)
    monitor_interval_s: float = 0.1  # torchrun --monitor-interval: how late a dead process is noticed
    restart_s: float = 0.0  # from a decision to the next segment's start (spawn, checkpoint load)
    max_recoveries: int = 3  # every run ends: at most this many re-formed memberships

    def is_commit(self, step: int) -> bool:
        return step % self.commit_every == 0 or step == self.steps


def parse_recovery(
    table: Mapping[str, Any], source: str, cluster: Cluster, limits: InputLimits | None = None
) -> RecoveryConfig:
    """Validate ``[recovery]`` field by field against the cluster and the input limits; errors name the file
    and the key (times are finite and within ``max_sim_time_s``; recoveries within ``max_recoveries``)."""
    limits = limits or current_limits()
    reader = Reader(source, "recovery", dict(table))
    number = (int, float)
    horizon = limits.max_sim_time_s
    replicas = reader.get("replicas", int)
    steps = reader.get("steps", int)
    commit_every = reader.get("commit_every", int)
    slow_factor = finite(reader, "slow_factor", reader.get("slow_factor", number, 2.0), -math.inf)
    timeout = reader.get("timeout_s", number, None)
    if timeout is not None:
        timeout = finite(reader, "timeout_s", timeout, -math.inf, horizon, "max_sim_time_s")
    monitor = finite(reader, "monitor_interval_s", reader.get("monitor_interval_s", number, 0.1), -math.inf, horizon)
    restart = finite(reader, "restart_s", reader.get("restart_s", number, 0.0), -math.inf, horizon, "max_sim_time_s")
    max_recoveries = reader.get("max_recoveries", int, 3)
    reader.finish()
    if max_recoveries > limits.max_recoveries:
        raise reader.error("max_recoveries", exceeded("max_recoveries", max_recoveries, limits.max_recoveries))
    world = cluster.world_size
    if replicas < 1 or world % replicas:
        raise reader.error("replicas", f"expected a divisor of the world of {world} ranks, got {replicas}")
    for key, value in (("steps", steps), ("commit_every", commit_every)):
        if value < 1:
            raise reader.error(key, f"expected an integer >= 1, got {value}")
    if slow_factor <= 1:
        raise reader.error("slow_factor", f"expected a number > 1 (a multiple of the median), got {slow_factor:g}")
    if timeout is not None and timeout <= 0:
        raise reader.error("timeout_s", f"expected a positive number of seconds, got {timeout:g}")
    for key, value in (("monitor_interval_s", monitor), ("restart_s", restart)):
        if value < 0:
            raise reader.error(key, f"expected a non-negative number of seconds, got {value:g}")
    if max_recoveries < 0:
        raise reader.error("max_recoveries", f"expected an integer >= 0, got {max_recoveries}")
    assert cluster.ranks_per_node is not None
    if cluster.ranks_per_node > cluster.gpus_per_node:
        raise ScenarioError(
            source,
            "cluster.ranks_per_node",
            f"a recovery run needs one GPU per rank: {cluster.ranks_per_node} ranks on {cluster.gpus_per_node} "
            "GPUs per node (the GPUs beyond ranks_per_node are the spares)",
        )
    return RecoveryConfig(
        replicas=replicas,
        steps=steps,
        commit_every=commit_every,
        slow_factor=slow_factor,
        timeout_s=None if timeout is None else float(timeout),
        monitor_interval_s=monitor,
        restart_s=restart,
        max_recoveries=max_recoveries,
    )


# ---------------------------------------------------------------------------------------------- programs


def initial_devices(cluster: Cluster) -> tuple[Device, ...]:
    """Rank r on GPU ``r % ranks_per_node`` of its node, as torchrun's LOCAL_RANK would put it."""
    return tuple(cluster.device(cluster.node_of(r), cluster.local_rank(r)) for r in range(cluster.world_size))


def replica_groups(world: int, replicas: int) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(replica groups, dp groups): replica k holds ranks [k*m, (k+1)*m); dp group j the j-th rank of each."""
    size = world // replicas
    return (
        tuple(tuple(range(k * size, (k + 1) * size)) for k in range(replicas)),
        tuple(tuple(range(j, world, size)) for j in range(size)),
    )


def segment_programs(
    cfg: RecoveryConfig, body: Sequence[Program], devices: Sequence[Device], first_step: int
) -> list[Program]:
    """Every rank's program for one segment: fresh groups on its GPU, then steps ``first_step..cfg.steps``.

    Markers (``Checkpoint`` ops, which cost nothing) make the segment observable: ``start`` after the groups
    exist, ``ready:s`` when the rank finished step s's local work (before the body's first communication),
    ``done:s`` after the step and ``commit:s`` after a commit's barrier.
    """
    replicas, dps = replica_groups(len(devices), cfg.replicas)
    programs = []
    for rank, device in enumerate(devices):
        ops: list[Op] = [
            SetDevice(device=device.index),
            InitProcessGroup(backend="nccl", device_id=device.index, timeout_s=cfg.timeout_s),
        ]
        for handle, groups in ((REPLICA, replicas), (DP, dps)):
            ops += [
                NewGroup(
                    ranks=ranks,
                    bind=handle,
                    group_desc=f"{handle}{k}",
                    timeout_s=cfg.timeout_s,
                    purpose=handle,
                    traffic="collectives",
                )
                for k, ranks in enumerate(groups)
            ]
        ops.append(Checkpoint(label=START))
        step_ops = body[rank].ops
        split = next((i for i, op in enumerate(step_ops) if isinstance(op, (Collective, PointToPoint))), len(step_ops))
        for step in range(first_step, cfg.steps + 1):
            ops += [*step_ops[:split], Checkpoint(label=f"ready:{step}"), *step_ops[split:]]
            ops.append(Checkpoint(label=f"done:{step}"))
            if cfg.is_commit(step):
                ops += [Barrier(group=WORLD), Checkpoint(label=f"commit:{step}")]
        programs.append(Program(tuple(ops)))
    return programs


# ---------------------------------------------------------------------------------------------- the quorum (pure)


@dataclass(frozen=True, slots=True)
class StepSample:
    step: int
    at_s: float  # when the rank finished the step's local work: observable from then on
    local_s: float  # seconds of local work the step took on this rank (what a straggler slows)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the orchestrator knows about one rank of the current membership."""

    rank: int
    device: Device
    failed_at_s: float | None = None  # when its failure was detected
    failure: str = ""
    samples: tuple[StepSample, ...] = ()  # the steps since the last quorum


@dataclass(frozen=True, slots=True)
class QuorumState:
    replicas: int
    ranks: tuple[Observation, ...]  # indexed by rank
    spares: tuple[Device, ...]  # healthy idle GPUs
    slow_factor: float


@dataclass(frozen=True, slots=True)
class Exclusion:
    rank: int
    device: Device
    reason: str


@dataclass(frozen=True, slots=True)
class Replacement:
    rank: int
    old: Device
    new: Device


@dataclass(frozen=True, slots=True)
class Decision:
    """The next membership (``members[rank]`` is the rank's GPU), and why. ``ok`` False: no quorum can form."""

    time_s: float
    members: tuple[Device, ...]
    excluded: tuple[Exclusion, ...]
    replacements: tuple[Replacement, ...]
    explanation: str
    ok: bool = True

    @property
    def changed(self) -> bool:
        return bool(self.excluded)

    def plan(self) -> str:
        if not self.ok:
            return "no quorum"
        if not self.replacements:
            return "unchanged"
        return ", ".join(f"rank {r.rank}: {r.old.key} -> spare {r.new.key}" for r in self.replacements)


def quorum(time_s: float, state: QuorumState) -> Decision:
    """Who trains next, decided from what is known at ``time_s``: a pure function of its arguments.

    Excluded: a rank whose failure was detected by then, and a rank whose mean local step time (over the
    samples observable by then) exceeds ``slow_factor`` times the median of all healthy ranks. Each excluded
    rank moves to the first spare GPU (by node, then index) on its own node; none left means no quorum.
    """
    assert [o.rank for o in state.ranks] == list(range(len(state.ranks))), "observations are indexed by rank"
    excluded = [
        Exclusion(o.rank, o.device, o.failure)
        for o in state.ranks
        if o.failed_at_s is not None and o.failed_at_s <= time_s
    ]
    failed = {e.rank for e in excluded}
    means: dict[int, tuple[float, int, int]] = {}
    for o in state.ranks:
        seen = [s for s in o.samples if s.at_s <= time_s]
        if o.rank not in failed and seen:
            means[o.rank] = (sum(s.local_s for s in seen) / len(seen), seen[0].step, seen[-1].step)
    median = statistics.median(sorted(m for m, _, _ in means.values())) if means else 0.0
    if median > 0:
        for rank in sorted(means):
            mean, first, last = means[rank]
            if mean > state.slow_factor * median:
                steps = f"step {first}" if first == last else f"steps {first}-{last}"
                excluded.append(
                    Exclusion(
                        rank,
                        state.ranks[rank].device,
                        f"slow: {mean:.3f} s of local work per step over {steps}, {mean / median:.1f}x the "
                        f"median {median:.3f} s (limit {state.slow_factor:g}x)",
                    )
                )
    excluded.sort(key=lambda e: e.rank)
    head = f"t={time_s:.3f} s: "
    world = len(state.ranks)
    if not excluded:
        slowest = max((m for m, _, _ in means.values()), default=None)
        health = (
            f" (slowest {slowest:.3f} s of local work per step, median {median:.3f} s, limit {state.slow_factor:g}x)"
            if slowest is not None
            else ""
        )
        members = tuple(o.device for o in state.ranks)
        return Decision(time_s, members, (), (), f"{head}all {world} ranks healthy{health}; membership unchanged")
    pool = sorted(state.spares)
    members_list = [o.device for o in state.ranks]
    replacements: list[Replacement] = []
    for e in excluded:
        spare = next((d for d in pool if d.node == e.device.node), None)
        if spare is None:
            return Decision(
                time_s,
                (),
                tuple(excluded),
                tuple(replacements),
                f"{head}exclude rank {e.rank} on {e.device.key} ({e.reason}), but no spare GPU is left on node "
                f"{e.device.node}: no quorum of {world} ranks in {state.replicas} replicas can form",
                ok=False,
            )
        pool.remove(spare)
        members_list[e.rank] = spare
        replacements.append(Replacement(e.rank, e.device, spare))
    moves = "; ".join(
        f"exclude rank {e.rank} on {e.device.key} ({e.reason}) and bring in spare {r.new.key} as rank {r.rank}"
        for e, r in zip(excluded, replacements, strict=True)
    )
    size = world // state.replicas
    return Decision(
        time_s,
        tuple(members_list),
        tuple(excluded),
        tuple(replacements),
        f"{head}{moves}; quorum: {world} ranks in {state.replicas} replicas of {size}",
    )


# ---------------------------------------------------------------------------------------------- observing


@dataclass(frozen=True, slots=True)
class SegmentView:
    """One engine run as the orchestrator sees it, in global simulated time."""

    commits: tuple[tuple[int, float], ...]  # (step, when every member passed its commit)
    done: tuple[tuple[int, float], ...]  # (step, when every member finished it)
    samples: tuple[tuple[StepSample, ...], ...]  # per rank
    failures: tuple[tuple[int, float, str], ...]  # (rank, detected at, why), by detection time
    detected_at_s: float | None  # the first failure detection of any kind
    fatal: str | None  # a failure the orchestrator does not route around


def observe(
    outcome: RunOutcome, devices: Sequence[Device], cfg: RecoveryConfig, first_step: int, offset_s: float
) -> SegmentView:
    keys = [d.key for d in devices]
    marks = outcome.checkpoints

    def everyone(label: str) -> float | None:
        snaps = marks.get(label)
        if snaps is None or any(k not in snaps for k in keys):
            return None
        return offset_s + max(snaps[k].time_s for k in keys)

    done, commits = [], []
    for step in range(first_step, cfg.steps + 1):
        at = everyone(f"done:{step}")
        if at is None:
            break
        done.append((step, at))
        if cfg.is_commit(step):
            committed = everyone(f"commit:{step}")
            if committed is None:
                break
            commits.append((step, committed))
    samples = []
    for key in keys:
        own: list[StepSample] = []
        previous = marks.get(START, {}).get(key)
        for step in range(first_step, cfg.steps + 1):
            ready = marks.get(f"ready:{step}", {}).get(key)
            if previous is None or ready is None:
                break
            own.append(StepSample(step, offset_s + ready.time_s, ready.time_s - previous.time_s))
            previous = marks.get(f"done:{step}", {}).get(key)
        samples.append(tuple(own))
    failures, fatal = _failures(outcome, cfg, offset_s)
    detections = [at for _, at, _ in failures]
    detections += [offset_s + h["detected_at_s"] for h in outcome.hangs if h.get("detected_at_s") is not None]
    detected = min(detections) if detections else None
    if fatal is None and detected is None and outcome.verdict != "pass":
        fatal = f"the segment ended {outcome.verdict!r} and nothing detected it (no process died, no watchdog fired)"
    return SegmentView(tuple(commits), tuple(done), tuple(samples), failures, detected, fatal)


def _failures(
    outcome: RunOutcome, cfg: RecoveryConfig, offset_s: float
) -> tuple[tuple[tuple[int, float, str], ...], str | None]:
    """Crashed processes (seen at the launcher's next poll) and ranks the watchdog names as the root cause."""
    found: dict[int, tuple[int, float, str]] = {}
    fatal = None
    for error in sorted(outcome.errors, key=lambda e: e["rank"]):
        first = error["message"].splitlines()[0] if error["message"] else error["type"]
        if error["kind"] in ("crash", "heartbeat"):  # dead either way: legacy's heartbeat monitor aborted it
            at = offset_s + error["time_s"] + cfg.monitor_interval_s
            found[error["rank"]] = (
                error["rank"],
                at,
                f"its process died at t={offset_s + error['time_s']:.3f} s: {first}",
            )
        elif error["kind"] != "timeout" and fatal is None:
            fatal = f"rank {error['rank']} failed in {error['op']}: {error['type']}: {first}"
    waits = {h["rank"]: h for h in outcome.hangs}
    status = {rt.rank: rt.status for rt in outcome.ranks}
    detected = sorted((h for h in outcome.hangs if h.get("detected_at_s") is not None), key=_hang_order)
    for hang in detected:
        for root in _roots(hang["rank"], waits, status):
            if root not in found:
                since = offset_s + hang["since_s"]
                at = offset_s + hang["detected_at_s"]
                found[root] = (
                    root,
                    at,
                    f"unresponsive: rank {hang['rank']} waited for it in {hang['op']} from t={since:.3f} s until "
                    f"its watchdog fired at t={at:.3f} s",
                )
    return tuple(sorted(found.values(), key=lambda f: (f[1], f[0]))), fatal


def _hang_order(hang: Mapping[str, Any]) -> tuple[float, int]:
    return hang["detected_at_s"], hang["rank"]


def _roots(start: int, waits: Mapping[int, Mapping[str, Any]], status: Mapping[int, str]) -> list[int]:
    """Follow who-waits-for-whom from ``start`` to the ranks that hold everyone up without waiting themselves:
    a stalled rank (alive, issuing nothing) or a dead one. A rank blocked in a communication that can't
    complete (a mismatch) or one that finished its program (it diverged) is not a device fault: not blamed.
    """
    roots, seen, frontier = set(), {start}, [start]
    while frontier:
        rank = frontier.pop()
        entry = waits.get(rank)
        if rank != start:
            stalled = entry is not None and entry["kind"] == "stall"
            dead = entry is None and status.get(rank) in ("error", "aborted")
            if stalled or dead:
                roots.add(rank)
        for other in entry["waiting_for"] if entry is not None else ():
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return sorted(roots)


# ---------------------------------------------------------------------------------------------- orchestrating


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    index: int
    start_s: float
    end_s: float
    first_step: int
    committed_step: int  # the last durable commit when the segment ended
    lost_steps: int  # steps finished after that commit, re-done by the next segment
    devices: tuple[str, ...]  # per rank
    ended_by: str
    decisions: tuple[Decision, ...]  # the quorums taken during the segment
    trace_hash: str
    policy: tuple[dict[str, Any], ...] = ()  # the policy's group-creation decisions (non-default policies)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """The recovery story: segments, every quorum decision, and the numbers expectations check."""

    steps: int
    committed_steps: int
    lost_steps: int
    segments: tuple[SegmentRecord, ...]
    fault_detected_at_s: float | None  # when the orchestrator first acted on a fault
    reason: str

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return tuple(d for seg in self.segments for d in seg.decisions)

    @property
    def replacements(self) -> tuple[Replacement, ...]:
        return tuple(r for d in self.decisions if d.ok for r in d.replacements)

    @property
    def replacement_devices(self) -> tuple[str, ...]:
        return tuple(r.new.key for r in self.replacements)

    @property
    def recoveries(self) -> int:
        return len(self.segments) - 1

    def explanations(self) -> list[dict[str, Any]]:
        """Entries for ``VariantResult.explanations`` (the JSON's ``decisions``), shaped like policy decisions."""
        out: list[dict[str, Any]] = []
        for seg in self.segments:
            out += [{**entry, "call": f"segment {seg.index}: {entry['call']}"} for entry in seg.policy]
            out.append(
                {
                    "call": f"segment {seg.index}",
                    "ranks": list(range(len(seg.devices))),
                    "plan": f"steps {seg.first_step}-{self.steps} on {', '.join(seg.devices)}",
                    "explanation": f"t={seg.start_s:.3f}-{seg.end_s:.3f} s: {seg.ended_by}",
                    "start_s": round(seg.start_s, 6),
                    "end_s": round(seg.end_s, 6),
                    "first_step": seg.first_step,
                    "committed_step": seg.committed_step,
                    "lost_steps": seg.lost_steps,
                    "devices": list(seg.devices),
                }
            )
            out += [_decision_entry(d) for d in seg.decisions]
        out.append(
            {
                "call": "recovery",
                "ranks": "all",
                "plan": f"{self.committed_steps}/{self.steps} steps committed, {self.lost_steps} lost and re-done, "
                f"{self.recoveries} recover{'y' if self.recoveries == 1 else 'ies'}",
                "explanation": self.reason,
                "committed_steps": self.committed_steps,
                "lost_steps": self.lost_steps,
                "recoveries": self.recoveries,
                "replacement_devices": list(self.replacement_devices),
                "fault_detected_at_s": None if self.fault_detected_at_s is None else round(self.fault_detected_at_s, 6),
            }
        )
        return out


def _decision_entry(d: Decision) -> dict[str, Any]:
    return {
        "call": f"quorum t={d.time_s:.3f} s",
        "ranks": list(range(len(d.members))),
        "plan": d.plan(),
        "explanation": d.explanation,
        "time_s": round(d.time_s, 6),
        "excluded": [{"rank": e.rank, "device": e.device.key, "reason": e.reason} for e in d.excluded],
        "replacements": [{"rank": r.rank, "from": r.old.key, "to": r.new.key} for r in d.replacements],
    }


@dataclass(slots=True)
class RecoveryOutcome(RunOutcome):
    """A RunOutcome for the whole job (final segment's memory and groups; every segment's errors, commits),
    with the recovery story attached."""

    recovery: RecoveryReport | None = None


def orchestrate(cfg: RecoveryConfig, base: SimConfig, *, keep_trace: bool = False) -> RecoveryOutcome:
    """Run the job segment by segment until every step is committed, no quorum forms, or recoveries run out.

    ``base`` is the variant's engine config: ``programs`` holds one training step per rank and ``faults`` the
    first segment's faults.
    """
    cluster = base.cluster
    devices = initial_devices(cluster)
    retired: list[Device] = []  # excluded GPUs never come back
    committed, start_s = 0, 0.0
    segments: list[SegmentRecord] = []
    kept: list[tuple[RunOutcome, float, float]] = []  # (outcome, start, end) per segment
    first_fault: float | None = None
    verdict, reason = "fail", f"gave up after {cfg.max_recoveries} recoveries without committing every step"
    for index in range(1, cfg.max_recoveries + 2):
        first = committed + 1
        programs = segment_programs(cfg, base.programs, devices, first)
        faults = base.faults if index == 1 else NO_FAULTS
        engine = Engine(replace(base, programs=programs, faults=faults), keep_trace=keep_trace)
        outcome = engine.run()
        view = observe(outcome, devices, cfg, first, start_s)
        spares = tuple(d for d in cluster.devices() if d not in devices and d not in retired)
        decisions: list[Decision] = []
        cut_s, window = None, committed
        for step, at in view.commits:  # a quorum at every commit that precedes any detected failure
            if view.detected_at_s is not None and at > view.detected_at_s:
                break
            committed = step
            if committed == cfg.steps:
                break
            decisions.append(quorum(at, _state(cfg, devices, view, window, spares)))
            if decisions[-1].changed or not decisions[-1].ok:
                cut_s = at
                break
            window = step
        if cut_s is None and committed < cfg.steps and view.fatal is None and view.detected_at_s is not None:
            cut_s = view.detected_at_s
            decisions.append(quorum(cut_s, _state(cfg, devices, view, window, spares)))
        if first_fault is None:
            first_fault = cut_s
        end_s = start_s + outcome.end_time_s if cut_s is None else cut_s
        lost = sum(1 for step, at in view.done if step > committed and at <= end_s)
        decision = decisions[-1] if cut_s is not None else None
        finished = True
        if committed == cfg.steps:
            ended_by, verdict = f"all {cfg.steps} steps committed", "pass"
            reason = f"every step committed after {index - 1} recover{'y' if index == 2 else 'ies'}"
        elif view.fatal is not None:
            ended_by = reason = f"not recoverable: {view.fatal}"
            verdict = outcome.verdict if outcome.verdict != "pass" else "error"
        elif decision is None:
            ended_by = reason = f"ended without committing step {cfg.steps} and without a detected failure"
            verdict = "error"
        elif not decision.ok:
            ended_by, reason, verdict = "no quorum", decision.explanation, "fail"
        else:
            finished = False
            why = "; ".join(f"rank {e.rank}: {e.reason}" for e in decision.excluded)
            ended_by = f"{why or 'a failure no rank can be blamed for: restart the same members'}; "
            ended_by += f"resume from step {committed + 1}"
        keys = tuple(d.key for d in devices)
        policy = tuple(engine.explanations)
        segments.append(
            SegmentRecord(
                index,
                start_s,
                end_s,
                first,
                committed,
                lost,
                keys,
                ended_by,
                tuple(decisions),
                outcome.trace_hash,
                policy,
            )
        )
        kept.append((outcome, start_s, end_s))
        if finished:
            break
        assert decision is not None
        retired += [e.device for e in decision.excluded]
        devices = decision.members
        start_s = end_s + cfg.restart_s
    lost_total = sum(s.lost_steps for s in segments)
    report = RecoveryReport(cfg.steps, committed, lost_total, tuple(segments), first_fault, reason)
    return _combine(kept, verdict, report)


def _state(
    cfg: RecoveryConfig, devices: Sequence[Device], view: SegmentView, window: int, spares: tuple[Device, ...]
) -> QuorumState:
    failures = {rank: (at, why) for rank, at, why in view.failures}
    ranks = tuple(
        Observation(
            rank,
            device,
            failures.get(rank, (None, ""))[0],
            failures.get(rank, (None, ""))[1],
            tuple(s for s in view.samples[rank] if s.step > window),
        )
        for rank, device in enumerate(devices)
    )
    return QuorumState(cfg.replicas, ranks, spares, cfg.slow_factor)


def _combine(kept: list[tuple[RunOutcome, float, float]], verdict: str, report: RecoveryReport) -> RecoveryOutcome:
    """One RunOutcome for the job, in global time: the final segment's memory and groups (as its engine left
    them), each segment's durable commits, and the errors and watchdog detections that happened before its end."""
    final, final_start, _ = kept[-1]
    checkpoints: dict[str, dict[str, Snapshot]] = {}
    hangs: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    digest = hashlib.blake2b(digest_size=16)
    trace: list[tuple[Any, ...]] = []
    fr_dumps: dict[int, dict[str, Any]] = {}
    for index, (outcome, start, end) in enumerate(kept, 1):
        digest.update(f"{index}:{outcome.trace_hash}:{start!r}:{end!r};".encode())
        for label, snaps in outcome.checkpoints.items():
            if label.startswith("commit:") and all(start + s.time_s <= end for s in snaps.values()):
                checkpoints[label] = {k: replace(s, time_s=start + s.time_s) for k, s in sorted(snaps.items())}
        for error in outcome.errors:
            if start + error["time_s"] <= end:
                errors.append({**error, "time_s": start + error["time_s"], "segment": index})
        for hang in outcome.hangs:
            if hang.get("detected_at_s") is not None and start + hang["detected_at_s"] <= end:
                since, detected = start + hang["since_s"], start + hang["detected_at_s"]
                hangs.append({**hang, "since_s": since, "detected_at_s": detected, "segment": index})
                fr_dumps = outcome.fr_dumps
        if outcome.trace:
            trace.append(("segment", index, start, end))
            trace += outcome.trace
    for d in report.decisions:
        digest.update(f"{d.time_s!r}:{d.plan()}:{d.explanation};".encode())
    digest.update(f"verdict:{verdict}".encode())
    if final_start:
        for ledger in final.ledgers.values():
            ledger.timeline = [replace(e, time_s=final_start + e.time_s) for e in ledger.timeline]
        for record in final.groups.values():
            for info in record.members.values():
                info["phases"] = {phase: final_start + t for phase, t in info["phases"].items()}
    return RecoveryOutcome(
        verdict=verdict,
        ranks=final.ranks,
        ledgers=final.ledgers,
        checkpoints=checkpoints,
        groups=final.groups,
        hangs=hangs,
        errors=errors,
        event_count=sum(o.event_count for o, _, _ in kept),
        trace_hash=digest.hexdigest(),
        end_time_s=kept[-1][2],
        ops_executed=sum(o.ops_executed for o, _, _ in kept),
        trace=trace,
        fr_dumps=fr_dumps,
        recovery=report,
    )


def check_recovery(scenario: Scenario, limits: InputLimits | None = None) -> RecoveryConfig:
    """Everything about a recovery run that can be checked before it runs: the ``[recovery]`` table, the
    generated programs' length (``steps`` times the body, within ``max_program_ops``, checked before they are
    built) and the ``[faults]`` against the first segment's programs."""
    assert scenario.recovery is not None
    limits = limits or current_limits()
    cfg = parse_recovery(scenario.recovery, scenario.source, scenario.cluster, limits)
    body = max((len(p.ops) for p in scenario.programs), default=0)
    length = cfg.steps * (body + 3) + 2 * len(scenario.programs)  # per step: body, markers, commit barrier
    if length > limits.max_program_ops:
        raise ScenarioError(
            scenario.source,
            "recovery.steps",
            exceeded(
                "max_program_ops", f"{cfg.steps} steps of {body} ops ({length} ops per rank)", limits.max_program_ops
            ),
        )
    try:
        apply_to_programs(
            scenario.faults, segment_programs(cfg, scenario.programs, initial_devices(scenario.cluster), 1)
        )
    except FaultError as err:
        raise ScenarioError(scenario.source, "faults", f"{err} (in the first segment's generated program)") from None
    return cfg


def run_recovery(
    scenario: Scenario, base: SimConfig, *, keep_trace: bool = False
) -> tuple[RecoveryOutcome, list[dict[str, Any]]]:
    """The runner's entry point: validate ``[recovery]`` and the faults, orchestrate, explain."""
    assert scenario.recovery is not None
    cfg = check_recovery(scenario)
    outcome = orchestrate(cfg, base, keep_trace=keep_trace)
    assert outcome.recovery is not None
    return outcome, outcome.recovery.explanations()

"""Segments in time order: run, observe, decide, re-form the membership, resume from the last commit."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from simnccl.cluster import Device
from simnccl.engine import Engine, RunOutcome, SimConfig, Snapshot
from simnccl.faults import NO_FAULTS
from simnccl.recovery.config import RecoveryConfig
from simnccl.recovery.observe import SegmentView, observe
from simnccl.recovery.programs import check_recovery, initial_devices, segment_programs
from simnccl.recovery.quorum import Decision, Observation, QuorumState, Replacement, quorum
from simnccl.scenario import Scenario


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
            ledger.timeline = [e._replace(time_s=final_start + e.time_s) for e in ledger.timeline]
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
        # The faults are the first segment's (``orchestrate``): those that never acted there never acted in the job
        # (they were dropped here, and a crash timed after the job's end passed as a fault it had survived)
        faults_unacted=list(kept[0][0].faults_unacted),
        recovery=report,
    )


def run_recovery(
    scenario: Scenario, base: SimConfig, *, keep_trace: bool = False
) -> tuple[RecoveryOutcome, list[dict[str, Any]]]:
    """The runner's entry point: validate ``[recovery]`` and the faults, orchestrate, explain."""
    assert scenario.recovery is not None
    cfg = check_recovery(scenario)
    outcome = orchestrate(cfg, base, keep_trace=keep_trace)
    assert outcome.recovery is not None
    return outcome, outcome.recovery.explanations()

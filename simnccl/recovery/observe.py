"""Reading one segment's engine outcome: commits passed, local step times, crashes and watchdog timeouts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simnccl.cluster import Device
from simnccl.engine import RunOutcome
from simnccl.recovery.config import START, RecoveryConfig
from simnccl.recovery.quorum import StepSample


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

"""The outcome of a run: the verdict, and the hang report — for every stuck rank, where it waits, for whom,
and why, in words (torchft's style: a decision comes with its explanation).

Why a room: every run ends with a verdict (DESIGN rule 7), and a hang is only useful with its explanation; both
are read off the ranks' state and the meetings they wait in, after the run (or when a watchdog fires).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from simnccl.engine import init_barrier
from simnccl.engine.comms import bootstrap_group, unique_id_stage
from simnccl.engine.memory import Memory
from simnccl.engine.nvls import MulticastSlots
from simnccl.engine.sim import Sim
from simnccl.engine.state import ENDED_STATUSES, Block, RankRuntime, RunOutcome, device_name, measured_device
from simnccl.engine.timing import Timing
from simnccl.meetings import Meeting
from simnccl.ops import Checkpoint
from simnccl.release import Impl
from simnccl.watchdog import NO_HANDLING, MonitorAction

INIT_BLOCKS = (
    "group rank 0 published the NCCL unique id, so this rank is inside ncclCommInitRank, waiting for every member; "
    "in NCCL's default blocking mode it has no timeout and the communicator has no watchdog yet: nothing ends it"
)
INIT_LEGACY_MONITOR = " but legacy's heartbeat monitor, once another rank's watchdog timeout signals a dump"


class HangReport:
    def __init__(self, sim: Sim, timing: Timing, stuck: Mapping[int, MonitorAction | None]) -> None:
        """``stuck``: the ranks whose watchdog is stuck with them (the Watchdogs room's, read here)."""
        self.env = sim.env
        self.device_type = sim.device_type
        self.timing = timing
        self.stuck = stuck
        self.broken: set[int] = set()  # ranks stuck in an op of a communicator an NCCL error broke (NoHandling)

    def entry(
        self,
        rt: RankRuntime,
        by_rank: Sequence[RankRuntime] | Mapping[int, RankRuntime],
        settled: dict[int, tuple[Meeting, list[int], str]] | None = None,
    ) -> dict[str, Any]:
        """``rt``'s hang entry. ``by_rank``: every rank by its number (the ranks list is one). ``settled``:
        given once the run is over (nothing moves any more), what each meeting waits for is worked out once
        and shared by every rank stuck in it — a world-wide hang is then O(world), not world x missing."""
        block = rt.block
        stuck = next(((m, pc) for m, pc in rt.pending if not m.complete), None)
        if block is not None and stuck is not None and stuck[0] is not block.meeting:
            # Run-ahead splits that completed after the rank started waiting: it is really in the first open one.
            op = rt.program.ops[stuck[1]]
            block = Block(op, stuck[1], stuck[0], block.since_s)
        if block is None:  # pragma: no cover - a running rank at the end means the sim-time cap was hit
            return {
                "rank": rt.rank,
                "op": "<running>",
                "group": "",
                "seq": 0,
                "waiting_for": [],
                "since_s": self.env.now,
                "explanation": "still running when the simulated-time cap was hit",
            }
        meeting = block.meeting
        if settled is None:
            missing, explanation = self._waiting(meeting, by_rank)
        else:
            view = settled.get(id(meeting))
            if view is None or view[0] is not meeting:
                view = settled[id(meeting)] = (meeting, *self._waiting(meeting, by_rank))
            _, missing, explanation = view
        timeout_s, watchdog = self._timeout_for(rt, meeting)
        return {
            "rank": rt.rank,
            "op": block.op.describe(),
            "op_index": block.pc,
            "group": meeting.group or (block.handle or ""),
            "handle": block.handle,
            "kind": meeting.kind,
            "seq": meeting.seq,
            "waiting_for": missing,
            "since_s": block.since_s,
            "timeout_s": timeout_s,
            "detected_at_s": None if timeout_s is None else block.since_s + timeout_s,
            "watchdog": watchdog,
            "explanation": explanation,
        }

    def _waiting(
        self, meeting: Meeting, by_rank: Sequence[RankRuntime] | Mapping[int, RankRuntime]
    ) -> tuple[list[int], str]:
        """Who a meeting still waits for, and why, in words: the same for every rank stuck in it."""
        missing = list(meeting.missing())
        explanations = []
        if meeting.problem:
            explanations.append(meeting.problem)
        if meeting.note:
            explanations.append(meeting.note)
        if not missing and meeting.completed_at is not None and meeting.completed_at > self.env.now:
            slow = [link.name for link in self.timing.slow_links if self.timing.spans(link, meeting.expected)]
            explanations.append(
                f"every member arrived; the operation itself runs until t={meeting.completed_at:.3f} s"
                + (f" over the slowed link {', '.join(slow)}" if slow else "")
            )
        for r in missing:
            other = by_rank[r]
            explanations.append(f"rank {r} {self._whereabouts(other)}")
        return missing, "; ".join(explanations)

    def _whereabouts(self, rt: RankRuntime) -> str:
        if rt.status == "done":
            return "finished its program without joining"
        if rt.status in ("error", "aborted") and rt.error is not None:
            # An aborted process died; one that raised (a Python error, CleanUpOnly's DistBackendError) did not.
            how = "raised" if rt.status == "error" else "died:"
            # an empty message (a bare ``assert``) has no first line: torch prints the type alone
            first = next(iter(rt.error.message.splitlines()), "")
            return f"{how} {rt.error.type_name}" + (f": {first}" if first else "")
        if rt.block is not None and rt.block.meeting.kind == "stall":
            if rt.rank in self.stuck:
                return f"is stuck in a CUDA/NCCL call with its watchdog, before {rt.block.op.describe()}"
            if rt.rank in self.broken:
                return f"is stuck in {rt.block.op.describe()}: {NO_HANDLING}"
            return f"is stalled before {rt.block.op.describe()} (injected fault)"
        if rt.block is not None:
            m = rt.block.meeting
            where = f"group {m.group!r}" if m.group else "its parent communicator"
            if m.kind == "bootstrap" and self._unique_id_stage(rt, m) == "init":
                return f"is blocked in ncclCommInitRank in {rt.block.op.describe()} (bootstrap of {where})"
            return f"is blocked in {rt.block.op.describe()} ({m.kind} {m.seq} on {where})"
        return "is still running"

    def _unique_id_stage(self, rt: RankRuntime, meeting: Meeting) -> str | None:
        """``unique_id_stage`` of ``rt`` in its bootstrap ``meeting``, under the group's implementation."""
        group = rt.group_named(bootstrap_group(meeting))
        comm = None if group is None else group.comm_for(self.device_type)
        return None if comm is None else unique_id_stage(meeting, rt.rank, comm.impl)

    def _timeout_for(self, rt: RankRuntime, meeting: Meeting) -> tuple[float | None, str]:
        named = rt.group_named(bootstrap_group(meeting))
        group = rt.world if named is None else named
        timeout = group.timeout_s if group is not None else None
        if meeting.kind == "stall":
            if rt.rank in self.stuck:
                return None, (
                    "its watchdog thread is stuck too, and no heartbeat monitor watches it "
                    "(only legacy ProcessGroupNCCL has one, unless TORCH_NCCL_BLOCKING_WAIT=1)"
                )
            if rt.rank in self.broken:
                return None, "under NoHandling the watchdog only logs the error and any timeout; nothing ends the op"
            return None, "a stalled process issues nothing that could time out"
        if meeting.kind == init_barrier.KIND:
            return init_barrier.detected_after(meeting), (
                "TORCH_DIST_INIT_BARRIER=1: torch's store-based barrier after new_group raises DistStoreError at the "
                "end of the first store wait (10 s + 1 s per thousand ranks) past the group's timeout"
            )
        if meeting.kind in ("split", "split-color"):
            return (
                None,
                "ncclCommSplit blocks on the host with no timeout; only the job's own timeout ends it",
            )
        if meeting.kind == "bootstrap":
            comm = None if group is None else group.comm_for(self.device_type)
            stage = self._unique_id_stage(rt, meeting)
            if stage == "init":
                return None, INIT_BLOCKS + (
                    INIT_LEGACY_MONITOR if comm is not None and comm.impl is Impl.LEGACY else ""
                )
            if stage == "store" and comm is not None and comm.impl is Impl.LEGACY:
                return rt.world.timeout_s if rt.world is not None else timeout, (
                    "the store get of the NCCL unique id times out after the default store's timeout "
                    "(init_process_group's)"
                )
            return timeout, "the store wait for the NCCL unique id times out after the group's timeout"
        return timeout, "the watchdog aborts the collective after the group's timeout"


def outcome(
    sim: Sim,
    report: HangReport,
    memory: Memory,
    nvls: MulticastSlots,
    timing: Timing,
    fr_dumps: dict[int, dict[str, Any]],
) -> RunOutcome:
    """The verdict and everything a result is built from, read off the finished run."""
    hangs: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    ranks = sim.ranks
    settled: dict[int, tuple[Meeting, list[int], str]] = {}
    for rt in ranks:
        if rt.status in ("error", "aborted") and rt.error is not None:
            error = {
                "rank": rt.rank,
                "kind": rt.error_kind,
                "type": rt.error.type_name,
                "message": rt.error.message,
                "op": rt.error_op,
                "time_s": rt.finished_at,
            }
            if rt.replaced_timeout is not None:
                error["replaced_timeout"] = rt.replaced_timeout
            if rt.error.facts:
                error.update(rt.error.facts)
            errors.append(error)
    for rt in ranks:
        if rt.timeout_hang is not None:
            hangs.append(rt.timeout_hang)
        elif rt.status not in ENDED_STATUSES:
            hangs.append(report.entry(rt, ranks, settled))  # ranks[r] is rank r
    if any(e["kind"] in ("error", "abort", "crash", "peer-lost") for e in errors):
        verdict = "error"
    elif any(e["kind"] in ("oom", "check") for e in errors):
        verdict = "fail"
    elif hangs:
        verdict = "hang"
    else:
        verdict = "pass"
    trace = sim.trace
    trace.record("verdict", verdict)
    return RunOutcome(
        verdict=verdict,
        ranks=ranks,
        ledgers=memory.ledgers,
        checkpoints=memory.checkpoints,
        groups={(name, key.ranks): record for (name, key), record in memory.group_records.items()},
        hangs=hangs,
        errors=errors,
        event_count=trace.count,
        trace_hash=trace.digest(),
        end_time_s=sim.env.now,
        ops_executed=sim.guard.ops,
        trace=trace.events,
        fr_dumps=fr_dumps,
        slowdowns=timing.slowdowns(),
        host_ledgers=memory.host_ledgers,
        multicast_slots=nvls.in_use(),
        slots_charged=nvls.charged,
        races=list(sim.races),
    )


def devices_short_of(result: RunOutcome, label: str) -> dict[str, list[int]]:
    """The devices (by ledger name) of the ranks whose program holds checkpoint ``label`` but that ended before
    reaching it, each with those ranks. Why: a check of "every device at the checkpoint" read only the devices
    some rank measured there, so a rank that died or hung on the way (with 20 GB on its device) left its device
    out, and the check passed on the others."""
    first: dict[int, int | None] = {}  # per program object: where the label first is
    short: dict[str, list[int]] = {}
    for rt in result.ranks:
        ops = rt.program.ops
        at = first.get(id(ops), -1)
        if at == -1:
            at = first[id(ops)] = next(
                (i for i, op in enumerate(ops) if type(op) is Checkpoint and op.label == label), None
            )
        if at is not None and rt.pc <= at:
            short.setdefault(device_name(rt, measured_device(rt)), []).append(rt.rank)
    return short


# What a check that asks "did it pass" says of a pass that a race decided (``pass_decided_by_race``).
PASSED_BY_RACE = (
    "passed only in the simulated order of events, which real runs need not keep (the other order fails or hangs)"
)


def pass_decided_by_race(result: RunOutcome, *, quote: bool = True) -> str | None:
    """Why the run's "pass" is not one to rely on, or None.

    Why: a race (``RunOutcome.races``) is a store write or connection the simulated timing ordered one way, where
    real ranks order it either way and the other order fails (each race's text says what was measured). No hang
    or error carries it, so the verdict is "pass"; a check that called that run safe would be wrong in the user's
    favour. So every check that asks whether a run passed (``testing.passes``, a scenario variant's verdict, a
    sweep cell, a replay) fails it, unless the user accepted races (``--allow race``, ``--accept-verdict race``).
    ``quote``: end with the first race's text (and how many more); without, for a report that prints them."""
    if result.verdict != "pass" or not result.races:
        return None
    if not quote:
        return PASSED_BY_RACE
    more = len(result.races) - 1
    return f"{PASSED_BY_RACE}: race: {result.races[0]}" + (f" (and {more} more race(s))" if more else "")

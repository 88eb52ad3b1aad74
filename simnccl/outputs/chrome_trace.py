"""A run as a Chrome/Perfetto trace (JSON trace-event format) that ui.perfetto.dev and chrome://tracing open.

Why: a hang or a slow startup is a story across ranks in time — who arrived when, who waited for whom, which
rank's arrival released the others, what memory did meanwhile. A timeline viewer tells it better than any
table. Layout: one process per (scenario, variant, node), one track (thread) per rank; a slice per rendezvous
a rank took part in (communicator bootstrap, split, collective, send/recv, a cohort of group creations) with a
nested ``wait`` slice for the time it waited for the last member; flow arrows from the rank whose arrival
completed a meeting to every other member; a slice to the end of the run for each rank left hanging, naming
the ranks it waits for; instants for calls, checkpoints, faults, errors and timeouts; and a counter per device
with its used memory split by owner (CUDA context, torch, communicators).

What it reads: the outcome of a run made with ``keep_trace=True`` (its event trace and its meetings). Time a
rank spends in local work (``compute``) is a gap on its track: the engine records no event for it. A recovery
job's segments are separate engine runs: its trace shows a track of segments, every rank's events and the last
segment's memory, but no per-meeting slices.

Format rules this file keeps (tests/test_outputs_chrome_trace.py checks them): complete events (``X``) only, with
``dur``, properly nested per track; events sorted by ``ts`` per track; every flow id has one start (``s``) and one
end (``f``, ``bp: "e"``), each inside a slice of its track; timestamps in microseconds of simulated time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from simnccl.memory import to_mib
from simnccl.result import ScenarioResult, VariantResult

TRACE_SCHEMA = 1
US_PER_S = 1_000_000
# Per-rank trace events shown as instants when the run also kept its meetings (op completions are slices then).
INSTANT_KINDS = frozenset(
    {
        "init",
        "new_group",
        "split_group",
        "checkpoint",
        "memory_check",
        "torch-alloc",
        "destroy",
        "done",
        "error",
        "fault",
        "timeout",
        "fr-dump",
        "heartbeat",
        "watchdog-stuck",
        "peer-closed",
        "collision",
    }
)
# Per-rank trace events never shown as instants: memory has its counters, tree releases their flows.
NOT_INSTANTS = frozenset({"alloc", "context", "tree-release"})
# A hang the run ended on at once (a detected deadlock) is drawn this long, relative to the run, so it shows.
DRAWN_HANG_FRACTION, DRAWN_HANG_MIN_S = 0.1, 0.001
_NODE_OF_DEVICE = re.compile(r"^n(\d+):")


class TraceUnavailable(ValueError):
    """The outcome kept no event trace (run with ``keep_trace=True``): a trace of it would be empty."""


@dataclass(slots=True)
class _Slice:
    start_s: float
    end_s: float
    name: str
    args: dict[str, Any]
    children: list[_Slice] = field(default_factory=list)


def write_trace(results: Sequence[ScenarioResult], path: Path) -> int:
    """Write the trace of every variant of ``results`` to ``path``; return the number of events."""
    trace = build_trace(results)
    path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    return len(trace["traceEvents"])


def build_trace(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    """The trace as a JSON-ready object (``traceEvents``, ``displayTimeUnit``, ``otherData``)."""
    builder = _Builder()
    for result in results:
        for variant in result.variants:
            builder.add_variant(result.scenario, variant)
    return {
        "traceEvents": builder.sorted_events(),
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "simnccl",
            "schema": TRACE_SCHEMA,
            "time": "simulated seconds, written as microseconds",
            "runs": [
                {"scenario": r.scenario, "source": r.source, "seed": r.seed, "trace_hash": r.trace_hash}
                for r in results
            ],
        },
    }


def _us(seconds: float) -> float:
    return round(seconds * US_PER_S, 3)


def _plain(value: Any) -> Any:
    """A JSON value for an event's args (trace events hold tuples, ints, strings)."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return str(value)


def _ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class _Builder:
    def __init__(self) -> None:
        self._meta: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._pids: dict[tuple[str, str, str], int] = {}
        self._next_flow = 1

    # ------------------------------------------------------------------ processes and tracks

    def _pid(self, scenario: str, variant: str, where: str) -> int:
        key = (scenario, variant, where)
        pid = self._pids.get(key)
        if pid is None:
            pid = self._pids[key] = len(self._pids) + 1
            self._meta.append(
                {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": " · ".join(key)}}
            )
            self._meta.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            )
        return pid

    def _thread(self, pid: int, tid: int, name: str) -> None:
        self._meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self._meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    # ------------------------------------------------------------------ one variant

    def add_variant(self, scenario: str, variant: VariantResult) -> None:
        outcome = variant.outcome
        if not outcome.trace:
            raise TraceUnavailable(
                f"{scenario}/{variant.name}: the run kept no event trace (run it with keep_trace=True)"
            )
        recovery = getattr(outcome, "recovery", None)
        node_of = {rt.rank: rt.node for rt in outcome.ranks}
        track = {}
        for rank in sorted(node_of):
            pid = self._pid(scenario, variant.name, f"node {node_of[rank]}")
            track[rank] = (pid, rank)
            self._thread(pid, rank, f"rank {rank}")
        slices: dict[int, list[_Slice]] = {rank: [] for rank in node_of}
        flows: list[tuple[int, float, list[int], str]] = []
        if recovery is None:
            self._meeting_slices(outcome, slices, flows)
        self._hang_slices(outcome, slices, recovery is not None)
        kept = {rank: self._emit_slices(track[rank], _sequential(items)) for rank, items in slices.items()}
        for releaser, at_s, members, name in flows:
            self._flows(track, kept, releaser, at_s, members, name)
        self._instants(outcome.trace, track, with_meetings=recovery is None)
        self._memory(scenario, variant, outcome)
        if recovery is not None:
            self._segments(scenario, variant.name, recovery)

    def _meeting_slices(
        self, outcome: Any, slices: dict[int, list[_Slice]], flows: list[tuple[int, float, list[int], str]]
    ) -> None:
        hung = {h["rank"] for h in outcome.hangs}
        finished = {rt.rank: rt.finished_at for rt in outcome.ranks}
        cohort_calls = {e[3]: e[4] for e in outcome.trace if len(e) == 5 and e[1] == "meet" and e[2] == "cohort"}
        for meeting in outcome.meetings:
            if not meeting.arrivals:
                continue
            arrived = {}
            for rank, arrival in sorted(meeting.arrivals.items()):
                start = arrival.time_s
                after = arrival.after
                if after is not None and after.completed_at is not None and after.completed_at > start:
                    start = after.completed_at  # a run-ahead split: really joined when its predecessor ended
                arrived[rank] = start
            if meeting.key in cohort_calls:
                calls = cohort_calls[meeting.key]
                what = f"{calls} group creation{'s' if calls != 1 else ''} (cohort)"
            else:
                first = next(iter(meeting.arrivals.values())).op
                what = getattr(first, "name", "op")
            name = f"{what} ({meeting.kind} #{meeting.seq} on {meeting.group!r})" if meeting.group else what
            args = {"kind": meeting.kind, "group": meeting.group, "seq": meeting.seq, "members": len(meeting.expected)}
            if meeting.complete:
                ready = max(arrived.values())
                last = [r for r, t in arrived.items() if t == ready]
                for rank, start in arrived.items():
                    item = _Slice(
                        start, meeting.completed_at, name, {**args, "op": meeting.arrivals[rank].op.describe()}
                    )
                    if ready > start:
                        item.children.append(_Slice(start, ready, f"wait for {_ranks_text(last)}", {}))
                    slices[rank].append(item)
                if len(arrived) > 1:
                    flows.append((last[0], ready, [r for r in arrived if r != last[0]], name))
                continue
            for rank, start in arrived.items():
                if rank in hung:
                    continue  # its hang slice tells this wait, with whom it waits for
                end = finished.get(rank)
                problem = meeting.fatal or meeting.problem or "the meeting never completed"
                slices[rank].append(
                    _Slice(
                        start,
                        outcome.end_time_s if end is None else end,
                        f"{name} (never completed)",
                        {**args, "op": meeting.arrivals[rank].op.describe(), "problem": problem},
                    )
                )

    def _hang_slices(self, outcome: Any, slices: dict[int, list[_Slice]], recovery: bool) -> None:
        finished = {rt.rank: rt.finished_at for rt in outcome.ranks}
        for hang in outcome.hangs:
            rank = hang["rank"]
            if rank not in slices:
                continue
            end = hang.get("detected_at_s") if recovery else finished.get(rank)
            end = max(outcome.end_time_s if end is None else end, hang["since_s"])
            waiting = hang.get("waiting_for") or []
            label = f"hung in {hang.get('op', '?')}"
            args = {k: _plain(v) for k, v in hang.items() if k not in ("monitor",)}
            if end <= hang["since_s"]:
                # A deadlock ends the run the moment it forms: draw the hang anyway, and say its length is drawn.
                end = hang["since_s"] + max(outcome.end_time_s * DRAWN_HANG_FRACTION, DRAWN_HANG_MIN_S)
                args["note"] = "nothing ends this wait; the run stopped when the deadlock was detected"
            item = _Slice(hang["since_s"], end, label, args)
            wait = (
                f"wait for {_ranks_text(waiting)}" if waiting else f"{hang.get('kind', 'blocked')}: waits for no rank"
            )
            item.children.append(_Slice(hang["since_s"], end, wait, {}))
            slices[rank].append(item)

    def _emit_slices(self, track: tuple[int, int], items: list[_Slice]) -> list[tuple[float, float]]:
        """Write the slices as complete events; return their (ts, end) in µs, to bind flows to."""
        pid, tid = track
        kept = []
        for item in items:
            ts, end = _us(item.start_s), _us(item.end_s)
            if end <= ts:
                continue
            self._events.append(
                {
                    "ph": "X",
                    "name": item.name,
                    "cat": "op",
                    "pid": pid,
                    "tid": tid,
                    "ts": ts,
                    "dur": round(end - ts, 3),
                    "args": item.args,
                }
            )
            kept.append((ts, end))
            for child in item.children:
                cts, cend = max(ts, _us(child.start_s)), min(end, _us(child.end_s))
                if cend > cts:
                    self._events.append(
                        {
                            "ph": "X",
                            "name": child.name,
                            "cat": "wait",
                            "pid": pid,
                            "tid": tid,
                            "ts": cts,
                            "dur": round(cend - cts, 3),
                            "args": child.args,
                        }
                    )
        return kept

    def _flows(
        self,
        track: dict[int, tuple[int, int]],
        kept: dict[int, list[tuple[float, float]]],
        releaser: int,
        at_s: float,
        members: list[int],
        name: str,
    ) -> None:
        """Arrows from the rank whose arrival completed the meeting to each member it released."""
        at = _us(at_s)
        start = _inside(kept[releaser], at)
        if start is None:
            return
        for member in members:
            end = _inside(kept[member], at)
            if end is None or end < start:
                continue  # the member's slice was cut short: no arrow backwards in time
            flow = self._next_flow
            self._next_flow += 1
            pid, tid = track[releaser]
            self._events.append(
                {"ph": "s", "name": name, "cat": "meeting", "id": flow, "pid": pid, "tid": tid, "ts": start}
            )
            pid, tid = track[member]
            self._events.append(
                {"ph": "f", "bp": "e", "name": name, "cat": "meeting", "id": flow, "pid": pid, "tid": tid, "ts": end}
            )

    def _instants(
        self, trace: list[tuple[Any, ...]], track: dict[int, tuple[int, int]], *, with_meetings: bool
    ) -> None:
        offset = 0.0
        for event in trace:
            if event and event[0] == "segment":
                offset = event[2]  # a recovery job: the segment's events are in its own time
                continue
            if len(event) < 3 or not isinstance(event[1], int) or isinstance(event[1], bool):
                continue
            at, rank, kind, *rest = event
            if kind in NOT_INSTANTS or rank not in track or (with_meetings and kind not in INSTANT_KINDS):
                continue
            pid, tid = track[rank]
            label = kind if not rest or kind in ("init", "fr-dump") else f"{kind} {_plain(rest[0])}"
            self._events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": label,
                    "cat": "event",
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(offset + at),
                    "args": {"detail": _plain(rest)},
                }
            )

    def _memory(self, scenario: str, variant: VariantResult, outcome: Any) -> None:
        """A counter per device: used MiB by owner kind, after every change (one value per instant)."""
        for ledger in outcome.ledgers.values():
            if not ledger.timeline:
                continue
            match = _NODE_OF_DEVICE.match(ledger.device)
            pid = self._pid(scenario, variant.name, f"node {match.group(1)}" if match else "devices")
            by_kind: dict[str, int] = {}
            points: dict[float, dict[str, float]] = {}
            for event in ledger.timeline:
                by_kind[event.owner.kind] = by_kind.get(event.owner.kind, 0) + event.delta_bytes
                points[_us(event.time_s)] = {kind: round(to_mib(held), 3) for kind, held in sorted(by_kind.items())}
            kinds = sorted(by_kind)
            for ts, values in points.items():
                self._events.append(
                    {
                        "ph": "C",
                        "name": f"{ledger.device} used MiB",
                        "cat": "memory",
                        "pid": pid,
                        "tid": 0,
                        "ts": ts,
                        "args": {kind: values.get(kind, 0.0) for kind in kinds},
                    }
                )

    def _segments(self, scenario: str, variant: str, recovery: Any) -> None:
        pid = self._pid(scenario, variant, "recovery job")
        self._thread(pid, 0, "segments")
        for segment in recovery.segments:
            ts, end = _us(segment.start_s), _us(segment.end_s)
            self._events.append(
                {
                    "ph": "X",
                    "name": f"segment {segment.index}: steps {segment.first_step}-{segment.committed_step}",
                    "cat": "segment",
                    "pid": pid,
                    "tid": 0,
                    "ts": ts,
                    "dur": round(max(end - ts, 0.0), 3),
                    "args": {"ended_by": segment.ended_by, "lost_steps": segment.lost_steps},
                }
            )

    def sorted_events(self) -> list[dict[str, Any]]:
        """Metadata first; then per track by time, an enclosing slice before the slices it contains."""
        order = {"X": 0, "s": 1, "f": 1, "i": 2, "C": 3}
        events = sorted(
            self._events,
            key=lambda e: (e["pid"], e["tid"], e["ts"], order[e["ph"]], -e.get("dur", 0.0)),
        )
        return [*self._meta, *events]


def _sequential(items: list[_Slice]) -> list[_Slice]:
    """A rank is in one call at a time: where a slice starts before the previous one ends (a gloo broadcast
    member released before the whole tree finished), the previous one ended by then."""
    # Meetings that took no time (a one-rank gloo group's store key) are not drawn, and must not cut others.
    items = sorted((s for s in items if s.end_s > s.start_s), key=lambda s: (s.start_s, -s.end_s))
    for before, after in pairwise(items):
        if after.start_s < before.end_s:
            before.end_s = after.start_s
            for child in before.children:
                child.end_s = min(child.end_s, after.start_s)
    return items


def _inside(spans: list[tuple[float, float]], at: float) -> float | None:
    """``at`` if a slice of the track encloses it (flows bind to the slice enclosing them); else a point inside
    the slice that ends exactly at ``at`` (a meeting that took no time after its last arrival); else None."""
    for ts, end in spans:
        if ts <= at < end:
            return at
    for ts, end in spans:
        if at == end:
            return round((ts + end) / 2, 4)
    return None

"""The simpy engine: one process per rank runs its Program; meetings match ranks; a verdict always comes.

Why this shape: every behaviour that can hang (bootstrap, split, collective, send/recv) is a meeting keyed the
way torch/NCCL match it, so a hang is simply a meeting that can't complete, and the report falls out of the
registry: who is waiting where, for whom. The engine is the only simpy user (DESIGN rule 3).

Cost (DESIGN rule 8): a non-member ``new_group`` is O(1). Under a bound parent it is a NOCOLOR split the rank
joins without blocking ("run-ahead"): it records its arrival and keeps going until it next does something
observable, when it waits for its last pending split. Only members pay per-member work, so a startup's cost
grows with memberships, not with calls x world. Where the call needs no split at all (a lazy or unbound default
group, a backend other than the default group's), the outsider fast path (``_outsider_calls``) takes a rank's
run of such calls in place: the outsider plan is computed once per kind of rank and call, and a rank-independent
policy decides once per shared history state (``_HistoryNode``); each rank only moves its counter, handles and
history forward. Same trace, same outcome (tests/test_outsiders.py), about a microsecond per call.
"""

from __future__ import annotations

import gc
import hashlib
import math
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import simpy

from simnccl.backends import Charge, Comm, CommState, lifecycle, runtime_connect
from simnccl.backends.gloo import PEER_CLOSED, SINGLETON_RACE, broadcast_needs, direct_peers, wire_mismatch
from simnccl.c10d import (
    NON_GROUP_MEMBER,
    CommPlan,
    Group,
    GroupPlan,
    Members,
    ProcessContext,
    TorchError,
    outsider_key,
    plan_init,
    plan_new_group,
    plan_split_group,
    split_source,
    validate_ranks,
    world_ranks,
)
from simnccl.cluster import Cluster
from simnccl.faults import NO_FAULTS, Fault, FaultSchedule, apply_to_programs, validate
from simnccl.flight_recorder import RECORDING_IMPLS, Entry, FlightRecorder, buffer_size, numel
from simnccl.meetings import Arrival, Meeting, MeetingRegistry
from simnccl.memory import (
    DeviceLedger,
    Owner,
    SimulatedOOM,
    oom_message,
    vllm_check_message,
    vllm_requested_bytes,
)
from simnccl.ops import (
    NO_OPTIONS,
    WORLD,
    Alloc,
    Broadcast,
    Checkpoint,
    Collective,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Op,
    PgOptions,
    PointToPoint,
    Program,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.policy import (
    BasePolicy,
    GroupDecision,
    GroupRequest,
    History,
    InitPlan,
    InitRequest,
    Policy,
    decide_group,
    decide_split,
    decides_alike_on_every_rank,
)
from simnccl.profiles import MAX_NCHANNELS_ENV, CommCosts, Profile
from simnccl.release import CUDAMALLOCASYNC_TRACKER, DEFAULT_PG_NCCL_TIMEOUT_S, Impl, Release
from simnccl.watchdog import MonitorAction, TimeoutAction, on_async_error, on_dump_signal, on_timeout, on_watchdog_stuck

Waiting = Generator[simpy.Event, Any, None]


class EngineGuardError(RuntimeError):
    """A runaway simulation: too many ops or too much wall time. Never a silent hang of the harness."""


class WorkloadFailure(Exception):
    """The workload's own check failed on this rank (vLLM's startup memory check)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Guards that turn a runaway simulation into an error: engine work units (an op run by one rank, or a
    member handled in a cohort block), wall seconds, simulated seconds."""

    max_ops: int = 200_000_000
    wall_s: float = 900.0
    max_sim_time_s: float = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one run needs; a scenario variant expands into one of these."""

    cluster: Cluster
    release: Release
    profile: Profile
    programs: Sequence[Program]
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: str = "torchrun"
    seed: int = 0
    limits: Limits = Limits()
    policy: Policy | None = None
    faults: FaultSchedule = NO_FAULTS


@dataclass(slots=True)
class Block:
    op: Op
    pc: int
    handle: str
    meeting: Meeting
    since_s: float


@dataclass(slots=True)
class RankRuntime:
    """One process: its program counter, groups, handles, device and status."""

    rank: int
    program: Program
    ctx: ProcessContext
    node: int
    pc: int = 0
    status: str = "running"
    current_device: int | None = None
    contexts: set[int] = field(default_factory=set)
    world: Group | None = None
    handles: dict[str, Group | int] = field(default_factory=dict)
    counter: int = 1
    groups: list[Group] = field(default_factory=list)
    block: Block | None = None
    pending: list[tuple[Meeting, int]] = field(default_factory=list)
    error: TorchError | None = None
    error_op: str = ""
    error_kind: str = ""
    nccl_devices: set[int] = field(default_factory=set)
    history: History = field(default_factory=History)
    history_shared: bool = False
    # Calls taken on shared decisions (``Engine._outsider_calls``) and not yet recorded in ``history``: the
    # rank's real history is ``history`` + these; ``hnode`` is the shared state it is in (None: not tracked).
    history_tail: list[_Step] = field(default_factory=list)
    hnode: _HistoryNode | None = None
    policy_class: tuple[Any, ...] | None = None  # (ctx, world, class) cache for Engine._policy_class
    outsider_verdicts: tuple[Any, ...] | None = None  # cache for Engine._outsider_verdicts
    fr: FlightRecorder | None = None
    timed_out: bool = False
    unhealthy: bool = False
    timeout_hang: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    device: str
    used_bytes: int
    free_bytes: int
    time_s: float
    rank: int


@dataclass(slots=True)
class GroupRecord:
    """One group as the world sees it: its members and what each member's communicators cost."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    impl: str
    via_split: bool
    members: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class RunOutcome:
    verdict: str
    ranks: list[RankRuntime]
    ledgers: dict[str, DeviceLedger]
    checkpoints: dict[str, dict[str, Snapshot]]
    groups: dict[tuple[str, tuple[int, ...]], GroupRecord]
    hangs: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    event_count: int
    trace_hash: str
    end_time_s: float
    ops_executed: int
    trace: list[tuple[Any, ...]]
    fr_dumps: dict[int, dict[str, Any]] = field(default_factory=dict)
    slowdowns: list[dict[str, Any]] = field(default_factory=list)  # what each straggler fault cost, see _slowdowns


class Engine:
    """Runs a SimConfig to a verdict."""

    def __init__(self, config: SimConfig, keep_trace: bool = False, fast_path: bool = True) -> None:
        """``fast_path=False`` runs every call through the ordinary per-rank path (``_outsider_calls`` off):
        the same outcome and trace, slower; kept so tests can check the two agree."""
        self.config = config
        self.cluster: Cluster = config.cluster
        self.release: Release = config.release
        self.profile: Profile = config.profile
        self._device_type = "cuda" if self.cluster.device_count > 0 else "cpu"  # where tensors live (fixed)
        self._costs_by_channels: dict[str | None, CommCosts] = {}
        self.policy: Policy = config.policy if config.policy is not None else BasePolicy()
        self._policy_active = type(self.policy) is not BasePolicy
        self._decisions: dict[tuple[int, tuple[int, ...]], tuple[int, GroupDecision]] = {}
        self._fast = fast_path
        # Decisions shared between ranks with equal histories: only a policy simnccl has established decides
        # alike on every rank (its built-ins); any other is asked on every calling rank and checked.
        self._policy_verified = decides_alike_on_every_rank(self.policy)
        self._shared_steps = fast_path and self._policy_active and self._policy_verified
        self._hnodes: dict[tuple[Any, int, int], _HistoryNode] = {}
        self._classes: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        # Outsider plans: per outsider_key, id(op torch receives) -> counter advance (None: not a plain call).
        self._outsiders: dict[tuple[object, ...], dict[int, int | None]] = {}
        self._outsider_ops: list[NewGroup] = []  # the ops those ids name, kept alive for the run
        self._outsider_tables: dict[int, tuple[Program, list[_OutsiderEntry | None]]] = {}
        self._canonical_ops: dict[NewGroup, NewGroup] = {}  # one op object per value (programs keep theirs alive)
        self._op_keys: dict[int, int] = {}  # id(program's op) -> id(its canonical op)
        self.explanations: list[dict[str, Any]] = []
        self.env = simpy.Environment()
        self.meetings = MeetingRegistry()
        self.ledgers: dict[str, DeviceLedger] = {
            d.key: DeviceLedger(d.key, self.cluster.gpu.total_bytes) for d in self.cluster.devices()
        }
        self.checkpoints: dict[str, dict[str, Snapshot]] = {}
        self.group_records: dict[tuple[str, _RanksKey], GroupRecord] = {}
        self._record_of_group: dict[int, tuple[Group, GroupRecord]] = {}  # id(group) -> (group, its record)
        self._hasher = hashlib.blake2b(digest_size=16)
        self._event_count = 0
        self._keep_trace = keep_trace
        self._trace: list[tuple[Any, ...]] = []
        self._next_comm_id = 1
        self._ops = 0  # rank-ops simulated (a block of k calls taken by a cohort counts k per rank)
        self._work = 0  # engine work units, what the max_ops guard bounds
        self._clock: float | None = None  # set while a cohort applies a block at a simulated time ahead of now
        self._shared_program: Program | None = None  # set once the fault schedule has rewritten programs
        self._cohorts: dict[int, Cohort] = {}
        self._device_ledgers: dict[tuple[int, int], DeviceLedger] = {}  # (node, index) -> its ledger
        self._procs: dict[int, simpy.Process] = {}
        self._min_timeout_s = DEFAULT_PG_NCCL_TIMEOUT_S
        self.fr_dumps: dict[int, dict[str, Any]] = {}
        self._members_cache: dict[int, tuple[tuple[int, ...] | None, Members]] = {}
        self._ranks_keys: dict[int, _RanksKey] = {}
        self._wall_start = 0.0
        self._pair_attempts: dict[tuple[str, int, int, int], int] = {}
        self._meeting_ids: dict[int, int] = {}
        self._split_results: dict[int, dict[tuple[int, ...], int | Meeting]] = {}
        self._comm_members: dict[int, tuple[int, ...]] = {}
        self._gloo_used = False  # set once a gloo communicator exists: the peer-closed model costs nothing else
        self._gloo_closed: dict[int, set[int]] = {}  # gloo comm id -> ranks whose sockets on it are closed
        self._peer_lost: set[int] = set()  # ranks interrupted with "Connection closed by peer", not yet failed
        self._tree_waits: dict[int, dict[int, simpy.Event]] = {}  # id(gloo broadcast) -> member -> its release
        self._tree_released: dict[int, set[int]] = {}  # id(gloo broadcast) -> members already released
        self.faults = config.faults
        self._programs = apply_to_programs(config.faults, config.programs)
        # Cohorts need every rank on one Program object and no runtime fault that could stop one rank mid-block.
        self._shared_program = None if config.faults.runtime() else self._common_program(self._programs)
        # Per op of the shared program, whether a cohort may take it (ops are immutable: decided once).
        self._block_starts = tuple(map(_starts_block, self._shared_program.ops)) if self._shared_program else ()
        self._op_faults: dict[tuple[int, int], Fault] = {}
        self._slow: dict[int, float] = {}
        self._slow_extra_s: dict[int, float] = {}  # rank straggler -> local seconds it added
        self._slow_links: list[_SlowLink] = []
        self._monitor_start: dict[int, float] = {}  # rank -> when its default group (and its watchdog) was made
        self._stuck: dict[int, MonitorAction | None] = {}  # watchdog-stuck ranks -> what their monitor does
        self._monitor_action: dict[int, MonitorAction] = {}  # rank -> the heartbeat-monitor action now pending
        self._oom_at_init: set[int] = set()
        self._store_timeout: set[tuple[int, int | None]] = set()  # (rank, op index or None: the next bootstrap)
        self.ranks = [self._make_rank(r) for r in range(self.cluster.world_size)]
        self._arm_faults()
        self._world_ranks = world_ranks(self.cluster.world_size)
        shared_history = History()  # every rank has seen the same calls until one diverges (copy-on-write)
        for rt in self.ranks:
            rt.history = shared_history
            rt.history_shared = True
        # Handlers as the class's functions, not bound methods: bound methods held here would make every
        # engine a reference cycle, left for the cyclic GC to find and free (measured: most of a small run's
        # GC time); without them an engine that ran to the end is freed as soon as it is dropped.
        cls = type(self)
        self._dispatch: dict[type, Callable[[Engine, RankRuntime, Any], Waiting | None]] = {
            SetDevice: cls._op_set_device,
            InitProcessGroup: cls._op_init,
            NewGroup: cls._op_new_group,
            SplitGroup: cls._op_split_group,
            DestroyProcessGroup: cls._op_destroy,
            Compute: cls._op_compute,
            Alloc: cls._op_alloc,
            MemoryCheck: cls._op_memory_check,
            Checkpoint: cls._op_checkpoint,
        }

    # ------------------------------------------------------------------ setup and run

    def _make_rank(self, rank: int) -> RankRuntime:
        programs = self._programs
        if len(programs) != self.cluster.world_size:
            raise ValueError(f"{len(programs)} programs for a world of {self.cluster.world_size} ranks")
        env = dict(self.config.env)
        local = self.cluster.local_rank(rank)
        if self.config.launcher == "torchrun":
            env.update(LOCAL_RANK=str(local), RANK=str(rank), WORLD_SIZE=str(self.cluster.world_size))
        ctx = ProcessContext(
            rank=rank,
            world_size=self.cluster.world_size,
            local_rank=local,
            device_count=self.cluster.device_count,
            env=env,
        )
        return RankRuntime(
            rank=rank,
            program=programs[rank],
            ctx=ctx,
            node=self.cluster.node_of(rank),
            fr=FlightRecorder(rank, capacity=buffer_size(env)),
        )

    def run(self) -> RunOutcome:
        """Run to a verdict. The cyclic GC is paused meanwhile: a large startup allocates millions of
        long-lived objects, and repeated full collections over them made run time grow faster than the
        work (measured: benchmarks/engine.py); nothing the engine builds needs cycle collection to finish."""
        self._wall_start = time.monotonic()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for rt in self.ranks:
                self._procs[rt.rank] = self.env.process(self._rank_process(rt))
            for fault in self.faults.runtime():
                if fault.at_s is not None:
                    self.env.process(self._timed_fault(fault))
            self._run_with_watchdogs()
            return self._outcome()
        finally:
            if gc_was_enabled:
                gc.enable()

    @staticmethod
    def _common_program(programs: Sequence[Program]) -> Program | None:
        """The one Program object every rank runs, if there is one: the precondition for cohorts."""
        first = programs[0] if programs else None
        return first if first is not None and all(p is first for p in programs) else None

    def _now(self) -> float:
        return self.env.now if self._clock is None else self._clock

    def _record(self, *event: Any) -> None:
        self._event_count += 1
        self._hasher.update(repr(event).encode())
        if self._keep_trace:
            self._trace.append(event)

    def _guard(self) -> None:
        self._ops += 1
        self._work += 1
        if self._work & 0xFFFF == 0:
            self._check_limits()

    def _check_limits(self) -> None:
        limits = self.config.limits
        if self._work > limits.max_ops:
            raise EngineGuardError(f"simulation exceeded {limits.max_ops} ops; a runaway program?")
        elapsed = time.monotonic() - self._wall_start
        if elapsed > limits.wall_s:
            raise EngineGuardError(
                f"simulation exceeded its wall-clock guard of {limits.wall_s:.0f} s after {self._work} ops"
            )

    def _rank_process(self, rt: RankRuntime) -> Waiting:
        ops = rt.program.ops
        dispatch = self._dispatch
        fast = self._fast
        block_starts = self._block_starts if rt.program is self._shared_program else None
        try:
            while rt.pc < len(ops):
                if fast and type(ops[rt.pc]) is NewGroup and self._outsider_calls(rt):
                    continue
                self._guard()
                op = ops[rt.pc]
                if self._op_faults:
                    fault = self._op_faults.get((rt.rank, rt.pc))
                    if fault is not None:
                        yield from self._inject(rt, fault)
                if block_starts is not None and block_starts[rt.pc]:
                    yield from self._cohort(rt)
                    continue
                handler = dispatch.get(type(op))
                if handler is None:
                    handler = type(self)._op_collective if isinstance(op, Collective) else type(self)._op_p2p
                work = handler(self, rt, op)
                if work is not None:
                    yield from work
                rt.pc += 1
            yield from self._settle(rt)
            rt.status = "done"
            rt.finished_at = self.env.now
            self._record(self.env.now, rt.rank, "done")
        except simpy.Interrupt as interrupt:
            cause = interrupt.cause
            while True:  # a later crash or heartbeat-monitor kill may cut a stall or a dump wait short
                try:
                    if isinstance(cause, _Crash) and cause.stall:
                        yield from self._stall(rt, cause.fault)
                    elif not isinstance(cause, _Crash):
                        rt.status = "blocked"
                        if cause.wait_s > 0:
                            yield self.env.timeout(cause.wait_s)
                    break
                except simpy.Interrupt as again:
                    cause = again.cause
            if isinstance(cause, _Crash):
                self._fail(rt, "crash", cause, abort=True)
                return
            action: TimeoutAction = cause
            self._fail(rt, action.kind, TorchError(action.error_type, action.message), abort=action.outcome == "abort")
        except _Crash as err:
            self._fail(rt, "crash", err, abort=True)
        except _AsyncError as err:
            self._fail(rt, "timeout" if err.action.outcome != "abort" else "abort", err, abort=True)
        except _ProcessAbort as err:
            self._fail(rt, "abort", err)
        except _PeerLost as err:
            self._fail(rt, "peer-lost", err)
        except TorchError as err:
            self._fail(rt, "error", err)
        except SimulatedOOM as err:
            self._fail(rt, "oom", TorchError("torch.OutOfMemoryError", str(err)))
        except WorkloadFailure as err:
            self._fail(rt, "check", TorchError("ValueError", str(err)))

    def _fail(self, rt: RankRuntime, kind: str, err: TorchError, *, abort: bool = False) -> None:
        rt.status = "aborted" if kind == "abort" or abort else "error"
        rt.error = err
        rt.error_kind = kind
        rt.error_op = rt.program.ops[rt.pc].describe() if rt.pc < len(rt.program.ops) else "<end>"
        rt.block = None
        rt.finished_at = self._now()
        self._record(self._now(), rt.rank, "error", kind, err.type_name, err.message)
        if rt.status == "aborted" and self._gloo_used:
            # A dead process's sockets close: gloo peers waiting on it fail (a Python error keeps them open).
            self._close_gloo(rt, [c for g in rt.groups for c in g.comms.values()])

    # ------------------------------------------------------------------ meetings

    def _open(self, key: tuple[Any, ...], kind: str, group: str, seq: int, expected: tuple[int, ...]) -> Meeting:
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self.meetings.open(key, kind, group, seq, expected)
            meeting.result = self.env.event()
        return meeting

    def _arrive(
        self,
        meeting: Meeting,
        rt: RankRuntime,
        payload: Any,
        op: Op,
        *,
        duration: Callable[[Meeting], float],
        run_ahead: bool = False,
    ) -> None:
        """Record an arrival; check it agrees with the first; complete the meeting when everyone is here."""
        after = None
        if run_ahead and rt.pending:
            after = rt.pending[-1][0]
        arrival = meeting.arrivals[rt.rank] = Arrival(rt.rank, self.env.now, payload, op, after)
        if meeting.problem is None:
            first = next(iter(meeting.arrivals.values()))
            problem = None if first is arrival else self._disagreement(meeting, first, arrival)
            if problem:
                meeting.problem = problem
                if meeting.abort_on_mismatch and problem.startswith("size mismatch"):
                    self._abort_meeting(meeting, problem)
        if meeting.problem is None and len(meeting.arrivals) == len(meeting.expected):
            self._complete(meeting, duration(meeting))

    def _disagreement(self, meeting: Meeting, first: Arrival, this: Arrival) -> str | None:
        """Why two arrivals at one key can't be the same operation (what torch/NCCL would trip on)."""
        if first is this:
            return None
        if meeting.kind == "bootstrap":
            if first.payload is not this.payload and first.payload != this.payload:
                return (
                    f"store key collision under group name {meeting.group!r}: rank {first.rank} bootstraps "
                    f"ranks {list(first.payload)}, rank {this.rank} bootstraps ranks {list(this.payload)}"
                )
            return None
        a, b = first.payload, this.payload
        if meeting.abort_on_mismatch:  # gloo: what the wire does, not what the user meant (backends/gloo.py)
            how = wire_mismatch(a, b)
            if how is None:
                return None
            if how == "hang":
                return (
                    f"gloo collective mismatch at tag {meeting.seq} of group {meeting.group!r}: rank {first.rank} "
                    f"issued {first.op.describe()}, rank {this.rank} issued {this.op.describe()} — different gloo "
                    "algorithms send on different slots, so neither receives the other's messages: both wait "
                    "until the timeout"
                )
        if a[0] != b[0] and not meeting.abort_on_mismatch:
            return (
                f"operation mismatch at sequence number {meeting.seq} of group {meeting.group!r}: "
                f"rank {first.rank} issued {first.op.describe()}, rank {this.rank} issued {this.op.describe()}"
            )
        if a[0] != "split" and a[1:] != b[1:]:
            return (
                f"size mismatch at sequence number {meeting.seq} of group {meeting.group!r}: "
                f"rank {first.rank} {a[0]} of {a[1]} bytes ({a[2]}), rank {this.rank} {b[1]} bytes ({b[2]})"
            )
        return None

    def _abort_meeting(self, meeting: Meeting, problem: str) -> None:
        """gloo enforces sizes: a mismatched collective aborts every process already in it, and later ones."""
        meeting.fatal = (
            "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  Received data size "
            f"doesn't match expected size. Is there a distributed collective mismatch in your code? ({problem})"
        )
        self._record(self.env.now, "abort-meeting", meeting.key)
        meeting.result.succeed()
        for event in self._tree_waits.get(id(meeting), {}).values():  # gloo broadcast members wait on their own
            _fire_once(event)

    def _complete(self, meeting: Meeting, duration_s: float) -> None:
        done_at = max(self.env.now, meeting.ready_time()) + duration_s
        meeting.completed_at = done_at
        self._record(done_at, "meet", meeting.kind, meeting.key, len(meeting.expected))
        event = meeting.result
        delay = done_at - self.env.now
        self.env.timeout(delay).callbacks.append(lambda _ev: event.succeed())

    def _wait(self, rt: RankRuntime, meeting: Meeting, op: Op, own: simpy.Event | None = None) -> Waiting:
        """Block until the meeting completes (or ``own``, this rank's release from it, fires)."""
        if self._gloo_closed and not meeting.complete and meeting.fatal is None:
            peer = self._closed_peer(rt.rank, meeting)
            if peer is not None:
                raise _PeerLost(peer)
        now = self.env.now
        if not (meeting.complete and meeting.completed_at <= now) and meeting.fatal is None:
            rt.status = "blocked"
            rt.block = Block(op, rt.pc, _handle_of(op), meeting, now)
            yield meeting.result if own is None else own
            rt.status = "running"
            rt.block = None
        if meeting.fatal is not None:
            raise _ProcessAbort(meeting.fatal)

    def _settle(self, rt: RankRuntime) -> Iterable[simpy.Event]:
        """Wait for this rank's run-ahead NOCOLOR splits before it does anything observable (``yield from``
        it). With nothing run ahead, as for most ops, it is an empty tuple: no generator is created per op."""
        return self._settle_pending(rt) if rt.pending else ()

    def _settle_pending(self, rt: RankRuntime) -> Waiting:
        last, pc = rt.pending[-1]
        if not (last.complete and last.completed_at <= self.env.now):
            # Report the earliest split that is not complete: that is where the rank really is.
            first_open = next(((m, p) for m, p in rt.pending if not m.complete), (last, pc))
            rt.status = "blocked"
            op = rt.program.ops[first_open[1]]
            rt.block = Block(op, first_open[1], _handle_of(op), first_open[0], self.env.now)
            yield last.result
            while not all(m.complete for m, _ in rt.pending):  # pragma: no cover - completion is ordered
                yield next(m for m, _ in rt.pending if not m.complete).result
            rt.status = "running"
            rt.block = None
        rt.pending.clear()

    # ------------------------------------------------------------------ durations

    def _bootstrap_s(self, meeting: Meeting) -> float:
        return self.profile.timing.comm_init_s

    def _split_s(self, meeting: Meeting) -> float:
        return self.profile.timing.split_s

    def _collective_s(self, meeting: Meeting) -> float:
        timing = self.profile.timing
        size = next(iter(meeting.arrivals.values())).payload[1]
        n = len(meeting.expected)
        if n <= 1:
            return timing.collective_latency_s
        bus_bytes = 2 * (n - 1) / n * size
        seconds = timing.collective_latency_s + bus_bytes / (timing.bus_bandwidth_gbps * 1e9)
        return self._over_links(meeting, seconds) if self._slow_links else seconds

    def _p2p_s(self, meeting: Meeting) -> float:
        timing = self.profile.timing
        size = next(iter(meeting.arrivals.values())).payload[1]
        seconds = timing.p2p_latency_s + size / (timing.bus_bandwidth_gbps * 1e9)
        return self._over_links(meeting, seconds) if self._slow_links else seconds

    def _over_links(self, meeting: Meeting, seconds: float) -> float:
        """A communicator with a member on each end of a slowed link runs at that link's pace: the slowest
        such link sets the factor (a ring or tree is as fast as its slowest hop). The extra time is charged to
        that link so ``explain`` can name it."""
        worst: _SlowLink | None = None
        for link in self._slow_links:
            if (worst is None or link.fault.factor > worst.fault.factor) and self._spans(link, meeting.expected):
                worst = link
        if worst is None:
            return seconds
        worst.ops += 1
        worst.extra_s += seconds * (worst.fault.factor - 1.0)
        if meeting.group and meeting.group not in worst.groups:
            worst.groups.append(meeting.group)
        self._record(self.env.now, "slow-link", worst.name, meeting.key)
        return seconds * worst.fault.factor

    def _spans(self, link: _SlowLink, members: tuple[int, ...]) -> bool:
        """Whether ``members`` put one rank on each end of ``link`` (nodes, or GPUs of one node)."""
        ends = [False, False]
        for r in members:
            end = self._link_end(link, r)
            if end is not None:
                ends[end] = True
                if ends[0] and ends[1]:
                    return True
        return False

    def _link_end(self, link: _SlowLink, rank: int) -> int | None:
        node = self.ranks[rank].node
        if link.nodes[0] != link.nodes[1]:
            return 0 if node == link.nodes[0] else 1 if node == link.nodes[1] else None
        if node != link.nodes[0]:
            return None
        device = self._rank_device(rank)
        devices = self._rank_device(link.fault.rank), self._rank_device(link.fault.peer or 0)
        if devices[0] == devices[1]:
            return None  # both ends on one GPU: there is no wire between them to slow
        return 0 if device == devices[0] else 1 if device == devices[1] else None

    def _rank_device(self, rank: int) -> int:
        rt = self.ranks[rank]
        return rt.ctx.local_rank if rt.current_device is None else rt.current_device

    # ------------------------------------------------------------------ devices and memory

    def _ledger(self, rt: RankRuntime, index: int) -> DeviceLedger:
        """The ledger of device ``index`` on this rank's node (validated by the cluster on first use)."""
        key = (rt.node, index)
        ledger = self._device_ledgers.get(key)
        if ledger is None:
            ledger = self._device_ledgers[key] = self.ledgers[self.cluster.device(rt.node, index).key]
        return ledger

    def _touch(self, rt: RankRuntime, index: int, op: Op) -> DeviceLedger:
        """Use a device from this process: the first touch creates its CUDA context."""
        ledger = self._ledger(rt, index)
        if index not in rt.contexts:
            rt.contexts.add(index)
            ledger.allocate(
                Owner("cuda_context", rt.rank),
                self.cluster.gpu.cuda_context_bytes,
                time_s=self._now(),
                op=op,
            )
            self._record(self._now(), rt.rank, "context", ledger.device)
        return ledger

    def _charge(self, rt: RankRuntime, comm: Comm, charges: list[Charge], op: Op, group: Group | None) -> None:
        if comm.device is None or not charges:
            return
        ledger = self._touch(rt, comm.device, op)
        if comm.device not in rt.nccl_devices and lifecycle(comm.impl).allocates_gpu_memory:
            rt.nccl_devices.add(comm.device)
            charges = [Charge("process-first-comm", self._bytes(self._costs(rt).process_first_comm_mib)), *charges]
        if rt.rank in self._oom_at_init and any(c.phase == "init" for c in charges):
            self._oom_at_init.discard(rt.rank)
            ledger = self._ledger(rt, comm.device)
            raise SimulatedOOM(
                oom_message(ledger.device, self._bytes(self._costs(rt).init_mib), 0, ledger.total_bytes, nccl=True)
                + " (injected fault: oom-at-init)",
                ledger.device,
                self._bytes(self._costs(rt).init_mib),
                0,
            )
        now = self._now()  # no simulated time passes while charging
        member: dict[str, Any] | None = None
        for charge in charges:
            if charge.num_bytes == 0:
                continue
            ledger.allocate(
                Owner("comm", rt.rank, comm.group, charge.phase),
                charge.num_bytes,
                time_s=now,
                op=op,
                nccl=True,
            )
            self._record(now, rt.rank, "alloc", ledger.device, comm.group, charge.phase, charge.num_bytes)
            if group is not None:
                if member is None:  # looked up at the first real charge, as the record is created only then
                    record = self._group_record(group, comm)
                    member = record.members.setdefault(rt.rank, {"device": ledger.device, "bytes": 0, "phases": {}})
                member["bytes"] += charge.num_bytes
                member["phases"].setdefault(charge.phase, now)

    @staticmethod
    def _bytes(mib: float) -> int:
        return round(mib * 1024 * 1024)

    def _group_record(self, group: Group, comm: Comm) -> GroupRecord:
        cached = self._record_of_group.get(id(group))
        if cached is not None and cached[0] is group:
            return cached[1]
        key = (group.name, self._ranks_key(group.ranks))
        record = self.group_records.get(key)
        if record is None:
            record = GroupRecord(group.name, group.desc, group.ranks, comm.impl.value, comm.via_split)
            self.group_records[key] = record
        # A group's name and members never change and records are never replaced: remember its record.
        self._record_of_group[id(group)] = (group, record)
        return record

    def _ranks_key(self, ranks: tuple[int, ...]) -> _RanksKey:
        """A member tuple as a dict key with its hash computed once per tuple object: every member of a
        group looks its record up, and rehashing a 16k-rank tuple per member is quadratic."""
        entry = self._ranks_keys.get(id(ranks))
        if entry is None or entry.ranks is not ranks:
            entry = self._ranks_keys[id(ranks)] = _RanksKey(ranks)
        return entry

    # ------------------------------------------------------------------ local ops

    def _op_set_device(self, rt: RankRuntime, op: SetDevice) -> Waiting:
        yield from self._settle(rt)
        index = rt.ctx.local_rank if op.device is None else op.device
        if index < 0 or index >= self.cluster.device_count:
            raise TorchError("torch.AcceleratorError", "CUDA error: invalid device ordinal")
        rt.current_device = index
        self._touch(rt, index, op)

    def _op_compute(self, rt: RankRuntime, op: Compute) -> Waiting:
        yield from self._settle(rt)
        if op.seconds > 0:
            factor = self._slow.get(rt.rank, 1.0)
            if factor != 1.0:
                self._slow_extra_s[rt.rank] = self._slow_extra_s.get(rt.rank, 0.0) + op.seconds * (factor - 1.0)
            yield self.env.timeout(op.seconds * factor)

    def _current_device(self, rt: RankRuntime) -> int:
        return 0 if rt.current_device is None else rt.current_device

    def _op_alloc(self, rt: RankRuntime, op: Alloc) -> Waiting:
        yield from self._settle(rt)
        ledger = self._touch(rt, self._current_device(rt), op)
        ledger.allocate(Owner("torch", rt.rank, phase=op.tag), self._bytes(op.mib), time_s=self.env.now, op=op)
        self._record(self.env.now, rt.rank, "torch-alloc", ledger.device, op.mib)

    def _op_memory_check(self, rt: RankRuntime, op: MemoryCheck) -> Waiting:
        yield from self._settle(rt)
        index = self._current_device(rt)
        ledger = self._touch(rt, index, op)
        free, total = ledger.mem_get_info()
        requested = vllm_requested_bytes(total, op.gpu_memory_utilization)
        self._record(self.env.now, rt.rank, "memory_check", ledger.device, free, requested)
        if free < requested:
            raise WorkloadFailure(
                vllm_check_message(f"cuda:{index}", free, total, op.gpu_memory_utilization, requested)
            )

    def _op_checkpoint(self, rt: RankRuntime, op: Checkpoint) -> Waiting:
        yield from self._settle(rt)
        index = rt.current_device
        if index is None and rt.world is not None:
            index = rt.world.bound_device
        self._record(self.env.now, rt.rank, "checkpoint", op.label)
        per_device = self.checkpoints.setdefault(op.label, {})
        if index is None:
            return
        ledger = self._ledger(rt, index)
        per_device[ledger.device] = Snapshot(ledger.device, ledger.used_bytes, ledger.free_bytes, self.env.now, rt.rank)

    # ------------------------------------------------------------------ group creation

    def _op_init(self, rt: RankRuntime, op: InitProcessGroup) -> Waiting:
        yield from self._settle(rt)
        if rt.world is not None:
            raise TorchError("ValueError", "trying to initialize the default process group twice!")
        if self._policy_active:
            op = self._policy_init(rt, op)
        plan = plan_init(self.release, rt.ctx, op.backend, op.device_id, op.timeout_s, op.pg_options)
        group = self._group_from_plan(rt, plan)
        rt.world = group
        rt.handles[WORLD] = group
        self._monitor_start[rt.rank] = self.env.now  # the default group's watchdog (and heartbeat monitor) start
        self._record(self.env.now, rt.rank, "init", plan.backend.requested, plan.bound_device)
        yield from self._create_comms(rt, group, plan, op)

    def _members(self, op: NewGroup) -> Members | tuple[int, ...] | None:
        """The op's validated members, once per rank-list object (all ranks, and a policy's rewritten op,
        share it); invalid lists stay raw so each rank raises torch's error itself."""
        entry = self._members_cache.get(id(op.ranks))
        if entry is None or entry[0] is not op.ranks:  # keyed by the tuple object, kept alive by the entry
            try:
                members = validate_ranks(op.ranks, self.cluster.world_size)
            except TorchError:
                return op.ranks
            entry = self._members_cache[id(op.ranks)] = (op.ranks, members)
        return entry[1]

    def _op_new_group(self, rt: RankRuntime, op: NewGroup) -> Waiting | None:
        self._require_world(rt, op)
        if self._policy_active:
            decided = self._policy_group(rt, op)
            if decided is None:
                return None  # reused an identical group: no torch call at all
            op = decided
        plan = self._plan_new_group(rt, op, rt.counter)
        rt.counter += plan.counter_advance
        if not plan.member:
            if op.bind:
                # Frameworks keep a group only where they are members (``if rank in ranks: _TP = g``), so a
                # non-member result never overwrites a handle; an unbound one becomes NON_GROUP_MEMBER.
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            if plan.nocolor_split_on is not None:
                return self._nocolor_split(rt, plan.nocolor_split_on, op)
            return None
        return self._create_member_group(rt, plan, op)

    def _op_split_group(self, rt: RankRuntime, op: SplitGroup) -> Waiting | None:
        self._require_world(rt, op)
        parent = self._resolve(rt, op.parent, op)
        if not isinstance(parent, Group):
            raise TorchError("RuntimeError", f"split_group: this rank is not a member of the parent {op.parent!r}")
        if self._policy_active:
            decided = self._policy_split(rt, op, parent)
            if decided is None:
                return None  # every split of the call reused an identical group: no torch call
            op = decided
        plan = plan_split_group(
            self.release,
            rt.ctx,
            rt.counter,
            parent,
            op.split_ranks,
            op.pg_options,
            op.group_desc,
            op.timeout_s,
        )
        rt.counter += plan.counter_advance
        if not plan.member:
            if op.bind:
                # Frameworks keep a group only where they are members (``if rank in ranks: _TP = g``), so a
                # non-member result never overwrites a handle; an unbound one becomes NON_GROUP_MEMBER.
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            if plan.nocolor_split_on is not None:
                return self._nocolor_split(rt, plan.nocolor_split_on, op)
            return None
        return self._create_member_group(rt, plan, op)

    def _create_member_group(self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup) -> Waiting:
        yield from self._settle(rt)
        group = self._group_from_plan(rt, plan)
        if op.bind:
            rt.handles[op.bind] = group
        self._record(self.env.now, rt.rank, op.name, plan.name, _ranks_digest(plan.ranks))
        yield from self._create_comms(rt, group, plan, op)

    def _require_world(self, rt: RankRuntime, op: Op) -> Group:
        if rt.world is None:
            raise TorchError(
                "ValueError",
                "Default process group has not been initialized, please make sure to call init_process_group.",
            )
        return rt.world

    def _group_from_plan(self, rt: RankRuntime, plan: GroupPlan) -> Group:
        group = Group(
            name=plan.name,
            desc=plan.desc,
            ranks=plan.ranks,
            rank_in_group=plan.rank_in_group,
            backend=plan.backend,
            bound_device=plan.bound_device,
            timeout_s=plan.timeout_s,
            options=plan.options,
        )
        rt.groups.append(group)
        self._min_timeout_s = min(self._min_timeout_s, plan.timeout_s)
        if rt.fr is not None:
            rt.fr.group(plan.name, plan.desc, plan.ranks)
        return group

    def _create_comms(self, rt: RankRuntime, group: Group, plan: GroupPlan, op: Op) -> Waiting:
        for comm_plan in plan.comms:
            comm = Comm(
                impl=comm_plan.pair.impl,
                group=group.name,
                size=group.size,
                device=comm_plan.device,
                lazy_init=comm_plan.lazy_init,
                via_split=comm_plan.split_from is not None,
                shared=comm_plan.shared,
            )
            for pair in plan.backend.pairs:
                if pair.name == comm_plan.pair.name:
                    group.comms[pair.device_type] = comm
            self._group_record(group, comm)
            if comm_plan.split_from is not None:
                yield from self._member_split(rt, group, comm, comm_plan, op)
            elif comm_plan.eager:
                yield from self._init_comm(rt, group, comm, op)

    def _abort_if_cudamallocasync(self, rt: RankRuntime, comm: Comm) -> None:
        """2.15 defect (#203322): every nccl2 communicator registers an allocator hook cudaMallocAsync rejects."""
        if comm.impl not in (Impl.NCCL2, Impl.NCCL_LAZY) or not self.release.cudamallocasync_aborts:
            return
        conf = rt.ctx.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "backend:cudaMallocAsync" in conf.replace(" ", ""):
            raise _ProcessAbort(
                "terminate called after throwing an instance of 'c10::Error'\n  what():  " + CUDAMALLOCASYNC_TRACKER
            )

    def _init_comm(self, rt: RankRuntime, group: Group, comm: Comm, op: Op) -> Waiting:
        """Bootstrap a communicator over the store: a members-only meeting keyed by the group's name."""
        life = lifecycle(comm.impl)
        if comm.impl is Impl.GLOO:
            self._gloo_used = True
        if comm.device is None and comm.impl.is_nccl:
            comm.device = self._current_device(rt)
        if comm.device is not None and comm.impl.is_nccl:
            self._touch(rt, comm.device, op)
        if life.communicates and group.size > 1:
            key = ("bootstrap", group.name, comm.impl.is_nccl)
            meeting = self._open(key, "bootstrap", group.name, 0, group.ranks)
            if rt.rank in meeting.arrivals or meeting.complete:
                meeting = self._collision(meeting, rt, group, op)
            armed = (rt.rank, rt.pc) if (rt.rank, rt.pc) in self._store_timeout else (rt.rank, None)
            if armed in self._store_timeout:
                self._store_timeout.discard(armed)
                meeting = self._open(("store-fault", rt.rank, group.name), "bootstrap", group.name, 0, group.ranks)
                meeting.problem = "injected fault: store-timeout — this rank's store never returns the unique id"
            self._arrive(meeting, rt, group.ranks, op, duration=self._bootstrap_s)
            yield from self._wait(rt, meeting, op)
            comm.comm_id = self._comm_id_for(meeting)
        else:
            if comm.impl is Impl.GLOO:
                self._gloo_singleton(rt, group, op)
            comm.comm_id = self._new_comm_id()
        self._comm_members[comm.comm_id] = group.ranks
        self._abort_if_cudamallocasync(rt, comm)
        comm.state = CommState.READY
        self._charge(rt, comm, life.init_charges(self._costs(rt), comm, rt.ctx.env), op, group)

    def _gloo_singleton(self, rt: RankRuntime, group: Group, op: Op) -> None:
        """A one-rank ProcessGroupGloo still writes its address under the group's store prefix (measured: a
        ``new_group([0])`` adds one store key), though it waits for nobody. Under a name another group bootstraps
        with (diverged counters) the keys collide: record it, so both sides report the store-key race."""
        key = ("bootstrap", group.name, False)
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self._open(key, "bootstrap", group.name, 0, group.ranks)
            meeting.arrivals[rt.rank] = Arrival(rt.rank, self.env.now, group.ranks, op)
            meeting.completed_at = self.env.now  # a later bootstrapper under this name collides with it
            meeting.result.succeed()
            return
        if not meeting.complete and meeting.problem is None and meeting.arrivals:
            first = next(iter(meeting.arrivals.values()))
            meeting.problem = (
                f"store key collision under group name {group.name!r}: ranks {list(meeting.arrivals)} bootstrap "
                f"ranks {list(first.payload)}, rank {rt.rank} wrote its one-rank group's key under that name; "
                f"{SINGLETON_RACE}"
            )
            self._record(self.env.now, rt.rank, "collision", group.name)

    def _collision(self, meeting: Meeting, rt: RankRuntime, group: Group, op: Op) -> Meeting:
        """A second bootstrap under a name already used: a meeting that can never complete, explained."""
        first = next(iter(meeting.arrivals.values()))
        stuck = self._open(("collision", *meeting.key, rt.rank), "bootstrap", group.name, 0, group.ranks)
        stuck.problem = (
            f"store key collision under group name {group.name!r}: ranks {list(meeting.arrivals)} already "
            f"bootstrapped ranks {list(first.payload)} under that name; rank {rt.rank} waits for a peer "
            f"that will never come"
        )
        if len(first.payload) == 1:
            stuck.problem += f"; {SINGLETON_RACE}"
        return stuck

    def _new_comm_id(self) -> int:
        comm_id = self._next_comm_id
        self._next_comm_id += 1
        return comm_id

    def _comm_id_for(self, meeting: Meeting) -> int:
        """The identity every member of a completed bootstrap shares (its ncclUniqueId)."""
        cid = self._meeting_ids.get(id(meeting))
        if cid is None:
            cid = self._new_comm_id()
            self._meeting_ids[id(meeting)] = cid
        return cid

    # ------------------------------------------------------------------ splits

    def _split_meeting(self, parent: Comm) -> Meeting:
        """The next op in the parent communicator's sequence: splits and collectives share it, as in NCCL."""
        parent.seq += 1
        assert parent.comm_id is not None
        members = self._comm_members[parent.comm_id]
        return self._open(("coll", parent.comm_id, parent.seq), "split", parent.group, parent.seq, members)

    def _nocolor_split(self, rt: RankRuntime, parent: Comm, op: Op) -> Waiting | None:
        """A non-member's ``perform_nocolor_split``: joins the parent's split without waiting (run-ahead).

        Run-ahead is limited to consecutive splits of one parent, so a pending split always completes before
        a later one on the same parent, and the rank's real position is its earliest incomplete split.
        """
        if rt.pending and rt.pending[-1][0].key[1] != parent.comm_id:
            return self._settled_nocolor_split(rt, parent, op)
        meeting = self._split_meeting(parent)
        self._arrive(meeting, rt, ("split", None), op, duration=self._split_s, run_ahead=True)
        if not (meeting.complete and meeting.completed_at <= self.env.now):
            rt.pending.append((meeting, rt.pc))
        return None

    def _settled_nocolor_split(self, rt: RankRuntime, parent: Comm, op: Op) -> Waiting:
        yield from self._settle(rt)
        self._nocolor_split(rt, parent, op)

    def _member_split(self, rt: RankRuntime, group: Group, comm: Comm, plan: CommPlan, op: Op) -> Waiting:
        parent = plan.split_from
        assert parent is not None
        if not lifecycle(parent.impl).communicates:
            comm.comm_id = self._new_comm_id()
            comm.state = CommState.READY
            return
        meeting = self._split_meeting(parent)
        self._arrive(meeting, rt, ("split", group.ranks), op, duration=self._split_s)
        yield from self._wait(rt, meeting, op)
        colors = self._split_colors(meeting)
        child = colors.get(group.ranks)
        if isinstance(child, Meeting):
            yield from self._wait(rt, child, op)  # never completes: an incomplete color
        assert isinstance(child, int)
        comm.comm_id = child
        self._comm_members[child] = group.ranks
        self._abort_if_cudamallocasync(rt, comm)
        comm.state = CommState.READY
        self._charge(rt, comm, lifecycle(comm.impl).init_charges(self._costs(rt), comm, rt.ctx.env), op, group)

    def _split_colors(self, meeting: Meeting) -> dict[tuple[int, ...], int | Meeting]:
        """Assign child communicators per color once; an incomplete color becomes a stuck meeting."""
        colors = self._split_results.get(id(meeting))
        if colors is not None:
            return colors
        colors = {}
        presenters: dict[tuple[int, ...], list[int]] = {}
        for rank in sorted(meeting.arrivals):
            color = meeting.arrivals[rank].payload[1]
            if color is not None:
                presenters.setdefault(color, []).append(rank)
        for color, ranks in presenters.items():
            if tuple(sorted(ranks)) == tuple(sorted(color)):
                colors[color] = self._new_comm_id()
            else:
                stuck = self._open(("color", *meeting.key, color), "split-color", meeting.group, meeting.seq, color)
                for r in ranks:
                    stuck.arrivals[r] = meeting.arrivals[r]
                elsewhere = [
                    f"rank {r} issued {meeting.arrivals[r].op.describe()}"
                    for r in color
                    if r in meeting.arrivals and r not in ranks
                ]
                stuck.problem = (
                    f"split {meeting.seq} of the parent communicator: ranks {ranks} asked for group {list(color)} "
                    f"but " + ("; ".join(elsewhere) or "its other members were not in this split")
                )
                colors[color] = stuck
        self._split_results[id(meeting)] = colors
        return colors

    # ------------------------------------------------------------------ collectives and p2p

    def _resolve(self, rt: RankRuntime, handle: str, op: Op) -> Group | int:
        try:
            target = rt.handles[handle]
        except KeyError:
            raise TorchError("NameError", f"group handle {handle!r} was never bound on rank {rt.rank}") from None
        if isinstance(target, Group) and target.destroyed:
            raise TorchError("ValueError", "Invalid process group specified")
        return target

    def _usable_comm(self, rt: RankRuntime, group: Group, op: Op) -> Comm:
        device_type = self._device_type
        comm = group.comm_for(device_type)
        if comm is None:
            raise TorchError("RuntimeError", f"No backend type associated with device type {device_type}")
        if device_type == "cuda" and comm.impl.is_nccl:
            current = self._current_device(rt)
            if comm.device is not None and comm.device != current:
                if comm.impl is Impl.LEGACY:
                    raise TorchError(
                        "ValueError",
                        f"Tensor found on device cuda:{current} but backend constrained to cuda:{comm.device}",
                    )
                raise TorchError(
                    "RuntimeError",
                    f"ProcessGroupNCCL is bound to device cuda:{comm.device} but an operation was "
                    f"issued on cuda:{current}",
                )
        return comm

    def _op_collective(self, rt: RankRuntime, op: Collective) -> Waiting:
        yield from self._settle(rt)
        target = self._resolve(rt, op.group, op)
        if not isinstance(target, Group):
            rt.warnings.append(f"Running {op.name} on global rank {rt.rank} which does not belong to the given group.")
            return
        comm = self._usable_comm(rt, target, op)
        life = lifecycle(comm.impl)
        if not comm.ready:
            yield from self._init_comm(rt, target, comm, op)
        if not life.communicates:
            return
        if comm.impl.is_nccl:
            self._touch(rt, comm.device, op)
        if not comm.connected:
            comm.connected = True
            self._charge(rt, comm, life.first_collective_charges(self._costs(rt), comm, rt.ctx.env), op, target)
        comm.seq += 1
        entry = self._fr_record(rt, target, comm, op.name, op.size_bytes, op.dtype, p2p=False)
        members = self._comm_members.setdefault(comm.comm_id, target.ranks)
        meeting = self._open(("coll", comm.comm_id, comm.seq), "collective", target.name, comm.seq, members)
        meeting.abort_on_mismatch = comm.impl is Impl.GLOO
        self._arrive(meeting, rt, (op.name, op.size_bytes, op.dtype), op, duration=self._collective_s)
        if meeting.abort_on_mismatch and isinstance(op, Broadcast) and len(members) > 2:
            yield from self._wait_tree(rt, meeting, op)
        else:
            yield from self._wait(rt, meeting, op)
        FlightRecorder.complete(entry, self.env.now)
        self._record(self.env.now, rt.rank, op.name, target.name, comm.seq)

    def _wait_tree(self, rt: RankRuntime, meeting: Meeting, op: Broadcast) -> Waiting:
        """A gloo broadcast is a binomial tree of sends and recvs, not one rendezvous: a member leaves as soon
        as its ancestors and children have joined (``broadcast_needs``), so the root and subtrees that do not
        depend on a missing rank complete, and only the ranks that wait on it hang. Each member waits on its own
        event; the meeting completing (everyone in) releases the rest at its end."""
        waits = self._tree_waits.setdefault(id(meeting), {})
        waits[rt.rank] = self.env.event()
        if meeting.problem is None:
            if meeting.complete:
                assert meeting.completed_at is not None
                release_at = meeting.completed_at
                ready = [r for r in sorted(waits) if r not in self._tree_released.setdefault(id(meeting), set())]
            else:
                release_at = self.env.now + self._collective_s(meeting)
                ready = self._tree_ready(meeting, waits)
            for rank in ready:
                self._tree_released[id(meeting)].add(rank)
                if not meeting.complete:
                    self._record(self.env.now, rank, "tree-release", meeting.key)
                event = waits[rank]
                self.env.timeout(release_at - self.env.now).callbacks.append(lambda _ev, e=event: _fire_once(e))
        yield from self._wait(rt, meeting, op, waits[rt.rank])

    def _tree_ready(self, meeting: Meeting, waits: Mapping[int, simpy.Event]) -> list[int]:
        """Members in the broadcast, not yet released, whose tree neighbours (``broadcast_needs``) are all in.
        O(members x log members) per arrival, and only while the broadcast is incomplete."""
        released = self._tree_released.setdefault(id(meeting), set())
        expected = meeting.expected
        position = {r: i for i, r in enumerate(expected)}
        src = getattr(next(iter(meeting.arrivals.values())).op, "src", 0)
        root = position.get(src, 0)
        ready = []
        for rank in sorted(waits):
            if rank in released:
                continue
            needs = broadcast_needs(position[rank], len(expected), root)
            if all(expected[i] in meeting.arrivals for i in needs):
                ready.append(rank)
        return ready

    def _fr_record(
        self, rt: RankRuntime, group: Group, comm: Comm, op: str, size_bytes: int, dtype: str, *, p2p: bool
    ) -> Entry | None:
        """What the flight recorder (hook or native) records at issue; fake records nothing (§E.1)."""
        if rt.fr is None or comm.impl not in RECORDING_IMPLS:
            return None
        trace = rt.fr.group(group.name, group.desc, group.ranks)
        return rt.fr.record(
            trace,
            comm.impl.cpp_name,
            op,
            numel=numel(size_bytes, dtype),
            dtype=dtype,
            p2p=p2p,
            time_s=self.env.now,
            timeout_s=group.timeout_s,
        )

    def _op_p2p(self, rt: RankRuntime, op: PointToPoint) -> Waiting:
        yield from self._settle(rt)
        target = self._resolve(rt, op.group, op)
        if not isinstance(target, Group):
            rt.warnings.append(f"Running {op.name} on global rank {rt.rank} which does not belong to the given group.")
            return
        if op.peer not in target.ranks or op.peer == rt.rank:
            raise TorchError("ValueError", f"Invalid peer rank {op.peer} for {op.name} in group {target.name!r}")
        comm = self._usable_comm(rt, target, op)
        life = lifecycle(comm.impl)
        if not life.communicates:
            return
        src, dst = (rt.rank, op.peer) if isinstance(op, Send) else (op.peer, rt.rank)
        if life.p2p_uses_pair_comm(comm, bound=target.bound_device is not None):
            channel = yield from self._pair_comm(rt, target, comm, op)
        else:
            if not comm.ready:
                yield from self._init_comm(rt, target, comm, op)
            if not comm.connected:
                comm.connected = True
                self._charge(rt, comm, life.first_collective_charges(self._costs(rt), comm, rt.ctx.env), op, target)
            channel = comm.comm_id
        n = comm.p2p_seq.get((src, dst), 0) + 1
        comm.p2p_seq[(src, dst)] = n
        label = f"send {src}->{dst}" if isinstance(op, Send) else f"recv {dst}<-{src}"
        entry = self._fr_record(rt, target, comm, label, op.size_bytes, op.dtype, p2p=True)
        meeting = self._open(("p2p", channel, src, dst, n), "p2p", target.name, n, (src, dst))
        self._arrive(meeting, rt, ("p2p", op.size_bytes, op.dtype), op, duration=self._p2p_s)
        yield from self._wait(rt, meeting, op)
        FlightRecorder.complete(entry, self.env.now)
        self._record(self.env.now, rt.rank, op.name, target.name, src, dst, n)

    def _pair_comm(self, rt: RankRuntime, group: Group, comm: Comm, op: PointToPoint) -> Generator[Any, Any, int]:
        """A lazily created 2-rank communicator for one peer: a rendezvous with that peer, then its memory."""
        peer = op.peer
        existing = comm.pair_comms.get(peer)
        if existing is not None:
            return existing
        lo, hi = sorted((rt.rank, peer))
        attempt = self._pair_attempts.get((group.name, lo, hi, rt.rank), 0)
        self._pair_attempts[(group.name, lo, hi, rt.rank)] = attempt + 1
        if comm.device is None:
            comm.device = self._current_device(rt)
        key = ("pair", group.name, lo, hi, attempt)
        meeting = self._open(key, "bootstrap", f"{group.name}/p2p-{lo}-{hi}-{attempt}", 0, (lo, hi))
        self._arrive(meeting, rt, (lo, hi), op, duration=self._bootstrap_s)
        yield from self._wait(rt, meeting, op)
        pair_id = self._comm_id_for(meeting)
        comm.pair_comms[peer] = pair_id
        pair = Comm(
            impl=comm.impl,
            group=f"{group.name}/p2p-{lo}-{hi}",
            size=2,
            device=comm.device,
            state=CommState.READY,
            comm_id=pair_id,
        )
        self._charge(rt, pair, lifecycle(comm.impl).pair_charges(self._costs(rt)), op, group)
        return pair_id

    # ------------------------------------------------------------------ teardown

    def _op_destroy(self, rt: RankRuntime, op: DestroyProcessGroup) -> Waiting:
        yield from self._settle(rt)
        if op.group == WORLD:
            groups = list(rt.groups)
            if self._gloo_used and rt.world is not None:
                # gloo has no shutdown: a ProcessGroupGloo closes its sockets when freed. torch drops its last
                # reference to the default group here; subgroups live on in the program's handles (frameworks
                # keep them in globals, and so does real.driver), so peers waiting on those keep waiting.
                self._close_gloo(rt, list(rt.world.comms.values()))
            rt.world = None
            rt.handles.clear()
            rt.counter = 1
        else:
            target = self._resolve(rt, op.group, op)
            if not isinstance(target, Group):
                return
            groups = [target]
        for group in sorted(groups, key=lambda g: g.name, reverse=True):
            group.destroyed = True
            for comm in {id(c): c for c in group.comms.values()}.values():
                comm.state = CommState.DESTROYED
                if comm.device is not None:
                    ledger = self._ledger(rt, comm.device)
                    for owner in [
                        o
                        for o in ledger.by_owner
                        if o.rank == rt.rank
                        and o.kind == "comm"
                        and (o.group == comm.group or o.group.startswith(comm.group + "/p2p-"))
                    ]:
                        ledger.release_owner(owner, time_s=self.env.now, op=op)
        self._record(self.env.now, rt.rank, "destroy", op.group)

    def _close_gloo(self, rt: RankRuntime, comms: Sequence[Comm]) -> None:
        """``rt`` closes its sockets on these gloo communicators (destroyed, or the process died): each member
        blocked in an operation that talks to ``rt`` directly fails at once with 'Connection closed by peer';
        members whose algorithm only waits on ``rt`` through others keep waiting (``backends/gloo.py``)."""
        for comm in comms:
            if comm.impl is not Impl.GLOO or comm.comm_id is None:
                continue
            closed = self._gloo_closed.setdefault(comm.comm_id, set())
            if rt.rank in closed:
                continue
            closed.add(rt.rank)  # not traced: only what it does to a waiting peer is (a closed idle socket is not)
            for member in self._comm_members.get(comm.comm_id, ()):
                other = self.ranks[member]
                if other is rt or other.status != "blocked" or other.block is None or other.timed_out:
                    continue
                if member in self._peer_lost:
                    continue
                peer = self._closed_peer(member, other.block.meeting)
                if peer is not None:
                    self._peer_lost.add(member)
                    self._record(self._now(), member, "peer-closed", peer, comm.group)
                    message = PEER_CLOSED.format(peer=peer)
                    cause = TimeoutAction("raise", False, 0.0, "RuntimeError", message, False, kind="peer-lost")
                    self._procs[member].interrupt(cause)

    def _closed_peer(self, rank: int, meeting: Meeting) -> int | None:
        """A peer ``rank``'s part of this gloo operation reads or writes directly that has closed its sockets
        and is not in the operation itself (None: none, or not a gloo collective/send/recv)."""
        if meeting.kind not in ("collective", "p2p") or meeting.key[0] not in ("coll", "p2p"):
            return None
        closed = self._gloo_closed.get(meeting.key[1])
        arrival = meeting.arrivals.get(rank)
        if not closed or arrival is None:
            return None
        expected = meeting.expected
        if meeting.kind == "p2p":
            peers: Sequence[int] = [r for r in expected if r != rank]
        else:
            op = arrival.op
            src = getattr(op, "src", None)
            root = expected.index(src) if src in expected else 0
            peers = [expected[i] for i in direct_peers(op.name, expected.index(rank), len(expected), root)]
        return next((p for p in peers if p in closed and p not in meeting.arrivals), None)

    # ------------------------------------------------------------------ policies

    def _costs(self, rt: RankRuntime) -> CommCosts:
        """Profile costs under this process's environment (a policy may set NCCL_MAX_NCHANNELS)."""
        channels = rt.ctx.env.get(MAX_NCHANNELS_ENV)
        costs = self._costs_by_channels.get(channels)
        if costs is None:
            costs = self._costs_by_channels[channels] = self.profile.costs_for_env(rt.ctx.env)
        return costs

    def _policy_init(self, rt: RankRuntime, op: InitProcessGroup) -> InitProcessGroup:
        plan = self.policy.on_init(
            InitRequest(
                rt.rank, rt.ctx.world_size, self.release.key, rt.ctx.env, op.backend, op.device_id, op.pg_options
            )
        )
        if plan.env:
            rt.ctx = replace(rt.ctx, env={**rt.ctx.env, **plan.env})
        if rt.rank == 0:
            self.explanations.append(
                {
                    "call": "init_process_group",
                    "ranks": "all",
                    "plan": _init_text(plan),
                    "explanation": plan.explanation or "as requested",
                }
            )
        if plan.backend is op.backend and plan.device_id is op.device_id and plan.pg_options is op.pg_options:
            return op  # the plan passes every argument through: a copy would be equal to the op
        return replace(op, backend=plan.backend, device_id=plan.device_id, pg_options=plan.pg_options)

    def _group_request(
        self,
        rt: RankRuntime,
        op: NewGroup | SplitGroup,
        members: tuple[int, ...],
        backend: str | None = None,
        history: History | None = None,
    ) -> GroupRequest:
        """What the process knows; the backend is named as torch resolves it (the default group's if none).
        ``history`` stands in for the rank's own (a cohort decides on the history its ranks share)."""
        assert rt.world is not None
        return GroupRequest(
            kind=op.name,
            ranks=members,
            rank=rt.rank,
            world_size=rt.ctx.world_size,
            release=self.release.key,
            env=rt.ctx.env,
            backend=backend or getattr(op, "backend", None) or rt.world.backend.requested,
            pg_options=op.pg_options,
            use_local_synchronization=getattr(op, "use_local_synchronization", False),
            purpose=op.purpose,
            traffic=op.traffic,
            history=history if history is not None else self._history(rt),
            eager_group_mib=self._costs(rt).eager_group_mib(connect_at_init=not runtime_connect(rt.ctx.env)),
        )

    def _policy_group(self, rt: RankRuntime, op: NewGroup) -> NewGroup | None:
        """Ask the policy; check members agree; return the op torch really receives (None: reuse)."""
        members = self._members(op)
        if not isinstance(members, Members):
            return op  # invalid ranks: torch raises before any policy could matter
        if op.use_local_synchronization and rt.rank not in members.index:
            return op  # returns before anything a policy could change (l.7206)
        node = self._hnode(rt) if self._shared_steps else None
        op_key = self._op_key(rt.program, op) if node is not None else 0
        step = node.steps.get(op_key) if node is not None else None
        if step is not None:
            # Decided (and checked: the step's first caller ran _check_consistent) on an equal history.
            rt.history_tail.append(step)
            rt.hnode = step.after
            return self._effective_op(rt, op, members, step.decision, step.effective)
        request = self._group_request(rt, op, members.ranks)
        decision = decide_group(self.policy, request)
        self._check_consistent(rt, request, decision)
        history = self._own_history(rt)
        history.record(request, decision)
        effective = None if decision.reuse is not None else _rewritten(op, decision)
        if node is not None:
            after = self._hnode(rt)
            after.snapshot = history
            node.steps[op_key] = _Step(op, request, decision, effective, after)
        return self._effective_op(rt, op, members, decision, effective)

    def _policy_split(self, rt: RankRuntime, op: SplitGroup, parent: Group) -> SplitGroup | None:
        """``decide_split`` for every split of the call (all recorded, as ``apply`` does); this rank applies
        its own split's decision (or the first split's, when it is in none)."""
        splits = [tuple(parent.ranks[r] for r in split if 0 <= r < parent.size) for split in op.split_ranks]
        if not splits or any(len(s) != len(raw) or not s for s, raw in zip(splits, op.split_ranks, strict=True)):
            return op  # invalid: torch raises its own error
        parent_backend = parent.backend.requested
        requests = [self._group_request(rt, op, split, parent_backend) for split in splits]
        decisions = decide_split(self.policy, requests)
        own = next((i for i, split in enumerate(splits) if rt.rank in split), 0)
        self._check_consistent(rt, requests[own], decisions[own])
        history = self._own_history(rt)
        for request, decision in zip(requests, decisions, strict=True):
            history.record(request, decision)
        mine = decisions[own]
        if mine.reuse is not None:
            if op.bind and rt.rank in splits[own]:
                existing = self._identical_group(rt, splits[own], parent_backend, mine.pg_options)
                if existing is not None:
                    rt.handles[op.bind] = existing
            elif op.bind:
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            return None
        return replace(op, pg_options=mine.pg_options)

    def _own_history(self, rt: RankRuntime) -> History:
        """The rank's history, its own to record into (its shared state, if tracked, is left behind)."""
        self._history(rt)
        if rt.history_shared:
            rt.history = rt.history.copy()
            rt.history_shared = False
        rt.hnode = None
        return rt.history

    def _check_consistent(self, rt: RankRuntime, request: GroupRequest, decision: GroupDecision) -> None:
        """Every caller of one group-creation call must reach the same plan, or real torch hangs or crashes."""
        key = (request.history.calls, request.ranks)
        seen = self._decisions.get(key)
        if seen is None:
            self._decisions[key] = (rt.rank, decision)
            if request.member and request.ranks[0] == rt.rank:
                self.explanations.append(
                    {
                        "call": f"new_group #{request.history.calls + 1}",
                        "ranks": list(request.ranks),
                        "plan": decision.describe(),
                        "explanation": decision.explanation,
                    }
                )
            return
        other, first = seen
        if first.key() != decision.key():
            raise TorchError(
                "PolicyInconsistency",
                f"policy {self.policy.name!r} planned differently for group {list(request.ranks)} "
                f"(group-creation call #{request.history.calls + 1}): rank {other}: {first.describe()} "
                f"({first.explanation}); rank {rt.rank}: {decision.describe()} ({decision.explanation})",
            )

    def _identical_group(
        self, rt: RankRuntime, ranks: tuple[int, ...], backend: str | None, options: PgOptions
    ) -> Group | None:
        """The group this rank created earlier with the same ranks, backend name and options (dedupe's key)."""
        assert rt.world is not None
        name = (backend or rt.world.backend.requested).lower()
        for group in rt.groups:
            same = group.ranks == ranks and group.backend.requested == name and group.options == options
            if same and not group.destroyed:
                return group
        return None

    def _effective_op(
        self,
        rt: RankRuntime,
        op: NewGroup,
        members: Members,
        decision: GroupDecision,
        rewritten: NewGroup | None = None,
    ) -> NewGroup | None:
        """The op torch receives (None: reuse, with the handle bound here); ``rewritten`` is
        ``_rewritten(op, decision)`` when the caller has it already."""
        if decision.reuse is not None:
            if rt.rank in members.index and op.bind:
                existing = self._identical_group(rt, members.ranks, decision.backend, decision.pg_options)
                if existing is not None:
                    rt.handles[op.bind] = existing
            elif op.bind:
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            return None
        return rewritten if rewritten is not None else _rewritten(op, decision)

    # ------------------------------------------------------------------ outsiders (DESIGN rule 8)

    def _outsider_calls(self, rt: RankRuntime) -> bool:
        """Take, in place, the run of ``new_group`` calls at ``rt.pc`` this rank makes as an outsider that
        needs nothing: not a member, no NOCOLOR split, no error, no injected fault, no cohort waiting for it.

        Why: a large startup is mostly such calls (Megatron TP8·PP4·DP16: ~2,900 per rank, ~20 of them
        memberships), and where the default group is lazy or unbound (legacy, lazy-init) or the group's backend
        is not the default group's (gloo twins, a policy's fake singletons) no cohort can take them. Their whole
        effect is the group counter, a NON_GROUP_MEMBER handle and, under a policy, one history record, so they
        are applied here without planning: the outsider plan once per ``outsider_key`` and call, the policy's
        decision once per shared history state and call (``_HistoryNode``), the record appended to the rank's
        ``history_tail``. The ordinary path records no trace event and never waits for such a call, so the trace
        and the order in which ranks run are unchanged. Each call taken counts for the guard as it would there.
        Returns whether any call was taken.
        """
        world = rt.world
        policy = self._policy_active
        if world is None or rt.pending or (policy and not self._shared_steps):
            return False
        table = self._outsider_table(rt.program)
        rank = rt.rank
        pc = start = rt.pc
        cohorts = self._cohorts if rt.program is self._shared_program else None
        op_faults = self._op_faults
        node = None
        verdicts: dict[int, int | None] | None = None
        keep = self._outsider_ops
        setdefault = rt.handles.setdefault
        append = rt.history_tail.append
        work = self._work
        taken = counter = 0
        end = len(table)
        while pc < end:
            entry = table[pc]
            if entry is None or (op_faults and (rank, pc) in op_faults):
                break
            op_id, index, bind, op = entry
            if rank in index:
                break
            if cohorts is not None:
                cohort = cohorts.get(pc)
                if cohort is None or not cohort.broken:
                    break  # the first rank here decides whether a block starts; a live cohort is joined
            step = None
            effective_id = op_id
            if policy:
                if node is None:
                    node = self._hnode(rt)
                step = node.steps.get(op_id)
                if step is None:
                    break  # nobody decided this call on this history yet: the ordinary path decides it
                effective_id = step.effective_id
            advance = 0
            if effective_id:  # 0: the policy reuses an identical group, no torch call at all
                if verdicts is None:
                    verdicts = self._outsider_verdicts(rt, world)
                advance = verdicts.get(effective_id, -1)
                if advance == -1:
                    effective = op if step is None else step.effective
                    assert effective is not None
                    advance = verdicts[effective_id] = self._outsider_advance(rt, world, effective)
                    keep.append(effective)  # ids stay valid while the verdict is kept
                if advance is None:
                    break
            taken += 1
            work += 1
            if work & 0xFFFF == 0:  # the guard's check, at the same count as on the ordinary path
                self._work, self._ops, rt.pc, rt.counter = work, self._ops + taken, pc, rt.counter + counter
                taken = counter = 0
                self._check_limits()
            if step is not None:
                append(step)
                node = step.after
            counter += advance
            if bind:
                setdefault(bind, NON_GROUP_MEMBER)
            pc += 1
        self._work = work
        self._ops += taken
        rt.counter += counter
        rt.pc = pc
        if node is not None:
            rt.hnode = node
        return pc > start

    def _outsider_table(self, program: Program) -> list[_OutsiderEntry | None]:
        """Per op of a program: (key, member index, bind, op) where a rank outside the group might take it as
        an outsider call (a world-wide ``new_group`` with a valid rank list), else None. Built once per Program.

        The key is the id of one canonical op per value: generators share op objects between ranks, but
        programs built per rank (captured ones) have equal, distinct ops, and decisions and outsider plans must
        be shared between those too (else every rank would decide, and leave a step, on its own)."""
        cached = self._outsider_tables.get(id(program))
        if cached is not None and cached[0] is program:
            return cached[1]
        table: list[_OutsiderEntry | None] = []
        canonical = self._canonical_ops
        keys = self._op_keys
        for op in program.ops:
            entry = None
            if type(op) is NewGroup:
                same = canonical.setdefault(op, op)
                keys[id(op)] = id(same)
                members = self._members(op)
                if not op.use_local_synchronization and isinstance(members, Members):
                    entry = (id(same), members.index, op.bind, same)
            table.append(entry)
        self._outsider_tables[id(program)] = (program, table)
        return table

    def _op_key(self, program: Program, op: NewGroup) -> int:
        """The shared key of one of ``program``'s ``new_group`` ops (see ``_outsider_table``)."""
        key = self._op_keys.get(id(op))
        if key is None:
            self._outsider_table(program)
            key = self._op_keys[id(op)]
        return key

    def _outsider_verdicts(self, rt: RankRuntime, world: Group) -> dict[int, int | None]:
        """The outsider plans shared by every rank with this rank's ``outsider_key``; remembered per rank for
        as long as its context, default group and that group's cuda communicator (and its state) stay the same."""
        parent = world.comm_for("cuda")
        state = None if parent is None else parent.state
        cached = rt.outsider_verdicts
        if cached is not None and cached[:4] == (rt.ctx, world, parent, state):  # compared by identity first
            return cached[4]
        verdicts = self._outsiders.setdefault(outsider_key(rt.ctx, world), {})
        rt.outsider_verdicts = (rt.ctx, world, parent, state, verdicts)
        return verdicts

    def _outsider_advance(self, rt: RankRuntime, world: Group, op: NewGroup) -> int | None:
        """How far an outsider's plain call advances the counter; None when it is not plain (it raises, or
        joins a NOCOLOR split): the ordinary path then runs it on every rank."""
        try:
            plan = self._plan_new_group(rt, op, rt.counter)
        except (TorchError, ValueError):
            return None
        if plan.member or plan.nocolor_split_on is not None:
            return None
        return plan.counter_advance

    def _policy_class(self, rt: RankRuntime) -> tuple[Any, ...]:
        """What a rank-independent policy may decide on besides the call and the history: the environment
        (less the rank's own LOCAL_RANK and RANK) and the default group's backend name. Ranks of one class
        with equal histories share decisions; one canonical tuple per class, so nodes compare by identity."""
        cached = rt.policy_class
        if cached is not None and cached[0] is rt.ctx and cached[1] is rt.world:
            return cached[2]
        env = tuple(sorted((k, v) for k, v in rt.ctx.env.items() if k not in _RANK_ENV))
        cls = (rt.world.backend.requested if rt.world is not None else None, env)
        cls = self._classes.setdefault(cls, cls)
        rt.policy_class = (rt.ctx, rt.world, cls)
        return cls

    def _hnode(self, rt: RankRuntime) -> _HistoryNode:
        """The shared state this rank's history is in (found by class, call count and digest)."""
        cls = self._policy_class(rt)
        node = rt.hnode
        if node is not None and node.cls is cls:
            return node
        history = self._history(rt)
        key = (cls, history.calls, history.digest)
        node = self._hnodes.get(key)
        if node is None:
            node = self._hnodes[key] = _HistoryNode(cls, history.calls, history.digest, snapshot=history)
        rt.hnode = node
        return node

    def _history(self, rt: RankRuntime) -> History:
        """The rank's real history: its pending tail of shared records applied (or, for a long tail, a copy of
        a history known to be in the same state: the rank that first decided there)."""
        tail = rt.history_tail
        if tail:
            target = tail[-1].after
            snap = target.snapshot
            if (
                len(tail) > _REPLAY_MAX
                and snap is not None
                and snap.calls == target.calls
                and snap.digest == target.digest
            ):
                rt.history = snap.copy()
            else:
                history = rt.history.copy() if rt.history_shared else rt.history
                for step in tail:
                    history.record(step.request, step.decision)
                rt.history = history
            rt.history_shared = False
            tail.clear()
        return rt.history

    def history_of(self, rank: int) -> History:
        """The group-creation history ``rank`` has recorded so far (what its policy decides on)."""
        return self._history(self.ranks[rank])

    def _history_state(self, rt: RankRuntime) -> tuple[int, int]:
        """(calls, digest) of the rank's real history, without applying its tail."""
        if rt.history_tail:
            node = rt.history_tail[-1].after
            return node.calls, node.digest
        return rt.history.calls, rt.history.digest

    # ------------------------------------------------------------------ cohorts (DESIGN rule 8)

    def _cohort(self, rt: RankRuntime) -> Waiting:
        """Run a block of world-wide group-creation calls for every rank at once.

        Precondition (checked): every rank runs this same Program object and arrives at the same pc with the
        same group counter and nothing pending. Then each ``new_group``/``split_group`` of the block is, for
        every rank, either a split of the bound default group (members split, everyone else NOCOLOR, all
        leave together after ``split_s``) or a purely local lazy creation. The block is applied in one pass:
        per-member work for members, a constant for everyone else — the same outcome as running each rank
        through each call, without calls x world work. Anything else (a fresh eager bootstrap, an error in
        planning, a rank that is not eligible) ends the block, and ranks continue one by one from there.
        """
        yield from self._settle(rt)
        start = rt.pc
        cohort = self._cohorts.get(start)
        if cohort is None:
            world_seq = rt.world.comm_for("cuda").seq if rt.world and rt.world.comm_for("cuda") else 0
            meeting = self.meetings.open(("cohort", start), "split", "0", world_seq + 1, self._world_ranks)
            meeting.result = self.env.event()
            cohort = Cohort(start=start, counter=rt.counter, meeting=meeting, history=self._history(rt))
            self._cohorts[start] = cohort
            if not self._opens_with_world_split(rt, rt.program.ops[start]):
                # Waiting for every rank is only right when the first call is itself world-wide (a split of
                # the bound default group); a local or members-only creation must not synchronise anyone.
                cohort.broken = True
        if cohort.broken or not self._cohort_eligible(rt, cohort):
            self._break_cohort(cohort)
            yield from self._one_call(rt)
            return
        op = rt.program.ops[start]
        cohort.meeting.arrivals[rt.rank] = Arrival(rt.rank, self.env.now, ("split", None), op)
        if len(cohort.meeting.arrivals) == len(self._world_ranks):
            self._apply_block(cohort)
        yield from self._wait(rt, cohort.meeting, op)
        if cohort.broken:
            yield from self._one_call(rt)
            return
        self._resume_from_block(rt, cohort)

    def _opens_with_world_split(self, rt: RankRuntime, op: Op) -> bool:
        """Whether this call is, for this rank, a split of the default group (which every rank joins)."""
        if rt.world is None or rt.pending:
            return False
        if isinstance(op, SplitGroup):
            parent = rt.world.comm_for("cuda")
            if parent is None or not parent.ready:
                return False
            life = lifecycle(parent.impl)
            return life.communicates and life.split_is_collective  # gloo's split is a members-only bootstrap
        assert isinstance(op, NewGroup)
        if split_source(self.release, rt.world, rt.world.backend, NO_OPTIONS) is None:
            # The default group can't be split by any call (unbound, lazy, not ready): nothing this call could
            # decide or plan makes it a split, so skip deciding and planning it twice (the call runs next).
            return False
        if self._policy_active:
            members = self._members(op)
            if not isinstance(members, Members):
                return False
            decision = decide_group(self.policy, self._group_request(rt, op, members.ranks))
            if decision.reuse is not None:
                return False
            op = self._effective_op(rt, op, members, decision) or op
        try:
            plan = self._plan_new_group(rt, op, rt.counter)
        except TorchError:
            return False
        return plan.nocolor_split_on is not None or any(c.split_from is not None for c in plan.comms)

    def _one_call(self, rt: RankRuntime) -> Waiting:
        """The ordinary path for the op at pc, used when a cohort can't take it."""
        op = rt.program.ops[rt.pc]
        handler = self._op_new_group if isinstance(op, NewGroup) else self._op_split_group
        work = handler(rt, op)
        if work is not None:
            yield from work
        rt.pc += 1

    def _cohort_eligible(self, rt: RankRuntime, cohort: Cohort) -> bool:
        world = rt.world
        if world is None or rt.pending or rt.counter != cohort.counter:
            return False
        if self._policy_active:
            history = cohort.history
            assert history is not None
            calls, digest = self._history_state(rt)
            same = (rt.history is history and not rt.history_tail) or (
                calls == history.calls and digest == history.digest
            )
            if not same or not self._policy_verified:
                return False
        # A lazy (unbound) default group is fine: its new_groups are local lazy creations, which a block takes;
        # _block_plans stops the block at anything it cannot take (an eager fresh bootstrap).
        return True

    def _break_cohort(self, cohort: Cohort) -> None:
        if cohort.broken:
            return
        cohort.broken = True
        if not cohort.meeting.complete:
            cohort.meeting.completed_at = self.env.now
            cohort.meeting.result.succeed()

    def _apply_block(self, cohort: Cohort) -> None:
        """The leader's pass over the block: plan once per op, act per member, advance time per split."""
        program = self._shared_program
        assert program is not None
        ops = program.ops
        ranks = self.ranks
        clock = self.env.now
        counter = cohort.counter
        pc = cohort.start
        executed = splits = 0
        binds: set[str] = set()
        failed = False
        while pc < len(ops) and _starts_block(ops[pc]) and not failed:
            op = ops[pc]
            decided: tuple[GroupRequest, GroupDecision] | None = None
            if self._policy_active and isinstance(op, NewGroup):
                effective, decision, request = self._block_policy(cohort, op)
                if effective is None:  # reused by every caller: no torch call, no counter, no split
                    assert cohort.history is not None and request is not None
                    cohort.history.record(request, decision)
                    self._block_reuse(op, decision)
                    if op.bind:
                        binds.add(op.bind)
                    executed += 1
                    pc += 1
                    continue
                op = effective
                decided = (request, decision) if request is not None else None
            plans = self._block_plans(op, counter)
            if plans is None:
                break  # nothing recorded: the ranks decide this call again, one by one
            if decided is not None:
                assert cohort.history is not None
                cohort.history.record(*decided)
            is_split = any(
                p.nocolor_split_on is not None or any(c.split_from is not None for c in p.comms) for p in plans.values()
            )
            if is_split:
                clock += self.profile.timing.split_s
            self._clock = clock
            child_id = self._new_comm_id() if is_split else None
            for rank, plan in plans.items():
                if not plan.member:
                    continue
                rt = ranks[rank]
                rt.pc = pc
                try:
                    self._apply_member_plan(rt, plan, op, child_id)
                except (TorchError, SimulatedOOM) as err:
                    cohort.failures[rank] = (pc, err)  # re-raised in that rank's own process
                    failed = True
            self._clock = None
            self._record(clock, "cohort", pc, op.name, len(plans))
            self._work += len(plans) + 1
            self._check_limits()
            if getattr(op, "bind", None):
                binds.add(op.bind)
            counter += 1
            executed += 1
            splits += int(is_split)
            pc += 1
        self._ops += max(executed - 1, 0) * len(ranks)  # each rank's guard already counted the block's first op
        cohort.end = pc
        cohort.counter_end = counter
        cohort.executed = executed
        cohort.splits = splits
        cohort.binds = tuple(sorted(binds))
        if executed == 0:
            self._break_cohort(cohort)
            return
        cohort.meeting.completed_at = clock
        self._record(clock, "meet", "cohort", cohort.meeting.key, executed)
        event = cohort.meeting.result
        self.env.timeout(clock - self.env.now).callbacks.append(lambda _ev: event.succeed())

    def _block_policy(self, cohort: Cohort, op: NewGroup) -> tuple[NewGroup | None, GroupDecision, GroupRequest | None]:
        """A rank-independent policy decides once for the whole block, on the history all ranks share.
        Recording is the caller's, once it knows the block takes the op."""
        members = self._members(op)
        if not isinstance(members, Members):
            return op, unchanged_decision(op), None
        rt = self.ranks[members.ranks[0]]
        assert cohort.history is not None
        request = self._group_request(rt, op, members.ranks, history=cohort.history)
        decision = decide_group(self.policy, request)
        self._check_consistent(rt, request, decision)
        if decision.reuse is not None:
            return None, decision, request
        return self._effective_op(rt, op, members, decision), decision, request

    def _block_reuse(self, op: NewGroup, decision: GroupDecision) -> None:
        members = self._members(op)
        assert isinstance(members, Members)
        if not op.bind:
            return
        for rank in members.ranks:
            rt = self.ranks[rank]
            existing = self._identical_group(rt, members.ranks, decision.backend, decision.pg_options)
            if existing is not None:
                rt.handles[op.bind] = existing

    def _block_plans(self, op: Op, counter: int) -> dict[int, GroupPlan] | None:
        """Every rank's plan that matters for this op, or None when the op can't be taken as a block.

        For ``new_group`` non-members are uniform (a NOCOLOR split, or nothing), so only members are planned;
        ``split_group`` (rare) is planned for every rank since each validates its own split.
        """
        ranks = self.ranks
        try:
            if isinstance(op, NewGroup):
                probe = self._plan_new_group(ranks[0], op, counter)
                members = probe.ranks
                plans = {0: probe}
                for rank in members:
                    if rank != 0:
                        plans[rank] = self._plan_new_group(ranks[rank], op, counter)
            else:
                assert isinstance(op, SplitGroup)
                if op.parent != WORLD or self._policy_active:
                    return None  # policies decide splits per call on each rank's own history
                plans = {}
                for rt in ranks:
                    assert rt.world is not None
                    plans[rt.rank] = plan_split_group(
                        self.release,
                        rt.ctx,
                        counter,
                        rt.world,
                        op.split_ranks,
                        op.pg_options,
                        op.group_desc,
                        op.timeout_s,
                    )
        except TorchError:
            return None
        for plan in plans.values():
            if any(c.eager and c.split_from is None for c in plan.comms):
                return None  # a fresh bootstrap: members-only meeting, not a world-wide step
        return plans

    def _plan_new_group(self, rt: RankRuntime, op: NewGroup, counter: int) -> GroupPlan:
        assert rt.world is not None
        return plan_new_group(
            self.release,
            rt.ctx,
            rt.world,
            counter,
            self._members(op),
            op.backend,
            op.pg_options,
            op.use_local_synchronization,
            op.group_desc,
            op.device_id,
            op.timeout_s,
        )

    def _apply_member_plan(
        self, rt: RankRuntime, plan: GroupPlan, op: NewGroup | SplitGroup, child_id: int | None
    ) -> None:
        group = self._group_from_plan(rt, plan)
        if op.bind:
            rt.handles[op.bind] = group
        self._record(self._now(), rt.rank, op.name, plan.name, _ranks_digest(plan.ranks))
        for comm_plan in plan.comms:
            comm = Comm(
                impl=comm_plan.pair.impl,
                group=group.name,
                size=group.size,
                device=comm_plan.device,
                lazy_init=comm_plan.lazy_init,
                via_split=comm_plan.split_from is not None,
                shared=comm_plan.shared,
            )
            for pair in plan.backend.pairs:
                if pair.name == comm_plan.pair.name:
                    group.comms[pair.device_type] = comm
            self._group_record(group, comm)
            if comm_plan.split_from is None:
                continue  # lazy: created at first use
            assert child_id is not None
            comm.comm_id = child_id
            self._comm_members[child_id] = group.ranks
            self._abort_if_cudamallocasync(rt, comm)
            comm.state = CommState.READY
            self._charge(rt, comm, lifecycle(comm.impl).init_charges(self._costs(rt), comm, rt.ctx.env), op, group)

    def _resume_from_block(self, rt: RankRuntime, cohort: Cohort) -> None:
        """Bring one rank's own state to the end of the block (counter, parent sequence, handles, history)."""
        rt.counter = cohort.counter_end
        if cohort.history is not None:
            rt.history = cohort.history  # equal content (checked on arrival): share one object again,
            rt.history_shared = True  # copied on this rank's next own record (the owner's too)
            rt.history_tail.clear()  # already in that content
            rt.hnode = None
        parent = rt.world.comm_for("cuda") if rt.world is not None else None
        if parent is not None:
            parent.seq += cohort.splits
        for bind in cohort.binds:
            rt.handles.setdefault(bind, NON_GROUP_MEMBER)
        failure = cohort.failures.get(rt.rank)
        if failure is not None:
            rt.pc, err = failure
            raise err
        rt.pc = cohort.end

    # ------------------------------------------------------------------ faults

    def _arm_faults(self) -> None:
        for fault in self.faults.runtime():
            validate(fault, self._programs)
            if fault.kind == "straggler":
                self._slow[fault.rank] = fault.factor
            elif fault.kind == "link-straggler":
                assert fault.peer is not None
                nodes = (self.cluster.node_of(fault.rank), self.cluster.node_of(fault.peer))
                self._slow_links.append(_SlowLink(fault, nodes))
            elif fault.kind == "oom-at-init":
                self._oom_at_init.add(fault.rank)
            elif fault.kind == "store-timeout":
                self._store_timeout.add((fault.rank, fault.at_op))
            elif fault.at_op is not None:
                self._op_faults[(fault.rank, fault.at_op)] = fault

    def _timed_fault(self, fault: Fault) -> Waiting:
        assert fault.at_s is not None
        yield self.env.timeout(fault.at_s)
        rt = self.ranks[fault.rank]
        if rt.status in ("done", "error", "aborted"):
            return
        self._record(self.env.now, rt.rank, "fault", fault.kind)
        if fault.kind in ("crash", "gpu-crash"):
            for victim in self._victims(rt, fault):
                self._procs[victim.rank].interrupt(_Crash(fault))
        elif fault.kind == "nccl-error":
            action = on_async_error(rt.ctx.env, rank=rt.rank)
            if action.dump:
                self._dump_all(self.env.now)
            if action.outcome != "hang":
                self._procs[rt.rank].interrupt(action)
        elif fault.kind in ("stall", "watchdog-stuck"):
            self._procs[rt.rank].interrupt(_Crash(fault, stall=True))

    def _victims(self, rt: RankRuntime, fault: Fault) -> list[RankRuntime]:
        """A GPU crash takes down every live process using that GPU."""
        if fault.kind != "gpu-crash":
            return [rt]
        device = rt.current_device if rt.current_device is not None else rt.ctx.local_rank
        return [
            other
            for other in self.ranks
            if other.node == rt.node
            and device in other.contexts | {other.current_device}
            and other.status not in ("done", "error", "aborted")
        ] or [rt]

    def _inject(self, rt: RankRuntime, fault: Fault) -> Waiting:
        """An op-indexed fault, before the op runs."""
        self._record(self.env.now, rt.rank, "fault", fault.kind, rt.pc)
        if fault.kind in ("crash", "gpu-crash"):
            for victim in self._victims(rt, fault):
                if victim is not rt:
                    self._procs[victim.rank].interrupt(_Crash(fault))
            raise _Crash(fault)
        if fault.kind in ("stall", "watchdog-stuck"):
            yield from self._stall(rt, fault)
        if fault.kind == "nccl-error":
            action = on_async_error(rt.ctx.env, rank=rt.rank)
            if action.dump:
                self._dump_all(self.env.now)
            if action.outcome == "hang":
                return
            if action.wait_s:
                yield self.env.timeout(action.wait_s)
            raise _AsyncError(action)

    def _stall(self, rt: RankRuntime, fault: Fault) -> Waiting:
        """The rank stops issuing ops but stays alive (it still answers a flight-recorder dump). A
        ``watchdog-stuck`` rank is stuck in a CUDA/NCCL call with its watchdog thread: its own collective
        timeouts never fire, and only legacy's heartbeat monitor can end it (``simnccl.watchdog``)."""
        op = rt.program.ops[min(rt.pc, len(rt.program.ops) - 1)]
        meeting = self._open(("stall", rt.rank), "stall", "", 0, ())
        if fault.kind == "watchdog-stuck":
            meeting.problem = (
                f"injected fault: {fault.describe()} — the process and its NCCL watchdog thread are stuck in a "
                "CUDA/NCCL call"
            )
            self._arm_monitor(rt, fault)
        else:
            meeting.problem = f"injected fault: {fault.describe()} — the rank stopped issuing ops"
        yield from self._wait(rt, meeting, op)

    def _arm_monitor(self, rt: RankRuntime, fault: Fault) -> None:
        """Start the stuck rank's heartbeat monitor clock, if its default group has one (legacy only)."""
        if rt.rank in self._stuck:
            return
        impl = self._world_impl(rt)
        action = None
        if impl is not None:
            start_s = self._monitor_start[rt.rank]
            action = on_watchdog_stuck(impl, rt.ctx.env, rank=rt.rank, monitor_start_s=start_s, stuck_at_s=self.env.now)
        self._stuck[rt.rank] = action
        self._record(self.env.now, rt.rank, "watchdog-stuck", None if action is None else action.detected_at_s)
        if action is not None:
            self._monitor_action[rt.rank] = action
            self.env.process(self._monitor(rt, action))

    def _world_impl(self, rt: RankRuntime) -> Impl | None:
        """The implementation behind this rank's live default group (whose watchdog the monitor watches)."""
        if rt.world is None or rt.world.destroyed or rt.rank not in self._monitor_start:
            return None
        comm = rt.world.comm_for(self._device_type)
        return None if comm is None else comm.impl

    def _monitor(self, rt: RankRuntime, action: MonitorAction) -> Waiting:
        """Legacy's heartbeat monitor acting on its process: detect, dump, wait a heartbeat, terminate. A dump
        signal may replace a later pending action with an earlier one; only the one pending acts."""
        yield self.env.timeout(max(action.detected_at_s - self.env.now, 0.0))
        if self._monitor_action.get(rt.rank) is not action or rt.status in ("done", "error", "aborted"):
            return
        if rt.status == "blocked" and rt.timeout_hang is None:  # a running process is not hung (yet)
            entry = self._hang_entry(rt, {r.rank: r for r in self.ranks})
            entry["detected_at_s"] = action.terminate_at_s
            entry["timeout_s"] = action.heartbeat_timeout_s
            entry["watchdog"] = action.message.splitlines()[0]
            entry["explanation"] += f"; heartbeat monitor: {action.message.splitlines()[-1]}"
            entry["monitor"] = {
                "reason": action.reason,
                "detected_at_s": action.detected_at_s,
                "terminate_at_s": action.terminate_at_s,
                "heartbeat_timeout_s": action.heartbeat_timeout_s,
            }
            rt.timeout_hang = entry
        self._record(self.env.now, rt.rank, "heartbeat", action.reason)
        if action.dump and rt.fr is not None and rt.fr.enabled and rt.rank not in self.fr_dumps:
            self.fr_dumps[rt.rank] = rt.fr.dump()  # this process only: the monitor signals nobody
            self._record(self.env.now, rt.rank, "fr-dump", len(rt.fr.entries))
        if action.terminate_at_s is None:
            return
        yield self.env.timeout(max(action.terminate_at_s - self.env.now, 0.0))
        if self._monitor_action.get(rt.rank) is action and rt.status not in ("done", "error", "aborted"):
            self._procs[rt.rank].interrupt(
                TimeoutAction("abort", False, 0.0, "SIGABRT", action.message, False, kind="heartbeat")
            )

    # ------------------------------------------------------------------ watchdogs (simulated time)

    def _run_with_watchdogs(self) -> None:
        """Run to the end, letting each blocked wait's timeout fire at its simulated deadline.

        No timer events are created: the run advances in steps no longer than the shortest group timeout, so
        a wait that starts inside a step cannot be due before the step ends; after each step the due
        watchdogs act. When nothing is scheduled the clock jumps straight to the next deadline; a stall with
        no deadline left (e.g. inside ncclCommSplit) ends the run as a hang.
        """
        while True:
            self._work += 1  # an iteration that made no progress must still reach the wall-clock guard
            if self._work & 0x3FF == 0:
                self._check_limits()
            due = self._due_timeouts()
            for at, rt, action in due:
                if at <= self.env.now:
                    self._fire(rt, action, at)
            due = [d for d in due if d[0] > self.env.now]
            next_deadline = due[0][0] if due else math.inf
            env = self.env
            if env.peek() == math.inf and next_deadline == math.inf:
                return
            horizon = self.config.limits.max_sim_time_s
            if min(env.peek(), next_deadline) > horizon:
                raise EngineGuardError(f"simulated time would pass Limits.max_sim_time_s = {horizon:g} s")
            # A wait starts at an event, so steps are measured from the next one: idle time is never walked
            # through in timeout-sized steps (a 1 ms timeout over hours of compute was billions of steps).
            step_end = min(next_deadline, max(env.now, env.peek()) + self._min_timeout_s, horizon)
            if env.peek() > step_end:
                # Nothing happens before then: move the clock to the step end. simpy places the event at
                # ``now + delay``, which rounding can put one ulp past ``step_end``; step to where it really
                # landed, or the loop would never reach it and schedule another one forever.
                env.timeout(step_end - env.now)
                step_end = max(step_end, env.peek())
            step = env.step
            while env.peek() <= step_end:
                step()

    def _due_timeouts(self) -> list[tuple[float, RankRuntime, TimeoutAction]]:
        due = []
        for rt in self.ranks:
            if rt.status != "blocked" or rt.timed_out or rt.block is None or rt.rank in self._peer_lost:
                continue
            block = rt.block
            group = self._group_named(rt, block.meeting.group)
            if group is None:
                continue
            comm = group.comm_for(self._device_type)
            if comm is None:
                continue
            op = block.op
            action = on_timeout(
                comm.impl,
                block.meeting.kind,
                rt.ctx.env,
                rank=rt.rank,
                seq=block.meeting.seq,
                op_name=op.name,
                numel=numel(getattr(op, "size_bytes", 4), getattr(op, "dtype", "Float")),
                timeout_s=group.timeout_s,
            )
            if action is not None:
                due.append((block.since_s + group.timeout_s, rt, action))
        due.sort(key=lambda item: (item[0], item[1].rank))
        return due

    def _group_named(self, rt: RankRuntime, name: str) -> Group | None:
        for group in reversed(rt.groups):
            if group.name == name:
                return group
        return None

    def _fire(self, rt: RankRuntime, action: TimeoutAction, at: float) -> None:
        rt.timed_out = True
        rt.unhealthy = rt.unhealthy or action.unhealthy
        entry = self._hang_entry(rt, {r.rank: r for r in self.ranks})
        entry["detected_at_s"] = at + action.wait_s
        entry["timeout_s"] = at - entry["since_s"]
        entry["watchdog"] = action.message.splitlines()[0] if action.message else entry["watchdog"]
        rt.timeout_hang = entry
        self._record(at, rt.rank, "timeout", action.outcome, entry["kind"], entry["seq"])
        if action.dump:
            self._dump_all(at)
        if action.outcome in ("abort", "raise"):
            self._procs[rt.rank].interrupt(action)

    def _dump_all(self, at: float) -> None:
        """The abort hook dumps on this rank and signals the others through the store: every live process
        writes its ``TORCH_FR_DUMP_TEMP_FILE<rank>``. A dead process writes nothing."""
        for rt in self.ranks:
            self._signal_monitor(rt, at)
            if rt.rank in self.fr_dumps or rt.fr is None or not rt.fr.enabled:
                continue
            if rt.status in ("running", "blocked"):
                self.fr_dumps[rt.rank] = rt.fr.dump()
                self._record(at, rt.rank, "fr-dump", len(rt.fr.entries))

    def _signal_monitor(self, rt: RankRuntime, at: float) -> None:
        """Legacy's monitor on the default group polls the store's dump key every second: once any rank's
        watchdog timed out (and set it), every live legacy process dumps, waits one heartbeat timeout and is
        terminated (torch's "collective timeout or exception" path) — a stalled or stuck process included,
        unless something ended it before."""
        impl = self._world_impl(rt) if rt.status in ("running", "blocked") else None
        if impl is not Impl.LEGACY:
            return
        source = rt.rank if rt.timed_out else min((r.rank for r in self.ranks if r.timed_out), default=-1)
        start_s = self._monitor_start[rt.rank]
        action = on_dump_signal(impl, rt.ctx.env, rank=rt.rank, monitor_start_s=start_s, signal_at_s=at, src=source)
        current = self._monitor_action.get(rt.rank)
        if action is not None and (current is None or action.detected_at_s < current.detected_at_s):
            self._monitor_action[rt.rank] = action
            self.env.process(self._monitor(rt, action))

    # ------------------------------------------------------------------ outcome

    def _outcome(self) -> RunOutcome:
        hangs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        by_rank = {rt.rank: rt for rt in self.ranks}
        for rt in self.ranks:
            if rt.status in ("error", "aborted") and rt.error is not None:
                errors.append(
                    {
                        "rank": rt.rank,
                        "kind": rt.error_kind,
                        "type": rt.error.type_name,
                        "message": rt.error.message,
                        "op": rt.error_op,
                        "time_s": rt.finished_at,
                    }
                )
        for rt in self.ranks:
            if rt.timeout_hang is not None:
                hangs.append(rt.timeout_hang)
            elif rt.status not in ("done", "error", "aborted"):
                hangs.append(self._hang_entry(rt, by_rank))
        if any(e["kind"] in ("error", "abort", "crash", "peer-lost") for e in errors):
            verdict = "error"
        elif any(e["kind"] in ("oom", "check") for e in errors):
            verdict = "fail"
        elif hangs:
            verdict = "hang"
        else:
            verdict = "pass"
        self._record("verdict", verdict)
        return RunOutcome(
            verdict=verdict,
            ranks=self.ranks,
            ledgers=self.ledgers,
            checkpoints=self.checkpoints,
            groups={(name, key.ranks): record for (name, key), record in self.group_records.items()},
            hangs=hangs,
            errors=errors,
            event_count=self._event_count,
            trace_hash=self._hasher.hexdigest(),
            end_time_s=self.env.now,
            ops_executed=self._ops,
            trace=self._trace,
            fr_dumps=self.fr_dumps,
            slowdowns=self._slowdowns(),
        )

    def _slowdowns(self) -> list[dict[str, Any]]:
        """What each straggler fault cost, so reports name the slow rank or link rather than those who waited."""
        out: list[dict[str, Any]] = []
        for rank, factor in sorted(self._slow.items()):
            out.append(
                {
                    "kind": "straggler",
                    "rank": rank,
                    "factor": factor,
                    "extra_s": self._slow_extra_s.get(rank, 0.0),
                }
            )
        for link in self._slow_links:
            out.append(
                {
                    "kind": "link-straggler",
                    "link": link.name,
                    "ranks": [link.fault.rank, link.fault.peer],
                    "factor": link.fault.factor,
                    "ops": link.ops,
                    "extra_s": link.extra_s,
                    "groups": list(link.groups),
                }
            )
        return out

    def _hang_entry(self, rt: RankRuntime, by_rank: dict[int, RankRuntime]) -> dict[str, Any]:
        block = rt.block
        stuck = next(((m, pc) for m, pc in rt.pending if not m.complete), None)
        if block is not None and stuck is not None and stuck[0] is not block.meeting:
            # Run-ahead splits that completed after the rank started waiting: it is really in the first open one.
            op = rt.program.ops[stuck[1]]
            block = Block(op, stuck[1], _handle_of(op), stuck[0], block.since_s)
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
        missing = list(meeting.missing())
        explanations = []
        if meeting.problem:
            explanations.append(meeting.problem)
        if not missing and meeting.completed_at is not None and meeting.completed_at > self.env.now:
            slow = [link.name for link in self._slow_links if self._spans(link, meeting.expected)]
            explanations.append(
                f"every member arrived; the operation itself runs until t={meeting.completed_at:.3f} s"
                + (f" over the slowed link {', '.join(slow)}" if slow else "")
            )
        for r in missing:
            other = by_rank[r]
            explanations.append(f"rank {r} {self._whereabouts(other)}")
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
            "explanation": "; ".join(explanations),
        }

    def _whereabouts(self, rt: RankRuntime) -> str:
        if rt.status == "done":
            return "finished its program without joining"
        if rt.status in ("error", "aborted") and rt.error is not None:
            return f"died: {rt.error.type_name}: {rt.error.message.splitlines()[0]}"
        if rt.block is not None and rt.block.meeting.kind == "stall":
            if rt.rank in self._stuck:
                return f"is stuck in a CUDA/NCCL call with its watchdog, before {rt.block.op.describe()}"
            return f"is stalled before {rt.block.op.describe()} (injected fault)"
        if rt.block is not None:
            m = rt.block.meeting
            where = f"group {m.group!r}" if m.group else "its parent communicator"
            return f"is blocked in {rt.block.op.describe()} ({m.kind} {m.seq} on {where})"
        return "is still running"

    def _timeout_for(self, rt: RankRuntime, meeting: Meeting) -> tuple[float | None, str]:
        group = rt.world
        for g in rt.groups:
            if g.name == meeting.group:
                group = g
        timeout = group.timeout_s if group is not None else None
        if meeting.kind == "stall":
            if rt.rank in self._stuck:
                return None, (
                    "its watchdog thread is stuck too, and no heartbeat monitor watches it "
                    "(only legacy ProcessGroupNCCL has one, unless TORCH_NCCL_BLOCKING_WAIT=1)"
                )
            return None, "a stalled process issues nothing that could time out"
        if meeting.kind in ("split", "split-color"):
            return (
                None,
                "ncclCommSplit blocks on the host with no timeout; only the job's own timeout ends it",
            )
        if meeting.kind == "bootstrap":
            return timeout, "the store wait for the NCCL unique id times out after the group's timeout"
        return timeout, "the watchdog aborts the collective after the group's timeout"


@dataclass(slots=True, eq=False)
class _SlowLink:
    """A ``link-straggler`` fault armed on the cluster: its two nodes (equal: the link joins two GPUs of one
    node), and what it has cost so far."""

    fault: Fault
    nodes: tuple[int, int]
    ops: int = 0
    extra_s: float = 0.0
    groups: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        a, b = self.fault.rank, self.fault.peer
        if self.nodes[0] != self.nodes[1]:
            return f"between node {self.nodes[0]} and node {self.nodes[1]} (ranks {a} and {b})"
        return f"between the GPUs of ranks {a} and {b} on node {self.nodes[0]}"


@dataclass(slots=True, eq=False)
class Cohort:
    """All ranks taking one block of group-creation calls together (see ``Engine._cohort``)."""

    start: int
    counter: int
    meeting: Meeting
    broken: bool = False
    end: int = 0
    executed: int = 0
    splits: int = 0
    binds: tuple[str, ...] = ()
    failures: dict[int, tuple[int, TorchError | SimulatedOOM]] = field(default_factory=dict)
    history: History | None = None
    counter_end: int = 0


def _starts_block(op: Op) -> bool:
    """Ops a cohort may take: world-wide group creation (local synchronization is members-only)."""
    if isinstance(op, NewGroup):
        return not op.use_local_synchronization
    return isinstance(op, SplitGroup) and op.parent == WORLD


class _RanksKey:
    """Wraps a member tuple with its hash computed once (tuples don't cache theirs)."""

    __slots__ = ("_hash", "ranks")

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self._hash = hash(ranks)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _RanksKey) and (self.ranks is other.ranks or self.ranks == other.ranks)


def _ranks_digest(ranks: tuple[int, ...]) -> tuple[int, int, int]:
    """A cheap, deterministic stand-in for a member list in the trace (repr of a 16k-rank tuple per member
    would make tracing quadratic); the group's name is recorded beside it."""
    return len(ranks), ranks[0], ranks[-1]


@dataclass(slots=True, eq=False)
class _HistoryNode:
    """A state of group-creation history that ranks share (their class, call count and digest), with the calls
    already decided from it. ``snapshot`` is a History last seen in this state (checked before use: its owner
    records into it in place)."""

    cls: tuple[Any, ...]
    calls: int
    digest: int
    steps: dict[int, _Step] = field(default_factory=dict)  # id(op) -> the call decided from this state
    snapshot: History | None = None


@dataclass(slots=True, eq=False)
class _Step:
    """One call decided once for every rank in a state: the deciding rank's request (what ``History.record``
    needs, equal on every rank of the class), the decision, the op torch receives (None: reuse), the next state."""

    op: NewGroup
    request: GroupRequest
    decision: GroupDecision
    effective: NewGroup | None
    after: _HistoryNode
    effective_id: int = 0  # id(effective), 0 for None: the outsider loop's key

    def __post_init__(self) -> None:
        self.effective_id = 0 if self.effective is None else id(self.effective)


_OutsiderEntry = tuple[int, dict[int, int], str | None, NewGroup]  # (op key, member index, bind, canonical op)
_RANK_ENV = frozenset(("LOCAL_RANK", "RANK"))  # the launcher's per-rank variables; not a policy's business
_REPLAY_MAX = 16  # a longer tail is cheaper to materialise by copying a snapshot than by replaying its records


def _rewritten(op: NewGroup, decision: GroupDecision) -> NewGroup:
    """The op with a (non-reuse) policy decision applied: what torch receives."""
    return replace(
        op,
        backend=decision.backend,
        pg_options=decision.pg_options,
        use_local_synchronization=decision.use_local_synchronization,
        device_id=decision.device_id if decision.device_id is not None else op.device_id,
    )


def unchanged_decision(op: NewGroup) -> GroupDecision:
    return GroupDecision(op.backend, op.pg_options, op.use_local_synchronization, explanation="as requested")


def _init_text(plan: InitPlan) -> str:
    parts = [f"backend={plan.backend or '<default>'}"]
    if plan.pg_options.to_dict():
        parts.append(f"pg_options={plan.pg_options.to_dict()}")
    parts += [f"{k}={v}" for k, v in sorted(plan.env.items())]
    return ", ".join(parts)


def _fire_once(event: simpy.Event) -> None:
    """Succeed an event unless something (an abort) already did."""
    if not event.triggered:
        event.succeed()


def _handle_of(op: Op) -> str:
    """The program's name for the group an op concerns: the handle it binds or the one it uses."""
    return getattr(op, "bind", None) or getattr(op, "group", None) or ""


class _Crash(TorchError):
    """An injected process death (or, with ``stall``, a process that stops issuing ops)."""

    def __init__(self, fault: Fault, stall: bool = False) -> None:
        super().__init__("Crash", f"injected fault: {fault.describe()}")
        self.fault = fault
        self.stall = stall


class _AsyncError(TorchError):
    def __init__(self, action: TimeoutAction) -> None:
        super().__init__(action.error_type or "DistBackendError", action.message)
        self.action = action


class _ProcessAbort(TorchError):
    def __init__(self, message: str) -> None:
        super().__init__("SIGABRT", message)


class _PeerLost(TorchError):
    """A gloo operation towards a peer whose sockets are closed (it destroyed its groups, or died)."""

    def __init__(self, peer: int) -> None:
        super().__init__("RuntimeError", PEER_CLOSED.format(peer=peer))

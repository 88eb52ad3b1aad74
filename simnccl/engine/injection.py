"""Fault injection: a seeded schedule (``simnccl.faults``) armed on the rooms it affects, and acted out.

Why a room: each fault kind acts where the real failure would — a crash or stall before an op or at a time, an
NCCL error through the watchdog's rules (``simnccl.watchdog``), a straggler through ``Timing``, an OOM at the
next communicator init through ``Memory``, a store that never answers through ``Comms``. Program faults
(skip, mismatch) were applied to the programs before the run (``apply_to_programs``).
"""

from __future__ import annotations

from collections.abc import Sequence

from simnccl.c10d import Group
from simnccl.engine.comms import Comms
from simnccl.engine.memory import Memory
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import ENDED_STATUSES, AsyncError, Crash, RankRuntime, Waiting
from simnccl.engine.timing import Timing
from simnccl.engine.watchdogs import Watchdogs
from simnccl.faults import PROGRAM_FAULTS, STRAGGLER_FAULTS, Fault, FaultSchedule, validate
from simnccl.ops import Collective, Program
from simnccl.watchdog import NO_HANDLING, on_async_error


class Injection:
    def __init__(
        self,
        sim: Sim,
        schedule: FaultSchedule,
        programs: Sequence[Program],
        rendezvous: Rendezvous,
        timing: Timing,
        memory: Memory,
        comms: Comms,
        watchdogs: Watchdogs,
        originals: Sequence[Program] = (),
    ) -> None:
        self.sim = sim
        self.env = sim.env
        self.ranks = sim.ranks
        self.record = sim.trace.record
        self.rendezvous = rendezvous
        self.watchdogs = watchdogs
        self.schedule = schedule
        self.memory = memory
        self.comms = comms
        self.timing = timing
        self.op_faults: dict[tuple[int, int], Fault] = {}  # (rank, op index) -> the fault before that op
        self._struck: set[int] = set()  # ids of the op and timed faults that struck (``unacted``)
        # ids of the faults that met their op or time and could not act there -> why (``unacted``)
        self._could_not: dict[int, str] = {}
        # (rank, op index) -> a program fault (skip, mismatch) and the collective it rewrote (``originals``: the
        # programs before ``apply_to_programs``, a skip's op being a no-op compute now): the rank meeting that op
        # tells whether the rewrite changed anything (``program_fault``)
        self.program_faults: dict[tuple[int, int], tuple[Fault, Collective]] = {}
        for fault in schedule.faults:
            if fault.kind in PROGRAM_FAULTS and fault.at_op is not None and fault.rank < len(originals):
                op = originals[fault.rank].ops[fault.at_op]
                if isinstance(op, Collective):
                    self.program_faults[(fault.rank, fault.at_op)] = (fault, op)
        for fault in schedule.runtime():
            validate(fault, programs)
            if fault.kind == "straggler":
                timing.slow_rank(fault.rank, fault.factor)
            elif fault.kind == "link-straggler":
                assert fault.peer is not None
                nodes = (sim.cluster.node_of(fault.rank), sim.cluster.node_of(fault.peer))
                timing.slow_link(fault, nodes)
            elif fault.kind == "oom-at-init":
                memory.fail_next_init(fault.rank)
            elif fault.kind == "store-timeout":
                comms.fail_store(fault.rank, fault.at_op)
            elif fault.at_op is not None:
                self.op_faults[(fault.rank, fault.at_op)] = fault

    def start(self) -> None:
        """Start a process per fault that strikes at a simulated time."""
        for fault in self.schedule.runtime():
            if fault.at_s is not None:
                self.env.process(self._timed(fault))

    def _timed(self, fault: Fault) -> Waiting:
        assert fault.at_s is not None
        yield self.env.timeout(fault.at_s)
        rt = self.ranks[fault.rank]
        if rt.status in ENDED_STATUSES or self._cannot_act(rt, fault):
            return
        self._struck.add(id(fault))
        self.record(self.env.now, rt.rank, "fault", fault.kind)
        procs = self.sim.procs
        if fault.kind in ("crash", "gpu-crash"):
            for victim in self._victims(rt, fault):
                procs[victim.rank].interrupt(Crash(fault))
                self.comms.drop_store(victim, died=True)  # under spawn, rank 0's store goes with its process
        elif fault.kind == "nccl-error":
            action = on_async_error(rt.ctx.env, self.watchdogs.world_impl(rt), rank=rt.rank)
            if action.dump:
                self.watchdogs.dump_all(self.env.now)
            procs[rt.rank].interrupt(Crash(fault, stall=True) if action.outcome == "hang" else action)
        elif fault.kind in ("stall", "watchdog-stuck"):
            procs[rt.rank].interrupt(Crash(fault, stall=True))

    def _cannot_act(self, rt: RankRuntime, fault: Fault) -> bool:
        """Whether ``fault``, at its op or time, has nothing to act on (recorded with why for ``unacted``).

        Why: an ``nccl-error`` is an error an NCCL communicator reports (ncclCommGetAsyncError, read by the
        watchdog): a process with none yet (before ``init_process_group``, before a lazy group's first use, or in a
        gloo-only world) cannot raise "NCCL Async Error", so it aborted a run real torch never aborts there."""
        if fault.kind != "nccl-error" or _has_nccl_comm(rt):
            return False
        self._could_not[id(fault)] = "the rank had no NCCL communicator then: no NCCL error can surface"
        return True

    def program_fault(self, rt: RankRuntime, fault: Fault, op: Collective) -> None:
        """``rt`` meets the op a program fault rewrote (``op`` as the program had it): did the rewrite change
        anything? Not on a rank outside the op's group (torch's NON_GROUP_MEMBER: the collective is a warning and a
        no-op either way), nor a size mismatch on a group of one (there is no other member to disagree with); a
        skip on a group of one still spares the rank that collective (its communicator, its time).

        Why: both rewrites were applied before the run and reported nothing, so a skip or mismatch that could not
        change the run passed as if the policy had survived it."""
        handle = rt.handles.get(op.group)
        if handle is not None and not isinstance(handle, Group):
            why = f"the rank is not a member of group {op.group!r}: the collective is torch's NON_GROUP_MEMBER no-op"
            self._could_not[id(fault)] = why
        elif fault.kind == "mismatch" and isinstance(handle, Group) and handle.size == 1:
            self._could_not[id(fault)] = f"group {op.group!r} has one member: no other member to disagree on the size"
        else:
            self._struck.add(id(fault))

    def unacted(self) -> list[str]:
        """The scheduled faults that never acted, described, with why: at the end of a run.

        Why: a fault that never struck leaves a run that passes as if it had survived it (a crash at t=100 s of a
        rank that finished at t=50 s, a stall at an op the rank never reached, an oom-at-init with no init left, a
        skip of a collective the rank only meets as a non-member, a straggler with no local work or a slow link no
        communicator spans): the schedule printed it, and nothing said it did nothing."""
        out = []
        for fault in self.schedule.faults:
            if fault.kind in STRAGGLER_FAULTS:
                if self.timing.straggler_acted(fault):
                    continue
                why = (
                    "the rank ran no local work it could slow"
                    if fault.kind == "straggler"
                    else "no collective or send/recv it slowed ran over that link"
                )
            elif id(fault) in self._could_not:
                why = self._could_not[id(fault)]
            elif fault.kind == "oom-at-init":
                if not self.memory.init_fault_armed(fault.rank):
                    continue
                why = "the rank made no communicator after it was armed"
            elif fault.kind == "store-timeout":
                if not self.comms.store_fault_armed(fault.rank, fault.at_op):
                    continue
                why = "the rank made no bootstrap where it was armed"
            elif id(fault) in self._struck:
                continue
            elif fault.kind in PROGRAM_FAULTS:
                why = "the rank never reached that op"
            elif fault.at_s is not None:
                ended = self.ranks[fault.rank].status in ENDED_STATUSES
                why = "the rank had ended before then" if ended else "the run ended before then"
            else:
                why = "the rank never reached that op"
            out.append(f"{fault.describe()}: never acted ({why})")
        return out

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
            and other.status not in ENDED_STATUSES
        ] or [rt]

    def inject(self, rt: RankRuntime, fault: Fault) -> Waiting:
        """An op-indexed fault, before the op runs: once the NOCOLOR splits this rank ran ahead of are complete,
        where the op would start (``Rendezvous.settle``). A stall there said the rank was stuck since its arrival
        at the split, before the split it was still in had ended."""
        yield from self.rendezvous.settle(rt)
        if self._cannot_act(rt, fault):
            return
        self._struck.add(id(fault))
        self.record(self.env.now, rt.rank, "fault", fault.kind, rt.pc)
        if fault.kind in ("crash", "gpu-crash"):
            for victim in self._victims(rt, fault):
                if victim is not rt:
                    self.sim.procs[victim.rank].interrupt(Crash(fault))
                self.comms.drop_store(victim, died=True)
            raise Crash(fault)
        if fault.kind in ("stall", "watchdog-stuck"):
            yield from self.stall(rt, fault)
        if fault.kind == "nccl-error":
            action = on_async_error(rt.ctx.env, self.watchdogs.world_impl(rt), rank=rt.rank)
            if action.dump:
                self.watchdogs.dump_all(self.env.now)
            if action.outcome == "hang":
                yield from self.stall(rt, fault)
            if action.wait_s:
                yield self.env.timeout(action.wait_s)
            raise AsyncError(action)

    def stall(self, rt: RankRuntime, fault: Fault) -> Waiting:
        """The rank stops issuing ops but stays alive (it still answers a flight-recorder dump). A
        ``watchdog-stuck`` rank is stuck in a CUDA/NCCL call with its watchdog thread: its own collective
        timeouts never fire, and only legacy's heartbeat monitor can end it (``simnccl.watchdog``). An
        ``nccl-error`` under ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (NoHandling) lands here too: the watchdog
        only logs the error and nothing tears the broken communicator down, so the op never completes and the
        rank hangs in it — the error must not simply vanish."""
        op = rt.program.ops[min(rt.pc, len(rt.program.ops) - 1)]
        meeting = self.rendezvous.open(("stall", rt.rank), "stall", "", 0, ())
        if fault.kind == "watchdog-stuck":
            meeting.problem = (
                f"injected fault: {fault.describe()} — the process and its NCCL watchdog thread are stuck in a "
                "CUDA/NCCL call"
            )
            self.watchdogs.arm_monitor(rt, fault)
        elif fault.kind == "nccl-error":
            self.watchdogs.report.broken.add(rt.rank)
            meeting.problem = (
                f"injected fault: {fault.describe()} — {NO_HANDLING}; the watchdog logged: "
                f"{on_async_error(rt.ctx.env, self.watchdogs.world_impl(rt), rank=rt.rank).message}"
            )
        else:
            meeting.problem = f"injected fault: {fault.describe()} — the rank stopped issuing ops"
        yield from self.rendezvous.wait(rt, meeting, op)


def _has_nccl_comm(rt: RankRuntime) -> bool:
    """Whether the rank holds a live NCCL communicator (a group's, or a send/recv pair's), which an NCCL error
    needs to surface."""
    return any(
        comm.impl.is_nccl and (comm.ready or bool(comm.pair_comms))
        for group in rt.groups
        if not group.destroyed
        for comm in group.comms.values()
    )

"""Watchdogs and monitors in simulated time: a blocked wait's timeout firing at its deadline, flight-recorder
dumps, and legacy's heartbeat monitor ending a process whose watchdog is stuck.

Why a room: what each backend's watchdog does is a pure rule (``simnccl.watchdog``); *when* it acts, on which
process, is the engine's. This room drives the whole run (``run``): simpy steps in slices no longer than the
shortest group timeout, and after each slice the due watchdogs act — so a hang always ends with a verdict
(DESIGN rule 7). A firing watchdog writes its rank's entry of the hang report (``outcome.HangReport``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from simnccl.backends import Comm
from simnccl.backends.gloo import TIMEOUT_TIE_RACE
from simnccl.c10d import Group
from simnccl.engine import init_barrier
from simnccl.engine.comms import bootstrap_group, pair_in_group, unique_id_stage
from simnccl.engine.config import EngineGuardError
from simnccl.engine.outcome import HangReport
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import ENDED_STATUSES, RankRuntime, Waiting
from simnccl.engine.timing import Timing
from simnccl.faults import Fault
from simnccl.flight_recorder import numel
from simnccl.limits import number_text
from simnccl.meetings import Meeting
from simnccl.ops import Barrier
from simnccl.release import DEFAULT_PG_NCCL_TIMEOUT_S, Impl
from simnccl.watchdog import (
    MonitorAction,
    TimeoutAction,
    on_dump_signal,
    on_gloo_bootstrap_wait,
    on_store_host_wait,
    on_timeout,
    on_unique_id_wait,
    on_watchdog_stuck,
    unique_id_wait_s,
)

_STORE_BARRIER = init_barrier.KIND  # (a global, not an attribute lookup, in the per-rank loop)


class Watchdogs:
    def __init__(self, sim: Sim, sockets: GlooSockets, timing: Timing) -> None:
        self.sim = sim
        self.env = sim.env
        self.ranks = sim.ranks
        self.record = sim.trace.record
        self.sockets = sockets
        self.timing = timing
        self.min_timeout_s = DEFAULT_PG_NCCL_TIMEOUT_S
        # a monitored_barrier's own timeout bounds the steps as a group's does (one of 1 s under a group's 60 s
        # started and ended inside a step, and passed); read once per distinct program
        programs = {id(rt.program): rt.program for rt in sim.ranks}.values()
        own = [op.timeout_s for p in programs for op in p.ops if type(op) is Barrier and op.timeout_s]
        if own:
            self.min_timeout_s = min(self.min_timeout_s, *own)
        self.monitor_start: dict[int, float] = {}  # rank -> when its default group (and its watchdog) was made
        self.stuck: dict[int, MonitorAction | None] = {}  # watchdog-stuck ranks -> what their monitor does
        self.monitor_action: dict[int, MonitorAction] = {}  # rank -> the heartbeat-monitor action now pending
        self.fr_dumps: dict[int, dict[str, Any]] = {}
        self.report = HangReport(sim, timing, self.stuck)

    def group_made(self, timeout_s: float) -> None:
        """A group exists with this timeout: the run's steps must be no longer than the shortest."""
        self.min_timeout_s = min(self.min_timeout_s, timeout_s)

    def default_group_made(self, rt: RankRuntime) -> None:
        """The default group's watchdog (and heartbeat monitor) start now."""
        self.monitor_start[rt.rank] = self.env.now

    # ---------------------------------------------------------------- the run, in simulated time

    def run(self) -> None:
        """Run to the end, letting each blocked wait's timeout fire at its simulated deadline.

        No timer events are created: the run advances in steps no longer than the shortest group timeout, so
        a wait that starts inside a step cannot be due before the step ends; after each step the due
        watchdogs act. When nothing is scheduled the clock jumps straight to the next deadline; a stall with
        no deadline left (e.g. inside ncclCommSplit) ends the run as a hang.
        """
        guard = self.sim.guard
        while True:
            guard.work += 1  # an iteration that made no progress must still reach the wall-clock guard
            if guard.work & 0x3FF == 0:
                guard.check()
            due = self._due_timeouts()
            closing = []
            for at, rt, action in due:
                if at <= self.env.now:
                    closing.append(self._fire(rt, action, at))
            for closed in closing:  # after every timeout due now fired: members timing out together each time out
                if closed is not None:
                    self._close_at_timeout(*closed)
            due = [d for d in due if d[0] > self.env.now]
            next_deadline = due[0][0] if due else math.inf
            env = self.env
            if env.peek() == math.inf and next_deadline == math.inf:
                return
            if not due and self.sim.ended == len(self.ranks):
                return  # every rank has ended (see the stepping loop below)
            horizon = self.sim.config.limits.max_sim_time_s
            if min(env.peek(), next_deadline) > horizon:
                raise EngineGuardError(
                    f"simulated time would pass Limits.max_sim_time_s = {number_text(horizon)} s", "max_sim_time_s"
                )
            # A wait starts at an event, so steps are measured from the next one: idle time is never walked
            # through in timeout-sized steps (a 1 ms timeout over hours of compute was billions of steps).
            step_end = min(next_deadline, max(env.now, env.peek()) + self.min_timeout_s, horizon)
            if env.peek() > step_end:
                # Nothing happens before then: move the clock to the step end. simpy places the event at
                # ``now + delay``, which rounding can put one ulp past ``step_end``; step to where it really
                # landed, or the loop would never reach it and schedule another one forever.
                env.timeout(step_end - env.now)
                step_end = max(step_end, env.peek())
            step = env.step
            shortest = self.min_timeout_s
            sim, ranks = self.sim, len(self.ranks)
            while env.peek() <= step_end:
                if sim.ended == ranks:
                    # Every rank has ended: what is still scheduled (a fault timed for later, a monitor's timer)
                    # can change nothing, and running to it put the run's end there (a crash at t=500 s that
                    # never acted made a 0.25 s run end at 500 s).
                    return
                step()
                if self.min_timeout_s < shortest:
                    # A group with a shorter timeout was made inside this step: a wait on it starts no earlier
                    # than now, so the step must end by now + its timeout, or a wait that starts and ends
                    # inside the step would never be checked (a 1 s timeout under a 5 s late peer passed).
                    shortest = self.min_timeout_s
                    step_end = max(min(step_end, env.now + shortest), env.now)

    def _due_timeouts(self) -> list[tuple[float, RankRuntime, TimeoutAction]]:
        due = []
        # (deadline, gloo operation) -> indexes in ``due`` of members raising there then (``TIMEOUT_TIE_RACE``,
        # marked where they are all of its members: measured so, when every member arrived and the operation
        # still cannot run; members timing out together while another never came are left as they were)
        together: dict[tuple[float, int, int], list[int]] = {}
        for rt in self.ranks:
            if rt.status != "blocked" or rt.timed_out or rt.block is None or rt.rank in self.sockets.peer_lost:
                continue
            block = rt.block
            if block.meeting.kind == _STORE_BARRIER:
                barrier = block.meeting
                action = init_barrier.timeout_action(rt.rank, barrier, rt.world)
                due.append((block.since_s + init_barrier.detected_after(barrier), rt, action))
                continue
            group = rt.group_named(bootstrap_group(block.meeting))
            if group is None:
                continue
            comm = group.comm_for(self.sim.device_type)
            if comm is None:
                continue
            op = block.op
            meeting = block.meeting
            stage = unique_id_stage(meeting, rt.rank, comm.impl) if meeting.kind == "bootstrap" else None
            if stage is not None:
                store_s = rt.world.timeout_s if rt.world is not None else group.timeout_s
                wait_s = unique_id_wait_s(comm.impl, group_timeout_s=group.timeout_s, store_timeout_s=store_s)
                action = on_unique_id_wait(
                    comm.impl,
                    group_rank=group.ranks.index(rt.rank),
                    group=group.name,
                    in_store=stage == "store",
                    timeout_s=wait_s,
                    pair=pair_in_group(meeting, group.ranks),
                )
            elif (
                comm.impl is Impl.GLOO
                and meeting.kind == "bootstrap"
                and self._hosts_store(rt, group, meeting.key[0] == "store-fault")
            ):
                joined = 1 + sum(1 for r in group.ranks if r != rt.rank and r in meeting.arrivals)
                wait_s, action = on_store_host_wait(joined=joined, world=group.size, timeout_s=group.timeout_s)
            elif comm.impl is Impl.GLOO and meeting.kind == "bootstrap":
                deadline = self.timing.gloo_bootstrap_deadline(meeting, block.since_s, group.timeout_s)
                if deadline is None:
                    continue  # every member is in, and no one peer's connection outlasts the timeout
                wait_s = deadline - block.since_s
                # gloo waits for each other member's address in group-rank order: the first that never came
                others = [r for r in group.ranks if r != rt.rank]
                peer = next((r for r in others if r not in meeting.arrivals), others[0])
                action = on_gloo_bootstrap_wait(
                    group=group.name, default=group is rt.world, peer=group.ranks.index(peer), timeout_s=group.timeout_s
                )
            else:
                wait_s = group.timeout_s
                if type(op) is Barrier and op.call == "monitored_barrier":
                    # torch 2.15's monitored_barrier(timeout=None) waits _get_default_timeout(get_backend(group)),
                    # not the group's own (l.6687-6688): 30 minutes for gloo. Found by a tester: a peer 1.5 s late
                    # under a 1 s group timeout passed on real gloo (3 runs), the simulator timed it out.
                    wait_s = op.timeout_s or self.sim.release.default_timeout_s(group.backend.requested)
                if comm.impl is Impl.GLOO and meeting.kind in ("collective", "p2p"):
                    deadline = self.timing.gloo_deadline(meeting, op, block.since_s, wait_s)
                    if deadline is None:
                        continue  # every member is in, and no one message outlasts the timeout
                    wait_s = deadline - block.since_s
                action = on_timeout(
                    comm.impl,
                    meeting.kind,
                    rt.ctx.env,
                    rank=rt.rank,
                    seq=meeting.seq,
                    op_name=op.name,
                    numel=numel(getattr(op, "size_bytes", 4), getattr(op, "dtype", "Float")),
                    timeout_s=wait_s if type(op) is Barrier and op.call == "monitored_barrier" else group.timeout_s,
                )
            if action is not None:
                if comm.impl is Impl.GLOO and action.outcome == "raise" and meeting.kind in ("collective", "p2p"):
                    key = (block.since_s + wait_s, id(meeting), len(meeting.expected))
                    together.setdefault(key, []).append(len(due))
                due.append((block.since_s + wait_s, rt, action))
        for (_, _, members), indexes in together.items():
            if len(indexes) == members > 1:
                for i in indexes:
                    at, member, action = due[i]
                    due[i] = (at, member, replace(action, message=f"{action.message} ({TIMEOUT_TIE_RACE})"))
        due.sort(key=lambda item: (item[0], item[1].rank))
        return due

    def _hosts_store(self, rt: RankRuntime, group: Group, faulted: bool) -> bool:
        """Whether ``rt`` waits in ``group``'s bootstrap as the host of the default group's store: rank 0 under
        spawn, whose store server waits for every rank to connect before any backend starts (measured); not
        where an injected store fault (``faulted``) is what it waits on."""
        return self.sim.config.launcher == "spawn" and rt.rank == 0 and group is rt.world and not faulted

    def _fire(
        self, rt: RankRuntime, action: TimeoutAction, at: float
    ) -> tuple[RankRuntime, tuple[Comm, ...], Meeting] | None:
        """The timeout acts on ``rt``; what it closes, for ``run`` to close once every timeout due now has
        fired: a gloo collective's or send/recv's timeout closes the rank's pairs of that communicator
        (``_gloo_timeout_closes``)."""
        rt.timed_out = True
        rt.unhealthy = rt.unhealthy or action.unhealthy
        entry = self.report.entry(rt, self.ranks)  # ranks[r] is rank r
        entry["detected_at_s"] = at + action.wait_s
        entry["timeout_s"] = at - entry["since_s"]
        entry["watchdog"] = action.message.splitlines()[0] if action.message else entry["watchdog"]
        rt.timeout_hang = entry
        self.record(at, rt.rank, "timeout", action.outcome, entry["kind"], entry["seq"])
        if action.dump:
            self.dump_all(at)
        meeting = None if rt.block is None else rt.block.meeting
        leaves = action.outcome in ("abort", "raise") and meeting is not None and meeting.kind == "bootstrap"
        if leaves and meeting is not None and not meeting.complete:
            # It left the bootstrap: a member arriving later must not complete the communicator with it.
            meeting.arrivals.pop(rt.rank, None)
        closes = self._gloo_timeout_closes(rt, action, meeting)
        if action.outcome in ("abort", "raise"):
            self.sim.procs[rt.rank].interrupt(action)
        return closes

    def _close_at_timeout(self, rt: RankRuntime, comms: tuple[Comm, ...], meeting: Meeting) -> None:
        """``rt`` leaves ``meeting`` and closes its pairs of ``comms`` after its timeout (once every timeout due
        then fired and was reported: a member timing out with it is reported waiting for the ranks that never
        came, not for it); each member that fails for it as peer-lost keeps the wait it was in
        (``replaced_timeout``, with ``ended_by``): a real run stopped before that timeout (the stall detector,
        under a default 30-minute timeout) saw the member stuck there, and compares it so
        (``real.compare.stuck_until_timeout``)."""
        if not meeting.complete:
            meeting.arrivals.pop(rt.rank, None)
        before = set(self.sockets.peer_lost)
        self.sockets.close(rt, comms)
        for member in sorted(self.sockets.peer_lost - before):
            other = self.ranks[member]
            entry = self.report.entry(other, self.ranks)
            entry["ended_by"] = f"rank {rt.rank}'s timeout closed its gloo pairs"
            other.replaced_timeout = entry

    def _gloo_timeout_closes(
        self, rt: RankRuntime, action: TimeoutAction, meeting: Meeting | None
    ) -> tuple[RankRuntime, tuple[Comm, ...], Meeting] | None:
        """A gloo collective or send/recv that timed out leaves its operation, and gloo closes every pair of the
        rank's context before torch raises (``context_->signalException`` in gloo's ``tcp/unbound_buffer.cc``):
        a member still waiting on it directly fails with "Connection closed by peer", and one arriving later does
        too, never completing the operation with a rank that left it. Found by a tester (real 2.15 gloo, 2-3
        ranks, 2 runs each): a rank late past its peer's timeout completed its all_reduce in the simulator (done)
        where real gloo failed it as peer-lost; peers still waiting hung instead of failing."""
        if action.outcome != "raise" or meeting is None or meeting.kind not in ("collective", "p2p"):
            return None
        group = rt.group_named(bootstrap_group(meeting))
        comm = None if group is None else group.comm_for(self.sim.device_type)
        if comm is None or comm.impl is not Impl.GLOO:
            return None
        return rt, (comm,), meeting

    # ---------------------------------------------------------------- dumps and heartbeat monitors

    def dump_all(self, at: float) -> None:
        """The abort hook dumps on this rank and signals the others through the store: every live process
        writes its ``TORCH_FR_DUMP_TEMP_FILE<rank>``. A dead process writes nothing."""
        for rt in self.ranks:
            self._signal_monitor(rt, at)
            if rt.rank in self.fr_dumps or rt.fr is None or not rt.fr.enabled:
                continue
            if rt.status in ("running", "blocked"):
                self.fr_dumps[rt.rank] = rt.fr.dump()
                self.record(at, rt.rank, "fr-dump", len(rt.fr.entries))

    def _signal_monitor(self, rt: RankRuntime, at: float) -> None:
        """Legacy's monitor on the default group polls the store's dump key every second: once any rank's
        watchdog timed out (and set it), every live legacy process dumps, waits one heartbeat timeout and is
        terminated (torch's "collective timeout or exception" path) — a stalled or stuck process included,
        unless something ended it before."""
        impl = self.world_impl(rt) if rt.status in ("running", "blocked") else None
        if impl is not Impl.LEGACY:
            return
        source = rt.rank if rt.timed_out else min((r.rank for r in self.ranks if r.timed_out), default=-1)
        start_s = self.monitor_start[rt.rank]
        action = on_dump_signal(impl, rt.ctx.env, rank=rt.rank, monitor_start_s=start_s, signal_at_s=at, src=source)
        current = self.monitor_action.get(rt.rank)
        if action is not None and (current is None or action.detected_at_s < current.detected_at_s):
            self.monitor_action[rt.rank] = action
            self.env.process(self._monitor(rt, action))

    def arm_monitor(self, rt: RankRuntime, fault: Fault) -> None:
        """Start the stuck rank's heartbeat monitor clock, if its default group has one (legacy only)."""
        if rt.rank in self.stuck:
            return
        impl = self.world_impl(rt)
        action = None
        if impl is not None:
            start_s = self.monitor_start[rt.rank]
            action = on_watchdog_stuck(impl, rt.ctx.env, rank=rt.rank, monitor_start_s=start_s, stuck_at_s=self.env.now)
        self.stuck[rt.rank] = action
        self.record(self.env.now, rt.rank, "watchdog-stuck", None if action is None else action.detected_at_s)
        if action is not None:
            self.monitor_action[rt.rank] = action
            self.env.process(self._monitor(rt, action))

    def world_impl(self, rt: RankRuntime) -> Impl | None:
        """The implementation behind this rank's live default group (whose watchdog the monitor watches)."""
        if rt.world is None or rt.world.destroyed or rt.rank not in self.monitor_start:
            return None
        comm = rt.world.comm_for(self.sim.device_type)
        return None if comm is None else comm.impl

    def _monitor(self, rt: RankRuntime, action: MonitorAction) -> Waiting:
        """Legacy's heartbeat monitor acting on its process: detect, dump, wait a heartbeat, terminate. A dump
        signal may replace a later pending action with an earlier one; only the one pending acts."""
        yield self.env.timeout(max(action.detected_at_s - self.env.now, 0.0))
        if self.monitor_action.get(rt.rank) is not action or rt.status in ENDED_STATUSES:
            return
        if rt.status == "blocked" and rt.timeout_hang is None:  # a running process is not hung (yet)
            entry = self.report.entry(rt, self.ranks)  # ranks[r] is rank r
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
        self.record(self.env.now, rt.rank, "heartbeat", action.reason)
        if action.dump and rt.fr is not None and rt.fr.enabled and rt.rank not in self.fr_dumps:
            self.fr_dumps[rt.rank] = rt.fr.dump()  # this process only: the monitor signals nobody
            self.record(self.env.now, rt.rank, "fr-dump", len(rt.fr.entries))
        if action.terminate_at_s is None:
            return
        yield self.env.timeout(max(action.terminate_at_s - self.env.now, 0.0))
        if self.monitor_action.get(rt.rank) is action and rt.status not in ENDED_STATUSES:
            self.sim.procs[rt.rank].interrupt(
                TimeoutAction("abort", False, 0.0, "SIGABRT", action.message, False, kind="heartbeat")
            )

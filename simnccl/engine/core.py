"""The Engine: builds the rooms of one run, wires them, and runs the ranks to a verdict.

Why composition: each room owns its state and is handed the rooms it calls, in the order below (a room only
calls rooms built before it), so the wiring *is* the dependency map, and no room holds the Engine — nothing a
run builds is a reference cycle, and a finished engine is freed as soon as it is dropped.

The dispatch table below is where an op type meets its handler. To add an op: its frozen dataclass in
``simnccl.ops``, a handler ``op_<name>(rt, op)`` in the room that owns what it touches, one line here.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from simnccl.engine.caching_allocator import CachingAllocator
from simnccl.engine.collectives import Collectives
from simnccl.engine.comms import CommRegistry, Comms
from simnccl.engine.config import SimConfig
from simnccl.engine.fast import CallTable, Cohorts, FastPaths, Outsiders, RankClasses, SharedHistories, common_program
from simnccl.engine.groups import Groups
from simnccl.engine.injection import Injection
from simnccl.engine.memory import Memory
from simnccl.engine.outcome import outcome
from simnccl.engine.planning import Planner
from simnccl.engine.policy_gate import PolicyGate
from simnccl.engine.ranks import RankLoop, make_ranks
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import RankRuntime, RunOutcome, Waiting
from simnccl.engine.timing import Timing
from simnccl.engine.watchdogs import Watchdogs
from simnccl.faults import apply_to_programs
from simnccl.ops import (
    Alloc,
    BatchIsendIrecv,
    Checkpoint,
    Compute,
    DestroyProcessGroup,
    EmptyCache,
    Free,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Raise,
    SetDevice,
    SplitGroup,
)
from simnccl.os_exit import os_exit_raises
from simnccl.policy import BasePolicy, History, Policy
from simnccl.policy.plans import PolicyCalledExit


class Engine:
    """Runs a SimConfig to a verdict."""

    def __init__(self, config: SimConfig, keep_trace: bool = False, fast_path: bool = True) -> None:
        """``fast_path=False`` runs every call through the ordinary per-rank path (outsider calls and shared
        policy decisions off, ``engine/fast``): the same outcome and trace, slower; kept so tests can check
        the two agree."""
        self.config = config
        self.cluster = config.cluster
        self.release = config.release
        self.profile = config.profile
        self.policy: Policy = config.policy if config.policy is not None else BasePolicy()
        self.faults = config.faults
        sim = self.sim = Sim(config, keep_trace)
        self.env = sim.env
        self.guard = sim.guard
        programs = apply_to_programs(config.faults, config.programs)
        sim.ranks.extend(make_ranks(config, programs))
        self.ranks: list[RankRuntime] = sim.ranks

        registry = CommRegistry()
        sockets = GlooSockets(sim, registry.members)
        rendezvous = Rendezvous(sim, sockets)
        self.timing = timing = Timing(sim, rendezvous)
        self.memory = memory = Memory(sim, rendezvous)
        allocator = CachingAllocator(sim, rendezvous, memory)
        planner = Planner(sim)
        self.watchdogs = watchdogs = Watchdogs(sim, sockets, timing)
        comms = Comms(sim, rendezvous, timing, memory, sockets, registry)
        self.nvls = comms.nvls  # the multicast slot ledger: the outcome reports what it charged
        self.histories = histories = SharedHistories(CallTable(planner))
        gate = PolicyGate(sim, self.policy, memory, planner, histories, share_decisions=fast_path)
        groups = Groups(sim, rendezvous, comms, planner, gate, watchdogs, sockets)
        collectives = Collectives(sim, rendezvous, comms, memory, timing)
        self.injection = injection = Injection(
            sim, config.faults, programs, rendezvous, timing, memory, comms, watchdogs, originals=config.programs
        )
        # Cohorts need every rank on one Program object and no runtime fault that could stop one rank mid-block.
        shared = None if config.faults.runtime() else common_program(programs)
        self.classes = classes = planner.classes = RankClasses(planner, enabled=fast_path)
        cohorts = Cohorts(sim, shared, rendezvous, comms, memory, groups, planner, gate, histories, classes)
        outsiders = Outsiders(sim, histories, planner, cohorts, injection.op_faults, gate)
        self.fast = fast = FastPaths(outsiders, cohorts, enabled=fast_path)

        dispatch: dict[type, Callable[[RankRuntime, Any], Waiting | None]] = {
            SetDevice: memory.op_set_device,
            InitProcessGroup: groups.op_init,
            NewGroup: groups.op_new_group,
            SplitGroup: groups.op_split_group,
            DestroyProcessGroup: groups.op_destroy,
            BatchIsendIrecv: collectives.op_batch_p2p,
            Compute: timing.op_compute,
            Alloc: allocator.op_alloc,
            Free: allocator.op_free,
            EmptyCache: allocator.op_empty_cache,
            MemoryCheck: memory.op_memory_check,
            Raise: memory.op_raise,
            Checkpoint: memory.op_checkpoint,
        }
        # every Collective goes to op_collective, every PointToPoint to op_p2p
        self.loop = RankLoop(
            sim, dispatch, collectives.op_collective, collectives.op_p2p, fast, injection, rendezvous, sockets
        )

        # What callers read after a run (the same objects the rooms own).
        self.meetings = rendezvous.meetings
        self.explanations: list[dict[str, Any]] = gate.explanations
        self._order_explanations = gate.order_explanations
        self.ledgers = memory.ledgers
        self.checkpoints = memory.checkpoints
        self.group_records = memory.group_records
        self.fr_dumps = watchdogs.fr_dumps

    def run(self) -> RunOutcome:
        """Run to a verdict. The cyclic GC is paused meanwhile: a large startup allocates millions of
        long-lived objects, and repeated full collections over them made run time grow faster than the
        work (measured: benchmarks/engine.py); nothing the engine builds needs cycle collection to finish.
        A user's policy hook runs with ``os._exit`` raising (``simnccl.os_exit``): its failure, not the end of the
        process with no report."""
        self.guard.start()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with os_exit_raises(PolicyCalledExit):
                self.loop.start()
                self.injection.start()
                self.watchdogs.run()
            result = outcome(self.sim, self.watchdogs.report, self.memory, self.nvls, self.timing, self.fr_dumps)
            result.faults_unacted = self.injection.unacted()
            result.repeated_checkpoints = self.memory.repeated_checkpoints
            if self.sim.trace.keep:  # a Perfetto trace draws the waits: every rendezvous, in opening order
                result.meetings = self.meetings.all()
            return result
        finally:
            self._order_explanations()  # call order, whatever order ranks decided in (also after a raise)
            if gc_was_enabled:
                gc.enable()

    def history_of(self, rank: int) -> History:
        """The group-creation history ``rank`` has recorded so far (what its policy decides on)."""
        return self.histories.history(self.ranks[rank])

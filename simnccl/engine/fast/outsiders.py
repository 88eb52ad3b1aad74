"""Outsider calls: a rank's run of ``new_group`` calls it is not a member of, taken in place (DESIGN rule 8).

Why: a large startup is mostly such calls (Megatron TP8·PP4·DP16: ~2,900 per rank, ~20 of them memberships),
and where the default group is lazy or unbound (legacy, lazy-init) or the group's backend is not the default
group's (gloo twins, a policy's fake singletons) no cohort can take them. Their whole effect is the group
counter, a NON_GROUP_MEMBER handle and, under a policy, one history record, so they are applied here without
planning: the outsider plan once per ``outsider_key`` and call, the policy's decision once per shared history
state and call (``SharedHistories``), the record appended to the rank's ``history_tail``. Same trace, same
outcome (tests/test_outsiders.py), about a microsecond per call.
"""

from __future__ import annotations

from simnccl.c10d import NON_GROUP_MEMBER, Group, TorchError, outsider_key
from simnccl.engine.fast.cohorts import Cohorts
from simnccl.engine.fast.histories import SharedHistories
from simnccl.engine.planning import Planner
from simnccl.engine.policy_gate import PolicyGate
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.faults import Fault
from simnccl.ops import NewGroup


class Outsiders:
    def __init__(
        self,
        sim: Sim,
        histories: SharedHistories,
        planner: Planner,
        cohorts: Cohorts,
        op_faults: dict[tuple[int, int], Fault],
        policy_gate: PolicyGate,
    ) -> None:
        self.guard = sim.guard
        self.histories = histories
        self.calls = histories.calls
        self.planner = planner
        self.cohorts = cohorts
        self.op_faults = op_faults
        self.policy_active = policy_gate.active
        self.shares_decisions = policy_gate.shares
        self.gate = policy_gate
        # Outsider plans: per outsider_key, id(op torch receives) -> counter advance (None: not a plain call).
        self.plans: dict[tuple[object, ...], dict[int, int | None]] = {}
        self._keep: list[NewGroup] = []  # the ops those ids name, kept alive for the run

    def take(self, rt: RankRuntime) -> bool:
        """Take, in place, the run of ``new_group`` calls at ``rt.pc`` this rank makes as an outsider that
        needs nothing: not a member, no NOCOLOR split, no error, no injected fault, no cohort waiting for it.

        The ordinary path records no trace event and never waits for such a call, so the trace and the order
        in which ranks run are unchanged. Each call taken counts for the guard as it would there.
        Returns whether any call was taken.
        """
        world = rt.world
        policy = self.policy_active
        if world is None or rt.pending or (policy and not self.shares_decisions):
            return False
        table = self.calls.table(rt.program)
        rank = rt.rank
        pc = start = rt.pc
        cohorts = self.cohorts.by_start if rt.program is self.cohorts.program else None
        op_faults = self.op_faults
        node = None
        verdicts: dict[int, int | None] | None = None
        keep = self._keep
        setdefault = rt.handles.setdefault
        append = rt.history_tail.append
        guard = self.guard
        gate = self.gate
        verified = gate.verified
        work = guard.work
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
                    node = self.histories.node(rt)
                step = node.steps.get(op_id)
                if step is None:
                    break  # nobody decided this call on this history yet: the ordinary path decides it
                if not verified and not gate.agrees(rt, op, step):
                    break  # this rank plans otherwise: the ordinary path reports the inconsistency
                effective_id = step.effective_id
            advance = 0
            if effective_id:  # 0: the policy reuses an identical group, no torch call at all
                if verdicts is None:
                    verdicts = self._verdicts(rt, world)
                advance = verdicts.get(effective_id, -1)
                if advance == -1:
                    effective = op if step is None else step.effective
                    assert effective is not None
                    advance = verdicts[effective_id] = self._advance(rt, world, effective)
                    keep.append(effective)  # ids stay valid while the verdict is kept
                if advance is None:
                    break
            taken += 1
            work += 1
            if work & 0xFFFF == 0:  # the guard's check, at the same count as on the ordinary path
                guard.work, guard.ops, rt.pc, rt.counter = work, guard.ops + taken, pc, rt.counter + counter
                taken = counter = 0
                guard.check()
            if step is not None:
                append(step)
                node = step.after
            counter += advance
            if bind:
                setdefault(bind, NON_GROUP_MEMBER)
            pc += 1
        guard.work = work
        guard.ops += taken
        rt.counter += counter
        rt.pc = pc
        if node is not None:
            rt.hnode = node
        return pc > start

    def _verdicts(self, rt: RankRuntime, world: Group) -> dict[int, int | None]:
        """The outsider plans shared by every rank with this rank's ``outsider_key``; remembered per rank for
        as long as its context, default group and that group's cuda communicator (and its state) stay the same."""
        parent = world.comm_for("cuda")
        state = None if parent is None else parent.state
        cached = rt.outsider_verdicts
        if cached is not None and cached[:4] == (rt.ctx, world, parent, state):  # compared by identity first
            return cached[4]
        verdicts = self.plans.setdefault(outsider_key(rt.ctx, world), {})
        rt.outsider_verdicts = (rt.ctx, world, parent, state, verdicts)
        return verdicts

    def _advance(self, rt: RankRuntime, world: Group, op: NewGroup) -> int | None:
        """How far an outsider's plain call advances the counter; None when it is not plain (it raises, or
        joins a NOCOLOR split): the ordinary path then runs it on every rank."""
        try:
            plan = self.planner.plan_new_group(rt, op, rt.counter)
        except (TorchError, ValueError):
            return None
        if plan.member or plan.nocolor_split_on is not None:
            return None
        return plan.counter_advance

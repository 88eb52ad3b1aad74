"""Planning a ``new_group`` for one rank: torch's decision (``simnccl.c10d``) on validated members.

Why a room: the group ops, the policy gate and the fast paths all plan the same call the same way; members are
validated once per rank-list object (every rank, and a policy's rewritten op, share it), not once per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnccl.c10d import GroupPlan, Members, TorchError, plan_new_group, validate_ranks
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.ops import NewGroup

if TYPE_CHECKING:
    from simnccl.engine.fast.classes import RankClasses


class Planner:
    def __init__(self, sim: Sim) -> None:
        self.release = sim.release
        self.world_size = sim.cluster.world_size
        self._members_cache: dict[int, tuple[tuple[int, ...] | None, Members]] = {}
        self.classes: RankClasses | None = None  # members' plans made once per rank class (set by the engine)

    def members(self, op: NewGroup) -> Members | tuple[int, ...] | None:
        """The op's validated members, once per rank-list object (all ranks, and a policy's rewritten op,
        share it); invalid lists stay raw so each rank raises torch's error itself."""
        entry = self._members_cache.get(id(op.ranks))
        if entry is None or entry[0] is not op.ranks:  # keyed by the tuple object, kept alive by the entry
            try:
                members = validate_ranks(op.ranks, self.world_size)
            except TorchError:
                return op.ranks
            entry = self._members_cache[id(op.ranks)] = (op.ranks, members)
        return entry[1]

    def plan_new_group(self, rt: RankRuntime, op: NewGroup, counter: int) -> GroupPlan:
        """torch's plan for ``op`` on ``rt``: for a member, through the rank classes when they are on (the
        same plan, made once per class: ``engine/fast/classes.py``)."""
        members = self.members(op)
        classes = self.classes
        if classes is not None and classes.enabled and isinstance(members, Members) and rt.rank in members.index:
            return classes.member_plan(rt, op, members, counter)
        return self.rules_plan(rt, op, counter, members)

    def rules_plan(
        self, rt: RankRuntime, op: NewGroup, counter: int, members: Members | tuple[int, ...] | None
    ) -> GroupPlan:
        """torch's plan for ``op`` on ``rt`` by its rules (``c10d.plan_new_group``), on ``members(op)``."""
        assert rt.world is not None
        return plan_new_group(
            self.release,
            rt.ctx,
            rt.world,
            counter,
            members,
            op.backend,
            op.pg_options,
            op.use_local_synchronization,
            op.group_desc,
            op.device_id,
            op.timeout_s,
        )

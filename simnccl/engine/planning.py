"""Planning a ``new_group`` for one rank: torch's decision (``simnccl.c10d``) on validated members.

Why a room: the group ops, the policy gate and the fast paths all plan the same call the same way; members are
validated once per rank-list object (every rank, and a policy's rewritten op, share it), not once per rank.
"""

from __future__ import annotations

from simnccl.c10d import GroupPlan, Members, TorchError, plan_new_group, validate_ranks
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.ops import NewGroup


class Planner:
    def __init__(self, sim: Sim) -> None:
        self.release = sim.release
        self.world_size = sim.cluster.world_size
        self._members_cache: dict[int, tuple[tuple[int, ...] | None, Members]] = {}

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
        assert rt.world is not None
        return plan_new_group(
            self.release,
            rt.ctx,
            rt.world,
            counter,
            self.members(op),
            op.backend,
            op.pg_options,
            op.use_local_synchronization,
            op.group_desc,
            op.device_id,
            op.timeout_s,
        )

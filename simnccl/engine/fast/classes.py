"""Rank classes: ranks that plan a group-creation call alike up to relabelling are planned once per class.

Why: in a world-wide block (``cohorts``) every member of every new group is planned, and at 16,384 ranks
planning alone was a quarter of a Megatron startup's run. Members whose ``c10d.member_key`` is equal (same
environment less the launcher's per-rank variables, same default group backend and binding state, same
split-parent lifecycle state) get plans that differ only in their group rank, their bound device and their
own split parent; so the first member of a class met with a call's arguments is planned by torch's rules
(``c10d.plan_new_group``) and every later one — of this call or any later call with equal arguments — is that
template relabelled (``c10d.relabel_member_plan``). Ranks in different classes (another env, a lazy or
unbound default group, a parent in another state) fall back to planning of their own: divergence costs
exactly one plan per class it creates.

Who asks: ``Planner.plan_new_group`` for every member on the ordinary path (each rank's own call), and a cohort
for all members of a call at once (``member_plans``). ``check=True`` plans every member by the rules as well and
asserts the relabelled plan equals it (tests); ``enabled=False`` (``Engine(fast_path=False)``) plans by the rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from simnccl.c10d import GroupPlan, Members, TorchError, group_name_for, member_key, relabel_member_plan
from simnccl.engine.planning import Planner
from simnccl.engine.state import RankRuntime
from simnccl.ops import NewGroup


class RankClasses:
    def __init__(self, planner: Planner, *, enabled: bool = True, check: bool = False) -> None:
        self.planner = planner
        self.enabled = enabled
        self.check = check
        self._classes: dict[tuple[object, ...], int] = {}  # class key -> its number
        self._by_rank: dict[int, tuple[Any, ...]] = {}  # rank -> (ctx, world, parent, state, class number)
        self._arguments: dict[tuple[object, ...], int] = {}  # a call's planning arguments -> their number
        self._options: dict[int, object] = {}  # id -> the options object in ``_arguments``' keys, kept alive
        self._templates: dict[tuple[int, int], GroupPlan] = {}  # (class, arguments) -> the first member's plan
        self.planned = 0  # plans made by the rules (one per class and call arguments)
        self.relabelled = 0  # plans made by relabelling a template

    def class_of(self, rt: RankRuntime) -> int:
        """The rank's class number, recomputed only when what its key reads may have changed."""
        world = rt.world
        assert world is not None
        parent = world.comm_for("cuda")
        state = None if parent is None else parent.state
        cached = self._by_rank.get(rt.rank)
        if (
            cached is not None
            and cached[0] is rt.ctx
            and cached[1] is world
            and cached[2] is parent
            and cached[3] is state
        ):
            return cached[4]
        key = member_key(rt.ctx, world)
        number = self._classes.setdefault(key, len(self._classes))
        self._by_rank[rt.rank] = (rt.ctx, world, parent, state, number)
        return number

    def member_plan(self, rt: RankRuntime, op: NewGroup, members: Members, counter: int) -> GroupPlan:
        """``rt``'s plan for ``op``, ``rt`` a member of ``members`` (what ``Planner`` asks for a member)."""
        return self._plan(rt, op, members, counter, self.arguments_number(op), self._name(op, members, counter))

    def member_plans(
        self, ranks: list[RankRuntime], op: NewGroup, members: Members, counter: int
    ) -> Iterator[tuple[int, GroupPlan]]:
        """Every member's plan for ``op``, in member order (a cohort's pass over one call)."""
        if not self.enabled:
            for rank in members.ranks:
                yield rank, self.planner.rules_plan(ranks[rank], op, counter, members)
            return
        number = self.arguments_number(op)
        name = self._name(op, members, counter)
        plan = self._plan
        for rank in members.ranks:
            yield rank, plan(ranks[rank], op, members, counter, number, name)

    def arguments_number(self, op: NewGroup) -> int:
        """The number of the call's planning arguments (everything of the op but its ranks, bind, purpose).

        The options object by identity, kept alive here (so no other object takes its id): hashing its twenty
        fields was a microsecond per call, and a large startup makes one call per group. Equal options in two
        objects get two numbers, so at most a plan more, never a wrong one."""
        options = op.pg_options
        self._options.setdefault(id(options), options)
        arguments = (op.backend, id(options), op.use_local_synchronization, op.group_desc, op.device_id, op.timeout_s)
        return self._arguments.setdefault(arguments, len(self._arguments))

    @staticmethod
    def _name(op: NewGroup, members: Members, counter: int) -> str:
        return group_name_for(counter, members.ranks, op.use_local_synchronization)

    def _plan(self, rt: RankRuntime, op: NewGroup, members: Members, counter: int, number: int, name: str) -> GroupPlan:
        """The rules' plan for the first member of a class with these arguments, relabelled for the others.
        Errors are the rules' own: a class whose first member's plan raises has no template, so each of its
        members raises as torch would."""
        world = rt.world
        assert world is not None
        if op.device_id is not None and op.device_id != world.bound_device:
            return self.planner.rules_plan(rt, op, counter, members)  # torch's bound-device check fails here
        key = (self.class_of(rt), number)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self.planner.rules_plan(rt, op, counter, members)
            self.planned += 1
            return template
        plan = relabel_member_plan(template, members, rt.rank, name, world)
        self.relabelled += 1
        if self.check:
            try:
                by_rules = self.planner.rules_plan(rt, op, counter, members)
            except TorchError as err:
                raise AssertionError(f"rank {rt.rank}: relabelled {plan} where the rules raise {err}") from err
            assert plan == by_rules, f"rank {rt.rank}: relabelled {plan} != planned {by_rules}"
        return plan

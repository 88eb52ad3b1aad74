"""Policy application: what torch really receives for each group-creation call, and the members-agree check.

Why a room: a policy (``simnccl.policy``) is pure; applying it is the engine's job — build the request from
what the process knows (its environment, the default group's backend, its group-creation history), ask the
policy, record the decision in the rank's history, and check that every caller of one call reached the same
plan, or real torch would hang or crash (DESIGN rule 10: never trust a promise, check). A reuse decision binds
the handle to the identical group the rank made before.

Histories live in ``fast.histories``: ranks with equal histories share decisions there when the policy is one
simnccl has established decides alike on every rank (``recall``/``remember``); this room only asks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from simnccl.c10d import NON_GROUP_MEMBER, Group, Members, TorchError
from simnccl.engine.memory import Memory
from simnccl.engine.planning import Planner
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.ops import MIB, InitProcessGroup, NewGroup, PgOptions, SplitGroup
from simnccl.policy import (
    BasePolicy,
    GroupDecision,
    GroupRequest,
    History,
    InitPlan,
    InitRequest,
    Policy,
    ask_init,
    decide_group,
    decide_split,
    decides_alike_on_every_rank,
    reused_group_among,
)
from simnccl.release import Impl, ReleaseError, resolve_backend

if TYPE_CHECKING:
    from simnccl.engine.fast.histories import SharedHistories

# The error ``simnccl.torch_apply`` raises where a policy reuses a group this process no longer holds, named as the
# real tier's driver names a rank's exception (module and class: ``simnccl.real.compare.real_error_type``), so that
# the two sides of a comparison that fail alike agree (a bare "ApplyError" here read as a different error).
APPLY_ERROR_TYPE = "simnccl.torch_apply.ApplyError"


def rewritten(op: NewGroup, decision: GroupDecision) -> NewGroup:
    """The op with a (non-reuse) policy decision applied: what torch receives. A device string (``"cuda:1"``,
    which ``decision_problem`` admits) is its index: ``simnccl.torch_apply`` hands torch ``torch.device("cuda:1")``,
    equal to a default group bound to that device, as the index is here."""
    device_id = decision.device_id
    if isinstance(device_id, str):
        device_id = int(device_id.removeprefix("cuda:"))
    return replace(
        op,
        backend=decision.backend,
        pg_options=decision.pg_options,
        use_local_synchronization=decision.use_local_synchronization,
        device_id=device_id if device_id is not None else op.device_id,
    )


def policy_fake_error(policy: str, ranks: tuple[int, ...], asked: str, use: str) -> TorchError:
    """What ends a rank where a policy turned a group of several ranks (``ranks``, asked for backend ``asked``) to
    the ``fake`` backend and the program communicates there (``use``): the gate's, at a group tagged for traffic,
    and the collectives', at an op on it. A policy may make a group fake only where nothing communicates."""
    return TorchError(
        "PolicyFakeBackend",
        f"policy {policy!r} made group {list(ranks)} ({len(ranks)} ranks, asked for backend {asked}) 'fake', and "
        f"{use}: the fake backend moves no data (torch's FakeProcessGroup returns at once), so production would go "
        "on without communicating",
    )


def unchanged_decision(op: NewGroup) -> GroupDecision:
    return GroupDecision(op.backend, op.pg_options, op.use_local_synchronization, explanation="as requested")


def _init_text(plan: InitPlan, device: bool = False) -> str:
    """The plan in torch's terms; ``device``: with its ``device_id`` (one rank's own: not for every rank's line)."""
    parts = [f"backend={plan.backend or '<default>'}"]
    if device:
        parts.append(f"device_id={plan.device_id}")
    if plan.pg_options.to_dict():
        parts.append(f"pg_options={plan.pg_options.to_dict()}")
    parts += [f"{k}={v}" for k, v in sorted(plan.env.items())]
    return ", ".join(parts)


class PolicyGate:
    def __init__(
        self,
        sim: Sim,
        policy: Policy,
        memory: Memory,
        planner: Planner,
        histories: SharedHistories,
        share_decisions: bool,
    ) -> None:
        """``share_decisions``: ranks with equal histories may share a decision (the fast path is on). For a
        policy simnccl has established decides alike on every rank (its built-ins: ``verified``) the shared
        decision is taken as it is; any other policy -- every user policy -- is still asked on every calling
        rank, and its plan compared with the shared one (``confirms``): sharing saves the engine's work, never
        the check."""
        self.sim = sim
        self.release = sim.release
        self.policy = policy
        self.active = type(policy) is not BasePolicy  # torch's defaults need no gate at all
        self.verified = decides_alike_on_every_rank(policy)
        self.shares = share_decisions and self.active
        self._init_plans: tuple[int, InitPlan] | None = None  # the first rank's init plan, for the agreement check
        self.memory = memory
        self.planner = planner
        self.histories = histories
        self.explanations: list[dict[str, Any]] = []
        self._explained: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}  # call -> its explanation
        self._decisions: dict[tuple[int, tuple[int, ...]], tuple[int, GroupDecision]] = {}
        self._splits: dict[tuple[int, tuple[int, ...]], tuple[SplitGroup, list[tuple[int, ...]]]] = {}
        # id(group) -> the handles a reuse returned it to, beyond the call that created it (``reused_group``)
        self._extra_handles: dict[int, int] = {}

    def init(self, rt: RankRuntime, op: InitProcessGroup) -> InitProcessGroup:
        if self.sim.halted is not None:  # as ``decide``
            raise self.sim.halted
        plan = ask_init(
            self.policy,
            InitRequest(
                rt.rank, rt.ctx.world_size, self.release.key, rt.ctx.env, op.backend, op.device_id, op.pg_options
            ),
        )
        self._check_init_agrees(rt, plan)
        faked = rt.ctx.world_size > 1 and self._makes_fake(plan.backend, rt)
        if faked and not self._makes_fake(op.backend, rt):  # the default group made fake: an op on it fails
            self.sim.policy_faked[tuple(range(rt.ctx.world_size))] = op.backend or "the default"
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

    def _check_init_agrees(self, rt: RankRuntime, plan: InitPlan) -> None:
        """Every rank's ``init_process_group`` plan must agree on the backend, options, environment knobs and
        whether a ``device_id`` is named (which device is each rank's own), as a group's members must
        (``GroupDecision.key``): a rank on another backend or another ``TORCH_DIST_USE_NCCL2`` would hang or crash
        real torch at its first collective, and a legacy rank that names a device inits its communicator at once
        where one that does not waits for its first collective (the run hung on a store timeout, unexplained)."""
        if self._init_plans is None:
            self._init_plans = (rt.rank, plan)
            return
        other, first = self._init_plans
        mine = (plan.backend, plan.pg_options, dict(plan.env), plan.device_id is not None)
        if (first.backend, first.pg_options, dict(first.env), first.device_id is not None) != mine:
            raise TorchError(
                "PolicyInconsistency",
                f"policy {self.policy.name!r} planned init_process_group differently: rank {other}: "
                f"{_init_text(first, True)} ({first.explanation or 'as requested'}); rank {rt.rank}: "
                f"{_init_text(plan, True)} "
                f"({plan.explanation or 'as requested'})",
            )

    def _own_decision(
        self, rt: RankRuntime, op: NewGroup, members: tuple[int, ...]
    ) -> tuple[GroupRequest, GroupDecision]:
        """What this rank decides for ``op`` on its own real history (before the call is recorded)."""
        # A policy asked on every rank reads its history through the state's shared view (no per-rank copy);
        # a built-in asks only as the first rank in a state, which records into its own history next.
        histories = self.histories
        history = histories.history(rt) if self.verified else histories.view(rt)
        request = self.group_request(rt, op, members, history=history)
        return request, self.decide(request)

    def decide(self, request: GroupRequest) -> GroupDecision:
        """The policy's decision (``decide_group``), unless the run is ending (``Sim.halt``): then what ends it
        is raised instead, so a user's policy that looped until a timeout is not entered by the next rank."""
        if self.sim.halted is not None:
            raise self.sim.halted
        return decide_group(self.policy, request)

    def agrees(self, rt: RankRuntime, op: NewGroup, step: Any) -> bool:
        """For the outsider fast path: whether this rank, asked itself, reaches the shared plan (a built-in
        always does). False sends the call to the ordinary path, which raises the inconsistency there."""
        if self.verified:
            return True
        return self._own_decision(rt, op, step.request.ranks)[1].key() == step.decision.key()

    def group_request(
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
            history=history if history is not None else self.histories.history(rt),
            eager_group_mib=self.memory.pricer.eager_group_bytes(members, rt.ctx.env, op.pg_options) / MIB,
        )

    def group(self, rt: RankRuntime, op: NewGroup) -> NewGroup | None:
        """Ask the policy; check members agree; return the op torch really receives (None: reuse)."""
        members = self.planner.members(op)
        if not isinstance(members, Members):
            return op  # invalid ranks: torch raises before any policy could matter
        if op.use_local_synchronization and rt.rank not in members.index:
            return op  # returns before anything a policy could change (l.7206)
        # A built-in takes an equal history's decision as it is (its first caller decided and checked it). Any
        # other policy is asked as this rank, and checked, before anything is recorded; an equal history's
        # shared step then saves only the engine's work.
        slot = None
        if self.shares and self.verified:
            step, slot = self.histories.recall(rt, op)
            if step is not None:
                return self.effective_op(rt, op, members, step.decision, step.effective)
        request, decision = self._own_decision(rt, op, members.ranks)
        self.check_consistent(rt, request, decision)
        if self.shares and not self.verified:
            step, slot = self.histories.recall(rt, op, take=False)
            if step is not None and step.decision.device_id == decision.device_id:  # each binds its own device
                self.histories.take(rt, step)
                return self.effective_op(rt, op, members, step.decision, step.effective)
        history = self.histories.own(rt)
        history.record(request, decision)
        effective = None if decision.reuse is not None else rewritten(op, decision)
        if slot is not None:
            self.histories.remember(rt, slot, op, request, decision, effective, history)
        return self.effective_op(rt, op, members, decision, effective)

    def split(self, rt: RankRuntime, op: SplitGroup, parent: Group) -> SplitGroup | None:
        """``decide_split`` for every split of the call (all recorded, as ``apply`` does); this rank applies
        its own split's decision (or the first split's, when it is in none)."""
        splits = self._global_splits(op, parent)
        if not splits or any(len(s) != len(raw) or not s for s, raw in zip(splits, op.split_ranks, strict=True)):
            return op  # invalid: torch raises its own error
        parent_backend = parent.backend.requested
        requests = [self.group_request(rt, op, split, parent_backend) for split in splits]
        decisions = decide_split(self.policy, requests)
        own = next((i for i, split in enumerate(splits) if rt.rank in split), 0)
        self.check_consistent(rt, requests[own], decisions[own])
        history = self.histories.own(rt)
        for request, decision in zip(requests, decisions, strict=True):
            history.record(request, decision)
        mine = decisions[own]
        if mine.reuse is not None:
            if rt.rank in splits[own]:  # resolved as ``effective_op`` does
                group = self.reused_group(rt, splits[own], parent_backend, mine)
                if op.bind:
                    rt.handles[op.bind] = group
            elif op.bind:
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            return None
        return replace(op, pg_options=mine.pg_options)

    def _global_splits(self, op: SplitGroup, parent: Group) -> list[tuple[int, ...]]:
        """The call's splits in global ranks (invalid indices dropped), one list per op and parent member list,
        so every rank's requests share the tuples: what is priced and counted per member list
        (``Pricer.eager_group_bytes``) is then kept once per split, not once per rank that asks."""
        key = (id(op), parent.ranks)
        known = self._splits.get(key)
        if known is not None and known[0] is op:
            return known[1]
        splits = [tuple(parent.ranks[r] for r in split if 0 <= r < parent.size) for split in op.split_ranks]
        self._splits[key] = (op, splits)
        return splits

    def check_consistent(self, rt: RankRuntime, request: GroupRequest, decision: GroupDecision) -> None:
        """Every caller of one group-creation call must reach the same plan, or real torch hangs or crashes.

        Each call is explained once (``--explain``): as the group's first member was told, or, for a policy that
        decides alike on every rank (``verified``), as the first rank to decide was told, which is the same.
        Which rank decides first depends on the engine's path (a cohort decides as the first member, ranks on
        their own in time order), so the list must not: ``order_explanations`` sorts it by call."""
        key = (request.history.calls, request.ranks)
        seen = self._decisions.get(key)
        if seen is None:
            self._decisions[key] = (rt.rank, decision)
        if (
            self._makes_fake(decision.backend, rt)
            and not self._makes_fake(request.backend, rt)
            and len(request.ranks) > 1
        ):
            self._faked(request)
        if key not in self._explained and (self.verified or (request.member and request.ranks[0] == rt.rank)):
            entry = {
                "call": f"new_group #{request.history.calls + 1}",
                "ranks": list(request.ranks),
                "plan": decision.describe(),
                "explanation": decision.explanation,
            }
            self._explained[key] = entry
            self.explanations.append(entry)
        if seen is None:
            return
        other, first = seen
        if first.key() != decision.key():
            raise TorchError(
                "PolicyInconsistency",
                f"policy {self.policy.name!r} planned differently for group {list(request.ranks)} "
                f"(group-creation call #{request.history.calls + 1}): rank {other}: {first.describe()} "
                f"({first.explanation}); rank {rt.rank}: {decision.describe()} ({decision.explanation})",
            )

    def _faked(self, request: GroupRequest) -> None:
        """A policy turned a group of several ranks to the ``fake`` backend, which moves no data: remembered, so
        an op that communicates on it fails (``Collectives._usable_comm``); where the program tags the group
        as one it will communicate on (``traffic``), the call fails now, as the startup may never use it."""
        asked = request.backend or "the default group's"
        self.sim.policy_faked[request.ranks] = asked
        if request.traffic in ("collectives", "p2p"):
            use = f"the program tags it traffic={request.traffic!r}"
            raise policy_fake_error(self.policy.name, request.ranks, asked, use)

    def _makes_fake(self, backend: str | None, rt: RankRuntime) -> bool:
        """Whether torch's reading of a backend string (``release.resolve_backend``, the one parser: "FAKE" is
        lower-cased, "cpu:fake" is a device map) puts the fake backend on some device. A string it refuses is
        torch's error at the call, not a fake group (a policy's "FAKE" and "cpu:fake" got past ``== "fake"``)."""
        if backend is None:
            return False
        try:
            config = resolve_backend(self.release, backend, rt.ctx.env, has_cuda=rt.ctx.device_count > 0)
        except ReleaseError:
            return False
        return any(pair.impl is Impl.FAKE for pair in config.pairs)

    def order_explanations(self) -> None:
        """The explanations in call order (``init_process_group`` first), whatever order ranks decided in."""
        calls = {id(entry) for entry in self._explained.values()}
        first = [entry for entry in self.explanations if id(entry) not in calls]
        self.explanations[:] = first + [entry for _key, entry in sorted(self._explained.items())]

    def identical_group(
        self, rt: RankRuntime, ranks: tuple[int, ...], backend: str | None, options: PgOptions
    ) -> Group | None:
        """The group a reuse of ``ranks`` binds on this rank, by the rule ``simnccl.torch_apply`` binds by
        (``reused_group_among``): the same ranks, backend and options, else ranks and backend, else ranks. A
        policy composed with ``dedupe`` may change what the call dedupe reuses made (``dedupe+budget(0)`` made
        the earlier group lazy), and a team's own part after dedupe may change the reuse itself (the built-ins
        leave a reuse alone). Only groups a ``new_group`` or ``split_group`` made count, as there: never the
        default group, which no reuse names (it bound a destroyed group's reuse to the world group where real
        torch raises). None when no live group has those ranks."""
        world = rt.world
        assert world is not None
        name = (backend or world.backend.requested).lower()
        live = (
            (group.backend.requested, group.options, group)
            for group in rt.groups
            if not group.destroyed and group.ranks == ranks and group is not world
        )
        return reused_group_among(live, name, options)

    def reused_group(
        self, rt: RankRuntime, ranks: tuple[int, ...], backend: str | None, decision: GroupDecision
    ) -> Group:
        """``identical_group``, or the error ``simnccl.torch_apply`` raises where there is none (the group was
        destroyed): a member left holding no group would pass here and fail in real torch."""
        existing = self.identical_group(rt, ranks, backend, decision.pg_options)
        if existing is None:
            raise TorchError(
                APPLY_ERROR_TYPE,
                f"policy {self.policy.name!r} reuses group {list(ranks)} ({decision.explanation}), but this process "
                "holds no live group with those ranks (destroyed)",
            )
        self._extra_handles[id(existing)] = self._extra_handles.get(id(existing), 0) + 1
        return existing

    def drops_handle(self, group: Group) -> bool:
        """Whether a ``destroy_process_group`` of ``group`` only drops one of its handles: a reuse returned it
        to more than one call, and the other handles still hold it. ``simnccl.torch_apply`` counts the same
        references and skips torch's destroy then. Why: under torch's default those calls made separate groups,
        so destroying one and using another is a correct program; destroying the shared group broke it."""
        extra = self._extra_handles.get(id(group), 0)
        if not extra:
            return False
        self._extra_handles[id(group)] = extra - 1
        return True

    def destroyed(self, rt: RankRuntime, groups: list[Group], world: bool) -> None:
        """``groups`` are destroyed on this rank (``world``: the default group, and every group with it): the
        rank's history records it (``History.record_destroy``), so a policy never reuses them."""
        for group in groups:
            self._extra_handles.pop(id(group), None)
        self.histories.own(rt).record_destroy(None if world else groups[0].ranks)

    def effective_op(
        self,
        rt: RankRuntime,
        op: NewGroup,
        members: Members,
        decision: GroupDecision,
        effective: NewGroup | None = None,
    ) -> NewGroup | None:
        """The op torch receives (None: reuse, with the handle bound here); ``effective`` is
        ``rewritten(op, decision)`` when the caller has it already."""
        if decision.reuse is not None:
            # A member resolves the reuse even when the program keeps no handle: real torch returns the group
            # all the same (a reference, ``drops_handle``), or raises where there is none.
            if rt.rank in members.index:
                group = self.reused_group(rt, members.ranks, decision.backend, decision)
                if op.bind:
                    rt.handles[op.bind] = group
            elif op.bind:
                rt.handles.setdefault(op.bind, NON_GROUP_MEMBER)
            return None
        return effective if effective is not None else rewritten(op, decision)

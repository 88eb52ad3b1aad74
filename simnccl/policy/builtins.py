"""simnccl's built-in policies, their composition with ``+``, and which policies may be decided once.

Each built-in overrides one hook and explains its change (torchft style: a decision and its reason).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from simnccl.policy.plans import (
    NCCL_NAMES,
    P2P_PURPOSES,
    GroupDecision,
    GroupRequest,
    InitPlan,
    InitRequest,
    Policy,
    PolicyError,
    _because,
    ask_group,
    ask_init,
)


@dataclass(frozen=True)
class BasePolicy:
    """Changes nothing; built-ins override one hook. ``on_group`` refines the decision made so far."""

    name: str = "torch-default"
    doc: str = "change nothing: what torch does by default on this release"

    def on_init(self, request: InitRequest) -> InitPlan:
        return InitPlan(request.backend, request.device_id, request.pg_options, {}, "")

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return decision


def _creates_nccl(decision: GroupDecision, request: GroupRequest) -> bool:
    """Whether the decision so far creates an NCCL group: what the built-ins that change how one is created act
    on. A reuse creates none (``dedupe`` before them in a composition): they leave it as it is, rather than
    explain a lazy_init or a backend that nothing is created with."""
    return decision.reuse is None and (decision.backend or request.effective_backend) in NCCL_NAMES


@dataclass(frozen=True)
class LegacyPolicy(BasePolicy):
    name: str = "legacy"
    doc: str = "roll back to the legacy lazy backend (TORCH_DIST_USE_NCCL2=0); survives one more release"

    def on_init(self, request: InitRequest) -> InitPlan:
        if request.release == "2.14":
            return InitPlan(request.backend, request.device_id, request.pg_options, {}, "2.14 is legacy already")
        return InitPlan(
            request.backend,
            request.device_id,
            request.pg_options,
            {"TORCH_DIST_USE_NCCL2": "0"},
            "TORCH_DIST_USE_NCCL2=0: 'nccl' resolves to the legacy ProcessGroupNCCL, lazy until first use",
        )


def _lazy_supported(release: str) -> bool:
    return release != "2.14"


@dataclass(frozen=True)
class LazyInitPolicy(BasePolicy):
    name: str = "lazy-init"
    doc: str = "lazy_init on every NCCL group (and the default group): a group pays only when first used"

    def on_init(self, request: InitRequest) -> InitPlan:
        if not _lazy_supported(request.release):
            return InitPlan(request.backend, request.device_id, request.pg_options, {}, "2.14 has no lazy_init")
        if request.backend is not None and "nccl" not in request.backend:
            return InitPlan(request.backend, request.device_id, request.pg_options, {}, "not an NCCL backend")
        options = replace(request.pg_options, lazy_init=True)
        return InitPlan(request.backend, request.device_id, options, {}, "lazy_init on the default group")

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if not _lazy_supported(request.release) or not _creates_nccl(decision, request):
            return decision
        return _because(
            decision, "lazy_init: created at first use", pg_options=replace(decision.pg_options, lazy_init=True)
        )


@dataclass(frozen=True)
class LazySingleRankPolicy(BasePolicy):
    name: str = "lazy-single-rank"
    doc: str = "PR #203904: lazy_init for single-rank groups when no device is requested"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) != 1 or decision.device_id is not None or not _creates_nccl(decision, request):
            return decision
        if not _lazy_supported(request.release):
            return decision
        return _because(
            decision,
            "single-rank group: lazy_init (PR #203904)",
            pg_options=replace(decision.pg_options, lazy_init=True),
        )


@dataclass(frozen=True)
class SkipSingleRankPolicy(BasePolicy):
    name: str = "skip-single-rank"
    doc: str = "size-1 groups get no NCCL communicator (a fake group: every collective is a local no-op)"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) != 1 or not _creates_nccl(decision, request):
            return decision
        return _because(
            decision, "single-rank group needs no communication: fake backend (sglang#35538)", backend="fake"
        )


@dataclass(frozen=True)
class NcclLazyP2PPolicy(BasePolicy):
    name: str = "nccl-lazy-p2p"
    doc: str = "pipeline / p2p groups on nccl-lazy: pair communicators only for peers that really talk"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        p2p = request.traffic == "p2p" or (request.traffic is None and request.purpose in P2P_PURPOSES)
        if not p2p or not _creates_nccl(decision, request):
            return decision
        return _because(decision, f"p2p traffic ({request.purpose or request.traffic}): nccl-lazy", backend="nccl-lazy")


@dataclass(frozen=True)
class ShareResourcesPolicy(BasePolicy):
    name: str = "share-resources"
    doc: str = "NCCL_COMM_SPLIT_SHARE_RESOURCES=1: split children share the parent's buffers (unsafe concurrently)"

    def on_init(self, request: InitRequest) -> InitPlan:
        return InitPlan(
            request.backend,
            request.device_id,
            request.pg_options,
            {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"},
            "NCCL_COMM_SPLIT_SHARE_RESOURCES=1: split children share the parent's resources",
        )


@dataclass(frozen=True)
class DedupePolicy(BasePolicy):
    """A group this process destroyed is never reused (``History.record_destroy``): an equal later call creates
    it anew. Two handles of one reused group are two references: destroying one leaves the group to the other,
    and the group is destroyed with its last handle (the simulator's ``PolicyGate`` and ``simnccl.torch_apply``
    count them alike), so a program that destroys one of two equal groups and keeps using the other runs as
    under torch's default."""

    name: str = "dedupe"
    doc: str = "identical rank sets (same backend and options) reuse the first group, e.g. DeviceMesh duplicates"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if decision.reuse is not None or decision.use_local_synchronization:
            return decision
        key = (request.ranks, decision.backend or "", decision.pg_options)
        history = request.history
        first = history.created.get(key)
        if first is None and key[1:] == (request.backend or "", request.pg_options):
            # Deciding on the call as asked (dedupe first in a composition): an equal earlier call counts even
            # where a later part changed what it created (lazy_init, a backend); the reuse finds that group.
            first = history.requested.get(key)
        if first is None:
            if (
                history.destroyed and frozenset(request.ranks) in history.destroyed
            ):  # said, because a non-member of it cannot know (see History)
                return _because(decision, f"group {list(request.ranks)} was destroyed in this process: created anew")
            return decision
        return _because(decision, f"identical to group-creation call #{first}: reused", reuse=request.ranks)


@dataclass(frozen=True)
class BudgetPolicy(BasePolicy):
    """Eager while every member stays within a modelled per-device budget, lazy after.

    Consistent by construction: the budget is checked for *every member* from the world-wide history of
    calls, which every rank sees identically, so all members reach the same decision.
    """

    name: str = "budget"
    doc: str = "eager while a modelled per-device budget allows, lazy_init after"
    max_mib_per_device: float = 2048.0
    # MiB every eager group costs (a team's own figure: the budget then caps a count, X // per groups); None:
    # each group at its request's ``eager_group_mib`` (the profile of the GPU kind, by the group's layout).
    per_group_mib: float | None = None

    def group_mib(self, request: GroupRequest) -> float:
        """The price of this eager group: the explicit figure, else the profile's for its layout."""
        per = self.per_group_mib if self.per_group_mib is not None else request.eager_group_mib
        if per is None:
            raise PolicyError(
                f"budget({self.max_mib_per_device:g}) needs the cost of one eager communicator on this device: "
                f"give it as budget({self.max_mib_per_device:g},MiB), or tell apply() the GPU kind "
                "(apply(policy, gpu='h100-80gb')) so it is read from that kind's profile"
            )
        return per

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if not _lazy_supported(request.release) or not _creates_nccl(decision, request):
            return decision
        if decision.pg_options.lazy_init:
            return decision
        per = self.group_mib(request)
        history = request.history
        worst = max((history.eager_by_rank.get(r, 0) for r in request.ranks), default=0)
        if self.per_group_mib is not None:  # every group at one figure: a count
            wanted = f"{worst + 1} x {per:g} MiB"
            fits = (worst + 1) * per <= self.max_mib_per_device
        else:  # each group at its own price: what the members' earlier eager groups cost, summed
            spent = max((history.eager_mib_by_rank.get(r, 0.0) for r in request.ranks), default=0.0)
            # Said as a count where every group so far cost this one's price (always with connections made at
            # first use, the default).
            uniform = spent == worst * per
            wanted = f"{worst + 1} x {per:g} MiB" if uniform else f"{spent:g} MiB held + {per:g} MiB"
            fits = spent + per <= self.max_mib_per_device
        if fits:
            return _because(decision, f"budget: eager ({wanted} <= {self.max_mib_per_device:g} MiB)")
        return _because(
            decision,
            f"budget: {wanted} would exceed {self.max_mib_per_device:g} MiB: lazy_init",
            pg_options=replace(decision.pg_options, lazy_init=True),
        )


@dataclass(frozen=True)
class ComposedPolicy:
    """``a+b``: each refines the decision of the ones before it; init plans merge (later env wins)."""

    parts: tuple[Policy, ...]

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    @property
    def doc(self) -> str:
        return "; then ".join(getattr(p, "doc", p.name) for p in self.parts)

    def on_init(self, request: InitRequest) -> InitPlan:
        plan = InitPlan(request.backend, request.device_id, request.pg_options, {}, "")
        for part in self.parts:
            request = _with_plan(request, plan)
            step = ask_init(part, request)  # a part that raises or answers no plan is named, not the composition
            explanation = "; ".join(t for t in (plan.explanation, step.explanation) if t)
            plan = InitPlan(step.backend, step.device_id, step.pg_options, {**plan.env, **step.env}, explanation)
        return plan

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        for part in self.parts:
            # A part that raises or answers no decision is named, not the composition: a user's part that
            # returned None was reported as the next part's AttributeError.
            decision = ask_group(part, request, decision)
        return decision


def _with_plan(request: InitRequest, plan: InitPlan) -> InitRequest:
    """The request the next part of a composed policy sees: the plan's arguments so far (the request itself
    where the plan passed them through, which most parts do)."""
    if (
        plan.backend is request.backend
        and plan.device_id is request.device_id
        and plan.pg_options is request.pg_options
    ):
        return request
    return replace(request, backend=plan.backend, device_id=plan.device_id, pg_options=plan.pg_options)


# Wrapper types of simnccl's own whose decisions are their inner policy's, made rank-independently:
# type -> the attribute holding the inner policy (``simnccl.real.lanes.CpuLanePolicy`` registers itself).
TRUSTED_WRAPPERS: dict[type, str] = {}


def decides_alike_on_every_rank(policy: object) -> bool:
    """Whether the simulator may decide a group-creation call once and give every caller that plan.

    True only for simnccl's built-in policy classes (exact types, not subclasses: an override may look at
    ``request.rank``), compositions of them and simnccl's own wrappers around them. Their rank independence
    is established by simnccl's tests, which run them on the per-rank path and on the shared path and
    compare traces. Any other policy -- every user policy -- is asked on every calling rank and the plans
    are compared (``PolicyInconsistency``); no attribute a policy sets can switch that check off.
    """
    kind = type(policy)
    if kind in _BUILTIN_TYPES:
        return True
    if kind is ComposedPolicy:
        return all(decides_alike_on_every_rank(part) for part in policy.parts)  # type: ignore[attr-defined]
    attribute = TRUSTED_WRAPPERS.get(kind)
    return attribute is not None and decides_alike_on_every_rank(getattr(policy, attribute))


BUILTIN: dict[str, Callable[[], Policy]] = {
    "torch-default": BasePolicy,
    "legacy": LegacyPolicy,
    "lazy-init": LazyInitPolicy,
    "lazy-single-rank": LazySingleRankPolicy,
    "skip-single-rank": SkipSingleRankPolicy,
    "nccl-lazy-p2p": NcclLazyP2PPolicy,
    "share-resources": ShareResourcesPolicy,
    "dedupe": DedupePolicy,
    "budget": BudgetPolicy,
}

_BUILTIN_TYPES: frozenset[type] = frozenset(BUILTIN.values())  # type: ignore[arg-type]

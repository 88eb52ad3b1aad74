"""Group-creation policies: pure decisions, shared by the simulator and by real torch (``apply``).

A policy answers two questions, in torch's own terms, each with a one-line explanation (torchft style):

* at ``init_process_group``: which backend, which ``device_id``, which process-environment knobs
  (``TORCH_DIST_USE_NCCL2``, ``NCCL_COMM_SPLIT_SHARE_RESOURCES``, ...), which ``pg_options``;
* at each ``new_group`` / ``split_group``: which backend, which ``pg_options`` (``lazy_init``,
  ``split_share``, ...), ``use_local_synchronization``, ``device_id`` — or "no new communicator": reuse an
  identical group this process already created.

Why pure (DESIGN rule 2): the same object decides in the simulator and in production, so it may import
neither simpy nor torch, and it sees only what a real process sees when it calls ``new_group``: the ranks,
its own rank, the release, the environment, and the history of group-creation calls *it* made. Every rank
calls ``new_group`` for every group in the same order (unless ``use_local_synchronization``), so a policy that
derives its decision from that history decides the same on every member — and the simulator checks that it
does (a policy whose members disagree would hang or crash real torch).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from simnccl.ops import NO_OPTIONS, PgOptions

TRAFFIC_KINDS = ("collectives", "p2p", "none")
P2P_PURPOSES = ("pp", "pipeline", "p2p", "embedding")
NCCL_NAMES = ("nccl", "nccl2", "nccl-lazy", "nccl-legacy")


class PolicyError(ValueError):
    """An unknown policy name or malformed policy spec."""


@dataclass(frozen=True, slots=True)
class InitRequest:
    """What a process knows when it calls ``init_process_group``."""

    rank: int
    world_size: int
    release: str
    env: Mapping[str, str]
    backend: str | None
    device_id: int | str | None
    pg_options: PgOptions = NO_OPTIONS


@dataclass(frozen=True, slots=True)
class InitPlan:
    """How ``init_process_group`` is really called: arguments plus environment knobs set before it."""

    backend: str | None
    device_id: int | str | None
    pg_options: PgOptions
    env: Mapping[str, str] = field(default_factory=dict)
    explanation: str = ""


@dataclass(slots=True)
class History:
    """The group-creation calls this process has seen, with the aggregates built-in policies need.

    Maintained by the caller (simulator or ``apply``) in call order, O(members) per call. It is the same on
    every rank that made the same calls, which is what keeps history-based decisions consistent.
    """

    calls: int = 0
    eager_by_rank: dict[int, int] = field(default_factory=dict)
    created: dict[tuple[tuple[int, ...], str, PgOptions], int] = field(default_factory=dict)
    digest: int = 0  # a running hash of every recorded call: equal histories compare in O(1)

    def record(self, request: GroupRequest, decision: GroupDecision) -> None:
        """Add one call (made by this process, member or not) and what was decided for it."""
        self.calls += 1
        self.digest = hash((self.digest, request.kind, request.ranks, request.backend, decision.key()))
        if decision.reuse is not None:
            return
        key = (request.ranks, decision.backend or "", decision.pg_options)
        self.created.setdefault(key, self.calls)
        if creates_eager_nccl(request, decision):
            for r in request.ranks:
                self.eager_by_rank[r] = self.eager_by_rank.get(r, 0) + 1

    def copy(self) -> History:
        return History(self.calls, dict(self.eager_by_rank), dict(self.created), self.digest)


def creates_eager_nccl(request: GroupRequest, decision: GroupDecision) -> bool:
    """Whether this decision allocates an NCCL communicator at creation (the cost budget counts)."""
    backend = decision.backend or request.effective_backend
    if decision.reuse is not None or decision.pg_options.lazy_init or request.release == "2.14":
        return False
    if backend == "nccl-legacy" or (backend == "nccl" and request.env.get("TORCH_DIST_USE_NCCL2") == "0"):
        return False
    return backend in NCCL_NAMES


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """What a process knows when it calls ``new_group`` (or ``split_group``, with its own split's ranks)."""

    kind: str
    ranks: tuple[int, ...]
    rank: int
    world_size: int
    release: str
    env: Mapping[str, str]
    backend: str | None
    pg_options: PgOptions
    use_local_synchronization: bool
    purpose: str | None
    traffic: str | None
    history: History
    # What one eagerly created communicator costs this process's device at creation, in MiB, from the simnccl
    # profile of its GPU kind and torch release (``CommCosts.eager_group_mib``); None where nobody said.
    eager_group_mib: float | None = None

    @property
    def member(self) -> bool:
        return self.rank in self.ranks

    @property
    def effective_backend(self) -> str:
        """The backend name torch will use. Callers fill ``backend`` with the default group's name when the
        program passed none (as torch does); ``nccl`` is assumed only if they could not."""
        return self.backend or "nccl"


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """A plan in torch's terms. ``reuse`` = the ranks of an identical earlier group to return instead."""

    backend: str | None
    pg_options: PgOptions
    use_local_synchronization: bool
    device_id: int | None = None
    reuse: tuple[int, ...] | None = None
    explanation: str = ""

    def key(self) -> tuple[object, ...]:
        """What members must agree on (explanations may differ)."""
        return (self.backend, self.pg_options, self.use_local_synchronization, self.device_id, self.reuse)

    def describe(self) -> str:
        if self.reuse is not None:
            return f"reuse group {list(self.reuse)}"
        parts = [f"backend={self.backend or '<default>'}"]
        options = self.pg_options.to_dict()
        if options:
            parts.append(f"pg_options={options}")
        if self.use_local_synchronization:
            parts.append("use_local_synchronization=True")
        return ", ".join(parts)


def unchanged(request: GroupRequest) -> GroupDecision:
    return GroupDecision(request.backend, request.pg_options, request.use_local_synchronization)


class Policy(Protocol):
    name: str

    def on_init(self, request: InitRequest) -> InitPlan: ...

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision: ...


@dataclass(frozen=True)
class BasePolicy:
    """Changes nothing; built-ins override one hook. ``on_group`` refines the decision made so far."""

    name: str = "torch-default"
    doc: str = "change nothing: what torch does by default on this release"

    def on_init(self, request: InitRequest) -> InitPlan:
        return InitPlan(request.backend, request.device_id, request.pg_options, {}, "")

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return decision


def _is_nccl(decision: GroupDecision, request: GroupRequest) -> bool:
    return (decision.backend or request.effective_backend) in NCCL_NAMES


def _because(decision: GroupDecision, text: str, **changes: object) -> GroupDecision:
    explanation = f"{decision.explanation}; {text}" if decision.explanation else text
    return replace(decision, explanation=explanation, **changes)


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
        if not _lazy_supported(request.release) or not _is_nccl(decision, request):
            return decision
        return _because(
            decision, "lazy_init: created at first use", pg_options=replace(decision.pg_options, lazy_init=True)
        )


@dataclass(frozen=True)
class LazySingleRankPolicy(BasePolicy):
    name: str = "lazy-single-rank"
    doc: str = "PR #203904: lazy_init for single-rank groups when no device is requested"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) != 1 or decision.device_id is not None or not _is_nccl(decision, request):
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
        if len(request.ranks) != 1 or not _is_nccl(decision, request):
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
        if not p2p or not _is_nccl(decision, request):
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
    name: str = "dedupe"
    doc: str = "identical rank sets (same backend and options) reuse the first group, e.g. DeviceMesh duplicates"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if decision.reuse is not None or decision.use_local_synchronization:
            return decision
        key = (request.ranks, decision.backend or "", decision.pg_options)
        first = request.history.created.get(key)
        if first is None:
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
    # MiB one eager group costs; None: the request's ``eager_group_mib`` (the profile of the process's GPU kind).
    per_group_mib: float | None = None

    def group_mib(self, request: GroupRequest) -> float:
        """The price of one eager group: the explicit figure, else the profile's for this device."""
        per = self.per_group_mib if self.per_group_mib is not None else request.eager_group_mib
        if per is None:
            raise PolicyError(
                f"budget({self.max_mib_per_device:g}) needs the cost of one eager communicator on this device: "
                f"give it as budget({self.max_mib_per_device:g},MiB), or tell apply() the GPU kind "
                "(apply(policy, gpu='h100-80gb')) so it is read from that kind's profile"
            )
        return per

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if not _lazy_supported(request.release) or not _is_nccl(decision, request) or decision.reuse is not None:
            return decision
        if decision.pg_options.lazy_init:
            return decision
        per = self.group_mib(request)
        worst = max((request.history.eager_by_rank.get(r, 0) for r in request.ranks), default=0)
        if (worst + 1) * per <= self.max_mib_per_device:
            return _because(decision, f"budget: eager ({worst + 1} x {per:g} MiB <= {self.max_mib_per_device:g} MiB)")
        return _because(
            decision,
            f"budget: {worst + 1} x {per:g} MiB would exceed {self.max_mib_per_device:g} MiB: lazy_init",
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
            step = part.on_init(request)
            explanation = "; ".join(t for t in (plan.explanation, step.explanation) if t)
            plan = InitPlan(step.backend, step.device_id, step.pg_options, {**plan.env, **step.env}, explanation)
        return plan

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        for part in self.parts:
            decision = part.on_group(request, decision)
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


def decide_group(policy: Policy, request: GroupRequest) -> GroupDecision:
    """The policy's full decision for one call, starting from "as the program asked"."""
    decision = policy.on_group(request, unchanged(request))
    if not decision.explanation:
        decision = replace(decision, explanation="as requested")
    return decision


def decide_split(policy: Policy, requests: list[GroupRequest]) -> list[GroupDecision]:
    """Decisions for every split of one ``split_group`` call (all are recorded, so histories stay equal).

    ``split_group`` can express less than ``new_group``: the child keeps the parent's backend, has no
    ``use_local_synchronization`` and inherits the parent's device; and it is collective over the parent,
    so a split can be reused only if every split of the call is.
    """
    decisions = []
    for request in requests:
        decision = decide_group(policy, request)
        if decision.backend not in (None, request.backend):
            decision = _because(
                decision,
                f"split_group keeps the parent's backend: {decision.backend} not applied",
                backend=request.backend,
            )
        if decision.use_local_synchronization:
            decision = _because(
                decision, "split_group has no use_local_synchronization", use_local_synchronization=False
            )
        if decision.device_id is not None:
            decision = _because(decision, "split_group inherits the parent's device", device_id=None)
        decisions.append(decision)
    if not all(d.reuse is not None for d in decisions):
        decisions = [
            _because(d, "split_group is collective over the parent and other splits create groups: created", reuse=None)
            if d.reuse is not None
            else d
            for d in decisions
        ]
    return decisions


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

_BUDGET = re.compile(r"^budget\((?P<mib>[0-9]+(?:\.[0-9]+)?)(?:,(?P<per>[0-9]+(?:\.[0-9]+)?))?\)$")


def get_policy(spec: str) -> Policy:
    """``"legacy"``, ``"dedupe+lazy-single-rank"``, ``"budget(2048)"``, ``"budget(2048,231.1)"``."""
    parts: list[Policy] = []
    for raw in spec.replace(" ", "").split("+"):
        match = _BUDGET.match(raw)
        if match:
            per = match.group("per")
            parts.append(
                BudgetPolicy(
                    max_mib_per_device=float(match.group("mib")), **({"per_group_mib": float(per)} if per else {})
                )
            )
        elif raw in BUILTIN:
            parts.append(BUILTIN[raw]())
        else:
            known = ", ".join([*BUILTIN, "budget(MiB)", "budget(MiB,per_group_MiB)"])
            raise PolicyError(f"unknown policy {raw!r} in {spec!r}; expected one of {known}, joined with '+'")
    if not parts:
        raise PolicyError("empty policy spec")
    return parts[0] if len(parts) == 1 else ComposedPolicy(tuple(parts))


def apply(policy: Policy | str, *, release: str | None = None, gpu: str | None = None):
    """Route ``torch.distributed`` group creation through ``policy`` in this process (real torch).

    A context manager (``with apply("legacy"): ...``); ``simnccl.torch_apply`` also offers ``install``/
    ``uninstall``. ``gpu`` (a simnccl GPU kind) lets cost-aware policies such as ``budget(X)`` price a group
    from that kind's profile. Imported lazily so that importing simnccl never imports torch.
    """
    from simnccl.torch_apply import apply as _apply

    return _apply(get_policy(policy) if isinstance(policy, str) else policy, release=release, gpu=gpu)

"""ACME's group-creation policies: the same objects drive the simulator in CI and real torch in production
(``simnccl.torch_apply.apply(CappedEager())`` around the startup code)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simnccl.policy import NCCL_NAMES, BasePolicy, GroupDecision, GroupRequest


def _can_be_lazy(request: GroupRequest, decision: GroupDecision) -> bool:
    nccl = (decision.backend or request.effective_backend) in NCCL_NAMES
    return nccl and request.release != "2.14" and decision.reuse is None and not decision.pg_options.lazy_init


@dataclass(frozen=True)
class CappedEager(BasePolicy):
    """At most ``max_eager`` eager NCCL groups per rank at startup, ``lazy_init`` after.

    Correct: it decides from the call and the group-creation history, which every rank shares, so every
    member of a group reaches the same plan.
    """

    name: str = "acme-capped-eager"
    max_eager: int = 3

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if not _can_be_lazy(request, decision):
            return decision
        worst = max((request.history.eager_by_rank.get(r, 0) for r in request.ranks), default=0)
        if worst < self.max_eager:
            return decision
        options = replace(decision.pg_options, lazy_init=True)
        return replace(decision, pg_options=options, explanation=f"{worst} eager groups already: lazy_init")


@dataclass(frozen=True)
class TightRanksLazy(BasePolicy):
    """Wrong on purpose: "the upper half of the ranks is short of memory, make their groups lazy".

    The plan depends on the calling rank, so a group spanning both halves gets two plans: on real torch an
    eager member waits in ``ncclCommSplit`` for a lazy one that never comes. simnccl must catch it.
    """

    name: str = "acme-tight-ranks-lazy"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if not _can_be_lazy(request, decision) or request.rank < request.world_size // 2:
            return decision
        return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True), explanation="tight rank")

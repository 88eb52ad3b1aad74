"""Policies as a team would write them, for the tests of naming, checking and replaying users' own policies.

Imported by spec (``user_policies:Name``) with ``tests/`` on ``sys.path`` (pytest puts it there).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from simnccl.policy import BasePolicy, DedupePolicy, GroupDecision, GroupRequest, InitPlan, InitRequest, Policy


@dataclass(frozen=True)
class LazyAbove(BasePolicy):
    """Correct: groups larger than ``max_eager_ranks`` get lazy_init (decided from the call only)."""

    name: str = "lazy-above"
    max_eager_ranks: int = 2

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) <= self.max_eager_ranks:
            return decision
        return replace(
            decision,
            pg_options=replace(decision.pg_options, lazy_init=True),
            explanation=f"{len(request.ranks)} ranks > {self.max_eager_ranks}: lazy",
        )


@dataclass(frozen=True)
class LastMemberLazy(BasePolicy):
    """Wrong: the last member of a group decides lazy, the others eager (members disagree). It also *claims*
    rank independence with a plain class attribute, which the harness must not trust."""

    name: str = "last-member-lazy"
    rank_independent = True  # not a field: a bare promise

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) > 1 and request.rank == request.ranks[-1]:
            return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True), explanation="last: lazy")
        return decision


@dataclass(frozen=True)
class SkewedDedupe(DedupePolicy):
    """Wrong, and a subclass of a built-in: odd ranks never dedupe."""

    name: str = "skewed-dedupe"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if request.rank % 2:
            return decision
        return super().on_group(request, decision)


LAZY_ABOVE_FOUR = LazyAbove(max_eager_ranks=4)  # a module-level instance, named by spec

CALLS: list[str] = []


def not_a_policy() -> None:
    """A function: a spec naming it must be refused without calling it."""
    CALLS.append("called")


class NeedsArguments(BasePolicy):
    def __init__(self, budget: float) -> None:
        self.budget = budget


@dataclass(frozen=True)
class HalfLegacy(BasePolicy):
    """Wrong: the lower half of the ranks rolls back to the legacy backend, the upper half keeps nccl2."""

    name: str = "half-legacy"

    def on_init(self, request: InitRequest) -> InitPlan:
        env = {"TORCH_DIST_USE_NCCL2": "0"} if request.rank < request.world_size // 2 else {}
        return InitPlan(request.backend, request.device_id, request.pg_options, env, "lower half: legacy")


@dataclass(frozen=True)
class OwnDevice(BasePolicy):
    """Correct: each rank binds its own device (device_id differs per rank by nature)."""

    name: str = "own-device"

    def on_init(self, request: InitRequest) -> InitPlan:
        return InitPlan(request.backend, request.rank, request.pg_options, {}, "device_id = rank")


class ProtocolOnly(Policy):
    """Wrong: subclasses the ``Policy`` protocol, whose hooks are stubs returning None."""

    name = "protocol-only"


class UnnamedSubclass(BasePolicy):
    """Wrong: ``name = ...`` without @dataclass keeps BasePolicy's field value, 'torch-default'."""

    name = "unnamed-subclass"


@dataclass(frozen=True)
class WrongHookName(BasePolicy):
    """Wrong: ``decide`` is no hook; the policy would run as torch's defaults under the name 'wrong-hook-name'."""

    name: str = "wrong-hook-name"

    def decide(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True))


@dataclass(frozen=True)
class ExitsOnGroup(BasePolicy):
    """A policy that calls ``sys.exit(0)`` in a hook (a leftover debugging exit): not a run that passed."""

    name: str = "exits-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        sys.exit(0)


@dataclass(frozen=True)
class InterruptedOnGroup(BasePolicy):
    """Ctrl-C arriving while a hook runs."""

    name: str = "interrupted-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        raise KeyboardInterrupt


class PolicyAbort(BaseException):
    """A team's own BaseException (not an Exception), as some code bases use to unwind."""


@dataclass(frozen=True)
class RaisesBaseExceptionOnInit(BasePolicy):
    name: str = "raises-base-exception-on-init"

    def on_init(self, request: InitRequest) -> InitPlan:
        raise PolicyAbort("unwind")


@dataclass(frozen=True)
class RaisesOnGroup(BasePolicy):
    """A policy with a bug: raises for any group of more than one rank."""

    name: str = "raises-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) > 1:
            raise RuntimeError("team policy bug")
        return decision


@dataclass(frozen=True)
class ReturnsNothing(BasePolicy):
    """A policy with a bug: forgets to return the decision."""

    name: str = "returns-nothing"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        replace(decision, reuse=False)
        return None  # type: ignore[return-value]


@dataclass(frozen=True)
class RaisesOnInit(BasePolicy):
    name: str = "raises-on-init"

    def on_init(self, request: InitRequest) -> InitPlan:
        raise KeyError("MASTER_ADDR")

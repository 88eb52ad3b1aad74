"""Replaying a capture made under a policy: the recorded calls are the policy's decisions, not requests.

Why: ``simnccl capture --policy X`` runs each rank under ``simnccl.torch_apply.apply(X)``, and what it records is
torch's functions as the policy called them — ``lazy_init``, the backend, ``device_id``, a reuse — not what the
captured code asked for. Replaying those Programs under ``X`` again asked ``X`` about its own output: a policy
that is not idempotent (one that flips ``lazy_init`` on some ranks) turned each decision back, and a startup
whose ranks really disagreed (eager on some, lazy on others: a hang on real torch) was simulated as agreeing
and passed. ``as-captured(X)`` replays them as they were decided: every recorded call is taken as it stands,
and each rank's ``init_process_group`` gets the environment knobs ``X`` set there (which no recorded op holds:
``torch_apply`` sets them in the process). Its plans are those calls, so it is never trusted to decide alike on
every rank: each member's plan is compared (``PolicyInconsistency`` where the recorded calls disagree).
"""

from __future__ import annotations

from dataclasses import dataclass

from simnccl.policy.plans import GroupDecision, GroupRequest, InitPlan, InitRequest, Policy, ask_init

SPEC_PREFIX = "as-captured("


@dataclass(frozen=True)
class AsCaptured:
    """The calls a capture under ``inner`` recorded, replayed as decided; ``inner`` only for its init env knobs."""

    inner: Policy

    @property
    def name(self) -> str:
        return f"as-captured({self.inner.name})"

    def on_init(self, request: InitRequest) -> InitPlan:
        """The recorded call as it stands, with the knobs ``inner`` sets in the rank's environment (its
        ``on_init`` asked about the recorded call: what it set in the capture, for any policy whose knobs do not
        depend on the options it chose itself)."""
        plan = ask_init(self.inner, request)  # the inner policy's error is named as its own
        return InitPlan(
            request.backend,
            request.device_id,
            request.pg_options,
            dict(plan.env),
            f"as captured under {self.inner.name}" + (f"; {plan.explanation}" if plan.env else ""),
        )

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        """The recorded call as it stands: it is ``inner``'s decision already."""
        return decision

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


def captured_policy(spec: str) -> str | None:
    """The policy an ``as-captured(...)`` spec replays a capture of (its inner spec); None for any other spec
    (``as-captured(a)+b(c)`` too: its parentheses do not enclose the rest)."""
    compact = spec.replace(" ", "")
    if not (compact.startswith(SPEC_PREFIX) and compact.endswith(")")):
        return None
    inner = compact[len(SPEC_PREFIX) : -1]
    depth = 0
    for char in inner:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return None
    return inner if depth == 0 else None


def replayed_as(captured: str, other: str) -> str:
    """The policy a run of a capture's steps (its policy ``captured``, an ``as-captured(...)`` spec) takes where
    ``other`` is asked for in its place (``--policy``, a variant's ``policy``): ``captured`` itself where ``other``
    names it or the policy it replays; ``ValueError`` for any other, which would be asked about that policy's
    decisions as if they were the code's requests (a policy that is not idempotent turns them back: a false
    pass). Found by a tester: ``simnccl run captured.toml --policy SPEC`` swapped the replay for the policy."""
    inner = captured_policy(captured)
    if inner is None or other.replace(" ", "") in (captured.replace(" ", ""), inner):
        return captured if inner is not None else other
    raise ValueError(
        f"the steps were captured under policy {inner!r} (policy = {captured!r}): they are its decisions, not the "
        f"code's requests, and policy {other!r} would decide them again; capture the code again under it "
        f"(simnccl capture --policy {other} ...)"
    )

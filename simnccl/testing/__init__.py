"""Testing support: a one-call simulation harness (strategies and invariant checkers land with the policy issue)."""

from simnccl.testing.harness import simulate, used_mib

__all__ = ["simulate", "used_mib"]

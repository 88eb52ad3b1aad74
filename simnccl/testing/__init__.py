"""Testing support for users' own suites.

* ``simulate`` / ``used_mib`` (``simnccl.testing.harness``): one call, one simulation;
* ``simnccl.testing.strategies``: hypothesis strategies for clusters, releases, env knobs, policies (the
  built-ins and a team's own) and valid SPMD programs; ``mutants`` for programs broken in a known way;
* ``simnccl.testing.invariants``: one checker per property, each returning a verdict with an explanation;
* ``simnccl.testing.stateful.GrowingProgram`` (also ``simnccl.testing.GrowingProgram``): a
  ``RuleBasedStateMachine`` base for stateful tests of a policy;
* ``simnccl.testing.plugin``: the pytest plugin (fixtures, profiles, replayable failures, program counts);
* ``python -m simnccl.testing.replay CASE.json``: replay a failing case and re-run its check.

Importing this package needs neither hypothesis nor pytest; the modules that do import them on use.
"""

from typing import Any

from simnccl.testing.harness import simulate, used_mib

__all__ = ["GrowingProgram", "simulate", "used_mib"]


def __getattr__(name: str) -> Any:
    if name == "GrowingProgram":  # imports hypothesis: only when asked for
        from simnccl.testing.stateful import GrowingProgram

        return GrowingProgram
    raise AttributeError(f"module 'simnccl.testing' has no attribute {name!r}")

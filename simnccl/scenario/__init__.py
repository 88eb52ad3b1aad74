"""Scenario files: TOML in, a validated ``Scenario`` out, or an error naming the file, the key and the expectation.

The package's rooms: ``model`` (the types), ``reader`` (typed access to untrusted tables), ``load`` (the file and
its top-level tables; the schema is in its docstring), ``variants`` (releases, policies, profiles, the matrix),
``steps`` (workload expansion), ``expectations`` and ``fault_table``.
"""

from simnccl.scenario.load import exceeded_depth, load_scenario, parse_scenario
from simnccl.scenario.model import LAUNCHERS, VERDICTS, Expectation, FaultSwarm, Scenario, ScenarioError, Variant

__all__ = [
    "LAUNCHERS",
    "VERDICTS",
    "Expectation",
    "FaultSwarm",
    "Scenario",
    "ScenarioError",
    "Variant",
    "exceeded_depth",
    "load_scenario",
    "parse_scenario",
]

"""What a scenario file becomes: the validated ``Scenario``, its variants, expectations and the error type.

Why a module of its own: runners, the real tier, sweeps and reports read these types and nothing else of the
parser; they need not import TOML handling to name a ``Variant``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simnccl.cluster import Cluster
from simnccl.faults import (
    NO_FAULTS,
    FaultSchedule,
)
from simnccl.ops import (
    Program,
)
from simnccl.profiles import Profile

LAUNCHERS = ("torchrun", "spawn")
VERDICTS = ("pass", "fail", "hang", "error")


class ScenarioError(ValueError):
    """Bad scenario input: the message names the file, the key and what was expected."""

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"{source}: {key}: {message}" if key else f"{source}: {message}")
        self.source = source
        self.key = key


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    description: str
    release: str
    profile: Profile
    env: Mapping[str, str]
    policy: str


@dataclass(frozen=True, slots=True)
class Expectation:
    variants: tuple[str, ...]
    checkpoint: str | None = None
    baseline: str | None = None
    used_mib: float | None = None
    tolerance_pct: float | None = None
    tolerance_mib: float | None = None
    devices: tuple[str, ...] = ()
    verdict: str | None = None
    error_contains: str | None = None
    hang_ranks: tuple[int, ...] | None = None
    detected_at_s: float | None = None
    tolerance_s: float = 1e-6
    key: str = ""
    committed_steps: int | None = None  # recovery runs (simnccl.recovery)
    lost_steps: int | None = None
    replacement_devices: tuple[str, ...] | None = None
    fault_detected_at_s: float | None = None
    error_at_s: float | None = None  # when the first rank failed (an abort at init has no hang to detect)
    fr_dump_ranks: tuple[int, ...] | None = None  # ranks that wrote a flight-recorder dump; () asserts none did


@dataclass(frozen=True, slots=True)
class FaultSwarm:
    """How ``[faults]`` generated its schedule (``seed``, ``classes``, ``max_faults``), after the injected faults:
    kept so that ``--seed`` can draw the swarm again (``simnccl.cli_options``)."""

    classes: tuple[str, ...] | None
    max_faults: int
    injected: int


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    source: str
    seed: int
    cluster: Cluster
    launcher: str
    programs: tuple[Program, ...]
    variants: tuple[Variant, ...]
    expectations: tuple[Expectation, ...] = field(default_factory=tuple)
    faults: FaultSchedule = NO_FAULTS
    recovery: Mapping[str, Any] | None = None  # raw [recovery] table, validated by simnccl.recovery
    fault_swarm: FaultSwarm | None = None  # set when [faults] has a seed
    extra_knobs: tuple[str, ...] = ()  # [torch] extra_env_knobs: knob names newer than simnccl's list

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.variants)
        raise ScenarioError(self.source, "--variant", f"no variant {name!r}; this scenario has: {known}")

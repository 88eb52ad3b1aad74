"""What a run is given (SimConfig, Limits) and the two errors a caller of the engine may see."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simnccl.cluster import Cluster
from simnccl.faults import NO_FAULTS, FaultSchedule
from simnccl.ops import Program
from simnccl.policy import Policy
from simnccl.profiles import Profile
from simnccl.release import Release


class EngineGuardError(RuntimeError):
    """A runaway simulation: too many ops or too much wall time. Never a silent hang of the harness.
    ``limit``: the ``Limits`` field it passed (``max_ops``, ``wall_s``, ``max_sim_time_s``)."""

    def __init__(self, message: str, limit: str = "") -> None:
        super().__init__(message)
        self.limit = limit


class WorkloadFailure(Exception):
    """The workload's own check failed on this rank (vLLM's startup memory check, a ``raise`` op).
    ``type_name``: the exception the real workload raises there, reported as the rank's error type."""

    def __init__(self, message: str, type_name: str = "ValueError", facts: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.facts = facts  # what the check found, as the rank's error reports it beside its message (or None)


@dataclass(frozen=True, slots=True)
class Limits:
    """Guards that turn a runaway simulation into an error: engine work units (an op run by one rank, or a
    member handled in a cohort block), wall seconds, simulated seconds."""

    max_ops: int = 200_000_000
    wall_s: float = 900.0
    max_sim_time_s: float = 30 * 24 * 3600.0

    def __post_init__(self) -> None:
        """Each guard a positive number. Why: ``wall_s=nan`` compared false with every elapsed time and so turned
        the guard off, silently; a text failed deep in the run loop."""
        if isinstance(self.max_ops, bool) or not isinstance(self.max_ops, int) or self.max_ops < 1:
            raise ValueError(f"Limits.max_ops: expected an integer >= 1, got {self.max_ops!r}")
        for name in ("wall_s", "max_sim_time_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"Limits.{name}: expected a number of seconds > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one run needs; a scenario variant expands into one of these."""

    cluster: Cluster
    release: Release
    profile: Profile
    programs: Sequence[Program]
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: str = "torchrun"
    seed: int = 0
    limits: Limits = Limits()
    policy: Policy | None = None
    faults: FaultSchedule = NO_FAULTS

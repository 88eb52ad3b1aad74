"""GrowingProgram (simnccl.testing.stateful) draws timeouts and stragglers as cases() does by default."""

from __future__ import annotations

from typing import ClassVar

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from simnccl.ops import Compute, InitProcessGroup, NewGroup
from simnccl.testing import invariants as inv
from simnccl.testing.replay import SimCase
from simnccl.testing.stateful import GrowingProgram


class Recording(GrowingProgram):
    """Keeps every case it simulated (the base's own check still runs)."""

    seen: ClassVar[list[SimCase]] = []

    def check(self, case: SimCase, outcome) -> None:  # type: ignore[no-untyped-def]
        super().check(case, outcome)
        Recording.seen.append(case)


def test_growing_programs_draw_timeouts_and_stragglers_that_never_fire() -> None:
    """GrowingProgram drew no group or init timeout and no straggler, so a user's stateful suite never ran a
    watchdog timeout path or a time-dependent wait. It now draws both, only as cases() does by default: no
    wait can reach a drawn timeout (may_time_out is false), so its ``passes`` check stays right."""
    Recording.seen = []
    run_state_machine_as_test(
        Recording,
        settings=settings(max_examples=40, stateful_step_count=12, derandomize=True, deadline=None, database=None),
    )
    ops = [op for case in Recording.seen for program in case.programs for op in program]
    assert any(isinstance(op, NewGroup) and op.timeout_s is not None for op in ops)
    assert any(isinstance(op, InitProcessGroup) and op.timeout_s is not None for op in ops)
    assert any(isinstance(op, Compute) for op in ops)
    assert not any(inv.may_time_out(case.programs) for case in Recording.seen)

"""The fast paths (DESIGN rule 8: cost grows with memberships, not calls): the same outcome and trace as
running every rank through every call, at a fraction of the work.

* ``outsiders`` — a rank's run of ``new_group`` calls it is not a member of, taken in place;
* ``cohorts`` — a block of world-wide group-creation calls taken once for every rank running one Program;
* ``histories`` — group-creation histories shared between ranks that have seen the same calls, so a policy
  that decides alike on every rank decides once per shared state;
* ``classes`` — rank classes: members that plan a call alike up to relabelling are planned once per class;
* ``stamps`` — a cohort's split members made in one pass each, what the plan's shape and the call decide
  taken once (the ordinary rooms' steps in their order, for a member whose device needs nothing but its
  communicator);
* ``calls`` — the per-program table both of the first two key their sharing on.

The rank loop sees ``FastPaths`` (two calls); the policy gate sees ``SharedHistories`` (a rank's history, and
decisions made before on an equal one); the planner hands a member's plan to ``RankClasses``. No other room
knows these exist. ``Engine(fast_path=False)`` turns outsider calls, shared decisions, rank classes and
stamps off (tests compare the two); cohorts stay, being the only way a world-wide block is applied.
"""

from __future__ import annotations

from simnccl.engine.fast.calls import CallTable
from simnccl.engine.fast.classes import RankClasses
from simnccl.engine.fast.cohorts import Cohorts, common_program
from simnccl.engine.fast.histories import SharedHistories
from simnccl.engine.fast.outsiders import Outsiders
from simnccl.ops import Program

__all__ = ["CallTable", "Cohorts", "FastPaths", "Outsiders", "RankClasses", "SharedHistories", "common_program"]


class FastPaths:
    """What the rank loop calls: ``take_outsider_calls(rt) -> bool`` (None when the fast path is off),
    ``block_starts(program)`` (per op, whether a cohort may start there; None: no cohorts for this program)
    and ``run_cohort(rt)`` (a generator the rank yields from)."""

    def __init__(self, outsiders: Outsiders, cohorts: Cohorts, enabled: bool) -> None:
        self.outsiders = outsiders
        self.cohorts = cohorts
        self.take_outsider_calls = outsiders.take if enabled else None
        self.run_cohort = cohorts.run

    def block_starts(self, program: Program) -> tuple[bool, ...] | None:
        return self.cohorts.block_starts if program is self.cohorts.program else None

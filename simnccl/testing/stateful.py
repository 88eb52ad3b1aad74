"""A public base for users' stateful tests: grow one SPMD program step by step, simulate after every step.

Why a base in the package (not in simnccl's own tests): a team proving its own policy wants hypothesis'
stateful testing -- a program grown rule by rule, checked after each step, shrunk to the shortest failing
sequence -- without re-deriving how a valid program is built. Subclass it, say which policies to draw, and
add checks::

    from simnccl.testing.stateful import GrowingProgram

    class MyPolicyGrows(GrowingProgram):
        def draw_policy(self, data):
            return MyPolicy()

        def check(self, case, outcome):
            super().check(case, outcome)            # passes + within_capacity
            assert (v := inv.within_budget(outcome, ...)), v.explanation

    TestMyPolicyGrows = MyPolicyGrows.TestCase

Rules: a group family (tp/dp/pp-like partition, pairs, singletons, colour splits), a duplicate of a family,
a collective on a bound handle, a matched send/recv pair, a straggler (one rank computes, then all barrier).
Families and ``init_process_group`` take timeouts as ``cases()`` draws them by default: the backend's, or one
no straggler's wait can reach (``invariants.may_time_out`` stays false), so ``passes`` stays the check.
The program is valid by construction
(``simnccl.testing.strategies``), so any failure is the policy's or the simulator's: a family or a send/recv
pair that would take a node past its NVLS multicast slots is not added (``simnccl.testing.multicast_room``,
as ``cases()`` rejects such a program: it would test the hardware, not the policy).
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from simnccl.engine import RunOutcome
from simnccl.ops import WORLD
from simnccl.testing import invariants as inv
from simnccl.testing.multicast_room import within_multicast_slots
from simnccl.testing.replay import SimCase, generated
from simnccl.testing.strategies import (
    COLLECTIVES,
    COMPUTE_SECONDS,
    FAMILY_KINDS,
    GROUP_TIMEOUTS_S,
    INIT_TIMEOUTS_S,
    PURPOSE,
    SAFE_TIMEOUT_S,
    SIZES_BYTES,
    STRAGGLER_BUDGET_S,
    ClusterSpec,
    Family,
    Layout,
    Use,
    clusters,
    draw_mesh_shape,
    envs,
    family_parts,
    first_use_is_collective,
    policies,
    releases,
)

__all__ = ["MAX_OPS", "GrowingProgram"]

MAX_OPS = 30  # ops per rank: the size of a generated startup (strategies' default)

# As cases() by default: the backend's default or a timeout no drawn straggler's wait can reach (invariants.
# may_time_out stays false), so ``passes`` stays the right check after every step.
_TIMEOUTS = st.sampled_from((None, *(t for t in GROUP_TIMEOUTS_S if t >= SAFE_TIMEOUT_S)))
_INIT_TIMEOUTS = st.sampled_from((None, *(t for t in INIT_TIMEOUTS_S if t >= SAFE_TIMEOUT_S)))


class GrowingProgram(RuleBasedStateMachine):
    """Grows one SPMD program step by step and simulates it after every step under the drawn policy.

    Override ``draw_policy(data)`` to choose the policy (default: a built-in or a composition), ``check(case,
    outcome)`` to add invariants (call ``super().check``), and ``draw_cluster(data)`` to fix the cluster.
    ``self.case`` is the last case simulated (the pytest plugin dumps it when a check fails).
    """

    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Family | Use] = []
        self.families: dict[str, Family] = {}
        self.initialized: set[str] = set()
        self.world = 1
        self.shape = (1, 1, 1)
        self.dirty = False
        self.case: SimCase | None = None
        self.policy: Any = None
        self.init_timeout_s: float | None = None
        self.computed = 0.0  # seconds of stragglers' compute so far, at most STRAGGLER_BUDGET_S

    # ------------------------------------------------------------------ what subclasses choose

    def draw_cluster(self, data: st.DataObject) -> ClusterSpec:
        return data.draw(clusters(), label="cluster")

    def draw_policy(self, data: st.DataObject) -> Any:
        """The policy the program runs under: a spec string or a policy object (a team's own)."""
        return data.draw(policies(), label="policy")

    def check(self, case: SimCase, outcome: RunOutcome) -> None:
        """After every step: a valid program passes and no device goes over its capacity."""
        assert (v := inv.passes(outcome)), v.explanation
        assert (v := inv.within_capacity(outcome)), v.explanation

    # ------------------------------------------------------------------ rules

    @initialize(target=handles, release=releases(), env=envs(), init_timeout=_INIT_TIMEOUTS, data=st.data())
    def start(self, release: str, env: dict[str, str], init_timeout: float | None, data: st.DataObject) -> str:
        self.cluster = self.draw_cluster(data)
        self.init_timeout_s = init_timeout
        self.release, self.env = release, env
        self.policy = self.draw_policy(data)
        self.world = self.cluster.world_size
        self.shape = draw_mesh_shape(data.draw, self.world)
        self.dirty = True
        return WORLD

    def _layout(self, steps: list[Family | Use] | None = None) -> Layout:
        steps = self.steps if steps is None else steps
        return Layout(self.world, tuple(steps), init_timeout_s=self.init_timeout_s)

    def _ops(self) -> int:
        return max(len(p) for p in self._layout().render())

    @precondition(lambda self: self._ops() + 8 <= MAX_OPS)
    @rule(
        target=handles,
        kind=st.sampled_from([k for k in FAMILY_KINDS if k != "duplicate"]),
        colors=st.lists(st.integers(0, 3), min_size=8, max_size=8),
        timeout=_TIMEOUTS,
    )
    def add_family(self, kind: str, colors: list[int], timeout: float | None) -> str | MultipleResults[str]:
        handle = f"{PURPOSE[kind]}{len(self.families)}"
        family = Family(handle, family_parts(kind, self.world, self.shape, colors), PURPOSE[kind], timeout)
        return self._add(family)

    @precondition(lambda self: self._ops() + 8 <= MAX_OPS)
    @rule(target=handles, source=handles, timeout=_TIMEOUTS)
    def add_duplicate(self, source: str, timeout: float | None) -> str | MultipleResults[str]:
        parts = self.families[source].parts if source in self.families else (tuple(range(self.world)),)
        purpose = self.families[source].purpose if source in self.families else "world"
        return self._add(Family(f"{purpose}{len(self.families)}", parts, purpose, timeout))

    def _add(self, family: Family) -> str | MultipleResults[str]:
        if not self._fits([*self.steps, family]):
            return multiple()  # nothing added: no handle for later rules
        self.families[family.handle] = family
        self.steps.append(family)
        self.dirty = True
        return family.handle

    def _fits(self, steps: list[Family | Use]) -> bool:
        """Whether a program of ``steps`` stays within its nodes' NVLS multicast slots under every policy. On an
        8-GPU H200 node a 13th communicator of two or more local members fails at creation (pytorch#187155), in
        real life and in the simulator: a program past that tests the hardware, not the policy."""
        programs = self._layout(steps).render()
        return within_multicast_slots(programs, self.cluster.gpu, self.cluster.gpus_per_node)

    @precondition(lambda self: self._ops() < MAX_OPS)
    @rule(
        handle=handles,
        kind=st.sampled_from([k for k in COLLECTIVES if k != "broadcast"]),
        size=st.sampled_from(SIZES_BYTES),
    )
    def add_collective(self, handle: str, kind: str, size: int) -> None:
        self.steps += first_use_is_collective(self.steps, self.initialized, Use(kind, handle, size))
        self.dirty = True

    @precondition(lambda self: self.world > 1 and self._ops() + 1 < MAX_OPS)
    @rule(handle=handles, data=st.data())
    def add_p2p(self, handle: str, data: st.DataObject) -> None:
        parts = self.families[handle].parts if handle in self.families else (tuple(range(self.world)),)
        multi = [p for p in parts if len(p) > 1]
        assume(multi)
        part = data.draw(st.sampled_from(multi), label="part")
        src, dst = data.draw(st.permutations(part), label="order")[:2]
        size = data.draw(st.sampled_from(SIZES_BYTES), label="size")
        initialized = set(self.initialized)
        steps = [*self.steps, *first_use_is_collective(self.steps, initialized, Use("p2p", handle, size, src, dst))]
        if not self._fits(steps):  # the pair's own communicator would take a node past its multicast slots
            return
        self.steps, self.initialized = steps, initialized
        self.dirty = True

    @precondition(lambda self: self._ops() + 2 < MAX_OPS)
    @rule(handle=handles, seconds=st.sampled_from(COMPUTE_SECONDS), data=st.data())
    def add_straggler(self, handle: str, seconds: float, data: st.DataObject) -> None:
        """One rank computes alone, then every rank barriers on ``handle`` (as ``cases()`` draws a straggler):
        the others wait for it there, under that group's timeout, which the budget keeps out of reach."""
        if self.computed + seconds > STRAGGLER_BUDGET_S:
            return
        src = data.draw(st.integers(0, self.world - 1), label="straggler")
        self.steps.append(Use("compute", handle, src=src, seconds=seconds))
        self.steps += first_use_is_collective(self.steps, self.initialized, Use("barrier", handle, 4))
        self.computed += seconds
        self.dirty = True

    @precondition(lambda self: self._ops() >= MAX_OPS)
    @rule()
    def full(self) -> None:
        """The program is as long as a generated startup gets: nothing is added. Without a rule valid here,
        hypothesis would stop a long run with "No progress can be made" (InvalidDefinition) instead of going on
        checking what was grown."""

    @invariant()
    def keeps_invariants(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        self.case = generated(
            SimCase(
                programs=self._layout().render(),
                gpu=self.cluster.gpu,
                nodes=self.cluster.nodes,
                gpus_per_node=self.cluster.gpus_per_node,
                release=self.release,
                env=tuple(sorted(self.env.items())),
                policy=self.policy,
            )
        )
        self.check(self.case, self.case.run())

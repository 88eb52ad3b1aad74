"""Group-creation histories (what a policy decides on), shared between ranks that have seen the same calls.

Why: a policy's request carries the rank's whole history, and a large startup makes thousands of calls per
rank; copying a history per rank per call is calls x world work. So every rank starts on one shared History
(``engine.ranks.make_ranks`` hands every rank the same empty one; copied here when a rank writes), and a
policy simnccl has established decides alike on every rank (its built-ins) decides once per shared state
(``HistoryNode``: class, call count, digest) and call: later ranks in that state take the ``Step`` (recorded in
their ``history_tail``, applied only when their real history is needed).

The policy gate sees ``history``, ``own``, ``recall`` and ``remember``; everything else here is the fast paths'.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from simnccl.engine.fast.calls import CallTable
from simnccl.engine.state import RankRuntime
from simnccl.env_knobs import PER_RANK_VARIABLES
from simnccl.ops import NewGroup
from simnccl.policy import GroupDecision, GroupRequest, History

_RANK_ENV = frozenset(PER_RANK_VARIABLES)  # the launcher's per-rank variables; not a policy's business
_REPLAY_MAX = 16  # a longer tail is cheaper to materialise by copying a snapshot than by replaying its records
_VIEWS_MAX = 64  # shared read-only histories kept for ``view`` (the most recent states): bounds their memory


@dataclass(slots=True, eq=False)
class HistoryNode:
    """A state of group-creation history that ranks share (their class, call count and digest), with the calls
    already decided from it. ``snapshot`` is a History last seen in this state (checked before use: its owner
    records into it in place)."""

    cls: tuple[Any, ...]
    calls: int
    digest: int
    steps: dict[int, Step] = field(default_factory=dict)  # op key -> the call decided from this state
    snapshot: History | None = None


@dataclass(slots=True, eq=False)
class Step:
    """One call decided once for every rank in a state: the deciding rank's request (what ``History.record``
    needs, equal on every rank of the class), the decision, the op torch receives (None: reuse), the next state."""

    op: NewGroup
    request: GroupRequest
    decision: GroupDecision
    effective: NewGroup | None
    after: HistoryNode
    effective_id: int = 0  # id(effective), 0 for None: the outsider loop's key

    def __post_init__(self) -> None:
        self.effective_id = 0 if self.effective is None else id(self.effective)


@dataclass(slots=True, eq=False)
class Span:
    """Calls ``first`` to ``last`` (exclusive) of a list of Steps that only grows (an outsider track's), taken
    by a rank as one entry of its ``history_tail``: a rank's stretch of outsider calls is thousands of Steps
    long, and copying them into every rank's tail was calls x ranks work and memory (Megatron TP8·PP8·DP64
    under lazy-init: ~84 million references). ``after``: the state after the last call, as ``Step.after``."""

    steps: list[Step | None]
    first: int
    last: int
    after: HistoryNode

    def __len__(self) -> int:
        return self.last - self.first


TailEntry = Step | Span  # one call taken on a shared decision, or a run of them


def tail_length(tail: list[TailEntry]) -> int:
    """How many calls a rank's ``history_tail`` holds."""
    return sum(1 if type(entry) is Step else len(entry) for entry in tail)


def tail_steps(tail: list[TailEntry]) -> Iterator[Step]:
    """The Steps of a rank's ``history_tail``, in call order."""
    for entry in tail:
        if type(entry) is Step:
            yield entry
        else:
            for step in islice(entry.steps, entry.first, entry.last):
                assert step is not None  # a track under a policy records a Step for every call it covers
                yield step


Slot = tuple[HistoryNode, int]  # where a decision about to be made is remembered: (state before, op key)


class SharedHistories:
    def __init__(self, calls: CallTable) -> None:
        self.calls = calls
        self.nodes: dict[tuple[Any, int, int], HistoryNode] = {}
        self._classes: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._views: dict[HistoryNode, History] = {}  # a state -> one History in it that nobody records into

    # ---------------------------------------------------------------- the policy gate's interface

    def history(self, rt: RankRuntime) -> History:
        """The rank's real history: its pending tail of shared records applied (or, for a long tail, a copy of
        a history known to be in the same state: the rank that first decided there)."""
        tail = rt.history_tail
        if tail:
            target = tail[-1].after
            snap = target.snapshot
            if (
                snap is not None
                and tail_length(tail) > _REPLAY_MAX
                and snap.calls == target.calls
                and snap.digest == target.digest
            ):
                rt.history = snap.copy()
            else:
                history = rt.history.copy() if rt.history_shared else rt.history
                for step in tail_steps(tail):
                    history.record(step.request, step.decision)
                rt.history = history
            rt.history_shared = False
            tail.clear()
        return rt.history

    def view(self, rt: RankRuntime) -> History:
        """The rank's real history to show a policy asked as this rank, in O(1) for every rank but the first to
        reach a state: that rank's materialised history becomes the state's shared one (``history_shared``: any
        rank records into it only after copying, as ``own`` does), and later ranks in the state adopt it instead
        of each copying and replaying its own. Equal content to ``history``; only for policies asked on every
        rank (the gate's unverified path), whose runs never let a cohort record into a history in place."""
        tail = rt.history_tail
        if not tail:
            return rt.history
        target = tail[-1].after
        shared = self._views.get(target)
        if shared is None:
            shared = self.history(rt)
            rt.history_shared = True
            if len(self._views) >= _VIEWS_MAX:
                del self._views[next(iter(self._views))]  # the oldest state (insertion order: deterministic)
            self._views[target] = shared
            return shared
        rt.history = shared
        rt.history_shared = True
        tail.clear()
        return shared

    def own(self, rt: RankRuntime) -> History:
        """The rank's history, its own to record into (its shared state, if tracked, is left behind)."""
        self.history(rt)
        if rt.history_shared:
            rt.history = rt.history.copy()
            rt.history_shared = False
        rt.hnode = None
        return rt.history

    def recall(self, rt: RankRuntime, op: NewGroup, *, take: bool = True) -> tuple[Step | None, Slot | None]:
        """The decision already made for this call from the rank's state, taken (the rank moves past it) unless
        ``take`` is off; else where to ``remember`` the one about to be made. Only for decisions that may be
        shared (the gate's ``shares``).

        ``take=False``: for a caller that may turn the step down (a user's policy binding each rank its own
        device): a step taken and then turned down was in the rank's history twice, once in its tail and once as
        recorded, so the members-agree check compared call numbers that differ and passed a real disagreement
        (found by a tester: the fast path said pass where the per-rank path raised PolicyInconsistency)."""
        node = self.node(rt)
        op_key = self.calls.op_key(rt.program, op)
        step = node.steps.get(op_key)
        if step is not None:
            if take:
                self.take(rt, step)
            return step, None
        return None, (node, op_key)

    @staticmethod
    def take(rt: RankRuntime, step: Step) -> None:
        """The rank moves past a step ``recall`` found: its decision is the rank's next call in its history."""
        rt.history_tail.append(step)
        rt.hnode = step.after

    def remember(
        self,
        rt: RankRuntime,
        slot: Slot,
        op: NewGroup,
        request: GroupRequest,
        decision: GroupDecision,
        effective: NewGroup | None,
        history: History,
    ) -> None:
        """Share a decision the rank just recorded into ``history`` with every rank in the state it left."""
        node, op_key = slot
        after = self.node(rt)
        after.snapshot = history
        node.steps[op_key] = Step(op, request, decision, effective, after)

    # ---------------------------------------------------------------- states

    def node(self, rt: RankRuntime) -> HistoryNode:
        """The shared state this rank's history is in (found by class, call count and digest)."""
        cls = self._policy_class(rt)
        node = rt.hnode
        if node is not None and node.cls is cls:
            return node
        history = self.history(rt)
        key = (cls, history.calls, history.digest)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = HistoryNode(cls, history.calls, history.digest, snapshot=history)
        rt.hnode = node
        return node

    def state(self, rt: RankRuntime) -> tuple[int, int]:
        """(calls, digest) of the rank's real history, without applying its tail."""
        if rt.history_tail:
            node = rt.history_tail[-1].after
            return node.calls, node.digest
        return rt.history.calls, rt.history.digest

    def _policy_class(self, rt: RankRuntime) -> tuple[Any, ...]:
        """What a rank-independent policy may decide on besides the call and the history: the environment (less
        the launcher's per-rank variables: RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK) and the default group's
        backend name. Ranks of one class with equal histories share decisions; one canonical tuple per class, so
        nodes compare by identity."""
        cached = rt.policy_class
        if cached is not None and cached[0] is rt.ctx and cached[1] is rt.world:
            return cached[2]
        env = tuple(sorted((k, v) for k, v in rt.ctx.env.items() if k not in _RANK_ENV))
        cls = (rt.world.backend.requested if rt.world is not None else None, env)
        cls = self._classes.setdefault(cls, cls)
        rt.policy_class = (rt.ctx, rt.world, cls)
        return cls

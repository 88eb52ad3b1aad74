"""The vocabulary of a group-creation policy: what a process knows (requests), what it decides (plans,
decisions), the history it decides from, and the two functions that ask a policy.

Why a module of its own: the simulator, ``simnccl.torch_apply`` (real torch) and users' own policies all speak
these types; they import neither simpy nor torch (DESIGN rule 2).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NoReturn, Protocol, TypeVar

from simnccl.env_knobs import NO_SCENARIO_DECLARES, env_problem, is_env_name
from simnccl.nccl.knobs import nccl_config_problem
from simnccl.ops import NO_OPTIONS, PgOptions
from simnccl.release import RELEASES, ReleaseError, resolve_backend
from simnccl.visible_text import error_text, repr_text

T = TypeVar("T")

TRAFFIC_KINDS = ("collectives", "p2p", "none")
P2P_PURPOSES = ("pp", "pipeline", "p2p", "embedding")
NCCL_NAMES = ("nccl", "nccl2", "nccl-lazy", "nccl-legacy")


class PolicyError(ValueError):
    """An unknown policy name or malformed policy spec."""


@dataclass(frozen=True, slots=True)
class InitRequest:
    """What a process knows when it calls ``init_process_group``."""

    rank: int
    world_size: int
    release: str
    env: Mapping[str, str]
    backend: str | None
    device_id: int | str | None
    pg_options: PgOptions = NO_OPTIONS


@dataclass(frozen=True, slots=True)
class InitPlan:
    """How ``init_process_group`` is really called: arguments plus environment knobs set before it."""

    backend: str | None
    device_id: int | str | None
    pg_options: PgOptions
    env: Mapping[str, str] = field(default_factory=dict)
    explanation: str = ""


_Created = dict[tuple[tuple[int, ...], str, PgOptions], int]


class History:
    """The group-creation calls this process has seen, with the aggregates built-in policies need.

    Maintained by the caller (simulator or ``apply``) in call order with ``record``, O(members) per call. It is
    the same on every rank that made the same calls, which is what keeps history-based decisions consistent.

    Read-only to a policy: its tables are read-only views and its counters have no setter. Why: the simulator
    hands ranks with equal histories one History, so a policy that wrote into it (a flag only rank 0 set) was
    seen by every rank after it and their decisions agreed; in production each process has its own, only rank 0
    sees the flag and members disagree (a hang). A policy keeps its own state elsewhere; writing here raises,
    which the harness reports as the policy's error, in simulation and under real torch alike.
    """

    __slots__ = (
        "_calls",
        "_created",
        "_created_view",
        "_destroyed",
        "_digest",
        "_eager_by_rank",
        "_eager_by_rank_view",
        "_eager_mib_by_rank",
        "_eager_mib_by_rank_view",
        "_requested",
        "_requested_view",
    )

    def __init__(self) -> None:
        self._calls = 0
        self._digest = 0  # a running hash of every recorded call: equal histories compare in O(1)
        self._destroyed: frozenset[frozenset[int]] = frozenset()
        self._set_tables({}, {}, {}, {})

    def _set_tables(
        self,
        eager_by_rank: dict[int, int],
        created: _Created,
        eager_mib_by_rank: dict[int, float],
        requested: _Created,
    ) -> None:
        self._eager_by_rank, self._eager_by_rank_view = eager_by_rank, MappingProxyType(eager_by_rank)
        self._created, self._created_view = created, MappingProxyType(created)
        self._eager_mib_by_rank, self._eager_mib_by_rank_view = eager_mib_by_rank, MappingProxyType(eager_mib_by_rank)
        self._requested, self._requested_view = requested, MappingProxyType(requested)

    @property
    def calls(self) -> int:
        """Group-creation calls recorded (member or not)."""
        return self._calls

    @property
    def digest(self) -> int:
        return self._digest

    @property
    def eager_by_rank(self) -> Mapping[int, int]:
        """Per rank, how many eager NCCL groups it is a member of."""
        return self._eager_by_rank_view

    @property
    def created(self) -> Mapping[tuple[tuple[int, ...], str, PgOptions], int]:
        """(ranks, backend, options) of each group created (not reused) -> the call that first created it."""
        return self._created_view

    @property
    def destroyed(self) -> frozenset[frozenset[int]]:
        """The rank sets of groups this process destroyed (``record_destroy``) and has not created since."""
        return self._destroyed

    @property
    def eager_mib_by_rank(self) -> Mapping[int, float]:
        """Per rank, the MiB its eager groups cost at creation, each at its request's ``eager_group_mib`` (groups
        whose request had no price count nothing here): what ``budget(X)`` has spent of a member's device."""
        return self._eager_mib_by_rank_view

    @property
    def requested(self) -> Mapping[tuple[tuple[int, ...], str, PgOptions], int]:
        """As ``created``, keyed by what the call asked for rather than what was decided: a policy composed after
        ``dedupe`` (``dedupe+lazy-init``) changes what is created, and an equal later call must still find it."""
        return self._requested_view

    def record(self, request: GroupRequest, decision: GroupDecision) -> None:
        """Add one call (made by this process, member or not) and what was decided for it."""
        self._calls += 1
        self._digest = hash((self._digest, request.kind, request.ranks, request.backend, decision.key()))
        if decision.reuse is not None:
            return
        key = (request.ranks, decision.backend or "", decision.pg_options)
        if self._destroyed:
            self._destroyed -= {frozenset(request.ranks)}
        self._created.setdefault(key, self._calls)
        self._requested.setdefault((request.ranks, request.backend or "", request.pg_options), self._calls)
        if creates_eager_nccl(request, decision):
            price = request.eager_group_mib
            eager, eager_mib = self._eager_by_rank, self._eager_mib_by_rank
            for r in request.ranks:
                eager[r] = eager.get(r, 0) + 1
                if price is not None:
                    eager_mib[r] = eager_mib.get(r, 0.0) + price

    def record_destroy(self, ranks: tuple[int, ...] | None) -> None:
        """This process destroyed its last handle of a group with ``ranks`` (None: the default group, and with it
        every group): ``created`` and ``requested`` forget every group with those ranks (in any order), so
        ``dedupe`` creates an equal later call anew, as torch's default does, rather than reuse a group that is
        gone.

        Why every group with the ranks, not the one destroyed: a reuse binds by ranks first
        (``reused_group_among``), so a remembered sibling could bind another backend's group, and a split child's
        ranks may be listed in another order than the call that made it; creating is what torch's default does
        anyway. ``calls`` is unchanged (a destroy is no group-creation call: members and
        non-members still number the next call alike, which is what the members-agree check compares).

        Only the process that destroyed knows: a non-member of the group records nothing, and a later equal
        call with non-members is decided differently on them (reuse) than on the members (create), which the
        simulator reports as ``PolicyInconsistency`` (real torch would hang: only the members call torch)."""
        members = None if ranks is None else frozenset(ranks)
        self._digest = hash((self._digest, "destroy", None if ranks is None else tuple(sorted(ranks))))
        if members is None:
            self._created.clear()
            self._requested.clear()
            self._destroyed = frozenset()
            return
        for table in (self._created, self._requested):
            for key in [key for key in table if len(key[0]) == len(members) and frozenset(key[0]) == members]:
                del table[key]
        self._destroyed |= {members}

    def copy(self) -> History:
        other = History.__new__(History)
        other._calls, other._digest, other._destroyed = self._calls, self._digest, self._destroyed
        other._set_tables(
            dict(self._eager_by_rank), dict(self._created), dict(self._eager_mib_by_rank), dict(self._requested)
        )
        return other


def creates_eager_nccl(request: GroupRequest, decision: GroupDecision) -> bool:
    """Whether this decision allocates an NCCL communicator at creation (the cost budget counts)."""
    backend = decision.backend or request.effective_backend
    if decision.reuse is not None or decision.pg_options.lazy_init or request.release == "2.14":
        return False
    if backend == "nccl-legacy" or (backend == "nccl" and request.env.get("TORCH_DIST_USE_NCCL2") == "0"):
        return False
    return backend in NCCL_NAMES


def reused_group_among(groups: Iterable[tuple[str, PgOptions, T]], backend: str, options: PgOptions) -> T | None:
    """The group a reuse binds, from a process's live groups with the reused ranks as (backend name, options,
    group) in creation order: the first with the reuse's backend and options (dedupe's key), else the first with
    its backend, else the first. Why the middle step: a part after ``dedupe`` may have changed the group the
    reuse names (made it lazy), and a group of another backend on the same ranks is never it. The simulator
    (``PolicyGate.identical_group``) and real torch (``simnccl.torch_apply``) both bind by this rule."""
    first = same_backend = None
    for name, group_options, group in groups:
        if name == backend:
            if group_options == options:
                return group
            if same_backend is None:
                same_backend = group
        if first is None:
            first = group
    return same_backend if same_backend is not None else first


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """What a process knows when it calls ``new_group`` (or ``split_group``, with its own split's ranks)."""

    kind: str
    ranks: tuple[int, ...]
    rank: int
    world_size: int
    release: str
    env: Mapping[str, str]
    backend: str | None
    pg_options: PgOptions
    use_local_synchronization: bool
    purpose: str | None
    traffic: str | None
    history: History
    # What an eager creation of this group costs its most expensive member's device, in MiB, by the simnccl
    # profile of the GPU kind and torch release, laid out on the nodes as the group is
    # (``Pricer.eager_group_bytes``: never below the flat price of a one- or two-rank group on one node, and
    # that price wherever connections are made at first use, the default); None where nobody said.
    eager_group_mib: float | None = None

    @property
    def member(self) -> bool:
        return self.rank in self.ranks

    @property
    def effective_backend(self) -> str:
        """The backend name torch will use. Callers fill ``backend`` with the default group's name when the
        program passed none (as torch does); ``nccl`` is assumed only if they could not."""
        return self.backend or "nccl"


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """A plan in torch's terms. ``reuse`` = the ranks of an identical earlier group to return instead."""

    backend: str | None
    pg_options: PgOptions
    use_local_synchronization: bool
    device_id: int | None = None
    reuse: tuple[int, ...] | None = None
    explanation: str = ""

    def key(self) -> tuple[object, ...]:
        """What members must agree on (explanations may differ). Whether a device is named, not which: each
        process binds its own (``device_id=local_rank`` differs on every rank by nature), but one that names a
        device where another does not inits eagerly where the other waits (legacy)."""
        return (self.backend, self.pg_options, self.use_local_synchronization, self.device_id is not None, self.reuse)

    def describe(self) -> str:
        if self.reuse is not None:
            return f"reuse group {list(self.reuse)}"
        parts = [f"backend={self.backend or '<default>'}"]
        options = self.pg_options.to_dict()
        if options:
            parts.append(f"pg_options={options}")
        if self.use_local_synchronization:
            parts.append("use_local_synchronization=True")
        if self.device_id is not None:
            parts.append(f"device_id={self.device_id!r}")
        return ", ".join(parts)


def unchanged(request: GroupRequest) -> GroupDecision:
    return GroupDecision(request.backend, request.pg_options, request.use_local_synchronization)


class Policy(Protocol):
    name: str

    def on_init(self, request: InitRequest) -> InitPlan: ...

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision: ...


def _because(decision: GroupDecision, text: str, **changes: object) -> GroupDecision:
    explanation = f"{decision.explanation}; {text}" if decision.explanation else text
    return replace(decision, explanation=explanation, **changes)


class UserPolicyError(PolicyError):
    """A user's policy raised, or returned something that is not a plan or a decision, when a simulation asked
    it: bad input (exit 2, naming the policy, the hook and the call), neither a simnccl defect (exit 70, as it
    was) nor a failed check (exit 1). The policy's own exception is the ``__cause__``."""


def is_user_policy(policy: object) -> bool:
    """Whether ``policy`` is (or composes, or wraps) code from outside simnccl: a user's class, or a user's
    subclass of a built-in. A built-in that raises is simnccl's defect and is not relabelled."""
    if type(policy).__module__.split(".")[0] != "simnccl":
        return True
    parts = getattr(policy, "parts", None) or ((policy.inner,) if hasattr(policy, "inner") else ())
    return any(is_user_policy(part) for part in parts)


class PolicyCalledExit(BaseException):
    """A user's policy code called ``os._exit(status)`` while simnccl ran it in its own process
    (``simnccl.os_exit``): reported as the policy's failure, where it had ended the process with no report."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    def __str__(self) -> str:
        return f"os._exit({self.status}) called"

    __repr__ = __str__


def policy_raised(err: BaseException) -> bool:
    """Whether ``err``, raised while a user's policy code ran (its import, its constructor, a hook), is the policy's
    failure. Every ``Exception`` is, and so are ``sys.exit()``, ``GeneratorExit`` and a ``BaseException`` of the
    policy's own; Ctrl-C and simnccl's own control flow (its timeouts: a BaseException raised by a signal while the
    policy's code happened to run) are not.

    Why: ``except Exception`` let a hook's ``sys.exit(0)`` end ``simnccl run`` with exit 0 and no report at all, a
    run that checked nothing reported as passing, and a BaseException of the policy's exit 1, a failed check."""
    if isinstance(err, Exception | PolicyCalledExit):
        return True
    return not isinstance(err, KeyboardInterrupt) and type(err).__module__.split(".")[0] != "simnccl"


def _policy_name(policy: object) -> str:
    name = getattr(policy, "name", None)
    return name if isinstance(name, str) else type(policy).__qualname__


def _asked(policy: Policy, hook: str, call: Callable[[], T], expected: type, context: Callable[[], str]) -> T:
    """``call()`` (the policy's ``hook``) checked: a user's policy that raises, or answers with no ``expected``,
    is ``UserPolicyError`` naming the policy, the hook and ``context()`` (built only then: this is per call)."""
    try:
        answer = call()
    except UserPolicyError:  # a wrapper's inner policy, already named
        raise
    except BaseException as err:
        if not policy_raised(err) or not is_user_policy(policy):
            raise
        if isinstance(err, PolicyCalledExit):
            raise UserPolicyError(
                f"policy {_policy_name(policy)!r}: {hook} called os._exit({err.status}), which would have ended the "
                f"simulating process with no report ({context()})"
            ) from None
        raise UserPolicyError(  # (error_text: a user's exception whose __str__ raises is still the policy's)
            f"policy {_policy_name(policy)!r}: {hook} raised {type(err).__name__}: {error_text(err)} ({context()})"
        ) from err
    if not isinstance(answer, expected):
        how = {
            "on_init": "subclass simnccl.policy.BasePolicy, whose on_init returns torch's plan; change what you need",
            "on_group": "return the decision it was given, changed with dataclasses.replace",
        }[hook]
        raise UserPolicyError(
            f"policy {_policy_name(policy)!r}: {hook} returned {repr_text(answer)}; expected "
            f"{'an' if expected.__name__[0] in 'AEIOU' else 'a'} {expected.__name__} ({how})"
        )
    return answer


def ask_init(policy: Policy, request: InitRequest) -> InitPlan:
    """``policy.on_init(request)``; a user's policy that raises, returns no ``InitPlan`` or a malformed one
    (``init_plan_problem``) is ``UserPolicyError``."""
    plan = _asked(
        policy,
        "on_init",
        lambda: policy.on_init(request),
        InitPlan,
        lambda: f"rank {request.rank} of {request.world_size}, init_process_group(backend={request.backend!r})",
    )
    same = plan.backend is request.backend and plan.pg_options is request.pg_options and plan.env == {}
    if same and plan.device_id is request.device_id and type(plan.explanation) is str:
        return plan  # the common answer: the request's own arguments, checked where they were given
    problem = init_plan_problem(request, plan)
    if problem is not None:
        _refuse(policy, f"on_init returned {problem} (rank {request.rank} of {request.world_size})")
    return plan


def _refuse(policy: Policy, what: str) -> NoReturn:
    """A malformed answer: the user's error (``UserPolicyError``), or a bug in a built-in policy."""
    if not is_user_policy(policy):
        raise AssertionError(f"built-in policy {_policy_name(policy)!r}: {what}")
    raise UserPolicyError(f"policy {_policy_name(policy)!r}: {what}")


def init_plan_problem(request: InitRequest, plan: InitPlan) -> str | None:
    """What is wrong with an ``InitPlan``'s fields (None: nothing): wrong types, a backend torch does not know, an
    environment entry a scenario's env table is refused for (``env_knobs.env_problem``).

    Why: such a plan reached the engine, which failed on it as a bug in simnccl; and an env entry a file is
    refused for (``NCCL_FOOBAR``, ``RANK``, ``TORCH_DIST_USE_NCCL2 = 0`` as a number) was taken in silently."""
    problem = _arguments_problem(plan, request.pg_options)
    if problem is not None:
        return problem
    if not isinstance(plan.env, Mapping):
        return f"env={plan.env!r}; expected a mapping of variable names to strings"
    for name, value in plan.env.items():
        if type(name) is not str or type(value) is not str or not is_env_name(name):
            return f"env entry {name!r}: {value!r}; expected variable names and values that are strings"
        problem = env_problem(name, value, (), NO_SCENARIO_DECLARES)
        if problem is not None:
            return f"env entry {name}={value!r}; {problem}"
    return _backend_problem(plan.backend, request.backend, request.release, {**request.env, **plan.env})


def _arguments_problem(answer: InitPlan | GroupDecision, asked: PgOptions) -> str | None:
    """What is wrong with the fields an ``InitPlan`` and a ``GroupDecision`` share (None: nothing): their types,
    and options outside NCCL's range where they are not the ones the call was made with (``asked``)."""
    # Exact types, not subclasses: the members-agree check compares answers with ``==``, and a subclass's own
    # ``__eq__`` (equal to anything) made a rank's gloo or lazy answer "agree" with another's eager NCCL one; the
    # engine then applied the first rank's answer on both, and the run passed what production hangs on.
    if answer.backend is not None and type(answer.backend) is not str:
        return f"backend={answer.backend!r}; expected a backend name or None (a str, not a subclass)"
    if type(answer.pg_options) is not PgOptions:
        return (
            f"pg_options={answer.pg_options!r}; expected a PgOptions, not a subclass (dataclasses.replace the one "
            "it was given)"
        )
    device = answer.device_id
    if device is not None and type(device) not in (int, str):
        return f"device_id={device!r}; expected a device index (an int), a device string or None"
    if not isinstance(answer.explanation, str):
        return f"explanation={answer.explanation!r}; expected text"
    if answer.pg_options is not asked and (problem := options_problem(answer.pg_options)) is not None:
        return problem
    return None


def _backend_problem(backend: str | None, asked: str | None, release: str, env: Mapping[str, str]) -> str | None:
    """A backend an answer changed to that this release does not know (under ``env``), or None."""
    if backend != asked and release in RELEASES:
        try:
            resolve_backend(RELEASES[release], backend, env)
        except ReleaseError as err:
            return f"backend={backend!r}; {err}"
    return None


def ask_group(policy: Policy, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
    """``policy.on_group(request, decision)``; a user's policy that raises or returns no ``GroupDecision`` is
    ``UserPolicyError``. Also what a wrapper (a composition, a lane) asks each policy it holds with, so the part
    at fault is named, not the wrapper."""
    return _asked(
        policy,
        "on_group",
        lambda: policy.on_group(request, decision),
        GroupDecision,
        lambda: f"rank {request.rank}, {request.kind}(ranks={list(request.ranks)}, backend={request.backend!r})",
    )


def decide_group(policy: Policy, request: GroupRequest) -> GroupDecision:
    """The policy's full decision for one call, starting from "as the program asked"; a user's policy that
    raises, returns no ``GroupDecision`` or a malformed one (``decision_problem``) is ``UserPolicyError``.

    The answer is always a plain ``GroupDecision``: a subclass's own ``key()`` (``()`` on every rank) hid members
    that disagreed from the check that compares them."""
    d = ask_group(policy, request, unchanged(request))
    plain = (  # the common answer, checked without the full walk: every field of the type it must have
        type(d) is GroupDecision
        and type(d.explanation) is str
        and d.explanation
        and d.reuse is None
        and d.device_id is None
        and (d.backend is request.backend or (type(d.backend) is str and d.backend == request.backend))
        and type(d.pg_options) is PgOptions
        and (d.pg_options is request.pg_options or options_problem(d.pg_options) is None)
        and type(d.use_local_synchronization) is bool
    )
    if not plain:
        problem = decision_problem(request, d)
        if problem is not None:
            where = f"rank {request.rank}, {request.kind}(ranks={list(request.ranks)})"
            _refuse(policy, f"on_group returned {problem} ({where})")
        if type(d) is not GroupDecision or not d.explanation:
            d = GroupDecision(
                d.backend,
                d.pg_options,
                d.use_local_synchronization,
                d.device_id,
                d.reuse,
                d.explanation or "as requested",
            )
    return d


_CUDA_DEVICE = re.compile(r"cuda:(0|[1-9][0-9]{0,5})")  # torch.device refuses "cuda:01"


def decision_problem(request: GroupRequest, decision: GroupDecision) -> str | None:
    """What is wrong with a decision's fields for this call (None: nothing): wrong types, a backend torch does not
    know, or a reuse of other ranks than the call's.

    Why: such a decision reached the engine, which failed on it as a bug in simnccl (exit 70); and a ``reuse`` of
    other ranks was ignored by the simulator (it binds the call's own ranks) while ``simnccl.torch_apply`` binds the
    group it names, so the simulation passed what production breaks."""
    d = decision
    if not isinstance(d.use_local_synchronization, bool):
        return f"use_local_synchronization={d.use_local_synchronization!r}; expected True or False"
    if d.reuse is not None and (
        type(d.reuse) is not tuple or any(type(r) is not int for r in d.reuse) or d.reuse != request.ranks
    ):
        return (
            f"reuse={d.reuse!r}; a reuse names the call's own ranks {request.ranks} (an earlier identical group "
            "with them is returned), never another group"
        )
    problem = _arguments_problem(d, request.pg_options)
    if problem is not None:
        return problem
    if type(d.device_id) is str and not _CUDA_DEVICE.fullmatch(d.device_id):
        return f"device_id={d.device_id!r}; a group's device string names its CUDA device with an index ('cuda:N')"
    return _backend_problem(d.backend, request.backend, request.release, request.env)


@functools.lru_cache(maxsize=4096)
def options_problem(options: PgOptions) -> str | None:
    """A ``PgOptions`` field set outside NCCL's range (``nccl_config_problem``: ``max_ctas=-3``), or None. Its
    types were checked when it was made (so equal options are equally valid: cached by value, as a policy makes
    the same options again for every call)."""
    for name, value in options.to_dict().items():
        problem = nccl_config_problem(name, value)
        if problem is not None:
            return f"pg_options.{name}={value!r}; {problem}"
    return None


def decide_split(policy: Policy, requests: list[GroupRequest]) -> list[GroupDecision]:
    """Decisions for every split of one ``split_group`` call (all are recorded, so histories stay equal).

    ``split_group`` can express less than ``new_group``: the child keeps the parent's backend, has no
    ``use_local_synchronization`` and inherits the parent's device; and it is collective over the parent,
    so a split can be reused only if every split of the call is.
    """
    decisions = []
    for request in requests:
        decision = decide_group(policy, request)
        if decision.backend not in (None, request.backend):
            decision = _because(
                decision,
                f"split_group keeps the parent's backend: {decision.backend} not applied",
                backend=request.backend,
            )
        if decision.use_local_synchronization:
            decision = _because(
                decision, "split_group has no use_local_synchronization", use_local_synchronization=False
            )
        if decision.device_id is not None:
            decision = _because(decision, "split_group inherits the parent's device", device_id=None)
        decisions.append(decision)
    if not all(d.reuse is not None for d in decisions):
        decisions = [
            _because(d, "split_group is collective over the parent and other splits create groups: created", reuse=None)
            if d.reuse is not None
            else d
            for d in decisions
        ]
    return decisions

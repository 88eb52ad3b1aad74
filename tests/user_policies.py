"""Policies as a team would write them, for the tests of naming, checking and replaying users' own policies.

Imported by spec (``user_policies:Name``) with ``tests/`` on ``sys.path`` (pytest puts it there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace

from simnccl.ops import PgOptions
from simnccl.policy import BasePolicy, DedupePolicy, GroupDecision, GroupRequest, InitPlan, InitRequest, Policy


@dataclass(frozen=True)
class LazyAbove(BasePolicy):
    """Correct: groups larger than ``max_eager_ranks`` get lazy_init (decided from the call only)."""

    name: str = "lazy-above"
    max_eager_ranks: int = 2

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) <= self.max_eager_ranks:
            return decision
        return replace(
            decision,
            pg_options=replace(decision.pg_options, lazy_init=True),
            explanation=f"{len(request.ranks)} ranks > {self.max_eager_ranks}: lazy",
        )


@dataclass(frozen=True)
class LastMemberLazy(BasePolicy):
    """Wrong: the last member of a group decides lazy, the others eager (members disagree). It also *claims*
    rank independence with a plain class attribute, which the harness must not trust."""

    name: str = "last-member-lazy"
    rank_independent = True  # not a field: a bare promise

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) > 1 and request.rank == request.ranks[-1]:
            return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True), explanation="last: lazy")
        return decision


@dataclass(frozen=True)
class FlipsLazyOnUpperHalf(BasePolicy):
    """Wrong, and not idempotent: ranks in the upper half of the world flip lazy_init (eager becomes lazy), so
    members disagree; asked again about its own decision, it flips it back (a replay must not ask it twice)."""

    name: str = "flips-lazy-on-upper-half"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if request.rank < request.world_size // 2:
            return decision
        options = decision.pg_options
        return replace(decision, pg_options=replace(options, lazy_init=not options.lazy_init), explanation="flip")


@dataclass(frozen=True)
class SkewedDedupe(DedupePolicy):
    """Wrong, and a subclass of a built-in: odd ranks never dedupe."""

    name: str = "skewed-dedupe"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if request.rank % 2:
            return decision
        return super().on_group(request, decision)


LAZY_ABOVE_FOUR = LazyAbove(max_eager_ranks=4)  # a module-level instance, named by spec

CALLS: list[str] = []


def not_a_policy() -> None:
    """A function: a spec naming it must be refused without calling it."""
    CALLS.append("called")


class NeedsArguments(BasePolicy):
    def __init__(self, budget: float) -> None:
        self.budget = budget


@dataclass(frozen=True)
class HalfLegacy(BasePolicy):
    """Wrong: the lower half of the ranks rolls back to the legacy backend, the upper half keeps nccl2."""

    name: str = "half-legacy"

    def on_init(self, request: InitRequest) -> InitPlan:
        env = {"TORCH_DIST_USE_NCCL2": "0"} if request.rank < request.world_size // 2 else {}
        return InitPlan(request.backend, request.device_id, request.pg_options, env, "lower half: legacy")


@dataclass(frozen=True)
class OwnDevice(BasePolicy):
    """Correct: each rank binds its own device (device_id differs per rank by nature)."""

    name: str = "own-device"

    def on_init(self, request: InitRequest) -> InitPlan:
        return InitPlan(request.backend, request.rank, request.pg_options, {}, "device_id = rank")


@dataclass(frozen=True)
class DeviceOnRankZero(BasePolicy):
    """Wrong: only rank 0 names its device at init (legacy: rank 0 inits at once, the others at first use)."""

    name: str = "device-on-rank-zero"

    def on_init(self, request: InitRequest) -> InitPlan:
        device = 0 if request.rank == 0 else request.device_id
        return InitPlan(request.backend, device, request.pg_options, {}, "rank 0 binds cuda:0")


class ProtocolOnly(Policy):
    """Wrong: subclasses the ``Policy`` protocol, whose hooks are stubs returning None."""

    name = "protocol-only"


class UnnamedSubclass(BasePolicy):
    """Wrong: ``name = ...`` without @dataclass keeps BasePolicy's field value, 'torch-default'."""

    name = "unnamed-subclass"


@dataclass(frozen=True)
class WrongHookName(BasePolicy):
    """Wrong: ``decide`` is no hook; the policy would run as torch's defaults under the name 'wrong-hook-name'."""

    name: str = "wrong-hook-name"

    def decide(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True))


@dataclass(frozen=True)
class ExitsOnGroup(BasePolicy):
    """A policy that calls ``sys.exit(0)`` in a hook (a leftover debugging exit): not a run that passed."""

    name: str = "exits-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        sys.exit(0)


@dataclass(frozen=True)
class OsExitsOnGroup(BasePolicy):
    """A policy that calls ``os._exit(0)`` in a hook: it ended ``simnccl run`` (and a pytest session) with exit 0
    and no report. Run only in a child process: without simnccl's guard it ends the process it runs in."""

    name: str = "os-exits-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        os._exit(0)


@dataclass(frozen=True)
class ForksOnGroup(BasePolicy):
    """A policy whose hook forks a child that leaves with ``os._exit(0)``: the child exits for real."""

    name: str = "forks-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"the forked child ended with status {status}")
        return decision


@dataclass(frozen=True)
class InterruptedOnGroup(BasePolicy):
    """Ctrl-C arriving while a hook runs."""

    name: str = "interrupted-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        raise KeyboardInterrupt


@dataclass(frozen=True)
class FlagsRank0InHistory(BasePolicy):
    """Wrong: rank 0 caches a "memory-tight" flag in the history it is shown and every call that sees the flag is
    lazy. In production only rank 0's process has the flag (members disagree: a hang); a simulator that shared
    one history between ranks showed it to all, and they agreed."""

    name: str = "flags-rank0-in-history"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        flags = request.history.eager_mib_by_rank
        if request.rank == 0:
            flags.setdefault(-1, 0.0)  # type: ignore[attr-defined]
        if -1 in flags:
            return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True), explanation="tight")
        return decision


class PolicyAbort(BaseException):
    """A team's own BaseException (not an Exception), as some code bases use to unwind."""


@dataclass(frozen=True)
class RaisesBaseExceptionOnInit(BasePolicy):
    name: str = "raises-base-exception-on-init"

    def on_init(self, request: InitRequest) -> InitPlan:
        raise PolicyAbort("unwind")


@dataclass(frozen=True)
class RaisesOnGroup(BasePolicy):
    """A policy with a bug: raises for any group of more than one rank."""

    name: str = "raises-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) > 1:
            raise RuntimeError("team policy bug")
        return decision


@dataclass(frozen=True)
class NcclOnlyUnderTorch(BasePolicy):
    """A policy with a bug that only real torch shows: it asks torch.distributed for the default group's backend
    and refuses anything but NCCL (on gloo, the CPU lane's backend, it raises); simulated, torch.distributed is
    never initialised, so it passes the decision through."""

    name: str = "nccl-only-under-torch"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_initialized() and dist.get_backend() != "nccl":
            raise RuntimeError(f"expected an NCCL world, got {dist.get_backend()}")
        return decision


SLEEPS_S = 60.0


@dataclass(frozen=True)
class StartsADaemon(BasePolicy):
    """A policy that starts a helper process in a session of its own (``sleep 300``, standing in for a cache
    daemon) on the real ranks only (where torch.distributed is initialized), and leaves it running. It keeps
    the rank's stdout and stderr; ``StartsADetachedDaemon``'s does not."""

    name: str = "starts-a-daemon"
    detached: bool = False

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_initialized():
            quiet = subprocess.DEVNULL if self.detached else None
            subprocess.Popen(["sleep", "300"], start_new_session=True, stdin=quiet, stdout=quiet, stderr=quiet)
        return decision


@dataclass(frozen=True)
class StartsADetachedDaemon(StartsADaemon):
    name: str = "starts-a-detached-daemon"
    detached: bool = True


@dataclass(frozen=True)
class SleepsOnGroup(BasePolicy):
    """A slow policy (a lookup that takes its time): sleeps ``SLEEPS_S`` in ``on_group``, then passes the
    decision; for tests that interrupt a command while a variant is still running."""

    name: str = "sleeps-on-group"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        time.sleep(SLEEPS_S)
        return decision


@dataclass(frozen=True)
class ReturnsNothing(BasePolicy):
    """A policy with a bug: forgets to return the decision."""

    name: str = "returns-nothing"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        replace(decision, reuse=False)
        return None  # type: ignore[return-value]


@dataclass(frozen=True)
class RaisesOnInit(BasePolicy):
    name: str = "raises-on-init"

    def on_init(self, request: InitRequest) -> InitPlan:
        raise KeyError("MASTER_ADDR")


LOOPS_ENTERED: list[int] = []  # ranks that entered LoopsForever.on_group
LOOP_GIVES_UP_S = 20.0


@dataclass(frozen=True)
class LoopsForever(BasePolicy):
    """A policy that does not return (a busy wait on something that never comes): only a timeout stops it.
    It gives up after ``LOOP_GIVES_UP_S``, so a harness that failed to stop it makes a test fail, not hang; each
    rank that enters says so on stderr."""

    name: str = "loops-forever"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        LOOPS_ENTERED.append(request.rank)
        print(f"loops-forever: rank {request.rank} entered", file=sys.stderr, flush=True)
        gives_up = time.monotonic() + LOOP_GIVES_UP_S
        while time.monotonic() < gives_up:
            pass
        raise RuntimeError(f"gave up after {LOOP_GIVES_UP_S:g} s")


@dataclass(frozen=True)
class ReusesOtherRanks(BasePolicy):
    """Wrong: answers a repeated 4-rank call with a reuse of the 2-rank group (0, 1). ``torch_apply`` binds the
    group a reuse names, so production gets the wrong group; the simulator bound the call's own ranks."""

    name: str = "reuses-other-ranks"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if len(request.ranks) == 4 and any(key[0] == request.ranks for key in request.history.created):
            return replace(decision, reuse=(0, 1), explanation="reuse (0, 1)")
        return decision


@dataclass(frozen=True)
class PrintsOnStdout(BasePolicy):
    """Harmless but chatty: prints a line on stdout at every init, in whatever process runs it (a real rank)."""

    name: str = "prints-on-stdout"

    def on_init(self, request: InitRequest) -> InitPlan:
        print(f"prints-on-stdout: rank {request.rank} init", flush=True)
        return super().on_init(request)


@dataclass(frozen=True)
class ReusesAGroupNeverMade(BasePolicy):
    """Wrong: answers the first call on ranks (0, 1) with a reuse of a group (0, 1) no one made. Every rank fails
    alike there, in the simulation and under ``torch_apply`` (ApplyError)."""

    name: str = "reuses-a-group-never-made"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if request.ranks == (0, 1):
            return replace(decision, reuse=(0, 1), explanation="reuse (0, 1)")
        return decision


@dataclass(frozen=True, slots=True)
class _AlwaysAgreeing(GroupDecision):
    def key(self) -> tuple[object, ...]:
        return ()


@dataclass(frozen=True)
class HidesDisagreementInKey(BasePolicy):
    """Wrong: odd ranks go lazy, and the decision's own ``key()`` says every rank agrees."""

    name: str = "hides-disagreement-in-key"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        options = replace(decision.pg_options, lazy_init=bool(request.rank % 2))
        d = decision
        return _AlwaysAgreeing(d.backend, options, d.use_local_synchronization, d.device_id, d.reuse, "odd: lazy")


@dataclass(frozen=True)
class OptionsAsDict(BasePolicy):
    name: str = "options-as-dict"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, pg_options={"lazy_init": True})  # type: ignore[arg-type]


@dataclass(frozen=True)
class ExplainedOptionsAsDict(BasePolicy):
    """As ``OptionsAsDict``, with an explanation: the answer the quick check once let through."""

    name: str = "explained-options-as-dict"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, pg_options={"lazy_init": True}, explanation="lazy")  # type: ignore[arg-type]


@dataclass(frozen=True)
class UnknownBackend(BasePolicy):
    name: str = "unknown-backend"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, backend="bogus-backend")


@dataclass(frozen=True)
class ReusesDestroyed(BasePolicy):
    """Wrong: answers a call with the ranks of a group this process destroyed by reusing that dead group (what
    the built-in dedupe did before its history recorded destroys): torch raises at the reuse."""

    name: str = "reuses-destroyed"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        if frozenset(request.ranks) in request.history.destroyed:
            return replace(decision, reuse=request.ranks, explanation="reuse the destroyed group")
        return decision


@dataclass(frozen=True)
class BindsOwnDevice(BasePolicy):
    """Correct: each rank names its own device for the group (``device_id=local_rank``), as torch code does."""

    name: str = "binds-own-device"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, device_id=request.rank, explanation="own device")


@dataclass(frozen=True)
class OnlyRank0NamesADevice(BasePolicy):
    """Wrong: rank 0 names a device (legacy: inits eagerly), the others do not (they wait for first use)."""

    name: str = "only-rank0-names-a-device"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, device_id=0) if request.rank == 0 else decision


@dataclass(frozen=True)
class OptionsOutOfRange(BasePolicy):
    """Options of the right types, outside NCCL's range: the simulation stopped on the NCCL model's error."""

    name: str = "options-out-of-range"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, pg_options=replace(decision.pg_options, max_ctas=-3))


@dataclass(frozen=True)
class InitPlanOf(BasePolicy):
    """An ``on_init`` whose plan changes the fields given (as a test builds each malformed plan)."""

    name: str = "init-plan-of"
    changes: tuple[tuple[str, object], ...] = ()

    def on_init(self, request: InitRequest) -> InitPlan:
        return replace(super().on_init(request), **dict(self.changes))


class NameRaises:
    """A policy (by its hooks) whose ``name`` property raises."""

    @property
    def name(self) -> str:
        raise RuntimeError("name not configured")

    def on_init(self, request: InitRequest) -> InitPlan:
        return InitPlan(request.backend, request.device_id, request.pg_options)

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return decision


@dataclass(frozen=True)
class DeviceString(BasePolicy):
    """Binds each group to the rank's device by name (``"cuda:0"``), which decisions may give as well as an index."""

    name: str = "device-string"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, device_id=f"cuda:{request.rank}")


@dataclass(frozen=True)
class DeviceTheNodeLacks(BasePolicy):
    """Names device 99 on a node of a few GPUs (a local rank taken for a global one, say)."""

    name: str = "device-the-node-lacks"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, device_id=99)


@dataclass(frozen=True, eq=False)
class _EqualToAnyOptions(PgOptions):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, PgOptions)

    def __hash__(self) -> int:
        return 0


class _EqualToAnyName(str):
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


@dataclass(frozen=True)
class HidesLazyInOptionsEquality(BasePolicy):
    """Wrong (found by a tester): odd ranks go lazy, in options whose ``__eq__`` says every rank's are equal."""

    name: str = "hides-lazy-in-options-equality"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, pg_options=_EqualToAnyOptions(lazy_init=request.rank % 2 == 1), explanation="odd")


@dataclass(frozen=True)
class HidesGlooInBackendEquality(BasePolicy):
    """Wrong (found by a tester): odd ranks on gloo, named by a str whose ``__eq__`` is always true."""

    name: str = "hides-gloo-in-backend-equality"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        backend = _EqualToAnyName("gloo" if request.rank % 2 else "nccl")
        return replace(decision, backend=backend, explanation="odd: gloo")


@dataclass(frozen=True)
class BindsOwnDeviceByName(BasePolicy):
    """Correct: each rank names its own device as torch code often does, ``"cuda:<local rank>"``."""

    name: str = "binds-own-device-by-name"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, device_id=f"cuda:{request.env.get('LOCAL_RANK', request.rank)}", explanation="own")


@dataclass(frozen=True)
class DeviceOf(BasePolicy):
    """Every group's ``device_id`` set to ``device``, as given."""

    name: str = "device-of"
    device: object = None

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, device_id=self.device, explanation="device")  # type: ignore[arg-type]


@dataclass(frozen=True)
class FakesAs(BasePolicy):
    """Wrong (found by testers): every new group's backend set to ``backend``: fake groups move no data, and
    production would run on without communicating ("FAKE" and "cpu:fake" got past a test of ``== "fake"``)."""

    name: str = "fakes-as"
    backend: str = "fake"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        return replace(decision, backend=self.backend, explanation="fake")


@dataclass(frozen=True)
class FakesTheWorld(BasePolicy):
    """Wrong (found by a tester): the default group made fake by ``on_init``."""

    name: str = "fakes-the-world"
    backend: str = "fake"

    def on_init(self, request: InitRequest) -> InitPlan:
        return replace(super().on_init(request), backend=self.backend, explanation="fake world")


@dataclass(frozen=True)
class EverythingFake(BasePolicy):
    """Wrong: every group on the fake backend, those that communicate too (``PolicyFakeBackend``)."""

    name: str = "acme-everything-fake"

    def on_group(self, request, decision):  # type: ignore[no-untyped-def]
        return replace(decision, backend="fake")


@dataclass(frozen=True)
class KillsItsProcess(BasePolicy):
    """Wrong: SIGKILLs the process it runs in at its first group. Run only in a child process (a sweep's pool)."""

    name: str = "kills-its-process"

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        return decision

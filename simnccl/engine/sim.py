"""What every room of one run shares: the simpy environment and clock, the ranks and their processes, the
trace every room records into, and the guard that bounds the run.

Why a separate object: rooms hold this and the rooms they call, never the Engine itself, so nothing a run
builds is a reference cycle — a finished engine is freed as soon as it is dropped, with no work for the cyclic
GC (measured: cycles here were most of a small run's GC time).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import simpy
import simpy.events

from simnccl.engine.config import EngineGuardError, Limits, SimConfig
from simnccl.engine.state import RankRuntime


class Trace:
    """The run's event trace: counted and hashed always (DESIGN rule 6), kept only when asked.

    Events are hashed in batches (the repr of each, joined): a streaming hash of the concatenation is the hash
    of the updates one by one, so the digest is the same, for a fraction of the per-event cost a startup of
    millions of events pays."""

    __slots__ = ("_clock", "_clock_text", "_hasher", "_pending", "count", "events", "keep")

    _BATCH = 4096

    def __init__(self, keep: bool) -> None:
        self._hasher = hashlib.blake2b(digest_size=16)
        self._pending: list[str] = []
        self.count = 0
        self.keep = keep
        self.events: list[tuple[Any, ...]] = []
        self._clock: object = None  # the last time ``time_text`` was asked for, and its repr
        self._clock_text = ""

    def record(self, *event: Any) -> None:
        self.count += 1
        pending = self._pending
        pending.append(repr(event))
        if len(pending) >= self._BATCH:
            self._flush()
        if self.keep:
            self.events.append(event)

    def record_text(self, text: str, event: tuple[Any, ...]) -> None:
        """``record(*event)`` for a caller that built ``repr(event)`` itself, from parts it reprs once for many
        events (``time_text``, a call's constant tail): a world-wide startup records two events per membership,
        and the repr of each tuple was a tenth of its making. Checked against ``repr(event)`` whenever the
        trace is kept (every test that reads a trace), so a text that differs fails there."""
        self.count += 1
        pending = self._pending
        pending.append(text)
        if len(pending) >= self._BATCH:
            self._flush()
        if self.keep:
            if text != repr(event):
                raise AssertionError(f"trace text {text!r} is not the repr of its event {event!r}")
            self.events.append(event)

    def time_text(self, now: float) -> str:
        """``repr(now)``, remembered for the same object: the members of a call share their clock's float."""
        if now is not self._clock:
            self._clock = now
            self._clock_text = repr(now)
        return self._clock_text

    def _flush(self) -> None:
        self._hasher.update("".join(self._pending).encode())
        self._pending.clear()

    def digest(self) -> str:
        self._flush()
        return self._hasher.hexdigest()


class Guard:
    """Turns a runaway simulation into an EngineGuardError. ``ops``: rank-ops simulated (a block of k calls
    taken by a cohort counts k per rank); ``work``: engine work units, what ``Limits.max_ops`` bounds."""

    __slots__ = ("limits", "ops", "wall_start", "work")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.ops = 0
        self.work = 0
        self.wall_start = 0.0

    def start(self) -> None:
        self.wall_start = time.monotonic()

    def tick(self) -> None:
        """One op run by one rank on the ordinary path."""
        self.ops += 1
        self.work += 1
        if self.work & 0xFFFF == 0:
            self.check()

    def check(self) -> None:
        limits = self.limits
        if self.work > limits.max_ops:
            raise EngineGuardError(f"simulation exceeded {limits.max_ops} ops; a runaway program?", "max_ops")
        elapsed = time.monotonic() - self.wall_start
        if elapsed > limits.wall_s:
            raise EngineGuardError(
                f"simulation exceeded its wall-clock guard of {limits.wall_s:.0f} s after {self.work} ops", "wall_s"
            )


class Sim:
    """The shared state of one run. ``clock`` is set while a cohort applies a block at a simulated time ahead
    of ``env.now``; ``now()`` is the time every room stamps what it does with."""

    __slots__ = (
        "_last_counts",
        "clock",
        "cluster",
        "config",
        "device_type",
        "ended",
        "env",
        "guard",
        "halted",
        "policy_faked",
        "procs",
        "profile",
        "races",
        "ranks",
        "release",
        "trace",
    )

    def __init__(self, config: SimConfig, keep_trace: bool) -> None:
        self.config = config
        self.cluster = config.cluster
        self.release = config.release
        self.profile = config.profile
        self.device_type = "cuda" if self.cluster.device_count > 0 else "cpu"  # where tensors live (fixed)
        self.env = simpy.Environment()
        self.trace = Trace(keep_trace)
        self.guard = Guard(config.limits)
        self.clock: float | None = None
        self.ranks: list[RankRuntime] = []
        self.procs: dict[int, simpy.Process] = {}
        self.ended = 0  # ranks whose process has ended (done, error, aborted): the run's loop stops at all of them
        self.halted: BaseException | None = None  # what ends the run at once (``halt``)
        # Where the run's outcome on real gloo is the order of store writes the simulated timing decided one way
        # (no hang or error carries it): each said once, reported beside the verdict (``RunOutcome.races``).
        self.races: list[str] = []
        # Member lists of groups a policy turned to the ``fake`` backend from the one the program asked for
        # (``PolicyGate.check_consistent``), with that backend: an op that communicates on one fails the run
        # (``Collectives._usable_comm``, ``policy_gate.policy_fake_error``).
        self.policy_faked: dict[tuple[int, ...], str] = {}
        self._last_counts: tuple[Sequence[int], Counter[int]] = ((), Counter())

    def node_counts(self, ranks: Sequence[int]) -> Counter[int]:
        """Ranks per node of a member list (checked by ``Cluster.nodes_of``), nodes in order of first appearance.

        Why the last list's answer is kept: a new group's member is priced (``comm_memory.Pricer``) and binds
        its NVLS slots (``engine.nvls``) by its group's layout, each counted once per member list, and the two
        asked for the same list one after the other; counting it twice was a tenth of making a member. One entry
        only: it holds the list it answers for, so no other list can take its identity. Callers read it, never
        change it."""
        last = self._last_counts
        if last[0] is not ranks:
            last = self._last_counts = (ranks, Counter(self.cluster.nodes_of(ranks)))
        return last[1]

    def now(self) -> float:
        return self.env.now if self.clock is None else self.clock

    def halt(self, err: BaseException) -> None:
        """End the run with ``err`` (a defect, a user policy's error, a timeout, Ctrl-C: nothing a rank does).

        Why: simpy keeps what a process raises in that process's event and re-raises it only when that event's
        turn comes, and the other ranks woken by the same event run first, in the same step. A command's
        wall-clock timeout raised inside a user's policy that loops forever was kept while the next rank entered
        the same policy, and no second alarm came: the command never ended. So the run remembers ``err``
        (``halted``: the policy gate raises it instead of asking a policy again) and an event ahead of every
        other one of this instant raises it out of the run loop at the next step."""
        if self.halted is None:
            self.halted = err

        def reraise(_event: simpy.Event) -> None:
            raise err

        event = self.env.event()
        event._ok, event._value = True, None  # triggered: processed like any scheduled event
        event.callbacks.append(reraise)
        self.env.schedule(event, simpy.events.URGENT - 1)  # before a process's start (URGENT), as StopSimulation

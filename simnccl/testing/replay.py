"""A simulation case as data: cluster, release, env, policy and one program per rank — dumped, printed, replayed.

Why: a property test that fails must leave behind the minimal failing program in a form a person can run
again without hypothesis (DESIGN, "Hypothesis stateful testing"): a JSON file and the one command that
replays it (``python -m simnccl.testing.replay FILE``), plus the same case as a Python snippet. This module
imports neither hypothesis nor pytest, so the replay works from a plain install.

A replay re-runs the *check* that failed, not only the simulation: the invariant checkers of
``simnccl.testing.invariants`` note here when they fail on the case just simulated (name and arguments), the
plugin writes those notes into the case file, and the replay calls the same checkers again. A failure that
was the test's own assertion is replayed by running that test again (``pytest NODEID``). Either way the exit
status says whether it still fails. A case may carry a user's policy object: the file records its import
spec and dataclass fields (``simnccl.policy.describe_policy``) and the replay rebuilds it.
"""

from __future__ import annotations

import _signal  # signal's C core: ``signal.signal`` wraps every handler it returns in an enum (see _alarm)
import contextlib
import hashlib
import json
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from simnccl import __version__
from simnccl.engine import Limits, RunOutcome
from simnccl.ops import NO_OPTIONS, OP_TYPES, Op, PgOptions, retired_field
from simnccl.policy import PolicyError, describe_policy, policy_from_description, policy_label
from simnccl.policy.sources import file_digest
from simnccl.testing.case_file import check_case
from simnccl.visible_text import invisible_in, one_line

SCHEMA = "simnccl-case/1"

# A generated case is small (<= 16 ranks, tens of ops) and simulates in milliseconds: one that runs for 30
# seconds is a runaway engine, and must end as an error, not stall a test session (DESIGN rule 7). The
# engine's own guard is passed too; the alarm also catches loops that never reach the engine's check.
CASE_WALL_S = 30.0
CASE_LIMITS = Limits(wall_s=CASE_WALL_S)


class CaseTimeout(RuntimeError):
    """A case ran past ``CASE_WALL_S`` of wall time: an engine that no longer makes progress."""


@contextlib.contextmanager
def _alarm(
    seconds: float, what: str | Callable[[], str], error: Callable[[], BaseException] | None = None
) -> Iterator[None]:
    """Raise ``error()`` after ``seconds`` (main thread on POSIX only; elsewhere a no-op).

    ``what``: the run it guards, or a function giving it (called only if the alarm fires: a property run
    guards thousands of cases). ``error``: the exception class or factory to raise (``simnccl.capture`` raises
    a BaseException there, which the captured code cannot swallow); None raises CaseTimeout naming ``what``.
    The handler is swapped through ``_signal``, signal's C core: the same calls without converting the
    previous handler to an enum, which was ~5% of a property run (benchmarks/property.py, sampled).
    """
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        if error is not None:
            raise error()
        described = what if isinstance(what, str) else what()
        raise CaseTimeout(f"{described}: still simulating after {seconds:g} s of wall time (a runaway engine loop)")

    previous = _signal.signal(signal.SIGALRM, fire)
    _signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        _signal.setitimer(signal.ITIMER_REAL, 0)
        _signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class SimCase:
    """Everything one simulation needs. ``programs`` holds one op tuple per rank; ranks with identical
    programs share one tuple object (DESIGN rule 8) and run on one Program: a case whose ranks all share one
    is run as a single program so the engine can take group creation in cohorts; elsewhere (sends and recvs
    differ) the ranks that share a tuple share a Program, which the engine plans and prices once."""

    programs: tuple[tuple[Op, ...], ...]
    gpu: str = "h100-80gb"
    nodes: int = 1
    gpus_per_node: int = 2
    release: str = "2.15"
    env: tuple[tuple[str, str], ...] = ()
    policy: Any = None  # a policy spec string, a policy object (a user's own), or None (torch's defaults)
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if len(self.programs) != self.world_size:
            raise ValueError(f"{len(self.programs)} programs for a world of {self.world_size} ranks")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def shared(self) -> bool:
        """Whether every rank runs the same program object."""
        first = self.programs[0]
        return all(p is first for p in self.programs)

    def ops_per_rank(self) -> int:
        return max(len(p) for p in self.programs)

    def total_ops(self) -> int:
        return sum(len(p) for p in self.programs)

    def with_(self, **changes: Any) -> SimCase:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        if isinstance(values["env"], Mapping):
            values["env"] = tuple(sorted(values["env"].items()))
        return SimCase(**values)

    def run(
        self, *, policy: str | object | None = ..., keep_trace: bool = False, limits: Limits | None = None
    ) -> RunOutcome:
        """Simulate through ``simnccl.testing.simulate``; ``policy`` overrides the case's own."""
        from simnccl.testing import harness

        chosen = self.policy if policy is ... else policy
        if self.shared:
            program: Any = list(self.programs[0])
        else:  # one list per distinct tuple object: ``simulate`` makes one Program of each list
            lists: dict[int, list[Op]] = {}
            program = [lists.setdefault(id(p), list(p)) for p in self.programs]
        _count_simulation(self, chosen)
        with _alarm(CASE_WALL_S, lambda: f"a {self.world_size}-rank case under policy {policy_label(chosen)!r}"):
            outcome = harness.simulate(
                program,
                gpu=self.gpu,
                nodes=self.nodes,
                gpus_per_node=self.gpus_per_node,
                release=self.release,
                env=self.env_dict,
                policy=chosen,  # type: ignore[arg-type]
                keep_trace=keep_trace,
                limits=limits or CASE_LIMITS,
            )
        _LAST_OUTCOME[0] = outcome
        _remember(outcome, self, chosen)
        return outcome

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> dict[str, Any]:
        distinct: list[tuple[Op, ...]] = []
        index: list[int] = []
        for program in self.programs:
            for i, seen in enumerate(distinct):
                if seen is program or seen == program:
                    index.append(i)
                    break
            else:
                index.append(len(distinct))
                distinct.append(program)
        return {
            "schema": SCHEMA,
            "gpu": self.gpu,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "release": self.release,
            "env": dict(self.env),
            "policy": describe_policy(self.policy),
            "note": self.note,
            "programs": [[op.to_dict() for op in p] for p in distinct],
            "rank_program": index,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SimCase:
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            schema = data.get("schema") if isinstance(data, Mapping) else None
            raise ValueError(f"not a simnccl case (schema {schema!r}, expected {SCHEMA!r})")
        check_case(data)  # every field, as a scenario's: a bad file is exit 2 naming its key, not a crash
        distinct = [tuple(op_from_dict(d) for d in ops) for ops in data["programs"]]
        return cls(
            programs=tuple(distinct[i] for i in data["rank_program"]),
            gpu=data["gpu"],
            nodes=data["nodes"],
            gpus_per_node=data["gpus_per_node"],
            release=data["release"],
            env=tuple(sorted(data.get("env", {}).items())),
            policy=_policy_of(data.get("policy")),
            note=data.get("note", ""),
        )

    def dump(self, path: str | Path, failure: Mapping[str, Any] | None = None) -> Path:
        """Write the case (and, from the plugin, what failed on it: ``Failure.to_json()``) as JSON."""
        data = self.to_json()
        if failure is not None:
            data["failure"] = dict(failure)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> SimCase:
        return cls.from_json(_read_case(Path(path)))

    def snippet(self) -> str:
        """The case as Python that replays it with ``simnccl.testing.simulate``."""
        names: list[str] = []
        lines = ["from simnccl.ops import *", "from simnccl.testing import simulate", ""]
        distinct: list[tuple[Op, ...]] = []
        for program in self.programs:
            for i, seen in enumerate(distinct):
                if seen is program or seen == program:
                    names.append(f"p{i}")
                    break
            else:
                names.append(f"p{len(distinct)}")
                distinct.append(program)
                body = ",\n".join(f"    {op_source(op)}" for op in program)
                lines.append(f"p{len(distinct) - 1} = [\n{body},\n]")
        arg = names[0] if len(distinct) == 1 else "[" + ", ".join(names) + "]"
        policy = _policy_source(self.policy)
        if policy.startswith("policy_from_description("):
            lines.insert(2, "from simnccl.policy import policy_from_description")
        lines += [
            f"out = simulate({arg}, gpu={self.gpu!r}, nodes={self.nodes}, gpus_per_node={self.gpus_per_node},",
            f"               release={self.release!r}, env={dict(self.env)!r}, policy={policy})",
            "print(out.verdict, out.hangs, out.errors)",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example: runnable text
        try:
            return f"SimCase.from_json({json.dumps(self.to_json())})"
        except PolicyError:  # a policy no other process can rebuild: still say what the case is
            return f"SimCase(<{self.world_size} ranks, policy {policy_label(self.policy)!r}: not serialisable>)"


def _policy_of(description: Any) -> Any:
    """A spec string stays a string (resolved when the case runs, like any spec); a recorded user policy is
    rebuilt now, so a file whose policy cannot be rebuilt fails on load, naming the reason."""
    if description is None or isinstance(description, str):
        return description
    return policy_from_description(description)


def _policy_source(policy: Any) -> str:
    """Python text that rebuilds ``policy``: its spec, or ``policy_from_description({...})``."""
    described = describe_policy(policy)
    if described is None or isinstance(described, str):
        return repr(described)
    return f"policy_from_description({described!r})"


def op_source(op: Op) -> str:
    """``NewGroup(ranks=(0, 1), bind='tp')``: constructor call with non-default fields only."""
    parts = []
    for f in fields(op):
        value = getattr(op, f.name)
        if value == f.default:
            continue
        if isinstance(value, PgOptions):
            opts = ", ".join(f"{k}={v!r}" for k, v in value.to_dict().items())
            parts.append(f"{f.name}=PgOptions({opts})")
        else:
            parts.append(f"{f.name}={value!r}")
    return f"{type(op).__name__}({', '.join(parts)})"


def op_from_dict(data: Mapping[str, Any]) -> Op:
    """The inverse of ``Op.to_dict`` (lists back to tuples, option tables back to PgOptions)."""
    kwargs = dict(data)
    name = kwargs.pop("op")
    cls = OP_TYPES[name]
    retired = retired_field(name, kwargs)
    if retired is not None:
        raise ValueError(f"{name} op: {retired[0]}: {retired[1]}")
    if "pg_options" in kwargs:
        kwargs["pg_options"] = PgOptions(**kwargs["pg_options"]) if kwargs["pg_options"] else NO_OPTIONS
    if isinstance(kwargs.get("ranks"), list):
        kwargs["ranks"] = tuple(kwargs["ranks"])
    if "split_ranks" in kwargs:
        kwargs["split_ranks"] = tuple(tuple(s) for s in kwargs["split_ranks"])
    return cls(**kwargs)


def share_identical(programs: Sequence[Sequence[Op]]) -> tuple[tuple[Op, ...], ...]:
    """One tuple object per distinct program, reused by every rank that runs it."""
    seen: dict[tuple[Op, ...], tuple[Op, ...]] = {}
    out = []
    for program in programs:
        key = tuple(program)
        out.append(seen.setdefault(key, key))
    return tuple(out)


# ---------------------------------------------------------------------- counters (read by the pytest plugin)

COUNTS = {"programs": 0, "simulations": 0}  # programs: len(DISTINCT_PROGRAMS)
DISTINCT_PROGRAMS: set[bytes] = set()  # ``case_digest`` of every generated case simulated in this process
_ADDED_THIS_TEST: list[bytes] = []  # of those, the ones the running test was the first to simulate
_LAST: list[object] = [None, None]  # the last case simulated, and the policy it ran under
_LAST_OUTCOME: list[RunOutcome | None] = [None]  # what that simulation returned
# This example's simulations, oldest first: (outcome, case, policy). A check is handed an outcome only, and a test
# may simulate a baseline after the case it then checks; this tells which case an outcome came from. Bounded: a
# stateful test simulates after every step of one example. The outcome by weak reference: a check can only be
# handed one the test still holds, and 64 kept outcomes made a plain loop of simulations 20% slower (the cyclic
# GC walked them all, again and again).
_RECENT: list[tuple[weakref.ref[RunOutcome], SimCase, object]] = []
_RECENT_MAX = 64
_JUDGED: list[tuple[RunOutcome, SimCase, object] | None] = [None]  # the simulation the failed checks judged
_FAILED_CHECKS: list[dict[str, Any]] = []  # invariants that failed on _JUDGED's outcome, in call order
_EXPLANATIONS: list[str] = []  # what those checks said (to find them in the test's failure)
_EXAMPLE: list[object] = [None]  # the hypothesis example the records above belong to (None: a plain test)
_COUNTED: dict[int, SimCase] = {}  # the generated cases this example counted, by identity
_COUNTED_MAX = 1024


def generated(case: SimCase) -> SimCase:
    """``case``, marked as drawn by a strategy (``cases``, ``GrowingProgram``): only such cases count as generated
    programs. Why: every new SimCase counted, so a fixed program run 300 times through the ``simnccl_simulate``
    fixture made 300 "generated programs" and met ``--simnccl-min-programs`` with nothing generated."""
    object.__setattr__(case, "_generated", True)  # not a field: equality, replay and case files ignore it
    return case


def case_digest(case: SimCase) -> bytes:
    """Eight bytes that stand for the case's content, the same in every process (no ``hash()``, which strings
    randomise per process): generated programs are counted once per content, in a session and across xdist
    workers. Why: hypothesis draws some cases more than once (267 distinct of 300 at seed 0), and gateways run
    with ``--dist each`` draw the same derandomized examples, so ``--simnccl-min-programs 40`` passed on 20."""
    programs: dict[int, tuple[int, tuple[Op, ...]]] = {}
    index = [programs.setdefault(id(p), (len(programs), p))[0] for p in case.programs]
    try:
        policy: object = describe_policy(case.policy)
    except PolicyError:  # a policy that cannot be written down (defined in a function): its class names it
        policy = f"{type(case.policy).__module__}.{type(case.policy).__qualname__}"
    text = repr((case.gpu, case.nodes, case.gpus_per_node, case.release, case.env, policy, index))
    text += repr([p for _, p in programs.values()])
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


def take_back_test_counts(simulations_before: int) -> None:
    """What the test now ending counted is taken back (a skipped or xfailed test checked nothing the session can
    count on): its simulations, and the distinct programs it was the first to simulate."""
    COUNTS["simulations"] = simulations_before
    DISTINCT_PROGRAMS.difference_update(_ADDED_THIS_TEST)
    _ADDED_THIS_TEST.clear()
    COUNTS["programs"] = len(DISTINCT_PROGRAMS)


def test_started() -> None:
    """A test starts: what it counts from now on can be taken back (``take_back_test_counts``)."""
    _ADDED_THIS_TEST.clear()


def _count_simulation(case: SimCase, policy: object) -> None:
    """Count simulations, and distinct generated cases simulated (a case run under several policies counts once,
    however the test interleaves them with other runs; a case written by hand not at all: ``generated``).

    Why per example and not "unlike the last one": a test that ran a drawn case under three policies with a
    baseline (``case.with_(policy=None)``) between them counted the case three times, and
    ``--simnccl-min-programs`` passed on a third of the programs it asked for."""
    COUNTS["simulations"] += 1
    example = _current_example()
    if example is not _EXAMPLE[0]:  # what an earlier example simulated and failed is not this example's failure
        _forget_simulations()
        _EXAMPLE[0] = example
    if getattr(case, "_generated", False) and id(case) not in _COUNTED:
        if len(_COUNTED) >= _COUNTED_MAX:  # outside hypothesis every test is one "example": keep it bounded
            _COUNTED.clear()
        _COUNTED[id(case)] = case  # held, so its id is not another case's while it is remembered
        digest = case_digest(case)
        if digest not in DISTINCT_PROGRAMS:
            DISTINCT_PROGRAMS.add(digest)
            _ADDED_THIS_TEST.append(digest)
            COUNTS["programs"] = len(DISTINCT_PROGRAMS)
    _LAST[0], _LAST[1] = case, policy
    _LAST_OUTCOME[0] = None


def _current_example() -> object:
    """The hypothesis example running now (its build context), or None outside one. Read through
    ``sys.modules``: this module imports no hypothesis, and a process that never imported it runs no example."""
    control = sys.modules.get("hypothesis.control")
    current = getattr(control, "currently_in_test_context", None)
    if current is None or not current():
        return None
    return control.current_build_context()  # type: ignore[union-attr]


def _remember(outcome: RunOutcome, case: SimCase, policy: object) -> None:
    _RECENT.append((weakref.ref(outcome), case, policy))
    del _RECENT[:-_RECENT_MAX]


def _forget_simulations() -> None:
    _RECENT.clear()
    _COUNTED.clear()
    _JUDGED[0] = None
    _FAILED_CHECKS.clear()
    _EXPLANATIONS.clear()


# Checkers whose failure can be re-checked from the case alone (one outcome, JSON arguments).
REPLAYABLE_CHECKS = ("passes", "names_culprit", "within_capacity", "within_budget", "lazy_unused_allocate_nothing")
_CASE_PROGRAMS = "$case.programs"


def note_failed_check(
    outcome: RunOutcome, name: str, args: Sequence[Any], kwargs: Mapping[str, Any], explanation: str = ""
) -> None:
    """Called by the invariant checkers when one fails: remember it, and the simulation it judged, if that is one
    of this example's. Why not only the last one: a test that simulated a passing baseline after the failing
    case reported, and wrote to the case file, the baseline, whose replay then passed."""
    if name not in REPLAYABLE_CHECKS:
        return
    found = next((r for r in reversed(_RECENT) if r[0]() is outcome), None)
    if found is None:
        return
    judged = _JUDGED[0]
    if judged is None or judged[0] is not outcome:  # notes belong to the simulation they were made on
        _FAILED_CHECKS.clear()
        _EXPLANATIONS.clear()
        judged = _JUDGED[0] = (outcome, found[1], found[2])
    programs = judged[1].programs

    def plain(value: Any) -> Any:
        if programs is not None and _same_programs(value, programs):
            return _CASE_PROGRAMS
        if isinstance(value, set | frozenset):
            return sorted(value)
        return list(value) if isinstance(value, tuple) else value

    note = {"check": name, "args": [plain(a) for a in args], "kwargs": {k: plain(v) for k, v in kwargs.items()}}
    try:
        json.dumps(note)
    except (TypeError, ValueError):
        return  # arguments the replay could not rebuild: the test is re-run instead
    _FAILED_CHECKS.append(note)
    _EXPLANATIONS.append(explanation)


def _same_programs(value: Any, programs: tuple[tuple[Op, ...], ...]) -> bool:
    if value is programs:
        return True
    try:
        return isinstance(value, Sequence) and len(value) == len(programs) and tuple(map(tuple, value)) == programs
    except TypeError:
        return False


def failed_checks() -> list[dict[str, Any]]:
    """The invariant failures noted on the judged simulation (the plugin writes them to the case file)."""
    return [dict(n) for n in _FAILED_CHECKS]


def failing_case(failure_text: str = "") -> tuple[SimCase | None, RunOutcome | None, list[dict[str, Any]]]:
    """The case a failed test's report shows: (case with the policy it ran under, its outcome, the failed
    checks to replay on it).

    The simulation the noted failed checks judged, when ``failure_text`` (the test's failure as printed) quotes
    what one of those checks said; else the last case simulated, with no check (the test's own assertion, which
    the replay re-runs). Why the quote: a test may check that a case fails (``assert not passes(out)``, or
    ``if not passes(control): assert mine.verdict == "pass"``) and then fail on its own assertion about another
    case; taken for the last simulation's check, the failure was recorded as that check's, on the control's
    case, and its replay said "still fails" after the user's policy was fixed."""
    judged = _JUDGED[0]
    if judged is not None and _quoted(_EXPLANATIONS, failure_text):
        outcome, case, policy = judged
        return (case if policy == case.policy else case.with_(policy=policy)), outcome, failed_checks()
    return last_case(), last_outcome(), []


def _quoted(explanations: Sequence[str], text: str) -> bool:
    """Whether ``text`` shows one of ``explanations``: as written (``assert v, v.explanation``), or inside a
    repr (``assert passes(out)`` prints the verdict), whose middle pytest may cut: its first line's start."""
    for explanation in explanations:
        start = explanation.splitlines()[0][:60] if explanation else ""
        if start and (start in text or repr(start)[1:-1] in text):
            return True
    return False


def recheck(case: SimCase, outcome: RunOutcome, notes: Sequence[Mapping[str, Any]]) -> list[tuple[str, bool, str]]:
    """Run the noted checks again on ``outcome``: (check, ok, explanation) each."""
    from simnccl.testing import invariants

    results = []
    for note in notes:
        name = note.get("check")
        if name not in REPLAYABLE_CHECKS:
            raise ValueError(f"case file: unknown check {name!r}; expected one of {', '.join(REPLAYABLE_CHECKS)}")

        def real(value: Any) -> Any:
            return case.programs if value == _CASE_PROGRAMS else value

        args = [real(a) for a in note.get("args", [])]
        kwargs = {k: real(v) for k, v in dict(note.get("kwargs", {})).items()}
        verdict = getattr(invariants, name).__wrapped__(outcome, *args, **kwargs)
        results.append((name, bool(verdict), verdict.explanation))
    return results


def last_outcome() -> RunOutcome | None:
    """What the last simulation of ``last_case`` returned (None while it runs, or when it raised)."""
    return _LAST_OUTCOME[0]


def last_case() -> SimCase | None:
    """The case most recently simulated, with the policy it ran under (the plugin dumps it on failure)."""
    case, policy = _LAST
    if not isinstance(case, SimCase):
        return None
    return case if policy == case.policy else case.with_(policy=policy)


PLUGIN_STATE = {"registered": False}


def plugin_registered() -> bool:
    """Whether pytest registered ``simnccl.testing.plugin`` in this process (its ``pytest_configure`` ran).

    Test modules ask this, without importing the plugin, to decide whether to name it in ``pytest_plugins``:
    once it is loaded by ``-p`` or the ``pytest11`` entry point, naming it again would register it twice.
    """
    return PLUGIN_STATE["registered"]


def reset_last_case() -> None:
    _LAST[0] = _LAST[1] = None
    _LAST_OUTCOME[0] = None
    _EXAMPLE[0] = None
    _forget_simulations()


# ---------------------------------------------------------------------- command line


def describe(outcome: RunOutcome) -> str:
    lines = [f"verdict: {outcome.verdict}   trace_hash: {outcome.trace_hash}"]
    for h in outcome.hangs:
        lines.append(
            f"  hang: rank {h['rank']} in {h['op']} (op #{h.get('op_index')}, group {h['group']!r}, seq {h['seq']}) "
            f"waiting for {h['waiting_for']}: {h['explanation']}"
        )
    for e in outcome.errors:
        lines.append(f"  error: rank {e['rank']} {e['kind']} in {e['op']}: {e['type']}: {e['message']}")
    lines += [f"  race: {race}" for race in outcome.races]
    for device, ledger in sorted(outcome.ledgers.items()):
        lines.append(
            f"  {device}: used {ledger.used_bytes / 2**20:.1f} MiB, peak {ledger.peak_bytes / 2**20:.1f} MiB "
            f"of {ledger.total_bytes / 2**20:.1f} MiB"
        )
    return "\n".join(lines)


EXIT_OK, EXIT_STILL_FAILS, EXIT_BAD_INPUT = 0, 1, 2


def _read_case(path: Path) -> Any:
    """A case file's JSON, read only when it is a regular file within ``max_file_bytes`` (``/dev/zero`` was read
    until the process was killed); ``ValueError`` says why not."""
    from simnccl.limits import current as current_limits
    from simnccl.limits import file_problem

    problem = file_problem(path, current_limits().max_file_bytes)
    if problem is not None:
        raise ValueError(problem)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # the decoder recurses once per level of nesting: no case file is that deep
        raise ValueError("not a simnccl case (nested too deep to read)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Replay a case file: simulate it, then re-run the check that failed on it.

    Exit 0: the recorded check passes now (or, with ``--simulate-only``, the verdict is ``pass``); 1: it
    still fails; 2: the file cannot be read or its policy rebuilt.
    """
    from simnccl.cli_options import UsageParser  # usage errors are one line, as every simnccl command's

    parser = UsageParser(
        prog="python -m simnccl.testing.replay",
        description="Replay a simnccl case dumped by a failing test, and re-run the check that failed.",
    )
    parser.add_argument("case", help="JSON file written by the simnccl pytest plugin")
    parser.add_argument("--policy", help="override the case's policy (any simnccl policy spec)")
    parser.add_argument("--snippet", action="store_true", help="print the case as Python instead of running it")
    parser.add_argument(
        "--simulate-only", action="store_true", help="only simulate: exit 0 when the verdict is pass, 1 otherwise"
    )
    args = parser.parse_args(argv)
    try:
        data = _read_case(Path(args.case))
        case = SimCase.from_json(data)
        if args.policy:
            case = case.with_(policy=args.policy)
    except (OSError, ValueError, KeyError, TypeError, PolicyError) as error:
        print(one_line(f"error: {args.case}: {error}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.snippet:
        print(case.snippet())
        return EXIT_OK
    failure = data.get("failure") if isinstance(data.get("failure"), Mapping) else {}
    print(
        one_line(
            f"{args.case}: {case.world_size} ranks on {case.nodes}x{case.gpus_per_node} {case.gpu}, "
            f"torch {case.release}, env {dict(case.env)}, policy {policy_label(case.policy)}"
        )
    )
    if case.note:
        print(f"note: {one_line(case.note)}")
    try:
        outcome = case.run()
    except PolicyError as error:
        print(one_line(f"error: {args.case}: {error}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(describe(outcome))
    if args.simulate_only:
        return EXIT_OK if _passes(outcome) else EXIT_STILL_FAILS
    notes = failure.get("checks") or []
    if notes:
        try:
            results = recheck(case, outcome, notes)
        except (ValueError, TypeError) as error:
            print(one_line(f"error: {args.case}: {error}"), file=sys.stderr)
            return EXIT_BAD_INPUT
        for name, ok, explanation in results:
            print(f"check {name}: {'ok' if ok else 'FAILS'}: {explanation}")
        failing = [name for name, ok, _ in results if not ok]
        if not failing and _diverged(failure, outcome):
            return EXIT_STILL_FAILS
        print(f"still fails: {', '.join(failing)}" if failing else "the recorded check(s) pass now")
        return EXIT_STILL_FAILS if failing else EXIT_OK
    test = failure.get("test")
    if isinstance(test, str) and test:
        if invisible_in(test) is not None:  # a pytest node id is one line of plain text; pytest echoes it raw
            said = f"error: {args.case}: failure.test: expected a pytest node id, got {test!r}"
            print(one_line(said), file=sys.stderr)
            return EXIT_BAD_INPUT
        if _diverged(failure, outcome, rerun=True):
            return EXIT_STILL_FAILS
        return _rerun_test(test, failure)
    # An old case file, or one written by hand: the only check known is that a valid program passes.
    print("no recorded check: judging the verdict (a valid program must pass)")
    return EXIT_OK if _passes(outcome) else EXIT_STILL_FAILS


def _passes(outcome: RunOutcome) -> bool:
    """``invariants.passes``, the check a valid program meets (a pass, not one a race decided: ``describe``
    printed the race), without recording a failed check: this is the replay's verdict, not a test's."""
    from simnccl.testing.invariants import passes

    return bool(passes.__wrapped__(outcome))  # type: ignore[attr-defined]


def _policy_changed(failure: Mapping[str, Any]) -> list[str]:
    """The recorded policy source files whose content is not what it was when the test failed."""
    recorded = failure.get("policy_sources")
    if not isinstance(recorded, Mapping):
        return []
    return [path for path, digest in recorded.items() if isinstance(path, str) and file_digest(path) != digest]


def _diverged(failure: Mapping[str, Any], outcome: RunOutcome, *, rerun: bool = False) -> bool:
    """Whether this simulation differs from the failing one the plugin recorded (its trace hash), by the same
    simnccl and the same policy source: then the case is not deterministic, and "passes now" would hide a
    failure that comes and goes. A policy whose source changed since explains the difference (the user's fix:
    the replay said "not deterministic", exit 1, after every fix). ``rerun``: asked before re-running a test whose
    own assertion failed (the re-run's pass said "passes now" of a policy reading the environment, exit 0, where
    this simulation already differed from the failing one)."""
    recorded = failure.get("trace_hash")
    if not isinstance(recorded, str) or recorded == outcome.trace_hash:
        return False
    changed = _policy_changed(failure)
    if changed:
        print(
            f"note: the policy's source changed since the failure ({', '.join(changed)}): this simulation differs "
            "from the failing one as a change to the policy makes it"
        )
        return False
    if failure.get("simnccl_version") != __version__:
        print(
            f"note: the failure was recorded by simnccl {failure.get('simnccl_version')}, this is {__version__}: "
            f"its simulation may differ (recorded trace hash {recorded})"
        )
        return False
    said = "this simulation" if rerun else "the recorded check(s) pass now, but this simulation"
    print(
        f"{said} is not the one that failed: trace hash "
        f"{outcome.trace_hash}, recorded {recorded}, by the same simnccl. Something the run depends on is not "
        "deterministic (a policy reading random numbers, the clock, hash() of a string, or state it kept from "
        "another case): the failure comes and goes, and it did fail. Exit 1."
    )
    return True


def _rerun_test(test: str, failure: Mapping[str, Any]) -> int:
    """The failure was the test's own assertion: run that test again, as it ran (profile, folder)."""
    import os
    import subprocess

    rootdir = failure.get("rootdir")
    cwd = rootdir if isinstance(rootdir, str) and Path(rootdir).is_dir() else None
    env = dict(os.environ)
    profile = failure.get("profile_env")
    if isinstance(profile, str) and profile:
        env["SIMNCCL_HYPOTHESIS_PROFILE"] = profile
    rerun_args = failure.get("rerun_args")
    seeded = [str(a) for a in rerun_args] if isinstance(rerun_args, list) else []
    # ``-m ""``: the node id alone selects the test, whatever marker filter the suite's addopts apply (a test
    # marked ``slow`` under ``addopts = -m 'not slow'`` was run with ``-m slow`` and failed; its rerun ran nothing)
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:randomly", "-q", "-m", "", *seeded, test]
    print(f"the failure was the test's own assertion: re-running {test} ({' '.join(command[2:])})", flush=True)
    with tempfile.TemporaryDirectory(prefix="simnccl-replay-") as folder:
        report = Path(folder) / "rerun.xml"
        try:
            done = subprocess.run(
                [*command, f"--junitxml={report}"], cwd=cwd, env=env, timeout=CASE_WALL_S * 20, check=False
            )
        except subprocess.TimeoutExpired:
            print(one_line(f"error: {test} still running after {CASE_WALL_S * 20:g} s"), file=sys.stderr)
            return EXIT_STILL_FAILS
        ran = _ran_and_passed(report) if done.returncode == 0 else None
    if done.returncode == 0 and ran is not None:
        print(
            one_line(
                f"error: {test} did not run ({ran}): a re-run that runs nothing proves nothing; re-run it with "
                "the options or environment that enable it (the failure's own command)"
            ),
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if done.returncode == 0:
        if failure.get("examples_reproducible") is False:
            print(
                f"{test} passed this time, but it draws its examples at random (its profile is not derandomized and "
                "no seed was given): the failing example need not have been drawn again. Not known to pass; run it "
                "under a seed (--hypothesis-seed N) or a derandomized profile to replay a failure. Exit 1."
            )
            return EXIT_STILL_FAILS
        print(f"{test} passes now")
        return EXIT_OK
    if done.returncode == 1:
        return EXIT_STILL_FAILS
    print(one_line(f"error: pytest could not run {test} (exit {done.returncode})"), file=sys.stderr)
    return EXIT_BAD_INPUT


def _ran_and_passed(report: Path) -> str | None:
    """None when pytest's JUnit report says one test or more ran and none was skipped; else what it says.

    Why: pytest exits 0 when the test is skipped (a ``skipif`` on an option or variable the re-run lacks, as
    ``--runslow``), and the replay said "passes now", exit 0, of a policy that still fails (found by a tester)."""
    import xml.etree.ElementTree as ElementTree

    try:
        root = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        return "pytest wrote no report of it"
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = sum(int(suite.get("tests", "0")) for suite in suites)
    skipped = sum(int(suite.get("skipped", "0")) for suite in suites)
    if tests == 0:
        return "no test collected or selected"
    if skipped:
        return f"{skipped} of {tests} skipped"
    return None


if __name__ == "__main__":
    # Guarded as every simnccl command is: a crash exits 70, not 1 ("still fails"); a user's policy that raises, 2.
    from simnccl.cli_guard import guarded

    sys.exit(guarded(main, command=("testing.replay",))())

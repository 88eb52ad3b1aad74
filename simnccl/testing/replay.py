"""A simulation case as data: cluster, release, env, policy and one program per rank — dumped, printed, replayed.

Why: a property test that fails must leave behind the minimal failing program in a form a person can run
again without hypothesis (DESIGN, "Hypothesis stateful testing"): a JSON file and the one command that
replays it (``python -m simnccl.testing.replay FILE``), plus the same case as a Python snippet. This module
imports neither hypothesis nor pytest, so the replay works from a plain install.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from simnccl.engine import Limits, RunOutcome
from simnccl.ops import NO_OPTIONS, OP_TYPES, Op, PgOptions

SCHEMA = "simnccl-case/1"

# A generated case is small (<= 16 ranks, tens of ops) and simulates in milliseconds: one that runs for 30
# seconds is a runaway engine, and must end as an error, not stall a test session (DESIGN rule 7). The
# engine's own guard is passed too; the alarm also catches loops that never reach the engine's check.
CASE_WALL_S = 30.0
CASE_LIMITS = Limits(wall_s=CASE_WALL_S)


class CaseTimeout(RuntimeError):
    """A case ran past ``CASE_WALL_S`` of wall time: an engine that no longer makes progress."""


@contextlib.contextmanager
def _alarm(seconds: float, what: str, error: Callable[[], BaseException] | None = None) -> Iterator[None]:
    """Raise ``error()`` after ``seconds`` (main thread on POSIX only; elsewhere a no-op).

    ``error``: the exception class or factory to raise (``simnccl.capture`` raises a BaseException there, which
    the captured code cannot swallow); None raises CaseTimeout naming ``what``.
    """
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        if error is not None:
            raise error()
        raise CaseTimeout(f"{what}: still simulating after {seconds:g} s of wall time (a runaway engine loop)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class SimCase:
    """Everything one simulation needs. ``programs`` holds one op tuple per rank; ranks with identical
    programs share one tuple object (DESIGN rule 8), and a case whose ranks all share one is run as a single
    program so the engine can take group creation in cohorts."""

    programs: tuple[tuple[Op, ...], ...]
    gpu: str = "h100-80gb"
    nodes: int = 1
    gpus_per_node: int = 2
    release: str = "2.15"
    env: tuple[tuple[str, str], ...] = ()
    policy: str | None = None
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
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
        program: Any = list(self.programs[0]) if self.shared else [list(p) for p in self.programs]
        _count_simulation(self, chosen)
        with _alarm(CASE_WALL_S, f"a {self.world_size}-rank case under policy {chosen!r}"):
            return harness.simulate(
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
            "policy": self.policy,
            "note": self.note,
            "programs": [[op.to_dict() for op in p] for p in distinct],
            "rank_program": index,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SimCase:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a simnccl case (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        distinct = [tuple(op_from_dict(d) for d in ops) for ops in data["programs"]]
        return cls(
            programs=tuple(distinct[i] for i in data["rank_program"]),
            gpu=data["gpu"],
            nodes=data["nodes"],
            gpus_per_node=data["gpus_per_node"],
            release=data["release"],
            env=tuple(sorted(data.get("env", {}).items())),
            policy=data.get("policy"),
            note=data.get("note", ""),
        )

    def dump(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> SimCase:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

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
        lines += [
            f"out = simulate({arg}, gpu={self.gpu!r}, nodes={self.nodes}, gpus_per_node={self.gpus_per_node},",
            f"               release={self.release!r}, env={dict(self.env)!r}, policy={self.policy!r})",
            "print(out.verdict, out.hangs, out.errors)",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example: runnable text
        return f"SimCase.from_json({json.dumps(self.to_json())})"


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

COUNTS = {"programs": 0, "simulations": 0}
_LAST: list[object] = [None, None]  # the last case simulated, and the policy it ran under


def _count_simulation(case: SimCase, policy: object) -> None:
    """Count simulations, and distinct cases simulated (a case run under several policies counts once)."""
    COUNTS["simulations"] += 1
    if _LAST[0] is not case:
        COUNTS["programs"] += 1
    _LAST[0], _LAST[1] = case, policy


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
    for device, ledger in sorted(outcome.ledgers.items()):
        lines.append(
            f"  {device}: used {ledger.used_bytes / 2**20:.1f} MiB, peak {ledger.peak_bytes / 2**20:.1f} MiB "
            f"of {ledger.total_bytes / 2**20:.1f} MiB"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simnccl.testing.replay", description="Replay a simnccl case dumped by a failing test."
    )
    parser.add_argument("case", help="JSON file written by the simnccl pytest plugin")
    parser.add_argument("--policy", help="override the case's policy")
    parser.add_argument("--snippet", action="store_true", help="print the case as Python instead of running it")
    args = parser.parse_args(argv)
    case = SimCase.load(args.case)
    if args.policy:
        case = case.with_(policy=args.policy)
    if args.snippet:
        print(case.snippet())
        return 0
    print(
        f"{args.case}: {case.world_size} ranks on {case.nodes}x{case.gpus_per_node} {case.gpu}, torch {case.release}, "
        f"env {dict(case.env)}, policy {case.policy or 'torch-default'}"
    )
    if case.note:
        print(f"note: {case.note}")
    outcome = case.run()
    print(describe(outcome))
    return 0 if outcome.verdict == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())

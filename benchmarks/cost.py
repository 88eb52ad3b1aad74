"""``simnccl cost`` speed on Megatron TP8·PP4·DP16 (512 ranks): seconds per column, all in one process.

Run: ``python benchmarks/cost.py [--tp 8 --pp 4 --dp 16] [--policy P ...] [--slow-path] [--command [--jobs N]]``;
the 4,096-rank target: ``python benchmarks/cost.py --tp 8 --pp 8 --dp 64 --policy dedupe``.

Why: issue 6 asks that ``simnccl cost --workload megatron --tp 8 --pp 4 --dp 16`` finish in seconds for every
policy. Each column is one simulation of the whole startup (~2,900 ``new_group`` calls on each of 512 ranks);
most of those calls are made by ranks outside the group, which the engine takes on its outsider fast path
(``Engine._outsider_calls``) or in cohorts. This script times exactly what the command simulates: the columns
of ``simnccl.cost.columns_for`` (torch's default, the legacy env and every built-in policy, or ``--policy``),
on the programs the Megatron generator builds once, each column in a fresh ``Engine``. ``--slow-path`` runs
the engine with ``fast_path=False`` (the ordinary per-rank path) for comparison; ``--check`` runs both and
exits 1 unless every column's trace hash agrees.

Each column must end with verdict "pass" (exit 1 otherwise). Wall and CPU seconds cover ``Engine(...)`` plus
``run()`` (CPU seconds are the figure to compare on a shared machine); building the programs is timed
separately. The in-run ratio: the columns' CPU seconds over those of a raw simpy baseline measured first in the
same process (``BASELINE_PROCESSES`` processes each yielding ``BASELINE_EVENTS`` ``timeout(0)``), so a figure
from a slower or busier machine can be compared with one from another. ``--command`` then also times the
columns as the command runs them (``simnccl.cost_runs.run_columns``: worker processes, ``--jobs`` defaulting as
the command's does, each column's figures measured), in the same run, and prints its ratio to the one-process
sum, and the command's CPU seconds (this process's and its workers', whatever the workers cost to start
included) with their ratio to the baseline. The LAST line is exactly::

    megatron512_total_s=<x> cpu_s=<c> ratio=<r> worst_policy=<name> worst_s=<y>[ <command>]

where ``<command>``, with ``--command`` only, is ``command_s=<z> jobs=<n> command_cpu_s=<u> command_ratio=<q>``

(``total_s``/``worst_s``: wall seconds; ``cpu_s``: the columns' CPU seconds; ``ratio``: ``cpu_s`` over the
baseline's CPU seconds; ``command_s``: the command's wall seconds; ``command_cpu_s``: its CPU seconds, and
``command_ratio`` those over the baseline's.)

(``megatron512`` is the label for the default sizes; other sizes print ``megatron<world>``.)
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import simpy

from simnccl.cost import Column, build_cluster, column_config, columns_for, rank_ops, run_column
from simnccl.cost_runs import default_jobs, run_columns
from simnccl.engine import Engine
from simnccl.ops import Program
from simnccl.workloads import GENERATORS

GPU = "h100-80gb"
RELEASE = "2.15"
GPUS_PER_NODE = 8
BASELINE_PROCESSES, BASELINE_EVENTS = 512, 1_000


@dataclass(frozen=True, slots=True)
class Timing:
    column: str
    verdict: str
    wall_s: float
    cpu_s: float
    trace_hash: str
    ops: int


def build_programs(tp: int, pp: int, dp: int) -> tuple[Program, ...]:
    """The Megatron generator's startup for tp x pp x dp ranks (all other knobs at Megatron's defaults)."""
    world = tp * pp * dp
    return tuple(GENERATORS["megatron"]({"tp": tp, "pp": pp, "dp": dp}, world))


def time_column(programs: Sequence[Program], column: Column, *, fast_path: bool = True) -> Timing:
    """One column as ``simnccl cost`` runs it (``column_config``, the command's own), timed around the engine only."""
    cluster = build_cluster(GPU, len(programs), GPUS_PER_NODE)
    config = column_config(tuple(programs), cluster, RELEASE, column)
    gc.collect()  # start each column from the same heap
    start, cpu = time.perf_counter(), time.process_time()
    outcome = Engine(config, fast_path=fast_path).run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Timing(column.name, outcome.verdict, wall, cpu, outcome.trace_hash, outcome.ops_executed)


def simpy_baseline_cpu_s() -> float:
    """CPU seconds of raw simpy: ``BASELINE_PROCESSES`` processes each yielding ``BASELINE_EVENTS`` zero-delay
    timeouts (the cheapest a simpy engine can do per event; the ratio's denominator)."""
    env = simpy.Environment()

    def process(n: int):  # type: ignore[no-untyped-def]
        for _ in range(n):
            yield env.timeout(0)

    for _ in range(BASELINE_PROCESSES):
        env.process(process(BASELINE_EVENTS))
    gc.collect()
    start = time.process_time()
    env.run()
    return time.process_time() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--dp", type=int, default=16)
    parser.add_argument("--policy", action="append", help="policy columns (default: every built-in policy)")
    parser.add_argument("--slow-path", action="store_true", help="time the engine with fast_path=False")
    parser.add_argument("--check", action="store_true", help="also run the slow path; trace hashes must agree")
    parser.add_argument("--command", action="store_true", help="also time the columns as simnccl cost runs them")
    parser.add_argument("--jobs", type=int, default=None, help="with --command: worker processes (default: as cost)")
    args = parser.parse_args(argv)

    baseline_s = simpy_baseline_cpu_s()
    print(f"raw simpy: {BASELINE_PROCESSES} processes x {BASELINE_EVENTS} timeout(0) = {baseline_s:.3f} CPU s")
    start = time.perf_counter()
    programs = build_programs(args.tp, args.pp, args.dp)
    world = len(programs)
    print(f"megatron tp={args.tp} pp={args.pp} dp={args.dp}: {world} ranks, {len(programs[0])} ops per rank")
    print(f"programs built in {time.perf_counter() - start:.2f} s")
    timings = []
    failed = False
    for column in columns_for(args.policy):
        timing = time_column(programs, column, fast_path=not args.slow_path)
        timings.append(timing)
        line = (
            f"{timing.column:>18}  {timing.wall_s:7.2f} s  cpu {timing.cpu_s:6.2f} s  {timing.verdict}  "
            f"ops={timing.ops}  {timing.trace_hash}"
        )
        if args.check:
            other = time_column(programs, column, fast_path=args.slow_path)
            same = other.trace_hash == timing.trace_hash and other.verdict == timing.verdict
            line += f"  other path {other.wall_s:.2f} s {'same' if same else 'DIFFERENT'}"
            failed |= not same
        failed |= timing.verdict != "pass"
        print(line, flush=True)
    total = sum(t.wall_s for t in timings)
    cpu = sum(t.cpu_s for t in timings)
    worst = max(timings, key=lambda t: t.wall_s)
    print(f"columns: {total:.2f} s wall, {cpu:.2f} CPU s = {cpu / baseline_s:.2f}x the raw simpy baseline")
    tail = ""
    if args.command:
        command_s, command_cpu, jobs, verdicts = time_command(programs, columns_for(args.policy), args.jobs)
        failed |= any(v != "pass" for v in verdicts)
        print(
            f"as the command runs them: {command_s:.2f} s with {jobs} job(s), {total / command_s:.2f}x the sum above; "
            f"{command_cpu:.2f} CPU s (workers included) = {command_cpu / baseline_s:.2f}x the raw simpy baseline"
        )
        tail = (
            f" command_s={command_s:.3f} jobs={jobs} command_cpu_s={command_cpu:.3f}"
            f" command_ratio={command_cpu / baseline_s:.2f}"
        )
    if failed:
        print("FAILED: a column did not pass, or the two paths disagree", file=sys.stderr)
    print(
        f"megatron{world}_total_s={total:.3f} cpu_s={cpu:.3f} ratio={cpu / baseline_s:.2f} "
        f"worst_policy={worst.column} worst_s={worst.wall_s:.3f}{tail}"
    )
    return 1 if failed else 0


def time_command(
    programs: Sequence[Program], columns: Sequence[Column], jobs: int | None
) -> tuple[float, float, int, list[str]]:
    """Every column as ``simnccl cost`` runs it (its column runner, its default ``--jobs``): wall seconds, and CPU
    seconds of this process and of the workers (reaped by the time ``run_columns`` returns)."""
    chosen = jobs if jobs is not None else default_jobs(len(columns), rank_ops(programs))
    cluster = build_cluster(GPU, len(programs), GPUS_PER_NODE)
    before = _cpu_s()
    start = time.perf_counter()
    finished = run_columns(run_column, [(tuple(programs), cluster, RELEASE, c, 0) for c in columns], chosen)
    wall = time.perf_counter() - start
    cpu = _cpu_s() - before
    return wall, cpu, chosen, [r.verdict if r is not None else "not finished" for r in finished.results]


def _cpu_s() -> float:
    """User and system CPU seconds of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    sys.exit(main())

"""Property-test throughput: generated programs simulated per second, 8 ranks, at most 30 ops per rank.

Run: ``python benchmarks/property.py [--programs N] [--seed S]``.

What is measured, in ONE process (no xdist), the loop a property test pays per example:

1. **End to end** (the headline): hypothesis draws a case from ``simnccl.testing.strategies.cases`` (8 ranks
   on one or two nodes of a drawn GPU kind, a drawn release, env knobs and policy, a valid SPMD program of at
   most 30 ops per rank), the case is simulated through ``simnccl.testing.simulate`` and checked with
   ``invariants.passes`` and ``invariants.within_capacity``. ``programs_per_s = N / wall`` over the whole
   hypothesis run (generation, simulation, checks, hypothesis' own bookkeeping).
2. **Simulation only**: the same N cases simulated again, without hypothesis: ``sim_programs_per_s``.
3. **Generation only**: the share of (1) that is neither simulation nor checking.
4. **Hypothesis' floor**: the same number of examples of a trivial strategy making as many bounded-integer
   choices as a case makes on average (``FLOOR_DRAWS``), nothing simulated: what hypothesis alone costs an
   example, below which no strategy or simulator change can take (1).

Every example is checked: a failed invariant exits 1 (a benchmark of a broken simulator measures nothing).
The cases are derandomized by ``--seed`` so two runs measure the same programs.

Target: ``programs_per_s >= 300`` (2,000 programs for the ``ci`` profile in under ~7 s of one core). On a
shared machine wall time counts the other processes' turns too, so the CPU seconds of this process are
printed beside it: ``cpu_programs_per_s`` is what one core of its own would do.

The LAST line is exactly::

    programs_per_s=<x> sim_programs_per_s=<y> mean_ops_per_rank=<z> cpu_programs_per_s=<w>
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from simnccl.testing import invariants as inv
from simnccl.testing.replay import SimCase
from simnccl.testing.strategies import cases

WORLD = 8
MAX_OPS = 30
# Bounded-integer choices a case of ``cases(min_world=8, max_world=8, max_ops=30)`` makes on average (13.4,
# counted over 300 cases of seed 0 at 3145d2c): the floor's examples make as many.
FLOOR_DRAWS = 13


def hypothesis_floor(examples: int, seed_value: int) -> float:
    """CPU seconds hypothesis takes for ``examples`` examples of ``FLOOR_DRAWS`` integer choices each."""
    choice = st.integers(0, 255)

    @st.composite
    def choices(draw: st.DrawFn) -> list[int]:  # drawn as ``cases`` draws: inside one composite strategy
        return [draw(choice) for _ in range(FLOOR_DRAWS)]

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=["generate"],
        suppress_health_check=list(HealthCheck),
    )
    @given(choices())
    def trivial(values: list[int]) -> None:
        pass

    cpu_start = time.process_time()
    trivial()
    return time.process_time() - cpu_start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=2000, help="generated programs to simulate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    seen: list[SimCase] = []
    sim_s = [0.0, 0.0]  # wall, CPU
    failures: list[str] = []

    @seed(args.seed)
    @settings(
        max_examples=args.programs,
        deadline=None,
        database=None,
        derandomize=False,
        phases=["generate"],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(min_world=WORLD, max_world=WORLD, max_ops=MAX_OPS))
    def one(case: SimCase) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        out = case.run()
        for verdict in (inv.passes(out), inv.within_capacity(out)):
            if not verdict:
                failures.append(f"{verdict.explanation}\n{case.snippet()}")
        sim_s[0] += time.perf_counter() - start
        sim_s[1] += time.process_time() - cpu_start
        seen.append(case)

    print(f"property throughput: {args.programs} generated programs, {WORLD} ranks, <= {MAX_OPS} ops per rank")
    start, cpu_start = time.perf_counter(), time.process_time()
    one()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if failures:
        print(f"FAILED: {len(failures)} invariant violation(s); first:\n{failures[0]}")
        return 1
    assert all(c.world_size == WORLD and c.ops_per_rank() <= MAX_OPS for c in seen)
    n = len(seen)
    ops = [c.ops_per_rank() for c in seen]

    start, cpu_start = time.perf_counter(), time.process_time()
    for case in seen:
        case.run()
    sim_only, sim_only_cpu = time.perf_counter() - start, time.process_time() - cpu_start

    floor_cpu = hypothesis_floor(n, args.seed)

    programs_per_s = n / wall
    sim_programs_per_s = n / sim_only
    print(f"  programs:                 {n} (ops per rank: mean {statistics.mean(ops):.1f}, max {max(ops)})")
    print(f"  end to end:               {wall:.2f} s  -> {programs_per_s:.0f} programs/s")
    print(f"    in CPU seconds:         {cpu:.2f} s  -> {n / cpu:.0f} programs/s")
    print(
        f"    of which simulation:    {sim_s[0]:.2f} s ({sim_s[0] / wall:.0%}); "
        f"CPU {sim_s[1]:.2f} s ({sim_s[1] / cpu:.0%})"
    )
    print(
        f"    generation + hypothesis: {wall - sim_s[0]:.2f} s ({(wall - sim_s[0]) / wall:.0%}); "
        f"CPU {cpu - sim_s[1]:.2f} s ({(cpu - sim_s[1]) / cpu:.0%})"
    )
    print(f"  simulation only (rerun):  {sim_only:.2f} s  -> {sim_programs_per_s:.0f} programs/s")
    print(f"    in CPU seconds:         {sim_only_cpu:.2f} s  -> {n / sim_only_cpu:.0f} programs/s")
    print(
        f"  hypothesis' floor:        {floor_cpu:.2f} CPU s -> {n / floor_cpu:.0f} examples/s "
        f"({FLOOR_DRAWS} integer choices an example, nothing simulated)"
    )
    print(f"  target >= 300 programs/s: {'met' if programs_per_s >= 300 else 'NOT met'}")
    print(
        f"programs_per_s={programs_per_s:.1f} sim_programs_per_s={sim_programs_per_s:.1f} "
        f"mean_ops_per_rank={statistics.mean(ops):.1f} cpu_programs_per_s={n / cpu:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

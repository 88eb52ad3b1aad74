"""Steady-state collectives: what one rank's all_reduce, or one send/recv, costs the engine once its groups exist.

Run: ``python benchmarks/collectives.py [--ranks R] [--ops N] [--programs P] [--repeats K]``.

Why: the startup benchmark (``engine.py``) measures group creation, and the property benchmark mixes every op.
Neither isolates the op a training step repeats, so neither says what the collective path alone costs.

What is measured, all in ONE process (so that the ratio cancels out the machine):

1. **Raw simpy baseline**: as ``engine.py``'s, ``simpy_events_per_s``.
2. **Three programs** on one node of ``R`` H100 GPUs (torch 2.15, the built-in profile), every rank running:
   - ``empty``: ``set_device``, ``init_process_group`` (nccl), nothing else;
   - ``all_reduce``: the same, then ``N`` all_reduces on the world (one program object shared by every rank);
   - ``send_recv``: the same, then ``N`` sends from each even rank to the next odd one, which receives them.
   Each is simulated ``P`` times in a round, ``K`` rounds; a program's figure is its best round's CPU seconds.
   Each run is checked: verdict "pass" and every op executed. A failed check exits 1.
3. **Per rank-op**: ``(best(program) - best(empty)) / (P x R x N)``: the empty program's fixed cost (engine,
   ranks, the default group's communicators) measured in the same run and taken off. ``ratio`` is rank-ops per
   second over raw simpy events per second (1.0: an op costs the engine what one bare ``timeout(0)`` costs simpy).

The LAST line is exactly::

    all_reduce_us=<x> send_recv_us=<y> all_reduce_ratio=<r> send_recv_ratio=<s> empty_ms=<z>
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine.py's baseline, when run as a script

from engine import run_baseline

from simnccl.ops import AllReduce, InitProcessGroup, Op, Recv, Send, SetDevice
from simnccl.testing import simulate

GPU = "h100-80gb"
START: tuple[Op, ...] = (SetDevice(), InitProcessGroup(backend="nccl"))


def programs(ranks: int, ops: int) -> dict[str, list[list[Op]] | list[Op]]:
    """The three programs: one op list shared by every rank, or one per rank (send/recv differ)."""
    reduce_all = [*START, *([AllReduce()] * ops)]
    pairs = []
    for rank in range(ranks):
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        op: Op = Send(peer=peer) if rank % 2 == 0 else Recv(peer=peer)
        pairs.append([*START, *([op] * ops)])
    return {"empty": list(START), "all_reduce": reduce_all, "send_recv": pairs}


def check(name: str, program: list[list[Op]] | list[Op], ranks: int) -> None:
    """One run of ``program``: it must pass and execute every op of every rank, or the benchmark measures nothing."""
    out = simulate(program, gpu=GPU, gpus_per_node=ranks)
    per_rank = len(program) if program and not isinstance(program[0], list) else len(program[0])
    if out.verdict != "pass" or out.ops_executed != ranks * per_rank:
        raise SystemExit(
            f"FAILED: {name}: verdict {out.verdict!r}, {out.ops_executed} ops executed of {ranks * per_rank}"
        )


def best_cpu_s(program: list[list[Op]] | list[Op], ranks: int, runs: int, rounds: int) -> float:
    """The least CPU seconds ``runs`` simulations of ``program`` took, over ``rounds`` rounds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(runs):
            simulate(program, gpu=GPU, gpus_per_node=ranks)
        best = min(best, time.process_time() - start)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="ranks on the one node (even, 2-8)")
    parser.add_argument("--ops", type=int, default=64, help="collectives (or sends) per rank")
    parser.add_argument("--programs", type=int, default=60, help="simulations of each program per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; the best one counts")
    args = parser.parse_args(argv)
    if not (2 <= args.ranks <= 8 and args.ranks % 2 == 0) or min(args.ops, args.programs, args.repeats) < 1:
        parser.error("--ranks: an even count from 2 to 8; --ops, --programs, --repeats: at least 1")

    baseline = run_baseline(256, 2000)
    print(f"raw simpy: {baseline.events:,} events in {baseline.wall_s:.3f} s -> {baseline.events_per_s:,.0f} events/s")
    built = programs(args.ranks, args.ops)
    for name, program in built.items():
        check(name, program, args.ranks)
    best = {name: best_cpu_s(program, args.ranks, args.programs, args.repeats) for name, program in built.items()}
    rank_ops = args.programs * args.ranks * args.ops
    empty_ms = best["empty"] / args.programs * 1e3
    print(
        f"{args.ranks} ranks, {args.ops} ops per rank, best of {args.repeats} rounds of {args.programs} programs; "
        f"empty program {empty_ms:.3f} ms"
    )
    figures = {}
    for name in ("all_reduce", "send_recv"):
        per_op_s = max(best[name] - best["empty"], 0.0) / rank_ops
        ratio = (1 / per_op_s) / baseline.events_per_s if per_op_s else float("inf")
        figures[name] = (per_op_s * 1e6, ratio)
        print(f"  {name:<11} {per_op_s * 1e6:8.2f} us a rank's op   ops/s : simpy {ratio:.4f}")
    print(
        f"all_reduce_us={figures['all_reduce'][0]:.2f} send_recv_us={figures['send_recv'][0]:.2f} "
        f"all_reduce_ratio={figures['all_reduce'][1]:.4f} send_recv_ratio={figures['send_recv'][1]:.4f} "
        f"empty_ms={empty_ms:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Megatron-Core's destroy / re-initialize cycle, as test suites run it: the ``megatron`` generator's knobs
``reinit_cycles`` and ``reinit_destroy`` (its startup, repeated).

Follows NVIDIA/Megatron-LM#6897's repro: ``Utils.initialize_model_parallel(tp, pp)`` once, then per cycle
``Utils.destroy_model_parallel()`` (``parallel_state.destroy_model_parallel()`` and a ``barrier``) and
``Utils.initialize_model_parallel(tp, pp)`` again. Until PR #6902, ``destroy_model_parallel`` released only
the Gloo groups and set every NCCL group to None without ``destroy_process_group()``, so c10d kept them in its
``_world.pg_map`` with their communicators (``reinit_destroy = "gloo"``, the default). The fix destroys
every group ``create_group`` handed out (``reinit_destroy = "all"``).

Each cycle's calls are the ``megatron`` generator's (megatron-core 0.19.2), with handles renamed per call so a
destroy names exactly the group that call made (``destroy_process_group`` of a non-member's
``NON_GROUP_MEMBER`` is a no-op, as the fix skips it). A checkpoint ``cycle<k>`` follows the k-th
initialisation: where #6897 printed ``len(_world.pg_map)``.
"""

from __future__ import annotations

from dataclasses import replace

from simnccl.ops import (
    WORLD,
    Barrier,
    Checkpoint,
    Collective,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Op,
    Program,
    SetDevice,
)
from simnccl.workloads._common import INT, STR, Param

DESTROY_MODES = ("gloo", "all")
PARAMS = (
    Param(
        "reinit_cycles",
        INT,
        1,
        "initialize_model_parallel calls in one process: the first, then one per destroy_model_parallel + "
        "initialize_model_parallel (a test suite's cycle, Megatron-LM#6897)",
        minimum=1,
    ),
    Param(
        "reinit_destroy",
        STR,
        "gloo",
        "what destroy_model_parallel destroys between cycles: 'gloo' (Megatron before PR #6902: the leak) or "
        "'all' (the fix)",
        choices=DESTROY_MODES,
    ),
)


def _one_init(ops: tuple[Op, ...], cycle: int) -> tuple[list[Op], list[tuple[str, str | None]]]:
    """One ``initialize_model_parallel``'s calls with per-call handles, and (handle, backend) of each group."""
    out: list[Op] = []
    made: list[tuple[str, str | None]] = []
    latest: dict[str, str] = {}  # the program's handle -> its latest per-call name (later calls rebind it)
    for index, op in enumerate(ops):
        if isinstance(op, SetDevice | InitProcessGroup | Checkpoint):
            continue
        if isinstance(op, NewGroup) and op.bind:
            handle = f"{op.bind}@{cycle}.{index}"
            latest[op.bind] = handle
            made.append((handle, op.backend))
            out.append(replace(op, bind=handle))
        elif isinstance(op, Collective) and op.group in latest:
            out.append(replace(op, group=latest[op.group]))
        else:
            out.append(op)
    return out, made


def cycle_ops(startup: tuple[Op, ...], cycles: int, destroy: str) -> list[Op]:
    """The startup, then ``cycles - 1`` destroy/re-init cycles, a checkpoint ``cycle<k>`` after each init."""
    head = [op for op in startup if isinstance(op, SetDevice | InitProcessGroup)]
    ops: list[Op] = [*head, Checkpoint("after_init")]
    held: list[tuple[str, str | None]] = []
    for cycle in range(1, cycles + 1):
        if cycle > 1:
            ops += [
                DestroyProcessGroup(group=h) for h, backend in reversed(held) if destroy == "all" or backend == "gloo"
            ]
            ops.append(Barrier(group=WORLD))
            held = []
        calls, made = _one_init(startup, cycle)
        ops += calls
        held += made
        ops.append(Checkpoint(f"cycle{cycle}"))
    return ops


def with_reinit_cycles(programs: tuple[Program, ...], cycles: int, destroy: str) -> tuple[Program, ...]:
    """Every rank's startup repeated as ``cycles`` initialisations; unchanged for one (the default)."""
    if cycles == 1:
        return programs
    by_id: dict[int, Program] = {}
    out = []
    for program in programs:  # identical startups stay one Program (DESIGN rule 8)
        cycled = by_id.get(id(program))
        if cycled is None:
            cycled = by_id[id(program)] = Program(tuple(cycle_ops(program.ops, cycles, destroy)))
        out.append(cycled)
    return tuple(out)

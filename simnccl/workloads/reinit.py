"""Megatron-Core's destroy / re-initialize cycle, as test suites run it: the ``megatron`` generator's knobs
``reinit_cycles`` and ``reinit_destroy`` (its startup, repeated).

Follows NVIDIA/Megatron-LM#6897's repro: ``Utils.initialize_model_parallel(tp, pp)`` once, then per cycle
``Utils.destroy_model_parallel()`` and ``Utils.initialize_model_parallel(tp, pp)`` again. ``Utils`` is Megatron's
``tests/unit_tests/test_utilities.py`` (main of 2026-08-22, d98e8a6), and its glue replaces the training
script's: ``initialize_model_parallel`` calls ``ps.destroy_model_parallel()`` (a no-op by then), initialises
torch once (``set_device``, ``init_process_group(backend="nccl", world_size, rank)`` with no timeout, then a
world ``barrier()``) and calls ``ps.initialize_model_parallel(tp, pp)``; ``destroy_model_parallel`` is a world
``barrier()`` and then ``ps.destroy_model_parallel()``. Until PR #6902, ``ps.destroy_model_parallel`` released
only the Gloo groups and set every NCCL group to None without ``destroy_process_group()``, so c10d kept them in
its ``_world.pg_map`` with their communicators (``reinit_destroy = "gloo"``, the default). The fix destroys
every group ``create_group`` handed out (``reinit_destroy = "all"``).

Each cycle's calls are the ``megatron`` generator's (megatron-core 0.19.2; the repro leaves
``distributed_timeout_minutes`` at ``initialize_model_parallel``'s default, 30), with handles renamed per call
so a destroy names exactly the group that call made (``destroy_process_group`` of a non-member's
``NON_GROUP_MEMBER`` is a no-op, as the fix skips it). A checkpoint ``cycle<k>`` follows the k-th
initialisation: where #6897 printed ``len(_world.pg_map)``. tests/test_framework_fidelity.py runs the repro on
the real ``parallel_state`` under ``simnccl.capture`` and checks these ops and the real ``pg_map`` counts.
"""

from __future__ import annotations

from dataclasses import replace

from simnccl.limits import current as current_limits
from simnccl.limits import exceeded
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
from simnccl.workloads._common import INT, STR, Param, WorkloadError

DESTROY_MODES = ("gloo", "all")
# What megatron-core 0.19.2's ``parallel_state.destroy_model_parallel`` hands to ``destroy_process_group``, in its
# order, by ``group_desc``: the globals ``_DATA_PARALLEL_GROUP_GLOO``, ``_DATA_PARALLEL_GROUP_WITH_CP_GLOO``,
# ``_EXPERT_DATA_PARALLEL_GROUP_GLOO`` and ``_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO`` (the level-0
# hierarchical group, else an alias of the expert one, skipped once destroyed). The other Gloo groups
# (``INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO``, the level-1 hierarchical one) stay, like every NCCL group.
GLOO_GROUPS_DESTROYED = (
    "DATA_PARALLEL_GROUP_GLOO",
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO",
    "EXPERT_DATA_PARALLEL_GROUP_GLOO",
    "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_GLOO_L0",
)
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
        "what destroy_model_parallel destroys between cycles: 'gloo' (Megatron before PR #6902, the leak: the "
        "Gloo groups it keeps in globals) or 'all' (the fix: every group created)",
        choices=DESTROY_MODES,
    ),
)


def _one_init(ops: tuple[Op, ...], cycle: int) -> tuple[list[Op], list[NewGroup]]:
    """One ``initialize_model_parallel``'s calls with per-call handles, and each group-creating call."""
    out: list[Op] = []
    made: list[NewGroup] = []
    latest: dict[str, str] = {}  # the program's handle -> its latest per-call name (later calls rebind it)
    for index, op in enumerate(ops):
        if isinstance(op, SetDevice | InitProcessGroup | Checkpoint):
            continue
        if isinstance(op, NewGroup) and op.bind:
            handle = f"{op.bind}@{cycle}.{index}"
            latest[op.bind] = handle
            made.append(replace(op, bind=handle))
            out.append(made[-1])
        elif isinstance(op, Collective) and op.group in latest:
            out.append(replace(op, group=latest[op.group]))
        else:
            out.append(op)
    return out, made


def cycle_ops(startup: tuple[Op, ...], cycles: int, destroy: str) -> list[Op]:
    """The startup, then ``cycles - 1`` destroy/re-init cycles, a checkpoint ``cycle<k>`` after each init.

    ``Utils``' glue: ``init_process_group`` without a timeout and a world barrier after it; each
    ``destroy_model_parallel`` a world barrier before the destroys.
    """
    head: list[Op] = []
    for op in startup:
        if isinstance(op, SetDevice):
            head.append(op)
        elif isinstance(op, InitProcessGroup):
            head.append(replace(op, timeout_s=None))
    ops: list[Op] = [*head, Checkpoint("after_init"), Barrier(group=WORLD)]
    held: list[NewGroup] = []
    for cycle in range(1, cycles + 1):
        if cycle > 1:
            ops.append(Barrier(group=WORLD))
            ops += [DestroyProcessGroup(group=h) for h in _destroyed(held, destroy)]
            held = []
        calls, made = _one_init(startup, cycle)
        ops += calls
        held += made
        ops.append(Checkpoint(f"cycle{cycle}"))
    return ops


def _destroyed(held: list[NewGroup], destroy: str) -> list[str]:
    """The handles one ``destroy_model_parallel`` destroys, in its order (a non-member's handle: a no-op)."""
    if destroy == "all":
        return [op.bind for op in reversed(held) if op.bind]
    return [op.bind for desc in GLOO_GROUPS_DESTROYED for op in held if op.group_desc == desc and op.bind]


def with_reinit_cycles(programs: tuple[Program, ...], cycles: int, destroy: str) -> tuple[Program, ...]:
    """Every rank's startup repeated as ``cycles`` initialisations; unchanged for one (the default)."""
    if cycles == 1:
        return programs
    _check_length(programs, cycles, destroy)
    by_id: dict[int, Program] = {}
    out = []
    for program in programs:  # identical startups stay one Program (DESIGN rule 8)
        cycled = by_id.get(id(program))
        if cycled is None:
            cycled = by_id[id(program)] = Program(tuple(cycle_ops(program.ops, cycles, destroy)))
        out.append(cycled)
    return tuple(out)


def _check_length(programs: tuple[Program, ...], cycles: int, destroy: str) -> None:
    """Refuse, before building any cycle, programs longer than the input limits allow: a cycle count is one
    number in a file, and 10**400 of them must be an exit 2 naming the limit, not minutes of building ops.
    A cycle's length is measured on two cycles; every later cycle is as long as the second."""
    limits = current_limits()
    total = 0
    measured: set[int] = set()
    for program in programs:
        if id(program) in measured:
            continue
        measured.add(id(program))
        first = len(cycle_ops(program.ops, 1, destroy))
        length = first + (cycles - 1) * (len(cycle_ops(program.ops, 2, destroy)) - first)
        if length > limits.max_program_ops:
            shown = f"{cycles} cycles of a {first}-op startup ({length} ops per rank)"
            raise WorkloadError("reinit_cycles", exceeded("max_program_ops", shown, limits.max_program_ops))
        total += length
    if total > limits.max_expanded_ops:
        shown = f"{total} ops over the distinct programs of {cycles} cycles"
        raise WorkloadError("reinit_cycles", exceeded("max_expanded_ops", shown, limits.max_expanded_ops))

"""Simulate a program in one call: the entry point for unit tests and for users' own pytest suites.

Why: a scenario file is the right form for CI artifacts, but a test wants "these ops, on this cluster, this
release" in one line, with the profile picked the same way the CLI picks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, Limits, RunOutcome, SimConfig
from simnccl.env_knobs import env_problem, is_env_name
from simnccl.faults import NO_FAULTS, FaultSchedule
from simnccl.limits import InputLimits, exceeded
from simnccl.limits import current as current_limits
from simnccl.ops import Op, Program
from simnccl.policy import Policy, get_policy
from simnccl.profiles import find_profile, get_profile
from simnccl.release import get_release
from simnccl.scenario.model import LAUNCHERS
from simnccl.scenario.steps import check_op


def simulate(
    program: Sequence[Op] | Sequence[Sequence[Op]],
    *,
    gpu: str = "h100-80gb",
    nodes: int = 1,
    gpus_per_node: int = 2,
    ranks_per_node: int | None = None,
    release: str = "2.15",
    env: Mapping[str, str] | None = None,
    launcher: str = "torchrun",
    profile: str | None = None,
    keep_trace: bool = False,
    limits: Limits | None = None,
    policy: str | Policy | None = None,
    faults: FaultSchedule | None = None,
    extra_env_knobs: Sequence[str] = (),
) -> RunOutcome:
    """Run ``program`` (one op list for every rank, or one list per rank) and return the outcome.

    ``env`` is checked as a scenario's env table is (``ValueError``): a ``TORCH_*``/``PYTORCH_*``/``NCCL_*`` name
    torch or NCCL does not read (``TORCH_DIST_USE_NCL2`` simulated torch's default), a value simnccl cannot use,
    or a launcher variable (``RANK``). ``extra_env_knobs`` names knobs newer than simnccl's list, as a scenario's
    ``[torch] extra_env_knobs`` does.

    The cluster is bounded by ``max_world_size`` (ranks, and GPUs) before anything is made for it, as a scenario's
    is: ``nodes=10**7`` is a ``ValueError`` naming the limit, not a test that runs until the machine gives out."""
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"env: expected a mapping of variable names to strings, got {type(env).__name__}")
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):  # torch and NCCL read text: 0 is not "0"
            raise TypeError(f"env: expected names and values that are strings, got {name!r}: {value!r}")
        if not is_env_name(name):
            raise ValueError(f"env: {name!r}: expected an environment variable's name (letters, digits, '_')")
        problem = env_problem(name, value, extra_env_knobs, "name a newer one in extra_env_knobs")
        if problem is not None:
            raise ValueError(f"env: {name}: {problem}")
    if launcher not in LAUNCHERS:  # it decides how long the store lives: a typo simulated spawn's
        raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    for value, kind, what in ((limits, Limits, "limits"), (faults, FaultSchedule, "faults")):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{what}: expected a {kind.__name__} or None, got {type(value).__name__}")
    input_limits = current_limits()
    cluster = bounded_cluster(gpu, nodes, gpus_per_node, ranks_per_node, input_limits)
    per_rank = _programs(program, cluster.world_size, input_limits)
    chosen = get_profile(profile) if profile else find_profile(gpu, release)
    config = SimConfig(
        cluster=cluster,
        release=get_release(release),
        profile=chosen,
        programs=per_rank,
        env=dict(env or {}),
        launcher=launcher,
        limits=limits or Limits(),
        policy=None if policy is None else get_policy(policy),  # an object is checked as a loaded spec is
        faults=faults or NO_FAULTS,
    )
    return Engine(config, keep_trace=keep_trace).run()


def bounded_cluster(
    gpu: str, nodes: int, gpus_per_node: int, ranks_per_node: int | None, limits: InputLimits | None = None
) -> Cluster:
    """The cluster, its ranks and GPUs bounded by ``max_world_size`` before anything is made for each (a
    ``ValueError`` naming the limit): what ``simulate`` and the ``simnccl_cluster`` fixture make."""
    cluster = Cluster(get_gpu_kind(gpu), nodes, gpus_per_node, ranks_per_node)
    limit = (limits or current_limits()).max_world_size
    for count, what in ((cluster.world_size, "ranks"), (cluster.nodes * cluster.gpus_per_node, "GPUs")):
        if count > limit:
            raise ValueError(exceeded("max_world_size", f"a cluster of {count} {what}", limit))
    return cluster


def used_mib(outcome: RunOutcome, checkpoint: str) -> dict[str, float]:
    """Used MiB per device at a checkpoint; a checkpoint the run did not pass is a KeyError naming those it did."""
    if not isinstance(outcome, RunOutcome):
        raise TypeError(f"outcome: expected the RunOutcome simulate returned, got {type(outcome).__name__}")
    devices = outcome.checkpoints.get(checkpoint)
    if devices is None:
        passed = ", ".join(map(repr, outcome.checkpoints)) or "none"
        raise KeyError(f"checkpoint {checkpoint!r} was not passed by this run; checkpoints passed: {passed}")
    if checkpoint in outcome.repeated_checkpoints:  # the last of several moments, read as the one asked for
        raise ValueError(f"checkpoint {checkpoint!r} was met more than once by a rank: name each moment once")
    return {device: s.used_bytes / 2**20 for device, s in sorted(devices.items())}


def _programs(program: object, world_size: int, limits: InputLimits) -> list[Program]:
    """One Program per rank from what ``simulate`` was given, every op checked (``scenario.steps.check_op``) and
    every program's length bounded (``max_program_ops``), as a scenario's are, before anything runs."""
    if isinstance(program, str | bytes | Mapping) or not isinstance(program, Sequence):
        raise TypeError(f"program: expected a list of ops, or one list per rank, got {type(program).__name__}")
    if program and not isinstance(program[0], Op):
        # The same op list object for several ranks becomes one shared Program (DESIGN rule 8: the engine's
        # fast path needs it); equal but distinct lists stay distinct, which forces the rank-by-rank path.
        lists = list(program)
        if len(lists) != world_size:
            raise ValueError(f"{len(lists)} programs for a world of {world_size}")
        shared_by_id: dict[int, Program] = {}
        checked: dict[int, Op] = {}  # one check per op object, in whichever rank's list it is
        per_rank = []
        for rank, ops in enumerate(lists):
            made = shared_by_id.get(id(ops))
            if made is None:
                made = shared_by_id[id(ops)] = _program(ops, f"program[{rank}]", limits, checked)
            per_rank.append(made)
        return per_rank
    return [_program(program, "program", limits, {})] * world_size


def _program(ops: object, where: str, limits: InputLimits, checked: dict[int, Op]) -> Program:
    if isinstance(ops, str | bytes | Mapping) or not isinstance(ops, Sequence):
        raise TypeError(f"{where}: expected a list of ops, got {type(ops).__name__}")
    if len(ops) > limits.max_program_ops:
        raise ValueError(exceeded("max_program_ops", f"{where} of {len(ops)} ops", limits.max_program_ops))
    made = []
    for index, op in enumerate(ops):
        same = checked.get(id(op))
        if same is None:  # one check per op object: a repeated op is one object many times
            same = checked[id(op)] = check_op(op, "simulate", f"{where}[{index}]", limits)
        made.append(same)
    return Program(tuple(made))

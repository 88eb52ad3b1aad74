"""Simulate a program in one call: the entry point for unit tests and for users' own pytest suites.

Why: a scenario file is the right form for CI artifacts, but a test wants "these ops, on this cluster, this
release" in one line, with the profile picked the same way the CLI picks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, Limits, RunOutcome, SimConfig
from simnccl.env_knobs import env_problem
from simnccl.faults import NO_FAULTS, FaultSchedule
from simnccl.limits import current as current_limits
from simnccl.limits import exceeded
from simnccl.ops import Op, Program
from simnccl.policy import Policy, get_policy
from simnccl.profiles import find_profile, get_profile
from simnccl.release import get_release


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
    for name, value in (env or {}).items():
        problem = env_problem(name, value, extra_env_knobs, "name a newer one in extra_env_knobs")
        if problem is not None:
            raise ValueError(f"env: {name}: {problem}")
    cluster = Cluster(get_gpu_kind(gpu), nodes, gpus_per_node, ranks_per_node)
    limit = current_limits().max_world_size
    for count, what in ((cluster.world_size, "ranks"), (cluster.nodes * cluster.gpus_per_node, "GPUs")):
        if count > limit:
            raise ValueError(exceeded("max_world_size", f"a cluster of {count} {what}", limit))
    if program and not isinstance(program[0], Op):
        # The same op list object for several ranks becomes one shared Program (DESIGN rule 8: the engine's
        # fast path needs it); equal but distinct lists stay distinct, which forces the rank-by-rank path.
        shared_by_id: dict[int, Program] = {}
        per_rank = [shared_by_id.setdefault(id(ops), Program(tuple(ops))) for ops in program]  # type: ignore[arg-type]
        if len(per_rank) != cluster.world_size:
            raise ValueError(f"{len(per_rank)} programs for a world of {cluster.world_size}")
    else:
        shared = Program(tuple(program))  # type: ignore[arg-type]
        per_rank = [shared] * cluster.world_size
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


def used_mib(outcome: RunOutcome, checkpoint: str) -> dict[str, float]:
    """Used MiB per device at a checkpoint."""
    return {device: s.used_bytes / 2**20 for device, s in sorted(outcome.checkpoints[checkpoint].items())}

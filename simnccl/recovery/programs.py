"""Each segment's generated programs: set_device, init, the policy's groups, the steps, markers and commits.

Also the up-front check of a recovery scenario, since what it bounds is the generated programs' length.
"""

from __future__ import annotations

from collections.abc import Sequence

from simnccl.cluster import Cluster, Device
from simnccl.faults import FaultError, apply_to_programs
from simnccl.limits import InputLimits, exceeded
from simnccl.limits import current as current_limits
from simnccl.ops import (
    WORLD,
    Barrier,
    Checkpoint,
    Collective,
    InitProcessGroup,
    NewGroup,
    Op,
    PointToPoint,
    Program,
    SetDevice,
)
from simnccl.recovery.config import DP, REPLICA, START, RecoveryConfig, parse_recovery
from simnccl.scenario import Scenario, ScenarioError


def initial_devices(cluster: Cluster) -> tuple[Device, ...]:
    """Rank r on GPU ``r % ranks_per_node`` of its node, as torchrun's LOCAL_RANK would put it."""
    return tuple(cluster.device(cluster.node_of(r), cluster.local_rank(r)) for r in range(cluster.world_size))


def replica_groups(world: int, replicas: int) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(replica groups, dp groups): replica k holds ranks [k*m, (k+1)*m); dp group j the j-th rank of each."""
    size = world // replicas
    return (
        tuple(tuple(range(k * size, (k + 1) * size)) for k in range(replicas)),
        tuple(tuple(range(j, world, size)) for j in range(size)),
    )


def segment_programs(
    cfg: RecoveryConfig, body: Sequence[Program], devices: Sequence[Device], first_step: int
) -> list[Program]:
    """Every rank's program for one segment: fresh groups on its GPU, then steps ``first_step..cfg.steps``.

    Markers (``Checkpoint`` ops, which cost nothing) make the segment observable: ``start`` after the groups
    exist, ``ready:s`` when the rank finished step s's local work (before the body's first communication),
    ``done:s`` after the step and ``commit:s`` after a commit's barrier.
    """
    replicas, dps = replica_groups(len(devices), cfg.replicas)
    programs = []
    for rank, device in enumerate(devices):
        ops: list[Op] = [
            SetDevice(device=device.index),
            InitProcessGroup(backend="nccl", device_id=device.index, timeout_s=cfg.timeout_s),
        ]
        for handle, groups in ((REPLICA, replicas), (DP, dps)):
            ops += [
                NewGroup(
                    ranks=ranks,
                    bind=handle,
                    group_desc=f"{handle}{k}",
                    timeout_s=cfg.timeout_s,
                    purpose=handle,
                    traffic="collectives",
                )
                for k, ranks in enumerate(groups)
            ]
        ops.append(Checkpoint(label=START))
        step_ops = body[rank].ops
        split = next((i for i, op in enumerate(step_ops) if isinstance(op, (Collective, PointToPoint))), len(step_ops))
        for step in range(first_step, cfg.steps + 1):
            ops += [*step_ops[:split], Checkpoint(label=f"ready:{step}"), *step_ops[split:]]
            ops.append(Checkpoint(label=f"done:{step}"))
            if cfg.is_commit(step):
                ops += [Barrier(group=WORLD), Checkpoint(label=f"commit:{step}")]
        programs.append(Program(tuple(ops)))
    return programs


def check_recovery(scenario: Scenario, limits: InputLimits | None = None) -> RecoveryConfig:
    """Everything about a recovery run that can be checked before it runs: the ``[recovery]`` table, the
    generated programs' length (``steps`` times the body, within ``max_program_ops``, checked before they are
    built) and the ``[faults]`` against the first segment's programs."""
    assert scenario.recovery is not None
    limits = limits or current_limits()
    cfg = parse_recovery(scenario.recovery, scenario.source, scenario.cluster, limits)
    body = max((len(p.ops) for p in scenario.programs), default=0)
    length = cfg.steps * (body + 3) + 2 * len(scenario.programs)  # per step: body, markers, commit barrier
    if length > limits.max_program_ops:
        raise ScenarioError(
            scenario.source,
            "recovery.steps",
            exceeded(
                "max_program_ops", f"{cfg.steps} steps of {body} ops ({length} ops per rank)", limits.max_program_ops
            ),
        )
    try:
        apply_to_programs(
            scenario.faults, segment_programs(cfg, scenario.programs, initial_devices(scenario.cluster), 1)
        )
    except FaultError as err:
        raise ScenarioError(scenario.source, "faults", f"{err} (in the first segment's generated program)") from None
    return cfg

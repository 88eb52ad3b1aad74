"""The ``[recovery]`` table: the training loop's and the orchestrator's knobs, checked as untrusted input."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simnccl.cluster import Cluster
from simnccl.limits import InputLimits, exceeded, number_text
from simnccl.limits import current as current_limits
from simnccl.scenario import ScenarioError
from simnccl.scenario.reader import Reader, finite

REPLICA, DP = "replica", "dp"
START = "start"
# The markers segment_programs puts in every rank's program (expectations may name them): see its docstring.
MARKER_LABEL = re.compile(rf"{START}|(ready|done|commit):[1-9][0-9]*")


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """The ``[recovery]`` table: the training loop and the orchestrator's knobs."""

    replicas: int
    steps: int
    commit_every: int
    slow_factor: float = 2.0  # a rank whose local step time exceeds this multiple of the median is excluded
    timeout_s: float | None = None  # every process group's timeout (None: torch's default)
    monitor_interval_s: float = 0.1  # torchrun --monitor-interval: how late a dead process is noticed
    restart_s: float = 0.0  # from a decision to the next segment's start (spawn, checkpoint load)
    max_recoveries: int = 3  # every run ends: at most this many re-formed memberships

    def is_commit(self, step: int) -> bool:
        return step % self.commit_every == 0 or step == self.steps


def parse_recovery(
    table: Mapping[str, Any], source: str, cluster: Cluster, limits: InputLimits | None = None
) -> RecoveryConfig:
    """Validate ``[recovery]`` field by field against the cluster and the input limits; errors name the file
    and the key (times are finite and within ``max_sim_time_s``; recoveries within ``max_recoveries``)."""
    limits = limits or current_limits()
    reader = Reader(source, "recovery", dict(table))
    number = (int, float)
    horizon = limits.max_sim_time_s
    replicas = reader.get("replicas", int)
    steps = reader.get("steps", int)
    commit_every = reader.get("commit_every", int)
    slow_factor = finite(reader, "slow_factor", reader.get("slow_factor", number, 2.0), -math.inf)
    timeout = reader.get("timeout_s", number, None)
    if timeout is not None:
        timeout = finite(reader, "timeout_s", timeout, -math.inf, horizon, "max_sim_time_s")
    monitor = finite(reader, "monitor_interval_s", reader.get("monitor_interval_s", number, 0.1), -math.inf, horizon)
    restart = finite(reader, "restart_s", reader.get("restart_s", number, 0.0), -math.inf, horizon, "max_sim_time_s")
    max_recoveries = reader.get("max_recoveries", int, 3)
    reader.finish()
    if max_recoveries > limits.max_recoveries:
        raise reader.error("max_recoveries", exceeded("max_recoveries", max_recoveries, limits.max_recoveries))
    world = cluster.world_size
    if replicas < 1 or world % replicas:
        raise reader.error("replicas", f"expected a divisor of the world of {world} ranks, got {replicas}")
    for key, value in (("steps", steps), ("commit_every", commit_every)):
        if value < 1:
            raise reader.error(key, f"expected an integer >= 1, got {value}")
    if slow_factor <= 1:
        raise reader.error(
            "slow_factor", f"expected a number > 1 (a multiple of the median), got {number_text(slow_factor)}"
        )
    if timeout is not None and timeout <= 0:
        raise reader.error("timeout_s", f"expected a positive number of seconds, got {number_text(timeout)}")
    for key, value in (("monitor_interval_s", monitor), ("restart_s", restart)):
        if value < 0:
            raise reader.error(key, f"expected a non-negative number of seconds, got {number_text(value)}")
    if max_recoveries < 0:
        raise reader.error("max_recoveries", f"expected an integer >= 0, got {max_recoveries}")
    assert cluster.ranks_per_node is not None
    if cluster.ranks_per_node > cluster.gpus_per_node:
        raise ScenarioError(
            source,
            "cluster.ranks_per_node",
            f"a recovery run needs one GPU per rank: {cluster.ranks_per_node} ranks on {cluster.gpus_per_node} "
            "GPUs per node (the GPUs beyond ranks_per_node are the spares)",
        )
    return RecoveryConfig(
        replicas=replicas,
        steps=steps,
        commit_every=commit_every,
        slow_factor=slow_factor,
        timeout_s=None if timeout is None else float(timeout),
        monitor_interval_s=monitor,
        restart_s=restart,
        max_recoveries=max_recoveries,
    )

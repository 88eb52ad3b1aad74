"""torch's store-based barrier after ``new_group`` under ``TORCH_DIST_INIT_BARRIER=1``.

Why a room: with the variable at 1, torch 2.15's ``_new_group_with_tag`` ends every ``new_group`` call, member
or not, with ``_store_based_barrier`` over the whole world (the default store); with
``use_local_synchronization`` over the group's members only (its own store), and a non-member returns before it.
A rank that never calls that ``new_group`` then holds every caller there: they raise ``DistStoreError`` after the
group's timeout, where without the variable the members go on (found by a tester: the simulator passed,
real gloo hung 3 runs of 3).

The barrier polls: each ``store.wait`` lasts the logging interval, ``max(10 s, 10 s + world size / 1000 s)``,
and only after a wait times out is the elapsed time compared with the timeout, so the error comes at the first
whole interval past it. Measured (torch 2.15 CPU, gloo, 3 ranks, rank 2 never calling ``new_group([0, 1],
timeout=3 s)``): ranks 0 and 1 raise after 10.0 s, "Timed out initializing process group in store based
barrier on rank 0, for key: store_based_barrier_key:1 (world_size=3, num_workers_joined=2, timeout=0:00:03
error=wait timeout after 10003ms, keys: /default_pg/0//store_based_barrier_key:1:last_worker)".
``init_process_group``'s own barrier under the variable is not modelled: every rank must be in init already.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping

from simnccl.c10d import Group
from simnccl.meetings import Meeting
from simnccl.watchdog import STORE_WAIT_TIMEOUT, TimeoutAction

KNOB = "TORCH_DIST_INIT_BARRIER"
KIND = "store-barrier"
PREFIX = "store_based_barrier_key"


def wanted(env: Mapping[str, str]) -> bool:
    """Whether torch runs the barrier: ``int(os.getenv("TORCH_DIST_INIT_BARRIER", "0")) == 1``."""
    value = env.get(KNOB)
    if value is None:
        return False
    try:
        return int(value) == 1
    except ValueError:
        return False


def interval_s(world_size: int) -> float:
    """One ``store.wait`` of the barrier: its logging interval."""
    return max(10.0, 10.0 + world_size / 1000)


def detected_after_s(world_size: int, timeout_s: float) -> float:
    """Seconds from entering the barrier to its DistStoreError: the first whole interval past the timeout."""
    step = interval_s(world_size)
    return step * max(1, math.ceil(timeout_s / step))


def detected_after(meeting: Meeting) -> float:
    """``detected_after_s`` of a rank waiting in this barrier (its members, the new group's timeout)."""
    return detected_after_s(len(meeting.expected), meeting.timeout_s or 0.0)


def timeout_action(rank: int, meeting: Meeting, world: Group | None) -> TimeoutAction:
    """The DistStoreError a rank left in the barrier raises (the text torch 2.15 builds)."""
    n = len(meeting.expected)
    group_name = meeting.key[2]
    key = f"{PREFIX}:{group_name}"
    where = f"/default_pg/{world.name if world is not None else '0'}//"
    error = STORE_WAIT_TIMEOUT.format(ms=round(interval_s(n) * 1000), keys=f"{where}{key}:last_worker")
    timeout = datetime.timedelta(seconds=meeting.timeout_s or 0.0)
    return TimeoutAction(
        "raise",
        False,
        0.0,
        "torch.distributed.DistStoreError",
        f"Timed out initializing process group in store based barrier on rank {rank}, for key: {key} "
        f"(world_size={n}, num_workers_joined={len(meeting.arrivals)}, timeout={timeout} error={error})",
        False,
    )

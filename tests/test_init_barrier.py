"""torch's store-based barrier after ``new_group`` under ``TORCH_DIST_INIT_BARRIER=1`` (``engine/init_barrier.py``).

Found by a tester: the variable was accepted and ignored, so a rank that never calls a ``new_group`` the others
call passed in the simulator, where real torch holds the callers in the barrier (gloo: 3 runs of 3; nccl under
``TORCH_DIST_USE_NCCL2=0`` alike in ``real compare``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, SimConfig
from simnccl.engine.init_barrier import detected_after_s
from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
from simnccl.policy import BasePolicy, InitPlan
from simnccl.profiles import find_profile
from simnccl.release import get_release
from simnccl.testing import simulate
from simnccl.workloads import GENERATORS

GLOO = InitProcessGroup(backend="gloo")
BARRIER_ON = {"TORCH_DIST_INIT_BARRIER": "1"}
PAIR = NewGroup(ranks=(0, 1), bind="g", timeout_s=3.0)


def _three(pair: NewGroup, env: dict[str, str] | None = None, third: list | None = None):
    callers = [GLOO, pair, AllReduce(group="g", size_bytes=64)]
    return simulate([callers, callers, [GLOO, *(third or [])]], gpus_per_node=0, ranks_per_node=3, env=env)


def test_a_rank_that_never_calls_new_group_holds_the_callers_in_the_barrier_as_measured() -> None:
    out = _three(PAIR, BARRIER_ON)
    assert out.verdict == "hang"
    assert [(e["rank"], e["type"], e["time_s"]) for e in out.errors] == [
        (0, "torch.distributed.DistStoreError", pytest.approx(out.errors[0]["time_s"])),
        (1, "torch.distributed.DistStoreError", pytest.approx(out.errors[0]["time_s"])),
    ]
    # measured: both raise 10.0 s after entering (the first 10.003 s store wait past the 3 s timeout), with this text
    since = {h["rank"]: h["since_s"] for h in out.hangs}
    assert out.errors[0]["time_s"] - since[0] == pytest.approx(10.003)
    assert out.errors[0]["message"] == (
        "Timed out initializing process group in store based barrier on rank 0, for key: store_based_barrier_key:1 "
        "(world_size=3, num_workers_joined=2, timeout=0:00:03 error=wait timeout after 10003ms, keys: "
        "/default_pg/0//store_based_barrier_key:1:last_worker)"
    )
    assert {h["rank"]: h["waiting_for"] for h in out.hangs} == {0: [2], 1: [2]}


def test_without_the_variable_the_members_go_on() -> None:
    assert _three(PAIR).verdict == "pass"
    assert _three(PAIR, {"TORCH_DIST_INIT_BARRIER": "0"}).verdict == "pass"


def test_a_non_member_that_calls_new_group_meets_the_members_in_the_barrier() -> None:
    out = _three(PAIR, BARRIER_ON, third=[PAIR])
    assert out.verdict == "pass", out.errors


def test_with_local_synchronization_only_the_members_meet() -> None:
    local = NewGroup(ranks=(0, 1), bind="g", timeout_s=3.0, use_local_synchronization=True)
    assert _three(local, BARRIER_ON).verdict == "pass"


def test_the_barrier_waits_whole_intervals_past_the_timeout() -> None:
    assert detected_after_s(3, 3.0) == pytest.approx(10.003)
    assert detected_after_s(3, 25.0) == pytest.approx(30.009)
    assert detected_after_s(3, 1800.0) == pytest.approx(180 * 10.003)
    assert detected_after_s(20_000, 5.0) == pytest.approx(30.0)  # 10 s + 1 s per thousand ranks


@dataclass(frozen=True)
class BarrierAfterInit(BasePolicy):
    name: str = "barrier-after-init"

    def on_init(self, request) -> InitPlan:
        return InitPlan(request.backend, request.device_id, request.pg_options, dict(BARRIER_ON), "barrier")


def test_a_policy_that_sets_the_variable_gets_the_barrier() -> None:
    callers = [GLOO, PAIR, AllReduce(group="g", size_bytes=64)]
    out = simulate([callers, callers, [GLOO]], gpus_per_node=0, ranks_per_node=3, policy=BarrierAfterInit())
    assert out.verdict == "hang"


def test_every_rank_of_a_megatron_startup_passes_every_barrier_on_the_fast_and_the_ordinary_path() -> None:
    # Outsider calls and cohorts take new_group calls in place (cohorts on both paths: they are how a world-wide
    # block is applied); under the variable each call ends in a barrier, so they leave them to the ordinary path.
    programs = GENERATORS["megatron"]({"tp": 2, "pp": 2, "dp": 2}, 8)
    calls = sum(type(op) is NewGroup for op in programs[0].ops)
    cluster = Cluster(get_gpu_kind("h100-80gb"), 1, 8)
    runs = {}
    for env in ({}, BARRIER_ON):
        config = SimConfig(
            cluster=cluster,
            release=get_release("2.15"),
            profile=find_profile(cluster.gpu.key, "2.15"),
            programs=programs,
            env=dict(env),
        )
        fast = Engine(config, keep_trace=True, fast_path=True).run()
        slow = Engine(config, keep_trace=True, fast_path=False).run()
        assert fast.verdict == slow.verdict == "pass"
        assert (fast.trace_hash, fast.event_count) == (slow.trace_hash, slow.event_count)
        runs[bool(env)] = fast
    passed = [e for e in runs[True].trace if len(e) > 2 and e[2] == "store-barrier" and isinstance(e[1], int)]
    assert len(passed) == 8 * calls  # every rank, every call, member or not
    assert not [e for e in runs[False].trace if len(e) > 2 and e[2] == "store-barrier"]


def test_on_legacy_nccl_the_barrier_holds_the_callers_too() -> None:
    # (nccl2's new_group splits the bound default group, which waits for rank 2 before any barrier: a hang with
    # or without the variable.) Legacy makes its communicator at first use: the barrier is what holds them.
    nccl = [SetDevice(), InitProcessGroup(backend="nccl")]
    callers = [*nccl, PAIR, AllReduce(group="g", size_bytes=64)]
    legacy = {"TORCH_DIST_USE_NCCL2": "0"}
    assert simulate([callers, callers, nccl], gpus_per_node=3, env=legacy).verdict == "pass"
    out = simulate([callers, callers, nccl], gpus_per_node=3, env={**legacy, **BARRIER_ON})
    assert out.verdict == "hang"
    assert {e["type"] for e in out.errors} == {"torch.distributed.DistStoreError"}


@pytest.mark.parametrize("value", ["true", "yes", "1.0"])
def test_a_value_torch_cannot_read_as_an_integer_is_refused(value: str) -> None:
    # torch reads int(os.getenv(...)): "true" raises ValueError in init_process_group and every new_group. Found by
    # a tester: the simulator took it for "no barrier" and passed.
    with pytest.raises(ValueError, match="TORCH_DIST_INIT_BARRIER: expected an integer"):
        _three(PAIR, {"TORCH_DIST_INIT_BARRIER": value})


@pytest.mark.parametrize(("value", "verdict"), [(" 01", "hang"), ("2", "pass")])
def test_values_are_read_as_torch_reads_them(value: str, verdict: str) -> None:
    assert _three(PAIR, {"TORCH_DIST_INIT_BARRIER": value}).verdict == verdict

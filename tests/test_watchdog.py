"""What a timed-out wait does, per backend and environment, in simulated time."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from simnccl.explain import explain
from simnccl.faults import Fault, FaultSchedule
from simnccl.ops import AllReduce, Compute, InitProcessGroup, NewGroup, Recv, Send, SetDevice
from simnccl.release import Impl
from simnccl.result import VariantResult
from simnccl.testing import simulate
from simnccl.watchdog import blocking_wait, heartbeat_monitor, on_timeout, on_watchdog_stuck

PROGRAM = [SetDevice(), InitProcessGroup(backend="nccl"), AllReduce(), AllReduce()]
STALL = FaultSchedule(None, (), (Fault("stall", 1, at_op=3),))


def run(env=None, program=PROGRAM):
    return simulate(program, env=env, faults=STALL)


def waiter(outcome):
    return next(h for h in outcome.hangs if h["rank"] == 0)


def test_default_aborts_after_timeout_plus_dump_wait() -> None:
    out = run()
    assert waiter(out)["detected_at_s"] == pytest.approx(waiter(out)["since_s"] + 600 + 15)
    (error,) = [e for e in out.errors if e["rank"] == 0]
    assert error["type"] == "SIGABRT" and "Aborting process on rank 0" in error["message"]
    assert out.ranks[0].status == "aborted" and out.ranks[0].unhealthy


def test_dump_wait_is_configurable() -> None:
    out = run({"TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC": "2000"})
    assert waiter(out)["detected_at_s"] == pytest.approx(waiter(out)["since_s"] + 602)


def test_no_handling_leaves_the_process_hung_but_dumps() -> None:
    out = run({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert not [e for e in out.errors if e["rank"] == 0]
    assert out.ranks[0].status == "blocked" and 0 in out.fr_dumps and out.verdict == "hang"


def test_cleanup_only_raises_in_the_waiting_call() -> None:
    out = run({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"})
    (error,) = [e for e in out.errors if e["rank"] == 0]
    assert error["type"] == "torch.distributed.DistBackendError" and out.ranks[0].status == "error"


def test_blocking_wait_raises_at_the_timeout_itself() -> None:
    out = run({"TORCH_NCCL_BLOCKING_WAIT": "1"})
    (error,) = [e for e in out.errors if e["rank"] == 0]
    assert "timed out in blocking wait" in error["message"]
    assert error["time_s"] == pytest.approx(waiter(out)["since_s"] + 600)


def test_explicit_timeout_is_used() -> None:
    program = [SetDevice(), InitProcessGroup(backend="nccl", timeout_s=30), AllReduce(), AllReduce()]
    out = run(program=program)
    assert waiter(out)["detected_at_s"] == pytest.approx(waiter(out)["since_s"] + 30 + 15)


def test_gloo_raises_at_its_30_minute_default() -> None:
    program = [SetDevice(), InitProcessGroup(backend="gloo"), AllReduce(), AllReduce()]
    out = run(program=program)
    (error,) = [e for e in out.errors if e["rank"] == 0]
    # torch 2.15's gloo, measured (3 ranks, one late): what a log shows, so an error_contains copied from one matches
    assert error["message"].endswith("unbound_buffer.cc:78] Timed out waiting 1800000ms for recv operation to complete")


def test_a_split_never_times_out() -> None:
    local = [
        SetDevice(),
        InitProcessGroup(backend="nccl"),
        NewGroup(ranks=(0,), bind="g", use_local_synchronization=True),
    ]
    out = simulate([local, [SetDevice(), InitProcessGroup(backend="nccl")]])
    (hang,) = out.hangs
    assert hang["detected_at_s"] is None and "no timeout" in hang["watchdog"]


def test_on_timeout_is_a_pure_decision() -> None:
    action = on_timeout(Impl.NCCL2, "collective", {}, rank=3, seq=7, op_name="all_reduce", numel=8, timeout_s=600)
    assert action is not None and action.outcome == "abort" and action.wait_s == 15
    assert "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000)" in action.message
    assert on_timeout(Impl.NCCL2, "split", {}, rank=0, seq=1, op_name="x", numel=1, timeout_s=1) is None
    assert on_timeout(Impl.FAKE, "collective", {}, rank=0, seq=1, op_name="x", numel=1, timeout_s=1) is None


def test_a_deadline_that_float_rounding_puts_past_the_step_still_fires() -> None:
    """Regression: simpy places ``timeout(deadline - now)`` at ``now + (deadline - now)``, which for this
    generated case lands one ulp past the deadline; the watchdog loop used to reschedule forever."""
    from pathlib import Path

    from simnccl.engine import Limits
    from simnccl.testing.replay import SimCase

    case = SimCase.load(Path(__file__).parent / "cases" / "watchdog-deadline-rounding.json")
    out = case.run(limits=Limits(wall_s=20.0))
    assert out.verdict == "hang"
    mismatched = {h["rank"]: h for h in out.hangs if "size mismatch" in h["explanation"]}
    assert sorted(mismatched) == [5, 7]
    assert all(h["detected_at_s"] == pytest.approx(h["since_s"] + 615.0) for h in out.hangs)


# ---------------------------------------------------------------------------------------------- heartbeat monitor

LEGACY = {"TORCH_DIST_USE_NCCL2": "0"}
# Rank 1's process and watchdog get stuck in a CUDA/NCCL call after the last collective, while rank 0 finishes:
# nothing else times out, so only the heartbeat monitor can end rank 1.
ALONE = [SetDevice(), InitProcessGroup(backend="nccl"), AllReduce(size_bytes=32), Compute(seconds=5.0)]
STUCK = FaultSchedule(None, (), (Fault("watchdog-stuck", 1, at_op=3),))


def stuck(env=None, program=ALONE, release="2.15"):
    return simulate(program, env=env, faults=STUCK, release=release)


def test_monitor_timeline_is_one_to_two_heartbeats_then_dump_then_one_more() -> None:
    first = on_watchdog_stuck(Impl.LEGACY, {}, rank=1, monitor_start_s=0.0, stuck_at_s=0.25)
    assert first is not None and (first.detected_at_s, first.terminate_at_s) == (960.0, 960.0 + 15 + 480)
    later = on_watchdog_stuck(Impl.LEGACY, {}, rank=1, monitor_start_s=2.0, stuck_at_s=500.0)
    assert later is not None and later.detected_at_s == 2.0 + 3 * 480  # the check at 962 s still saw a beat
    assert later.heartbeat_timeout_s == 480.0 and later.dump
    assert "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress" in later.message
    assert later.message.endswith(
        "Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang."
    )


@pytest.mark.parametrize(
    ("env", "detected", "terminate"),
    [
        ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60"}, 120.0, 120.0 + 15 + 60),
        ({"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "2000"}, 960.0, 960.0 + 2 + 480),
        ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, 960.0, 960.0 + 480),  # no dump, polls every heartbeat
        ({"TORCH_NCCL_ENABLE_MONITORING": "0"}, 960.0, None),  # logs that it would have terminated
    ],
)
def test_monitor_knobs(env, detected, terminate) -> None:
    action = on_watchdog_stuck(Impl.LEGACY, env, rank=0, monitor_start_s=0.0, stuck_at_s=1.0)
    assert action is not None and (action.detected_at_s, action.terminate_at_s) == (detected, terminate)
    assert action.dump == (env.get("TORCH_NCCL_DUMP_ON_TIMEOUT") != "0")


@pytest.mark.parametrize("impl", [Impl.NCCL2, Impl.NCCL_LAZY, Impl.GLOO])
def test_only_legacy_has_a_heartbeat_monitor(impl) -> None:
    assert on_watchdog_stuck(impl, {}, rank=0, monitor_start_s=0.0, stuck_at_s=1.0) is None


def test_blocking_wait_creates_no_watchdog_hence_no_monitor() -> None:
    env = {"TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert on_watchdog_stuck(Impl.LEGACY, env, rank=0, monitor_start_s=0.0, stuck_at_s=1.0) is None


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("true", True), (" TRUE ", True), ("0", False), ("false", False), ("yes", False)]
)
def test_blocking_wait_is_read_one_way_by_the_timeout_and_the_monitor(value, on) -> None:
    """The timeout path and the heartbeat monitor must agree on whether legacy runs a watchdog."""
    env = {"TORCH_NCCL_BLOCKING_WAIT": value}
    assert blocking_wait(env, Impl.LEGACY) is on
    assert (heartbeat_monitor(Impl.LEGACY, env) is None) is on
    action = on_timeout(Impl.LEGACY, "collective", env, rank=0, seq=1, op_name="all_reduce", numel=1, timeout_s=1)
    assert action is not None and ("blocking wait" in action.message) is on


@pytest.mark.parametrize(("env", "release"), [(LEGACY, "2.15"), (None, "2.14")])
def test_legacy_heartbeat_monitor_terminates_a_stuck_process(env, release) -> None:
    out = stuck(env, release=release)
    assert out.verdict == "hang"
    (error,) = out.errors
    assert error["rank"] == 1 and error["kind"] == "heartbeat" and error["type"] == "SIGABRT"
    assert error["time_s"] == pytest.approx(960 + 15 + 480)  # the default group was made at t=0 (lazy)
    assert "ProcessGroupNCCL's watchdog got stuck for 480 seconds" in error["message"]
    (hang,) = out.hangs
    assert hang["rank"] == 1 and hang["detected_at_s"] == pytest.approx(1455.0)
    assert hang["monitor"]["detected_at_s"] == pytest.approx(960.0) and hang["timeout_s"] == 480.0
    assert set(out.fr_dumps) == {1}  # the monitor dumps its own process and signals nobody
    assert out.ranks[1].status == "aborted" and not out.ranks[1].unhealthy


def test_nccl2_has_no_monitor_so_a_stuck_process_stays_hung() -> None:
    out = stuck()
    assert out.verdict == "hang" and not out.errors and not out.fr_dumps
    (hang,) = out.hangs
    assert hang["detected_at_s"] is None and "no heartbeat monitor watches it" in hang["watchdog"]


def test_monitoring_disabled_dumps_but_never_terminates() -> None:
    out = stuck({**LEGACY, "TORCH_NCCL_ENABLE_MONITORING": "0"})
    assert out.verdict == "hang" and not out.errors and set(out.fr_dumps) == {1}
    (hang,) = out.hangs
    assert hang["detected_at_s"] is None and hang["monitor"]["detected_at_s"] == pytest.approx(960.0)


def test_another_ranks_timeout_signal_ends_the_stuck_process_sooner() -> None:
    program = [SetDevice(), InitProcessGroup(backend="nccl"), AllReduce(size_bytes=32), AllReduce(size_bytes=32)]
    out = stuck(LEGACY, program=program)
    times = {e["rank"]: (e["kind"], e["time_s"]) for e in out.errors}
    assert times[0] == ("timeout", pytest.approx(0.25002 + 600 + 15, abs=1e-4))
    # rank 0's watchdog sets the store's dump key at 600.25 s; rank 1's monitor polls it every second
    assert times[1] == ("heartbeat", pytest.approx(601 + 15 + 480))
    error = next(e for e in out.errors if e["rank"] == 1)
    assert "Received a dump signal due to a collective timeout from  rank 0" in error["message"]
    assert "due to collective timeout or exception." in error["message"]


def test_a_stuck_rank_at_a_time_can_still_crash_without_upsetting_the_harness() -> None:
    faults = FaultSchedule(None, (), (Fault("watchdog-stuck", 1, at_s=0.1), Fault("crash", 1, at_s=50.0)))
    out = simulate(PROGRAM, env=LEGACY, faults=faults)
    crash = next(e for e in out.errors if e["rank"] == 1)
    assert crash["kind"] == "crash" and crash["time_s"] == pytest.approx(50.0)


def test_explain_tells_the_monitors_timeline() -> None:
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", stuck(LEGACY)))
    assert "Legacy's heartbeat monitor saw no watchdog heartbeat at t=960.000 s" in text
    assert "terminated the process at t=1455.000 s" in text
    # the times add up as written: 960 + a 15 s dump wait + 480 = 1455 (the dump's wait was left out)
    assert "dumped the flight recorder (15 s), waited another 480 s and terminated" in text, text


def test_legacy_ends_a_merely_stalled_rank_one_heartbeat_after_the_dump_signal() -> None:
    out = run(LEGACY)  # rank 1 stalls (its watchdog is fine); rank 0 times out and sets the store's dump key
    times = {e["rank"]: (e["kind"], e["time_s"]) for e in out.errors}
    assert times[0] == ("timeout", pytest.approx(0.25002 + 600 + 15, abs=1e-4))
    assert times[1] == ("heartbeat", pytest.approx(601 + 15 + 480))  # next 1 s poll, dump, one heartbeat
    stalled = next(h for h in out.hangs if h["rank"] == 1)
    assert stalled["monitor"]["reason"] == "dump signal" and stalled["detected_at_s"] == pytest.approx(1096.0)
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    assert "Legacy's heartbeat monitor saw another rank's dump signal in the store at t=601.000 s" in text


def test_nccl2_leaves_a_stalled_rank_alone() -> None:
    out = run()
    assert [e["rank"] for e in out.errors] == [0] and out.ranks[1].status == "blocked"


# ---------------------------------------------------------------------------------------------- short timeouts


def _late_peer(backend: str, timeout_s: float, late_s: float) -> list[list]:
    """Rank 1 comes ``late_s`` late to an all_reduce on a group with timeout ``timeout_s``, made mid-run."""
    head = [
        SetDevice(),
        InitProcessGroup(backend="gloo"),
        NewGroup((0, 1), backend=backend, bind="a", timeout_s=timeout_s),
    ]
    return [[*head, AllReduce(group="a")], [*head, Compute(seconds=late_s), AllReduce(group="a")]]


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_a_timeout_shorter_than_the_default_fires_on_a_wait_that_would_end_later(backend: str) -> None:
    """Regression: the run stepped by the shortest timeout known when the step began (600 s), so a 1 s timeout of
    a group made inside that step never fired on a wait that started and ended within it: rank 1 coming 5 s late
    passed, where real torch (gloo: "Timed out waiting 1000ms") fails rank 0 at 1 s."""
    out = simulate(_late_peer(backend, 1.0, 5.0), gpus_per_node=2)
    # gloo's timeout closes rank 0's pairs: rank 1, coming later, fails as peer-lost (an error)
    assert out.verdict == ("hang" if backend == "nccl" else "error"), out.verdict
    (hang,) = [h for h in out.hangs if h["rank"] == 0]
    assert hang["timeout_s"] == pytest.approx(1.0) and hang["since_s"] < 1.0, hang
    assert simulate(_late_peer(backend, 10.0, 5.0), gpus_per_node=2).verdict == "pass"


@given(
    backend=st.sampled_from(["nccl", "gloo"]),
    timeout_ds=st.integers(5, 500),  # tenths of a second
    delays_ds=st.lists(st.integers(0, 1000), min_size=2, max_size=4),
)
def test_a_group_timeout_fires_exactly_when_a_wait_outlasts_it(
    backend: str, timeout_ds: int, delays_ds: list[int]
) -> None:
    """Every rank of a group with timeout T computes for its own time, then all of them all_reduce on it: the run
    passes when no rank waits T for the last one, and does not when one waits longer (by more than a margin for
    the collective's own time). The engine gate's thousands of cases never made a short timeout straddle a wait,
    which is how a 1 s timeout that never fired went unseen."""
    timeout_s, delays = timeout_ds / 10, [d / 10 for d in delays_ds]
    waits = [max(delays) - d for d in delays]
    assume(all(abs(w - timeout_s) > 0.05 for w in waits))
    world = len(delays)
    head = [
        SetDevice(),
        InitProcessGroup(backend="gloo"),
        NewGroup(tuple(range(world)), backend=backend, bind="a", timeout_s=timeout_s),
    ]
    programs = [[*head, Compute(seconds=d), AllReduce(group="a", size_bytes=32)] for d in delays]
    out = simulate(programs, gpus_per_node=world)
    late = sorted(r for r, w in enumerate(waits) if w > timeout_s)
    assert (out.verdict == "pass") == (not late), (out.verdict, late, out.hangs)
    timed_out = sorted(h["rank"] for h in out.hangs if h.get("timeout_s") is not None)
    assert set(late) <= set(timed_out) or out.verdict != "hang", (late, out.hangs)


@pytest.mark.parametrize("release", ["2.15", "2.14"])
def test_legacy_reads_the_deprecated_nccl_aliases_where_the_torch_names_are_unset(release) -> None:
    """Legacy ProcessGroupNCCL reads NCCL_ASYNC_ERROR_HANDLING / NCCL_BLOCKING_WAIT after the TORCH_ names
    (ProcessGroupNCCL.hpp); they were accepted and ignored, so the run aborted where torch hangs or raises."""
    legacy = {"TORCH_DIST_USE_NCCL2": "0"} if release == "2.15" else {}

    def legacy_run(env, launcher="spawn"):  # spawn: no launcher sets TORCH_NCCL_ASYNC_ERROR_HANDLING
        return simulate(PROGRAM, env={**legacy, **env}, faults=STALL, release=release, launcher=launcher)

    def rank0(out):
        return [e["kind"] for e in out.errors if e["rank"] == 0]

    # NoHandling: the watchdog does not abort; legacy's heartbeat monitor ends the process on the dump signal
    assert rank0(legacy_run({"NCCL_ASYNC_ERROR_HANDLING": "0"})) == ["heartbeat"]
    (error,) = [e for e in legacy_run({"NCCL_BLOCKING_WAIT": "1"}).errors if e["rank"] == 0]
    assert "timed out in blocking wait" in error["message"]
    both = legacy_run({"NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert rank0(both) == ["timeout"]  # the TORCH_ name wins: the watchdog aborts
    # torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the launching shell did: the alias never counts there
    assert rank0(legacy_run({"NCCL_ASYNC_ERROR_HANDLING": "0"}, launcher="torchrun")) == ["timeout"]


def test_nccl2_does_not_read_the_deprecated_aliases() -> None:
    out = run({"NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_BLOCKING_WAIT": "1"})
    (error,) = [e for e in out.errors if e["rank"] == 0]
    assert error["kind"] == "timeout" and "Aborting process on rank 0" in error["message"]


# ------------------------------------------------------------------------------- a bootstrap the others never join


def _bootstrap(late_rank: int, late_s: float = 5000.0, faults: FaultSchedule | None = None, env=None):
    """Ranks 0 and 1 make group "1" (timeout 120 s; the default group's, hence the store's, is 600 s) and run a
    collective on it; ``late_rank`` first computes ``late_s`` seconds (before new_group), -1: nobody. Its communicator
    is bootstrapped fresh over the store: legacy's lazily (``env=LEGACY``), else nccl-lazy's (nccl2's bootstrap)."""
    backend = "nccl" if env == LEGACY else "nccl-lazy"
    head = [SetDevice(), InitProcessGroup(backend="nccl"), NewGroup((0, 1), backend=backend, bind="g", timeout_s=120)]
    programs = [[*head, AllReduce(group="g")] for _ in range(2)]
    if late_rank >= 0:
        programs[late_rank].insert(2, Compute(seconds=late_s))
    return simulate(programs, env=env, faults=faults)


def _legacy_text(group_rank: int, ms: int) -> str:
    return (
        f"[{group_rank}] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
        f"store by key '0', but store->get('0') got error: wait timeout after {ms}ms, keys: /default_pg/1//cuda//0. "
        "This may indicate a possible application crash on rank 0 or a network set up issue."
    )


def test_legacy_members_time_out_in_the_store_after_its_own_timeout_when_rank_0_never_published() -> None:
    """torch 2.15's legacy ProcessGroupNCCL: a member reads the unique id with store->get under the default store's
    timeout (init_process_group's 600 s, not the group's 120 s) and wraps the store's error in DistBackendError.
    Rank 0 comes later, publishes and blocks in ncclCommInitRank, which has no timeout: still a hang."""
    out = _bootstrap(late_rank=0, env=LEGACY)
    (error,) = out.errors
    assert (error["rank"], error["kind"], error["type"]) == (1, "timeout", "torch.distributed.DistBackendError")
    assert error["message"] == _legacy_text(1, 600000)
    hangs = {h["rank"]: h for h in out.hangs}
    assert hangs[1]["timeout_s"] == pytest.approx(600.0)
    assert error["time_s"] == pytest.approx(hangs[1]["since_s"] + 600.0)
    assert out.verdict == "hang" and out.ranks[0].status == "blocked"
    assert hangs[0]["timeout_s"] is None and hangs[0]["detected_at_s"] is None
    assert "ncclCommInitRank" in hangs[0]["watchdog"] and "heartbeat monitor" in hangs[0]["watchdog"]


def test_nccl2_family_members_raise_the_stores_own_error_after_the_group_timeout() -> None:
    out = _bootstrap(late_rank=0)
    (error,) = out.errors
    assert (error["rank"], error["type"]) == (1, "torch.distributed.DistStoreError")
    assert error["message"] == "wait timeout after 120000ms, keys: /default_pg/1//cuda//1/nccl_storekey_0"
    assert next(h for h in out.hangs if h["rank"] == 1)["timeout_s"] == pytest.approx(120.0)
    assert out.verdict == "hang" and out.ranks[0].status == "blocked"


@pytest.mark.parametrize("env", [None, LEGACY])
def test_group_rank_0_blocks_in_init_without_a_timeout_and_the_report_says_so(env) -> None:
    """Rank 0 published the unique id and never waits in the store: it must not raise the store's error; it stays
    in ncclCommInitRank, and the run still ends as a hang naming both ranks."""
    out = _bootstrap(late_rank=-1, faults=FaultSchedule(None, (), (Fault("stall", 1, at_op=2),)), env=env)
    assert out.verdict == "hang" and not out.errors
    hangs = {h["rank"]: h for h in out.hangs}
    assert set(hangs) == {0, 1}
    assert hangs[0]["kind"] == "bootstrap" and hangs[0]["timeout_s"] is None and hangs[0]["waiting_for"] == [1]
    assert hangs[0]["watchdog"].startswith("group rank 0 published the NCCL unique id")


@pytest.mark.parametrize(("env", "raised"), [(None, "torch.distributed.DistStoreError"), (LEGACY, None)])
def test_a_store_fault_on_group_rank_0_times_out_its_store_wait_only_under_nccl2(env, raised) -> None:
    """nccl2's rank 0 waits for its own key, so a store that never answers times it out; legacy's rank 0 only
    writes the id, so it blocks in init. Either way rank 1 never gets the id and times out in the store."""
    faults = FaultSchedule(None, (), (Fault("store-timeout", 0),))
    out = _bootstrap(late_rank=-1, faults=faults, env=env)
    types = {e["rank"]: e["type"] for e in out.errors}
    assert types.get(0) == raised
    assert types[1] == ("torch.distributed.DistBackendError" if env else "torch.distributed.DistStoreError")
    assert out.verdict == "hang"
    if raised is None:
        (root,) = [h for h in out.hangs if h["rank"] == 0]
        assert root["timeout_s"] is None and "ncclCommInitRank" in root["watchdog"]


def test_a_member_whose_own_store_fails_names_rank_0_as_blocked_in_init() -> None:
    out = _bootstrap(late_rank=-1, faults=FaultSchedule(None, (), (Fault("store-timeout", 1),)), env=LEGACY)
    (error,) = out.errors
    assert error["rank"] == 1 and error["message"] == _legacy_text(1, 600000)
    faulted = next(h for h in out.hangs if h["rank"] == 1)
    assert "rank 0 is blocked in ncclCommInitRank" in faulted["explanation"]
    assert next(h for h in out.hangs if h["rank"] == 0)["timeout_s"] is None


# ---------------------------------------------------------------------------- a p2p pair bootstrap the peer never joins


def _pair(backend: str, late_rank: int, faults: FaultSchedule | None = None):
    """World of 3; group "1" is global ranks 1 and 2 (group ranks 0 and 1; timeout 120 s; the default group's,
    hence the store's, is 600 s). Global 2 sends to global 1 over a lazily made pair communicator, one of them
    (``late_rank``; -1: nobody) first computing 5000 s."""
    head = [SetDevice(), InitProcessGroup(backend="nccl-legacy")]
    group = NewGroup((1, 2), backend=backend, bind="g", timeout_s=120)
    programs = [[*head, group], [*head, group, Recv(peer=2, group="g")], [*head, group, Send(peer=1, group="g")]]
    if late_rank >= 0:
        programs[late_rank].insert(3, Compute(seconds=5000.0))
    return simulate(programs, gpus_per_node=3, faults=faults)


def test_a_legacy_pair_bootstrap_times_out_in_the_store_by_key_lo_hi_of_group_ranks() -> None:
    """Legacy's unbatched send/recv bootstraps a 2-rank communicator keyed getKeySendRecv(rank, peer) = "lo:hi" in
    group ranks ("0:1" here, not the global "1:2"); pair rank 0 (group rank 0, global 1) publishes the id, the
    other reads it with store->get under the default store's timeout. Global 1 is late: global 2 raises after
    600 s, then global 1 publishes and blocks in ncclCommInitRank for a peer that left: a hang with no deadline."""
    out = _pair("nccl-legacy", late_rank=1)
    (error,) = out.errors
    assert (error["rank"], error["kind"], error["type"]) == (2, "timeout", "torch.distributed.DistBackendError")
    assert error["message"] == (
        "[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key "
        "'0:1', but store->get('0:1') got error: wait timeout after 600000ms, keys: /default_pg/1//cuda//0:1. "
        "This may indicate a possible application crash on rank 0 or a network set up issue."
    )
    hangs = {h["rank"]: h for h in out.hangs}
    assert error["time_s"] == pytest.approx(hangs[2]["since_s"] + 600.0)
    assert out.verdict == "hang" and out.ranks[1].status == "blocked"
    assert hangs[1]["timeout_s"] is None and "ncclCommInitRank" in hangs[1]["watchdog"]


def test_a_nccl_lazy_pair_bootstrap_times_out_after_the_groups_timeout_with_the_stores_error() -> None:
    out = _pair("nccl-lazy", late_rank=1)
    (error,) = out.errors
    assert (error["rank"], error["type"]) == (2, "torch.distributed.DistStoreError")
    assert error["message"] == (
        "wait timeout after 120000ms, keys: /default_pg/1//cuda//1/p2p-0-1-0/1/p2p-0-1-0/nccl_storekey_0"
    )
    assert next(h for h in out.hangs if h["rank"] == 2)["timeout_s"] == pytest.approx(120.0)


@pytest.mark.parametrize("backend", ["nccl-legacy", "nccl-lazy"])
def test_pair_rank_0_waiting_for_a_late_peer_blocks_in_init_without_a_timeout(backend) -> None:
    """The pair's rank 0 published the id and waits in ncclCommInitRank: nothing times it out, and the report
    names the wait for what it is."""
    out = _pair(backend, late_rank=2)
    assert out.verdict == "pass" and not out.errors  # the late peer comes at last: init completes
    stuck = _pair(backend, late_rank=-1, faults=FaultSchedule(None, (), (Fault("stall", 2, at_op=3),)))
    assert stuck.verdict == "hang" and not stuck.errors
    (hang,) = [h for h in stuck.hangs if h["rank"] == 1]
    assert hang["timeout_s"] is None and hang["watchdog"].startswith("group rank 0 published the NCCL unique id")


# ---------------------------------------------------------------------------- a gloo bootstrap the peer never joins


def test_a_gloo_bootstrap_whose_peer_never_joins_raises_the_stores_wait_timeout_for_its_address() -> None:
    """Measured on torch 2.15 CPU (two processes; rank 0 alone calls new_group([0, 1], timeout=3 s)): after 3 s
    connectFullMesh's store wait for group rank 1's address raises DistStoreError 'wait timeout after 3000ms, keys:
    /default_pg/0//1//cpu//0/1' -- gloo exchanges addresses, not an NCCL unique id."""
    gloo = InitProcessGroup(backend="gloo")
    late = NewGroup(ranks=(0, 1), bind="b", timeout_s=3)
    out = simulate([[gloo, late], [gloo, Compute(seconds=5000.0)]], gpus_per_node=0, ranks_per_node=2)
    (error,) = out.errors
    assert (error["rank"], error["type"]) == (0, "torch.distributed.DistStoreError")
    assert error["message"] == "wait timeout after 3000ms, keys: /default_pg/0//1//cpu//0/1"
    (hang,) = out.hangs
    assert error["time_s"] == pytest.approx(hang["since_s"] + 3.0)


def test_a_gloo_default_group_member_waits_for_the_first_absent_group_ranks_address() -> None:
    # torchrun: rank 1 reads the agent's store, rank 0 never comes; gloo waits for the keys in group-rank order
    gloo = InitProcessGroup(backend="gloo", timeout_s=5)
    out = simulate([[Compute(seconds=5000.0), gloo], [gloo], [gloo]], gpus_per_node=0, ranks_per_node=3)
    messages = {e["rank"]: e["message"] for e in out.errors if e["rank"] != 0}
    assert messages == {
        1: "wait timeout after 5000ms, keys: /default_pg/0//cpu//0/0",
        2: "wait timeout after 5000ms, keys: /default_pg/0//cpu//0/0",
    }


def test_under_spawn_rank_0_times_out_waiting_for_store_clients_one_second_past_the_timeout() -> None:
    """Measured on torch 2.15 CPU under env:// without an agent store (rank 1 never calls init_process_group,
    timeout 3 s, then 6 s): rank 0's store server raises after 4 s, then 7 s, 'Timed out after 4 seconds waiting
    for clients. 1/2 clients joined.'"""
    gloo = InitProcessGroup(backend="gloo", timeout_s=3)
    out = simulate([[gloo], [Compute(seconds=5000.0), gloo]], gpus_per_node=0, ranks_per_node=2, launcher="spawn")
    (error,) = [e for e in out.errors if e["rank"] == 0]
    assert error["type"] == "torch.distributed.DistStoreError"
    assert error["message"] == "Timed out after 4 seconds waiting for clients. 1/2 clients joined."
    hang = next(h for h in out.hangs if h["rank"] == 0)
    assert error["time_s"] == pytest.approx(hang["since_s"] + 4.0)

"""What a timed-out wait does, per backend and environment, in simulated time."""

from __future__ import annotations

import pytest

from simnccl.faults import Fault, FaultSchedule
from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
from simnccl.release import Impl
from simnccl.testing import simulate
from simnccl.watchdog import on_timeout

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
    assert error["message"].startswith("[gloo] Timed out waiting 1800000ms")


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

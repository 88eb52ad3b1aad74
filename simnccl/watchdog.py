"""What a process does when an operation it waits on exceeds its timeout, per backend and environment.

Pure decisions (the engine executes them in simulated time). Sources: reference §D.3/§D.5/§E.1 — nccl2 and
legacy run a watchdog per communicator; on timeout the abort hooks run (flight-recorder dump, health check
marked unhealthy) under "Waiting <n> ms for health check and flight recorder dump before aborting", then
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` decides: 0 NoHandling (log only: the process stays hung), 1 TearDown and
3 SkipCleanUp (the default; abort the process), 2 CleanUpOnly (abort the communicator; the waiting call
raises). ``TORCH_NCCL_BLOCKING_WAIT=1`` makes ``wait()`` itself raise at the timeout. gloo's wait raises at
its timeout. A store wait (the unique-id exchange of a bootstrap) raises ``DistStoreError``. A blocking
``ncclCommSplit`` has no timeout at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from simnccl.flight_recorder import dump_on_timeout, dump_wait_ms
from simnccl.release import Impl

OP_TYPES = {
    "all_reduce": "ALLREDUCE",
    "broadcast": "BROADCAST",
    "all_gather": "ALLGATHER",
    "reduce_scatter": "REDUCE_SCATTER",
    "all_to_all": "ALLTOALL_BASE",
    "barrier": "BARRIER",
    "send": "SEND",
    "recv": "RECV",
}


@dataclass(frozen=True, slots=True)
class TimeoutAction:
    """``outcome``: "abort" (the process dies), "raise" (the call raises), "hang" (nothing happens)."""

    outcome: str
    dump: bool
    wait_s: float
    error_type: str
    message: str
    unhealthy: bool


def async_error_handling(env: Mapping[str, str]) -> int:
    value = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3").strip()
    return int(value) if value in ("0", "1", "2", "3") else 3


def on_timeout(
    impl: Impl,
    kind: str,
    env: Mapping[str, str],
    *,
    rank: int,
    seq: int,
    op_name: str,
    numel: int,
    timeout_s: float,
) -> TimeoutAction | None:
    """The action for a wait of ``kind`` (collective, p2p, bootstrap, split) that timed out; None: no timeout."""
    ms = round(timeout_s * 1000)
    if kind in ("split", "split-color"):
        return None
    if kind == "bootstrap":
        return TimeoutAction(
            "raise",
            False,
            0.0,
            "torch.distributed.DistStoreError",
            f"Timed out after {timeout_s:g} seconds waiting for the NCCL unique id in the store "
            "(the group's other members never arrived)",
            False,
        )
    if impl is Impl.GLOO:
        return TimeoutAction(
            "raise", False, 0.0, "RuntimeError", f"[gloo] Timed out waiting {ms}ms for {op_name} to complete", False
        )
    if not impl.is_nccl:
        return None
    work = (
        f"WorkNCCL(SeqNum={seq}, OpType={OP_TYPES.get(op_name, op_name.upper())}, NumelIn={numel}, "
        f"NumelOut={numel}, Timeout(ms)={ms})"
    )
    timeout_text = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ms} milliseconds "
        "before timing out."
    )
    if env.get("TORCH_NCCL_BLOCKING_WAIT", "0").strip().lower() in ("1", "true"):
        return TimeoutAction(
            "raise",
            False,
            0.0,
            "torch.distributed.DistBackendError",
            f"{timeout_text} timed out in blocking wait.",
            True,
        )
    dump = dump_on_timeout(env)
    wait_s = dump_wait_ms(env) / 1000 if dump else 0.0
    mode = async_error_handling(env)
    if mode == 0:
        return TimeoutAction("hang", dump, wait_s, "", timeout_text, True)
    if mode == 2:
        return TimeoutAction("raise", dump, wait_s, "torch.distributed.DistBackendError", timeout_text, True)
    return TimeoutAction(
        "abort",
        dump,
        wait_s,
        "SIGABRT",
        f"{timeout_text}\nWaiting {round(wait_s * 1000)} ms for health check and flight recorder dump before "
        f"aborting\nAborting process on rank {rank} due to timeout - timeout watchdog detected operation timeout",
        True,
    )


def on_async_error(env: Mapping[str, str], *, rank: int) -> TimeoutAction:
    """An NCCL async error on a communicator (a peer died, a network error): the watchdog's error path."""
    text = (
        f"[Rank {rank}] NCCL Async Error: ncclRemoteError: A call failed possibly due to a network error or a "
        "remote process exiting prematurely."
    )
    dump = dump_on_timeout(env)
    wait_s = dump_wait_ms(env) / 1000 if dump else 0.0
    mode = async_error_handling(env)
    if mode == 0:
        return TimeoutAction("hang", dump, wait_s, "", text, True)
    if mode == 2:
        return TimeoutAction("raise", dump, wait_s, "torch.distributed.DistBackendError", text, True)
    return TimeoutAction(
        "abort",
        dump,
        wait_s,
        "SIGABRT",
        f"{text}\nAborting process on rank {rank} due to error - nccl hit async error",
        True,
    )

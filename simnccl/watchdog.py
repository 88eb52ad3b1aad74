"""What a process does when an operation it waits on exceeds its timeout, per backend and environment.

Pure decisions (the engine executes them in simulated time). Sources: reference §D.3/§D.5/§E.1 — nccl2 and
legacy run a watchdog per communicator; on timeout the abort hooks run (flight-recorder dump, health check
marked unhealthy) under "Waiting <n> ms for health check and flight recorder dump before aborting", then
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` decides: 0 NoHandling (log only: the process stays hung), 1 TearDown and
3 SkipCleanUp (the default; abort the process), 2 CleanUpOnly (abort the communicator; the waiting call
raises). ``TORCH_NCCL_BLOCKING_WAIT=1`` makes ``wait()`` itself raise at the timeout. gloo's wait raises at
its timeout. In an NCCL bootstrap only a member still waiting for the unique id in the store times out
(``on_unique_id_wait``); one inside ``ncclCommInitRank``, like a blocking ``ncclCommSplit``, has no timeout at all.

The heartbeat monitor (``on_watchdog_stuck``, ``on_dump_signal``) watches the watchdog itself. Only legacy
``ProcessGroupNCCL`` has one: the 2.15 wheel's ``ProcessGroupNCCL.hpp`` declares ``HeartbeatMonitor`` and
``TORCH_NCCL_ENABLE_MONITORING`` / ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``, and ``libtorch_cuda.so`` holds its
texts; ``nccl2/ProcessGroupNCCL.hpp`` declares only ``timeoutWatchdog`` and reads neither variable, so a stuck
nccl2 (or nccl-lazy) watchdog is noticed by nobody: the process stays hung (reference §D.3 documents the
monitor for legacy only). The monitor's loop, as in torch's source (main branch; the 2.15 strings match):
it wakes every ``TORCH_NCCL_COORD_CHECK_MILSEC`` (1000 ms) on the default group (uid 0, which also polls the
store for other ranks' dump signal), every heartbeat timeout elsewhere; every ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``
(480 s by default, a main-branch value the reference could not check against the 2.15 binary) it compares the
watchdog's heartbeat counter with the last one seen. The first check always sees a change (the counter starts
at 1, the monitor's copy at 0), so a watchdog stuck at ``t`` is caught at the first check that follows a check
at or after ``t``: between one and two heartbeat timeouts later. Then the default group's monitor dumps the
flight recorder (bounded by ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC``; charged in full, as every simulated dump
is), sleeps one more heartbeat timeout "to verify there is indeed a watchdog hang", and terminates the process
(``std::abort``): "Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL
watchdog hang." With ``TORCH_NCCL_ENABLE_MONITORING=0`` it only logs that it would have. With
``TORCH_NCCL_BLOCKING_WAIT=1`` legacy creates no watchdog thread, hence no monitor. The same monitor also
polls the store's dump key every second: once any rank's watchdog timed out and set it, every live legacy
process dumps, sleeps one heartbeat timeout and is terminated ("... due to collective timeout or exception."),
which is what finally ends a stalled legacy rank that nothing else would (2.15's nccl2 leaves it hung).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from simnccl.backends.gloo import RECV_TIMED_OUT
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
    """``outcome``: "abort" (the process dies), "raise" (the call raises), "hang" (nothing happens).
    ``kind`` names what acted in the result's errors: the collective ``timeout`` watchdog, the
    ``heartbeat`` monitor, or an NCCL async error (``abort``, ``error``: see ``on_async_error``)."""

    outcome: str
    dump: bool
    wait_s: float
    error_type: str
    message: str
    unhealthy: bool
    kind: str = "timeout"


# Legacy ProcessGroupNCCL's deprecated spellings (torch 2.15's c10d/ProcessGroupNCCL.hpp lists each after the
# TORCH_ name: getCvar* takes the first one set). nccl2's header lists no such aliases, so only legacy reads them.
LEGACY_ALIASES = {
    "TORCH_NCCL_BLOCKING_WAIT": "NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL_ASYNC_ERROR_HANDLING",
}


def _knob(env: Mapping[str, str], name: str, impl: Impl | None, default: str) -> str:
    """``name``'s value as ``impl`` reads it: legacy falls back to the deprecated alias where ``name`` is unset."""
    if name in env:
        return env[name]
    if impl is Impl.LEGACY and LEGACY_ALIASES[name] in env:
        return env[LEGACY_ALIASES[name]]
    return default


def blocking_wait(env: Mapping[str, str], impl: Impl | None) -> bool:
    """Whether ``TORCH_NCCL_BLOCKING_WAIT`` is on ("1" or "true"): one rule for both the timeout path and the
    heartbeat monitor, so they never disagree on whether a watchdog exists."""
    return _knob(env, "TORCH_NCCL_BLOCKING_WAIT", impl, "0").strip().lower() in ("1", "true")


def dump_wait_s(env: Mapping[str, str], dump: bool) -> float:
    """Seconds a dump holds the process before it acts (``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC``); 0 without one."""
    return dump_wait_ms(env) / 1000 if dump else 0.0


def async_error_handling(env: Mapping[str, str], impl: Impl | None) -> int:
    value = _knob(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", impl, "3").strip()
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
    if kind == "bootstrap":  # an NCCL key collision (NCCL's own: ``on_unique_id_wait``; gloo's: ``on_gloo_...``)
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
        return TimeoutAction("raise", False, 0.0, "RuntimeError", RECV_TIMED_OUT.format(ms=ms), False)
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
    if blocking_wait(env, impl):
        return TimeoutAction(
            "raise",
            False,
            0.0,
            "torch.distributed.DistBackendError",
            f"{timeout_text} timed out in blocking wait.",
            True,
        )
    dump = dump_on_timeout(env)
    wait_s = dump_wait_s(env, dump)
    mode = async_error_handling(env, impl)
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


# torch 2.15's texts for a member of an NCCL group whose unique id never reached it (strings of the 2.15 libtorch_cuda
# and libtorch_cpu). The store's keys, as TCPStore prints them ("/" + every PrefixStore's "<prefix>/<key>"): the
# default store is PrefixStore("default_pg", TCPStore), each group adds "<group name>/" then "<device>/" (checked
# against 2.15's own stores: get("0") prints "/default_pg/1//cuda//0"). Legacy's key is its ncclCommCounter_,
# "0" for a group's first communicator; nccl2's NCCLBootstrap adds a PrefixStore named after the communicator
# (the group's name) and the key "nccl_storekey_<generation>", 0 for the first bootstrap.
STORE_WAIT_TIMEOUT = "wait timeout after {ms}ms, keys: {keys}"
LEGACY_UNIQUE_ID_ERROR = (
    "[{group_rank}] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store "
    "by key '{key}', but store->get('{key}') got error: {error}. This may indicate a possible application crash on "
    "rank 0 or a network set up issue."
)


# torch 2.15's ProcessGroupGloo whose peer never joins: connectFullMesh (gloo transport/tcp) sets its own address
# under gloo's device prefix "0/" + its group rank, then waits for each other member's key in group-rank order,
# one store wait per key under the group's timeout; the first that never comes raises the store's DistStoreError.
# Measured on CPU (two processes, new_group([0, 1], timeout=3 s) on rank 0 alone): "wait timeout after 3000ms,
# keys: /default_pg/0//1//cpu//0/1" -- a new group's store is the default group's ("0/") prefixed with its name.
GLOO_STORE_KEYS = {True: "/default_pg/{group}//cpu//0/{peer}", False: "/default_pg/0//{group}//cpu//0/{peer}"}


def on_gloo_bootstrap_wait(*, group: str, default: bool, peer: int, timeout_s: float) -> TimeoutAction:
    """A member of a gloo group's bootstrap (``default``: the default group's) still waiting for group rank
    ``peer``'s address in the store when the group's timeout passes, as torch 2.15 ends it. Why not the NCCL
    text: gloo exchanges addresses, no unique id, and raises the store's own wait timeout (measured)."""
    keys = GLOO_STORE_KEYS[default].format(group=group, peer=peer)
    text = STORE_WAIT_TIMEOUT.format(ms=round(timeout_s * 1000), keys=keys)
    return TimeoutAction("raise", False, 0.0, "torch.distributed.DistStoreError", text, False)


# Under spawn (env:// without torchrun's agent store) rank 0 hosts the default group's TCPStore, whose server
# waits for every rank to connect before init_process_group goes on. Measured on CPU (rank 1 never calls
# init_process_group, timeout 3 s, then 6 s): after 4 s, then 7 s, "Timed out after 4 seconds waiting for clients.
# 1/2 clients joined." -- one second past the timeout; rank 0 counts itself.
STORE_HOST_WAIT_EXTRA_S = 1.0
STORE_HOST_TIMEOUT = "Timed out after {seconds:g} seconds waiting for clients. {joined}/{world} clients joined."


def on_store_host_wait(*, joined: int, world: int, timeout_s: float) -> tuple[float, TimeoutAction]:
    """Rank 0 under spawn, creating the default group's store, whose ``world - joined`` ranks never connected:
    how long it waits and what it raises. Why apart from gloo's key wait: it never reaches the backend."""
    wait_s = timeout_s + STORE_HOST_WAIT_EXTRA_S
    text = STORE_HOST_TIMEOUT.format(seconds=wait_s, joined=joined, world=world)
    return wait_s, TimeoutAction("raise", False, 0.0, "torch.distributed.DistStoreError", text, False)


def unique_id_wait_s(impl: Impl, *, group_timeout_s: float, store_timeout_s: float) -> float:
    """How long a member waits in the store for the unique id: legacy's ``store->get`` runs under the default
    store's own timeout (``init_process_group`` sets it to its timeout: ``store.set_timeout``), not the group's;
    nccl2's ``NCCLBootstrap`` calls ``store->wait(keys, timeout)`` with the group's."""
    return store_timeout_s if impl is Impl.LEGACY else group_timeout_s


def on_unique_id_wait(
    impl: Impl,
    *,
    group_rank: int,
    group: str,
    in_store: bool,
    timeout_s: float,
    pair: tuple[int, int, int] | None = None,
) -> TimeoutAction | None:
    """A member of an NCCL group's bootstrap that the others never joined, as torch 2.15 ends it.

    ``in_store``: the member still waits in the store for the unique id (group rank 0 never published it, or the
    member's own store never answers). Then the store times out after ``timeout_s`` (``unique_id_wait_s``): legacy
    wraps the store's DistStoreError in a DistBackendError; nccl2's ``exchangeUniqueIds`` lets it through. Else the
    member is inside ``ncclCommInitRank`` (group rank 0 after publishing, the others once they read the id), which
    in NCCL's default blocking mode has no timeout and no watchdog yet: None, nothing ends it here (legacy's
    heartbeat monitor may, on another rank's dump signal).

    ``pair``: the bootstrap is a send/recv pair communicator's of ``group`` (its two group ranks, lower first, and
    nccl-lazy's attempt number), whose pair rank 1 is the one that reads. Legacy's ``broadcastUniqueNCCLID`` keys
    a single p2p op's id by ``getKeySendRecv`` ("lo:hi") instead of its communicator counter, in the group's own
    store; nccl-lazy's pair is an nccl2 group named ``<group>/p2p-<lo>-<hi>-<attempt>`` over a store prefixed with
    that name, with the group's timeout."""
    if not in_store:
        return None
    ms = round(timeout_s * 1000)
    if impl is Impl.LEGACY:
        key = "0" if pair is None else f"{pair[0]}:{pair[1]}"
        error = STORE_WAIT_TIMEOUT.format(ms=ms, keys=f"/default_pg/{group}//cuda//{key}")
        text = LEGACY_UNIQUE_ID_ERROR.format(group_rank=group_rank, key=key, error=error)
        return TimeoutAction("raise", False, 0.0, "torch.distributed.DistBackendError", text, False)
    if pair is None:
        keys = f"/default_pg/{group}//cuda//{group}/nccl_storekey_0"
    else:
        name = f"{group}/p2p-{pair[0]}-{pair[1]}-{pair[2]}"
        keys = f"/default_pg/{group}//cuda//{name}/{name}/nccl_storekey_0"
    text = STORE_WAIT_TIMEOUT.format(ms=ms, keys=keys)
    return TimeoutAction("raise", False, 0.0, "torch.distributed.DistStoreError", text, False)


NO_HANDLING = (
    "its communicator hit an NCCL error and TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (NoHandling) only logs it: nothing "
    "tears the communicator down, so the op never completes"
)


def on_async_error(env: Mapping[str, str], impl: Impl | None, *, rank: int) -> TimeoutAction:
    """An NCCL async error on a communicator (a peer died, a network error): the watchdog's error path, under
    the rank's ``impl`` (None: no NCCL process group yet).

    Its ``kind`` is never "timeout": nothing timed out, the rank failed on its own, so a rank that raises
    (CleanUpOnly) or aborts is an error of the run, not a symptom of a hang. Under NoHandling ("hang") the
    watchdog only logs the error and the broken communicator never completes the op: the engine keeps the rank
    stuck in it (``Injection.stall``)."""
    text = (
        f"[Rank {rank}] NCCL Async Error: ncclRemoteError: A call failed possibly due to a network error or a "
        "remote process exiting prematurely."
    )
    dump = dump_on_timeout(env)
    wait_s = dump_wait_s(env, dump)
    mode = async_error_handling(env, impl)
    if mode == 0:
        return TimeoutAction("hang", dump, wait_s, "", text, True, kind="nccl-error")
    if mode == 2:
        return TimeoutAction("raise", dump, wait_s, "torch.distributed.DistBackendError", text, True, kind="error")
    return TimeoutAction(
        "abort",
        dump,
        wait_s,
        "SIGABRT",
        f"{text}\nAborting process on rank {rank} due to error - nccl hit async error",
        True,
        kind="abort",
    )


DEFAULT_HEARTBEAT_TIMEOUT_S = 480  # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, main-branch default (reference §D.3 [I])
DEFAULT_COORD_CHECK_MS = 1000  # TORCH_NCCL_COORD_CHECK_MILSEC
HEARTBEAT_STUCK_TEXT = (
    "ProcessGroupNCCL's watchdog got stuck for {seconds} seconds without making progress in monitoring enqueued "
    "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, "
    "and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), "
    "or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would "
    "help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the "
    "heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an "
    "issue to PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang. "
)
SIGNAL_TEXT = (
    "Received a dump signal due to a collective timeout from  rank {src} and we will try our best to dump the "
    "debug info. This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across "
    "ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, "
    "didn't run."
)


@dataclass(frozen=True, slots=True)
class MonitorAction:
    """What legacy's heartbeat monitor does: when it saw the problem, whether it dumps, when (if ever) it
    terminates the process, and torch's log text. ``terminate_at_s`` is None when monitoring is disabled."""

    reason: str  # "watchdog hang" | "dump signal"
    detected_at_s: float
    dump: bool
    terminate_at_s: float | None
    heartbeat_timeout_s: float
    message: str


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError:
        return default


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").strip().lower()
    return default if not value else value not in ("0", "false", "no", "off")


def heartbeat_monitor(impl: Impl, env: Mapping[str, str]) -> tuple[bool, int] | None:
    """``(enabled, heartbeat timeout s)`` for a process whose default group runs ``impl``; None: no monitor."""
    if impl is not Impl.LEGACY or blocking_wait(env, impl):
        return None
    timeout = _env_int(env, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", DEFAULT_HEARTBEAT_TIMEOUT_S)
    return _env_bool(env, "TORCH_NCCL_ENABLE_MONITORING", True), max(timeout, 1)


def _poll_ms(env: Mapping[str, str], heartbeat_s: int) -> int:
    """The default group's monitor wakes every coord-check interval when it dumps, else every heartbeat."""
    if not dump_on_timeout(env):
        return heartbeat_s * 1000
    return max(_env_int(env, "TORCH_NCCL_COORD_CHECK_MILSEC", DEFAULT_COORD_CHECK_MS), 1)


def _finish(
    reason: str,
    monitor: tuple[bool, int],
    dump: bool,
    env: Mapping[str, str],
    rank: int,
    detected_at_s: float,
    head: str,
) -> MonitorAction:
    """The monitor's action once it saw the problem; ``monitor`` and ``dump`` as the caller already computed."""
    enabled, heartbeat_s = monitor
    after_dump = detected_at_s + dump_wait_s(env, dump)
    exit_reason = "ProcessGroupNCCL watchdog hang" if reason == "watchdog hang" else "collective timeout or exception"
    if enabled:
        tail = f"Terminating the process after attempting to dump debug info, due to {exit_reason}."
    else:
        tail = (
            "ProcessGroupNCCL monitor thread is disabled, but would have terminated the processafter attempting "
            f"to dump debug info, due to {exit_reason}."
        )
    return MonitorAction(
        reason,
        detected_at_s,
        dump,
        after_dump + heartbeat_s if enabled else None,
        float(heartbeat_s),
        f"[Rank {rank}] {head}\n[Rank {rank}] {tail}",
    )


def on_watchdog_stuck(
    impl: Impl, env: Mapping[str, str], *, rank: int, monitor_start_s: float, stuck_at_s: float
) -> MonitorAction | None:
    """A watchdog that stopped beating at ``stuck_at_s``, under the default group's monitor started at
    ``monitor_start_s`` (the group's construction); None when no monitor watches it (nccl2, blocking wait)."""
    monitor = heartbeat_monitor(impl, env)
    if monitor is None:
        return None
    _, heartbeat_s = monitor
    poll_s = _poll_ms(env, heartbeat_s) / 1000
    period = poll_s * math.ceil(heartbeat_s / poll_s)  # checks fall on the first wake-up a heartbeat apart
    last_seen = max(1, math.ceil(max(stuck_at_s - monitor_start_s, 0.0) / period))
    detected = monitor_start_s + period * (last_seen + 1)
    head = HEARTBEAT_STUCK_TEXT.format(seconds=heartbeat_s)
    return _finish("watchdog hang", monitor, dump_on_timeout(env), env, rank, detected, head)


def on_dump_signal(
    impl: Impl, env: Mapping[str, str], *, rank: int, monitor_start_s: float, signal_at_s: float, src: int
) -> MonitorAction | None:
    """Another rank's watchdog timed out and set the store's dump key at ``signal_at_s``: the default group's
    monitor sees it at its next coord-check wake-up, dumps, waits a heartbeat timeout and ends the process.
    Only reached when dumps on timeout are on (otherwise nobody signals and nobody polls)."""
    monitor = heartbeat_monitor(impl, env)
    dump = dump_on_timeout(env)
    if monitor is None or not dump:
        return None
    poll_s = _poll_ms(env, monitor[1]) / 1000
    seen = monitor_start_s + poll_s * math.ceil(max(signal_at_s - monitor_start_s, 0.0) / poll_s)
    return _finish("dump signal", monitor, dump, env, rank, seen, SIGNAL_TEXT.format(src=src))

"""Running the target once per simulated rank: forked children under timeouts (reaped), or inline."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import io
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simnccl.capture.environment import DEFAULT_GPU, _installed
from simnccl.capture.recorder import _Recorder
from simnccl.capture.result import CaptureError, RankCapture
from simnccl.capture_cli import DEFAULT_TIMEOUT_S
from simnccl.ops import (
    Checkpoint,
)

MASTER_PORT = "29500"
STARTUP_CHECKPOINT = "startup"  # before a captured step: what startup left on each device
STEP_CHECKPOINT = "step1"  # after it: step 1's tensors and the communicators it created


@dataclass(frozen=True)
class _Spec:
    """Everything a rank needs: what to run, and the world it runs in."""

    target: Callable[[], Any]
    world_size: int
    gpus_per_node: int
    release: str
    env: Mapping[str, str]
    init_backend: str | None
    cuda: bool
    checkpoints: bool
    final_checkpoint: str | None
    timeout_s: float
    policy: str | None = None
    step: Callable[[Any], Any] | None = None  # run on the target's return value after startup (one step)
    gpu: str = DEFAULT_GPU  # the GPU kind torch.cuda.get_device_properties/mem_get_info describe

    def rank_env(self, rank: int) -> dict[str, str]:
        local = rank % self.gpus_per_node
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(self.gpus_per_node),
            "GROUP_RANK": str(rank // self.gpus_per_node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": MASTER_PORT,
            "TORCH_FR_BUFFER_SIZE": "0",  # no flight-recorder hooks: nothing to record, less noise
            **self.env,
        }


def _run_rank(spec: _Spec, rank: int) -> RankCapture:
    """Run the target as ``rank`` in this process and return what it called (the environment is restored)."""
    recorder = _Recorder(rank, rank % spec.gpus_per_node, spec.checkpoints)
    saved_env = dict(os.environ)
    saved_hook = sys.excepthook  # init_process_group installs a "[rankN]" excepthook; keep the process's own
    os.environ.update(spec.rank_env(rank))
    try:
        with (
            _installed(recorder, spec.release, spec.world_size, spec.gpus_per_node, spec.cuda, spec.gpu),
            _policy_applied(spec.policy, spec.release),
        ):
            if spec.init_backend is not None:
                dist.init_process_group(backend=spec.init_backend)
            state = None
            try:
                state = spec.target()
            except SystemExit as exit_:  # a script ending with sys.exit(0) finished normally
                if exit_.code not in (None, 0):
                    raise CaptureError(f"rank {rank}: the captured code exited with status {exit_.code}") from None
            if spec.step is not None:
                _run_step(spec.step, state, recorder)
            if spec.final_checkpoint is not None:
                recorder.append(Checkpoint(spec.final_checkpoint))
            recorder.finish()
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        with contextlib.suppress(Exception):
            from torch.distributed import device_mesh

            device_mesh._mesh_resources.__init__()  # type: ignore[misc]
        os.environ.clear()
        os.environ.update(saved_env)
        sys.excepthook = saved_hook
    return RankCapture(rank, tuple(recorder.ops), tuple(recorder.calls), tuple(recorder.notes))


def _run_step(step: Callable[[Any], Any], state: Any, recorder: _Recorder) -> None:
    """The first training step, between the ``startup`` and ``step1`` checkpoints (``simnccl.capture.api``)."""
    recorder.append(Checkpoint(STARTUP_CHECKPOINT))
    step(state)
    recorder.append(Checkpoint(STEP_CHECKPOINT))


@contextlib.contextmanager
def _policy_applied(policy: str | None, release: str) -> Iterator[None]:
    """Route the rank's group creation through ``simnccl.torch_apply.apply(policy)`` (production's path).

    Installed inside the rank, on top of the recording wrappers: torch's functions as the policy calls them are
    what gets recorded, so the Program is what real torch runs under that policy (its backend, device_id,
    pg_options such as ``lazy_init``, the groups it reuses instead of creating).
    """
    if policy is None:
        yield
        return
    from simnccl.torch_apply import apply

    with apply(policy, release=release):
        yield


def _describe_failure(rank: int, err: BaseException) -> str:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:]).rstrip()
    return f"rank {rank}: the captured code raised {type(err).__name__}: {err}\n{text}"


def _set_pdeathsig() -> None:
    """Die with the capturing process (Linux ``PR_SET_PDEATHSIG``); a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):  # non-Linux: no prctl
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _fork_rank(spec: _Spec, rank: int, log_path: str) -> tuple[int, int]:
    """Fork a child that runs ``rank`` and writes a pickled ``(ok, RankCapture | message)`` to a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(read_fd)
            _set_pdeathsig()
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
            sys.stderr = sys.stdout
            try:
                payload: tuple[bool, Any] = (True, _run_rank(spec, rank))
            except CaptureError as err:
                payload = (False, str(err))
            except BaseException as err:
                payload = (False, _describe_failure(rank, err))
            data = pickle.dumps(payload)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    tail = text.strip().splitlines()[-lines:]
    return ("\n  output:\n    " + "\n    ".join(tail)) if tail else ""


_WARM = False


def _warm_up() -> None:
    """Pay torch's lazy imports once, here, instead of once per forked rank.

    DeviceMesh slicing imports ``torch._dynamo`` (~900 modules, sympy among them: ~2 s of CPU), and the first
    group creation a few more. The warm-up imports the former and captures a 2-rank DeviceMesh build inline as
    rank 0, throwing it away; it never runs the user's code.
    """
    global _WARM
    if _WARM:
        return
    importlib.import_module("torch._dynamo")

    def startup() -> None:
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("nccl")
        mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("world",))
        mesh._unflatten(0, (1, 2), ("a", "b"), backend_override={"a": "fake"})["a", "b"]._flatten("ab")
        dist.new_group([0], backend="gloo")
        dist.all_reduce(torch.zeros(1))
        dist.barrier()

    spec = _Spec(startup, 2, 2, "2.15", {}, None, True, False, None, DEFAULT_TIMEOUT_S)
    with contextlib.redirect_stderr(io.StringIO()), _warnings_silenced():
        _run_rank(spec, 0)
    _WARM = True


@contextlib.contextmanager
def _warnings_silenced() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _run_forked(spec: _Spec, jobs: int, log_dir: str) -> list[RankCapture]:
    """Every rank in its own forked child, at most ``jobs`` at a time, each under ``spec.timeout_s``.

    Runs inside ``_intercepted()``: the children inherit the wrapped functions, and scan nothing themselves.
    """
    _warm_up()
    results: dict[int, RankCapture] = {}
    pending = list(range(spec.world_size))
    running: dict[int, tuple[int, int, float, bytearray, str]] = {}  # fd -> (rank, pid, deadline, data, log)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                rank = pending.pop(0)
                log = os.path.join(log_dir, f"rank_{rank}.log")
                pid, fd = _fork_rank(spec, rank, log)
                running[fd] = (rank, pid, time.monotonic() + spec.timeout_s, bytearray(), log)
            now = time.monotonic()
            wait_s = max(0.0, min(entry[2] for entry in running.values()) - now)
            ready, _, _ = select.select(list(running), [], [], min(wait_s, 1.0))
            for fd in ready:
                rank, pid, _, data, log = running[fd]
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    data.extend(chunk)
                    continue
                del running[fd]
                os.close(fd)
                _reap(pid)
                if not data:
                    raise CaptureError(f"rank {rank}: the capture process died without a result{_log_tail(log)}")
                ok, value = pickle.loads(bytes(data))
                if not ok:
                    raise CaptureError(f"{value}{_log_tail(log)}")
                results[rank] = value
            now = time.monotonic()
            for rank, _, deadline, _, log in list(running.values()):
                if now > deadline:
                    raise CaptureError(
                        f"rank {rank}: no result within {spec.timeout_s:g} s (the code waits for something "
                        f"that never comes: a peer, a store, or input); killed{_log_tail(log)}"
                    )
    finally:
        for fd, (_, pid, _, _, _) in running.items():
            os.close(fd)
            _reap(pid)
    return [results[r] for r in range(spec.world_size)]


class _Alarm(BaseException):
    """Raised in the main thread when an inline rank overruns its timeout.

    A BaseException, so the captured code's own ``except Exception`` cannot swallow it and run on.
    """


@contextlib.contextmanager
def _deadline(seconds: float, rank: int) -> Iterator[None]:
    """Interrupt the rank after ``seconds`` (main thread on POSIX; elsewhere it runs to completion)."""
    # Imported here: simnccl.testing pulls in the simulator, which only inline capture and simulate() need.
    from simnccl.testing.replay import _alarm

    try:
        with _alarm(seconds, f"rank {rank}", _Alarm):
            yield
    except _Alarm:
        raise CaptureError(f"rank {rank}: no result within {seconds:g} s; interrupted") from None


def _run_inline(spec: _Spec) -> list[RankCapture]:
    out = []
    for rank in range(spec.world_size):
        try:
            with _deadline(spec.timeout_s, rank):
                out.append(_run_rank(spec, rank))
        except CaptureError:
            raise
        except Exception as err:
            raise CaptureError(_describe_failure(rank, err)) from None
    return out

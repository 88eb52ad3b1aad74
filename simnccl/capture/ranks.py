"""Running the target once per simulated rank: forked children under timeouts (reaped), or inline."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import io
import operator
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from simnccl.capture.environment import DEFAULT_GPU, _installed
from simnccl.capture.heap import frozen_heap, prepare_to_fork, rank_collector
from simnccl.capture.process_end import collected as process_end_collected
from simnccl.capture.recorder import TooManyOps, _Recorder, built_calls, built_ops
from simnccl.capture.result import Call, CaptureError, RankCapture
from simnccl.capture_cli import DEFAULT_TIMEOUT_S
from simnccl.env_knobs import known_knobs, torchrun_env
from simnccl.file_tail import tail_text
from simnccl.nccl.knobs import same_to_the_model
from simnccl.ops import Checkpoint, Op, PgOptions
from simnccl.os_exit import os_exit_raises
from simnccl.process_tree import (
    become_subreaper,
    descendants,
    has_children,
    has_exited,
    how_it_ended,
    kill_descendants,
    subreaper,
)
from simnccl.visible_text import error_text

STARTUP_CHECKPOINT = "startup"  # before a captured step: what startup left on each device
STEP_CHECKPOINT = "step1"  # after it: step 1's tensors and the communicators it created
# How long a rank that closed its result pipe without a result gets to end, for its exit status to be reported: it
# closes the pipe by ending, so at once, unless the captured code closed the pipe's descriptor itself.
ENDED_GRACE_S = 2.0


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
        """What torchrun gives the rank (``env_knobs.torchrun_env``, as the simulator's ranks get it) over
        ``env``, which never holds one of ``env_knobs.LAUNCHER_VARIABLES`` (capture() refuses them)."""
        per_node = self.gpus_per_node
        return torchrun_env(
            rank=rank,
            local_rank=rank % per_node,
            node=rank // per_node,
            world_size=self.world_size,
            local_world_size=per_node,
            nodes=-(-self.world_size // per_node),
            env={**CAPTURE_OWN_ENV, **self.env},
        )


# What a capture sets in every rank's environment for itself, under what the user gives: no flight-recorder hooks
# (nothing to record on the stand-in backend, less noise).
CAPTURE_OWN_ENV = {"TORCH_FR_BUFFER_SIZE": "0"}


def _without(env: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the capture's own values (``own``), as the code would see it run alone."""
    return {k: v for k, v in env.items() if own.get(k) != v}


def _run_rank(spec: _Spec, rank: int) -> RankCapture:
    """Run the target as ``rank`` in this process and return what it called (the environment is restored)."""
    compact = _run_rank_compact(spec, rank)
    return RankCapture(rank, built_ops(compact.ops), built_calls(compact.calls), compact.notes, compact.env_set)


def _run_rank_compact(spec: _Spec, rank: int) -> RankCapture:
    """``_run_rank`` with the ops and calls as the recorder holds them (compact ``new_group`` entries, see
    ``_Recorder.record_new_group``): what a forked rank sends, for the parent to build once per distinct list."""
    recorder = _Recorder(rank, rank % spec.gpus_per_node, spec.checkpoints, spec.world_size)
    rank_pid = os.getpid()  # the rank; a process the captured code forks is not (see _exit_unless_the_rank)
    saved_env = dict(os.environ)
    saved_hook = sys.excepthook  # init_process_group installs a "[rankN]" excepthook; keep the process's own
    # torch's group counter: an init that failed in its rendezvous had already counted its group, and the next
    # rank (inline) or capture in this process named its groups one further on
    saved_group_count = c10d._world.group_count
    os.environ.update(spec.rank_env(rank))
    start_env = dict(os.environ)
    env_set: tuple[tuple[str, str | None, bool], ...] = ()
    try:
        with (
            _script_path(spec.target),
            _installed(recorder, spec.release, spec.world_size, spec.gpus_per_node, spec.cuda, spec.gpu),
            _policy_applied(spec.policy, spec.release) as applied,
            process_end_collected() as end,
        ):
            if spec.init_backend is not None:
                dist.init_process_group(backend=spec.init_backend)
            state = None
            try:
                try:
                    state = spec.target()
                except SystemExit as exit_:  # a script ending with sys.exit(0) finished normally
                    _exited(rank, rank_pid, exit_)
                _exit_unless_the_rank(rank_pid, None)  # before the step: a forked helper runs no step
                if spec.step is not None:
                    try:
                        _run_step(spec.step, state, recorder)
                    except SystemExit as exit_:  # as the startup's: inline, it ended the capturing process (exit 0)
                        _exited(rank, rank_pid, exit_)
                _exit_unless_the_rank(rank_pid, None)
                end.finish(rank)  # its threads joined and its exit handlers run, as Python ends a process
            except BaseException as err:
                _exit_unless_the_rank(rank_pid, err)
                with contextlib.suppress(AttributeError, TypeError):  # what the rank's failure is told with
                    err.simnccl_notes = tuple(recorder.notes)  # type: ignore[attr-defined]
                raise
            _exit_unless_the_rank(rank_pid, None)
            moments = [m for m in (recorder.env_at_init, recorder.env_at_first_op) if m is not None]
            policy_set = () if applied is None else tuple(applied.env_set)
            # the capture's own knobs, where the user did not set them, are no value of the code's (a code that sets
            # one to the capture's very value cannot be told from one that leaves it)
            own = {k: v for k, v in CAPTURE_OWN_ENV.items() if k not in spec.env}
            env_set = knobs_set_by_code(
                _without(start_env, own),
                [_without(moment, own) for moment in moments],
                policy_set,
                option_sets=lambda: option_sets(built_ops(recorder.ops)),
            )
            env_set += branch_knobs_set_by_code(start_env, recorder.env_at_nccl, policy_set)
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
        if not dist.is_initialized():
            c10d._world.group_count = saved_group_count
        os.environ.clear()
        os.environ.update(saved_env)
        sys.excepthook = saved_hook
    return RankCapture(rank, tuple(recorder.ops), tuple(recorder.calls), tuple(recorder.notes), env_set)


# Knobs read from the process's environment when a communicator is made (NCCL's, ProcessGroupNCCL's), so code
# that sets them before its groups changes what they do; torch's PYTORCH_* are read at import or CUDA's
# initialisation, before the code runs (a late one changes nothing: measured, real torch), and TORCH_DIST_USE_NCCL2
# at the first use of "nccl" (``BRANCH_KNOBS``).
CODE_SET_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_")  # TORCH_FR_*: the flight recorder, read by the first PG


def option_sets(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """The communicator configs NCCL's model reads (``comm_memory.model_options``) of every group ``ops`` make,
    and none: under each, two values of a knob must mean the same to count as one (``same_to_the_model``)."""
    from simnccl.comm_memory import model_options

    seen = {model_options(op.pg_options) for op in ops if isinstance(getattr(op, "pg_options", None), PgOptions)}
    return [dict(options) for options in sorted(seen | {()})]


def knobs_set_by_code(
    start: Mapping[str, str],
    moments: Sequence[Mapping[str, str]],
    policy_set: Sequence[str],
    option_sets: Callable[[], Sequence[Mapping[str, Any]]] = lambda: ({},),
) -> tuple[tuple[str, str | None, bool], ...]:
    """The knobs simnccl reads (``CODE_SET_PREFIXES``) the rank's code set in ``os.environ`` since it started
    (``start``), as they were at the moments NCCL may read them (``moments``: its first ``init_process_group``,
    where an eager communicator is made, and its first collective, send or recv, where a lazy one is; none: the
    rank's end): (name, value or None where removed, settled). ``settled`` is False where the value changed
    between those moments: which one NCCL read depends on when it made its communicator, so the capture does not
    guess. The ones its policy set (``policy_set``) are the policy's, simulated by the policy itself.

    Why not the rank's end: a knob set after the communicator was made changed nothing; one set for its creation
    and deleted after did its work; one set around init_process_group only was gone when legacy made its
    communicator at the first collective."""
    known = known_knobs()
    seen = list(moments) or [os.environ]
    names = {n for moment in (start, *seen) for n in moment if n.startswith(CODE_SET_PREFIXES) and n in known}
    out = []
    for name in sorted(names - set(policy_set)):
        values = {moment.get(name) for moment in seen}
        value = seen[0].get(name)
        if len(values) > 1 or value != start.get(name):
            # values that mean the same to NCCL's model where it read them are one value (``option_sets``, asked
            # only here: it builds the rank's ops)
            settled = len(values) == 1 or same_to_the_model(name, values, option_sets())
            out.append((name, value, settled))
    return tuple(out)


# Knobs torch reads once, at the first use of "nccl" in the process (``_register_builtin_nccl_backend``: legacy or
# nccl2), which a capture emulates from the environment the rank started with.
BRANCH_KNOBS = ("TORCH_DIST_USE_NCCL2",)


def branch_knobs_set_by_code(
    start: Mapping[str, str], at_nccl: Mapping[str, str] | None, policy_set: Sequence[str]
) -> tuple[tuple[str, str | None, bool], ...]:
    """The ``BRANCH_KNOBS`` the rank's code set (or removed) in ``os.environ`` before its first call naming
    "nccl" (``at_nccl``, the recorder's ``env_at_nccl``; None: it made none), as (name, value, True); not the ones
    its policy set. One set after it changes nothing: torch had read it."""
    if at_nccl is None:
        return ()
    return tuple(
        (name, at_nccl.get(name), True)
        for name in BRANCH_KNOBS
        if name not in policy_set and at_nccl.get(name) != start.get(name)
    )


def _exited(rank: int, rank_pid: int, exit_: SystemExit) -> None:
    """The captured code called ``sys.exit``: a status of 0 is a normal end; another is the rank's failure, with
    the status Python would exit with (``exit_status``: ``sys.exit(256)`` exits 0). In a process the captured code
    forked, it ends that process (``_exit_unless_the_rank``)."""
    status = exit_status(exit_)
    if status and os.getpid() == rank_pid:
        said = f" ({exit_.code})" if isinstance(exit_.code, str) else ""
        raise CaptureError(f"rank {rank}: the captured code exited with status {status}{said}") from None
    _exit_unless_the_rank(rank_pid, exit_)


def exit_status(exit_: SystemExit) -> int:
    """The status Python exits with for ``exit_``: an integer code modulo 256, 0 for None, 1 for anything else
    (a message, which Python prints)."""
    code = exit_.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _exit_unless_the_rank(rank_pid: int, outcome: BaseException | None) -> None:
    """End this process here, as Python would end it, unless it is the rank (pid ``rank_pid``) itself.

    Why: captured code may ``os.fork()`` a helper (a data-loader worker, a checkpoint writer) that ends with
    ``sys.exit(0)``, an exception, or by returning and running the rest of the script. Such a process is a copy
    of the rank, recorder included: left to go on, it would finish the rank's run and report *its* calls as the
    rank's result, hiding what the rank itself does next (a hang looked like a pass). It has nothing to report:
    it exits with the status Python would give it (``SystemExit``'s code, 1 after an uncaught exception, 0
    after returning), its output flushed, without running the step or the rank's cleanup, and what it recorded
    (into its own copy of the recorder) is dropped with it.
    """
    if os.getpid() == rank_pid:
        return
    status = 0
    if isinstance(outcome, SystemExit):
        status = exit_status(outcome)
        if outcome.code is not None and not isinstance(outcome.code, int):  # sys.exit("message"): printed
            print(outcome.code, file=sys.stderr)
    elif outcome is not None:
        traceback.print_exception(outcome)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _run_step(step: Callable[[Any], Any], state: Any, recorder: _Recorder) -> None:
    """The first training step, between the ``startup`` and ``step1`` checkpoints (``simnccl.capture.api``)."""
    recorder.append(Checkpoint(STARTUP_CHECKPOINT))
    step(state)
    recorder.append(Checkpoint(STEP_CHECKPOINT))


def _script_path(target: Callable[[], Any]) -> contextlib.AbstractContextManager[Any]:
    """A script target's ``sys.path`` (``ScriptTarget.importing``) for the whole rank: its exit handlers and a
    ``--step`` import from the script's directory after the script ran (a function target: nothing)."""
    importing = getattr(target, "importing", None)
    return importing() if callable(importing) else contextlib.nullcontext()


@contextlib.contextmanager
def _policy_applied(policy: str | None, release: str) -> Iterator[Any]:
    """Route the rank's group creation through ``simnccl.torch_apply.apply(policy)`` (production's path).

    Installed inside the rank, on top of the recording wrappers: torch's functions as the policy calls them are
    what gets recorded, so the Program is what real torch runs under that policy (its backend, device_id,
    pg_options such as ``lazy_init``, the groups it reuses instead of creating).
    """
    if policy is None:
        yield None
        return
    from simnccl.torch_apply import apply

    with apply(policy, release=release) as applied:
        yield applied


def _describe_failure(rank: int, err: BaseException) -> str:
    """The rank's failure, with its traceback's end and the capture's notes from the rank (a broadcast received
    with no sender's data explains an EOFError in ``broadcast_object_list``)."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:]).rstrip()
    notes = "".join(f"\n  note: {note}" for note in getattr(err, "simnccl_notes", ()) if isinstance(note, str))
    return f"rank {rank}: the captured code raised {type(err).__name__}: {error_text(err)}\n{text}{notes}"


def _set_pdeathsig() -> None:
    """Die with the process that forked this one (Linux ``PR_SET_PDEATHSIG``); a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):  # non-Linux: no prctl
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _forked_child(log_path: str) -> None:  # pragma: no cover - a child
    """What every forked process does first: die with its parent, write its output to ``log_path``, and run
    torch's intra-op work on this thread only. GNU OpenMP's thread pool does not survive ``fork``: once the
    parent has run one parallel op (any large tensor op), a child's next parallel op waits forever for threads
    it does not have, and the rank would be killed as hung. One thread per rank also suits ranks that already
    share the machine's cores.

    The new ``sys.stdout`` never closes fd 1 (``closefd=False``): a rank forked from the fork server replaces
    the server's own wrapper, and that one, freed, would otherwise close fd 1 under the rank, whose next
    ``open()`` then got fd 1 and whose every ``print`` failed (EBADF) or wrote into that file."""
    _set_pdeathsig()
    torch.set_num_threads(1)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0, closefd=False), write_through=True)
    sys.stderr = sys.stdout


def _own_group(pid: int) -> None:
    """Make rank ``pid`` the leader of a process group of its own (0: this process), inherited by whatever the
    captured code starts (a background job, a subprocess, a forked worker), so ``_kill_and_reap`` ends it all.

    Called by the rank and by the process that forked it, so the group exists before either goes on (whichever
    comes second finds it done, or the rank gone: nothing to do).
    """
    with contextlib.suppress(OSError):
        os.setpgid(pid, 0)


def _kill_and_reap(pid: int) -> None:
    """SIGKILL ``pid``, a rank forked by this process, with every process it started, and reap it.

    Why: only the rank dies with its parent (``PR_SET_PDEATHSIG``); a process the captured code started
    (``subprocess.Popen(["sleep", "1000"])``) would be reparented and outlive the capture. Those still in the
    rank's process group (``_own_group``) die with it (``killpg``, also where there is no ``/proc``). One that
    left the group (``setsid``, ``start_new_session=True``, a daemon's double fork) is still in the rank's
    tree on Linux, the rank being a subreaper (``_rank_child``): a rank still running is stopped (it forks no
    more) and its tree killed first (``kill_descendants``). A rank that ended on its own ended its tree itself.
    """
    if not has_exited(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
        kill_descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _rank_child(spec: _Spec, rank: int, write_fd: int, log_path: str) -> NoReturn:  # pragma: no cover - a child
    """The body of a forked rank: run ``rank``, write its framed result (``_frame``) to ``write_fd``, exit.

    Only this process, the rank, writes: a process the captured code forked ends in ``_run_rank_compact``
    (``_exit_unless_the_rank``), and one that gets here all the same exits without a word (70: it should not)."""
    code = 0
    rank_pid = os.getpid()
    try:
        _own_group(0)
        become_subreaper()  # what the captured code starts stays in our tree, even in a session of its own
        os.set_inheritable(write_fd, False)  # a program the captured code runs (os.system, Popen) never gets it
        _forked_child(log_path)
        rank_collector()
        try:
            data = _frame(_run_rank_compact(spec, rank))
        except (CaptureError, TooManyOps) as err:
            data = _frame(str(err))
        except BaseException as err:
            data = _frame(_describe_failure(rank, err))
        if os.getpid() != rank_pid:
            code = 70
            return
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
    except BaseException:
        code = 70
    finally:
        _end_descendants()
        os._exit(code)


def _end_descendants() -> None:  # pragma: no cover - a child
    """Kill whatever this process (a rank, a subreaper) still has running before it exits: its orphans would
    otherwise be re-parented past it, out of the capture's reach. Checked first with one system call: most
    ranks start nothing."""
    with contextlib.suppress(Exception):
        if has_children():
            kill_descendants(os.getpid())


_HEAD = struct.Struct("<BBQ")  # a frame's head: ok, number of parts, the pid of the process that wrote it


def _frame(result: RankCapture | str) -> bytes:
    """A rank's result as bytes: ops, calls and notes pickled apart (the parent shares equal parts), or the
    failure message. Ops and calls may be compact (``_run_rank_compact``): ``_Results`` builds them. The head
    names the writer's pid, so the parent can tell the rank's frame from anything another process wrote."""
    if isinstance(result, str):
        parts = [result.encode("utf-8", "replace")]
    else:
        parts = [_pickled(part) for part in (result.ops, result.calls, result.notes, result.env_set)]
    head = _HEAD.pack(not isinstance(result, str), len(parts), os.getpid())
    return head + b"".join(struct.pack("<Q", len(p)) for p in parts) + b"".join(parts)


def _frame_size(data: bytes | bytearray) -> int | None:
    """The length of the frame ``data`` starts with, once its head is complete (None before)."""
    if len(data) < _HEAD.size:
        return None
    _, count, _ = _HEAD.unpack_from(data)
    if len(data) < _HEAD.size + 8 * count:
        return None
    return _HEAD.size + 8 * count + sum(struct.unpack_from(f"<{count}Q", data, _HEAD.size))


def _pickled(value: Any) -> bytes:
    """``pickle.dumps`` with ops and calls reduced to (class, field values): 2-3x faster both ways than a frozen
    dataclass's default reduction, which looks its fields up again for every object."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _reductions()
    pickler.dump(value)
    return buffer.getvalue()


@functools.cache
def _reductions() -> dict[type, Callable[[Any], tuple[Any, ...]]]:
    from simnccl import ops

    table: dict[type, Callable[[Any], tuple[Any, ...]]] = {}
    for cls in (*vars(ops).values(), Call):
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            fields = dataclasses.fields(cls)
            if all(f.init for f in fields):  # rebuilt by calling the class with the values in field order
                table[cls] = _reducer(cls, tuple(f.name for f in fields))
    return table


def _reducer(cls: type, names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """``value -> (cls, its field values in order)``, the values read by one C-level ``attrgetter`` (the
    reduction runs once per op and call: ~6,000 times per Megatron rank at 512 ranks)."""
    if not names:
        return lambda value: (cls, ())
    get = operator.attrgetter(*names)
    if len(names) == 1:
        return lambda value: (cls, (get(value),))
    return lambda value: (cls, get(value))


class _Results:
    """Ranks' results merged as they arrive: equal parts (ops, calls, notes) are kept once, shared by every rank
    that produced them, so a world of ranks with the same program costs one program's memory (DESIGN rule 8)
    and the parent unpickles each distinct part once."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankCapture] = {}
        self._parts: dict[bytes, Any] = {}  # digest of the pickled part -> the part, unpickled once

    def add(self, rank: int, data: bytes, pid: int | None = None) -> None:
        """Merge ``rank``'s framed result; raises CaptureError with its failure message, or when ``data`` is
        not one whole frame written by process ``pid`` (the rank's; None: any), which would mean that something
        other than the rank answered for it (a process it forked): never dropped in silence, nor believed."""
        size = _frame_size(data)
        if size is None or size > len(data):
            raise CaptureError(f"rank {rank}: its result ended after {len(data)} bytes, incomplete")
        if size < len(data):
            raise CaptureError(f"rank {rank}: more than one result came back for it (a process it forked wrote one)")
        ok, count, writer = _HEAD.unpack_from(data)
        if pid is not None and writer != pid:
            raise CaptureError(f"rank {rank}: its result was written by process {writer}, not by the rank ({pid})")
        lengths = struct.unpack_from(f"<{count}Q", data, _HEAD.size)
        at, parts = _HEAD.size + 8 * count, []
        for length in lengths:
            parts.append(data[at : at + length])
            at += length
        if not ok:
            raise CaptureError(parts[0].decode("utf-8", "replace"))
        ops, calls, notes, env_set = parts
        self.ranks[rank] = RankCapture(
            rank,
            self._shared(ops, built_ops),
            self._shared(calls, built_calls),
            self._shared(notes, tuple),
            pickle.loads(env_set),
        )

    def _shared(self, part: bytes, build: Callable[[Any], Any]) -> Any:
        """``build(unpickled part)``, once per distinct part (the key tells ops, calls and notes apart too)."""
        key = hashlib.blake2b(part, digest_size=20, person=build.__name__.encode()[:16]).digest()
        if key not in self._parts:
            self._parts[key] = build(pickle.loads(part))
        return self._parts[key]


class _DirectForks:
    """Ranks forked straight from this process (which already holds everything the target imports)."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        self.prepared = False

    def spawn(self, rank: int, log_path: str) -> tuple[int, int]:
        if not self.prepared:  # inside _run_forked's frozen heap, right before the first fork
            prepare_to_fork(self.spec.world_size)
            self.prepared = True
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            os.close(read_fd)
            _rank_child(self.spec, rank, write_fd, log_path)
        _own_group(pid)
        os.close(write_fd)
        return pid, read_fd

    def release(self, pid: int) -> None:
        _kill_and_reap(pid)

    def how_it_ended(self, pid: int) -> str | None:
        return how_it_ended(pid, ENDED_GRACE_S)

    def close(self) -> None:
        return None


def _log_tail(path: str, lines: int = 15) -> str:
    text = tail_text(path, 8000)  # the last lines, without reading a rank's whole output
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
        dist.all_reduce(torch.zeros(1, device="cuda"))  # an nccl group has no cpu backend
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


def _run_forked(spec: _Spec, jobs: int, log_dir: str, forks: Any = None) -> list[RankCapture]:
    """Every rank in its own forked child, at most ``jobs`` at a time, each under ``spec.timeout_s``.

    ``forks`` starts and stops the children (``spawn(rank, log) -> (pid, fd)``, ``release(pid)``, ``close()``,
    ``how_it_ended(pid)`` for a rank that closed its result pipe without a result):
    ``_DirectForks`` (default) from this process, or a fork server (``simnccl.capture.forkserver``) holding the
    target's imports. Runs inside ``_intercepted()``: the children inherit the wrapped functions, and scan
    nothing themselves. Results are merged as each child finishes (``_Results``).

    Failures are reported deterministically: the error names the lowest failing rank, whichever child the
    parent happens to see fail first. Ranks start in order, so once rank ``r`` has failed no rank below it is
    still pending: the running ones below ``r`` finish (or time out), the ones above are killed, none starts.
    """
    _warm_up()
    forks = forks or _DirectForks(spec)
    results = _Results()
    pending = list(range(spec.world_size))
    pending.reverse()
    running: dict[int, tuple[int, int, float, bytearray, str]] = {}  # fd -> (rank, pid, deadline, data, log)
    failures: dict[int, str] = {}  # rank -> its error message
    finished: list[int] = []  # pids of ranks that sent their whole result, released once the next ones started

    def stop(fd: int) -> None:
        os.close(fd)
        forks.release(running.pop(fd)[1])

    def done(fd: int) -> None:
        """A rank sent its whole result, or closed its result pipe: it is exiting. It is reaped after the next
        ranks are started, so that the wait for its exit (its memory unmapped) does not hold up the next fork.

        Why not wait for end of input once the frame is in: a process the captured code forked and left running
        (a worker, a background job) holds the pipe's write end too, and the rank would be reported as hung."""
        os.close(fd)
        finished.append(running.pop(fd)[1])

    def failed(rank: int, message: str) -> None:
        failures[rank] = message
        pending.clear()  # every pending rank is above ``rank``: none can be the lowest failure
        for fd in [fd for fd, entry in running.items() if entry[0] > min(failures)]:
            stop(fd)

    try:
        with frozen_heap():
            while pending or running:
                while pending and len(running) < jobs:
                    rank = pending.pop()
                    log = os.path.join(log_dir, f"rank_{rank}.log")
                    pid, fd = forks.spawn(rank, log)
                    running[fd] = (rank, pid, time.monotonic() + spec.timeout_s, bytearray(), log)
                while finished:
                    forks.release(finished.pop())
                now = time.monotonic()
                wait_s = max(0.0, min(entry[2] for entry in running.values()) - now)
                ready, _, _ = select.select(list(running), [], [], min(wait_s, 1.0))
                for fd in ready:
                    if fd not in running:  # stopped above, after a lower rank failed
                        continue
                    rank, pid, _, data, log = running[fd]
                    chunk = os.read(fd, 1 << 20)
                    if chunk:
                        data.extend(chunk)
                        size = _frame_size(data)
                        if size is None or len(data) < size:
                            continue
                    done(fd)  # at end of input, or once the whole frame is in (see done)
                    if not data:  # asked before it is released (``finished``): how it ended, not how we ended it
                        failed(rank, f"{_no_result(rank, forks.how_it_ended(pid))}{_log_tail(log)}")
                        continue
                    try:
                        results.add(rank, bytes(data), pid)
                    except CaptureError as err:
                        failed(rank, f"{err}{_log_tail(log)}")
                now = time.monotonic()
                for fd, (rank, _, deadline, _, log) in list(running.items()):
                    if now > deadline and fd in running:
                        stop(fd)
                        failed(
                            rank,
                            f"rank {rank}: no result within {spec.timeout_s:g} s (the code waits for something "
                            f"that never comes: a peer, a store, or input); killed{_log_tail(log)}",
                        )
    finally:
        for fd in list(running):
            stop(fd)
        for pid in finished:
            forks.release(pid)
        forks.close()
    if failures:
        raise CaptureError(failures[min(failures)])
    return [results.ranks[r] for r in range(spec.world_size)]


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
            with (
                _deadline(spec.timeout_s, rank),
                _ending_what_it_starts(),
                _ctrl_c_told_apart() as pressed,
                _os_exit_is_the_ranks(),
            ):
                out.append(_run_rank(spec, rank))
        except _RankExited as exited:  # as fork mode reports a rank that ended without a result
            ended = f"exited with status {exited.status} (the captured code called os._exit)"
            raise CaptureError(_no_result(rank, ended)) from None
        except CaptureError:
            raise
        except TooManyOps as err:
            raise CaptureError(str(err)) from None
        except KeyboardInterrupt as err:
            if pressed:
                raise
            # the captured code's own ``raise KeyboardInterrupt``: its failure (exit 2, as in fork mode), not a
            # Ctrl-C the user pressed (exit 130, "interrupted")
            raise CaptureError(_describe_failure(rank, err)) from None
        except Exception as err:
            raise CaptureError(_describe_failure(rank, err)) from None
    return out


def _no_result(rank: int, ended: str | None) -> str:
    """The failure of a rank that ended without a result, and how it ended where that is known
    (``process_tree.how_it_ended``'s words: "exited with status 3", "was killed by signal 11 (SIGSEGV)")."""
    return f"rank {rank}: the capture process died without a result" + (f"; it {ended}" if ended else "")


class _RankExited(BaseException):
    """The captured code called ``os._exit(status)`` in an inline rank (``_os_exit_is_the_ranks``)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _os_exit_is_the_ranks() -> contextlib.AbstractContextManager[None]:
    """While an inline rank runs, the captured code's ``os._exit`` ends the rank, not the capturing process.

    Why: inline, the rank is this process, and ``os._exit(0)`` ended ``simnccl capture --simulate`` with exit 0
    and no output, nothing simulated. A process the captured code forks still exits for real (``simnccl.os_exit``).
    A BaseException, so the captured code's ``except Exception`` cannot swallow it."""
    return os_exit_raises(_RankExited)


@contextlib.contextmanager
def _ctrl_c_told_apart() -> Iterator[list[bool]]:
    """While an inline rank runs, a SIGINT is noted (the list holds True) before Python's handler raises its
    KeyboardInterrupt, so one the captured code raises itself can be told from one the user pressed."""
    pressed: list[bool] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        pressed.append(True)  # cannot tell: every KeyboardInterrupt counts as pressed, as before
        yield pressed
        return

    def noted(signum: int, frame: Any) -> None:
        pressed.append(True)
        previous(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _ending_what_it_starts() -> Iterator[None]:
    """Kill every process started inside the block (by an inline rank) once it ends, as a forked rank's are.

    Inline, the rank is this process: what the captured code starts is our child (or, orphaned, our child
    again: this process is a subreaper inside the block, and only there). Processes that were already our
    descendants before the block, and what they start, are left alone; one that another thread of this
    process starts during the block is not told apart from the rank's, and is killed too.
    """
    me = os.getpid()
    before = frozenset(descendants(me))
    with subreaper():
        try:
            yield
        finally:
            if os.getpid() == me:  # not in a process the captured code forked (it exits at once)
                kill_descendants(me, spare=before)

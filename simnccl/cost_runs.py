"""Running ``simnccl cost``'s columns: in this process or in worker processes, each reporting its progress,
each result handed back as soon as it is done, and what finished kept when Ctrl-C stops the rest.

Why a module of its own: ``simnccl.cost`` says what a column measures and how the table reads; this says
only where and how the columns run, so either can change without the other. Columns are independent
simulations of the same Programs (built once, before any column runs), so they may run in parallel: the
results are identical wherever a column runs (tests/test_cost.py compares serial and parallel).

Progress: a column's engine counts the rank-ops it has simulated (``Guard.ops``: an op run by one rank, a
call taken on a fast path counting as it would on the ordinary one); a reporter thread beside the engine
copies that count into a shared array every ``REPORT_EVERY_S``, and the caller polls the array. Workers use
the ``spawn`` start method (a fresh interpreter, never a fork of a process whose progress thread is running)
and ignore SIGINT: Ctrl-C is the parent's to handle, which terminates them. They are processes of our own
(``multiprocessing.Process`` with a pipe each), not an executor's: stopping a worker in the middle of a column
is then ``Process.terminate``, a public call, and a worker that dies is seen at once (its sentinel).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from typing import Any, Generic, TypeVar

REPORT_EVERY_S = 0.1  # how often a running column's rank-ops are copied out, and the bars redrawn
# Below this many rank-ops per column (world size x ops per rank), ``--jobs`` defaults to this process:
# starting a worker (a fresh interpreter importing simnccl, ~0.5 s of CPU) costs more than such a column
# (measured: the 32-rank test startups simulate in well under a second, Megatron 512 ranks in seconds).
PARALLEL_FROM_RANK_OPS = 200_000

NOT_STARTED = -1  # a column's count before its engine runs

R = TypeVar("R")

_SLOT: list[Any] = [None, -1]  # this process's (shared counts, index of the column it is running)


class Counter:
    """What an engine exposes for progress: ``ops``, rank-ops simulated so far (``simnccl.engine``'s Guard)."""

    ops: int


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs(columns: int, rank_ops: int) -> int:
    """Worker processes when ``--jobs`` is not given: one per column up to the usable CPUs, for startups
    large enough to repay starting a worker; else 1 (this process)."""
    if rank_ops < PARALLEL_FROM_RANK_OPS:
        return 1
    return max(1, min(columns, usable_cpus()))


@contextlib.contextmanager
def progress_reported(counter: Counter) -> Iterator[None]:
    """While the block runs (an engine's ``run()``), copy ``counter.ops`` into this process's slot every
    ``REPORT_EVERY_S``; nothing when no slot is set (a column run outside ``run_columns``)."""
    counts, index = _SLOT
    if counts is None:
        yield
        return
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(REPORT_EVERY_S):
            counts[index] = counter.ops

    counts[index] = counter.ops  # started: the parent shows this column's bar from now on
    reporter = threading.Thread(target=report, name="simnccl-cost-progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        stop.set()
        reporter.join()
        counts[index] = counter.ops


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off for the block (a whole column: building the engine, running it, reading its
    figures), back as it was after. Why: a column holds millions of small objects alive until its figures are
    read; with the collector on, every collection of the older generations walks all of them (measured on
    Megatron 512 ranks: reading a column's figures took ~4x as long with it on). Nothing a column builds needs
    cycle collection to finish; its cycles are collected once the collector is back."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _in_slot(counts: Any, index: int, fn: Callable[..., R], args: tuple[Any, ...]) -> R:
    _SLOT[:] = [counts, index]
    try:
        return fn(*args)
    finally:
        _SLOT[:] = [None, -1]


_WORKER_COUNTS: list[Any] = [None]  # in a worker process: the parent's shared counts (inherited at its start)


def _worker_init(counts: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers
    _WORKER_COUNTS[0] = counts


def _in_worker(index: int, fn: Callable[..., R], args: tuple[Any, ...]) -> R:
    return _in_slot(_WORKER_COUNTS[0], index, fn, args)


@dataclass(slots=True)
class Finished(Generic[R]):
    """The columns' results, ``None`` where a column did not finish (``interrupted``: Ctrl-C stopped it)."""

    results: list[R | None]
    interrupted: bool = False
    running: list[int] = field(default_factory=list)


def run_columns(
    fn: Callable[..., R],
    args: Sequence[tuple[Any, ...]],
    jobs: int,
    *,
    on_start: Callable[[int], None] = lambda index: None,
    on_progress: Callable[[int, int], None] = lambda index, ops: None,
    on_done: Callable[[int, R], None] = lambda index, result: None,
) -> Finished[R]:
    """``fn(*args[i])`` for every column i, ``jobs`` at a time (1: in this process, in order), with
    ``on_start(i)``, ``on_progress(i, rank_ops)`` (from a poller thread) and ``on_done(i, result)`` (in this
    thread, as each finishes). ``fn`` must be a module-level function (workers import it by name). Ctrl-C
    returns what finished, ``interrupted`` set and the columns that were running named."""
    count = len(args)
    parallel = jobs > 1 and count > 1
    # One writer per slot, so no lock; shared with the workers only when there are any.
    counts: Any = get_context("spawn").RawArray("q", [NOT_STARTED] * count) if parallel else [NOT_STARTED] * count
    finished: Finished[R] = Finished([None] * count)
    running = [False] * count  # a list, not a set: the poller thread reads it while this thread writes
    poller = _Poller(counts, running, on_progress)
    poller.start()
    try:
        if not parallel:
            for index, column_args in enumerate(args):
                running[index] = True
                on_start(index)
                result = _in_slot(counts, index, fn, column_args)
                running[index] = False
                finished.results[index] = result
                on_done(index, result)
        else:
            _run_pool(fn, args, jobs, counts, finished, running, on_start, on_done)
    except KeyboardInterrupt:
        finished.interrupted = True
        finished.running = [index for index, now in enumerate(running) if now]
    finally:
        poller.stop()
    return finished


class WorkerDied(RuntimeError):
    """A worker process ended without handing back its column (killed from outside, e.g. for memory)."""


@dataclass(slots=True, eq=False)
class _Worker:
    process: Any  # a spawn-context Process
    conn: Connection
    index: int = -1  # the column it is running (-1: idle)


def _worker_main(conn: Connection, counts: Any) -> None:
    """A worker: run the columns it is sent, one at a time, until told to stop (None)."""
    _worker_init(counts)
    while True:
        task = conn.recv()
        if task is None:
            return
        index, fn, args = task
        try:
            reply: tuple[bool, Any] = (True, _in_slot(counts, index, fn, args))
        except Exception as err:  # handed back: the parent raises it, as if the column ran there
            reply = (False, err)
        try:
            conn.send(reply)
        except Exception as err:  # an unpicklable result or error: say what it was
            conn.send((False, RuntimeError(f"column {index}: {type(err).__name__}: {err}")))


def _run_pool(
    fn: Callable[..., R],
    args: Sequence[tuple[Any, ...]],
    jobs: int,
    counts: Any,
    finished: Finished[R],
    running: list[bool],
    on_start: Callable[[int], None],
    on_done: Callable[[int, R], None],
) -> None:
    """The columns on ``jobs`` worker processes of our own (``spawn``), each sent one column at a time over
    its pipe. Whatever stops this early (Ctrl-C, a column's error) terminates the workers that still run and
    joins them, so nothing waits for a column to finish and no worker survives; a worker that dies is an
    error naming its column, never a wait for a result that cannot come."""
    ctx = get_context("spawn")
    workers: list[_Worker] = []
    queue = list(range(len(args)))
    stopped_early = True
    try:
        for _ in range(min(jobs, len(args))):
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=_worker_main, args=(theirs, counts), name="simnccl-cost-worker", daemon=True)
            process.start()
            theirs.close()
            workers.append(_Worker(process, ours))
        for worker in workers:
            _send_next(worker, queue, fn, args)
        while any(w.index >= 0 for w in workers):
            for index, now in enumerate(running):  # a column has started once its worker wrote a count
                if not now and counts[index] != NOT_STARTED and finished.results[index] is None:
                    running[index] = True
                    on_start(index)
            busy = [w for w in workers if w.index >= 0]
            ready = set(connection_wait([w.conn for w in busy] + [w.process.sentinel for w in busy], REPORT_EVERY_S))
            replies = []
            for worker in busy:
                if worker.conn in ready or worker.process.sentinel in ready:
                    replies.append((worker.index, worker, _reply(worker)))
            for index, worker, result in sorted(replies, key=lambda item: item[0]):  # in column order
                worker.index = -1
                if not running[index]:
                    on_start(index)
                running[index] = False
                finished.results[index] = result
                on_done(index, result)
                _send_next(worker, queue, fn, args)
        stopped_early = False
    finally:
        for worker in workers:
            if stopped_early:  # Ctrl-C (or an error) while columns run: they are not waited for
                worker.process.terminate()
            else:
                worker.conn.send(None)
        for worker in workers:
            worker.process.join()
            worker.conn.close()


def _send_next(worker: _Worker, queue: list[int], fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> None:
    if queue:
        worker.index = queue.pop(0)
        worker.conn.send((worker.index, fn, args[worker.index]))


def _reply(worker: _Worker) -> Any:
    """The finished column's result (its error raised here); WorkerDied if the worker ended without one."""
    try:
        ok, value = worker.conn.recv()
    except (EOFError, OSError):
        worker.process.join()
        raise WorkerDied(
            f"the worker process running column {worker.index} ended (exit code {worker.process.exitcode}) "
            "without a result"
        ) from None
    if not ok:
        raise value
    return value


class _Poller:
    """Reads the shared counts of the running columns every ``REPORT_EVERY_S`` and reports them."""

    def __init__(self, counts: Any, running: list[bool], report: Callable[[int, int], None]) -> None:
        self.counts = counts
        self.running = running
        self.report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="simnccl-cost-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            for index, now in enumerate(self.running):
                if now and self.counts[index] != NOT_STARTED:
                    self.report(index, self.counts[index])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

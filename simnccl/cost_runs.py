"""Running ``simnccl cost``'s columns: in this process or in worker processes, each reporting its progress,
each result handed back as soon as it is done, and what finished kept when Ctrl-C stops the rest.

Why a module of its own: ``simnccl.cost`` says what a column measures and how the table reads; this says
only where and how the columns run, so either can change without the other. Columns are independent
simulations of the same Programs (built once, before any column runs), so they may run in parallel: the
results are identical wherever a column runs (tests/test_cost.py compares serial and parallel).

Progress: a column's engine counts the rank-ops it has simulated (``Guard.ops``: an op run by one rank, a
call taken on a fast path counting as it would on the ordinary one); a reporter thread beside the engine
copies that count into a shared array every ``REPORT_EVERY_S``, and the caller polls the array.

Workers (``ColumnRunner``): processes of our own (``multiprocessing.Process`` with a pipe each), not an
executor's: stopping a worker in the middle of a column is then ``Process.terminate``, a public call, and a
worker that dies is seen at once (its sentinel). They are started when the runner is entered, before any
thread of ours (the progress poller, a terminal's bars) runs: then they are *forked* — a copy of this process,
nothing imported again (a ``spawn`` worker re-imports simnccl: ~0.6 s of CPU each, measured) — and only when
another thread already runs (forking then could copy a lock that thread holds) are they *spawned*
(``start_method``). Either way they ignore SIGINT: Ctrl-C is the parent's to handle, which terminates them.
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

from simnccl.interrupt_deferral import deferred_interrupt

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


def start_method(threads: int | None = None) -> str:
    """How workers start: ``fork`` while this process runs no thread but the main one (``threads``: how many
    run, default now), else ``spawn`` (a fork copies only the forking thread, and with it any lock another
    thread held at that moment, never to be released in the copy). Threads are counted as the OS counts them
    where it can say (``running_threads``): a thread started below ``threading`` (pytest-xdist's execnet
    starts its own with ``_thread``) is just as much a hazard, and Python 3.12+ warns of the fork then."""
    import multiprocessing

    threads = running_threads() if threads is None else threads
    return "fork" if threads == 1 and "fork" in multiprocessing.get_all_start_methods() else "spawn"


def running_threads() -> int:
    """This process's threads: the OS's count (``/proc/self/task``) where there is one, else ``threading``'s
    (which misses threads started with ``_thread`` or by C extensions)."""
    try:
        return max(len(os.listdir("/proc/self/task")), threading.active_count())
    except OSError:
        return threading.active_count()


@dataclass(slots=True)
class Finished(Generic[R]):
    """The columns' results, ``None`` where a column did not finish (``interrupted``: Ctrl-C stopped it)."""

    results: list[R | None]
    interrupted: bool = False
    running: list[int] = field(default_factory=list)

    def not_started(self) -> list[int]:
        """The columns that neither finished nor were running (after Ctrl-C: never begun)."""
        return [i for i, result in enumerate(self.results) if result is None and i not in self.running]


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
    thread, as each finishes). ``fn`` must be a module-level function (spawned workers import it by name).
    Ctrl-C returns what finished, ``interrupted`` set and the columns that were running named. A caller that
    starts threads of its own meanwhile (progress bars) enters a ``ColumnRunner`` before them instead."""
    with ColumnRunner(len(args), jobs) as runner:
        return runner.run(fn, args, on_start=on_start, on_progress=on_progress, on_done=on_done)


class WorkerDied(RuntimeError):
    """A worker process ended without handing back its column (killed from outside, e.g. for memory)."""


@dataclass(slots=True, eq=False)
class _Worker:
    process: Any  # a fork- or spawn-context Process
    conn: Connection
    index: int = -1  # the column it is running (-1: idle)


class ColumnRunner:
    """Where ``count`` columns run: this process (``jobs`` 1, or one column), else ``min(jobs, count)`` worker
    processes started on entering the runner (forked or spawned, ``start_method``) and stopped on leaving it —
    terminated when anything (Ctrl-C, a column's error) stops the columns early, so no worker survives and
    nothing waits for a column to finish. ``run`` runs the columns, once."""

    def __init__(self, count: int, jobs: int) -> None:
        self.parallel = jobs > 1 and count > 1
        self.jobs = min(jobs, count)
        self.count = count
        self.method = ""  # how the workers were started ("fork" or "spawn"), once they are
        self.counts: Any = [NOT_STARTED] * count  # per column, its rank-ops so far; shared once workers start
        self.workers: list[_Worker] = []
        self._complete = False  # every column handed back: the workers are told to stop, not terminated

    def __enter__(self) -> ColumnRunner:
        if self.parallel:
            try:
                self._start_workers()
            except BaseException:
                self._stop_workers()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_workers()

    def _start_workers(self) -> None:
        self.method = start_method()
        ctx = get_context(self.method)
        # One writer per slot, so no lock.
        self.counts = ctx.RawArray("q", [NOT_STARTED] * self.count)
        for _ in range(self.jobs):
            ours, theirs = ctx.Pipe()
            process = ctx.Process(
                target=_worker_main, args=(theirs, self.counts), name="simnccl-cost-worker", daemon=True
            )
            process.start()
            theirs.close()
            self.workers.append(_Worker(process, ours))

    def _stop_workers(self) -> None:
        workers, self.workers = self.workers, []
        for worker in workers:
            if self._complete:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
            else:  # Ctrl-C (or an error) while columns run: they are not waited for
                worker.process.terminate()
        for worker in workers:
            worker.process.join()
            worker.conn.close()

    def run(
        self,
        fn: Callable[..., R],
        args: Sequence[tuple[Any, ...]],
        *,
        on_start: Callable[[int], None] = lambda index: None,
        on_progress: Callable[[int, int], None] = lambda index, ops: None,
        on_done: Callable[[int, R], None] = lambda index, result: None,
    ) -> Finished[R]:
        """Every column (``len(args)``, as many as the runner was made for): see ``run_columns``."""
        assert len(args) == self.count, (len(args), self.count)
        finished: Finished[R] = Finished([None] * self.count)
        running = [False] * self.count  # a list, not a set: the poller thread reads it while this thread writes
        poller = _Poller(self.counts, running, on_progress)
        poller.start()  # after the workers started: a fork copies no thread of ours
        try:
            if not self.parallel:
                for index, column_args in enumerate(args):
                    running[index] = True
                    on_start(index)
                    result = _in_slot(self.counts, index, fn, column_args)
                    with deferred_interrupt():  # a result kept is a result reported (on_done), or neither
                        running[index] = False
                        finished.results[index] = result
                        on_done(index, result)
            else:
                self._run_pool(fn, args, finished, running, on_start, on_done)
                self._complete = True
        except KeyboardInterrupt:
            finished.interrupted = True
            # A column a worker was sent is running, whether or not its first count has been seen yet (named
            # "not finished" either way: the report left such a column out, as if it had never been asked for).
            sent = {w.index for w in self.workers if w.index >= 0} if self.parallel else set()
            finished.running = sorted({index for index, now in enumerate(running) if now} | sent)
        finally:
            poller.stop()
            self._stop_workers()  # done with them: stopped (or terminated, when stopped early) at once
        return finished

    def _run_pool(
        self,
        fn: Callable[..., R],
        args: Sequence[tuple[Any, ...]],
        finished: Finished[R],
        running: list[bool],
        on_start: Callable[[int], None],
        on_done: Callable[[int, R], None],
    ) -> None:
        """The columns on the workers, each sent one column at a time over its pipe; a worker that dies is an
        error naming its column, never a wait for a result that cannot come."""
        counts, workers = self.counts, self.workers
        queue = list(range(len(args)))
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
                with deferred_interrupt():  # a result kept is a result reported (on_done), or neither
                    worker.index = -1
                    if not running[index]:
                        on_start(index)
                    running[index] = False
                    finished.results[index] = result
                    on_done(index, result)
                _send_next(worker, queue, fn, args)


def _worker_main(conn: Connection, counts: Any) -> None:
    """A worker: run the columns it is sent, one at a time, until told to stop (None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers
    # What the worker holds before its first column (a fork: the parent's whole heap) is never walked by the
    # collector again: no time spent on it, and no page of a fork's heap copied for the collector's writes.
    gc.freeze()
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

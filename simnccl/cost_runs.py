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
and ignore SIGINT: Ctrl-C is the parent's to handle, which stops them (``simnccl.cli_guard`` reaps them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
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
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(args)),
        mp_context=get_context("spawn"),
        initializer=_worker_init,
        initargs=(counts,),
    )
    futures: dict[Future[R], int] = {}
    try:
        for index, column_args in enumerate(args):
            futures[pool.submit(_in_worker, index, fn, column_args)] = index
        waiting = set(futures)
        while waiting:
            for future, index in futures.items():  # a column has started once its worker wrote a count
                if future in waiting and not running[index] and counts[index] != NOT_STARTED:
                    running[index] = True
                    on_start(index)
            done, waiting = wait(waiting, timeout=REPORT_EVERY_S, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.__getitem__):
                index = futures[future]
                if not running[index]:
                    on_start(index)
                running[index] = False
                finished.results[index] = result = future.result()
                on_done(index, result)
    finally:
        if all(f.done() for f in futures):
            pool.shutdown(wait=True)
        else:  # Ctrl-C (or an error) while columns run
            _stop_workers(pool)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """After Ctrl-C the workers are still simulating (they ignore SIGINT): terminate them here and let the
    executor see its pool broken, so that nothing waits for a column to finish. Two exit-time waits must not
    remain: the interpreter's exit hook joins the pool's manager thread (which waits for its workers), and
    multiprocessing joins the call queue's feeder thread, which may be blocked writing a queued column's
    Programs into the pipe of a worker that is gone (``cancel_join_thread``). Futures are not cancelled
    first: the manager thread then fails them as broken instead of tripping over cancelled ones.
    ``_processes``/``_call_queue`` are the executor's own worker map and queue (CPython 3.10-3.13)."""
    processes = list(getattr(pool, "_processes", {}).values())
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
    call_queue = getattr(pool, "_call_queue", None)
    if call_queue is not None:
        call_queue.cancel_join_thread()
    pool.shutdown(wait=True, cancel_futures=True)


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

"""``simnccl.cost_runs``: columns on worker processes of our own — results in column order, a column's error
raised in the caller, a worker that dies named, never waited for."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from simnccl import cost_runs
from simnccl.cost_runs import ColumnRunner, WorkerDied, run_columns, start_method


@pytest.fixture(params=["fork", "spawn"])
def method(request, monkeypatch) -> str:
    """Each worker test under both ways of starting workers (``start_method`` picks one per run)."""
    monkeypatch.setattr(cost_runs, "start_method", lambda: request.param)
    return request.param


def test_workers_are_forked_only_while_no_other_thread_runs() -> None:
    assert start_method(threads=1) == "fork"
    assert start_method(threads=2) == "spawn"
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with ColumnRunner(2, 2) as runner:
            assert runner.method == "spawn"
    finally:
        stop.set()
        other.join()


def test_a_thread_started_below_threading_also_rules_out_fork() -> None:
    """pytest-xdist's execnet starts its threads with ``_thread``, which ``threading.active_count`` never
    sees: a fork there copies whatever lock such a thread holds (Python 3.12+ warns of it). In a fresh process,
    so that no thread of this one counts."""
    code = (
        "import _thread, sys\n"
        "from simnccl.cost_runs import start_method\n"
        "before = start_method()\n"
        "lock = _thread.allocate_lock(); lock.acquire()\n"
        "_thread.start_new_thread(lock.acquire, ())\n"
        "import time; time.sleep(0.05)\n"
        "print(before, start_method())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fork", "spawn"]


def test_parallel_columns_hand_back_results_in_column_order(method: str) -> None:
    done: list[int] = []
    finished = run_columns(int, [("7",), ("8",), ("9",)], 2, on_done=lambda index, result: done.append(index))
    assert finished.results == [7, 8, 9]
    assert sorted(done) == [0, 1, 2] and not finished.interrupted


def test_a_columns_error_in_a_worker_is_raised_in_the_caller(method: str) -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        run_columns(int, [("1",), ("x",)], 2)


def test_a_worker_that_dies_is_an_error_naming_its_column_not_a_wait(method: str) -> None:
    with pytest.raises(WorkerDied, match=r"column [01] ended \(exit code 3\) without a result"):
        run_columns(os._exit, [(3,), (3,)], 2)


def test_ctrl_c_terminates_the_workers_in_the_middle_of_a_column(method: str) -> None:
    """Ctrl-C (here: a KeyboardInterrupt raised by a timer while the caller waits) when workers are in the
    middle of their columns (a ten-minute sleep): the call returns, interrupted, and no worker is left."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        finished = run_columns(time.sleep, [(600,), (600,), (600,)], 2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert finished.interrupted and finished.results == [None, None, None]
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_ctrl_c_while_a_result_is_reported_lets_the_report_finish(jobs: int, method: str) -> None:
    """A column handed back is both kept (``finished.results``) and reported (``on_done``: the journal line and the
    streamed summary line), or neither. A Ctrl-C landing inside ``on_done`` cut the report short: ``simnccl cost``
    then kept a column it never printed a line for, and its journal said "finished" for a column missing from
    both the table and the "not finished" list (about 1 run in 4 with the signal sent as the first line arrived)."""
    reported: list[int] = []

    def on_done(index: int, result: int) -> None:
        if not reported:
            os.kill(os.getpid(), signal.SIGINT)  # lands while the first result is being reported
        reported.append(index)

    finished = run_columns(int, [("7",), ("8",), ("9",)], jobs, on_done=on_done)
    assert finished.interrupted
    kept = [i for i, result in enumerate(finished.results) if result is not None]
    assert kept == reported and len(kept) >= 1

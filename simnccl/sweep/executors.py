"""Where cells run: this process, a local process pool, or a Dask cluster. No task distribution of our own.

Every executor calls the same ``run_cell`` with the same ``Cell`` and yields rows as cells finish, so a cell's
result cannot depend on where it ran (the tests compare them). The pool uses the ``spawn`` start method: a
worker starts from a fresh interpreter, never a fork of a process with a progress thread running. Dask is
imported here and only when asked for (``--scheduler``, ``--dask-local``): importing simnccl stays light, and
a missing ``distributed`` is a missing prerequisite (exit 2, naming the extra to install).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
import socket
import threading
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from simnccl import __version__
from simnccl.sweep.cell import Cell, blank_row, run_cell
from simnccl.sweep.store import Row

DASK_CONNECT_TIMEOUT_S = 30.0
DASK_CONNECT_GRACE_S = 5.0  # beyond Dask's own timeout, before a connection that never answers is given up
DASK_WORKER_WAIT_S = 60.0
# tcp://HOST:PORT, what ``dask scheduler`` prints (the other protocols need setup a flag cannot carry: TLS its
# certificates, UCX its library, inproc a scheduler in this very process)
_ADDRESS = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})\Z")


class ExecutorError(RuntimeError):
    """The executor cannot start (exit 2): a missing extra, a scheduler that does not answer, no workers."""


@dataclass(frozen=True, slots=True)
class Executor:
    """``kind`` is ``local`` (``jobs`` = 1: this process), ``pool`` (``jobs`` processes) or ``dask``
    (``scheduler`` address, or ``dask_local`` workers in a LocalCluster started here)."""

    kind: str
    jobs: int = 1
    scheduler: str | None = None
    dask_local: int = 0

    def describe(self) -> str:
        if self.kind == "local":
            return "this process"
        if self.kind == "pool":
            return f"{self.jobs} local processes"
        if self.scheduler:
            return f"the Dask scheduler at {self.scheduler}"
        return f"a local Dask cluster of {self.dask_local} worker process{'es' if self.dask_local > 1 else ''}"


def check_address(address: str) -> str:
    match = _ADDRESS.match(address)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise ValueError(f"expected a scheduler address tcp://HOST:PORT (PORT 1 to 65535), got {address!r}")
    return address


def _lost(cell: Cell, what: str, err: BaseException) -> Row:
    """The row of a cell whose worker died or failed outside ``run_cell``: a crash, reported as that cell's."""
    row = blank_row(cell)
    row.update(
        status="crash",
        check=f"{what}: {type(err).__name__}: {err}",
        error="".join(traceback.format_exception(err)),
        worker="",
        wall_s=0.0,
    )
    return row


def run_cells(cells: Sequence[Cell], executor: Executor, timeout_s: float) -> Iterator[Row]:
    """Rows as cells finish (in any order); every cell yields exactly one row."""
    if executor.kind == "local":
        for cell in cells:
            yield run_cell(cell, timeout_s)
    elif executor.kind == "pool":
        yield from _run_pool(cells, executor.jobs, timeout_s)
    else:
        yield from _run_dask(cells, executor, timeout_s)


def _run_pool(cells: Sequence[Cell], jobs: int, timeout_s: float) -> Iterator[Row]:
    """The cells on ``jobs`` worker processes. A worker that dies (a cell's policy killing its process, a crash in
    C) breaks the whole pool: every cell not finished then fails with ``BrokenProcessPool``, the culprit's and the
    innocent ones' alike (found by a tester: 8 of 9 cells "crashed", none named as the cause). Those cells run
    again, each in a process of its own (``_run_alone``): the culprit's row says its process died, the others
    give their results."""
    pool = ProcessPoolExecutor(max_workers=max(1, min(jobs, len(cells))), mp_context=get_context("spawn"))
    broken: list[Cell] = []
    try:
        futures: dict[Future[Row], Cell] = {pool.submit(run_cell, cell, timeout_s): cell for cell in cells}
        try:
            for future in as_completed(futures):
                try:
                    yield future.result()
                except BrokenProcessPool:
                    broken.append(futures[future])
                except Exception as err:  # the cell did not pickle
                    yield _lost(futures[future], "worker process failed", err)
        finally:
            for future in futures:
                future.cancel()
    except BaseException:  # Ctrl-C, or the reader of the rows went away (GeneratorExit): stopped early
        _stop_workers(pool)
        raise
    pool.shutdown(wait=True)
    if broken:
        yield from _run_alone(sorted(broken, key=lambda cell: cell.index), jobs, timeout_s)


def _run_alone(cells: Sequence[Cell], jobs: int, timeout_s: float) -> Iterator[Row]:
    """Each cell in a worker process of its own, ``jobs`` at a time: a process that dies is that cell's."""
    pools: dict[Future[Row], tuple[Cell, ProcessPoolExecutor]] = {}
    todo = list(cells)
    try:
        while todo or pools:
            while todo and len(pools) < max(1, jobs):
                cell = todo.pop(0)
                pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
                pools[pool.submit(run_cell, cell, timeout_s)] = (cell, pool)
            done = next(as_completed(pools))
            cell, pool = pools.pop(done)
            try:
                yield done.result()
            except Exception as err:
                yield _lost(cell, "its worker process died running this cell alone (the cell's doing)", err)
            pool.shutdown(wait=True)
    except BaseException:
        for _, pool in pools.values():
            _stop_workers(pool)
        raise


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End a pool whose sweep stopped early (Ctrl-C, or the reader of its rows went away) without waiting for its
    running cells. Why: ``kill -INT`` to the sweep's own process (not its whole process group, as a terminal's
    Ctrl-C is) waited for every running cell to end, up to its wall-clock limit (found: 57 s, up to ~10 min by
    default), since leaving the pool's block waits for its workers."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # CPython's own record of them
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        with contextlib.suppress(OSError, ValueError):
            worker.terminate()
    for worker in workers:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()


def _simnccl_version() -> str:
    from simnccl import __version__ as version

    return version


DASK_MISSING = "Dask is not installed; install the sweep extra: pip install 'simnccl[sweep]'"


def dask_installed() -> bool:
    """Whether ``distributed`` can be imported (asked without importing it): a sweep checks before it lists or
    runs anything, so ``--dry-run`` does not say yes to a sweep that cannot run."""
    return importlib.util.find_spec("distributed") is not None


def _dask() -> Any:
    try:
        import distributed
    except ImportError:
        raise ExecutorError(DASK_MISSING) from None
    return distributed


def _connect(distributed: Any, address: str, where: str) -> Any:
    """A Client of the scheduler at ``address``, or ExecutorError within ``DASK_CONNECT_TIMEOUT_S`` (and a few
    seconds more) whatever answers there.

    Why a deadline of its own: Dask's connect timeout does not cover its handshake, so an address that accepts
    the connection and never answers (a firewall, another service) hung the sweep with no end; one that answers
    with something else raised ValueError or struct.error from Dask's frame reader (exit 70). Neither is a Dask
    scheduler: bad input."""
    match = _ADDRESS.match(address)
    if match is not None:  # nothing listening answers at once: Dask retried it for its whole timeout (30 s)
        host = match.group(1).strip("[]")
        try:
            socket.create_connection((host, int(match.group(2))), timeout=DASK_CONNECT_TIMEOUT_S).close()
        except OSError as err:
            raise ExecutorError(f"{where}: cannot reach the scheduler: {err.strerror or err}") from None
    box: dict[str, Any] = {}

    def attempt() -> None:
        try:
            box["client"] = distributed.Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
        except Exception as err:  # whatever the other end made Dask raise
            box["error"] = err

    thread = threading.Thread(target=attempt, name="simnccl-dask-connect", daemon=True)
    thread.start()
    thread.join(DASK_CONNECT_TIMEOUT_S + DASK_CONNECT_GRACE_S)
    if thread.is_alive():  # left behind, a daemon: the command ends without it
        raise ExecutorError(
            f"{where}: the address took the connection but no Dask scheduler answered within "
            f"{DASK_CONNECT_TIMEOUT_S + DASK_CONNECT_GRACE_S:g} s"
        )
    if "error" in box:
        err = box["error"]
        if isinstance(err, OSError | TimeoutError):
            raise ExecutorError(f"{where}: cannot reach the scheduler: {err}") from None
        raise ExecutorError(
            f"{where}: what answered there is not a Dask scheduler: {type(err).__name__}: {err}"
        ) from None
    return box["client"]


def _run_dask(cells: Sequence[Cell], executor: Executor, timeout_s: float) -> Iterator[Row]:
    distributed = _dask()
    cluster = None
    where = f"--scheduler {executor.scheduler}" if executor.scheduler else f"--dask-local {executor.dask_local}"
    try:
        if executor.scheduler:
            client = _connect(distributed, executor.scheduler, where)
        else:
            import dask

            # Dask's statistical profiler samples every worker thread's stack every 10 ms: on the engine's deep
            # simpy stacks that doubled the time per cell. Off here (the nannies hand this config to the workers);
            # a cluster of one's own: DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False on each worker.
            with dask.config.set({"distributed.worker.profile.enabled": False}):
                cluster = distributed.LocalCluster(
                    n_workers=executor.dask_local,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=":0",  # its HTTP server starts anyway: on a free port, never a taken 8787
                    silence_logs=logging.ERROR,
                )
            client = distributed.Client(cluster)
        with client:
            try:
                client.wait_for_workers(1, timeout=DASK_WORKER_WAIT_S)
            except (TimeoutError, OSError) as err:
                raise ExecutorError(f"{where}: no worker joined the scheduler within {DASK_WORKER_WAIT_S:g} s") from err
            versions = client.run(_simnccl_version)
            wrong = {addr: v for addr, v in sorted(versions.items()) if v != __version__}
            if wrong:
                shown = ", ".join(f"{a} has {v}" for a, v in wrong.items())
                raise ExecutorError(f"{where}: the workers must run simnccl {__version__} like this machine: {shown}")
            futures = {
                client.submit(
                    run_cell, cell, timeout_s, key=f"simnccl-cell-{cell.index}-{cell.cell_id}", pure=False
                ): cell
                for cell in cells
            }
            try:
                for future in distributed.as_completed(futures):
                    try:
                        yield future.result()
                    except Exception as err:  # a worker lost (KilledWorker), a cell that did not travel
                        yield _lost(futures[future], "Dask task failed", err)
            finally:
                client.cancel(list(futures))
    finally:
        if cluster is not None:
            cluster.close()

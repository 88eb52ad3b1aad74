"""A wall-clock limit on one call, whichever thread asks for it.

Why not SIGALRM (``simnccl.testing.replay._alarm``): a signal reaches only a process's main thread, and Dask
runs tasks in worker threads. Why not the engine's own guard alone: it is checked every few thousand ops, and a
user's policy stuck in a loop never gets back to it.

So the call runs in a thread of its own, and the caller waits for it. Past the limit the caller raises
``CellTimeout`` inside that thread (CPython's ``PyThreadState_SetAsyncExc``, delivered at the thread's next
bytecode boundary: the engine is pure Python), and again every ``REPEAT_S`` while the thread lives, because
one delivery can be absorbed: simpy catches whatever a process raises and runs the other ranks on. The
exception is a BaseException, so neither the engine's nor a policy's ``except Exception`` swallows it. The
thread runs nothing but the call, so an exception delivered late dies with it; a call that still outlives
``GIVE_UP_S`` of deliveries is abandoned (a daemon thread) and reported as stopped all the same. Python code
takes a delivery within milliseconds; a thread still alive after a second of them is blocked in C (a policy's
``time.sleep(100)``) and will not take one until it returns, so waiting longer only overran the limit (it was
10 s: a 3 s limit stopped such a cell after 13 s).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
REPEAT_S = 0.05
GIVE_UP_S = 1.0


class CellTimeout(BaseException):
    """The call ran past its wall-clock limit."""


def _raise_in(thread: threading.Thread) -> None:
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(CellTimeout))


def call_with_deadline(fn: Callable[[], T], seconds: float) -> T:
    """``fn()``'s value or exception, or CellTimeout once ``seconds`` of wall time have passed."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # handed to the caller, CellTimeout included
            outcome["error"] = err

    thread = threading.Thread(target=body, name="simnccl-sweep-cell", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        waited = 0.0
        while thread.is_alive() and waited < GIVE_UP_S:
            _raise_in(thread)
            thread.join(REPEAT_S)
            waited += REPEAT_S
        raise CellTimeout(f"still running after {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]

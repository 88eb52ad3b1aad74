"""``os._exit`` raising, not ending the process, while user code runs inside simnccl's own process.

Why: a user's policy hook (or a script captured inline) that calls ``os._exit(0)`` ended ``simnccl run`` — or the
user's whole pytest session — with exit 0 and no report: a run that checked nothing, read as a pass by every
shell script and CI job. ``os._exit`` skips every ``finally`` and exit handler, so nothing downstream can catch it;
only the function itself can be swapped. Inside ``os_exit_raises(factory)`` it raises ``factory(status)`` instead
(a BaseException, so user code's ``except Exception`` cannot swallow it), and the caller reports it as the user
code's failure.

Only the thread that entered the region and only this process: a process the user code forks still exits for
real (its pid differs), and so does any other thread, e.g. simnccl's own command guard ending the command with
``os._exit`` once its exit code is known. Regions nest and may be entered by several threads at once (a Dask
worker's threads run simulations side by side): the stand-in is installed while any region is open and delegates
to what was installed before it everywhere else.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

_REAL_EXIT = os._exit  # the function itself, whatever is installed later
_lock = threading.Lock()
_inside = threading.local()  # .factory, .pid: this thread's innermost open region
_open = 0  # regions open in all threads
_before: list[Callable[[int], object]] = []  # what os._exit was when the first region opened


def _stand_in(status: int) -> None:
    factory = getattr(_inside, "factory", None)
    if factory is not None and os.getpid() == _inside.pid:
        raise factory(status)
    (_before[0] if _before else _REAL_EXIT)(status)  # the real one does not return


@contextlib.contextmanager
def os_exit_raises(factory: Callable[[int], BaseException]) -> Iterator[None]:
    """While the block runs, this thread's ``os._exit(status)`` raises ``factory(status)``."""
    global _open
    outer = getattr(_inside, "factory", None), getattr(_inside, "pid", None)
    with _lock:
        if _open == 0 and os._exit is not _stand_in:
            _before[:] = [os._exit]
            os._exit = _stand_in  # type: ignore[assignment]
        _open += 1
    _inside.factory, _inside.pid = factory, os.getpid()
    try:
        yield
    finally:
        _inside.factory, _inside.pid = outer
        with _lock:
            _open -= 1
            if _open == 0 and os._exit is _stand_in and _before:
                os._exit = _before.pop()  # type: ignore[assignment]

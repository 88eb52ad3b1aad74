"""What a Python process does after its script's last line, done at the end of a captured rank.

Why: a rank's result was sent as soon as its code returned, and a forked rank then left with ``os._exit``. A real
process first joins the non-daemon threads its code started, then runs the exit handlers its code registered
(``atexit``), last registered first; a collective there is part of the run. One issued only by rank 0 from a
thread or an exit handler hangs the real run, and the capture had dropped it: a pass.

The handlers collected are those the captured code registers while it runs (``atexit.register`` called from
a module outside torch and simnccl); torch's own, and the process's before the rank, stay with Python.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from simnccl.capture.fake_devices import reached_the_driver
from simnccl.capture.result import CaptureError

_OWN_PREFIXES = ("torch", "simnccl")  # modules whose exit handlers are the process's, not the captured code's
Handler = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
# The exit handlers the script's imports registered in the fork server's preload (``preloaded_handlers``): each rank
# it forks starts with them, as a process that imported the modules itself registers them (``--no-preload``).
_PRELOADED: list[Handler] = []


def preloaded_handlers(handlers: list[Handler]) -> None:
    """Keep ``handlers`` (registered while the fork server imported the script's modules) for every rank forked
    after it."""
    _PRELOADED[:] = handlers


class ProcessEnd:
    """The rank's exit handlers and the threads alive before it, for ``finish``."""

    def __init__(self) -> None:
        self.handlers: list[Handler] = list(_PRELOADED)
        self.threads_before = set(threading.enumerate())
        self.thread_errors: list[BaseException] = []  # what the rank's threads raised (printed as Python does)

    def finish(self, rank: int) -> None:
        """Join the non-daemon threads the rank started, then run its exit handlers, last first; an exception in
        a handler is printed (``SystemExit`` silently) and the next one runs, as Python does."""
        for thread in threading.enumerate():
            if thread not in self.threads_before and not thread.daemon and thread is not threading.current_thread():
                thread.join()
        self.check_threads(rank)
        while self.handlers:
            function, args, kwargs = self.handlers.pop()
            try:
                function(*args, **kwargs)
            except SystemExit:  # Python runs the next handler, and prints nothing for it
                continue
            except BaseException:
                if isinstance(sys.exc_info()[1], KeyboardInterrupt):
                    raise
                print("Exception ignored in atexit callback:", file=sys.stderr)
                traceback.print_exc()

    def check_threads(self, rank: int) -> None:
        """A thread of the rank that reached a CUDA call the GPU-less CUDA does not serve fails the capture: the
        stand-ins serve the rank's main thread (torch's dispatch modes are per thread), and a thread that died
        there took its collectives with it (a real run would have made them: a pass where it hangs)."""
        for err in self.thread_errors:
            if reached_the_driver(err):
                raise CaptureError(
                    f"rank {rank}: a thread the captured code started reached CUDA ({type(err).__name__}); "
                    "simnccl's GPU-less CUDA stands in on the rank's main thread only, so what that thread does "
                    "(its collectives too) cannot be captured"
                )


@contextlib.contextmanager
def collected() -> Iterator[ProcessEnd]:
    """While the rank runs, the captured code's ``atexit.register`` (and ``unregister``) go to a ``ProcessEnd``."""
    end = ProcessEnd()
    register, unregister = atexit.register, atexit.unregister

    def rank_register(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".", 1)[0] in _OWN_PREFIXES:
            return register(function, *args, **kwargs)
        end.handlers.append((function, args, kwargs))
        return function

    def rank_unregister(function: Callable[..., Any]) -> None:
        end.handlers[:] = [h for h in end.handlers if h[0] != function]
        unregister(function)

    def rank_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            end.thread_errors.append(args.exc_value)
        excepthook(args)

    excepthook = threading.excepthook
    atexit.register, atexit.unregister = rank_register, rank_unregister  # type: ignore[assignment]
    threading.excepthook = rank_excepthook
    try:
        yield end
    finally:
        atexit.register, atexit.unregister = register, unregister  # type: ignore[assignment]
        threading.excepthook = excepthook

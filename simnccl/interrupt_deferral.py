"""Ctrl-C held back until a line of output is whole: ``deferred_interrupt``.

Why: a ``KeyboardInterrupt`` is raised between any two bytecodes, and a write is several. rich's console
writes its buffer, flushes it, and only then empties it; a Ctrl-C that lands between the flush and the
emptying leaves the written text in the buffer, and the next print (the interrupted report) writes it again.
``simnccl cost --quiet`` printed a finished column's line twice after Ctrl-C that way (1 run in 2 when the
signal came as the reader woke on the line), so a script counting result lines counted one column twice. A
line of output and the bookkeeping that goes with it (the summary it joins) must happen whole or not at all.

Only the main thread receives Python's signal handlers and only it may swap them, so elsewhere (rich's
refresh thread) nothing is deferred. A second Ctrl-C while one is held is not held: a write blocked on a
reader that never reads must not make Ctrl-C useless.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Run the block with SIGINT held: one that arrives meanwhile is handed to the previous handler (Python's
    default: ``KeyboardInterrupt``) as the block ends; a second one is handed on at once. Nested uses hold
    once; outside the main thread, or where SIGINT has no Python handler, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or isinstance(previous, _Holder):
        yield
        return
    holder = _Holder(previous)
    signal.signal(signal.SIGINT, holder)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if holder.held is not None:
        previous(*holder.held)


class _Holder:
    """The handler while a block runs: keeps the first signal, passes on the next."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.held: tuple[int, FrameType | None] | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.held is None:
            self.held = (signum, frame)
            return
        self.previous(signum, frame)

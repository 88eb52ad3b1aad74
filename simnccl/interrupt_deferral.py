"""Ctrl-C held back until a line of output is whole (``deferred_interrupt``), and SIGTERM taken as a Ctrl-C
(``terminate_as_interrupt``), so both reach the one interrupt path that holds and reports.

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
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

_terminated = threading.Event()  # a SIGTERM was handed on as the interrupt (``terminate_as_interrupt``)


def interruption() -> str:
    """What interrupted the command, as its reports name it: ``SIGTERM`` (handed on as an interrupt) or
    ``Ctrl-C``."""
    return "SIGTERM" if _terminated.is_set() else "Ctrl-C"


def terminate_as_interrupt() -> None:
    """SIGTERM handed on as a SIGINT to this process, so it ends as Ctrl-C ends it: the report of what finished,
    the ``--json`` document, exit 130, through every path that holds SIGINT while it writes (``deferred_interrupt``).

    Why: ``timeout 600 simnccl real compare ...``, a CI job's time limit and a batch scheduler's preemption send
    SIGTERM, which ended the command at once with status 143: no summary and no document, even of the variants
    that had finished. Left as it is where SIGTERM is not at its default (a parent chose to ignore it, or the
    embedding program handles it), where SIGINT is ignored (a background job of a non-interactive shell: handed
    on, the SIGTERM would be dropped and the command could no longer be stopped; a tester's ``cmd & kill $pid``
    ran on), off the main thread, and in a process torchrun started (``TORCHELASTIC_RUN_ID``: its agent stops
    the workers with SIGTERM when one fails and owns the report). A SIGTERM that comes while SIGINT is ignored
    for a moment (the reaping after an interrupt) is dropped: the command is already ending."""
    if threading.current_thread() is not threading.main_thread() or "TORCHELASTIC_RUN_ID" in os.environ:
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return

    command = os.getpid()

    def handed_on(_signum: int, _frame: FrameType | None) -> None:
        if os.getpid() != command:  # a forked child (a cost or sweep worker): SIGTERM ends it, as its parent expects
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        _terminated.set()
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGTERM, handed_on)


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

"""Ctrl-C waits for a line of output to be whole (``simnccl.interrupt_deferral``), so no line is printed twice."""

from __future__ import annotations

import argparse
import io
import os
import signal
import threading

import pytest

from simnccl.cli_output import Output, PipeAwareConsole
from simnccl.interrupt_deferral import deferred_interrupt
from simnccl.result import SummaryLine


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)


class _InterruptedOnFlush(io.StringIO):
    """A stream whose first flush (rich's, right after it wrote its buffer) brings a Ctrl-C."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def flush(self) -> None:
        super().flush()
        if not self.fired:
            self.fired = True
            _interrupt_self()


def test_a_ctrl_c_inside_the_block_is_raised_after_it() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupt():
        _interrupt_self()
        steps.append("after the signal")
    assert steps == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_is_not_held() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupt():
        _interrupt_self()
        steps.append("one held")
        _interrupt_self()
        steps.append("never")
    assert steps == ["one held"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_blocks_hold_once_and_raise_at_the_outer_end() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupt():
        with deferred_interrupt():
            _interrupt_self()
            steps.append("inner")
        steps.append("outer")
    assert steps == ["inner", "outer"]


def test_a_block_without_a_signal_changes_nothing() -> None:
    with deferred_interrupt():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_the_block_runs_as_it_is() -> None:
    seen = []

    def worker() -> None:
        with deferred_interrupt():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_line_interrupted_after_its_flush_is_not_printed_again() -> None:
    """rich flushes, then empties its buffer: a Ctrl-C between the two printed the line again with the next."""
    stream = _InterruptedOnFlush()
    console = PipeAwareConsole(file=stream, markup=False, highlight=False, soft_wrap=True, width=200)
    with pytest.raises(KeyboardInterrupt):
        console.print("torch-default  pass")
    console.print("legacy  interrupted  FAIL  not finished (Ctrl-C)")
    assert stream.getvalue().splitlines() == [
        "torch-default  pass",
        "legacy  interrupted  FAIL  not finished (Ctrl-C)",
    ]


def test_a_streamed_summary_line_is_kept_and_printed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _InterruptedOnFlush()
    monkeypatch.setattr("sys.stdout", stream)
    out = Output("cost", argparse.Namespace(quiet=True, json=None))
    line = SummaryLine("megatron", "torch-default", "pass", True, "ok")
    with pytest.raises(KeyboardInterrupt):
        out.add(line)
    assert out.summary == [line]
    assert stream.getvalue().splitlines() == [line.text()]

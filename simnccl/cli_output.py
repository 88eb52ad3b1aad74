"""Where a command's output goes: text streamed to stdout, a progress bar on stderr, one JSON document, --quiet.

Why one place: every command (run, explain, cost, capture, real ...) must behave alike for a person at a
terminal and for CI reading a pipe. Text is printed as each variant (cost column, diff case) finishes, not
all at the end; when stdout is not a terminal nothing is hard-wrapped (a long message stays one line, so
grep finds it); a progress bar shows on stderr only when stderr is a terminal, ``--quiet`` is off and the
JSON document does not take stdout; user text is never read as rich markup. ``--json`` without FILE replaces
the text on stdout with the document; ``--json FILE`` writes it there and keeps the text. ``--quiet`` prints
the one-line-per-variant summary (``simnccl.result.SummaryLine``) and nothing else; normal output ends with
the same lines.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from rich.console import Console, RenderableType
from rich.segment import Segment
from rich.text import Text

from simnccl.cli_options import STDOUT, ClosedStdout, OutputError
from simnccl.interrupt_deferral import deferred_interrupt, interruption
from simnccl.result import SummaryLine, document
from simnccl.visible_text import one_line, visible

PIPE_WIDTH = 4096  # columns when stdout is not a terminal: wide enough that nothing a command prints wraps


class PipeAwareConsole(Console):
    """rich's console, except that a reader that went away raises ``BrokenPipeError`` for the command's guard
    (``simnccl.cli_guard``: exit 141 with what finished) instead of rich's ``SystemExit(1)``, which a script
    reads as "an expectation failed" although the scenarios after that point never ran."""

    def _check_buffer(self) -> None:
        """rich's write of the buffer, with Ctrl-C held until the buffer is written and emptied
        (``simnccl.interrupt_deferral``): else a line written but not yet emptied is written again."""
        with deferred_interrupt():
            super()._check_buffer()

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        """What is printed, with the terminal controls in its text shown as escapes (``visible``): user text in a
        table cell or a line is printed as it is, never acted on. The console's own styling and control segments
        are left as they are."""
        return super()._render_buffer(
            segment if segment.control or segment.text.isprintable() else Segment(visible(segment.text), segment.style)
            for segment in buffer
        )


# Where the document goes while ``document_owns_stdout`` holds stdout: its own file (a descriptor) or, for a
# stdout without one, the stream object itself; and the stream a caller may still hold as "stdout".
_DOCUMENT: list[tuple[int | TextIO, TextIO] | None] = [None]


@contextlib.contextmanager
def document_owns_stdout(active: bool) -> Iterator[None]:
    """While a command whose JSON (or CSV) document goes to stdout runs, whatever else writes to stdout writes to
    stderr: a user's policy that prints, a worker or rank process it starts (they inherit the file), C code. The
    document alone reaches stdout (``write_all_to_stdout``).

    Why: a policy hook's ``print`` put 72 lines before ``simnccl run --json -``'s document, and the command
    exited 0 with stdout no JSON reader could parse. A stdout without a file of its own (a test's stand-in) is
    swapped for stderr as a Python object only."""
    if not active:
        yield
        return
    real = sys.stdout
    if real is None or isinstance(real, ClosedStdout):  # started with stdout closed (``>&-``)
        raise OutputError("stdout is closed, so the document has nowhere to go; give --json (or --csv) a FILE")
    try:
        real.flush()
        fd, err_fd = real.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        sys.stdout = sys.stderr
        _DOCUMENT[0] = (real, real)
        try:
            yield
        finally:
            _DOCUMENT[0] = None
            sys.stdout = real
        return
    saved = os.dup(fd)
    os.dup2(err_fd, fd)
    _DOCUMENT[0] = (saved, real)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            real.flush()  # what the run printed, to stderr, before stdout is stdout again
        _DOCUMENT[0] = None
        os.dup2(saved, fd)
        os.close(saved)


def document_stream() -> TextIO:
    """The stream a command writes its document to: stdout, also while ``document_owns_stdout`` points the
    process's stdout elsewhere (write the document with ``write_all_to_stdout(text, document_stream())``)."""
    held = _DOCUMENT[0]
    return sys.stdout if held is None else held[1]


def write_all_to_stdout(text: str, stream: TextIO | None = None) -> None:
    """``text`` on stdout (or ``stream``), every byte or an error. Under ``PYTHONUNBUFFERED=1`` (common in CI
    containers) stdout's binary layer is the raw file, and its text layer drops what a partial ``write`` left
    over without a word: a JSON document larger than a pipe's buffer, cut short by a reader that went away (or a
    signal mid-write), ended the command with exit 0 and half a document. Written here in a loop over the binary
    layer instead, the rest is written or raises (``BrokenPipeError``: the guard's exit 141). While
    ``document_owns_stdout`` holds stdout's file, the document is written to it there."""
    out = sys.stdout if stream is None else stream
    held = _DOCUMENT[0]
    if held is not None and (stream is None or stream is held[1]):
        target, out = held
        if isinstance(target, int):
            out.flush()
            data = memoryview(text.encode(out.encoding or "utf-8"))
            while data:
                data = data[os.write(target, data) :]
            return
    out.flush()
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a text-only stream (a test's stand-in): it writes all or raises
        out.write(text)
        out.flush()
        return
    data = memoryview(text.encode(out.encoding or "utf-8"))
    while data:
        written = buffer.write(data)
        if written is None:  # a non-blocking stdout that is full: wait for the reader
            time.sleep(0.01)
            continue
        data = data[written:]
    buffer.flush()


def console_for(stream: TextIO) -> Console:
    """A console that prints user text literally; on a pipe, wide and soft-wrapped (no hard line breaks)."""
    probe = Console(file=stream)
    if probe.is_terminal:
        return PipeAwareConsole(file=stream, markup=False, highlight=False)
    return PipeAwareConsole(file=stream, markup=False, highlight=False, soft_wrap=True, width=PIPE_WIDTH)


class _Live:
    """A rich progress display on stderr, shown only when ``output.show_progress``; hidden while text is printed."""

    def __init__(self, output: Output, shown: bool, count_column: str) -> None:
        self.output = output
        self._progress: Any = None
        if shown and output.show_progress:
            from rich import progress

            self._progress = progress.Progress(
                progress.TextColumn("{task.description}", markup=False),
                progress.BarColumn(),
                getattr(progress, count_column)(),
                progress.TimeElapsedColumn(),
                console=output.err,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )

    @property
    def live(self) -> bool:
        return self._progress is not None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hide the bar while text goes to the same terminal, so the two never overwrite each other."""
        if self._progress is None or not self.output.out.is_terminal:
            yield
            return
        self._progress.stop()
        try:
            yield
        finally:
            self._progress.start()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


L = TypeVar("L", bound=_Live)


class _Bar(_Live):
    """The progress bar of one long step (variants, columns, cases); a no-op when not shown."""

    def __init__(self, output: Output, total: int, what: str) -> None:
        super().__init__(output, total > 0, "MofNCompleteColumn")
        if self._progress is not None:
            self._task = self._progress.add_task(what, total=total)
            self._progress.start()

    def advance(self, label: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=label or None)


class _Rows(_Live):
    """One bar per item (``simnccl cost``: per column, filled by the rank-ops that column has simulated); a
    no-op when not shown. ``update`` may be called from any thread (rich's Progress takes its own lock)."""

    def __init__(self, output: Output, names: Sequence[str], total: int) -> None:
        super().__init__(output, bool(names), "TaskProgressColumn")
        self.total = max(total, 1)
        self._tasks: list[Any] = []
        if self._progress is not None:
            width = max(len(n) for n in names)
            self._tasks = [self._progress.add_task(n.ljust(width), total=self.total, start=False) for n in names]
            self._progress.start()

    def start(self, index: int) -> None:
        if self._progress is not None:
            self._progress.start_task(self._tasks[index])

    def update(self, index: int, completed: int) -> None:
        if self._progress is not None:
            self._progress.update(self._tasks[index], completed=min(completed, self.total))

    def done(self, index: int) -> None:
        if self._progress is not None:
            self._progress.update(self._tasks[index], completed=self.total)
            self._progress.stop_task(self._tasks[index])


class Output:
    """One command's output, configured by its ``--json``/``--quiet`` options."""

    def __init__(self, command: str, args: argparse.Namespace | None = None) -> None:
        self.command = command
        self.json_target: str | None = getattr(args, "json", None)
        self.quiet: bool = bool(getattr(args, "quiet", False))
        self.out = console_for(sys.stdout)
        self.err = console_for(sys.stderr)
        self.summary: list[SummaryLine] = []
        self._bar: _Live | None = None

    # ------------------------------------------------------------------------------------------ switches

    @property
    def text(self) -> bool:
        """Normal text on stdout: not with --quiet, not when the JSON document takes stdout."""
        return not self.quiet and self.json_target != STDOUT

    @property
    def show_progress(self) -> bool:
        """At an interactive terminal only, and never with --quiet or the JSON document on stdout (a script)."""
        return not self.quiet and self.json_target != STDOUT and self.err.is_terminal and self.err.is_interactive

    # ------------------------------------------------------------------------------------------ printing

    def print(self, *items: RenderableType | str, style: str = "") -> None:
        """Normal output (nothing under --quiet or --json to stdout); ``str`` items are printed literally."""
        if not self.text:
            return
        with self._paused():
            for item in items:
                self.out.print(Text(item, style=style) if isinstance(item, str) else item)

    def show(self, draw: Callable[[Console], None]) -> None:
        """Normal output drawn by a renderer that takes a console (``simnccl.report``)."""
        if self.text:
            with self._paused():
                draw(self.out)

    def note(self, message: str, style: str = "", *, always: bool = False) -> None:
        """A line on stderr (files written; ``always``: a run's identity, such as its fault schedule)."""
        if self.quiet and not always:
            return
        with self._paused():
            self.err.print(Text(message, style=style))

    def error(self, message: str, prefix: str = "error: ") -> None:
        """One line (``one_line``: a key or a file name with a newline in it split the error in two)."""
        with self._paused():
            self.err.print(Text.assemble((prefix, "red"), one_line(message)))

    def add(self, line: SummaryLine) -> None:
        """A variant finished: under --quiet its line is printed now (streamed); always kept for the end. Both or
        neither: a Ctrl-C meanwhile waits for them, so a line kept is a line printed."""
        with deferred_interrupt():
            self.summary.append(line)
            if self.quiet and self.json_target != STDOUT:
                with self._paused():
                    self.out.print(Text(line.text()), soft_wrap=True)

    def not_finished(self, label: str, names: Sequence[str]) -> dict[str, Any]:
        """Ctrl-C: each of ``names`` (variants, columns, cases) is a summary line that is not ok, so the document's
        ``ok`` is false (an interrupted run never reads as passing); returns the marks for its result record."""
        for name in names:
            self.add(SummaryLine(label, name, "interrupted", False, f"not finished ({interruption()})"))
        return {"interrupted": True, "not_finished": list(names)}

    # ------------------------------------------------------------------------------------------ progress

    def progress(self, total: int, what: str) -> contextlib.AbstractContextManager[_Bar]:
        return self._showing(_Bar(self, total, what))

    def progress_rows(self, names: Sequence[str], total: int) -> contextlib.AbstractContextManager[_Rows]:
        """A bar per name, each out of ``total`` (shown on a terminal's stderr, never with --quiet)."""
        return self._showing(_Rows(self, names, total))

    @contextlib.contextmanager
    def _showing(self, live: L) -> Iterator[L]:
        """``live`` is the display text printing pauses, until the block ends."""
        self._bar = live
        try:
            yield live
        finally:
            live.close()
            self._bar = None

    def _paused(self) -> contextlib.AbstractContextManager[None]:
        return self._bar.paused() if self._bar is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------------------------------ the end

    def finish(self, results: Sequence[Mapping[str, Any]], *, show_summary: bool = True) -> bool:
        """The summary lines (normal output; ``show_summary=False`` where each item already printed one line),
        then the JSON document; True when every line is ok."""
        if self.text and self.summary and show_summary:
            self.out.print(Text("summary:", style="bold"))
            for line in self.summary:
                self.out.print(Text(f"  {line.text()}", style="" if line.ok else "red"), soft_wrap=True)
        if self.json_target is not None:
            self.write_json(document(self.command, results, self.summary))
        return all(line.ok for line in self.summary)

    def write_json(self, doc: Mapping[str, Any]) -> None:
        text = json.dumps(doc, indent=2, default=str) + "\n"
        if self.json_target == STDOUT:
            write_all_to_stdout(text)
        elif self.json_target is not None:
            try:
                Path(self.json_target).write_text(text, encoding="utf-8")
            except OSError as err:
                raise OutputError(f"--json: cannot write {self.json_target!r}: {err.strerror or err}") from None
            self.note(f"wrote {self.json_target}")

"""The outer guard of every ``simnccl`` command: exit codes that tell the truth about how it ended.

Why: CI reads the exit code. 0 ok, 1 a check failed, 2 bad input — and before this guard every traceback
also exited 1, so a crash looked like a failed expectation. ``guarded(main)`` makes the rest explicit:

* an uncaught exception is a bug in simnccl: exit 70 (``EX_SOFTWARE`` from sysexits.h), the traceback, and
  one last line saying "please report" with the scenario file(s) the command was running;
* Ctrl-C (``KeyboardInterrupt``) ends any command with what finished so far and exit 130 (128 + SIGINT); so
  does SIGTERM, what ``timeout``, CI runners and batch schedulers send (it is handed on as a SIGINT: the same
  report, the same ``--json`` document of what finished), except in a process torchrun started (its agent
  stops its workers with SIGTERM and owns what they report);
* a full disk under its output (``> /dev/full``): exit 2 naming it, as for a ``--json`` file, not a bug report;
  a path too long for the file system (``ENAMETOOLONG``: every long name is one the user gave) the same;
* a reader that goes away (``simnccl run ... | head -1``) ends it with exit 141 (128 + SIGPIPE, what a shell
  reports for a command a closed pipe ended): the scenarios after that point never ran, so neither 0 nor 1 is
  true (rich's own answer, SystemExit(1), read as "an expectation failed"). Only a closed stdout or stderr
  counts: a broken pipe to a worker process is a bug like any other exception;
* the whole command (parsing, workload generators, engine, report) runs under a wall-clock limit
  (``max_wall_s`` in ``simnccl/data/limits.toml``): past it, exit 2 naming the limit — a scenario too large to
  simulate in time is a size problem of the input, like one past any other limit;
* in all three cases the child processes the command started are stopped and reaped, so nothing outlives it.

``simnccl real`` and ``simnccl capture`` keep their own timeouts (per run and per rank): the wall-clock limit
does not apply to them, everything else does.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from simnccl.cli_options import ClosedStdout, OutputError
from simnccl.interrupt_deferral import interruption, terminate_as_interrupt
from simnccl.limits import DATA_FILE, ENV_PREFIX, LimitError, number_text
from simnccl.limits import current as current_limits
from simnccl.policy.plans import UserPolicyError
from simnccl.runner import RunJournal, journal
from simnccl.visible_text import one_line, visible

EXIT_BAD_INPUT = 2
EXIT_SOFTWARE = 70  # sysexits.h EX_SOFTWARE: an internal software error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a command a closed pipe ended
OWN_TIMEOUTS = ("real", "capture")  # commands that bound their own time (per run, per rank)
REAP_GRACE_S = 5.0  # how long stopped children get to exit after SIGTERM before SIGKILL

MainFn = Callable[[Sequence[str] | None], int]


class CommandTimeout(BaseException):
    """The command (or ``what`` of it: ``wall_clock``) ran past ``max_wall_s``. A BaseException, so no ``except
    Exception`` (in simnccl or in a user's policy) can swallow it on the way out."""

    def __init__(self, what: str = "the command") -> None:
        super().__init__(what)
        self.what = what


def guarded(main_fn: MainFn, *, command: Sequence[str] = ()) -> MainFn:
    """``main_fn`` with the exit-code contract above enforced; ``guarded(main)(argv) -> int``.

    ``command``: the words a subcommand's own entry point stands for (``python -m simnccl.real``, which torchrun
    launches, is ``simnccl real``): its own timeouts and messages are the subcommand's."""

    @functools.wraps(main_fn)
    def run(argv: Sequence[str] | None = None) -> int:
        code = _run(argv)
        if _end_without_teardown.is_set():
            _flush_output()
            os._exit(code)
        return code

    def _run(argv: Sequence[str] | None) -> int:
        raw = [*command, *(sys.argv[1:] if argv is None else argv)]
        _open_closed_streams()
        if argv is None:  # the process's own command (not a call from a test or a user's code)
            terminate_as_interrupt()
        children_before = _children()
        with journal() as record:
            try:
                wall_s = None if raw[:1] and raw[0] in OWN_TIMEOUTS else current_limits().max_wall_s
                with wall_clock(wall_s):
                    code = main_fn(argv)
                    _flush_output()  # a full disk or a closed pipe shows here, inside the guard, not at exit
                    return code
            except LimitError as err:
                _say_error(f"error: {err}")
                return EXIT_BAD_INPUT
            except OutputError as err:
                _reap(children_before)
                _say_error(f"error: {err}")
                return EXIT_BAD_INPUT
            except UserPolicyError as err:  # the user's policy raised or returned no plan: their input, not ours
                _reap(children_before)
                _say_error(f"error: {_where(record, raw)}: {err}")
                if err.__cause__ is not None:
                    _say("the policy's traceback:")
                    cause = err.__cause__
                    _to_stderr(lambda: _print_traceback(cause))
                _partial_report(record)
                return EXIT_BAD_INPUT
            except MemoryError:
                # The machine's memory, not a defect: sizes within every limit can still be too much for this
                # machine. Said in one line (the traceback's frames, and what they held, are gone by now);
                # before, a second MemoryError while printing the traceback ended the command with exit 1.
                _reap(children_before)
                _say_error(
                    f"error: {_where(record, raw)}: ran out of memory (MemoryError): the input's sizes are within "
                    f"the limits ({DATA_FILE}) but too large for this machine's memory; make them smaller"
                )
                return EXIT_BAD_INPUT
            except KeyboardInterrupt:
                # more Ctrl-C while this one is handled: no traceback from the reaping; and where this is the
                # process's own command (its argv from sys.argv), none until it has exited: one landing after the
                # handler was put back killed it by SIGINT (-2) after its report, where the report promised 130
                with _interrupts_ignored(restore=argv is not None):
                    _reap(children_before)
                    _say(f"interrupted ({interruption()}): simnccl {' '.join(raw)}")
                    _partial_report(record)
                return EXIT_INTERRUPTED
            except CommandTimeout as err:
                _reap(children_before)
                where = _where(record, raw)
                limit = current_limits().max_wall_s if wall_s is None else wall_s  # (``wall_clock`` inside a command)
                _say(
                    f"error: {where}: {err.what} ran past its wall-clock limit max_wall_s = {number_text(limit)} s "
                    f"({DATA_FILE}; to raise it for one run, set {ENV_PREFIX}MAX_WALL_S)"
                )
                _partial_report(record)
                return EXIT_BAD_INPUT
            except Exception as err:
                _reap(children_before)
                if isinstance(err, OSError) and err.errno in _NO_SPACE:  # the machine's, not simnccl's
                    _discard_unwritable_output()
                    _say_error(f"error: {_where(record, raw)}: cannot write its output: {err.strerror or err}")
                    _partial_report(record)
                    return EXIT_BAD_INPUT
                if isinstance(err, OSError) and err.errno == errno.ENAMETOOLONG:  # a name the user gave, too long
                    name = visible(str(err.filename)) if err.filename is not None else "a path given"
                    _say_error(f"error: {_where(record, raw)}: a file name too long for the file system: {name}")
                    return EXIT_BAD_INPUT
                if isinstance(err, BrokenPipeError) and _silence_closed_output():
                    _say(f"stopped: the output was closed (broken pipe) during simnccl {' '.join(raw)}")
                    _partial_report(record)
                    return EXIT_OUTPUT_CLOSED
                bug = err
                _to_stderr(lambda: _print_traceback(bug))
                _say(
                    f"simnccl: internal error (a bug in simnccl, exit {EXIT_SOFTWARE}) while running "
                    f"{_where(record, raw)}: {type(err).__name__}: {err}"
                )
                _say(
                    "please report it (simnccl issue tracker) with the scenario file(s), the command and the traceback"
                )
                return EXIT_SOFTWARE

    return run


_end_without_teardown = threading.Event()


def end_without_teardown() -> None:
    """Once this command's exit code is known, end the process with ``os._exit`` (after flushing its output),
    skipping the interpreter's teardown.

    Why: a rank under torchrun (``simnccl.real.torchrun_mode``) keeps torch's process groups referenced to the end,
    and torch 2.15's C++ teardown of them at interpreter exit can abort the process ("terminate called without
    an active exception", SIGABRT), seen in CI once in hundreds of runs, after the rank had written its report.
    torchrun then failed a run that had passed. The local launcher's ranks end with ``os._exit`` for the same
    reason; every file the command writes is closed by then."""
    _end_without_teardown.set()


def _print_traceback(error: BaseException) -> None:
    """``error``'s traceback on stderr, user text in it made visible (``simnccl.visible_text``): a policy's
    exception message (or a path, a name it quotes) is the user's text, and an ESC in it reached the terminal raw."""
    sys.stderr.write(visible("".join(traceback.format_exception(error))))


_NO_SPACE = frozenset(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code is not None)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _discard_unwritable_output() -> None:
    """Point stdout or stderr at /dev/null where it still cannot take what is buffered (a full disk): else the
    interpreter's last flush fails again at exit, after this guard, and exits 120 with a traceback-like note."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except OSError:
            try:
                fd = stream.fileno()
            except (OSError, ValueError):
                continue
            _to_devnull(fd)


def _silence_closed_output() -> bool:
    """Point stdout and stderr, where their reader has gone, at /dev/null (what is still buffered, and the
    report of what finished, then go nowhere instead of failing again at exit); whether either had gone.

    A pipe's write end whose reader closed polls POLLERR (Linux, macOS); a file or a terminal does not. Where
    ``poll`` is missing nothing counts as closed, and the broken pipe is reported as the bug it may be."""
    if not hasattr(select, "poll"):
        return False
    closed = False
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            fd = stream.fileno() if stream is not None else -1
        except (OSError, ValueError):
            continue
        if fd < 0:
            continue
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(events & select.POLLERR for _fd, events in poller.poll(0)):
            closed = True
            _to_devnull(fd)
    return closed


def _to_devnull(fd: int) -> None:
    """Point file descriptor ``fd`` at /dev/null: what is written to it from now on goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _say_error(line: str) -> None:
    """An error, on one line whatever the user text in it (a key or a file name with a newline split it in two:
    ``one_line``)."""
    _say(one_line(line))


def _say(line: str) -> None:
    """Plain text on stderr: user text (file names, keys, a policy's message) is printed literally, never as rich
    markup, and the terminal controls in it are shown as escapes (``visible``).

    A stderr whose reader went away (``... 2>&1 | head -3``) takes nothing more and is pointed at /dev/null: the
    guard says its lines from its ``except`` handlers, and a BrokenPipeError raised there escaped the guard and
    ended an error's exit 2 (or a Ctrl-C's 130) as exit 1, "a check failed"; the error's own code must win."""
    _to_stderr(lambda: print(visible(line), file=sys.stderr, flush=True))


def _to_stderr(write: Callable[[], None]) -> None:
    """``write()`` to stderr, or nothing when stderr's reader has gone (``_silence_closed_output``) or it cannot
    take it (``2>/dev/full``: the line is lost, the error's exit code is not; it ended as exit 1)."""
    try:
        write()
    except BrokenPipeError:
        if not _silence_closed_output():
            raise
    except OSError as err:
        if err.errno not in _NO_SPACE and err.errno != errno.EIO:
            raise
        _discard_unwritable_output()


def _open_closed_streams() -> None:
    """A process started with stdout or stderr closed has ``None`` there, and every write to it crashed the
    command (exit 70, or exit 1 when the crash could not be reported either). Text to a closed stream goes
    nowhere; the exit code still says how the command ended."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's stderr from now on
    if sys.stdout is None:
        sys.stdout = ClosedStdout(open(os.devnull, "wb"), encoding="utf-8")  # noqa: SIM115 - likewise


def _where(record: RunJournal, argv: Sequence[str]) -> str:
    """The scenario the command was on (and its variant), else the files named on the command line."""
    if record.running is not None:
        source, variant = record.running
        return f"{source} (variant {variant!r})"
    files = [a for a in argv if not a.startswith("-") and (a.endswith(".toml") or os.path.isfile(a))]
    return ", ".join(files) if files else f"simnccl {' '.join(argv)}".rstrip()


def _partial_report(record: RunJournal) -> None:
    """One line per variant that finished, then the one that was running: the result so far."""
    for result in record.scenarios:
        for variant in result.variants:
            held = "expectations hold" if variant.ok else "EXPECTATIONS FAILED"
            _say(f"  finished  {result.source}  {variant.name}: {variant.verdict} ({held})")
    if record.running is not None:
        source, variant_name = record.running
        _say(f"  stopped   {source}  {variant_name}: not finished")
    for line in record.lines:
        _say(f"  {line}")
    if not record.scenarios and not record.lines:
        _say("  nothing had finished")


@contextlib.contextmanager
def _interrupts_ignored(*, restore: bool = True) -> Iterator[None]:
    """SIGINT ignored in the block (main thread only), the previous handler put back after it unless ``restore``
    is off (the process is ending). Why: a user who pressed Ctrl-C several times got a KeyboardInterrupt traceback
    from the reaping of the first one's children."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if restore:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def wall_clock(seconds: float | None, what: str = "the command") -> Iterator[None]:
    """Raise CommandTimeout(``what``) after ``seconds`` of wall time (POSIX main thread; elsewhere no limit).

    A timer already running (an enclosing alarm) is put back afterwards with the time it had left. The commands
    that bound their own time (``OWN_TIMEOUTS``) use it for what their own limits do not cover."""
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise CommandTimeout(what)

    previous_handler = signal.signal(signal.SIGALRM, fire)
    started = time.monotonic()
    previous_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay > 0:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))


def _children() -> set[int]:
    """This process's child pids (Linux ``/proc``; elsewhere none are known and none are reaped)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def _reap(before: set[int]) -> None:
    """Stop and reap the children started since ``before``: SIGTERM (to the child's process group when it
    leads one, as the real tier's rank processes do), up to REAP_GRACE_S to exit, then SIGKILL."""
    started = sorted(_children() - before)
    if not started:
        return
    for pid in started:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + REAP_GRACE_S
    left = list(started)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if not _reaped(pid)]
        if left:
            time.sleep(0.05)
    for pid in left:
        _signal(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # already reaped (by its Popen, say)
        return True
    return done == pid

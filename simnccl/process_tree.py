"""Finding and ending every process a rank started, including those that left its process group.

Why: a rank is killed with its process group (``killpg``), but the code it runs may start a process in a
session of its own (``setsid``, ``subprocess.Popen(..., start_new_session=True)``, a daemonizing double
fork). Such a process is out of the group's reach and, once its parent ends, is re-parented to init: it
outlived the run. On Linux a process can be made a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): orphans
among its descendants are re-parented to it instead of init, so they stay in its tree, where they can be
found (``/proc/*/stat``) and killed. Elsewhere (macOS) there is neither: these functions do nothing, and only
the process group is killed.

Only descendants are ever signalled: a process is found by walking parent links down from a given root.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
KILL_TREE_S = 5.0  # how long ending a tree may take before giving up (a process that forks faster than we kill)


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux); False where that is not possible (a no-op there)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl: not Linux
        return False


def _parents() -> dict[int, tuple[int, bool]]:
    """Every process's parent and whether it is a zombie, read from ``/proc`` (empty without ``/proc``)."""
    table: dict[int, tuple[int, bool]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), fields[0] == b"Z")
        except (OSError, IndexError, ValueError):  # ended while we looked
            continue
    return table


def descendants(root: int, spare: frozenset[int] = frozenset()) -> list[int]:
    """The live (not zombie) descendants of ``root``, parents before their children, leaving out each process
    in ``spare`` and everything below it."""
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [pid for pid in children.get(root, []) if pid not in spare]
    while todo:
        pid = todo.pop(0)
        if not table[pid][1]:
            found.append(pid)
        todo.extend(child for child in children.get(pid, []) if child not in spare)
    return found


def kill_descendants(root: int, timeout_s: float = KILL_TREE_S, spare: frozenset[int] = frozenset()) -> bool:
    """SIGKILL every descendant of ``root`` (never ``root`` itself, nor a process in ``spare`` or below it) until
    none is left alive, and reap those that are this process's own children; False if some survived
    ``timeout_s``.

    Rounds, because a process may fork between the walk and its kill: its child, orphaned, is re-parented to
    the nearest subreaper, which ``root`` should be (``become_subreaper``), so the next walk finds it. Only the
    processes killed here are reaped (``waitpid`` on each): any other child of this process is its owner's.
    """
    deadline = time.monotonic() + timeout_s
    killed: set[int] = set()
    try:
        while True:
            alive = descendants(root, spare)
            if not alive:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            _reap(killed)
            time.sleep(0.005)
    finally:
        reaped_by = time.monotonic() + 1.0  # SIGKILLed: gone at once, unless stuck in the kernel (then left)
        while killed and time.monotonic() < reaped_by:
            _reap(killed)
            if killed:
                time.sleep(0.005)


def _reap(pids: set[int]) -> None:
    """Reap each of ``pids`` that is this process's child and has ended (dropped from the set once reaped, or
    once known not to be ours)."""
    for pid in list(pids):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pids.discard(pid)
            continue
        if done == pid:
            pids.discard(pid)


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """This process as a child subreaper inside the block (whether it could be), as it was after it.

    Why restore: the process may be the user's own (inline capture runs there), and orphans of whatever it
    runs later are none of simnccl's business."""
    was = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: not Linux
        yield False
        return
    try:
        yield become_subreaper()
    finally:
        if not was.value:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def has_children() -> bool:
    """Whether this process has a child, running or ended and not reaped (one system call, nothing reaped):
    when it has none, it has no descendants either if it is a subreaper."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def has_exited(pid: int) -> bool:
    """Whether ``pid``, a child of this process, has ended (or is not ours), without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def how_it_ended(pid: int, wait_s: float) -> str | None:
    """How ``pid``, a child of this process, ended ("exited with status 3", "was killed by signal 11 (SIGSEGV)"),
    waiting up to ``wait_s`` for it to end; None if it is still running then, or is not ours. Nothing is reaped
    (``WNOWAIT``): whoever owns the child reaps it as before, so its pid cannot be reused in between.

    Why: a captured rank that closed its result pipe without a result crashed or exited; which one, and with
    what, is the first thing a user needs to find why (a segfault in a C extension, an ``os._exit``)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is not None:
            break
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)
    if info.si_code == os.CLD_EXITED:
        return f"exited with status {info.si_status}"
    try:
        name = f" ({signal.Signals(info.si_status).name})"
    except ValueError:
        name = ""
    dumped = ", core dumped" if info.si_code == os.CLD_DUMPED else ""
    return f"was killed by signal {info.si_status}{name}{dumped}"

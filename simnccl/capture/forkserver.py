"""The fork server: one forked process imports the script's modules once, and every rank forks from it.

Why a process of its own and not this one: the preload might be refused (a module read ``RANK`` at import,
see ``simnccl.capture.script``), and modules cannot be un-imported; a server that is thrown away leaves the
capturing process as it was, so the ranks can then be forked from it plainly (each importing for itself).
It also keeps a user's process free of whatever the captured script imports.

Protocol (a ``SOCK_SEQPACKET`` socket pair, one pickled tuple per message): the server answers its start with
``("ready", modules)`` or ``("refused", why)``; then, for each ``("fork", rank, log_path)`` carrying the write end of
that rank's result pipe (``socket.send_fds``), it forks the rank (``ranks._rank_child``) and answers ``("forked",
pid)``; ``("release", pid)`` kills and reaps a rank; ``("ended", pid)``, asked for a rank that closed its result pipe
without a result, is answered ``("ended", how)`` (``process_tree.how_it_ended``: only the rank's parent can tell). The
capturing process keeps every decision (which rank runs, each rank's deadline, killing an overrunning one) and reads
each result pipe itself, exactly as for ranks it forks directly. On end of input (the capturer closed the socket, or
died: the server has ``PR_SET_PDEATHSIG``) or SIGTERM (``simnccl``'s Ctrl-C guard) the server kills and reaps every rank
still running, and every process re-parented to it (it is a child subreaper), then exits; ranks die with the server
(their own ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import socket
import time
from typing import Any, NoReturn

from simnccl.capture.environment import _installed
from simnccl.capture.heap import prepare_to_fork
from simnccl.capture.process_end import collected, preloaded_handlers
from simnccl.capture.ranks import (
    ENDED_GRACE_S,
    _DirectForks,
    _forked_child,
    _kill_and_reap,
    _log_tail,
    _own_group,
    _rank_child,
    _Spec,
    _warm_up,
)
from simnccl.capture.recorder import _Recorder, built_calls
from simnccl.capture.result import CaptureError
from simnccl.capture.script import PreloadRefused, ScriptTarget
from simnccl.env_knobs import PER_RANK_VARIABLES
from simnccl.process_tree import become_subreaper, how_it_ended, kill_descendants

MESSAGE_BYTES = 1 << 16  # every message is a short tuple
SERVER_EXIT_S = 10.0  # how long the server gets to reap its ranks and exit once told to, before SIGKILL


class ForkServer:
    """The capturing process's side of a running fork server (``spawn``/``release``/``close`` like
    ``ranks._DirectForks``)."""

    def __init__(self, pid: int, sock: socket.socket, modules: list[str], log_path: str) -> None:
        self.pid = pid
        self.sock = sock
        self.modules = modules
        self.log_path = log_path

    def spawn(self, rank: int, log_path: str) -> tuple[int, int]:
        read_fd, write_fd = os.pipe()
        try:
            socket.send_fds(self.sock, [pickle.dumps(("fork", rank, log_path))], [write_fd])
            reply = _receive(self.sock)
        except OSError:
            reply = None
        finally:
            os.close(write_fd)
        if reply is None or reply[0] != "forked":
            os.close(read_fd)
            raise CaptureError(f"rank {rank}: the fork server died before forking it{_log_tail(self.log_path)}")
        return int(reply[1]), read_fd

    def release(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(pickle.dumps(("release", pid)))

    def how_it_ended(self, pid: int) -> str | None:
        """How a rank ended (``process_tree.how_it_ended``): asked of the server, the rank's parent."""
        try:
            self.sock.send(pickle.dumps(("ended", pid)))
            reply = _receive(self.sock)
        except OSError:
            return None
        return reply[1] if reply is not None and reply[0] == "ended" else None

    def close(self) -> None:
        """End the server (it reaps its ranks first) and reap it; SIGKILL after ``SERVER_EXIT_S``."""
        with contextlib.suppress(OSError):
            self.sock.close()
        _stop(self.pid)


def start_forks(spec: _Spec, log_dir: str) -> tuple[Any, list[str]]:
    """How this capture forks its ranks, and a note when it could not do it the fast way.

    A script target (``ScriptTarget`` with ``preload``) gets a fork server holding its leading imports; any
    other target is forked from this process, which already imported what the target needs.
    """
    _warm_up()  # before the server forks, so the server and any direct fork both inherit it
    target = spec.target
    if not isinstance(target, ScriptTarget) or not target.preload:
        return _DirectForks(spec), []
    log_path = os.path.join(log_dir, "forkserver.log")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the server's coverage is not collected
        ours.close()
        _serve(spec, target, theirs, log_path)
    theirs.close()
    try:
        ours.settimeout(spec.timeout_s)
        try:
            reply = _receive(ours)
        except TimeoutError:
            raise CaptureError(
                f"importing the script's modules (the fork server's preload) took longer than {spec.timeout_s:g} s"
                f"{_log_tail(log_path)}"
            ) from None
        ours.settimeout(None)
    except BaseException:
        ours.close()
        _stop(pid)
        raise
    if reply is not None and reply[0] == "ready":
        return ForkServer(pid, ours, list(reply[1]), log_path), []
    ours.close()
    _stop(pid)
    why = reply[1] if reply is not None else f"the fork server died while importing them{_log_tail(log_path)}"
    return _DirectForks(spec), [f"the script's modules were not imported once for all ranks: {why}"]


def _receive(sock: socket.socket) -> tuple[Any, ...] | None:
    """The next message, or None at end of input."""
    data = sock.recv(MESSAGE_BYTES)
    return pickle.loads(data) if data else None


def _stop(pid: int) -> None:
    """Reap the server, which is exiting; kill it if it has not within ``SERVER_EXIT_S``."""
    deadline = time.monotonic() + SERVER_EXIT_S
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done == pid:
            return
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class _Stop(BaseException):
    """SIGTERM in the server: leave the loop, reap the ranks, exit."""


def _raise_stop(signum: int, frame: Any) -> None:  # pragma: no cover - runs in the server
    raise _Stop


def _serve(spec: _Spec, target: ScriptTarget, sock: socket.socket, log_path: str) -> NoReturn:  # pragma: no cover
    """The server process: preload, answer, then fork ranks on request until end of input."""
    children: set[int] = set()
    code = 0
    try:
        _forked_child(log_path)
        become_subreaper()  # a rank killed before it ended its own tree leaves it to us (see finally)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the capturer, which ends us
        signal.signal(signal.SIGTERM, _raise_stop)
        try:
            modules = _preload(spec, target)
        except PreloadRefused as err:
            sock.send(pickle.dumps(("refused", str(err))))
            return
        sock.send(pickle.dumps(("ready", modules)))
        gc.freeze()  # the ranks share the preloaded heap: the collector must not write to it (copy-on-write)
        prepare_to_fork(spec.world_size)  # huge pages: every fork copies ~1/512 of the page table entries
        while True:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
            for fd in fds:  # received fds are inheritable: a rank's program (os.system) would keep the pipe open
                os.set_inheritable(fd, False)
            if not data:
                return
            request = pickle.loads(data)
            if request[0] == "fork":
                _, rank, rank_log = request
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    _rank_child(spec, rank, fds[0], rank_log)
                _own_group(pid)
                os.close(fds[0])
                children.add(pid)
                sock.send(pickle.dumps(("forked", pid)))
            elif request[0] == "release":
                _kill_and_reap(request[1])
                children.discard(request[1])
            elif request[0] == "ended":
                sock.send(pickle.dumps(("ended", how_it_ended(request[1], ENDED_GRACE_S))))
    except _Stop:
        pass
    except BaseException:
        code = 70
    finally:
        for pid in sorted(children):
            _kill_and_reap(pid)
        kill_descendants(os.getpid())  # orphans of ranks that died without ending their own tree (a crash)
        os._exit(code)


def _preload(spec: _Spec, target: ScriptTarget) -> list[str]:  # pragma: no cover - runs in the server
    """The target's leading imports, inside the world a rank runs in (stand-in backends, fake CUDA), with the
    environment every rank shares; refused when they read per-rank variables or call what a rank records."""
    environment = {**os.environ, **spec.rank_env(0)}  # what a rank's os.environ holds, as _run_rank sets it
    shared = {k: v for k, v in environment.items() if k not in PER_RANK_VARIABLES}
    recorder = _Recorder(0, 0, False)
    with _installed(recorder, spec.release, spec.world_size, spec.gpus_per_node, spec.cuda), collected() as end:
        modules = target.preload_in(shared)
    preloaded_handlers(end.handlers)  # the exit handlers its imports registered: every forked rank runs them
    if recorder.calls:
        names = ", ".join(sorted({c.name for c in built_calls(recorder.calls)}))
        raise PreloadRefused(f"importing them called {names}, which each rank must do itself")
    return modules

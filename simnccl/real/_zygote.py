"""The zygote: one process that imports torch once and forks rank processes on request.

Why: importing torch costs ~3 s of CPU; a world of 4 ranks spawned fresh on a 2-core CI runner costs ~7 s before
the first op, and the differential test runs dozens of worlds. Forking from a process that has imported torch
(but never touched CUDA or created a process group — the same rule ``multiprocessing``'s forkserver relies on)
starts a rank in milliseconds.

Protocol (JSON lines): stdin ``{"cmd": "spawn", "tag": ..., "spec": {...}, "log": path}`` (a rank, or with
``{"store_host": {...}}`` as its spec the run's store host: ``driver.store_host_main``) | ``{"cmd": "keep"}`` |
``{"cmd": "exit"}``; stdout ``{"ready": pid}``, ``{"spawned": pid, "tag": ...}``, ``{"exited": pid, "code": n}``
(negative: signal).

``--remove-when-orphaned DIR``: the launcher's own temporary folder (run files, rank logs). A launcher that exits
removes it itself; one that is killed (SIGKILL, an OOM kill, a pytest worker killed at its timeout) cannot, and a
CI runner's ``/tmp`` would fill with one folder per killed run. So a zygote that outlives its launcher (stdin at
end of file without ``exit``, or a new parent) removes it once its ranks are reaped, unless a run asked to keep
its files (``keep``).

No process is left behind: every rank gets its own process group (the launcher kills it with ``killpg``) and
``PR_SET_PDEATHSIG=SIGKILL`` (it dies with the zygote, whose one thread forked it); the zygote kills and reaps its
children when its stdin closes or its launcher process is gone (``getppid`` changes), and reaps every child that
exits (``waitpid``), so no zombie outlives a run either. On Linux the ranks and the zygote are child subreapers
(``simnccl.process_tree``): a process a rank's code starts in a session of its own (out of the ``killpg``'s
reach) stays in the rank's tree, which the rank kills before it exits; if the rank is killed first, its orphans
come to the zygote, which kills them.

Why the zygote watches its launcher instead of setting ``PR_SET_PDEATHSIG`` on it: that signal follows the
*thread* that started the process, not the process. A launcher is shared by threads (``real diff`` runs each
case in a pool thread of its own); when the thread that happened to start the zygote ended, the kernel killed the
zygote, and with it the ranks of a world another thread was still running: they vanished mid-op, unreported, and
their run ended as a hang ("no progress") that never happened.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import sys
import traceback

from simnccl.process_tree import become_subreaper, has_children, kill_descendants

PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Die with the parent (Linux); a no-op where prctl is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        pass


def _emit(out: int, record: dict) -> None:
    data = (json.dumps(record) + "\n").encode()
    try:
        while data:
            written = os.write(out, data)
            data = data[written:]
    except OSError:  # the launcher is gone; PDEATHSIG takes us and our children down
        pass


def _child(spec_json: str, log: str, parent: int) -> None:
    """In the forked child: own process group, die with the zygote, logs to a file, run the rank."""
    code = 70
    try:
        os.setpgid(0, 0)
        set_pdeathsig(signal.SIGKILL)
        become_subreaper()  # what the rank's code starts stays in its tree, even in a session of its own
        if os.getppid() != parent:  # the zygote died between fork and prctl
            os._exit(75)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        from simnccl.real.driver import RankSpec, child_main, store_host_main

        spec = json.loads(spec_json)
        code = (
            store_host_main(spec["store_host"]) if "store_host" in spec else child_main(RankSpec.from_json(spec_json))
        )
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if has_children():  # one system call: most ranks start nothing
                kill_descendants(os.getpid())
        finally:
            os._exit(code)


def _kill_all(children: set[int]) -> None:
    """Stopping: nothing of ours survives us (each rank's process group, or the rank alone)."""
    for pid in sorted(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _end_strays(children: set[int]) -> None:
    """Kill every process re-parented to us (we are a subreaper), and what it started: the orphans of a rank
    that ended without ending its own tree (killed by the launcher, a crash). Only a dead rank's orphans come
    to us; a running rank, a subreaper itself, keeps its own."""
    kill_descendants(os.getpid(), spare=frozenset(children))


def _orphan_dir(argv: list[str]) -> str | None:
    """The folder ``--remove-when-orphaned`` names, if any."""
    if "--remove-when-orphaned" in argv:
        at = argv.index("--remove-when-orphaned")
        if at + 1 < len(argv):
            return argv[at + 1]
    return None


def main(argv: list[str] | None = None) -> int:
    launcher = os.getppid()  # watched below: PR_SET_PDEATHSIG would follow the launcher's starting thread
    remove = _orphan_dir(sys.argv[1:] if argv is None else argv)
    orphaned = False
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when we stop
    out = os.dup(1)
    os.dup2(2, 1)  # stray prints (torch warnings) must not corrupt the protocol
    # The expensive part, done once: torch, torch.distributed, the policy routing and the driver. The launcher
    # hears when torch's import starts and ends: a process that ends in between is the machine's torch or its
    # limits (a broken install, ``ulimit -v``), a missing prerequisite, not a bug of simnccl's.
    _emit(out, {"importing": "torch"})
    import torch
    import torch.distributed  # noqa: F401

    _emit(out, {"imported": "torch"})

    import simnccl.real.driver
    import simnccl.torch_apply  # noqa: F401

    me = os.getpid()
    become_subreaper()  # a rank killed before it ended its own tree leaves it to us (see _end_strays)
    children: set[int] = set()
    _emit(out, {"ready": me})
    buffer = b""
    running = True
    while running or children:
        if running and os.getppid() != launcher:  # the launcher process is gone (killed before closing our stdin)
            running = False
            orphaned = True
            _kill_all(children)
        if running:
            readable, _, _ = select.select([0], [], [], 0.02)
            if readable:
                chunk = os.read(0, 1 << 16)
                if not chunk:  # the launcher closed our stdin without saying exit: it is dead or dying
                    running = False
                    orphaned = True
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    cmd = json.loads(line)
                    if cmd.get("cmd") == "exit":
                        running = False
                    elif cmd.get("cmd") == "keep":
                        remove = None
                    elif cmd.get("cmd") == "spawn":
                        pid = os.fork()
                        if pid == 0:
                            os.close(out)
                            _child(json.dumps(cmd["spec"]), cmd["log"], me)
                        children.add(pid)
                        _emit(out, {"spawned": pid, "tag": cmd.get("tag")})
            if not running:
                _kill_all(children)
        else:
            select.select([], [], [], 0.02)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            if pid in children:  # not a stray (_end_strays), which the launcher never heard of
                children.discard(pid)
                _emit(out, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
                _end_strays(children)
    _end_strays(children)
    if orphaned and remove is not None:  # every rank is reaped: nothing writes there any more
        shutil.rmtree(remove, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

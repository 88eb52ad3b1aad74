"""The zygote: a process that imported torch once and forks the real ranks, and the helpers that stop them.

Why a process of its own: importing torch takes seconds, a fork milliseconds; a killed rank must take its
whole process group with it (``killpg``) and a reaped one must be gone for good (checked through ``/proc``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simnccl.file_tail import tail_text
from simnccl.prerequisites import MissingPrerequisite

REPO_ROOT = Path(__file__).resolve().parent.parent


def torch_import_failure(log: str) -> str | None:
    """The error that stopped the zygote's ``import torch`` (its last line), if that is what ended it: a broken
    torch install (a missing shared library, a half-removed package) was reported as a bug in simnccl (exit 70)
    with a traceback that named a log already deleted."""
    if "Traceback" not in log or "torch" not in log:
        return None
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    kinds = ("ImportError", "ModuleNotFoundError", "OSError", "AttributeError", "RuntimeError")
    return last if last.split(":", 1)[0].rsplit(".", 1)[-1] in kinds else None


class LaunchError(RuntimeError):
    """The launcher itself failed (zygote did not start, a rank pid survived)."""


class Zygote:
    """The launcher's side of ``simnccl.real._zygote``: start it, spawn ranks, learn exits, stop it."""

    def __init__(
        self, log_dir: Path, start_timeout_s: float = 120.0, *, remove_when_orphaned: Path | None = None
    ) -> None:
        """``remove_when_orphaned``: a folder the zygote removes if it outlives this process (the launcher's own
        temporary folder: a killed launcher cannot remove it); ``keep_files`` cancels that."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.env: Mapping[str, str] = env  # what every rank it forks starts from (before its variant's env)
        self.log_path = log_dir / "zygote.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        orphan_args = [] if remove_when_orphaned is None else ["--remove-when-orphaned", str(remove_when_orphaned)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simnccl.real._zygote", *orphan_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        self._lock = threading.Condition()
        self._write_lock = threading.Lock()
        self.exited: dict[int, tuple[int, float]] = {}
        self._spawned: dict[str, int] = {}
        self.ready = False
        self.importing_torch = False  # between the zygote's "importing" and "imported" lines
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout_s
        with self._lock:
            while not self.ready:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    exited = self.proc.poll() is not None
                    settle = time.monotonic() + 2.0
                    while exited and self._reader.is_alive() and time.monotonic() < settle:
                        self._lock.wait(0.05)  # the reader takes in what it wrote before it ended (EOF ends it)
                    tail = self.log_tail()
                    self.close()
                    broken = torch_import_failure(tail) if exited else None
                    if broken is not None:  # the machine's torch, not simnccl: a missing prerequisite (exit 2)
                        raise MissingPrerequisite(
                            f"simnccl real needs a PyTorch that imports (torch>=2.15); importing it failed: {broken}; "
                            "reinstall it (pip install 'simnccl[real]') or raise the process's limits (ulimit -v)"
                        )
                    if exited and self.importing_torch:  # it ended inside ``import torch``, with no error of its own
                        last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "no message")
                        raise MissingPrerequisite(
                            f"simnccl real needs a PyTorch that imports (torch>=2.15); importing it ended the rank "
                            f"helper process (exit code {self.proc.returncode}; its last words: {last[:300]}): "
                            "a broken install (pip install 'simnccl[real]') or the process's limits (ulimit -v) "
                            "can do that"
                        )
                    raise LaunchError(f"the rank zygote did not start; see {self.log_path}:\n{tail}")
                self._lock.wait(0.1)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                if "ready" in msg:
                    self.ready = True
                elif "importing" in msg:
                    self.importing_torch = True
                elif "imported" in msg:
                    self.importing_torch = False
                elif "spawned" in msg:
                    pid = int(msg["spawned"])
                    self._spawned[str(msg["tag"])] = pid
                    # A pid the kernel reused (pid_max can be 32,768, and a test suite wraps it in minutes): the
                    # exit of this zygote's earlier rank with the same pid is not this rank's. The zygote reports
                    # a child's spawn before its exit, so an exit read before this line is the old one.
                    self.exited.pop(pid, None)
                elif "exited" in msg:
                    self.exited[int(msg["exited"])] = (int(msg["code"]), time.time())
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def log_tail(self, n: int = 4000) -> str:
        return tail_text(self.log_path, n)

    def spawn(self, spec: Mapping[str, Any], log: Path, tag: str, timeout_s: float = 30.0) -> int:
        self._send({"cmd": "spawn", "tag": tag, "spec": dict(spec), "log": str(log)})
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while tag not in self._spawned:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise LaunchError(f"the zygote did not spawn rank {tag}:\n{self.log_tail()}")
                self._lock.wait(0.05)
            return self._spawned.pop(tag)

    def keep_files(self) -> None:
        """A run asked to keep its files: the zygote must not remove its folder even if it outlives us."""
        with contextlib.suppress(OSError, ValueError):  # a dead zygote removes nothing
            self._send({"cmd": "keep"})

    def _send(self, command: Mapping[str, Any]) -> None:
        """One protocol line to the zygote (threads share it: one line at a time)."""
        assert self.proc.stdin is not None
        line = json.dumps(command) + "\n"
        with self._write_lock:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()

    def exit_of(self, pid: int) -> tuple[int, float] | None:
        with self._lock:
            return self.exited.get(pid)

    def drained(self, timeout_s: float = 2.0) -> bool:
        """Once the zygote has exited: whether every report it wrote has been read (its pipe at end of file)."""
        self._reader.join(timeout=timeout_s)
        return not self._reader.is_alive()

    def wait_exits(self, pids: Sequence[int], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not all(p in self.exited for p in pids):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    return all(p in self.exited for p in pids)
                self._lock.wait(0.05)
        return True

    def close(self) -> None:
        """Stop the zygote: it kills and reaps whatever rank is left, then exits."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self._send({"cmd": "exit"})
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def kill_tree(pid: int) -> None:
    """SIGKILL a rank's process group (it made itself a group leader), and the pid itself."""
    signal_tree(pid, signal.SIGKILL)


def signal_tree(pid: int, signum: signal.Signals) -> None:
    """Send ``signum`` to a rank's process group and to the pid itself (gone already: nothing to do)."""
    for send in (lambda: os.killpg(pid, signum), lambda: os.kill(pid, signum)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (checked through /proc, psutil-free)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False

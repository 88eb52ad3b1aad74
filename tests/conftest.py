"""Shared fixtures: the repository's scenarios folder, a writer for scenario files under tmp_path, a loader for
the benchmark scripts (they are files, not a package), a check that a block leaves no child process behind, and
Ctrl-C restored in a test run started with it ignored."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import IO

import pytest

REPO = Path(__file__).resolve().parent.parent
SCENARIOS_DIR = REPO / "scenarios"


def pytest_configure(config: pytest.Config) -> None:
    """Give Ctrl-C back to a test run started with SIGINT ignored, so that the processes its tests start get it.

    A shell's background job (``cmd &`` in a script, ``nohup``, some CI runners) starts with SIGINT ignored;
    Python then installs no KeyboardInterrupt handler, and every process it starts inherits the ignoring. The
    tests that press Ctrl-C on a real ``simnccl`` process (exit 130, no traceback, no worker left) then
    measured the launcher's signal disposition, not simnccl: the signal was dropped and the command ran on.
    A process started from one that handles SIGINT gets the default disposition, as from a terminal.
    Runs in the controller and in every xdist worker (each loads this file)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (registered in sys.modules: dataclasses resolve through it)."""
    spec = importlib.util.spec_from_file_location(f"simnccl_benchmark_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def child_pids() -> set[int]:
    """This process's children, reaped or not (a zombie is listed until it is reaped); Linux's /proc."""
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children", encoding="ascii") as listing:
            pids.update(int(pid) for pid in listing.read().split())
    return pids


@contextlib.contextmanager
def no_child_left_behind() -> Iterator[None]:
    """Assert that every child process started inside the block has ended and been reaped when it ends.

    Only the block's own children count: under pytest-xdist a worker may already hold children another test
    started and keeps (a module's loopback Dask cluster, multiprocessing's resource tracker), and asserting
    that the process had no child at all (``os.waitpid(-1, WNOHANG)`` raising) failed whenever one ran first.
    """
    before = child_pids()
    yield
    left = child_pids() - before
    assert not left, f"children left behind (running or unreaped): {sorted(left)}"


def communicate_or_kill(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """What ``proc`` prints until it ends, as ``proc.communicate(timeout)`` returns it; past the timeout, the
    process is killed and reaped and the test fails naming what it printed, rather than leaving a command running
    after the test that started it.

    Read through the process's own file objects, not their descriptors as ``Popen.communicate`` reads: after a
    test's ``proc.stdout.readline()``, the lines that arrived in the same chunk sit in the file object's buffer,
    and communicate never returns them (a line the command printed went missing from the test's view)."""
    read: dict[str, str] = {}

    def drain(name: str, stream: IO[str] | None) -> None:
        if stream is not None:
            with stream:
                read[name] = stream.read()

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        proc.wait(timeout)
        for reader in readers:  # a child of the command may hold the pipe open past its end: bounded too
            reader.join(max(deadline - time.monotonic(), 0.0))
        if any(reader.is_alive() for reader in readers):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for reader in readers:
            reader.join(10)
        pytest.fail(
            f"still running after {timeout:g} s (killed): {proc.args!r}\n"
            f"stdout: {read.get('out', '')}\nstderr: {read.get('err', '')}"
        )
    return read.get("out", ""), read.get("err", "")


def at_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make rich see stderr as an interactive terminal that can redraw a line, as a user's shell is: without
    ``TERM`` set to a real terminal, a run from ``TERM=dumb`` (some CI runners, an editor's shell) draws no bar
    at all, rightly, and a test of the bar measured its launcher."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")


# A small valid scenario: two H100 96GB ranks, init and one checkpoint. Tests append or replace pieces.
TINY = """\
[scenario]
name = "tiny"

[cluster]
gpu = "h100-96gb"
gpus_per_node = 2

[torch]
release = "2.15"

[workload]
steps = [
  { op = "set_device" },
  { op = "init_process_group", backend = "nccl" },
  { op = "checkpoint", name = "after_init" },
]
"""


@pytest.fixture
def write_scenario(tmp_path: Path) -> Callable[..., Path]:
    """``write_scenario(text, name="s.toml")`` writes ``text`` under tmp_path and returns the path."""

    def write(text: str, name: str = "s.toml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


def marked_processes(mark: str) -> list[int]:
    """Pids of live processes whose environment carries ``mark`` (everything a launch started inherits it)."""
    from simnccl.real.zygote import pid_alive

    found = []
    needle = f"REAL_TEST_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and pid_alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def ended_by_ctrl_c(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """Wait for ``proc``, which was sent SIGINT (killed if it outlives ``timeout``): it exited 130, with no
    traceback. Its stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    return err

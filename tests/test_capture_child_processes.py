"""Processes the captured code starts itself: a forked helper, a background shell job, a subprocess.

A rank is one process; whatever it starts is not the rank. A helper it forks must not answer for it (its calls
are not the rank's, and its early exit is not the rank's end), and nothing it leaves running may hold the
capture up or outlive it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import no_child_left_behind

pytest.importorskip("torch")

from simnccl import capture as cap
from simnccl.capture.ranks import _frame, _Results
from simnccl.ops import NewGroup

pytestmark = pytest.mark.torch

STARTUP = "import os, sys\nimport torch.distributed as dist\ndist.init_process_group('nccl')\nr = dist.get_rank()\n"

# Ranks create two groups in an order that depends on their parity: on real GPUs, a hang.
BRANCHING = (
    "if r % 2 == 0:\n    a = dist.new_group([0, 1]); b = dist.new_group([2, 3])\n"
    "else:\n    b = dist.new_group([2, 3]); a = dist.new_group([0, 1])\n"
    "dist.barrier()\n"
)


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(STARTUP + body, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "helper",
    [
        "pid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\n",
        "pid = os.fork()\nif pid == 0:\n    raise SystemExit\nos.waitpid(pid, 0)\n",
        "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n",
    ],
    ids=["sys.exit(0)", "SystemExit", "os._exit"],
)
def test_a_forked_helper_that_exits_does_not_finish_the_rank(tmp_path: Path, helper: str, capsys) -> None:
    """The helper's exit is not the rank's: the rank goes on to its hang, which --simulate reports (exit 1)."""
    path = write(tmp_path, "forkexit.py", helper + BRANCHING)
    with no_child_left_behind():
        assert cap.main(["--world", "4", "--simulate", str(path)]) == 1
    assert "hang" in capsys.readouterr().out


def test_a_forked_helper_that_returns_runs_on_but_only_the_rank_is_recorded(tmp_path: Path) -> None:
    body = (
        "pid = os.fork()\nif pid == 0:\n    dist.new_group([0, 1], group_desc='from_child')\n"
        "else:\n    os.waitpid(pid, 0)\n    dist.new_group([0, 1, 2, 3], group_desc='from_parent')\n"
    )
    path = write(tmp_path, "forkchild.py", body)
    with no_child_left_behind():
        run = cap.capture(cap.script_target(None, str(path), []), 4)
    for program, calls in zip(run.programs, run.calls, strict=True):
        assert [op.ranks for op in program.ops if isinstance(op, NewGroup)] == [(0, 1, 2, 3)]
        assert [c.args["group_desc"] for c in calls if c.name == "new_group"] == ["from_parent"]


def test_a_forked_helper_that_returns_in_inline_mode_ends_there(tmp_path: Path) -> None:
    """Inline, the helper would otherwise return from capture() into the caller's own code."""
    marker = tmp_path / "returned"
    body = (
        "pid = os.fork()\nif pid == 0:\n    dist.new_group([0], group_desc='from_child')\n"
        "else:\n    os.waitpid(pid, 0)\n"
    )
    path = write(tmp_path, "inline.py", body)
    pid = os.getpid()
    try:
        run = cap.capture(cap.script_target(None, str(path), []), 2, mode="inline")
    finally:
        if os.getpid() != pid:  # a helper got back here: say so, and end it before it runs pytest on
            marker.write_text("yes")
            os._exit(0)
    assert not marker.exists()
    assert [c.name for c in run.calls[0]] == ["init_process_group"]


def test_a_result_not_written_by_the_rank_or_more_than_one_is_an_error_naming_the_rank() -> None:
    results = _Results()
    frame = _frame(cap.RankCapture(2, (), (), ()))
    with pytest.raises(cap.CaptureError, match=r"rank 2: its result was written by process \d+, not by the rank"):
        results.add(2, frame, os.getpid() + 1)
    with pytest.raises(cap.CaptureError, match="rank 2: more than one result came back for it"):
        results.add(2, frame + frame, os.getpid())
    with pytest.raises(cap.CaptureError, match="rank 2: its result ended after 5 bytes, incomplete"):
        results.add(2, frame[:5], os.getpid())
    results.add(2, frame, os.getpid())
    assert results.ranks[2].rank == 2


# Code that leaves a process running after the rank ends, writing its pid to f"{PIDS}.{r}".
LEAVES = {
    "background-job": "os.system(f'sleep 60 & echo $! > {PIDS}.{r}')\n",
    "subprocess": "import subprocess\nopen(f'{PIDS}.{r}', 'w').write(str(subprocess.Popen(['sleep', '60']).pid))\n",
    "forked-worker": "pid = os.fork()\nif pid == 0:\n    import time\n    time.sleep(60)\n    os._exit(0)\n"
    "open(f'{PIDS}.{r}', 'w').write(str(pid))\n",
}
# Code that leaves a process running in a session of its own, out of reach of the rank's process group.
ESCAPES = {
    "new-session": "import subprocess\n"
    "open(f'{PIDS}.{r}', 'w').write(str(subprocess.Popen(['sleep', '300'], start_new_session=True).pid))\n",
    "new-session-detached": "import subprocess\nopen(f'{PIDS}.{r}', 'w').write(str(subprocess.Popen(['sleep', '300'], "
    "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid))\n",
    "setsid": "os.system(f'setsid sleep 300 & echo $! > {PIDS}.{r}')\n",
    "double-fork": "pid = os.fork()\nif pid == 0:\n    os.setsid()\n    daemon = os.fork()\n    if daemon == 0:\n"
    "        os.execvp('sleep', ['sleep', '300'])\n    open(f'{PIDS}.{r}', 'w').write(str(daemon))\n    os._exit(0)\n"
    "os.waitpid(pid, 0)\n",
}
LEAVES.update(ESCAPES)


def capture_leaving(
    tmp_path: Path, leaves: str, *, mode: str | None = None, preload: bool = True
) -> tuple[cap.CapturedRun, list[int]]:
    """Capture a 2-rank script that runs ``leaves``: the run, and the pids it left (killed here if still
    running, so that a failing test leaves nothing behind either)."""
    pids = tmp_path / "pid"
    path = write(tmp_path, "leaves.py", f"PIDS = {str(pids)!r}\n" + leaves + "dist.new_group([0, 1])\n")
    try:
        with no_child_left_behind():
            target = cap.script_target(None, str(path), [], preload=preload)
            run = cap.capture(target, 2, timeout_s=20, mode=mode)
        left = [int(p.read_text()) for p in sorted(tmp_path.glob("pid.*"))]
        alive = [pid for pid in left if _running(pid)]
    finally:
        for file in tmp_path.glob("pid.*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(file.read_text()), signal.SIGKILL)
    return run, alive


@pytest.mark.parametrize("leaves", ["background-job", "forked-worker"])
def test_a_rank_that_leaves_a_process_running_is_not_reported_as_hung(tmp_path: Path, leaves: str) -> None:
    """The process left behind holds the result pipe (inherited by the job's shell; copied into the worker):
    the rank's whole result is its end, not the pipe's end of input."""
    run, _ = capture_leaving(tmp_path, LEAVES[leaves])
    assert [sum(isinstance(op, NewGroup) for op in p.ops) for p in run.programs] == [1, 1]


@pytest.mark.parametrize("leaves", list(LEAVES))
def test_what_a_rank_leaves_running_does_not_outlive_the_capture(tmp_path: Path, leaves: str) -> None:
    _, alive = capture_leaving(tmp_path, LEAVES[leaves])
    assert alive == []


@pytest.mark.parametrize("leaves", list(LEAVES))
@pytest.mark.parametrize("how", ["forked-directly", "inline"])
def test_what_a_rank_leaves_running_does_not_outlive_the_capture_without_the_fork_server(
    tmp_path: Path, leaves: str, how: str
) -> None:
    """As above, with the ranks forked from the capturing process itself (no preload), and run inline in it.
    One in a session of its own (``ESCAPES``) is out of the rank's process group: it was re-parented to init
    and ran on. The rank is a child subreaper now, its orphans stay in its tree, and the tree is killed before
    the rank ends. Inline, nothing was killed at all: whatever the captured code left ran on."""
    mode = "inline" if how == "inline" else None
    run, alive = capture_leaving(tmp_path, LEAVES[leaves], mode=mode, preload=False)
    assert [sum(isinstance(op, NewGroup) for op in p.ops) for p in run.programs] == [1, 1]
    assert alive == []


def test_what_a_rank_that_crashed_left_in_a_session_of_its_own_does_not_outlive_the_capture(tmp_path: Path) -> None:
    """A rank killed by a signal cannot end its own tree: its orphans are re-parented to the fork server (a
    subreaper), which kills them before it exits."""
    pids = tmp_path / "pid"
    crash = "import signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    path = write(tmp_path, "crash.py", f"PIDS = {str(pids)!r}\n" + ESCAPES["new-session"] + crash)
    try:
        with no_child_left_behind(), pytest.raises(cap.CaptureError, match="died without a result"):
            cap.capture(cap.script_target(None, str(path), []), 2, timeout_s=20)
        # The rank that crashed wrote its pid first; the other one may have been stopped with it between
        # creating its file and writing it (CI once read an empty one), which leaves no pid to check.
        left = [int(text) for p in sorted(tmp_path.glob("pid.*")) if (text := p.read_text())]
        assert left and [pid for pid in left if _running(pid)] == []
    finally:
        for file in tmp_path.glob("pid.*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(file.read_text()), signal.SIGKILL)


def _running(pid: int) -> bool:
    """Running after a moment's grace for a SIGKILL sent just before to land (a zombie is not running)."""
    for _ in range(100):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("preload", [True, False], ids=["fork-server", "direct"])
@pytest.mark.parametrize(
    ("ending", "said"),
    [
        (
            "import faulthandler\n    faulthandler.disable()\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
            r"it was killed by signal 11 \(SIGSEGV\)",
        ),
        ("os.kill(os.getpid(), signal.SIGKILL)\n", r"it was killed by signal 9 \(SIGKILL\)"),
        ("os._exit(3)\n", r"it exited with status 3"),
        ("os._exit(0)\n", r"it exited with status 0"),
    ],
    ids=["SIGSEGV", "SIGKILL", "exit-3", "exit-0"],
)
def test_a_rank_that_ends_without_a_result_is_reported_with_how_it_ended(
    tmp_path: Path, preload: bool, ending: str, said: str
) -> None:
    """A crash in the captured code (a C extension's segfault) or an ``os._exit`` leaves no result: the error
    says which it was. With a fork server the rank is the server's child, and the server is asked."""
    path = write(tmp_path, "ends.py", "import signal\nif r == 1:\n    " + ending + "dist.new_group([0, 1])\n")
    target = cap.script_target(None, str(path), [], preload=preload)
    with no_child_left_behind(), pytest.raises(cap.CaptureError) as caught:
        cap.capture(target, 2, timeout_s=20, jobs=1)
    first = str(caught.value).splitlines()[0]
    assert first.startswith("rank 1: the capture process died without a result; "), first
    assert re.search(said, first), first

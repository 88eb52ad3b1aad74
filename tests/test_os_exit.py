"""``os._exit`` in user code that simnccl runs in its own process is that code's failure, never the end of the
process: a policy hook's ``os._exit(0)`` once ended ``simnccl run`` — or a team's pytest session — with exit 0 and
no report. The cases that call ``os._exit`` run in a child process: were the guard gone, they would end pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from simnccl.os_exit import os_exit_raises

TESTS = Path(__file__).resolve().parent


class _Exited(BaseException):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@pytest.fixture
def fake_exit(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``os._exit`` replaced by one that records its status (what the guard must hand every other call to)."""
    called: list[int] = []
    monkeypatch.setattr(os, "_exit", called.append)
    return called


def test_inside_a_region_os_exit_raises_and_outside_it_is_what_it_was(fake_exit: list[int]) -> None:
    before = os._exit
    with os_exit_raises(_Exited):
        with pytest.raises(_Exited) as raised:
            os._exit(3)
        assert raised.value.status == 3
        with os_exit_raises(lambda status: _Exited(status + 100)):  # regions nest: the innermost one's factory
            with pytest.raises(_Exited) as inner:
                os._exit(1)
            assert inner.value.status == 101
        with pytest.raises(_Exited):
            os._exit(0)
    assert os._exit is before and fake_exit == []
    os._exit(5)
    assert fake_exit == [5]


def test_another_threads_os_exit_is_not_the_regions(fake_exit: list[int]) -> None:
    """simnccl's command guard ends the command with ``os._exit`` from its own thread: that must still end it."""
    inside, leave = threading.Event(), threading.Event()

    def region() -> None:
        with os_exit_raises(_Exited):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=region)
    thread.start()
    try:
        assert inside.wait(10)
        os._exit(4)  # this thread has no region open: handed to what was installed before
    finally:
        leave.set()
        thread.join(10)
    assert fake_exit == [4]


def test_regions_of_two_threads_closing_out_of_order_leave_os_exit_as_it_was(fake_exit: list[int]) -> None:
    before = os._exit
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []

    def first() -> None:
        with os_exit_raises(_Exited):
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with os_exit_raises(_Exited):
            second_in.set()
            first_out.wait(10)  # the first region closes while this one is open
            try:
                os._exit(9)
            except _Exited:
                seen.append("raised")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == ["raised"] and os._exit is before and fake_exit == []


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_policy_hooks_os_exit_is_its_error_and_os_exit_works_again_after() -> None:
    done = _child(
        """
        import os, user_policies
        from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
        from simnccl.policy import UserPolicyError
        from simnccl.testing import simulate
        program = [SetDevice(), InitProcessGroup(), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
        try:
            simulate(program, policy=user_policies.OsExitsOnGroup())
        except UserPolicyError as err:
            print("USER POLICY ERROR:", err, flush=True)
        os._exit(7)  # after the run, os._exit ends the process as ever
        """
    )
    assert done.returncode == 7, done.stderr
    assert (
        "USER POLICY ERROR: policy 'os-exits-on-group': on_group called os._exit(0), which would have ended the "
        "simulating process with no report (rank 0" in done.stdout
    ), done.stdout


def test_a_child_a_policy_forks_exits_for_real() -> None:
    done = _child(
        """
        import user_policies
        from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
        from simnccl.testing import simulate
        program = [SetDevice(), InitProcessGroup(), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
        print("VERDICT", simulate(program, policy=user_policies.ForksOnGroup()).verdict)
        """
    )
    assert done.returncode == 0 and "VERDICT pass" in done.stdout, done.stderr


def test_a_policy_module_or_constructor_calling_os_exit_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "exits_at_import.py").write_text("import os\nos._exit(0)\n")
    (tmp_path / "exits_in_ctor.py").write_text(
        "import os\nfrom dataclasses import dataclass\nfrom simnccl.policy import BasePolicy\n"
        "@dataclass(frozen=True)\nclass P(BasePolicy):\n    name: str = 'p'\n"
        "    def __post_init__(self):\n        os._exit(0)\n"
    )
    for spec, message in [
        ("exits_at_import:P", "importing 'exits_at_import' failed: os._exit(0) called"),
        ("exits_in_ctor:P", "P() raised os._exit(0) called"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "simnccl", "run", "--policy", spec],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, (spec, done.returncode, done.stdout, done.stderr)
        assert message in done.stderr, done.stderr

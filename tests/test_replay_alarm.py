"""A generated case that runs past its wall-clock guard ends as CaseTimeout naming the run (DESIGN rule 7),
and the guard leaves the process's SIGALRM handler as it found it (``simnccl.testing.replay._alarm``)."""

from __future__ import annotations

import signal
import time

import pytest

from simnccl.testing.replay import CaseTimeout, _alarm


def test_the_case_alarm_raises_case_timeout_naming_the_run() -> None:
    described = []

    def what() -> str:
        described.append(1)
        return "a 2-rank case under policy 'eager'"

    deadline = time.monotonic() + 5
    with pytest.raises(CaseTimeout, match="a 2-rank case under policy 'eager': still simulating"), _alarm(0.05, what):
        while time.monotonic() < deadline:
            pass
    assert described == [1]


def test_the_case_alarm_names_the_run_only_when_it_fires_and_restores_the_handler() -> None:
    def mine(signum: int, frame: object) -> None:  # pragma: no cover - never fires
        raise AssertionError("the previous handler ran")

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        with _alarm(30.0, lambda: pytest.fail("described without firing")):
            assert signal.getsignal(signal.SIGALRM) is not mine
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)

"""The suite's own way of reading a command to its end (``conftest.communicate_or_kill``) loses nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import communicate_or_kill


def test_lines_read_ahead_with_the_first_are_returned() -> None:
    """Two lines in one write: ``readline`` takes the first, the second waits in the file object's buffer, where
    ``Popen.communicate`` (reading the descriptor) never looked; a Ctrl-C test then missed a printed line."""
    code = "import sys; sys.stdout.write('first\\nsecond\\n'); sys.stdout.flush(); print('third', file=sys.stderr)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "first\n"
    out, err = communicate_or_kill(proc, 60)
    assert (out, err, proc.returncode) == ("second\n", "third\n", 0)


def test_a_command_past_its_timeout_is_killed_and_the_test_fails() -> None:
    code = "import time; print('started', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(pytest.fail.Exception, match=r"still running after 1 s \(killed\)[\s\S]*started"):
        communicate_or_kill(proc, 1)
    assert proc.returncode is not None  # reaped

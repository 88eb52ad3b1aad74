"""Commands that need torch, run where torch is absent (a downstream suite's simnccl[testing] environment):
exit 2 with one line saying what to install, never a ModuleNotFoundError traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

# torch made unimportable in the child, as in a venv without it (sys.modules[name] = None blocks an import).
HIDE_TORCH = "import sys; sys.modules['torch'] = None; "


@pytest.mark.parametrize(
    "code",
    [
        "from simnccl.cli import main; sys.exit(main(['capture', '--world', '2', 'x.py']))",
        "from simnccl.cli import main; sys.exit(main(['real', 'run', 'x.toml']))",
        "import runpy; sys.argv = ['simnccl.real', 'run', 'x.toml']; "
        "runpy.run_module('simnccl.real', run_name='__main__')",
    ],
    ids=["simnccl capture", "simnccl real", "python -m simnccl.real"],
)
def test_torch_commands_without_torch_exit_2_with_one_line(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDE_TORCH + code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "pip install 'simnccl[real]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_default_job_runs_without_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDE_TORCH + "from simnccl.cli import main; sys.exit(main(['run']))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "all expectations hold" in done.stdout

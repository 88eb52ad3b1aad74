"""Importing simnccl (and running a simulation) must never import torch."""

from __future__ import annotations

import subprocess
import sys


def test_simnccl_does_not_import_torch() -> None:
    code = (
        "import sys, simnccl, simnccl.engine, simnccl.cli, simnccl.scenario, simnccl.testing\n"
        "from simnccl.cli import main\n"
        "rc = main(['run', '--json'])\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

"""The property benchmark's loop at a few programs: it draws, simulates, checks and prints its last line (no
timing asserts); a failed invariant makes it exit 1."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from simnccl.testing import invariants

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "property.py"
LAST_LINE = re.compile(
    r"programs_per_s=[\d.]+ sim_programs_per_s=[\d.]+ mean_ops_per_rank=[\d.]+ cpu_programs_per_s=[\d.]+"
)


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("simnccl_benchmark_property", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


def test_benchmark_prints_its_figures_for_the_programs_it_drew(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--programs", "15", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]
    assert any(line.strip().startswith("programs:                 15 ") for line in lines)


def test_a_failed_invariant_fails_the_benchmark(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invariants, "passes", lambda outcome: invariants.Verdict(False, "broken on purpose"))
    assert bench.main(["--programs", "3"]) == 1
    assert "broken on purpose" in capsys.readouterr().out

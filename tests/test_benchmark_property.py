"""The property benchmark's loop at a few programs: it draws, simulates, checks and prints its last line (no
timing asserts); a failed invariant makes it exit 1."""

from __future__ import annotations

import re

import pytest
from conftest import load_benchmark

from simnccl.testing import invariants

LAST_LINE = re.compile(
    r"programs_per_s=[\d.]+ sim_programs_per_s=[\d.]+ mean_ops_per_rank=[\d.]+ cpu_programs_per_s=[\d.]+"
)
bench = load_benchmark("property")


def test_benchmark_prints_its_figures_for_the_programs_it_drew(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--programs", "15", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]
    assert any(line.strip().startswith("programs:                 15 ") for line in lines)
    assert any(line.strip().startswith("hypothesis' floor:") for line in lines)  # hypothesis alone, for scale


def test_a_failed_invariant_fails_the_benchmark(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invariants, "passes", lambda outcome: invariants.Verdict(False, "broken on purpose"))
    assert bench.main(["--programs", "3"]) == 1
    assert "broken on purpose" in capsys.readouterr().out

"""The collectives benchmark at a few programs: it checks its programs, prints its last line (no timing asserts),
and a program that does not pass makes it fail."""

from __future__ import annotations

import re

import pytest
from conftest import load_benchmark

from simnccl.ops import AllReduce, Recv, Send

LAST_LINE = re.compile(
    r"all_reduce_us=[\d.]+ send_recv_us=[\d.]+ all_reduce_ratio=[\d.]+ send_recv_ratio=[\d.]+ empty_ms=[\d.]+"
)
bench = load_benchmark("collectives")


def test_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--ranks", "4", "--ops", "3", "--programs", "2", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]
    assert lines[0].startswith("raw simpy:")


def test_its_programs_are_all_reduces_on_the_world_and_sends_to_the_next_rank() -> None:
    built = bench.programs(4, 3)
    assert built["empty"] == list(bench.START)
    assert built["all_reduce"][2:] == [AllReduce()] * 3
    sends = [program[2:] for program in built["send_recv"]]
    assert sends == [[Send(peer=1)] * 3, [Recv(peer=0)] * 3, [Send(peer=3)] * 3, [Recv(peer=2)] * 3]


def test_a_program_that_does_not_pass_fails_the_benchmark() -> None:
    unmatched = [[*bench.START, Send(peer=1)], [*bench.START, Send(peer=0)]]  # both send: nobody receives
    with pytest.raises(SystemExit, match="FAILED: broken: verdict 'hang'"):
        bench.check("broken", unmatched, 2)


def test_bad_arguments_are_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        bench.main(["--ranks", "3"])
    assert err.value.code == 2
    assert "--ranks: an even count from 2 to 8" in capsys.readouterr().err

"""The engine benchmark's program builder, checks and output format at a tiny world (no timing asserts)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from simnccl.engine import Engine
from simnccl.memory import Owner
from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, NewGroup, SetDevice

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "engine.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("simnccl_benchmark_engine", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()
WORLD = 32
DIMS = bench.Dims(tp=2, cp=2, pp=2, ep=2, optimizer_instances=2)  # dp=4, expert-dp=8


@pytest.fixture(scope="module")
def startup():
    return bench.build_startup(WORLD, DIMS)


def test_program_is_one_shared_object_with_every_call(startup) -> None:
    ops = startup.program.ops
    assert isinstance(ops[0], SetDevice) and isinstance(ops[1], InitProcessGroup)
    new_groups = [op for op in ops if isinstance(op, NewGroup)]
    assert len(new_groups) == startup.new_group_calls
    assert startup.new_group_calls == sum(len(p.groups) for p in startup.partitions)
    assert [op.group for op in ops if isinstance(op, AllReduce)] == ["tp", "dp"]
    assert isinstance(ops[-1], Checkpoint)
    config = bench.make_config(startup, wall_s=60.0)
    assert all(p is startup.program for p in config.programs)


def test_each_rank_is_a_member_of_one_group_per_covering_partition(startup) -> None:
    new_groups = [op for op in startup.program.ops if isinstance(op, NewGroup)]
    stage = {r: r // (WORLD // DIMS.pp) for r in range(WORLD)}
    for rank in range(WORLD):
        counted = sum(rank in op.ranks for op in new_groups)
        assert counted == startup.memberships[rank]
        # One group per partition, but embedding (first and last stage) and position embedding (first).
        expected = len(startup.partitions) - 2
        expected += stage[rank] in (0, DIMS.pp - 1)
        expected += stage[rank] == 0
        assert counted == expected
        singles = sum(rank in op.ranks for op in new_groups if len(op.ranks) == 1)
        assert singles == startup.singleton_memberships[rank]
    for part in startup.partitions:
        if part.bind in ("embedding", "position_embedding"):
            continue
        covered = sorted(r for g in part.groups for r in g)
        assert covered == list(range(WORLD)), part.bind


def test_grid_groups_are_the_ranks_that_agree_outside_the_varied_dims() -> None:
    """The fast builder (one offset list per partition) against the definition: ranks of a grid (first dim
    fastest) grouped by their coordinates in the fixed dims, groups ordered by those coordinates with the
    last dim outermost, members ascending."""
    sizes = [("a", 2), ("b", 3), ("c", 2), ("d", 2)]
    world = 2 * 3 * 2 * 2

    def coords(rank: int) -> dict[str, int]:
        out = {}
        for name, size in sizes:
            rank, out[name] = divmod(rank, size)
        return out

    for vary in ({"a"}, {"b"}, {"d"}, {"a", "c"}, {"b", "d"}, {"a", "b", "c", "d"}, set()):
        fixed = [n for n, _ in sizes if n not in vary]
        by_fix: dict[tuple[int, ...], list[int]] = {}
        for rank in range(world):
            c = coords(rank)
            by_fix.setdefault(tuple(c[n] for n in reversed(fixed)), []).append(rank)
        expected = tuple(tuple(by_fix[key]) for key in sorted(by_fix))
        assert bench._grid_groups(sizes, vary) == expected, vary


def test_default_layout_at_512_matches_the_brief() -> None:
    big = bench.build_startup(512)
    assert big.new_group_calls == 2765
    assert 20 <= min(big.memberships) <= max(big.memberships) <= 22


def test_engine_run_passes_and_memory_matches(startup) -> None:
    config = bench.make_config(startup, wall_s=60.0)
    outcome = Engine(config).run()
    assert outcome.verdict == "pass"
    assert bench.check_outcome(startup, config, outcome) == []
    assert outcome.ops_executed == WORLD * len(startup.program)


def test_ledger_histories_group_the_devices_alike_up_to_relabelling(startup) -> None:
    """Every device counted once; the startup's devices fall into a few histories (what rank classes would hold),
    and a device made to differ gets a history of its own."""
    engine = Engine(bench.make_config(startup, wall_s=60.0))
    engine.run()
    ledgers = list(engine.ledgers.values())
    histories = bench.ledger_histories(ledgers)
    assert sum(histories) == len(ledgers) == WORLD
    assert 1 <= len(histories) < len(ledgers) and histories == sorted(histories, reverse=True)
    ledgers[0].allocate(Owner("torch", 0), 1, time_s=0.0, op=None)  # device 0 leaves its class (of several)
    after = bench.ledger_histories(ledgers)
    assert len(after) == len(histories) + 1 and after[-1] == 1 and sum(after) == WORLD


def test_check_outcome_catches_a_wrong_expectation(startup) -> None:
    config = bench.make_config(startup, wall_s=60.0)
    outcome = Engine(config).run()
    wrong = bench.Startup(
        startup.world,
        startup.program,
        startup.partitions,
        startup.new_group_calls,
        tuple(m + 1 for m in startup.memberships),
        startup.singleton_memberships,
    )
    assert bench.check_outcome(wrong, config, outcome)


def test_last_line_round_trips() -> None:
    ok = bench.SizeResult(512, 300.0, "ok", wall_s=1.25)
    over = bench.SizeResult(4096, 120.0, "budget")
    line = bench.last_line(0.5, {512: ok, 4096: over})
    assert line == "ratio=0.5000 w512_s=1.250 w4096_s=>120 w16384_s=nan"
    parsed = bench.parse_last_line(line)
    assert parsed["ratio"] == 0.5 and parsed["w512_s"] == 1.25 and parsed["w4096_s"] == ">120"
    assert math.isnan(parsed["w16384_s"])
    with pytest.raises(ValueError):
        bench.parse_last_line("ratio=1 w512_s=2")


def test_main_prints_a_parsable_last_line(capsys) -> None:
    rc = bench.main(["--quick", "--sizes", "32", "--dims", "2,2,2,2", "--budget", "32=60"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert any(line.split()[:1] == ["32"] and line.rstrip().endswith("ok") for line in out)
    parsed = bench.parse_last_line(out[-1])
    assert set(parsed) == {"ratio", "w512_s", "w4096_s", "w16384_s"}
    assert all(math.isnan(v) for v in parsed.values())  # W=512 and the big sizes were not run


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak RSS count (VmHWM) is Linux's")
def test_the_run_peak_rss_counts_from_its_reset_not_an_earlier_allocation() -> None:
    """The run's peak must not be an earlier size's (or anything allocated before the reset)."""
    big = b"x" * (300 * 2**20)  # 300 MiB, touched
    before = bench._peak_rss_gib()
    del big
    assert bench._reset_peak_rss()
    after = bench._peak_rss_gib()
    assert before - after > 0.25, (before, after)
    result = bench.run_size(32, 60.0, 8 * 2**30, DIMS)
    assert result.status == "ok" and not result.run_peak_is_process
    assert 0 < result.run_peak_gib < before


def test_the_materialisation_floor_builds_every_membership_once_and_restores_the_gc(startup) -> None:
    import gc

    assert gc.isenabled()
    seconds, count = bench.materialisation_floor(startup)
    assert count == sum(startup.memberships) and seconds > 0
    assert gc.isenabled()


def test_main_prints_the_floor_under_a_finished_size(capsys) -> None:
    rc = bench.main(["--quick", "--sizes", "32", "--dims", "2,2,2,2", "--budget", "32=60", "--floor"])
    out = capsys.readouterr().out
    assert rc == 0 and "materialisation floor:" in out and "us a membership" in out

"""Member fan-out (``engine/fast/fanout.py``): a cohort call's members applied in one pass with what they share
worked out once — and nothing observable changes. Each test runs the same startup with the fan-out and with
the one-by-one member path and compares everything a run is observed by: the gate's record (trace hash,
verdict, events, reports), every ledger by owner and its timeline, every group record, every rank's groups."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from simnccl.engine import Engine, RunOutcome, SimConfig
from simnccl.memory import Owner

_BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"simnccl_bench_fanout_{name}", _BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load("engine")
gate = _load("engine_gate")
SMALL = bench.Dims(tp=4, cp=1, pp=2, ep=4)


def _config(world: int) -> SimConfig:
    return bench.make_config(bench.build_startup(world, SMALL), 120.0)


def _run(config: SimConfig, *, fanout: bool, prepare: Any = None) -> tuple[Engine, RunOutcome]:
    engine = Engine(config, keep_trace=True)
    engine.fast.cohorts.fanout.enabled = fanout
    if prepare is not None:
        prepare(engine)
    return engine, engine.run()


def _facts(engine: Engine, outcome: RunOutcome) -> dict[str, Any]:
    return {
        "record": gate._record(outcome, engine.explanations),
        "trace": outcome.trace,
        "ledgers": {
            key: (
                ledger.used_bytes,
                ledger.peak_bytes,
                sorted((repr(o), held) for o, held in ledger.by_owner.items()),
                [(e.time_s, e.owner, e.delta_bytes, e.used_bytes) for e in ledger.timeline],
            )
            for key, ledger in {**outcome.ledgers, **engine.memory.host_ledgers}.items()
        },
        "groups": {key: (rec.impl, rec.via_split, rec.members) for key, rec in outcome.groups.items()},
        "ranks": [
            (
                rt.status,
                rt.pc,
                rt.counter,
                sorted((bind, getattr(handle, "name", repr(handle))) for bind, handle in rt.handles.items()),
                [(g.name, g.rank_in_group, g.bound_device, sorted(g.comms)) for g in rt.groups],
            )
            for rt in outcome.ranks
        ],
        "slots": dict(engine.nvls.charged),
    }


def test_a_fanned_out_startup_equals_the_one_by_one_path() -> None:
    config = _config(64)
    fanned = _run(config, fanout=True)
    assert fanned[1].verdict == "pass"
    memberships = sum(len(rt.groups) - 1 for rt in fanned[1].ranks)
    assert fanned[0].fast.cohorts.fanout.fanned == memberships  # every membership of the block fanned out
    one_by_one = _run(config, fanout=False)
    assert one_by_one[0].fast.cohorts.fanout.fanned == 0
    assert _facts(*fanned) == _facts(*one_by_one)


def test_a_rank_of_another_class_is_fanned_out_as_it_would_be_one_by_one() -> None:
    """A rank whose environment asks for shared split resources: its children are priced exactly (its own
    breakdown, NVLS shared with its parent) inside the same pass."""

    def odd_env(engine: Engine) -> None:
        rt = engine.ranks[5]
        rt.ctx = replace(rt.ctx, env={**rt.ctx.env, "NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"})

    config = _config(32)
    assert _facts(*_run(config, fanout=True, prepare=odd_env)) == _facts(*_run(config, fanout=False, prepare=odd_env))


def test_a_member_that_runs_out_of_memory_fails_alone_and_the_others_go_on() -> None:
    """Rank 5's device nearly full before the run: its first init charge in the block raises, re-raised in its
    own process; every other member of that call is still applied, as on the one-by-one path."""

    def fill(engine: Engine) -> None:
        ledger = engine.memory.ledgers[engine.cluster.device(0, 5).key]
        ledger.allocate(Owner("torch", 5), ledger.total_bytes - 2 * 2**30, time_s=0.0, op=None)

    config = _config(32)
    fanned = _run(config, fanout=True, prepare=fill)
    assert fanned[1].verdict != "pass"
    assert fanned[1].ranks[5].error_kind == "oom"
    assert _facts(*fanned) == _facts(*_run(config, fanout=False, prepare=fill))

"""The engine's behaviour gate: record every case's outcome with whatever engine is importable, then compare.

Why: a change that must not change behaviour (cutting ``simnccl/engine`` into rooms, a speed-up) is proven by
running the same thousands of simulations before and after and finding every outcome identical — not by
reading the diff. What one case records is
``(verdict, event_count, trace_hash, report_digest, semantic_digest)``: the trace hash covers every recorded
event (times, allocations, meetings, errors, the verdict); the report digest adds
what the trace does not carry (hang and error reports with their explanations, policy explanations,
flight-recorder dumps, straggler costs, checkpoints, ops counted, end time); a fifth field, the semantic
digest, is described under ``compare --semantic``.

Run::

    # before the change: the original engine first on PYTHONPATH (e.g. a ``git worktree`` of the old commit)
    PYTHONPATH=/tmp/engine-base python benchmarks/engine_gate.py record /tmp/gate/base.json
    # after the change
    PYTHONPATH=$PWD python benchmarks/engine_gate.py record /tmp/gate/new.json
    python benchmarks/engine_gate.py compare /tmp/gate/base.json /tmp/gate/new.json

Cases (each run on the fast path and on the ordinary per-rank path, ``Engine(fast_path=False)``):

* ``gen``: hypothesis-generated cases (``simnccl.testing.strategies.cases``, 1-8 ranks; a batch of 8-16
  ranks) under a fixed seed, each also with a seeded fault schedule (``simnccl.faults.generate``);
* ``mutant``: generated cases broken by one mutation (``strategies.mutants``);
* ``workload``: framework startups (every generator) under every ``simnccl cost`` column, some with faults,
  and a Megatron startup that runs out of device memory part way (``out_of_memory_cases``);
* ``scenario``: every variant of every shipped scenario (``simnccl/scenarios/*.toml``), through the runner
  (recovery scenarios through their orchestrator).

A case's id carries a digest of its input, so a drift in generation shows as missing cases, never as a false
difference. Exit codes: 0 every case identical (with ``--semantic``: identical or equivalent), 1 a difference
or a missing case, 2 bad input. The LAST line of ``compare`` is exactly
``compared=<n> identical=<m> equivalent=<e> differing=<d> missing=<k>``.

``compare --semantic`` is for a change that regroups calls into cohort blocks (which changes the trace's
order and its block records, not what any rank does): a case counts as *equivalent* when its fifth field, the
semantic digest, agrees — the verdict, the report with policy explanations as a multiset, and every trace
event except the blocks' own records (``cohort`` lines and cohort meetings) as a multiset, with its time,
rank, memory and ids. Without the flag, equivalent cases count as differing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

SCHEMA = "simnccl-engine-gate/2"  # /2: a fifth field, the semantic digest
SOURCES = ("gen", "mutant", "workload", "scenario")
MODES = (("fast", True), ("slow", False))
CASE_WALL_S = 120.0

# Framework startups under every cost column: (generator, its knobs, world size, cluster GPUs per node).
WORKLOADS: tuple[tuple[str, dict[str, Any], int, int], ...] = (
    ("megatron", {"tp": 2, "pp": 2}, 16, 8),
    ("megatron", {"tp": 4, "pp": 2, "cp": 2}, 32, 8),
    ("megatron", {"tp": 8, "pp": 2}, 64, 8),
    ("vllm", {}, 8, 8),
    ("vllm", {}, 16, 8),
    ("sglang", {}, 16, 8),
    ("torchtitan", {"tp": 2}, 16, 8),
    ("torchtitan", {"tp": 2, "dp_replicate": 2, "device_id": True}, 16, 8),
    ("deepspeed", {}, 16, 8),
    ("deepspeed", {"pp": 2, "zero_stage": 3}, 16, 8),  # PipelineEngine's ZeRO assertion after the engine's groups
    ("deepspeed", {"pp": 2, "zero_stage": 1}, 16, 8),  # the whole pipeline startup: parameter all_reduce, warm-up
)
WORKLOAD_FAULT_SEEDS = (1, 2, 3)
# Weights (MiB) that leave an H100-80GB short of memory for a 16-rank Megatron startup's communicators part way.
OUT_OF_MEMORY_MIB = (76_000, 77_700, 79_000)


def _digest(value: Any) -> str:
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()


def _is_block_layout(event: tuple[Any, ...]) -> bool:
    """A record of how calls were grouped into cohort blocks (a block's per-call line, its meeting), not of
    what any rank did: a fast path may group calls differently and still do the same thing."""
    return len(event) > 1 and (event[1] == "cohort" or (event[1] == "meet" and len(event) > 2 and event[2] == "cohort"))


_FLOAT = re.compile(r"\d+\.\d+(?:e[+-]?\d+)?")


def _canonical(text: str) -> str:
    """``text`` with every decimal number to 9 places: a time summed in another order (a block's clock against
    simpy's ``now + (t - now)``) differs in its last bit, which is no difference in what happened."""
    return _FLOAT.sub(lambda m: f"{float(m.group()):.9f}", text)


def _comm_labels(engine: Any) -> dict[int, str]:
    """Each communicator id of a run, named by what it is: its group and implementation (a send/recv pair's,
    its pair too). Ids are numbered in the order communicators come to exist, which a block (one pass, in call
    order) and ranks on their own (in time order, ties in event order) may number differently for the same
    communicators; meeting keys carry them."""
    labels: dict[int, str] = {}
    for rt in engine.ranks:
        for group in rt.groups:
            for comm in group.comms.values():
                if comm.comm_id is not None:
                    labels[comm.comm_id] = f"{group.name}:{comm.impl}"
                for peer, pair in getattr(comm, "pair_comms", {}).items():
                    labels[pair] = f"{group.name}:{comm.impl}:pair:{sorted((rt.rank, peer))}"
    return labels


def _relabelled(value: Any, labels: dict[int, str]) -> Any:
    """``value`` with the communicator id in every meeting key (``("coll" | "p2p", id, ...)``) named."""
    if isinstance(value, tuple):
        if len(value) > 1 and value[0] in ("coll", "p2p") and isinstance(value[1], int):
            return (value[0], labels.get(value[1], value[1]), *value[2:])
        return tuple(_relabelled(v, labels) for v in value)
    return value


def _semantic_digest(
    outcome: Any, explanations: Sequence[Any], events: Sequence[Any] | None, labels: dict[int, str] | None = None
) -> str:
    """What the run did, blind to the fast paths' layout: every trace event but the block-layout ones, as a
    multiset (events at one time on different ranks have no order a program can see), the policy explanations
    as a multiset, and the report; times to the nanosecond (``_canonical``), communicators by what they are
    (``labels``: ``_comm_labels``). ``events`` is None where the trace was not kept (through the runner)."""
    names = labels or {}
    kept = (
        None
        if events is None
        else sorted(_canonical(repr(_relabelled(e, names))) for e in events if not _is_block_layout(e))
    )
    report = (
        outcome.verdict,
        outcome.hangs,
        outcome.errors,
        sorted(repr(x) for x in explanations),
        sorted(outcome.fr_dumps.items()),
        outcome.slowdowns,
        sorted((label, sorted(per.items())) for label, per in outcome.checkpoints.items()),
        outcome.ops_executed,
        outcome.end_time_s,
        kept,
    )
    return _digest(_canonical(repr(report)))


def _record(
    outcome: Any,
    explanations: Sequence[Any],
    events: Sequence[Any] | None = None,
    labels: dict[int, str] | None = None,
) -> list[Any]:
    report = (
        outcome.hangs,
        outcome.errors,
        list(explanations),
        sorted(outcome.fr_dumps.items()),
        outcome.slowdowns,
        sorted((label, sorted(per.items())) for label, per in outcome.checkpoints.items()),
        outcome.ops_executed,
        outcome.end_time_s,
    )
    semantic = _semantic_digest(outcome, explanations, events, labels)
    return [outcome.verdict, outcome.event_count, outcome.trace_hash, _digest(report), semantic]


def _run(make: Callable[[], tuple[Any, ...]]) -> list[Any]:
    """One case's record; an exception is an outcome too (its type and message)."""
    try:
        outcome, explanations, *kept = make()
    except Exception as err:  # the gate compares what happens, including a raise
        raised = f"{type(err).__name__}: {err}"
        return ["raise", 0, raised, "", _digest(raised)]
    return _record(outcome, explanations, *kept)


def _engine_run(config: Any, fast_path: bool) -> tuple[Any, Sequence[Any], Sequence[Any], dict[int, str]]:
    from simnccl.engine import Engine

    engine = Engine(config, keep_trace=True, fast_path=fast_path)
    outcome = engine.run()
    return outcome, engine.explanations, engine.sim.trace.events, _comm_labels(engine)


# ---------------------------------------------------------------------------------------------- sources


@contextlib.contextmanager
def _without_local_constants() -> Iterator[None]:
    """hypothesis draws now and then from the literals of every "local" module loaded (not in site-packages:
    ``providers._get_local_constants``), and an editable simnccl checkout is local. So a string added to simnccl,
    or one more module imported before the draw, changed the cases the gate drew under one seed (they then
    showed as "missing", and the two records compared fewer simulations). Emptied while the gate draws: its
    cases depend on the seed and the strategies alone. A hypothesis without it draws as it always did."""
    from hypothesis.internal.conjecture import providers

    real = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)  # the pools as first drawn from, per kind of choice
    if real is None or cache is None:  # pragma: no cover - a hypothesis without local constants
        yield
        return
    providers._get_local_constants = providers.Constants  # an empty pool
    providers.CONSTANTS_CACHE = type(cache)(1024)  # and none filled before, from the modules loaded then
    try:
        yield
    finally:
        providers._get_local_constants, providers.CONSTANTS_CACHE = real, cache


def _draw(strategy: Any, count: int, seed: int) -> list[Any]:
    """``count`` examples of ``strategy`` under a fixed seed (hypothesis' generate phase only), whatever the
    modules loaded (``_without_local_constants``)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn: list[Any] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        drawn.append(example)

    with _without_local_constants():
        collect()
    return drawn


def _case_config(case: Any, faults: Any) -> Any:
    """A generated case as a SimConfig: ranks whose op tuples are one object share one Program."""
    from simnccl.cluster import Cluster, get_gpu_kind
    from simnccl.engine import Limits, SimConfig
    from simnccl.ops import Program
    from simnccl.policy import get_policy
    from simnccl.profiles import find_profile
    from simnccl.release import get_release

    shared: dict[int, Program] = {}
    programs = [shared.setdefault(id(ops), Program(tuple(ops))) for ops in case.programs]
    return SimConfig(
        cluster=Cluster(get_gpu_kind(case.gpu), case.nodes, case.gpus_per_node),
        release=get_release(case.release),
        profile=find_profile(case.gpu, case.release),
        programs=programs,
        env=case.env_dict,
        policy=get_policy(case.policy) if case.policy else None,
        faults=faults,
        limits=Limits(wall_s=CASE_WALL_S),
    )


def _case_id(case: Any) -> str:
    sharing = [next(i for i, q in enumerate(case.programs) if q is p) for p in case.programs]
    return _digest((case, sharing))


def generated_cases(count: int, big: int, seed: int) -> Iterator[tuple[str, Callable[[], list[Any]]]]:
    from simnccl.faults import NO_FAULTS, generate
    from simnccl.testing.strategies import cases

    batches = (("gen", cases(), count), ("gen16", cases(min_world=8, max_world=16), big))
    for prefix, strategy, n in batches:
        for i, case in enumerate(_draw(strategy, n, seed)):
            base = f"{prefix}/{i:05d}/{_case_id(case)}"
            programs = _case_config(case, NO_FAULTS).programs
            schedule = generate(seed * 100_003 + i, programs, max_faults=2)
            for faults, suffix in ((NO_FAULTS, ""), (schedule, f"+faults{_digest(schedule)}")):
                for mode, fast in MODES:
                    config = _case_config(case, faults)
                    yield f"{base}{suffix}/{mode}", lambda c=config, f=fast: _run(lambda: _engine_run(c, f))


def mutant_cases(count: int, seed: int) -> Iterator[tuple[str, Callable[[], list[Any]]]]:
    from simnccl.faults import NO_FAULTS
    from simnccl.testing.strategies import mutants

    for i, (case, mutation) in enumerate(_draw(mutants(), count, seed)):
        base = f"mutant/{i:05d}/{_case_id(case)}/{mutation.kind}"
        for mode, fast in MODES:
            config = _case_config(case, NO_FAULTS)
            yield f"{base}/{mode}", lambda c=config, f=fast: _run(lambda: _engine_run(c, f))


def workload_cases() -> Iterator[tuple[str, Callable[[], list[Any]]]]:
    from dataclasses import replace

    from simnccl.cost import build_cluster, column_config, columns_for
    from simnccl.faults import generate
    from simnccl.workloads import generate as workload

    for name, knobs, world, per_node in WORKLOADS:
        programs = workload(name, knobs, world)
        cluster = build_cluster("h100-80gb", world, per_node)
        base = f"workload/{name}/{_digest(sorted(knobs.items()))}/w{world}"
        for column in columns_for(None):
            config = column_config(programs, cluster, "2.15", column)
            for mode, fast in MODES:
                yield f"{base}/{column.name}/{mode}", lambda c=config, f=fast: _run(lambda: _engine_run(c, f))
            for seed in WORKLOAD_FAULT_SEEDS:
                faulted = replace(config, faults=generate(seed, programs, max_faults=2))
                for mode, fast in MODES:
                    key = f"{base}/{column.name}/faults{seed}/{mode}"
                    yield key, lambda c=faulted, f=fast: _run(lambda: _engine_run(c, f))


def out_of_memory_cases() -> Iterator[tuple[str, Callable[[], list[Any]]]]:
    """A Megatron startup whose communicators run out of device memory part way (weights allocated right after
    ``init_process_group``), under every cost column: failures inside cohort blocks and the waits they leave."""
    from simnccl.cost import build_cluster, column_config, columns_for
    from simnccl.ops import Alloc, InitProcessGroup, Program
    from simnccl.workloads import generate as workload

    ops = workload("megatron", {"tp": 2, "pp": 2, "dp": 4}, 16)[0].ops
    at = next(i for i, op in enumerate(ops) if isinstance(op, InitProcessGroup)) + 1
    cluster = build_cluster("h100-80gb", 16, 8)
    for mib in OUT_OF_MEMORY_MIB:
        program = Program((*ops[:at], Alloc(mib=mib), *ops[at:]))
        for column in columns_for(None):
            config = column_config((program,) * 16, cluster, "2.15", column)
            for mode, fast in MODES:
                key = f"workload/megatron-alloc{mib}/{column.name}/{mode}"
                yield key, lambda c=config, f=fast: _run(lambda: _engine_run(c, f))


def scenario_cases() -> Iterator[tuple[str, Callable[[], list[Any]]]]:
    import simnccl
    from simnccl.runner import config_for, run_variant
    from simnccl.scenario import load_scenario

    folder = Path(simnccl.__file__).resolve().parent / "scenarios"
    for path in sorted(folder.glob("*.toml")):
        scenario = load_scenario(path)
        for variant in scenario.variants:
            base = f"scenario/{path.stem}/{variant.name}"

            def through_runner(s: Any = scenario, v: Any = variant) -> tuple[Any, Sequence[Any]]:
                result = run_variant(s, v)
                return result.outcome, result.explanations

            yield f"{base}/runner", lambda m=through_runner: _run(m)
            if scenario.recovery is None:
                config = config_for(scenario, variant)
                for mode, fast in MODES:
                    yield f"{base}/{mode}", lambda c=config, f=fast: _run(lambda: _engine_run(c, f))


# ---------------------------------------------------------------------------------------------- commands


def record(args: argparse.Namespace) -> int:
    import simnccl.engine

    chosen = args.only.split(",") if args.only else list(SOURCES)
    unknown = [name for name in chosen if name not in SOURCES]
    if unknown:
        print(
            f"engine_gate: --only: unknown source {unknown[0]!r}; expected some of {','.join(SOURCES)}", file=sys.stderr
        )
        return 2
    makers: dict[str, Callable[[], Iterator[tuple[str, Callable[[], list[Any]]]]]] = {
        "gen": lambda: generated_cases(args.generated, args.generated_big, args.seed),
        "mutant": lambda: mutant_cases(args.mutants, args.seed),
        "workload": lambda: chain(workload_cases(), out_of_memory_cases()),
        "scenario": scenario_cases,
    }
    sources = [makers[name]() for name in SOURCES if name in chosen]
    results: dict[str, list[Any]] = {}
    start = time.perf_counter()
    for source in sources:
        for key, run in source:
            if key in results:  # pragma: no cover - ids carry the input's digest and the mode
                raise AssertionError(f"engine_gate: duplicate case id {key}")
            results[key] = run()
    wall = time.perf_counter() - start
    verdicts: dict[str, int] = {}
    for value in results.values():
        verdicts[value[0]] = verdicts.get(value[0], 0) + 1
    out = {"schema": SCHEMA, "engine": simnccl.engine.__file__, "wall_s": round(wall, 1), "cases": results}
    Path(args.out).write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"engine: {simnccl.engine.__file__}")
    print(f"recorded {len(results)} simulations in {wall:.1f} s; verdicts {dict(sorted(verdicts.items()))}")
    print(f"wrote {args.out}")
    return 0


def _load(path: str) -> dict[str, list[Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"engine_gate: {path}: cannot read a gate record ({err})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("cases"), dict):
        raise SystemExit(f"engine_gate: {path}: key 'schema': expected {SCHEMA!r} with a 'cases' table")
    return data["cases"]


def compare(args: argparse.Namespace) -> int:
    try:
        before, after = _load(args.before), _load(args.after)
    except SystemExit as err:
        print(err, file=sys.stderr)
        return 2
    fields = ("verdict", "event_count", "trace_hash", "report_digest", "semantic_digest")
    missing = sorted(set(before) ^ set(after))
    common = sorted(set(before) & set(after))
    differing = [key for key in common if before[key] != after[key]]
    # --semantic: a case whose trace differs only in block layout (same events as a multiset, same report)
    # is equivalent, not differing; every other difference still fails.
    equivalent = [key for key in differing if args.semantic and before[key][4:] == after[key][4:]]
    failing = [key for key in differing if key not in set(equivalent)]
    for key in missing[: args.show]:
        print(f"missing in {'after' if key in before else 'before'}: {key}")
    for key in failing[: args.show]:
        which = [f for f, a, b in zip(fields, before[key], after[key], strict=True) if a != b]
        print(f"differs ({', '.join(which)}): {key}\n  before {before[key]}\n  after  {after[key]}")
    by_source: dict[str, int] = {}
    for key in common:
        by_source[key.split("/", 1)[0]] = by_source.get(key.split("/", 1)[0], 0) + 1
    print(f"per source: {dict(sorted(by_source.items()))}")
    if args.semantic:
        by_source = {}
        for key in equivalent:
            by_source[key.split("/", 1)[0]] = by_source.get(key.split("/", 1)[0], 0) + 1
        print(f"equivalent per source: {dict(sorted(by_source.items()))}")
    identical = len(common) - len(differing)
    print(
        f"compared={len(common)} identical={identical} equivalent={len(equivalent)} "
        f"differing={len(failing)} missing={len(missing)}"
    )
    return 0 if not failing and not missing else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="simulate every case with the importable engine; write OUT (JSON)")
    rec.add_argument("out")
    rec.add_argument("--generated", type=int, default=1500, help="generated cases of 1-8 ranks")
    rec.add_argument("--generated-big", type=int, default=200, help="generated cases of 8-16 ranks")
    rec.add_argument("--mutants", type=int, default=400, help="generated mutants")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--only", default="", help=f"comma-separated sources (default: all of {','.join(SOURCES)})")
    cmp = sub.add_parser("compare", help="compare two records; exit 1 on any difference")
    cmp.add_argument("before")
    cmp.add_argument("after")
    cmp.add_argument("--show", type=int, default=20, help="differences to print")
    cmp.add_argument(
        "--semantic",
        action="store_true",
        help="a case whose trace differs only in cohort-block layout (same events as a multiset) is equivalent",
    )
    args = parser.parse_args(argv)
    return record(args) if args.command == "record" else compare(args)


if __name__ == "__main__":
    sys.exit(main())

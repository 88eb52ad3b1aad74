"""Engine throughput on an "enumerate-everything" startup, as a ratio to raw simpy measured in the same run.

Run: ``python benchmarks/engine.py [--quick]`` (``--quick``: W=512 only and a small baseline).

What is measured, all in ONE process (so that the ratio cancels out the machine):

1. **Raw simpy baseline.** ``P`` simpy processes each yield ``N`` ``env.timeout(0)`` events; the loop's
   throughput is ``simpy_events_per_s = P * N / wall``. It is the floor of what any simpy engine can do per
   scheduled event on this machine and interpreter.
2. **The simnccl engine** on a synthetic Megatron-style startup at world size W (W/8 nodes of 8 H100-80GB,
   torch 2.15, the built-in h100-80gb profile). Every rank issues EVERY ``new_group`` call of every
   partition — tp (8, contiguous), cp, dp, pp (strided), dp-cp, tp-cp, tp-pp, tp-dp-cp, tp-dp, the optimizer's
   intra/inter dp split, embedding pairs, position-embedding singletons, ep, expert-tp (singletons with
   etp=1), tp-ep, tp-ep-pp, expert-dp, plus duplicates (a second tp, a cp-a2a that equals cp), an all-ranks
   group and a singleton per rank. The program is built once and the same ``Program`` object is given to every
   rank (DESIGN rule 8). At W=512 a rank makes 2,765 ``new_group`` calls and is a member of 20-22 groups. Then
   one ``all_reduce`` on tp and one on dp, then ``checkpoint("startup")``.

Figures (per size):

* ``ops/s`` = ``outcome.ops_executed / wall`` — program ops executed over all ranks per wall second, member
  or not (a non-member ``new_group`` counts as one op). ``wall`` covers ``Engine(...)`` plus ``run()``;
  building the shared program is timed separately.
* ``memberships/s`` = (sum over ranks of the groups the rank is a member of, not counting the default
  group) / wall.
* ``events`` = ``outcome.event_count`` (the engine's recorded trace events; reported, not used in the ratio).
* ``cpu_s``: this process's CPU seconds over the same span as ``wall`` (on a shared machine the figure to compare).
* ``peak RSS of the run`` (under a finished size): the kernel's peak RSS count, reset just before ``Engine(...)``
  and read when ``run()`` returns, so neither an earlier size nor this size's checks count (the process's
  peak, printed last, has both).
* ``materialisation floor`` (``--floor``, under a finished size): ``materialisation_floor``, the seconds to build
  only what the run leaves behind per membership (its Group and Comm, two trace events, a device and a host
  ledger change, its group record entry), nothing decided: the least an engine that decides once per rank class
  but keeps one object per member could take.
* ``distinct histories`` (the line under a finished size): the device ledgers grouped by their history up to
  relabelling (``ledger_histories``), the state an engine holding it once per rank class would keep.

**Ratio** (``ratio=`` on the last line): ``engine ops/s at W=512 / raw simpy events/s``. 1.0 would mean an op
costs the engine what one bare ``timeout(0)`` costs simpy; higher is better. A Megatron startup is mostly
non-member ``new_group`` calls, which DESIGN rule 8 wants nearly free, so this ratio is the number to move.

Each size runs under a wall budget (``Limits(wall_s=...)``; ``EngineGuardError`` is caught) and an RSS cap
(a watcher thread interrupts the run), so an infeasible size is reported, never hung on. Each finished run is
checked: verdict "pass", every rank a member of exactly the groups the builder predicts, and every device's
memory = CUDA context + (memberships + default group) x per-group init cost + first-collective cost of tp and
dp. A failed check exits 1.

The LAST line is exactly::

    ratio=<r> w512_s=<s> w4096_s=<s> w16384_s=<s>

``<s>`` is the wall seconds of a finished run (3 decimals); ``>B`` means the size hit its budget of B seconds
(wall or memory guard) and did not finish; ``nan`` means the size was not attempted (``--quick``,
``--sizes``).
``ratio`` is ``nan`` unless W=512 finished.
"""

from __future__ import annotations

import _thread
import argparse
import gc
import math
import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import simpy

from simnccl.backends import Comm
from simnccl.c10d import Group
from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.comm_memory import Pricer
from simnccl.engine import Engine, EngineGuardError, Limits, RunOutcome, SimConfig
from simnccl.engine.sim import Trace
from simnccl.memory import DeviceLedger, Owner
from simnccl.ops import NO_OPTIONS, AllReduce, Checkpoint, InitProcessGroup, NewGroup, Op, Program, SetDevice
from simnccl.profiles import find_profile
from simnccl.release import Impl, get_release

GPU = "h100-80gb"
RELEASE = "2.15"
GPUS_PER_NODE = 8
REPORTED_SIZES = (512, 4096, 16384)
DEFAULT_BUDGET_S = {512: 300.0, 4096: 120.0, 16384: 120.0}
DEFAULT_MEM_CAP_GIB = 8.0
COLLECTIVE_HANDLES = ("tp", "dp")  # one all_reduce each, after group creation

Ranks = tuple[int, ...]


# ---------------------------------------------------------------------------------------------- the program


@dataclass(frozen=True, slots=True)
class Dims:
    """Megatron-style parallel sizes. dp and expert-dp follow from the world size."""

    tp: int = 8
    cp: int = 2
    pp: int = 4
    ep: int = 8
    optimizer_instances: int = 2  # distributed-optimizer instances: dp = intra (dp/n) x inter (n)

    def dp(self, world: int) -> int:
        return world // (self.tp * self.cp * self.pp)

    def edp(self, world: int) -> int:
        return world // (self.ep * self.pp)  # expert-tp is 1

    def check(self, world: int) -> None:
        dense = self.tp * self.cp * self.pp
        if world % dense or world % (self.ep * self.pp) or world % GPUS_PER_NODE:
            raise ValueError(f"world {world} is not divisible by tp*cp*pp={dense}, ep*pp and {GPUS_PER_NODE}")
        if self.dp(world) % self.optimizer_instances:
            raise ValueError(f"dp={self.dp(world)} is not divisible by {self.optimizer_instances} optimizer instances")


@dataclass(frozen=True, slots=True)
class Partition:
    """One framework loop: ``for ranks in groups: g = new_group(ranks); if rank in ranks: <bind> = g``."""

    bind: str
    groups: tuple[Ranks, ...]


def _grid_groups(sizes: Sequence[tuple[str, int]], vary: set[str]) -> tuple[Ranks, ...]:
    """Groups of a rank grid (first dim fastest): ranks that differ only along ``vary``, one group per fix.

    A group is its first rank plus the same offsets as every other group (sorted once), so building the
    131,072-rank startup costs one addition per membership, not a sum over the dims per rank."""
    strides: dict[str, int] = {}
    stride = 1
    for name, size in sizes:
        strides[name] = stride
        stride *= size

    def offsets(dims: Sequence[tuple[str, int]]) -> list[int]:
        """Every combination's offset, the last dim outermost (``itertools.product`` order)."""
        out = [0]
        for name, size in dims:
            out = [o + c * strides[name] for c in range(size) for o in out]
        return out

    fixed = [(n, s) for n, s in sizes if n not in vary]
    varying = sorted(offsets([(n, s) for n, s in sizes if n in vary]))
    return tuple(tuple([base + o for o in varying]) for base in offsets(fixed))


def megatron_partitions(world: int, dims: Dims = Dims()) -> tuple[Partition, ...]:
    """Every group loop of a Megatron-like ``initialize_model_parallel``, in call order."""
    dims.check(world)
    dp = dims.dp(world)
    inter = dims.optimizer_instances
    dense = [("tp", dims.tp), ("cp", dims.cp), ("dp", dp), ("pp", dims.pp)]
    # The distributed optimizer splits dp into intra (contiguous in dp) x inter instances.
    split_dp = [("tp", dims.tp), ("cp", dims.cp), ("intra", dp // inter), ("inter", inter), ("pp", dims.pp)]
    expert = [("etp", 1), ("ep", dims.ep), ("edp", dims.edp(world)), ("pp", dims.pp)]
    pp_groups = _grid_groups(dense, {"pp"})
    parts = [
        Partition("tp", _grid_groups(dense, {"tp"})),
        Partition("cp", _grid_groups(dense, {"cp"})),
        Partition("dp", _grid_groups(dense, {"dp"})),
        Partition("pp", pp_groups),
        Partition("dp_cp", _grid_groups(dense, {"dp", "cp"})),
        Partition("tp_cp", _grid_groups(dense, {"tp", "cp"})),
        Partition("mp", _grid_groups(dense, {"tp", "pp"})),
        Partition("tp_dp_cp", _grid_groups(dense, {"tp", "dp", "cp"})),
        Partition("tp_dp", _grid_groups(dense, {"tp", "dp"})),
        Partition("intra_dp", _grid_groups(split_dp, {"intra"})),
        Partition("inter_dp", _grid_groups(split_dp, {"inter"})),
        Partition("embedding", tuple((g[0], g[-1]) if len(g) > 1 else g for g in pp_groups)),
        Partition("position_embedding", tuple((g[0],) for g in pp_groups)),
        Partition("ep", _grid_groups(expert, {"ep"})),
        Partition("expert_tp", _grid_groups(expert, {"etp"})),  # etp=1: singletons
        Partition("tp_ep", _grid_groups(expert, {"etp", "ep"})),  # etp=1: duplicates ep
        Partition("tp_ep_pp", _grid_groups(expert, {"etp", "ep", "pp"})),
        Partition("expert_dp", _grid_groups(expert, {"edp"})),
        Partition("cp_a2a", _grid_groups(dense, {"cp"})),  # hierarchical cp at cp=2: duplicates cp
        Partition("tp_again", _grid_groups(dense, {"tp"})),  # a duplicate loop, as frameworks do
        Partition("all", (tuple(range(world)),)),
        Partition("self", tuple((r,) for r in range(world))),
    ]
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class Startup:
    """The shared program and what the builder promises about it (checked against the engine's outcome)."""

    world: int
    program: Program
    partitions: tuple[Partition, ...]
    new_group_calls: int  # per rank: every rank issues every call
    memberships: tuple[int, ...]  # per rank, excluding the default group
    singleton_memberships: tuple[int, ...]  # per rank, 1-rank groups among them


def build_startup(world: int, dims: Dims = Dims()) -> Startup:
    parts = megatron_partitions(world, dims)
    ops: list[Op] = [SetDevice(), InitProcessGroup(backend="nccl")]
    members = [0] * world
    singles = [0] * world
    for part in parts:
        for ranks in part.groups:
            ops.append(NewGroup(ranks=ranks, bind=part.bind, purpose=part.bind))
            for r in ranks:
                members[r] += 1
                if len(ranks) == 1:
                    singles[r] += 1
    calls = len(ops) - 2
    ops += [AllReduce(group=h) for h in COLLECTIVE_HANDLES]
    ops.append(Checkpoint(label="startup"))
    return Startup(world, Program(tuple(ops)), parts, calls, tuple(members), tuple(singles))


def make_config(startup: Startup, wall_s: float) -> SimConfig:
    world = startup.world
    cluster = Cluster(get_gpu_kind(GPU), nodes=world // GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE)
    return SimConfig(
        cluster=cluster,
        release=get_release(RELEASE),
        profile=find_profile(GPU, RELEASE),
        programs=[startup.program] * world,  # one shared object (DESIGN rule 8)
        # A shared-program startup legitimately executes W x len(program) ops (1.3 G at W=16384), past the
        # default max_ops runaway guard; the wall budget is what bounds this benchmark.
        limits=Limits(wall_s=wall_s, max_ops=max(Limits().max_ops, 2 * world * len(startup.program))),
    )


# ---------------------------------------------------------------------------------------------- checks


def expected_comm_bytes(
    startup: Startup, pricer: Pricer, rank: int, joined: Sequence[tuple[str, Ranks]], world: Ranks
) -> int:
    """Default group + every membership at its init (NCCL's mechanics, ``simnccl.comm_memory``), tp and dp's
    first all_reduce, and the profile's once-per-process overheads (first communicator, first collective).
    ``joined``: the (bind, ranks) of every group ``rank`` is a member of; ``world``: every rank, one tuple."""
    total = pricer.create(world, rank, {}).breakdown.device_bytes
    for bind, ranks in joined:
        memory = pricer.create(ranks, ranks.index(rank), {})
        if bind in COLLECTIVE_HANDLES:
            pricer.use(memory, "all_reduce", AllReduce().size_bytes)
        total += memory.breakdown.device_bytes
    return total + pricer.process_bytes + pricer.process_first_collective_bytes


def memberships_by_rank(startup: Startup) -> list[list[tuple[str, Ranks]]]:
    """Per rank, the (bind, ranks) of each group it is a member of, in call order: one pass over the groups,
    so checking a run costs its memberships, not ranks x groups (quadratic at 131,072 ranks)."""
    joined: list[list[tuple[str, Ranks]]] = [[] for _ in range(startup.world)]
    for part in startup.partitions:
        for ranks in part.groups:
            for r in ranks:
                joined[r].append((part.bind, ranks))
    return joined


def check_outcome(startup: Startup, config: SimConfig, outcome: RunOutcome) -> list[str]:
    """Everything wrong with a run, as sentences; empty when the run is right."""
    problems: list[str] = []
    if outcome.verdict != "pass":
        detail = (outcome.errors or outcome.hangs or [{}])[0]
        problems.append(f"verdict {outcome.verdict!r}, expected 'pass': {detail}")
    expected_ops = startup.world * len(startup.program)
    if outcome.ops_executed != expected_ops:
        problems.append(f"{outcome.ops_executed} ops executed, expected {expected_ops}")
    context = config.cluster.gpu.cuda_context_bytes
    pricer = Pricer(config.profile, config.cluster.node_of)
    joined_by_rank = memberships_by_rank(startup)
    world = tuple(range(startup.world))  # one object: the pricer counts its nodes once
    for rt in outcome.ranks:
        joined = len(rt.groups) - 1  # rt.groups holds the default group too
        if joined != startup.memberships[rt.rank]:
            problems.append(f"rank {rt.rank} joined {joined} groups, builder expects {startup.memberships[rt.rank]}")
        device = config.cluster.device(config.cluster.node_of(rt.rank), config.cluster.local_rank(rt.rank))
        ledger = outcome.ledgers[device.key]
        want = context + expected_comm_bytes(startup, pricer, rt.rank, joined_by_rank[rt.rank], world)
        if ledger.used_bytes != want:
            problems.append(f"rank {rt.rank} on {device.key}: {ledger.used_bytes} bytes used, expected {want}")
        if len(problems) > 10:
            problems.append("... (stopped after 10)")
            break
    return problems


# ---------------------------------------------------------------------------------------------- measuring


@dataclass(slots=True)
class Baseline:
    processes: int
    events_each: int
    wall_s: float

    @property
    def events(self) -> int:
        return self.processes * self.events_each

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s


def run_baseline(processes: int, events_each: int) -> Baseline:
    """``processes`` simpy processes, each yielding ``events_each`` zero-delay timeouts."""
    env = simpy.Environment()

    def proc(env: simpy.Environment, n: int):  # type: ignore[no-untyped-def]
        for _ in range(n):
            yield env.timeout(0)

    for _ in range(processes):
        env.process(proc(env, events_each))
    start = time.perf_counter()
    env.run()
    return Baseline(processes, events_each, time.perf_counter() - start)


@dataclass(slots=True)
class SizeResult:
    world: int
    budget_s: float
    status: str  # "ok" | "budget" | "memory" | "fail"
    build_s: float = 0.0
    wall_s: float = math.nan
    cpu_s: float = math.nan  # this process's CPU seconds over the same span (a shared machine's honest figure)
    calls_per_rank: int = 0
    memberships: int = 0
    ops: int = 0
    events: int = 0
    note: str = ""
    problems: list[str] = field(default_factory=list)
    histories: list[int] = field(default_factory=list)  # devices per distinct ledger history, largest first
    run_peak_gib: float = math.nan  # peak RSS from Engine(...) to the end of run() (nan: not measurable here)
    run_peak_is_process: bool = False  # the peak could not be reset: it is the process's peak so far
    floor_s: float = math.nan  # ``materialisation_floor`` of this startup (``--floor``; nan: not measured)

    @property
    def finished(self) -> bool:
        return self.status in ("ok", "fail")

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.wall_s if self.finished else math.nan

    @property
    def memberships_per_s(self) -> float:
        return self.memberships / self.wall_s if self.finished else math.nan


class _MemoryWatch:
    """Interrupts the main thread when this process's RSS passes a cap (a run's meetings can outgrow RAM)."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.tripped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.25):
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if rss > self.cap_bytes:
                self.tripped = True
                _thread.interrupt_main()
                return


def run_size(
    world: int, budget_s: float, mem_cap_bytes: int, dims: Dims = Dims(), *, floor: bool = False
) -> SizeResult:
    result = SizeResult(world, budget_s, "ok")
    t0 = time.perf_counter()
    startup = build_startup(world, dims)
    result.build_s = time.perf_counter() - t0
    result.calls_per_rank = startup.new_group_calls
    result.memberships = sum(startup.memberships)
    config = make_config(startup, budget_s)
    watch = _MemoryWatch(mem_cap_bytes)
    outcome = None
    try:
        with watch:
            result.run_peak_is_process = not _reset_peak_rss()
            start, cpu_start = time.perf_counter(), time.process_time()
            engine = Engine(config)
            outcome = engine.run()
            result.wall_s = time.perf_counter() - start
            result.cpu_s = time.process_time() - cpu_start
            result.run_peak_gib = _peak_rss_gib()
            result.histories = ledger_histories(engine.ledgers.values())
            del engine
    except EngineGuardError as err:
        result.status, result.note = "budget", str(err)
    except KeyboardInterrupt:
        if not watch.tripped:
            raise
        result.status = "memory"
        result.note = f"RSS passed {mem_cap_bytes / 2**30:.1f} GiB after {time.perf_counter() - start:.0f} s"
    if outcome is not None:
        result.ops, result.events = outcome.ops_executed, outcome.event_count
        result.problems = check_outcome(startup, config, outcome)
        if result.problems:
            result.status = "fail"
    del outcome, config
    gc.collect()
    if floor and result.finished:  # after the run and its checks are freed: the floor's objects are its own
        result.floor_s = materialisation_floor(startup)[0]
        gc.collect()
    del startup
    return result


def materialisation_floor(startup: Startup, gpus_per_node: int = GPUS_PER_NODE) -> tuple[float, int]:
    """Wall seconds (and memberships) to build, for every membership, only what a run leaves behind for it and
    no engine can skip while it keeps one object per member: its ``Group`` and ``Comm``, its two trace events
    (the call and the allocation), its device ledger change and its node's host ledger change, and its group
    record entry. Nothing is decided, planned, priced or checked.

    Why: it bounds from below what an engine that decides once per rank class and then materialises every member
    could reach, so the gap between ``wall_s`` and this is the part such an engine can remove (measured at
    16,384 ranks: 3.43 s against a 20.8 s run, ``--floor``). Below it only lazy per-member views help."""
    world = startup.world
    ledgers = [DeviceLedger(f"n{r // gpus_per_node}:{r % gpus_per_node}", 2**40) for r in range(world)]
    hosts = [DeviceLedger(f"n{n}:host", 2**62) for n in range(-(-world // gpus_per_node))]
    trace = Trace(False)
    records: dict[str, dict[int, dict[str, object]]] = {}
    groups: list[list[Group]] = [[] for _ in range(world)]
    joined = memberships_by_rank(startup)  # the startup's groups: one tuple object per group, as in the run
    position_of: dict[int, dict[int, int]] = {}
    init_bytes, host_bytes, now = 300 * 2**20, 2**20, 1.5
    count = 0
    enabled = gc.isenabled()
    gc.disable()  # as the engine's run does: the cyclic GC would walk every object made so far, again and again
    start = time.perf_counter()
    for rank, memberships in enumerate(joined):
        device, host, local = ledgers[rank], hosts[rank // gpus_per_node], rank % gpus_per_node
        for index, (bind, ranks) in enumerate(memberships):
            name = f"{bind}{index}"
            positions = position_of.get(id(ranks))
            if positions is None:  # one index per group, as the engine's ``Members`` (a scan is quadratic)
                positions = position_of[id(ranks)] = {r: i for i, r in enumerate(ranks)}
            group = Group(
                name=name,
                desc="",
                ranks=ranks,
                rank_in_group=positions[rank],
                backend=None,  # type: ignore[arg-type]
                bound_device=local,
                timeout_s=600.0,
                options=NO_OPTIONS,
            )
            groups[rank].append(group)
            group.comms["cuda"] = Comm(
                impl=Impl.NCCL2,
                group=name,
                size=len(ranks),
                device=local,
                lazy_init=False,
                via_split=True,
                shared=False,
                parent=None,
            )
            trace.record(now, rank, "new_group", name, "digest")
            owner = Owner("comm", rank, name, "init")
            device.allocate(owner, init_bytes, time_s=now, op=None, nccl=True)
            trace.record(now, rank, "alloc", device.device, name, "init", init_bytes)
            host.allocate(owner, host_bytes, time_s=now, op=None)
            records.setdefault(name, {})[rank] = {"device": device.device, "bytes": init_bytes, "phases": {}}
            count += 1
    trace.digest()
    elapsed = time.perf_counter() - start
    if enabled:
        gc.enable()
    return elapsed, count


def _reset_peak_rss() -> bool:
    """Start the kernel's peak-RSS count (VmHWM) afresh (Linux: ``5`` to ``/proc/self/clear_refs``), so the next
    reading is one run's peak, not an earlier size's or the checks'; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_gib() -> float:
    """VmHWM, the peak RSS since the last reset (nan where ``/proc`` has none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    return math.nan


def ledger_histories(ledgers: Iterable[DeviceLedger]) -> list[int]:
    """How many devices share each ledger history (the (owner kind, phase, bytes) of every change, in order),
    largest first.

    Why: it is what an engine that holds state once per rank class would hold. Devices alike up to relabelling
    (which rank, which group) are one history; this run paid for every device one by one (measured at 4,096
    ranks: 4,096 ledgers, 3 histories)."""
    counts = Counter(tuple((e.owner.kind, e.owner.phase, e.delta_bytes) for e in ledger.timeline) for ledger in ledgers)
    return sorted(counts.values(), reverse=True)


# ---------------------------------------------------------------------------------------------- output


def _seconds_field(result: SizeResult | None) -> str:
    if result is None:
        return "nan"
    if not result.finished:
        return f">{result.budget_s:g}"
    return f"{result.wall_s:.3f}"


def last_line(ratio: float, results: dict[int, SizeResult]) -> str:
    sizes = " ".join(f"w{w}_s={_seconds_field(results.get(w))}" for w in REPORTED_SIZES)
    return f"ratio={'nan' if math.isnan(ratio) else f'{ratio:.4f}'} {sizes}"


def parse_last_line(line: str) -> dict[str, float | str]:
    """``{"ratio": float, "w512_s": float | ">B" | nan, ...}``; raises ValueError on any other shape."""
    keys = ["ratio", *(f"w{w}_s" for w in REPORTED_SIZES)]
    parts = line.strip().split(" ")
    if len(parts) != len(keys):
        raise ValueError(f"expected {len(keys)} fields, got {line!r}")
    out: dict[str, float | str] = {}
    for key, part in zip(keys, parts, strict=True):
        name, sep, value = part.partition("=")
        if name != key or not sep:
            raise ValueError(f"expected {key}=..., got {part!r}")
        if value.startswith(">") and key != "ratio":
            float(value[1:])
            out[key] = value
        else:
            out[key] = float(value)  # accepts "nan"
    return out


def _fmt(x: float, spec: str) -> str:
    return "-" if math.isnan(x) else format(x, spec)


def print_table(baseline: Baseline, results: list[SizeResult], ratio: float) -> None:
    print(
        f"raw simpy: {baseline.processes} processes x {baseline.events_each} timeout(0) = "
        f"{baseline.events:,} events in {baseline.wall_s:.3f} s -> {baseline.events_per_s:,.0f} events/s"
    )
    header = (
        f"{'W':>6} {'calls/rank':>10} {'memberships':>11} {'ops':>12} {'events':>10} {'build_s':>8} "
        f"{'wall_s':>9} {'cpu_s':>9} {'ops/s':>10} {'member/s':>9} {'ops/s:simpy':>11}  status"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        rel = r.ops_per_s / baseline.events_per_s
        wall = _fmt(r.wall_s, ".3f") if r.finished else f">{r.budget_s:g}"
        print(
            f"{r.world:>6} {r.calls_per_rank:>10,} {r.memberships:>11,} {r.ops:>12,} {r.events:>10,} "
            f"{r.build_s:>8.3f} {wall:>9} {_fmt(r.cpu_s, '.3f'):>9} {_fmt(r.ops_per_s, ',.0f'):>10} "
            f"{_fmt(r.memberships_per_s, ',.0f'):>9} {_fmt(rel, '.4f'):>11}  {r.status}"
            + (f" ({r.note})" if r.note else "")
        )
        for p in r.problems:
            print(f"       FAIL: {p}")
        if not math.isnan(r.floor_s):
            per = 1e6 * r.floor_s / r.memberships if r.memberships else math.nan
            print(
                f"       materialisation floor: {r.floor_s:.2f} s ({per:.1f} us a membership; the run: "
                f"{1e6 * r.wall_s / r.memberships:.1f}), {r.wall_s / r.floor_s:.1f}x below the run"
            )
        if r.finished and not math.isnan(r.run_peak_gib):
            since = "the process's peak so far" if r.run_peak_is_process else "from Engine() to the end of run()"
            print(f"       peak RSS of the run: {r.run_peak_gib:.2f} GiB ({since})")
        if r.histories:
            shown = ", ".join(f"{n:,}" for n in r.histories[:6]) + (", ..." if len(r.histories) > 6 else "")
            print(
                f"       {sum(r.histories):,} device ledgers, {len(r.histories):,} distinct histories "
                f"(devices each: {shown})"
            )
    print(f"ratio = engine ops/s at W=512 / raw simpy events/s = {_fmt(ratio, '.4f')}")
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux
    print(f"peak RSS of this process: {peak_gib:.2f} GiB")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="W=512 only, small baseline")
    parser.add_argument("--sizes", default=None, help="comma-separated world sizes (default 512,4096,16384)")
    parser.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="W=S",
        help="wall budget in seconds for size W (repeatable)",
    )
    parser.add_argument(
        "--dims",
        default=None,
        metavar="TP,CP,PP,EP",
        help="parallel sizes (default 8,2,4,8); small ones make tiny worlds possible",
    )
    parser.add_argument(
        "--mem-cap-gib",
        type=float,
        default=DEFAULT_MEM_CAP_GIB,
        help="RSS cap per run; a run past it is reported as over budget",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time materialisation_floor after each finished size (what building every member's state costs)",
    )
    args = parser.parse_args(argv)

    sizes = [512] if args.quick else list(REPORTED_SIZES)
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    budgets = dict(DEFAULT_BUDGET_S)
    for item in args.budget:
        w, _, s = item.partition("=")
        budgets[int(w)] = float(s)
    mem_cap = int(args.mem_cap_gib * 2**30)
    dims = Dims()
    if args.dims:
        tp, cp, pp, ep = (int(x) for x in args.dims.split(","))
        dims = Dims(tp=tp, cp=cp, pp=pp, ep=ep)

    print(
        f"simnccl engine benchmark: {GPU}, torch {RELEASE}, python {sys.version.split()[0]}, simpy {simpy.__version__}",
        flush=True,
    )
    baseline = run_baseline(512, 200 if args.quick else 2000)
    results: dict[int, SizeResult] = {}
    for world in sizes:
        print(f"W={world}: running (budget {budgets.get(world, 300.0):g} s) ...", flush=True)
        results[world] = run_size(world, budgets.get(world, 300.0), mem_cap, dims, floor=args.floor)
    w512 = results.get(512)
    ratio = w512.ops_per_s / baseline.events_per_s if w512 is not None and w512.finished else math.nan
    print_table(baseline, list(results.values()), ratio)
    failed = any(r.status == "fail" for r in results.values())
    print(last_line(ratio, results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``simnccl cost``: what a framework's startup costs per rank, on torch's default, legacy and every policy.

    simnccl cost --workload megatron --tp 8 --pp 4 --dp 16 --gpu h100-80gb --release 2.15 [--policy P ...]
    simnccl cost --scenario scenarios/nvls-multicast-exhaustion.toml [--policy P ...]

Every number comes from simulating the startup (the workload generator's Programs through the engine), one
run per column, never from a formula: the columns are torch's default on the release, the legacy rollback
(``TORCH_DIST_USE_NCCL2=0``) and each built-in policy (or the ``--policy`` specs given). Rows, per rank and
summarised as ``typical [min-max]`` over ranks (typical = the most common value):

* ``new_group calls``: group-creation calls the rank's program makes (``new_group`` and ``split_group``);
* ``groups held``: process groups the rank ends up a member of (the default group not counted);
* ``singleton groups`` / ``duplicate groups``: of those, the 1-rank ones, and the ones whose rank set and
  backend repeat a group the rank already held (the default group included);
* ``NCCL comms at startup``: communicators that allocated GPU memory on the rank (fresh, split or pair);
* ``NCCL MiB / device`` and ``used MiB / device``: the communicators' memory, and everything on the device
  (CUDA context included);
* ``peak used MiB / device``: the device's highest use over the whole run.

Every row but the peak is read at one moment: the startup checkpoint where there is one, else the end of the run.

The Programs are generated once; the columns then run in this process or in worker processes (``--jobs``;
``simnccl.cost_runs``), each with its progress bar on a terminal, and Ctrl-C prints the table of the columns
that finished (exit 130).
``--breakdown`` adds where the NCCL MiB come from (``simnccl.cost_breakdown``: channels x buffers, NVLS,
network shared buffers, fixed overheads; paid at init or at a first use; NVLS multicast slots, pinned host
memory) and each communicator of the rank holding the most; the JSON always carries it (``breakdown``).

Framework knobs are the generator's own (``--tp 8``, ``--gloo false``, ``--hierarchical-cp 2,2``; a boolean
may be given bare, ``--moe``, or negated, ``--no-gloo``); an unknown flag is bad input (exit 2). The world
is the one the knobs pin down (tp*pp*dp ...), else ``--world``.

``--scenario FILE`` prices a scenario's own workload instead (``simnccl.cost_scenario``): one column per
variant of the file (its env, policy, release and profile), plus one per ``--policy`` given.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simnccl import cost_breakdown
from simnccl.cli_options import OverrideError, add_common, check_env, check_json_target, env_overrides
from simnccl.cluster import Cluster, ClusterError, get_gpu_kind
from simnccl.cost_runs import ColumnRunner, Finished, default_jobs, gc_paused, progress_reported
from simnccl.engine import Engine, EngineGuardError, RunOutcome, SimConfig
from simnccl.engine.policy_gate import APPLY_ERROR_TYPE
from simnccl.engine.state import device_name, measured_device
from simnccl.interrupt_deferral import interruption
from simnccl.limits import current as current_limits
from simnccl.memory import comm_holdings
from simnccl.ops import NewGroup, Program, SplitGroup
from simnccl.plain_table import plain_table
from simnccl.policy import BUILTIN, PolicyError, get_policy
from simnccl.profiles import Profile, ProfileError, find_profile
from simnccl.release import RELEASES, get_release
from simnccl.report import typical
from simnccl.result import SummaryLine
from simnccl.runner import current_journal, default_limits, limit_hint
from simnccl.workloads import GENERATORS, Generator, WorkloadError
from simnccl.workloads._common import BOOL

if TYPE_CHECKING:
    from simnccl.cli_output import Output

EXIT_OK, EXIT_POLICY_DEFECT, EXIT_BAD_INPUT = 0, 1, 2
LEGACY_ENV = {"TORCH_DIST_USE_NCCL2": "0"}
CHECKPOINTS = ("startup", "before_memory_check")
DEFAULT_POLICIES = tuple(name for name in BUILTIN if name not in ("torch-default", "legacy"))

ROWS = (
    ("calls", "new_group calls"),
    ("groups", "groups held"),
    ("singletons", "singleton groups"),
    ("duplicates", "duplicate groups"),
    ("comms", "NCCL comms at startup"),
    ("nccl_mib", "NCCL MiB / device"),
    ("used_mib", "used MiB / device"),
)
# The device's highest use over the whole run: the rows above are read at one moment (the checkpoint, else the
# end of the run), which may be below it (groups destroyed at the end read 0 comms). Not one of ``ROWS``, which
# are also the sweep's figures.
PEAK_ROW = ("peak_mib", "peak used MiB / device")


class CostError(ValueError):
    """Bad input to ``simnccl cost``."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    env: dict[str, str]
    policy: str | None
    release: str | None = None  # a scenario variant's own release and profile (None: the command's)
    profile: Profile | None = None


@dataclass(slots=True)
class ColumnResult:
    column: Column
    verdict: str
    per_rank: dict[str, list[float]]
    wall_s: float
    checkpoint: str | None
    error: str = ""
    summary: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    stopped: bool = False  # the engine's guard stopped it at a size limit: no figures
    # A defect of its policy, not a figure of torch's (exit 1): its members disagreed (PolicyInconsistency, which
    # would hang or crash real torch), or the startup errors or hangs under it where torch's default of the same
    # startup passes (``judge``). ``defect`` says which.
    policy_defect: bool = False
    defect: str = ""
    breakdown: dict[str, Any] = field(default_factory=dict)  # simnccl.cost_breakdown.breakdown of the run

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column.name,
            "env": dict(self.column.env),
            "policy": self.column.policy or "torch-default",
            "verdict": self.verdict,
            "error": self.error,
            "policy_defect": self.policy_defect,
            "defect": self.defect,
            # its figures are those of the moment the run died or hung, not the whole startup's cost
            "partial": self.partial,
            "checkpoint": self.checkpoint,
            # the moment every comms/MiB figure is read at ("peak_mib" aside: the whole run's highest)
            "read_at": f"checkpoint {self.checkpoint}" if self.checkpoint else "end of run",
            "wall_s": round(self.wall_s, 3),
            "summary": {k: {"typical": t, "min": lo, "max": hi} for k, (t, lo, hi) in self.summary.items()},
            "breakdown": self.breakdown,
        }

    @property
    def partial(self) -> bool:
        """The run died, hung or ran out of memory before the startup finished: its figures are of that moment."""
        return not self.stopped and self.verdict != "pass"


# ---------------------------------------------------------------------------------------------- arguments


DEFAULT_GPU, DEFAULT_RELEASE = "h100-80gb", "2.15"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=sorted(GENERATORS), help="the framework generator")
    parser.add_argument(
        "--scenario",
        metavar="FILE",
        help="price a scenario file's workload: one column per variant (instead of --workload)",
    )
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs (= ranks) per node (default 8)")
    parser.add_argument("--world", type=int, default=None, help="world size, when the knobs don't pin it down")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="simulate up to N columns in parallel processes (default: one per column up to the CPU count for "
        "a large startup, else 1 = this process)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also show where the NCCL MiB come from (channels x buffers, NVLS, network shared buffers, fixed "
        "overheads; paid at init or first use) and each communicator of the rank holding the most",
    )
    add_common(
        parser,
        help={
            "--policy": "a policy column (repeatable; default: every built-in policy); torch-default and legacy "
            "always show",
            "--release": f"torch release (default {DEFAULT_RELEASE})",
            "--gpu": f"GPU kind (default {DEFAULT_GPU})",
            "--seed": "the runs' seed (recorded; cost injects no faults, so the figures do not depend on it)",
            "--env": "set an environment variable in every column (repeatable; legacy keeps TORCH_DIST_USE_NCCL2=0)",
            "--variant": "only this column (repeatable): torch-default, legacy or a --policy SPEC",
        },
    )


def parse_knobs(generator: Generator, extra: Sequence[str]) -> dict[str, object]:
    """``--tp 8 --no-gloo --moe`` -> {"tp": 8, "gloo": False, "moe": True}, typed by the generator's params."""
    knobs: dict[str, object] = {}
    items = list(extra)
    i = 0
    while i < len(items):
        token = items[i]
        if not token.startswith("--") or len(token) < 3:
            raise CostError(f"unexpected argument {token!r}; framework knobs are given as --name value")
        text = token[2:]
        value_text = None
        if "=" in text:
            text, value_text = text.split("=", 1)
        name = text.replace("-", "_")
        param = generator.param(name)
        negated = False
        if param is None and name.startswith("no_"):
            param = generator.param(name[3:])
            negated = param is not None and param.kind == BOOL and value_text is None
            if not negated:
                param = None
        if param is None:
            known = " ".join(f"--{p.name.replace('_', '-')}" for p in generator.params)
            raise CostError(f"unknown option {token} for workload {generator.name!r}; its knobs are: {known}")
        if param.name in knobs:  # ``--tp 2 --tp 4``, ``--moe --no-moe``: which one was meant is the user's to say
            raise CostError(f"--{param.name.replace('_', '-')} is given twice; give each framework knob once")
        if negated:
            knobs[param.name] = False
            i += 1
            continue
        if value_text is None:
            following = items[i + 1] if i + 1 < len(items) else None
            if param.kind == BOOL and (following is None or following.startswith("--")):
                knobs[param.name] = True
                i += 1
                continue
            if following is None:
                raise CostError(f"option {token} needs a value")
            value_text = following
            i += 1
        try:
            knobs[param.name] = param.parse_text(value_text)
        except WorkloadError as err:
            raise CostError(f"--{param.name.replace('_', '-')}: {err.message}") from None
        i += 1
    return knobs


def columns_for(
    policies: Sequence[str] | None, env: Mapping[str, str] | None = None, only: Sequence[str] | None = None
) -> list[Column]:
    """torch-default, legacy and one column per policy; ``env`` in each (legacy's own knob wins); ``only``
    keeps the named columns (``--variant``)."""
    chosen = list(policies) if policies else list(DEFAULT_POLICIES)
    extra = dict(env or {})
    out = [Column("torch-default", dict(extra), None), Column("legacy", {**extra, **LEGACY_ENV}, None)]
    for spec in chosen:
        if spec == "torch-default" or any(c.name == spec for c in out):
            continue
        check_policy(spec)
        out.append(Column(spec, dict(extra), spec))
    return only_columns(out, only)


def check_policy(spec: str) -> None:
    """A ``--policy`` spec that names a policy, or CostError saying why not."""
    try:
        get_policy(spec)
    except PolicyError as err:
        raise CostError(f"--policy: {err}") from None


def only_columns(columns: list[Column], only: Sequence[str] | None) -> list[Column]:
    """The columns ``--variant`` names (all without it); a name that is no column is a CostError listing them."""
    if not only:
        return columns
    names = [c.name for c in columns]
    for name in only:
        if name not in names:
            raise CostError(f"--variant: no column {name!r}; the columns are: {', '.join(names)}")
    return [c for c in columns if c.name in only]


NOT_POLICIES = ("torch-default", "legacy")  # torch's own behaviours: a hang under them is a finding about torch


def baseline_of(column: Column, columns: Sequence[Column]) -> Column | None:
    """The column a policy column is judged against: torch's default on the same startup (the same env,
    release and profile, no policy), one of ``columns`` where there is one, else a new one to run as well;
    None for a column that is no policy's (torch's default, legacy: what they do is torch's finding)."""
    if column.policy is None or column.policy in NOT_POLICIES:
        return None
    for other in columns:
        if (other.policy, other.env, other.release, other.profile) == (
            None,
            column.env,
            column.release,
            column.profile,
        ):
            return other
    return Column("torch-default (baseline)", dict(column.env), None, column.release, column.profile)


def judge(result: ColumnResult, baseline: ColumnResult | None) -> None:
    """Mark ``result`` a policy defect where its startup errors, hangs or runs out of memory although
    ``baseline`` (torch's default on the same startup) passes. Why: such a policy column read ``error  ok``
    with smaller MiB than torch's default (it died before allocating the rest), exit 0: a policy that breaks
    the startup looked like a saving."""
    if not result.policy_defect and baseline is not None and result.partial and baseline.verdict == "pass":
        result.policy_defect = True
        result.defect = (
            f"it {_died(result.verdict)} where torch's default on the same startup passes "
            f"({baseline.column.name}): a defect of the policy"
        )


def _died(verdict: str) -> str:
    return "hung" if verdict == "hang" else "died"


# ---------------------------------------------------------------------------------------------- measuring


def _calls(program: Program) -> int:
    return sum(1 for op in program.ops if isinstance(op, NewGroup | SplitGroup))


def measure(outcome: RunOutcome, programs: Sequence[Program]) -> tuple[dict[str, list[float]], str | None]:
    """Per-rank figures from a finished run (and the checkpoint the MiB rows are read at)."""
    calls_by_program: dict[int, int] = {}
    per_rank: dict[str, list[float]] = {key: [] for key, _ in (*ROWS, PEAK_ROW)}
    checkpoint = next((c for c in CHECKPOINTS if c in outcome.checkpoints), None)
    snaps = outcome.checkpoints.get(checkpoint, {}) if checkpoint else {}
    # Rank sets numbered by identity: a world-wide group's tuple of ranks is hashed once per tuple object, not
    # once per rank holding it (measured: 0.9 s of a 4,096-rank column's figures went to hashing such tuples).
    numbered: dict[tuple[int, ...], int] = {}
    number_of: dict[int, int] = {}
    at_end = comm_holdings(outcome.ledgers.values())
    for rt in outcome.ranks:
        program = programs[rt.rank]
        calls = calls_by_program.get(id(program))
        if calls is None:
            calls = calls_by_program[id(program)] = _calls(program)
        seen: set[tuple[int, str]] = set()
        groups = singletons = duplicates = 0
        for group in rt.groups:
            if group.destroyed:
                continue  # torch dropped it from its pg_map: no longer held
            number = number_of.get(id(group.ranks))
            if number is None:  # the outcome keeps every group's tuple alive: its id is not reused meanwhile
                number = number_of[id(group.ranks)] = numbered.setdefault(group.ranks, len(numbered))
            key = (number, group.backend.requested)
            if key in seen:
                duplicates += 1
            seen.add(key)
            if group is rt.world:
                continue
            groups += 1
            singletons += group.size == 1
        device = device_name(rt, measured_device(rt))
        snap = snaps.get(device)
        ledger = outcome.ledgers.get(device)
        # Every MiB row of a rank at one moment: the checkpoint where there is one (its communicators too, not
        # the end of run's: they read 1,695.9 NCCL MiB beside 704.6 used when groups came after the checkpoint),
        # else the end of the run; the peak row says how far either is below the run's highest use.
        if snap is not None:
            used = snap.used_bytes / 2**20
            nccl_bytes, comms = snap.comms_by_rank.get(rt.rank, (0, 0))
        else:
            used = ledger.used_bytes / 2**20 if ledger is not None else 0.0
            nccl_bytes, comms = at_end.get(rt.rank, (0, 0))
        per_rank["calls"].append(calls)
        per_rank["groups"].append(groups)
        per_rank["singletons"].append(singletons)
        per_rank["duplicates"].append(duplicates)
        per_rank["comms"].append(comms)
        per_rank["nccl_mib"].append(nccl_bytes / 2**20)
        per_rank["used_mib"].append(used)
        per_rank[PEAK_ROW[0]].append(ledger.peak_bytes / 2**20 if ledger is not None else 0.0)
    return per_rank, checkpoint


def summarise(values: Sequence[float]) -> tuple[float, float, float]:
    """(typical, min, max): typical is the most common value (the smaller one on a tie)."""
    rounded = [round(v, 1) for v in values]
    return typical(rounded), min(rounded), max(rounded)


def column_config(
    programs: tuple[Program, ...], cluster: Cluster, release: str, column: Column, seed: int = 0
) -> SimConfig:
    """The simulation one column runs; shared with ``benchmarks/cost.py`` so it times exactly this."""
    release = column.release or release
    return SimConfig(
        cluster=cluster,
        release=get_release(release),
        profile=column.profile or find_profile(cluster.gpu.key, release),
        programs=programs,
        env=dict(column.env),
        policy=get_policy(column.policy) if column.policy else None,
        seed=seed,
        limits=default_limits(),
    )


def run_column(
    programs: tuple[Program, ...], cluster: Cluster, release: str, column: Column, seed: int = 0
) -> ColumnResult:
    """One column: its simulation and the figures read off it, the cyclic collector paused throughout
    (``gc_paused``)."""
    with gc_paused():
        return _run_column(programs, cluster, release, column, seed)


def _run_column(
    programs: tuple[Program, ...], cluster: Cluster, release: str, column: Column, seed: int
) -> ColumnResult:
    config = column_config(programs, cluster, release, column, seed)
    start = time.monotonic()
    try:
        engine = Engine(config)
        with progress_reported(engine.guard):
            outcome = engine.run()
    except EngineGuardError as err:
        stopped = f"simulation stopped: {err} ({limit_hint(err)})"
        return ColumnResult(column, "error", {}, time.monotonic() - start, None, stopped, stopped=True)
    wall = time.monotonic() - start
    per_rank, checkpoint = measure(outcome, programs)
    error = ""
    if outcome.errors:
        first = outcome.errors[0]
        error = f"rank {first['rank']}: {first['type']}: {_headline(first['message'])}"
    elif outcome.hangs:
        first = outcome.hangs[0]
        error = f"rank {first['rank']} hangs in {first['op']}"
    result = ColumnResult(column, outcome.verdict, per_rank, wall, checkpoint, error)
    defect = next((POLICY_DEFECTS[e["type"]] for e in outcome.errors if e["type"] in POLICY_DEFECTS), None)
    if defect is not None:
        result.policy_defect, result.defect = True, defect
    result.summary = {key: summarise(values) for key, values in per_rank.items() if values}
    result.breakdown = cost_breakdown.breakdown(outcome)
    return result


# The errors that are a defect of the column's policy whatever torch's default does on the same startup (exit 1):
# ``error  ok`` with exit 0 let a CI step that ran ``cost --policy mine`` pass a policy that breaks production
# wherever the default failed too (found by a tester for PolicyFakeBackend).
POLICY_DEFECTS = {
    "PolicyInconsistency": "its members disagreed (PolicyInconsistency): real torch hangs or crashes",
    "PolicyFakeBackend": "it made a group that communicates 'fake' (PolicyFakeBackend): production would go on "
    "without communicating",
    APPLY_ERROR_TYPE: "it reused a group its process no longer holds (ApplyError): simnccl.torch_apply raises there "
    "in production",
}


def _headline(message: str) -> str:
    """The line of an error that says what went wrong: NCCL's ``Last error:`` line where there is one (its first
    line only names the file that raised), else the first line."""
    lines = message.splitlines() or [""]
    if "Last error:" in lines[:-1]:
        return lines[lines.index("Last error:") + 1]
    return lines[0]


# ---------------------------------------------------------------------------------------------- output


PARTIAL_ROWS = ("comms", "nccl_mib", "used_mib", "peak_mib")  # figures that grow as the startup goes on


def _cell(summary: tuple[float, float, float] | None, died: str = "") -> str:
    """``typical [min-max]``; ``died`` ("died", "hung"): the run stopped early, so the figure is marked as that
    moment's, never to be read as the startup's (smaller) cost."""
    if summary is None:
        return "-"
    typical, lo, hi = summary

    def fmt(v: float) -> str:
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"

    text = fmt(typical) if lo == hi else f"{fmt(typical)} [{fmt(lo)}-{fmt(hi)}]"
    return f"{text} ({died})" if died else text


def _row_cell(result: ColumnResult, key: str) -> str:
    died = _died(result.verdict) if result.partial and key in PARTIAL_ROWS else ""
    return _cell(result.summary.get(key), died)


def render(results: Sequence[ColumnResult], missing: Sequence[str] = ()) -> str:
    """The table of the columns that finished; ``missing``: columns Ctrl-C stopped (named below it)."""
    header = ["per rank", *(r.column.name for r in results)]
    rows = [header]
    for key, label in (*ROWS, PEAK_ROW):
        rows.append([label, *(_row_cell(r, key) for r in results)])
    rows.append(["verdict", *(r.verdict for r in results)])
    rows.append(["sim wall s", *(f"{r.wall_s:.2f}" for r in results)])
    lines = plain_table(rows)
    notes = [f"{r.column.name}: {r.error}" for r in results if r.error]
    notes += [f"{r.column.name}: FAIL: {r.defect}" for r in results if r.policy_defect]
    checkpoints = sorted({r.checkpoint for r in results if r.checkpoint})
    lines.append("")
    lines.append(
        "cells: typical [min-max] over ranks; comms and MiB at checkpoint "
        + (", ".join(repr(c) for c in checkpoints) or "(none: the end of the run)")
        + ", peak over the whole run; legacy = TORCH_DIST_USE_NCCL2=0 (the same as policy 'legacy')"
    )
    if any(r.partial for r in results):
        lines.append("(died), (hung): the figures when the run stopped there, not the startup's whole cost")
    lines += [f"  {n}" for n in notes]
    if missing:
        lines.append(f"interrupted ({interruption()}): not finished: {', '.join(missing)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- entry


DEFAULT_GPUS_PER_NODE = 8


def _knob_flags(workload: str, knobs: Mapping[str, Any]) -> str:
    """The flags that gave ``knobs`` (``--tp 8 --pp 4``), for an error about what they imply together."""
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in knobs.items()) or f"--workload {workload}"


def build_cluster(gpu: str, world: int, gpus_per_node: int) -> Cluster:
    """Whole nodes of ``gpus_per_node`` GPUs (one node when the world is smaller); public for the benchmark."""
    limit = current_limits().max_world_size  # GPUs in one cluster: one node holds at most that many
    if not 1 <= gpus_per_node <= limit:
        raise CostError(f"--gpus-per-node: expected an integer in [1, {limit}] (max_world_size), got {gpus_per_node}")
    per_node = min(gpus_per_node, world)
    if world % per_node:
        raise CostError(f"a world of {world} ranks is not whole nodes of {gpus_per_node} GPUs (--gpus-per-node)")
    try:
        return Cluster(get_gpu_kind(gpu), world // per_node, per_node)
    except ClusterError as err:
        raise CostError(f"--gpu: {err}") from None


def rank_ops(programs: Sequence[Program]) -> int:
    """Ops over every rank: what a column's engine simulates, and its progress bar's length."""
    lengths: dict[int, int] = {}
    return sum(lengths.setdefault(id(p), len(p.ops)) for p in programs)


def column_summary(label: str, result: ColumnResult) -> SummaryLine:
    """A column in one line: typical NCCL and used MiB per device, communicators at startup. ``cost`` reports
    figures and checks nothing of torch's (a hang or error of torch's defaults is a finding, exit 0); ``ok`` is
    false only for a policy whose members disagreed (``policy_defect``: exit 1) and for a column a limit stopped
    (``stopped``: no figures, exit 2). Why: ``error  ok`` for a PolicyInconsistency, with exit 0, let a CI step
    that ran ``cost --policy mine`` pass a policy that hangs production; and a stopped column's ``ok`` made the
    JSON say ``"ok": true`` for a command that exited 2."""
    moment = f"at {result.checkpoint!r}" if result.checkpoint else "at the end of the run"
    figure = (
        f"NCCL {_row_cell(result, 'nccl_mib')} MiB/device, used {_row_cell(result, 'used_mib')} "
        f"MiB/device, {_row_cell(result, 'comms')} comms {moment}; peak {_row_cell(result, 'peak_mib')} MiB/device"
    )
    if result.error:
        figure += f"; {result.error}"
    if result.defect:
        figure += f"; {result.defect}"
    return SummaryLine(label, result.column.name, result.verdict, not (result.policy_defect or result.stopped), figure)


def _setup(
    args: argparse.Namespace, extra: Sequence[str]
) -> tuple[Generator, dict[str, object], tuple[Program, ...], Cluster, str, list[Column]]:
    """Everything checked before a column runs: (generator, knobs, programs, cluster, release, columns)."""
    release = args.release or DEFAULT_RELEASE
    generator = GENERATORS[args.workload]
    knobs = parse_knobs(generator, extra)
    if release not in RELEASES:
        raise CostError(f"--release: unknown torch release {release!r}; expected one of {', '.join(RELEASES)}")
    try:
        natural = generator.world_for(knobs)
    except WorkloadError as err:
        # no key: the world the knobs imply together (past max_world_size); name the knobs given
        where = f"--{err.key.replace('_', '-')}" if err.key else _knob_flags(generator.name, knobs)
        raise CostError(f"{where}: {err.message}") from None
    world = args.world if args.world is not None else natural
    if world is None:
        raise CostError(
            f"the {generator.name} knobs given do not pin the world size down; add --world N "
            "(or the data-parallel knob)"
        )
    if world < 1:
        raise CostError(f"--world: expected a positive integer, got {world}")
    if args.world is not None and natural is not None and natural != args.world:
        raise CostError(f"--world {args.world} does not match the {natural} ranks the knobs imply")
    # None: not given (with --scenario it is refused: the scenario's [cluster] names it)
    gpus_per_node = DEFAULT_GPUS_PER_NODE if args.gpus_per_node is None else args.gpus_per_node
    if "local_world_size" in {p.name for p in generator.params} and "local_world_size" not in knobs:
        knobs["local_world_size"] = min(gpus_per_node, world)
    cluster = build_cluster(args.gpu or DEFAULT_GPU, world, gpus_per_node)
    try:
        profile = find_profile(cluster.gpu.key, release)
    except ProfileError as err:
        raise CostError(f"--gpu/--release: {err}") from None
    columns = columns_for(args.policy, env_overrides(args), args.variant)
    for column in columns:
        check_env(profile, column.env)
    try:
        programs = generator(knobs, world)
    except WorkloadError as err:
        # no key: the world as a whole (--world, or the knobs that imply it), not some "arguments"
        world_flags = "--world" if args.world is not None else _knob_flags(generator.name, knobs)
        flag = f"--{err.key.replace('_', '-')}" if err.key else world_flags
        raise CostError(f"{flag}: {err.message}") from None
    return generator, knobs, programs, cluster, release, columns


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from simnccl.cli_output import Output

    out = Output("cost", args)
    if args.jobs is not None and args.jobs < 1:  # one check for --workload and --scenario
        out.error(f"--jobs: expected a positive integer, got {args.jobs}")
        return EXIT_BAD_INPUT
    if args.scenario is not None:
        from simnccl.cost_scenario import run_scenario

        return run_scenario(args, extra, out)
    try:
        check_json_target(args.json)
        if args.workload is None:
            raise CostError("expected --workload NAME (a framework generator) or --scenario FILE")
        generator, knobs, programs, cluster, release, columns = _setup(args, extra)
    except (CostError, OverrideError) as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    world = len(programs)
    shown = " ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
    title = (
        f"simnccl cost: {generator.framework} ({shown}) on {world} x {cluster.gpu.key} "
        f"({cluster.nodes} node{'s' if cluster.nodes > 1 else ''} x {cluster.gpus_per_node}), torch "
        f"{get_release(release).version}; {len({id(p) for p in programs})} distinct program(s)"
    )
    document = {
        "workload": generator.name,
        "knobs": {k: list(v) if isinstance(v, tuple) else v for k, v in knobs.items()},
        "world": world,
        "gpu": cluster.gpu.key,
        "release": release,
    }
    return report(out, args, title, f"{generator.name} {shown}", (programs, cluster, release, columns), document)


def report(
    out: Any,
    args: argparse.Namespace,
    title: str,
    label: str,
    work: tuple[tuple[Program, ...], Cluster, str, Sequence[Column]],
    document: dict[str, Any],
) -> int:
    """Run every column of ``work`` (programs, cluster, release, columns), print the table and write the JSON
    ``document`` with the seed and the columns added; shared by ``--workload`` and ``--scenario``."""
    programs, cluster, release, columns = work
    out.print(title)  # at once: the columns may take a while
    seed = args.seed if args.seed is not None else 0
    runs, baselines = with_baselines(columns)
    jobs = args.jobs if args.jobs is not None else default_jobs(len(runs), rank_ops(programs))
    finished = _simulate(out, label, (programs, cluster, release, seed), (runs, baselines, len(columns)), jobs)
    shown = finished.results[: len(columns)]
    results = [r for r in shown if r is not None]
    missing = [c.name for c, r in zip(columns, shown, strict=True) if r is None]
    out.print(render(results, missing))
    if getattr(args, "breakdown", False):
        out.print("")
        out.print(cost_breakdown.render((r.column.name, r.breakdown) for r in results))
    document = {**document, "seed": seed, "columns": [r.to_dict() for r in results]}
    if finished.interrupted:
        # What finished, marked: each column not finished is also a summary line that is not ok, so the
        # document's "ok" is false (as ``simnccl real`` does). Why: the document said "ok": true with no columns.
        document.update(out.not_finished(label, missing))
    out.finish([document])
    if finished.interrupted:
        raise KeyboardInterrupt  # simnccl.cli_guard: exit 130, stops the workers, prints the journal's lines
    stopped = [r for r in results if r.stopped]
    for result in stopped:  # no figures: the input is too large for a limit (as for run; exit 2, not a report)
        out.error(f"column {result.column.name}: {result.error}")
    if stopped:
        return EXIT_BAD_INPUT
    return EXIT_POLICY_DEFECT if any(r.policy_defect for r in results) else EXIT_OK


def with_baselines(columns: Sequence[Column]) -> tuple[list[Column], list[int | None]]:
    """The columns to run: ``columns``, then the baselines (``baseline_of``) none of them is, run but not shown;
    and per column to run, the index of its baseline (None: not judged)."""
    runs = list(columns)
    baselines: list[int | None] = []
    for column in columns:
        base = baseline_of(column, runs)
        if base is not None and not any(base is other for other in runs):
            runs.append(base)
        baselines.append(None if base is None else next(i for i, c in enumerate(runs) if c is base))
    return runs, baselines + [None] * (len(runs) - len(columns))


def _simulate(
    out: Output,
    label: str,
    common: tuple[tuple[Program, ...], Cluster, str, int],
    plan: tuple[Sequence[Column], Sequence[int | None], int],
    jobs: int,
) -> Finished[ColumnResult]:
    """Every column of ``plan`` (columns to run, each one's baseline index, how many are shown: the rest are
    baselines only) through ``run_column``, a progress bar per column; summary lines of the shown columns in
    column order as soon as a column, its baseline (``judge``) and those before it are done; Ctrl-C leaves what
    finished (and the journal says what ran)."""
    programs, cluster, release, seed = common
    columns, baselines, shown = plan
    journal = current_journal()
    results: dict[int, ColumnResult] = {}
    lines: dict[int, SummaryLine] = {}
    added = 0

    def line_for(index: int) -> SummaryLine:
        base = baselines[index]
        judge(results[index], results.get(base) if base is not None else None)
        return column_summary(label, results[index])

    def add_lines() -> None:
        nonlocal added
        while added < shown and added in results:
            base = baselines[added]
            if base is not None and base not in results:
                return  # judged once its baseline is done
            lines[added] = line_for(added)
            out.add(lines[added])
            added += 1

    # The workers start before the bars do: no thread of ours runs yet, so they may be forked (``ColumnRunner``).
    with (
        ColumnRunner(len(columns), jobs) as runner,
        out.progress_rows([c.name for c in columns], rank_ops(programs)) as bars,
    ):

        def done(index: int, result: ColumnResult) -> None:
            # The journal first: a Ctrl-C that lands while the line is being printed must not leave a column
            # on stdout that the interrupted report calls unfinished.
            if journal is not None:
                journal.lines.append(f"finished  cost  {result.column.name}: {result.verdict}")
            bars.done(index)
            results[index] = result
            add_lines()

        args = [(programs, cluster, release, column, seed) for column in columns]
        finished = runner.run(run_column, args, on_start=bars.start, on_progress=bars.update, on_done=done)
    for index in sorted(results):  # after Ctrl-C: the columns that finished after one that did not
        if added <= index < shown and index not in lines:
            out.add(line_for(index))
    if journal is not None:
        journal.lines += [f"stopped   cost  {columns[i].name}: not finished" for i in finished.running]
        if finished.interrupted:
            journal.lines += [f"skipped   cost  {columns[i].name}: not started" for i in finished.not_started()]
    return finished

"""``python -m simnccl.real calibrate --out simnccl/profiles/NAME.toml``: measure a profile on the GPUs of this machine.

GPU lane only: without a CUDA device it refuses ("no CUDA device: the GPU lane needs one"). The suite is a fixed
set of small worlds (one rank per visible GPU, at most 2; on a one-GPU machine every world has one rank, which
still measures per-communicator memory of 1-rank groups), each a Program run through the same launcher and
driver as ``python -m simnccl.real run``, with checkpoints between the steps:

========================  =====================================================================================
``nccl``                  set_device, init(device_id), world all_reduce, k new_groups, one all_reduce per group
``nccl-legacy``           the same on the legacy backend (for comparison; legacy pays at first use)
``nccl-lazy``             the same on nccl-lazy
``split-share``           ``nccl`` with NCCL_COMM_SPLIT_SHARE_RESOURCES=1
``max-nchannels-1``       ``nccl`` with NCCL_MAX_NCHANNELS=1
``lazy-init``             ``nccl`` with ``lazy_init`` on the k groups
``p2p`` (2 GPUs only)     nccl-lazy world, one send/recv pair (a lazily created pair communicator)
========================  =====================================================================================

Only what NCCL's mechanics cannot predict is fitted (DESIGN rule 12): the profile's fixed overheads. The
simulator first runs the suite with those overheads at zero (NCCL's mechanics alone, ``simnccl.nccl``, on the
GPU kind's topology and the measured NCCL version); the residuals of rank 0's device growth (``mem_get_info``
used, so NCCL buffers count) between checkpoints then give

* ``comm_fixed_mib``: the mean residual per eagerly created group (world_coll -> groups, divided by k) over
  the worlds that create them eagerly (``nccl``, ``nccl-lazy``, ``split-share``, ``max-nchannels-1``): the
  least-squares constant per communicator;
* ``process_mib``: the residual of ``context -> init`` (the world communicator, the process's first) minus
  ``comm_fixed_mib``;
* ``process_first_collective_mib``: the residual of ``init -> world_coll`` (the process's first collective).

A negative residual is clamped at 0 and noted (the model over-predicts there). Timings come from the ops' wall
times where measured, the rest is carried over from the simulator's built-in profile for this GPU, and says
so. The simulator then re-runs the suite from the new profile and reports the residual at every checkpoint of
every world (reproduction within 1 % is the target).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simnccl.ops import (
    MIB,
    NO_OPTIONS,
    AllReduce,
    Checkpoint,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    Program,
    Recv,
    Send,
    SetDevice,
)
from simnccl.real.lanes import NO_CUDA, LaneError, visible_gpus
from simnccl.real.launch import inherited_note, simulated_knobs

GROUPS = 4
SIZE_BYTES = 4 * MIB
TOLERANCE_PCT = 1.0
CHECKPOINTS = ("context", "init", "world_coll", "groups", "groups_coll")


@dataclass(frozen=True)
class CalRun:
    name: str
    programs: tuple[Program, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    what: str = ""


def _group_world(world: int, rank: int, backend: str, options: PgOptions = NO_OPTIONS) -> list[Op]:
    ranks = tuple(range(world))
    ops: list[Op] = [
        SetDevice(),
        Checkpoint(label="context"),
        InitProcessGroup(backend=backend, device_id=rank),
        Checkpoint(label="init"),
        AllReduce(size_bytes=SIZE_BYTES),
        Checkpoint(label="world_coll"),
    ]
    for i in range(GROUPS):
        ops.append(NewGroup(ranks=ranks, bind=f"g{i}", pg_options=options))
    ops.append(Checkpoint(label="groups"))
    for i in range(GROUPS):
        ops.append(AllReduce(group=f"g{i}", size_bytes=SIZE_BYTES))
    ops.append(Checkpoint(label="groups_coll"))
    return ops


def suite(world: int) -> list[CalRun]:
    """The calibration worlds for ``world`` ranks (1 or 2)."""

    def programs(backend: str, options: PgOptions = NO_OPTIONS) -> tuple[Program, ...]:
        return tuple(Program(tuple(_group_world(world, r, backend, options))) for r in range(world))

    runs = [
        CalRun("nccl", programs("nccl"), {}, "default nccl (nccl2, eager)"),
        CalRun("nccl-legacy", programs("nccl-legacy"), {}, "legacy ProcessGroupNCCL"),
        CalRun("nccl-lazy", programs("nccl-lazy"), {}, "ProcessGroupNCCLLazy"),
        CalRun("split-share", programs("nccl"), {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}, "split children share"),
        CalRun("max-nchannels-1", programs("nccl"), {"NCCL_MAX_NCHANNELS": "1"}, "one channel"),
        CalRun("lazy-init", programs("nccl", PgOptions(lazy_init=True)), {}, "lazy_init on the k groups"),
    ]
    if world >= 2:
        p2p = []
        for r in range(world):
            ops: list[Op] = [
                SetDevice(),
                Checkpoint(label="context"),
                InitProcessGroup(backend="nccl-lazy", device_id=r),
                Checkpoint(label="init"),
            ]
            if r == 0:
                ops.append(Send(peer=1, size_bytes=SIZE_BYTES))
            elif r == 1:
                ops.append(Recv(peer=0, size_bytes=SIZE_BYTES))
            ops.append(Checkpoint(label="p2p"))
            p2p.append(Program(tuple(ops)))
        runs.append(CalRun("p2p", tuple(p2p), {}, "one send/recv pair on nccl-lazy"))
    return runs


# ---------------------------------------------------------------------------------------------- derivation


def used_at(result: Mapping[str, Any], label: str, rank: int = 0) -> float | None:
    """Rank ``rank``'s device used MiB at a checkpoint of a real (Result-shaped) run."""
    for checkpoint in result.get("checkpoints", []):
        if checkpoint["name"] == label:
            for device in checkpoint["devices"]:
                if device.get("rank", 0) == rank:
                    return float(device["used_mib"])
    return None


def op_seconds(result: Mapping[str, Any], name: str, rank: int = 0) -> list[float]:
    for state in result.get("ranks", []):
        if state["rank"] == rank:
            return [
                float(op["end"] - op["start"])
                for op in state["ops"]
                if op.get("name") == name and op.get("outcome") == "ok" and "end" in op and "start" in op
            ]
    return []


EAGER_GROUP_RUNS = ("nccl", "nccl-lazy", "split-share", "max-nchannels-1")


def _growth(used: Any, label_a: str, label_b: str) -> float | None:
    """``used(label)`` at b minus at a, or None where either is missing."""
    x, y = used(label_a), used(label_b)
    return None if x is None or y is None else y - x


def model_only(base: Any, nccl_version: str | None = None) -> Any:
    """``base`` with every fixed overhead at zero (and the measured NCCL version): NCCL's mechanics alone."""
    from dataclasses import replace

    from simnccl.profiles import FixedOverheads

    return replace(
        base,
        comm=FixedOverheads(0.0, 0.0, 0.0),
        nccl_version=nccl_version or base.nccl_version,
        name=f"{base.name}-model-only",
    )


def derive(
    results: Mapping[str, Mapping[str, Any]],
    world: int,
    base: Any,
    nccl_version: str | None = None,
    inherited: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The fixed overheads and timings measured by the suite, their derivations, and notes.

    ``base``: the built-in profile of this GPU kind (its topology; its timings where unmeasured);
    ``nccl_version``: the NCCL the measurement ran (default: the base's); ``inherited``: the knobs the measured
    ranks inherited from the launcher's environment, which the model runs too (else the fit would take their
    effect for a fixed overhead), and which a note names.
    """
    values: dict[str, Any] = {}
    why: dict[str, str] = {}
    notes: list[str] = []
    k = GROUPS
    model = model_only(base, nccl_version)
    predicted = {run.name: _simulate(model, run, inherited) for run in suite(world)}
    note = inherited_note(inherited or {}, simulated_knobs(inherited))
    if note:
        notes.append(f"measured under inherited knobs: {note}")

    def residual(run: str, a: str, b: str) -> tuple[float, float, float] | None:
        """(real growth, model growth, residual) between two checkpoints of a world that passed."""
        result = results.get(run)
        if result is None or result.get("verdict") != "pass" or predicted[run].verdict != "pass":
            return None
        real = _growth(lambda label: used_at(result, label), a, b)
        sim = _growth(lambda label: _sim_used(predicted[run], label), a, b)
        return None if real is None or sim is None else (real, sim, real - sim)

    if residual("nccl", "context", "init") is None or residual("nccl", "init", "world_coll") is None:
        raise RuntimeError("the nccl calibration world did not pass; nothing to derive (see the run report)")
    per_group = {run: r for run in EAGER_GROUP_RUNS if (r := residual(run, "world_coll", "groups")) is not None}
    fixed = sum(r[2] for r in per_group.values()) / (k * len(per_group))
    lines = [f"{run}: real {r[0]:.3f} - model {r[1]:.3f} = {r[2]:+.3f} MiB for {k}" for run, r in per_group.items()]
    values["comm_fixed_mib"] = _clamped("comm_fixed_mib", fixed, notes)
    why["comm_fixed_mib"] = (
        f"FITTED (least squares, a constant per communicator) to the growth of {k} eager new_group calls "
        f"(checkpoints world_coll -> groups, rank 0's device, {world} rank(s)) beyond NCCL's mechanics "
        f"(simnccl.nccl, NCCL {model.nccl_version}): " + "; ".join(lines) + f" -> mean {fixed:.4f} MiB"
    )
    real, sim, rest = residual("nccl", "context", "init") or (0.0, 0.0, 0.0)
    process = rest - values["comm_fixed_mib"]
    values["process_mib"] = _clamped("process_mib", process, notes)
    why["process_mib"] = (
        f"FITTED: init_process_group (the world communicator, the process's first) grew the device by {real:.3f} "
        f"MiB (context -> init); the model predicts {sim:.3f}, plus comm_fixed_mib {values['comm_fixed_mib']:.4f} "
        f"-> {process:.4f} MiB once per process"
    )
    real, sim, rest = residual("nccl", "init", "world_coll") or (0.0, 0.0, 0.0)
    values["process_first_collective_mib"] = _clamped("process_first_collective_mib", rest, notes)
    why["process_first_collective_mib"] = (
        f"FITTED: the process's first all_reduce ({SIZE_BYTES // MIB} MiB, world group) grew the device by "
        f"{real:.3f} MiB (init -> world_coll); the model's connections predict {sim:.3f} -> {rest:.4f} MiB once "
        "per process"
    )
    for run in ("p2p", "lazy-init", "nccl-legacy"):
        if run not in results:
            notes.append(f"{run}: not run ({'it needs 2 GPUs' if run == 'p2p' else 'missing'}); no residual")
    nccl = results.get("nccl", {})
    inits = op_seconds(nccl, "init_process_group")
    splits = op_seconds(nccl, "new_group")
    contexts = op_seconds(nccl, "set_device")
    if inits:
        values["comm_init_s"] = round(inits[0], 4)
        why["comm_init_s"] = f"measured: init_process_group wall time {inits[0]:.4f} s (includes the bootstrap)"
    if splits:
        values["split_s"] = round(sum(splits) / len(splits), 4)
        why["split_s"] = f"measured: mean new_group wall time over {len(splits)} calls"
    if contexts:
        values["cuda_context_s"] = round(contexts[0], 4)
        why["cuda_context_s"] = "measured: set_device + first allocation wall time (context creation)"
    return values, why, notes


def _clamped(key: str, value: float, notes: list[str]) -> float:
    if value < 0:
        notes.append(f"{key}: the residual is {value:.4f} MiB (the model over-predicts); clamped at 0")
        return 0.0
    return round(value, 4)


# ---------------------------------------------------------------------------------------------- the file


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'"""{escaped}"""'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value)) if "\n" in str(value) else json.dumps(str(value))


def profile_toml(
    *,
    name: str,
    gpu: str,
    releases: Sequence[str],
    provenance: Mapping[str, Any],
    values: Mapping[str, Any],
    why: Mapping[str, str],
    base: Any,
    notes: Sequence[str] = (),
    nccl_version: str | None = None,
) -> str:
    """A profile document in simnccl's format; unmeasured fields are carried over from ``base``;
    ``nccl_version``: the NCCL the measurement ran (default: the base's)."""
    from simnccl.profiles import _COMM_KEYS, _TIMING_KEYS

    comm: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    derivation: dict[str, str] = {}
    for key in _COMM_KEYS:
        if key in values:
            comm[key] = values[key]
            derivation[key] = why[key]
        else:
            comm[key] = getattr(base.comm, key)
            derivation[key] = f"carried over from profile {base.name} (not measured by this calibration)"
    if base.topology_changes:
        derivation["topology"] = f"carried over from profile {base.name}: {base.derivation.get('topology', '')}"
    for key in _TIMING_KEYS:
        if key in values:
            timing[key] = values[key]
            derivation[key] = why[key]
        else:
            timing[key] = getattr(base.timing, key)
            derivation[key] = f"carried over from profile {base.name} (not measured by this calibration)"
    source = "measured by `python -m simnccl.real calibrate` on this machine: " + ", ".join(
        f"{k}={v}" for k, v in provenance.items()
    )
    measured = (
        f"Per-device memory (torch.cuda.mem_get_info total-free, minus the device's use before the process "
        f"touched it) at checkpoints of the calibration suite (real/calibrate.py), rank 0's device, "
        f"{GROUPS} groups per world. " + " ".join(notes)
    )
    lines = [
        "# Written by `python -m simnccl.real calibrate` (real/calibrate.py). Regenerate, don't edit by hand.",
        "",
        f"name = {json.dumps(name)}",
        f"gpu = {json.dumps(gpu)}",
        f"torch_build = {json.dumps(str(provenance.get('torch', 'unknown')))}",
        f"releases = {_toml_value(list(releases))}",
        f"nccl_version = {json.dumps(nccl_version or base.nccl_version)}",
        f"source = {_toml_string(source)}",
        f"measured = {_toml_string(measured)}",
        "",
        "[comm]",
    ]
    lines += [f"{key} = {_toml_value(value)}" for key, value in comm.items()]
    if base.topology_changes:
        lines += ["", "[topology]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in base.topology_changes.items()]
    lines += ["", "[timing]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in timing.items()]
    lines += ["", "[derivation]"]
    lines += [f"{key} = {_toml_string(text)}" for key, text in derivation.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- reproduction


def reproduce(
    profile: Any,
    runs: Sequence[CalRun],
    results: Mapping[str, Mapping[str, Any]],
    inherited: Mapping[str, str] | None = None,
) -> list[dict]:
    """The simulator re-runs each calibration world from ``profile`` (under the ``inherited`` knobs it can run,
    as ``derive`` did); growth since ``context`` is compared."""
    rows = []
    for run in runs:
        real = results.get(run.name)
        if real is None or real.get("verdict") != "pass":
            continue
        outcome = _simulate(profile, run, inherited)
        sim_base = _sim_used(outcome, "context")
        real_base = used_at(real, "context")
        for label in [c["name"] for c in real.get("checkpoints", [])]:
            if label == "context":
                continue
            sim_used, real_used = _sim_used(outcome, label), used_at(real, label)
            if None in (sim_used, real_used, sim_base, real_base):
                continue
            sim_growth, real_growth = sim_used - sim_base, real_used - real_base
            error = 0.0 if real_growth == sim_growth else (sim_growth - real_growth) / max(abs(real_growth), 1e-9) * 100
            rows.append(
                {
                    "run": run.name,
                    "checkpoint": label,
                    "sim_growth_mib": round(sim_growth, 3),
                    "real_growth_mib": round(real_growth, 3),
                    "residual_mib": round(real_growth - sim_growth, 3),
                    "error_pct": round(error, 3),
                    "within": abs(error) <= TOLERANCE_PCT or abs(sim_growth - real_growth) < 0.5,
                }
            )
    return rows


def _simulate(profile: Any, run: CalRun, inherited: Mapping[str, str] | None = None) -> Any:
    """The simulator's run of one calibration world under ``profile`` (the installed torch's release rules), with
    the ``inherited`` knobs it can run under the run's own env."""
    from simnccl.cluster import Cluster, get_gpu_kind
    from simnccl.engine import Engine, SimConfig
    from simnccl.real.launch import installed_release
    from simnccl.release import get_release

    release = installed_release() or profile.releases[0]
    config = SimConfig(
        cluster=Cluster(get_gpu_kind(profile.gpu), 1, len(run.programs), None),
        release=get_release(release),
        profile=profile,
        programs=run.programs,
        env={**simulated_knobs(inherited), **run.env},
        launcher="torchrun",
    )
    return Engine(config).run()


def _sim_used(outcome: Any, label: str) -> float | None:
    snaps = outcome.checkpoints.get(label)
    if not snaps:
        return None
    first = snaps[sorted(snaps)[0]]
    return first.used_bytes / MIB


# ---------------------------------------------------------------------------------------------- entry point


PROVENANCE_SCRIPT = r"""
import json, os, datetime, torch
out = {"torch": torch.__version__, "git": getattr(torch.version, "git_version", ""),
       "cuda": torch.version.cuda, "date": datetime.date.today().isoformat()}
try:
    v = torch.cuda.nccl.version(); out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:
    out["nccl"] = "unknown"
p = torch.cuda.get_device_properties(0)
out["gpu_name"] = p.name
out["gpu_total_mib"] = round(p.total_memory / 2**20, 1)
out["gpus"] = torch.cuda.device_count()
try:
    import subprocess
    out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
except Exception:
    out["driver"] = "unknown"
out["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_", "CUDA_VISIBLE"))}
print(json.dumps(out))
"""


def provenance() -> dict[str, Any]:
    """Collected in a child process, so this (launcher) process never creates a CUDA context."""
    done = subprocess.run([sys.executable, "-c", PROVENANCE_SCRIPT], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"could not read the GPU's provenance: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


GPU_NAMES = (
    ("H200", "h200-141gb"),
    ("GB200", "gb200"),
    ("H100", None),  # 80 vs 96 GB: by memory
    ("A100", "a100-80gb"),
    ("L4", "l4"),
    ("3060", "rtx3060-12gb"),
)


def guess_gpu_kind(name: str, total_mib: float) -> str | None:
    from simnccl.cluster import gpu_kinds

    kinds = gpu_kinds()
    for needle, key in GPU_NAMES:
        if needle in name:
            if key is None:
                key = "h100-96gb" if total_mib > 90_000 else "h100-80gb"
            matches = [k for k in kinds if k.startswith(key)]
            return matches[0] if matches else None
    return None


def measured_nccl_version(facts: Mapping[str, Any]) -> str | None:
    """The NCCL version torch reported, when it is one the model can read (else None: the base's is used)."""
    from simnccl.nccl import NcclInputError, NcclVersion

    try:
        return NcclVersion.parse(str(facts.get("nccl", ""))).text
    except NcclInputError:
        return None


def main(args: Any) -> int:
    from simnccl.profiles import find_profile, parse_profile
    from simnccl.real.launch import Launcher, RunSettings, installed_release

    gpus = visible_gpus()
    if gpus == 0:
        print(f"real calibrate: {NO_CUDA}", file=sys.stderr)
        return 2
    world = min(gpus, 2)
    facts = provenance()
    gpu = args.gpu_kind or guess_gpu_kind(str(facts.get("gpu_name", "")), float(facts.get("gpu_total_mib", 0)))
    if gpu is None:
        print(
            f"real calibrate: cannot tell which simnccl GPU kind {facts.get('gpu_name')!r} is; pass --gpu-kind",
            file=sys.stderr,
        )
        return 2
    release = installed_release() or "2.15"
    try:
        base = find_profile(gpu, release)
    except Exception as err:
        print(f"real calibrate: no built-in profile to carry unmeasured fields from: {err}", file=sys.stderr)
        return 2
    settings = RunSettings.for_lane("gpu", timeout_s=min(120.0, float(args.timeout) / 4))
    runs = suite(world)
    results: dict[str, dict[str, Any]] = {}
    started = datetime.datetime.now()
    try:
        with Launcher() as launcher:
            inherited = launcher.inherited_env()
            for run in runs:
                results[run.name] = launcher.run_programs(run.programs, settings, env=run.env, name=run.name)
                print(f"calibrate: {run.name}: {results[run.name]['verdict']} ({results[run.name].get('wall_s')}s)")
    except LaneError as err:
        print(f"real calibrate: {err}", file=sys.stderr)
        return 2
    nccl_version = measured_nccl_version(facts)
    values, why, notes = derive(results, world, base, nccl_version, inherited)
    out = Path(args.out)
    name = out.stem
    text = profile_toml(
        name=name,
        gpu=gpu,
        releases=[release],
        provenance={k: v for k, v in facts.items() if k != "env"} | {"world": world},
        values=values,
        why=why,
        base=base,
        notes=notes,
        nccl_version=nccl_version,
    )
    profile = parse_profile(text, str(out))  # validate before writing
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    rows = reproduce(profile, runs, results, inherited)
    print(f"calibrate: wrote {out} ({(datetime.datetime.now() - started).total_seconds():.0f}s)")
    print("  residual per checkpoint (growth since 'context', model + fitted overheads vs measured):")
    for row in rows:
        flag = "" if row["within"] else f"  outside {TOLERANCE_PCT}%"
        print(
            f"  {row['run']:<16} {row['checkpoint']:<12} sim +{row['sim_growth_mib']:.1f} MiB  "
            f"real +{row['real_growth_mib']:.1f} MiB  residual {row['residual_mib']:+.1f} MiB  "
            f"{row['error_pct']:+.2f}%{flag}"
        )
    for note in notes:
        print(f"  note: {note}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"provenance": facts, "values": values, "notes": notes, "reproduction": rows, "runs": results},
                indent=2,
                default=str,
            ),
            encoding="utf-8",
        )
    reproduced = [r for r in rows if r["run"] in ("nccl", "split-share", "p2p")]
    return 0 if reproduced and all(r["within"] for r in reproduced) else 1


# ---------------------------------------------------------------------------------------------- GPU check scenarios

GPU_SCENARIO = """\
# Written by real/gpu_check.sh: {world}-rank worlds on this machine's GPUs ({gpu}), priced by the profile just
# calibrated here. Singleton groups (what a one-GPU machine can measure), legacy vs nccl2, lazy_init, and the
# lazy-single-rank policy (PR #203904's rule).

[scenario]
name = "gpu-check-{world}rank"
description = "per-communicator memory of {world}-rank worlds: nccl2 eager vs legacy vs lazy_init"

[cluster]
gpu = "{gpu}"
gpus_per_node = {world}

[torch]
release = "{release}"
profile = "{profile}"
launcher = "torchrun"

[workload]
steps = [
  {{ op = "set_device" }},
  {{ op = "init_process_group", backend = "nccl", device_id = "cuda:{{rank}}" }},
  {{ op = "checkpoint", name = "init" }},
  {{ op = "new_group", ranks = [0], bind = "single0" }},
  {{ op = "new_group", ranks = [0], bind = "single1" }},
  {{ op = "new_group", ranks = {all_ranks}, bind = "all" }},
  {{ op = "checkpoint", name = "groups" }},
  {{ op = "all_reduce", group = "single0", size_mib = 4, on_ranks = [0] }},
  {{ op = "all_reduce", group = "all", size_mib = 4 }},
  {{ op = "checkpoint", name = "end" }},
]

[[variants]]
name = "nccl2-default"

[[variants]]
name = "legacy"
env = {{ TORCH_DIST_USE_NCCL2 = "0" }}

[[variants]]
name = "lazy-init"
policy = "lazy-init"

[[variants]]
name = "lazy-single-rank"
policy = "lazy-single-rank"

[[variants]]
name = "max-nchannels-1"
env = {{ NCCL_MAX_NCHANNELS = "1" }}
"""


def write_gpu_scenarios(out_dir: Path, gpu: str, profile: Path, world: int, release: str) -> list[Path]:
    """The GPU check's own scenarios for ``world`` ranks (they fit any machine with that many GPUs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"gpu-check-{world}rank.toml"
    path.write_text(
        GPU_SCENARIO.format(
            world=world,
            gpu=gpu,
            release=release,
            profile=profile.resolve().as_posix(),
            all_ranks=list(range(world)),
        ),
        encoding="utf-8",
    )
    return [path]

"""Scenario files: TOML in, a validated Scenario out, or an error naming the file, the key and the expectation.

Scenario files are untrusted input (DESIGN rule 9): parsed with ``tomllib``, every key checked against a
schema, nothing evaluated; every size is checked against ``simnccl.limits`` before anything is expanded, every
number is finite and in its range, and names used later (checkpoints, devices, env knobs) are checked here, so a
mistake is exit 2 up front rather than a surprise at the end of a simulation. Explicit workload steps expand
into one Program per rank; ranks whose expanded steps are identical share one Program object (DESIGN rule 8).

Schema (every table but ``[[variants]]`` and ``[[expect]]`` required unless marked optional)::

    [scenario]   name, description?, seed? (int), policy? ("torch-default")
    [cluster]    gpu, nodes?, gpus_per_node, ranks_per_node?
    [torch]      release, profile? (built-in name or path relative to the file), launcher? (torchrun|spawn), env?,
                 extra_env_knobs? (TORCH_*/PYTORCH_*/NCCL_* names newer than simnccl.env_knobs' list)
    [workload]   steps = [{op = "...", repeat?, on_ranks?, <op fields>}, ...]  |  generator = "...", args?
    [[variants]] name, description?, env?, release?, profile?, policy?
    [matrix]     release? = [...], policy? = [...], env? = {VAR = [...]}   (cartesian product, added to variants)
    [[expect]]   variants?, checkpoint?, baseline?, used_mib?, tolerance_pct?, tolerance_mib?, devices?,
                 verdict?, error_contains?, hang_ranks?, detected_at_s?, tolerance_s?, error_at_s?, fr_dump_ranks?,
                 committed_steps?, lost_steps?, replacement_devices?, fault_detected_at_s? (recovery runs)
    [faults]     inject? = [{kind, rank, at_op?, at_s?, factor?, peer?}], seed?, classes?, max_faults?
"""

from __future__ import annotations

import difflib
import heapq
import itertools
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from simnccl.cluster import Cluster, ClusterError, get_gpu_kind
from simnccl.env_knobs import unknown_knob_message, value_problem
from simnccl.faults import (
    NO_FAULTS,
    Fault,
    FaultError,
    FaultSchedule,
    check_program_faults_distinct,
    generate,
    validate,
)
from simnccl.limits import InputLimits, exceeded, file_problem, nesting_depth
from simnccl.limits import current as current_limits
from simnccl.ops import (
    MIB,
    OP_TYPES,
    Checkpoint,
    Collective,
    EmptyCache,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    PointToPoint,
    Program,
    SplitGroup,
    check_option,
    retired_field,
)
from simnccl.policy import PolicyError, get_policy
from simnccl.profiles import Profile, ProfileError, find_profile, get_profile
from simnccl.release import RELEASES, ReleaseError, resolve_backend
from simnccl.table_keys import key_problem

LAUNCHERS = ("torchrun", "spawn")
VERDICTS = ("pass", "fail", "hang", "error")


class ScenarioError(ValueError):
    """Bad scenario input: the message names the file, the key and what was expected."""

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"{source}: {key}: {message}" if key else f"{source}: {message}")
        self.source = source
        self.key = key


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    description: str
    release: str
    profile: Profile
    env: Mapping[str, str]
    policy: str


@dataclass(frozen=True, slots=True)
class Expectation:
    variants: tuple[str, ...]
    checkpoint: str | None = None
    baseline: str | None = None
    used_mib: float | None = None
    tolerance_pct: float | None = None
    tolerance_mib: float | None = None
    devices: tuple[str, ...] = ()
    verdict: str | None = None
    error_contains: str | None = None
    hang_ranks: tuple[int, ...] | None = None
    detected_at_s: float | None = None
    tolerance_s: float = 1e-6
    key: str = ""
    committed_steps: int | None = None  # recovery runs (simnccl.recovery)
    lost_steps: int | None = None
    replacement_devices: tuple[str, ...] | None = None
    fault_detected_at_s: float | None = None
    error_at_s: float | None = None  # when the first rank failed (an abort at init has no hang to detect)
    fr_dump_ranks: tuple[int, ...] | None = None  # ranks that wrote a flight-recorder dump; () asserts none did


@dataclass(frozen=True, slots=True)
class FaultSwarm:
    """How ``[faults]`` generated its schedule (``seed``, ``classes``, ``max_faults``), after the injected faults:
    kept so that ``--seed`` can draw the swarm again (``simnccl.cli_options``)."""

    classes: tuple[str, ...] | None
    max_faults: int
    injected: int


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    source: str
    seed: int
    cluster: Cluster
    launcher: str
    programs: tuple[Program, ...]
    variants: tuple[Variant, ...]
    expectations: tuple[Expectation, ...] = field(default_factory=tuple)
    faults: FaultSchedule = NO_FAULTS
    recovery: Mapping[str, Any] | None = None  # raw [recovery] table, validated by simnccl.recovery
    fault_swarm: FaultSwarm | None = None  # set when [faults] has a seed

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.variants)
        raise ScenarioError(self.source, "--variant", f"no variant {name!r}; this scenario has: {known}")


# ---------------------------------------------------------------------------------------------- helpers


class _Reader:
    """Typed access to one TOML table that remembers the key path for error messages."""

    def __init__(self, source: str, path: str, table: Any) -> None:
        if not isinstance(table, dict):
            raise ScenarioError(source, path, f"expected a table, got {_kind(table)}")
        self.source = source
        self.path = path
        self.table = table
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, message: str) -> ScenarioError:
        return ScenarioError(self.source, self.key(name), message)

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = ..., what: str = "") -> Any:
        self.used.add(name)
        if name not in self.table:
            if default is ...:
                raise self.error(name, f"missing; expected {what or _type_name(kind)}")
            return default
        value = self.table[name]
        if isinstance(value, bool) and bool not in _as_tuple(kind):
            raise self.error(name, f"expected {what or _type_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.error(name, f"expected {what or _type_name(kind)}, got {_kind(value)} {_shown(value)}")
        return value

    def int_list(self, name: str, default: Any = ...) -> tuple[int, ...] | Any:
        value = self.get(name, list, default, what="a list of integers")
        if value is default and default is not ...:
            return default
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(name, f"expected a list of integers, got {_shown(value)}")
        return tuple(value)

    def env(self, name: str, extra_knobs: Sequence[str] | None = ()) -> dict[str, str]:
        """An environment table: string values, and knob names torch or NCCL read (simnccl.env_knobs)."""
        value = self.get(name, dict, {}, what="a table of strings")
        for k, v in value.items():
            message = unknown_knob_message(k, extra_knobs or ())
            if message is None and isinstance(v, str):
                message = value_problem(k, v)
            if message is not None:
                raise ScenarioError(self.source, f"{self.key(name)}.{k}", message)
            if not isinstance(v, str):
                raise ScenarioError(
                    self.source,
                    f"{self.key(name)}.{k}",
                    f"expected a string (environment values are strings), got {_kind(v)} {_shown(v)}",
                )
        return dict(value)

    def finish(self) -> None:
        problem = key_problem(self.table, allowed=self.used, path=self.path)
        if problem is not None:
            raise ScenarioError(self.source, problem.key, problem.message)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in _as_tuple(kind))


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------------------------------- loading


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file: a regular file within the size limit, TOML within the nesting limit."""
    path = Path(path)
    source = str(path)
    limits = current_limits()
    problem = file_problem(path, limits.max_file_bytes)
    if problem is not None:
        raise ScenarioError(source, "", problem)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(source, "", f"cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(source, "", f"not UTF-8 text (TOML files are UTF-8): {err}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(source, "", f"malformed TOML: {err}") from None
    except ValueError as err:  # tomllib passes int()'s own error through (an integer of > 4300 digits)
        raise ScenarioError(source, "", f"malformed TOML: {err}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ScenarioError(
            source, "", "tables or arrays nested too deeply to parse: " + exceeded_depth(limits)
        ) from None
    try:
        return parse_scenario(data, source, base_dir=path.parent)
    except Exception as err:  # not ScenarioError: a defect; say which file made it, for the report
        if not isinstance(err, ScenarioError):
            err.add_note(f"while reading the scenario {source}")
        raise


def exceeded_depth(limits: InputLimits) -> str:
    return exceeded("max_nesting_depth", "the nesting", limits.max_nesting_depth)


def parse_scenario(data: Mapping[str, Any], source: str, base_dir: Path | None = None) -> Scenario:
    limits = current_limits()
    depth = nesting_depth(dict(data))
    if depth > limits.max_nesting_depth:
        raise ScenarioError(source, "", f"tables or arrays nested {depth} deep: " + exceeded_depth(limits))
    top = _Reader(source, "", dict(data))
    meta = _Reader(source, "scenario", top.get("scenario", dict))
    name = meta.get("name", str)
    description = meta.get("description", str, "")
    seed = meta.get("seed", int, 0)
    policy = _policy(meta, "policy", "torch-default")
    meta.finish()

    cluster = _cluster(_Reader(source, "cluster", top.get("cluster", dict)), limits)
    torch = _Reader(source, "torch", top.get("torch", dict))
    release = _release(torch, "release")
    launcher = torch.get("launcher", str, "torchrun")
    if launcher not in LAUNCHERS:
        raise torch.error("launcher", f"expected one of {', '.join(LAUNCHERS)}, got {_shown(launcher)}")
    extra_knobs = _str_list(torch, "extra_env_knobs", "a list of environment variable names") or ()
    base_env = torch.env("env", extra_knobs)
    profile_ref = torch.get("profile", str, None)
    torch.finish()
    base_profile = _profile(source, "torch.profile", profile_ref, cluster.gpu.key, release, base_dir)
    _check_env(source, "torch.env", base_profile, base_env)

    workload = _Reader(source, "workload", top.get("workload", dict))
    programs = _programs(workload, cluster.world_size, limits)
    workload.finish()

    raw_variants = top.get("variants", list, [], what="an array of tables [[variants]]")
    if len(raw_variants) > limits.max_variants:
        raise top.error("variants", exceeded("max_variants", f"{len(raw_variants)} variants", limits.max_variants))
    variants = []
    for i, raw in enumerate(raw_variants):
        reader = _Reader(source, f"variants[{i}]", raw)
        v_name = reader.get("name", str)
        if any(v.name == v_name for v in variants):
            raise reader.error("name", f"duplicate variant name {_shown(v_name)}")
        v_release = _release(reader, "release", release)
        own_env = reader.env("env", extra_knobs)
        env = {**base_env, **own_env}
        v_profile_ref = reader.get("profile", str, None)
        if v_profile_ref is None and v_release == release:
            v_profile = base_profile
        else:
            v_profile = _profile(
                source, f"variants[{i}].profile", v_profile_ref or profile_ref, cluster.gpu.key, v_release, base_dir
            )
        _check_env(source, f"variants[{i}].env", v_profile, own_env)
        variants.append(
            Variant(
                v_name, reader.get("description", str, ""), v_release, v_profile, env, _policy(reader, "policy", policy)
            )
        )
        reader.finish()
    if "matrix" in top.table:
        for variant in _matrix(
            _Reader(source, "matrix", top.get("matrix", dict)),
            _MatrixBase(release, policy, base_env, profile_ref, cluster, base_dir, extra_knobs),
            limits.max_variants - len(variants),
        ):
            if any(v.name == variant.name for v in variants):
                raise ScenarioError(source, "matrix", f"variant {_shown(variant.name)} is also defined in [[variants]]")
            variants.append(variant)
    if not variants:
        variants.append(Variant("default", "", release, base_profile, base_env, policy))

    recovery = top.get("recovery", dict, None, what="a table ([recovery])")
    checkpoints = _checkpoint_labels(programs)
    expectations = _expectations(top, source, [v.name for v in variants], checkpoints, cluster)
    faults, swarm = _faults(top, source, programs, limits) if "faults" in top.table else (NO_FAULTS, None)
    top.finish()
    scenario = Scenario(
        name,
        description,
        source,
        seed,
        cluster,
        launcher,
        programs,
        tuple(variants),
        tuple(expectations),
        faults,
        recovery,
        swarm,
    )
    if recovery is not None:
        # Validated here, before any simulation (the orchestrator reads it again when it runs).
        from simnccl.recovery import check_recovery

        check_recovery(scenario, limits)
    return scenario


def _faults(
    top: _Reader, source: str, programs: tuple[Program, ...], limits: InputLimits
) -> tuple[FaultSchedule, FaultSwarm | None]:
    """``[faults]``: ``inject = [{kind, rank, at_op?, at_s?, factor?, peer?}, ...]`` and/or a generated swarm
    schedule (``seed``, ``classes?``, ``max_faults?``). Op indexes count the rank's expanded steps from 0."""
    reader = _Reader(source, "faults", top.get("faults", dict))
    raw_injected = reader.get("inject", list, [], what="a list of fault tables")
    if len(raw_injected) > limits.max_faults:
        raise reader.error("inject", exceeded("max_faults", f"{len(raw_injected)} faults", limits.max_faults))
    injected: list[Fault] = []
    for i, raw in enumerate(raw_injected):
        item = _Reader(source, f"faults.inject[{i}]", raw)
        at_s = item.get("at_s", (int, float), None)
        factor = item.get("factor", (int, float), 1.0)
        fault = Fault(
            kind=item.get("kind", str),
            rank=item.get("rank", int),
            at_op=item.get("at_op", int, None),
            at_s=None if at_s is None else _finite(item, "at_s", at_s, 0, limits.max_sim_time_s, "max_sim_time_s"),
            factor=_finite(item, "factor", factor, 1),
            peer=item.get("peer", int, None),
        )
        item.finish()
        try:
            validate(fault, programs)
        except FaultError as err:
            raise ScenarioError(source, f"faults.inject[{i}]", str(err)) from None
        injected.append(fault)
    seed = reader.get("seed", int, None)
    classes = _str_list(reader, "classes", "a list of fault classes")
    max_faults = reader.get("max_faults", int, 2)
    reader.finish()
    if not 0 <= max_faults <= limits.max_faults:
        message = f"expected an integer >= 0, got {max_faults}"
        raise reader.error(
            "max_faults", message if max_faults < 0 else exceeded("max_faults", max_faults, limits.max_faults)
        )
    if seed is None:
        if classes is not None:
            raise reader.error("classes", "only meaningful with a seed (a generated schedule)")
        try:
            check_program_faults_distinct(injected)
        except FaultError as err:
            raise reader.error("inject", str(err)) from None
        return FaultSchedule(None, tuple(sorted({f.kind for f in injected})), tuple(injected)), None
    try:
        generated = generate(seed, programs, classes=classes, max_faults=max_faults)
        check_program_faults_distinct((*injected, *generated.faults))
    except FaultError as err:
        raise reader.error("classes", str(err)) from None
    swarm = FaultSwarm(None if classes is None else tuple(classes), max_faults, len(injected))
    return FaultSchedule(seed, generated.classes, tuple(injected) + generated.faults), swarm


@dataclass(frozen=True, slots=True)
class _MatrixBase:
    """What every [matrix] variant starts from: the scenario's own release, policy, env and profile."""

    release: str
    policy: str
    env: Mapping[str, str]
    profile_ref: str | None
    cluster: Cluster
    base_dir: Path | None
    extra_knobs: tuple[str, ...]


def _matrix(reader: _Reader, base: _MatrixBase, room: int) -> list[Variant]:
    """``[matrix]``: the cartesian product of ``release``, ``policy`` and each ``env`` variable's values.

    Variants are named ``axis=value,...`` over the axes with more than one value, in the order written. The
    product's size is checked against ``max_variants`` (``room`` is what [[variants]] left) before it is taken.
    """
    axes: list[tuple[str, list[str]]] = []
    for key in ("release", "policy"):
        values = reader.get(key, list, [getattr(base, key)], what="a list of strings")
        if not values or not all(isinstance(v, str) for v in values):
            raise reader.error(key, f"expected a non-empty list of strings, got {_shown(values)}")
        for value in values:
            if key == "release" and value not in RELEASES:
                raise reader.error(key, f"unknown torch release {_shown(value)}; expected one of {', '.join(RELEASES)}")
            if key == "policy":
                _check_policy(reader, key, value)
        axes.append((key, values))
    env_axes = reader.get("env", dict, {}, what="a table of environment variables to lists of strings")
    for var, values in env_axes.items():
        key = f"matrix.env.{var}"
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise ScenarioError(reader.source, key, f"expected a non-empty list of strings, got {_shown(values)}")
        _check_knob(reader.source, key, var, base.extra_knobs)
        for value in values:
            problem = value_problem(var, value)
            if problem is not None:
                raise ScenarioError(reader.source, key, problem)
        axes.append((var, values))
    reader.finish()
    size = math.prod(len(values) for _, values in axes)
    if size > room:
        shown = " x ".join(str(len(values)) for _, values in axes)
        raise ScenarioError(reader.source, "matrix", exceeded("max_variants", f"{shown} = {size} variants", room))
    named = [name for name, values in axes if len(values) > 1]
    cluster = base.cluster
    out = []
    for combo in itertools.product(*(values for _, values in axes)):
        chosen = dict(zip((name for name, _ in axes), combo, strict=True))
        env = {**base.env, **{k: v for k, v in chosen.items() if k not in ("release", "policy")}}
        v_release = chosen["release"]
        profile = _profile(reader.source, "matrix.release", base.profile_ref, cluster.gpu.key, v_release, base.base_dir)
        _check_env(reader.source, "matrix.env", profile, env)
        name = ",".join(f"{k}={chosen[k]}" for k in named) or "matrix"
        out.append(Variant(name, "", v_release, profile, env, chosen["policy"]))
    return out


def _check_policy(reader: _Reader, key: str, spec: str) -> None:
    try:
        get_policy(spec)
    except PolicyError as err:
        raise reader.error(key, str(err)) from None


def _policy(reader: _Reader, key: str, default: str) -> str:
    value = reader.get(key, str, default)
    _check_policy(reader, key, value)
    return value


def _release(reader: _Reader, key: str, default: Any = ...) -> str:
    value = reader.get(key, str, default)
    if value not in RELEASES:
        raise reader.error(key, f"unknown torch release {_shown(value)}; expected one of {', '.join(RELEASES)}")
    return value


def _cluster(reader: _Reader, limits: InputLimits) -> Cluster:
    """The cluster, after its size is checked against ``max_world_size`` (ranks and GPUs), before any is made."""
    gpu_key = reader.get("gpu", str)
    try:
        gpu = get_gpu_kind(gpu_key)
    except ClusterError as err:
        raise reader.error("gpu", str(err)) from None
    nodes = reader.get("nodes", int, 1)
    gpus = reader.get("gpus_per_node", int)
    ranks = reader.get("ranks_per_node", int, None)
    reader.finish()
    if nodes >= 1 and gpus >= 0 and (ranks is None or ranks >= 1):
        for what, count in (("GPUs", nodes * gpus), ("ranks", nodes * (gpus if ranks is None else ranks))):
            if count > limits.max_world_size:
                shown = f"{count} {what} (nodes x {'gpus_per_node' if what == 'GPUs' else 'ranks per node'})"
                raise ScenarioError(reader.source, "cluster", exceeded("max_world_size", shown, limits.max_world_size))
    try:
        return Cluster(gpu, nodes, gpus, ranks)
    except ClusterError as err:
        raise ScenarioError(reader.source, "cluster", str(err)) from None


def _profile(source: str, key: str, ref: str | None, gpu: str, release: str, base_dir: Path | None) -> Profile:
    try:
        if ref is None:
            return find_profile(gpu, release)
        candidate = (base_dir / ref) if base_dir is not None and ref.endswith(".toml") else None
        if candidate is not None or os.sep in ref:  # a file, not a built-in name: only a regular, small one
            problem = file_problem(candidate or Path(ref), current_limits().max_file_bytes)
            if problem is not None:
                raise ScenarioError(source, key, f"profile file {_shown(str(candidate or ref))}: {problem}")
        profile = get_profile(str(candidate) if candidate is not None else ref)
    except ProfileError as err:
        raise ScenarioError(source, key, str(err)) from None
    if profile.gpu != gpu:
        raise ScenarioError(source, key, f"profile {profile.name!r} is for GPU {profile.gpu!r}, cluster has {gpu!r}")
    if release not in profile.releases:
        raise ScenarioError(
            source,
            key,
            f"profile {profile.name!r} does not cover torch release {release!r} "
            f"(it covers {', '.join(profile.releases)}); name a profile for that release or omit it",
        )
    return profile


def _check_env(source: str, key: str, profile: Profile, env: Mapping[str, str]) -> None:
    """Validate the NCCL knobs the engine's memory model parses here: bad input is never a traceback."""
    try:
        profile.check_env(env)
    except ProfileError as err:
        raise ScenarioError(source, f"{key}.{err.knob}" if err.knob else key, str(err)) from None


def _check_knob(source: str, key: str, name: str, extra: Sequence[str]) -> None:
    message = unknown_knob_message(name, extra)
    if message is not None:
        raise ScenarioError(source, key, message)


# ---------------------------------------------------------------------------------------------- workload

_OPTION_FIELDS = {f.name for f in fields(PgOptions)}


def _programs(workload: _Reader, world_size: int, limits: InputLimits) -> tuple[Program, ...]:
    if "generator" in workload.table:
        # A framework startup (simnccl.workloads): the framework's own knobs in, every rank's Program out,
        # on the cluster's world; bad knobs are reported as workload.args.<key>.
        from simnccl.workloads import GENERATORS, WorkloadError

        generator = workload.get("generator", str)
        args = workload.get("args", dict, {}, what="a table of the generator's arguments")
        chosen = GENERATORS.get(generator)
        if chosen is None:
            raise workload.error(
                "generator",
                f"unknown workload generator {_shown(generator)}; expected one of {', '.join(GENERATORS)}",
            )
        try:
            return chosen(args, world_size)
        except WorkloadError as err:
            key = f"args.{err.key}" if err.key else "args"
            raise workload.error(key, f"{err.message} (generator {generator!r}, world of {world_size} ranks)") from None
    raw_steps = workload.get("steps", list, what="a list of step tables")
    if not raw_steps:
        raise workload.error("steps", "expected at least one step")
    steps = [
        _step(_Reader(workload.source, f"workload.steps[{i}]", raw), world_size) for i, raw in enumerate(raw_steps)
    ]
    return _expand(workload, steps, world_size, limits)


@dataclass(slots=True)
class _Step:
    """One parsed ``[workload] steps`` entry, before expansion."""

    reader: _Reader
    op_type: type[Op]
    repeat: int
    targets: tuple[int, ...] | None  # None: every rank
    fields: dict[str, Any]
    per_rank: bool  # a field uses {rank}: every rank gets its own ops
    ops: tuple[Op, ...] = ()  # the repeat's ops when they are the same on every rank


def _step(reader: _Reader, world_size: int) -> _Step:
    op_name = reader.get("op", str)
    op_type = OP_TYPES.get(op_name)
    if op_type is None:
        raise reader.error("op", f"unknown op {_shown(op_name)}; expected one of {', '.join(OP_TYPES)}")
    retired = retired_field(op_name, reader.table)
    if retired is not None:
        raise reader.error(*retired)
    repeat = reader.get("repeat", int, 1)
    if repeat < 1:
        raise reader.error("repeat", f"expected an integer >= 1, got {repeat}")
    on_ranks = reader.int_list("on_ranks", None)
    if on_ranks is not None:
        if not on_ranks:
            raise reader.error("on_ranks", "expected at least one rank (omit the key for every rank)")
        bad = [r for r in on_ranks if r < 0 or r >= world_size]
        if bad:
            raise reader.error("on_ranks", f"ranks {_shown(bad)} are outside the world of {world_size}")
    raw_fields = {k: v for k, v in reader.table.items() if k not in ("op", "repeat", "on_ranks")}
    reader.used.update(raw_fields)
    per_rank = any(isinstance(v, str) and "{rank}" in v for v in raw_fields.values())
    targets = None if on_ranks is None else tuple(sorted(set(on_ranks)))
    return _Step(reader, op_type, repeat, targets, raw_fields, per_rank)


def _expand(workload: _Reader, steps: list[_Step], world_size: int, limits: InputLimits) -> tuple[Program, ...]:
    """Every rank's Program. Ranks reached by the same steps share one Program (DESIGN rule 8), so the work
    is the distinct programs' length, not world x length; that length is checked against the limits
    (``max_program_ops``, ``max_expanded_ops``) before a single op is built."""
    everyone = [i for i, st in enumerate(steps) if st.targets is None]
    reached: dict[int, list[int]] = {}  # rank -> the on_ranks steps that reach it, in order
    for i, st in enumerate(steps):
        for rank in st.targets or ():
            reached.setdefault(rank, []).append(i)
    common_length = sum(steps[i].repeat for i in everyone)
    common_per_rank = any(steps[i].per_rank for i in everyone)
    total = 0
    seen: set[tuple[int, ...]] = set()
    for rank in range(world_size):
        own = tuple(reached.get(rank, ()))
        length = common_length + sum(steps[i].repeat for i in own)
        if length > limits.max_program_ops:
            shown = f"rank {rank}'s program of {length} ops (the sum of repeat over its steps)"
            raise workload.error("steps", exceeded("max_program_ops", shown, limits.max_program_ops))
        if common_per_rank or any(steps[i].per_rank for i in own) or own not in seen:
            seen.add(own)
            total += length
    if total > limits.max_expanded_ops:
        shown = f"{total} ops over the distinct programs of {world_size} ranks"
        raise workload.error("steps", exceeded("max_expanded_ops", shown, limits.max_expanded_ops))
    for st in steps:
        if not st.per_rank:
            st.ops = tuple(_build_op(st.reader, st.op_type, st.fields, i, None, world_size) for i in range(st.repeat))
    by_steps: dict[tuple[int, ...], Program] = {}
    by_ops: dict[tuple[Op, ...], Program] = {}
    programs = []
    for rank in range(world_size):
        own = tuple(reached.get(rank, ()))
        program = by_steps.get(own)
        if program is None:
            ops: list[Op] = []
            for i in heapq.merge(everyone, own):
                st = steps[i]
                if st.per_rank:
                    ops.extend(
                        _build_op(st.reader, st.op_type, st.fields, n, rank, world_size) for n in range(st.repeat)
                    )
                else:
                    ops.extend(st.ops)
            key = tuple(ops)
            program = by_ops.setdefault(key, Program(key))
            if not common_per_rank and not any(steps[i].per_rank for i in own):
                by_steps[own] = program
        programs.append(program)
    return tuple(programs)


def _fill(value: Any, i: int, rank: int | None) -> Any:
    if isinstance(value, str):
        value = value.replace("{i}", str(i))
        if rank is not None:
            value = value.replace("{rank}", str(rank))
    return value


# Field names as the file spells them where the op's dataclass field differs (checkpoint ``name``: ``label``).
_FIELD_ALIASES: dict[tuple[str, str], str] = {("checkpoint", "name"): "label"}


def _build_op(
    reader: _Reader, op_type: type[Op], raw: Mapping[str, Any], i: int, rank: int | None, world_size: int
) -> Op:
    allowed = {f.name: f for f in fields(op_type)}
    kwargs: dict[str, Any] = {}
    options: dict[str, Any] = {}
    limits = current_limits()
    for key, value in raw.items():
        value = _fill(value, i, rank)
        if key == "size_mib" and issubclass(op_type, (Collective, PointToPoint)):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise reader.error(key, f"expected a non-negative number of MiB, got {_shown(value)}")
            mib = _finite(reader, key, value, 0, limits.max_message_mib, "max_message_mib", " of MiB")
            kwargs["size_bytes"] = round(mib * MIB)
            continue
        name = _FIELD_ALIASES.get((op_type.name, key), key)
        if name in _OPTION_FIELDS and "pg_options" in allowed:
            try:
                options[name] = check_option(name, value)
            except ValueError as err:
                raise reader.error(key, str(err).removeprefix(f"{name}: ")) from None
            continue
        if name not in allowed or name == "pg_options":
            expected = sorted(_REVERSE_ALIASES.get((op_type.name, k), k) for k in allowed if k != "pg_options")
            if "pg_options" in allowed:
                expected += sorted(_OPTION_FIELDS)
            if issubclass(op_type, (Collective, PointToPoint)):
                expected.append("size_mib")
            raise reader.error(key, f"unknown field for op {op_type.name!r}; expected one of {', '.join(expected)}")
        kwargs[name] = _check_field(reader, key, name, _coerce(reader, key, value, allowed[name].type), world_size)
    if options:
        kwargs["pg_options"] = PgOptions(**options)
    if op_type in (NewGroup, SplitGroup, InitProcessGroup) and kwargs.get("backend") is not None:
        try:
            resolve_backend(RELEASES["2.15"], kwargs["backend"], {})
        except ReleaseError as err:
            raise reader.error("backend", str(err)) from None
    if op_type is SplitGroup and "split_ranks" not in kwargs:
        raise reader.error("split_ranks", "missing; expected a list of lists of parent ranks")
    if op_type is EmptyCache and "mib" not in kwargs:
        raise reader.error("mib", "missing; expected the MiB of the tag's memory given back to the device")
    if issubclass(op_type, PointToPoint):
        peer = kwargs.get("peer")
        if peer is None:
            raise reader.error("peer", "missing; expected the global rank of the other side")
        if not 0 <= peer < world_size:
            raise reader.error("peer", f"expected a rank in 0..{world_size - 1}, got {peer}")
    return op_type(**kwargs)


_REVERSE_ALIASES = {(op, field): key for (op, key), field in _FIELD_ALIASES.items()}


def _check_field(reader: _Reader, key: str, name: str, value: Any, world_size: int) -> Any:
    """Ranges of op fields whose values are sizes, times or ranks (the type is already checked)."""
    limits = current_limits()
    if value is None:
        return value
    if name == "size_bytes":
        return int(_finite(reader, key, value, 0, limits.max_message_mib * MIB, "max_message_mib"))
    if name == "seconds":
        return _finite(reader, key, value, 0, limits.max_sim_time_s, "max_sim_time_s", " of seconds")
    if name == "timeout_s":
        if value <= 0:
            raise reader.error(key, f"expected a positive number of seconds, got {value:g}")
        return _finite(reader, key, value, 0, limits.max_sim_time_s, "max_sim_time_s", " of seconds")
    if name == "mib":
        return _finite(reader, key, value, 0, limits.max_alloc_mib, "max_alloc_mib", " of MiB")
    if name == "gpu_memory_utilization":
        if not (math.isfinite(value) and 0 < value <= 1):
            raise reader.error(key, f"expected a fraction of the GPU's memory in (0, 1], got {value:g}")
        return value
    if name == "src":
        _ranks_in_world(reader, key, (value,), world_size)
    if name == "ranks":
        _ranks_in_world(reader, key, value, world_size)
    if name == "split_ranks":
        if not value:
            raise reader.error(key, "expected at least one split (a list of parent ranks)")
        for index, split in enumerate(value):
            if not split:
                raise reader.error(key, f"split {index} is empty; expected at least one parent rank")
            _ranks_in_world(reader, key, split, world_size)
    if name in ("device", "device_id") and isinstance(value, int) and value < 0:
        raise reader.error(key, f"expected a device index >= 0, got {value}")
    return value


def _ranks_in_world(reader: _Reader, key: str, ranks: Sequence[int], world_size: int) -> None:
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise reader.error(key, f"ranks {_shown(bad)} are outside the world of {world_size} (0..{world_size - 1})")
    duplicates = sorted({r for r in ranks if ranks.count(r) > 1}) if len(set(ranks)) != len(ranks) else []
    if duplicates:
        raise reader.error(key, f"rank(s) {_shown(duplicates)} listed more than once")


def _coerce(reader: _Reader, key: str, value: Any, annotation: str) -> Any:
    """Check one op field against its annotation (the dataclasses use string annotations)."""
    text = str(annotation)
    if key == "split_ranks":
        if not isinstance(value, list) or not all(
            isinstance(s, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in s) for s in value
        ):
            raise reader.error(key, f"expected a list of lists of integers, got {_shown(value)}")
        return tuple(tuple(s) for s in value)
    if text.startswith("tuple[int"):
        if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
            raise reader.error(key, f"expected a list of integers, got {_shown(value)}")
        return tuple(value)
    if text == "bool":
        if not isinstance(value, bool):
            raise reader.error(key, f"expected a boolean, got {_kind(value)} {_shown(value)}")
        return value
    if text == "float" or text.startswith("float"):
        return _finite(reader, key, value, -math.inf)
    if text.startswith("int | str"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise reader.error(key, f"expected an integer or a device string, got {_kind(value)} {_shown(value)}")
        return value
    if text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise reader.error(key, f"expected an integer, got {_kind(value)} {_shown(value)}")
        return value
    if text.startswith("str"):
        if not isinstance(value, str):
            raise reader.error(key, f"expected a string, got {_kind(value)} {_shown(value)}")
        return value
    return value  # pragma: no cover - every op field type is handled above


def _finite(
    reader: _Reader,
    key: str,
    value: float,
    minimum: float,
    maximum: float | None = None,
    limit: str = "",
    unit: str = "",
) -> float:
    """``value`` as a float: finite, >= ``minimum`` and, when given, <= ``maximum`` (the limit ``limit``).

    Non-finite numbers (TOML's ``inf``/``nan``, or an integer past float range) are never a size or a time."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise reader.error(key, f"expected a number{unit}, got {_kind(value)} {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer past float range
        number = math.inf if value > 0 else -math.inf
    if not math.isfinite(number):
        raise reader.error(key, f"expected a finite number{unit}, got {_shown(value)}")
    if number < minimum:
        wanted = f"a non-negative number{unit}" if minimum == 0 else f"a number{unit} >= {minimum:g}"
        raise reader.error(key, f"expected {wanted}, got {number:g}")
    if maximum is not None and number > maximum:
        raise reader.error(
            key, exceeded(limit, f"{number:g}{unit}", maximum) if limit else f"expected at most {maximum:g}"
        )
    return number


# ---------------------------------------------------------------------------------------------- expectations


def _checkpoint_labels(programs: Sequence[Program]) -> frozenset[str]:
    """Every checkpoint label some rank's program passes (each shared program read once)."""
    labels: set[str] = set()
    seen: set[int] = set()
    for program in programs:
        if id(program) in seen:
            continue
        seen.add(id(program))
        labels.update(op.label for op in program.ops if isinstance(op, Checkpoint))
    return frozenset(labels)


def _checkpoint_known(name: str, known: frozenset[str], recovery: bool) -> bool:
    """A checkpoint of the workload, or (recovery runs) one of the orchestrator's markers."""
    if name in known:
        return True
    if not recovery:
        return False
    from simnccl.recovery import MARKER_LABEL  # recovery imports this module

    return MARKER_LABEL.fullmatch(name) is not None


def _expectations(
    top: _Reader,
    source: str,
    variant_names: Sequence[str],
    checkpoints: frozenset[str],
    cluster: Cluster,
) -> list[Expectation]:
    out = []
    recovery = "recovery" in top.table
    for i, raw in enumerate(top.get("expect", list, [], what="an array of tables [[expect]]")):
        reader = _Reader(source, f"expect[{i}]", raw)
        names = _str_list(reader, "variants", "a list of variant names")
        names = list(variant_names) if names is None else list(names)
        for n in names:
            if n not in variant_names:
                raise reader.error(
                    "variants", f"unknown variant {_shown(n)}; expected one of {', '.join(variant_names)}"
                )
        exp = Expectation(
            variants=tuple(names),
            checkpoint=reader.get("checkpoint", str, None),
            baseline=reader.get("baseline", str, None),
            used_mib=_opt_number(reader, "used_mib", -math.inf),
            tolerance_pct=_opt_number(reader, "tolerance_pct", 0),
            tolerance_mib=_opt_number(reader, "tolerance_mib", 0),
            devices=_str_list(reader, "devices", "a list of device keys such as 'n0:cuda:0'") or (),
            verdict=reader.get("verdict", str, None),
            error_contains=reader.get("error_contains", str, None),
            hang_ranks=reader.int_list("hang_ranks", None),
            detected_at_s=_opt_number(reader, "detected_at_s", 0),
            tolerance_s=_default(_opt_number(reader, "tolerance_s", 0), 1e-6),
            key=f"expect[{i}]",
            committed_steps=_opt_count(reader, "committed_steps"),
            lost_steps=_opt_count(reader, "lost_steps"),
            replacement_devices=_str_list(reader, "replacement_devices", "a list of device keys such as 'n0:cuda:6'"),
            fault_detected_at_s=_opt_number(reader, "fault_detected_at_s", 0),
            error_at_s=_opt_number(reader, "error_at_s", 0),
            fr_dump_ranks=reader.int_list("fr_dump_ranks", None),
        )
        reader.finish()
        if exp.verdict is not None and exp.verdict not in VERDICTS:
            raise reader.error("verdict", f"expected one of {', '.join(VERDICTS)}, got {_shown(exp.verdict)}")
        if exp.used_mib is not None and exp.checkpoint is None:
            raise reader.error("used_mib", "needs a checkpoint to measure at")
        if exp.baseline is not None and exp.used_mib is None:
            raise reader.error("baseline", "only meaningful with used_mib")
        asserted = (exp.used_mib, exp.verdict, exp.error_contains, exp.hang_ranks, exp.detected_at_s)
        asserted += (exp.committed_steps, exp.lost_steps, exp.replacement_devices, exp.fault_detected_at_s)
        asserted += (exp.error_at_s, exp.fr_dump_ranks)
        if all(v is None for v in asserted):
            raise ScenarioError(
                source, f"expect[{i}]", "asserts nothing; expected used_mib, verdict, error_contains or hang_ranks"
            )
        for tol in ("tolerance_pct", "tolerance_mib"):
            if getattr(exp, tol) is not None and exp.used_mib is None:
                raise reader.error(tol, "only meaningful with used_mib")
        if exp.tolerance_pct is not None and exp.tolerance_mib is not None:
            raise reader.error("tolerance_mib", "give tolerance_pct or tolerance_mib, not both")
        for key in ("checkpoint", "baseline"):
            name = getattr(exp, key)
            if name is not None and not _checkpoint_known(name, checkpoints, recovery):
                markers = " (a recovery run also has start, ready:<step>, done:<step>, commit:<step>)"
                raise reader.error(key, _unknown_name("checkpoint", name, checkpoints) + (markers if recovery else ""))
        for key in ("devices", "replacement_devices"):
            for device in getattr(exp, key) or ():
                if not _device_exists(cluster, device):
                    raise reader.error(key, _unknown_name("device", device, (d.key for d in cluster.devices())))
        for key in ("hang_ranks", "fr_dump_ranks"):
            ranks = getattr(exp, key)
            if ranks is not None:
                _ranks_in_world(reader, key, ranks, cluster.world_size)
        out.append(exp)
    return out


def _device_exists(cluster: Cluster, key: str) -> bool:
    """``n<node>:cuda:<index>`` names a GPU of the cluster (as the memory ledgers key devices)."""
    match = re.fullmatch(r"n(0|[1-9][0-9]*):cuda:(0|[1-9][0-9]*)", key)
    return match is not None and int(match[1]) < cluster.nodes and int(match[2]) < cluster.gpus_per_node


def _default(value: float | None, default: float) -> float:
    return default if value is None else value


def _unknown_name(what: str, name: str, known: Iterable[str]) -> str:
    """No such checkpoint/device: the nearest known name, or the known ones when few."""
    known = sorted(known)
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if nearest:
        return f"no {what} {_shown(name)} in this scenario; did you mean {nearest[0]!r}?"
    listed = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return f"no {what} {_shown(name)} in this scenario; expected one of {listed or '(none)'}"


def _str_list(reader: _Reader, key: str, what: str) -> tuple[str, ...] | None:
    value = reader.get(key, list, None, what=what)
    if value is not None and not all(isinstance(v, str) for v in value):
        raise reader.error(key, f"expected {what}, got {_shown(value)}")
    return None if value is None else tuple(value)


def _opt_number(reader: _Reader, key: str, minimum: float) -> float | None:
    value = reader.get(key, (int, float), None)
    return None if value is None else _finite(reader, key, value, minimum)


def _opt_count(reader: _Reader, key: str) -> int | None:
    value = reader.get(key, int, None)
    if value is not None and value < 0:
        raise reader.error(key, f"expected an integer >= 0, got {value}")
    return value


def _shown(value: Any, width: int = 120) -> str:
    """``repr(value)`` cut to ``width`` characters: an error message must stay one readable line."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's int-to-text digit limit
        return "an integer of thousands of digits"
    return text if len(text) <= width else f"{text[: width - 5]}...{text[-2:]}"

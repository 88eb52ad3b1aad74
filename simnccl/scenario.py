"""Scenario files: TOML in, a validated Scenario out, or an error naming the file, the key and the expectation.

Scenario files are untrusted input (DESIGN rule 9): parsed with ``tomllib``, every key checked against a
schema, nothing evaluated. Explicit workload steps expand into one Program per rank; ranks whose expanded
steps are identical share one Program object (DESIGN rule 8).

Schema (every table but ``[[variants]]`` and ``[[expect]]`` required unless marked optional)::

    [scenario]   name, description?, seed? (int), policy? ("torch-default")
    [cluster]    gpu, nodes?, gpus_per_node, ranks_per_node?
    [torch]      release, profile? (built-in name or path relative to the file), launcher? (torchrun|spawn), env?
    [workload]   steps = [{op = "...", repeat?, on_ranks?, <op fields>}, ...]  |  generator = "...", args?
    [[variants]] name, description?, env?, release?, profile?, policy?
    [matrix]     release? = [...], policy? = [...], env? = {VAR = [...]}   (cartesian product, added to variants)
    [[expect]]   variants?, checkpoint?, baseline?, used_mib?, tolerance_pct?, tolerance_mib?, devices?,
                 verdict?, error_contains?, hang_ranks?, detected_at_s?, tolerance_s?, error_at_s?, fr_dump_ranks?,
                 committed_steps?, lost_steps?, replacement_devices?, fault_detected_at_s? (recovery runs)
    [faults]     inject? = [{kind, rank, at_op?, at_s?, factor?, peer?}], seed?, classes?, max_faults?
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from simnccl.cluster import Cluster, ClusterError, get_gpu_kind
from simnccl.faults import NO_FAULTS, Fault, FaultError, FaultSchedule, generate, validate
from simnccl.ops import (
    MIB,
    OP_TYPES,
    Collective,
    NewGroup,
    Op,
    PgOptions,
    PointToPoint,
    Program,
    SplitGroup,
    check_option,
)
from simnccl.policy import PolicyError, get_policy
from simnccl.profiles import MAX_NCHANNELS_ENV, Profile, ProfileError, find_profile, get_profile
from simnccl.release import RELEASES, ReleaseError, resolve_backend

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
            raise self.error(name, f"expected {what or _type_name(kind)}, got {_kind(value)} {value!r}")
        return value

    def int_list(self, name: str, default: Any = ...) -> tuple[int, ...] | Any:
        value = self.get(name, list, default, what="a list of integers")
        if value is default and default is not ...:
            return default
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(name, f"expected a list of integers, got {value!r}")
        return tuple(value)

    def env(self, name: str) -> dict[str, str]:
        value = self.get(name, dict, {}, what="a table of strings")
        for k, v in value.items():
            if not isinstance(v, str):
                raise ScenarioError(
                    self.source,
                    f"{self.key(name)}.{k}",
                    f"expected a string (environment values are strings), got {_kind(v)} {v!r}",
                )
        return dict(value)

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise self.error(unknown[0], f"unknown key; expected one of {', '.join(sorted(self.used))}")


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
    """Read and validate a scenario file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, "", "no such file") from None
    except OSError as err:
        raise ScenarioError(source, "", f"cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(source, "", f"not UTF-8 text (TOML files are UTF-8): {err}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(source, "", f"malformed TOML: {err}") from None
    return parse_scenario(data, source, base_dir=path.parent)


def parse_scenario(data: Mapping[str, Any], source: str, base_dir: Path | None = None) -> Scenario:
    top = _Reader(source, "", dict(data))
    meta = _Reader(source, "scenario", top.get("scenario", dict))
    name = meta.get("name", str)
    description = meta.get("description", str, "")
    seed = meta.get("seed", int, 0)
    policy = _policy(meta, "policy", "torch-default")
    meta.finish()

    cluster = _cluster(_Reader(source, "cluster", top.get("cluster", dict)))
    torch = _Reader(source, "torch", top.get("torch", dict))
    release = _release(torch, "release")
    launcher = torch.get("launcher", str, "torchrun")
    if launcher not in LAUNCHERS:
        raise torch.error("launcher", f"expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    base_env = torch.env("env")
    profile_ref = torch.get("profile", str, None)
    torch.finish()
    base_profile = _profile(source, "torch.profile", profile_ref, cluster.gpu.key, release, base_dir)
    _check_env(source, "torch.env", base_profile, base_env)

    workload = _Reader(source, "workload", top.get("workload", dict))
    programs = _programs(workload, cluster.world_size)
    workload.finish()

    raw_variants = top.get("variants", list, [], what="an array of tables [[variants]]")
    variants = []
    for i, raw in enumerate(raw_variants):
        reader = _Reader(source, f"variants[{i}]", raw)
        v_name = reader.get("name", str)
        if any(v.name == v_name for v in variants):
            raise reader.error("name", f"duplicate variant name {v_name!r}")
        v_release = _release(reader, "release", release)
        own_env = reader.env("env")
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
            release,
            policy,
            base_env,
            profile_ref,
            cluster,
            base_dir,
        ):
            if any(v.name == variant.name for v in variants):
                raise ScenarioError(source, "matrix", f"variant {variant.name!r} is also defined in [[variants]]")
            variants.append(variant)
    if not variants:
        variants.append(Variant("default", "", release, base_profile, base_env, policy))

    expectations = _expectations(top, source, [v.name for v in variants])
    faults, swarm = _faults(top, source, programs) if "faults" in top.table else (NO_FAULTS, None)
    recovery = top.get("recovery", dict, None, what="a table ([recovery])")
    top.finish()
    return Scenario(
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


def _faults(top: _Reader, source: str, programs: tuple[Program, ...]) -> tuple[FaultSchedule, FaultSwarm | None]:
    """``[faults]``: ``inject = [{kind, rank, at_op?, at_s?, factor?, peer?}, ...]`` and/or a generated swarm
    schedule (``seed``, ``classes?``, ``max_faults?``). Op indexes count the rank's expanded steps from 0."""
    reader = _Reader(source, "faults", top.get("faults", dict))
    injected: list[Fault] = []
    for i, raw in enumerate(reader.get("inject", list, [], what="a list of fault tables")):
        item = _Reader(source, f"faults.inject[{i}]", raw)
        fault = Fault(
            kind=item.get("kind", str),
            rank=item.get("rank", int),
            at_op=item.get("at_op", int, None),
            at_s=_num(item.get("at_s", (int, float), None)),
            factor=float(item.get("factor", (int, float), 1.0)),
            peer=item.get("peer", int, None),
        )
        item.finish()
        try:
            validate(fault, programs)
        except FaultError as err:
            raise ScenarioError(source, f"faults.inject[{i}]", str(err)) from None
        injected.append(fault)
    seed = reader.get("seed", int, None)
    classes = reader.get("classes", list, None, what="a list of fault classes")
    max_faults = reader.get("max_faults", int, 2)
    reader.finish()
    if seed is None:
        if classes is not None:
            raise reader.error("classes", "only meaningful with a seed (a generated schedule)")
        return FaultSchedule(None, tuple(sorted({f.kind for f in injected})), tuple(injected)), None
    try:
        generated = generate(seed, programs, classes=classes, max_faults=max_faults)
    except FaultError as err:
        raise reader.error("classes", str(err)) from None
    swarm = FaultSwarm(None if classes is None else tuple(classes), max_faults, len(injected))
    return FaultSchedule(seed, generated.classes, tuple(injected) + generated.faults), swarm


def _matrix(
    reader: _Reader,
    release: str,
    policy: str,
    base_env: Mapping[str, str],
    profile_ref: str | None,
    cluster: Cluster,
    base_dir: Path | None,
) -> list[Variant]:
    """``[matrix]``: the cartesian product of ``release``, ``policy`` and each ``env`` variable's values.

    Variants are named ``axis=value,...`` over the axes with more than one value, in the order written.
    """
    axes: list[tuple[str, list[str]]] = []
    for key in ("release", "policy"):
        values = reader.get(key, list, [release if key == "release" else policy], what="a list of strings")
        if not values or not all(isinstance(v, str) for v in values):
            raise reader.error(key, f"expected a non-empty list of strings, got {values!r}")
        for value in values:
            if key == "release" and value not in RELEASES:
                raise reader.error(key, f"unknown torch release {value!r}; expected one of {', '.join(RELEASES)}")
            if key == "policy":
                _check_policy(reader, key, value)
        axes.append((key, values))
    env_axes = reader.get("env", dict, {}, what="a table of environment variables to lists of strings")
    for var, values in env_axes.items():
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise ScenarioError(
                reader.source, f"matrix.env.{var}", f"expected a non-empty list of strings, got {values!r}"
            )
        axes.append((var, values))
    reader.finish()
    named = [name for name, values in axes if len(values) > 1]
    out = []
    for combo in itertools.product(*(values for _, values in axes)):
        chosen = dict(zip((name for name, _ in axes), combo, strict=True))
        env = {**base_env, **{k: v for k, v in chosen.items() if k not in ("release", "policy")}}
        v_release = chosen["release"]
        profile = _profile(reader.source, "matrix.release", profile_ref, cluster.gpu.key, v_release, base_dir)
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
        raise reader.error(key, f"unknown torch release {value!r}; expected one of {', '.join(RELEASES)}")
    return value


def _cluster(reader: _Reader) -> Cluster:
    gpu_key = reader.get("gpu", str)
    try:
        gpu = get_gpu_kind(gpu_key)
    except ClusterError as err:
        raise reader.error("gpu", str(err)) from None
    nodes = reader.get("nodes", int, 1)
    gpus = reader.get("gpus_per_node", int)
    ranks = reader.get("ranks_per_node", int, None)
    reader.finish()
    try:
        return Cluster(gpu, nodes, gpus, ranks)
    except ClusterError as err:
        raise ScenarioError(reader.source, "cluster", str(err)) from None


def _profile(source: str, key: str, ref: str | None, gpu: str, release: str, base_dir: Path | None) -> Profile:
    try:
        if ref is None:
            return find_profile(gpu, release)
        candidate = (base_dir / ref) if base_dir is not None and ref.endswith(".toml") else None
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
    """Validate env values the engine parses (NCCL_MAX_NCHANNELS) here: bad input is never a traceback."""
    try:
        profile.costs_for_env(env)
    except ProfileError as err:
        raise ScenarioError(source, f"{key}.{MAX_NCHANNELS_ENV}", str(err)) from None


# ---------------------------------------------------------------------------------------------- workload

_OPTION_FIELDS = {f.name for f in fields(PgOptions)}


def _programs(workload: _Reader, world_size: int) -> tuple[Program, ...]:
    if "generator" in workload.table:
        # A framework startup (simnccl.workloads): the framework's own knobs in, every rank's Program out,
        # on the cluster's world; bad knobs are reported as workload.args.<key>.
        from simnccl.workloads import GENERATORS, WorkloadError

        generator = workload.get("generator", str)
        args = workload.get("args", dict, {}, what="a table of the generator's arguments")
        chosen = GENERATORS.get(generator)
        if chosen is None:
            raise workload.error(
                "generator", f"unknown workload generator {generator!r}; expected one of {', '.join(GENERATORS)}"
            )
        try:
            return chosen(args, world_size)
        except WorkloadError as err:
            key = f"args.{err.key}" if err.key else "args"
            raise workload.error(key, f"{err.message} (generator {generator!r}, world of {world_size} ranks)") from None
    steps = workload.get("steps", list, what="a list of step tables")
    if not steps:
        raise workload.error("steps", "expected at least one step")
    per_rank: list[list[Op]] = [[] for _ in range(world_size)]
    for index, raw in enumerate(steps):
        reader = _Reader(workload.source, f"workload.steps[{index}]", raw)
        _expand_step(reader, world_size, per_rank)
    shared: dict[tuple[Op, ...], Program] = {}
    programs = []
    for ops in per_rank:
        key = tuple(ops)
        programs.append(shared.setdefault(key, Program(key)))
    return tuple(programs)


def _expand_step(reader: _Reader, world_size: int, per_rank: list[list[Op]]) -> None:
    op_name = reader.get("op", str)
    op_type = OP_TYPES.get(op_name)
    if op_type is None:
        raise reader.error("op", f"unknown op {op_name!r}; expected one of {', '.join(OP_TYPES)}")
    repeat = reader.get("repeat", int, 1)
    if repeat < 1:
        raise reader.error("repeat", f"expected an integer >= 1, got {repeat}")
    on_ranks = reader.int_list("on_ranks", None)
    if on_ranks is not None:
        if not on_ranks:
            raise reader.error("on_ranks", "expected at least one rank (omit the key for every rank)")
        bad = [r for r in on_ranks if r < 0 or r >= world_size]
        if bad:
            raise reader.error("on_ranks", f"ranks {bad} are outside the world of {world_size}")
    raw_fields = {k: v for k, v in reader.table.items() if k not in ("op", "repeat", "on_ranks")}
    templated = any(isinstance(v, str) and "{rank}" in v for v in raw_fields.values())
    targets = range(world_size) if on_ranks is None else sorted(set(on_ranks))
    for i in range(repeat):
        if templated:
            for rank in targets:
                per_rank[rank].append(_build_op(reader, op_type, raw_fields, i, rank, world_size))
        else:
            op = _build_op(reader, op_type, raw_fields, i, None, world_size)
            for rank in targets:
                per_rank[rank].append(op)
    reader.used.update(raw_fields)


def _fill(value: Any, i: int, rank: int | None) -> Any:
    if isinstance(value, str):
        value = value.replace("{i}", str(i))
        if rank is not None:
            value = value.replace("{rank}", str(rank))
    return value


def _build_op(
    reader: _Reader, op_type: type[Op], raw: Mapping[str, Any], i: int, rank: int | None, world_size: int
) -> Op:
    allowed = {f.name: f for f in fields(op_type)}
    kwargs: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for key, value in raw.items():
        value = _fill(value, i, rank)
        if key == "size_mib" and issubclass(op_type, (Collective, PointToPoint)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise reader.error(key, f"expected a non-negative number of MiB, got {value!r}")
            kwargs["size_bytes"] = round(value * MIB)
            continue
        if key == "name" and op_type.name == "checkpoint":
            key = "label"
        if key in _OPTION_FIELDS and "pg_options" in allowed:
            try:
                options[key] = check_option(key, value)
            except ValueError as err:
                raise reader.error(key, str(err).removeprefix(f"{key}: ")) from None
            continue
        if key not in allowed or key == "pg_options":
            expected = sorted(k for k in allowed if k != "pg_options")
            if "pg_options" in allowed:
                expected += sorted(_OPTION_FIELDS)
            if issubclass(op_type, (Collective, PointToPoint)):
                expected.append("size_mib")
            raise reader.error(key, f"unknown field for op {op_type.name!r}; expected one of {', '.join(expected)}")
        kwargs[key] = _coerce(reader, key, value, allowed[key].type, world_size)
    if options:
        kwargs["pg_options"] = PgOptions(**options)
    if op_type in (NewGroup, SplitGroup) and "backend" in kwargs and kwargs["backend"] is not None:
        try:
            resolve_backend(RELEASES["2.15"], kwargs["backend"], {})
        except ReleaseError as err:
            raise reader.error("backend", str(err)) from None
    if op_type.name == "init_process_group" and kwargs.get("backend") is not None:
        try:
            resolve_backend(RELEASES["2.15"], kwargs["backend"], {})
        except ReleaseError as err:
            raise reader.error("backend", str(err)) from None
    if op_type is SplitGroup and "split_ranks" not in kwargs:
        raise reader.error("split_ranks", "missing; expected a list of lists of parent ranks")
    if issubclass(op_type, PointToPoint):
        peer = kwargs.get("peer")
        if peer is None:
            raise reader.error("peer", "missing; expected the global rank of the other side")
        if not 0 <= peer < world_size:
            raise reader.error("peer", f"expected a rank in 0..{world_size - 1}, got {peer}")
    return op_type(**kwargs)


def _coerce(reader: _Reader, key: str, value: Any, annotation: str, world_size: int) -> Any:
    """Check one op field against its annotation (the dataclasses use string annotations)."""
    text = str(annotation)
    if key == "split_ranks":
        if not isinstance(value, list) or not all(
            isinstance(s, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in s) for s in value
        ):
            raise reader.error(key, f"expected a list of lists of integers, got {value!r}")
        return tuple(tuple(s) for s in value)
    if text.startswith("tuple[int"):
        if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
            raise reader.error(key, f"expected a list of integers, got {value!r}")
        return tuple(value)
    if text == "bool":
        if not isinstance(value, bool):
            raise reader.error(key, f"expected a boolean, got {_kind(value)} {value!r}")
        return value
    if text == "float" or text.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise reader.error(key, f"expected a number, got {_kind(value)} {value!r}")
        return float(value)
    if text.startswith("int | str"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise reader.error(key, f"expected an integer or a device string, got {_kind(value)} {value!r}")
        return value
    if text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise reader.error(key, f"expected an integer, got {_kind(value)} {value!r}")
        return value
    if text.startswith("str"):
        if not isinstance(value, str):
            raise reader.error(key, f"expected a string, got {_kind(value)} {value!r}")
        return value
    return value  # pragma: no cover - every op field type is handled above


# ---------------------------------------------------------------------------------------------- expectations


def _expectations(top: _Reader, source: str, variant_names: Sequence[str]) -> list[Expectation]:
    out = []
    for i, raw in enumerate(top.get("expect", list, [], what="an array of tables [[expect]]")):
        reader = _Reader(source, f"expect[{i}]", raw)
        names = reader.get("variants", list, list(variant_names), what="a list of variant names")
        for n in names:
            if n not in variant_names:
                raise reader.error("variants", f"unknown variant {n!r}; expected one of {', '.join(variant_names)}")
        number = (int, float)
        exp = Expectation(
            variants=tuple(names),
            checkpoint=reader.get("checkpoint", str, None),
            baseline=reader.get("baseline", str, None),
            used_mib=_num(reader.get("used_mib", number, None)),
            tolerance_pct=_num(reader.get("tolerance_pct", number, None)),
            tolerance_mib=_num(reader.get("tolerance_mib", number, None)),
            devices=tuple(reader.get("devices", list, [], what="a list of device keys such as 'n0:cuda:0'")),
            verdict=reader.get("verdict", str, None),
            error_contains=reader.get("error_contains", str, None),
            hang_ranks=reader.int_list("hang_ranks", None),
            detected_at_s=_num(reader.get("detected_at_s", number, None)),
            tolerance_s=float(reader.get("tolerance_s", number, 1e-6)),
            key=f"expect[{i}]",
            committed_steps=reader.get("committed_steps", int, None),
            lost_steps=reader.get("lost_steps", int, None),
            replacement_devices=_str_tuple(reader, "replacement_devices"),
            fault_detected_at_s=_num(reader.get("fault_detected_at_s", number, None)),
            error_at_s=_num(reader.get("error_at_s", number, None)),
            fr_dump_ranks=reader.int_list("fr_dump_ranks", None),
        )
        reader.finish()
        if exp.verdict is not None and exp.verdict not in VERDICTS:
            raise reader.error("verdict", f"expected one of {', '.join(VERDICTS)}, got {exp.verdict!r}")
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
            value = getattr(exp, tol)
            if value is not None and value < 0:
                raise reader.error(tol, f"expected a non-negative number, got {value:g}")
            if value is not None and exp.used_mib is None:
                raise reader.error(tol, "only meaningful with used_mib")
        if not all(isinstance(d, str) for d in exp.devices):
            raise reader.error(
                "devices", f"expected a list of device keys such as 'n0:cuda:0', got {list(exp.devices)}"
            )
        out.append(exp)
    return out


def _str_tuple(reader: _Reader, key: str) -> tuple[str, ...] | None:
    value = reader.get(key, list, None, what="a list of device keys such as 'n0:cuda:6'")
    if value is not None and not all(isinstance(v, str) for v in value):
        raise reader.error(key, f"expected a list of device keys such as 'n0:cuda:6', got {value!r}")
    return None if value is None else tuple(value)


def _num(value: int | float | None) -> float | None:
    return None if value is None else float(value)

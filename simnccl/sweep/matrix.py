"""A sweep's matrix: read from flags or a TOML file, validated axis by axis, counted, then expanded into cells.

Why validate before expanding: a matrix is a product, and a typo in one axis (an unknown GPU, a policy that
does not load, a release without a profile for one GPU) must be refused in a second with the flag or key that
holds it, not after hours of cells, and a product too large to be meant (``--max-cells``) must be refused
before a single cell object exists. Every value of every axis is checked once; the cell count is the product
of the axis lengths; only then are cells made.

TOML (every table optional; keys not listed are refused)::

    [sweep]      gpus_per_node? (8), cell_timeout_s? (600), max_cells? (10000)
    [[workload]] generator, args? = {knob = value}, world?, label?
    [[scenario]] file (relative to the matrix file), variants? = [...]
    [axes]       policy? = [...], release? = [...], gpu? = [...], env? = [{VAR = "value"}, ...]
    [env]        VAR = "value"             (set in every cell)
    [check]      verdict? = ["pass"], max_used_mib?

Workload cells are the product workloads x policies x releases x GPU kinds x env sets. A scenario variant is
one cell per policy (when the policy axis is given; else the variant's own) and per env set; its release and
GPU are its own (the profile is tied to them), and its ``[[expect]]`` tables are its check.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simnccl import __version__
from simnccl.cli_options import repeated_env
from simnccl.cluster import ClusterError, get_gpu_kind
from simnccl.cost import CostError, parse_knobs
from simnccl.env_knobs import NO_SCENARIO_DECLARES, env_problem, is_env_name
from simnccl.expect import ACCEPTABLE
from simnccl.limits import current as current_limits
from simnccl.limits import exceeded, file_problem, nesting_depth, number_text
from simnccl.policy import PolicyError, get_policy
from simnccl.policy.as_captured import replayed_as
from simnccl.policy.sources import file_digest, policy_sources
from simnccl.policy.specs import describe_policy
from simnccl.profiles import ProfileError, find_profile
from simnccl.release import RELEASES
from simnccl.scenario import Scenario, ScenarioError, load_scenario
from simnccl.scenario.reader import first_repeat
from simnccl.table_keys import key_problem
from simnccl.visible_text import brief
from simnccl.workloads import GENERATORS, WorkloadError

DEFAULT_GPU = "h100-80gb"
DEFAULT_RELEASE = "2.15"
DEFAULT_POLICY = "torch-default"
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_CELL_TIMEOUT_S = 600.0
DEFAULT_MAX_CELLS = 10_000
MAX_CELLS_CEILING = 1_000_000  # what --max-cells may be raised to: a bigger sweep is several sweeps
MAX_AXIS_VALUES = 1_000  # per axis: validation itself stays bounded
MAX_WORLD = 1 << 20
MAX_CELL_TIMEOUT_S = 7 * 24 * 3600.0


class SweepInputError(ValueError):
    """Bad sweep input (exit 2): ``where`` is the flag or ``file: key`` that holds the bad value."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True, slots=True)
class WorkloadEntry:
    """One framework config: a generator, the knobs given (JSON types), the world they make."""

    label: str
    generator: str
    knobs: Mapping[str, Any]
    world: int
    # the generator's whole config, defaults included (JSON): two spellings of one config share it
    config_key: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "generator": self.generator, "knobs": dict(self.knobs), "world": self.world}


def scenario_key(path: str) -> str:
    """A scenario's file as a sweep's identities name it: the file's name, however its path was spelled (the
    content is the identity's sha256). One rule for the matrix, ``Cell.identity`` and the resume check of a row."""
    return Path(path).name if path else path


@dataclass(frozen=True, slots=True)
class ScenarioEntry:
    """A scenario file and the variants chosen. ``sha256`` hashes the file's bytes and, where the chosen variants
    load any, the user's files they compute from (``scenario_inputs``): an edited file is another matrix."""

    path: str
    sha256: str
    variants: tuple[str, ...]
    scenario: Scenario = field(compare=False, repr=False)
    resolved: str = field(default="", compare=False)  # the file itself: two spellings of its path share it

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.path, "sha256": self.sha256, "variants": list(self.variants)}

    def identity(self) -> dict[str, Any]:
        """What the entry computes: the file's name and content, not how its path was spelled (from another
        folder, or relative vs absolute, one file made another matrix, and --resume refused its own output)."""
        return {"file": scenario_key(self.path), "sha256": self.sha256, "variants": list(self.variants)}


@dataclass(frozen=True, slots=True)
class Checks:
    """What a workload cell must show to be ok: a verdict among ``verdicts``, used MiB/device within a cap."""

    verdicts: tuple[str, ...] = ("pass",)
    max_used_mib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        # sorted: a set of accepted verdicts (given in another order, the matrix hash and every cell_id changed)
        return {"verdicts": sorted(self.verdicts), "max_used_mib": self.max_used_mib}


@dataclass(frozen=True, slots=True)
class Matrix:
    """A validated matrix. Its ``to_dict`` is its identity: ``fingerprint`` hashes it for resume."""

    workloads: tuple[WorkloadEntry, ...]
    scenarios: tuple[ScenarioEntry, ...]
    policies: tuple[str, ...]  # () = default: torch-default for workloads, the variant's own for scenarios
    releases: tuple[str, ...]
    gpus: tuple[str, ...]
    env: Mapping[str, str]
    env_sets: tuple[Mapping[str, str], ...]
    gpus_per_node: int
    checks: Checks
    # each user policy of ``policies`` -> its source files' digests (``policy.sources``): an edited policy is
    # another matrix, and its cells other cells (``Cell.policy_source``), so --resume never keeps their old rows
    policy_sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        sources = {spec: dict(sorted(files.items())) for spec, files in sorted(self.policy_sources.items()) if files}
        return {
            **({"policy_sources": sources} if sources else {}),  # absent where no policy is the user's
            # the model and the built-in policies are simnccl's: a row of another version is another result
            "simnccl": __version__,
            "workloads": [w.to_dict() for w in self.workloads],
            "scenarios": [s.to_dict() for s in self.scenarios],
            "policies": list(self.policies),
            "releases": list(self.releases),
            "gpus": list(self.gpus),
            "env": dict(sorted(self.env.items())),
            "env_sets": [dict(sorted(e.items())) for e in self.env_sets],
            "gpus_per_node": self.gpus_per_node,
            "checks": self.checks.to_dict(),
        }

    def fingerprint(self) -> str:
        return digest({**self.to_dict(), "scenarios": [s.identity() for s in self.scenarios]})

    def cell_count(self) -> int:
        """The number of cells, computed from the axis lengths (nothing expanded)."""
        workload_cells = len(self.workloads) * (len(self.policies) or 1) * len(self.releases) * len(self.gpus)
        variants = sum(len(s.variants) for s in self.scenarios)
        return (workload_cells + variants * (len(self.policies) or 1)) * len(self.env_sets)


@dataclass(frozen=True, slots=True)
class Settings:
    """How the sweep runs (not what it computes: none of this is in the matrix's identity)."""

    cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S
    max_cells: int = DEFAULT_MAX_CELLS


def digest(data: Any) -> str:
    """A stable short hash of JSON-able data (sorted keys): the same in every process and on every machine."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- reading


def read_matrix_file(path: Path) -> dict[str, Any]:
    """The matrix TOML, read only when it is a regular file within ``max_file_bytes`` (``/dev/zero`` was read
    until the process was killed) and nested no deeper than ``max_nesting_depth``."""
    limits = current_limits()
    problem = file_problem(path, limits.max_file_bytes)
    if problem is not None:
        raise SweepInputError(str(path), problem)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise SweepInputError(str(path), "no such file") from None
    except OSError as err:
        raise SweepInputError(str(path), f"cannot read: {err.strerror}") from None
    except ValueError as err:  # TOMLDecodeError, UnicodeDecodeError, int()'s own (an integer of > 4300 digits)
        raise SweepInputError(str(path), f"not valid TOML: {err}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise SweepInputError(str(path), exceeded("max_nesting_depth", "nesting", limits.max_nesting_depth)) from None
    depth = nesting_depth(data)
    if depth > limits.max_nesting_depth:
        raise SweepInputError(
            str(path), exceeded("max_nesting_depth", f"nesting {depth} deep", limits.max_nesting_depth)
        )
    _only(data, {"sweep", "workload", "scenario", "axes", "env", "check"}, str(path), "")
    return data


def _only(table: Any, allowed: Iterable[str], source: str, prefix: str) -> None:
    problem = key_problem(table, allowed=allowed, path=prefix.removesuffix("."))
    if problem is not None:
        raise SweepInputError(f"{source}: {problem.key}" if problem.key else source, problem.message)


def _list(value: Any, where: str, kind: type) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise SweepInputError(where, f"expected a list of {kind.__name__} values, got {value!r}")
    if not value:
        raise SweepInputError(where, "expected at least one value")
    if len(value) > MAX_AXIS_VALUES:
        raise SweepInputError(where, f"{len(value)} values: more than the limit of {MAX_AXIS_VALUES}")
    return value


def _number(value: Any, where: str, low: float, high: float, integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if not ok or isinstance(value, bool) or not math.isfinite(value) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise SweepInputError(where, f"expected {kind} in [{number_text(low)}, {number_text(high)}], got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------- validating


def _workload_from_table(table: Any, source: str, index: int) -> tuple[str, dict[str, Any], int | None, str | None]:
    _only(table, {"generator", "args", "world", "label"}, source, f"workload[{index}].")
    where = f"{source}: workload[{index}]"
    name = table.get("generator")
    if not isinstance(name, str):
        raise SweepInputError(f"{where}.generator", f"expected a generator name ({', '.join(GENERATORS)})")
    args = table.get("args", {})
    if not isinstance(args, Mapping):
        raise SweepInputError(f"{where}.args", f"expected a table of knobs, got {args!r}")
    world = table.get("world")
    if world is not None:
        _number(world, f"{where}.world", 1, MAX_WORLD, integer=True)
    label = table.get("label")
    if label is not None and not isinstance(label, str):
        raise SweepInputError(f"{where}.label", f"expected a string, got {label!r}")
    return name, dict(args), world, label


def _workload_from_flag(text: str) -> tuple[str, dict[str, Any], int | None, str | None]:
    """``"megatron tp=2 pp=2 dp=2 world=8"``: a generator, then its knobs as ``name=value`` (``moe``, ``no-gloo``
    for booleans), typed by the generator exactly as ``simnccl cost --tp 2`` types them."""
    where = f"--workload {text!r}"
    tokens = text.split()
    if not tokens:
        raise SweepInputError("--workload", "expected 'GENERATOR knob=value ...', got an empty string")
    name, rest = tokens[0], tokens[1:]
    generator = GENERATORS.get(name)
    if generator is None:
        raise SweepInputError(where, f"unknown workload generator {name!r}; expected one of {', '.join(GENERATORS)}")
    world = None
    flags = []
    named: set[str] = set()
    for token in rest:
        key, sep, value = token.partition("=")
        if key in named:  # "megatron tp=2 tp=4": which one was meant? (the last silently won)
            raise SweepInputError(where, f"knob {key!r} is given twice")
        named.add(key)
        if key == "world" and sep:
            try:
                number = int(value)
            except ValueError:
                raise SweepInputError(f"{where}: world", f"expected an integer, got {brief(value)}") from None
            # outside the try: its range error (a ValueError too) read as "expected an integer" for world=-8
            world = _number(number, f"{where}: world", 1, MAX_WORLD, integer=True)
            continue
        flags.append(f"--{token}")
    try:
        knobs = parse_knobs(generator, flags)
    except CostError as err:
        raise SweepInputError(where, str(err).replace("option --", "knob ").replace("--", "")) from None
    return name, knobs, world, None


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def check_workload(
    raw: tuple[str, dict[str, Any], int | None, str | None], where: str, gpus_per_node: int
) -> WorkloadEntry:
    """The generator's own checks (knob types, sizes that fit the world), without building any Program."""
    name, args, world, label = raw
    generator = GENERATORS.get(name)
    if generator is None:
        raise SweepInputError(where, f"unknown workload generator {name!r}; expected one of {', '.join(GENERATORS)}")
    try:
        config = generator.config(args)
        natural = generator.natural_world(config)
        if world is None and natural is None:
            raise SweepInputError(where, f"the {name} knobs given do not pin the world size down; add world=N")
        if world is not None and natural is not None and world != natural:
            raise SweepInputError(where, f"world={world} does not match the {natural} ranks the knobs imply")
        size = world if world is not None else natural
        assert size is not None
        limit = current_limits().max_world_size  # the limit each cell's generator checks, named as cost names it
        if size > limit:
            raise SweepInputError(where, exceeded("max_world_size", f"a world of {size} ranks", limit))
        args = dict(args)
        if "local_world_size" in config and "local_world_size" not in args:  # as simnccl cost sets it
            config["local_world_size"] = args["local_world_size"] = min(gpus_per_node, size)
        generator.check(config, size)
    except WorkloadError as err:
        raise SweepInputError(f"{where}: {err.key}" if err.key else where, err.message) from None
    per_node = min(gpus_per_node, size)
    if size % per_node:
        raise SweepInputError(where, f"a world of {size} ranks is not whole nodes of {gpus_per_node} GPUs")
    knobs = {k: _jsonable(generator.param(k).check(v)) for k, v in sorted(args.items())}  # type: ignore[union-attr]
    given = {k: v for k, v in knobs.items() if k in raw[1]}
    shown = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in given.items())
    text = f"{name} {shown}".strip() + (f" world={size}" if natural is None else "")
    whole = json.dumps({k: _jsonable(v) for k, v in config.items()}, sort_keys=True, default=str)
    return WorkloadEntry(label or text, name, knobs, size, f"{name} {whole} world={size}")


def check_scenario(path_text: str, variants: Sequence[str] | None, where: str, base: Path | None) -> ScenarioEntry:
    path = Path(path_text)
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        scenario = load_scenario(path)
        chosen = tuple(variants) if variants else tuple(v.name for v in scenario.variants)
        for name in chosen:
            scenario.variant(name)
    except ScenarioError as err:
        raise SweepInputError(where, str(err)) from None
    content = hashlib.sha256(path.read_bytes())
    inputs = scenario_inputs(scenario, chosen)
    if inputs:
        content.update(json.dumps(inputs, sort_keys=True).encode())
    return ScenarioEntry(str(path_text), content.hexdigest()[:16], chosen, scenario, os.path.realpath(path))


def scenario_inputs(scenario: Scenario, variants: Sequence[str]) -> dict[str, str]:
    """The user's files the chosen variants compute from, with a digest of each: a profile file outside simnccl
    (``profile = "mine.toml"``) and the sources of a user's policy (``policy.sources``). A sweep row holds only
    while they are what they were (``--resume`` kept a profile's old rows after its overheads changed)."""
    inputs: dict[str, str] = {}
    for name in variants:
        variant = scenario.variant(name)
        profile = Path(variant.profile.path)
        if not profile.resolve().is_relative_to(_PACKAGE):  # a built-in profile is versioned with simnccl
            inputs[str(profile.resolve())] = file_digest(str(profile)) or "unreadable"
        inputs.update(policy_sources(variant.policy))
    return inputs


def policy_key(spec: str) -> str:
    """What a policy spec names, whatever its spelling (``budget(2048)`` and ``budget(2048.0)`` are one policy):
    its description as a file would keep it, else the spec itself."""
    try:
        return json.dumps(describe_policy(get_policy(spec)), sort_keys=True)
    except (PolicyError, TypeError, ValueError):  # one that cannot be described: compared by its spec (loaded)
        return spec


_PACKAGE = Path(__file__).resolve().parents[1]  # simnccl's own files


def check_policy(spec: str, where: str) -> str:
    try:
        get_policy(spec)
    except PolicyError as err:
        raise SweepInputError(where, str(err)) from None
    except (ImportError, AttributeError, TypeError, ValueError) as err:  # a user's import spec that breaks
        raise SweepInputError(where, f"cannot load policy {spec!r}: {type(err).__name__}: {err}") from None
    return spec


def check_env(env: Any, where: str) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise SweepInputError(where, f'expected a table of VAR = "value", got {env!r}')
    out = {}
    for name, value in env.items():
        if not is_env_name(name):
            raise SweepInputError(where, f"expected an environment variable name, got {name!r}")
        if not isinstance(value, str) or "\x00" in value:
            raise SweepInputError(f"{where}.{name}", f"expected a string value, got {value!r}")
        problem = env_problem(name, value, declare=NO_SCENARIO_DECLARES)  # a misspelt knob would sweep torch's default
        if problem is not None:
            raise SweepInputError(f"{where}.{name}", problem)
        out[name] = value
    return out


def parse_env_set(text: str, where: str) -> dict[str, str]:
    """``--env-set "NCCL_MAX_NCHANNELS=4 TORCH_DIST_USE_NCCL2=0"``: one value of the env axis ("" = none)."""
    env = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep:
            raise SweepInputError(where, f"expected VAR=VALUE items, got {item!r}")
        if name in env:  # the last silently won
            raise SweepInputError(where, f"{name} is given twice")
        env[name] = value
    return check_env(env, where)


def _unique(values: Sequence[Any], where: str) -> tuple[Any, ...]:
    twice = first_repeat(values)
    if twice is not None:
        raise SweepInputError(where, f"{twice[0]!r} is given twice: each value of an axis is one set of cells")
    return tuple(values)


def _unique_by(values: Sequence[Any], key: Any, where: str, shown: str = "") -> tuple[Any, ...]:
    """``values``, refused where two name the same thing by ``key`` (two spellings of one policy, one config,
    one file) though their texts differ: each is one set of cells, and two would be the same simulations twice."""
    seen: dict[str, Any] = {}
    for value in values:
        if key(value) in seen:
            first = seen[key(value)]
            a, b = (getattr(first, shown), getattr(value, shown)) if shown else (first, value)
            said = f"{a!r} is given twice" if a == b else f"{a!r} and {b!r} are the same"
            raise SweepInputError(where, f"{said}: each value of an axis is one set of cells")
        seen[key(value)] = value
    return tuple(values)


def _check_profiles(matrix: Matrix, where: dict[str, str]) -> None:
    """Every GPU x release pair of the workload cells has its built-in profile; every env set parses on it."""
    if not matrix.workloads:
        return
    for gpu in matrix.gpus:
        try:
            get_gpu_kind(gpu)
        except ClusterError as err:
            raise SweepInputError(where["gpu"], str(err)) from None
    for release in matrix.releases:
        if release not in RELEASES:
            raise SweepInputError(
                where["release"], f"unknown torch release {release!r}; expected one of {', '.join(RELEASES)}"
            )
    for gpu in matrix.gpus:
        for release in matrix.releases:
            try:
                profile = find_profile(gpu, release)
            except ProfileError as err:
                raise SweepInputError(f"{where['gpu']}/{where['release']}", str(err)) from None
            try:  # the variables set in every cell alone first: an error there is theirs, not the axis'
                profile.check_env(matrix.env)
            except ProfileError as err:
                raise SweepInputError(where["fixed"], str(err)) from None
            for env in matrix.env_sets:
                try:
                    profile.check_env({**matrix.env, **env})
                except ProfileError as err:
                    raise SweepInputError(where["env"], str(err)) from None


def _tables(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    tables = data.get(key, [])
    if not isinstance(tables, list) or len(tables) > MAX_AXIS_VALUES:
        raise SweepInputError(f"{source}: {key}", f"expected at most {MAX_AXIS_VALUES} [[{key}]] tables")
    return tables


def _workloads(args: Any, data: Mapping[str, Any], source: str, gpus_per_node: int) -> list[WorkloadEntry]:
    """``--workload`` flags, or else the file's ``[[workload]]`` tables."""
    if args.workload:
        if len(args.workload) > MAX_AXIS_VALUES:
            raise SweepInputError("--workload", f"more than the limit of {MAX_AXIS_VALUES} configs")
        return [check_workload(_workload_from_flag(t), f"--workload {t!r}", gpus_per_node) for t in args.workload]
    return [
        check_workload(_workload_from_table(table, source, i), f"{source}: workload[{i}]", gpus_per_node)
        for i, table in enumerate(_tables(data, "workload", source))
    ]


def _scenarios(args: Any, data: Mapping[str, Any], source: str, base: Path | None) -> list[ScenarioEntry]:
    """``--scenario`` flags, or else the file's ``[[scenario]]`` tables (paths relative to the file)."""
    if args.scenario:
        return [check_scenario(text, args.variant, f"--scenario {text}", None) for text in args.scenario]
    out = []
    for i, table in enumerate(_tables(data, "scenario", source)):
        where = f"{source}: scenario[{i}]"
        _only(table, {"file", "variants"}, source, f"scenario[{i}].")
        if not isinstance(table.get("file"), str):
            raise SweepInputError(f"{where}.file", "expected the path of a scenario file")
        variants = _list(table["variants"], f"{where}.variants", str) if "variants" in table else None
        out.append(check_scenario(table["file"], args.variant or variants, where, base))
    return out


def build_matrix(args: Any, data: Mapping[str, Any] | None, source: str, base: Path | None) -> tuple[Matrix, Settings]:
    """The validated matrix from the flags (``args``) and the TOML file's ``data``; a flag given replaces the
    file's key of the same meaning (``--workload`` the ``[[workload]]`` tables, ``--policy`` ``axes.policy``).
    Raises SweepInputError naming the flag or key."""
    data = data or {}
    sweep = data.get("sweep", {})
    _only(sweep, {"gpus_per_node", "cell_timeout_s", "max_cells"}, source, "sweep.")
    axes = data.get("axes", {})
    _only(axes, {"policy", "release", "gpu", "env"}, source, "axes.")
    check = data.get("check", {})
    _only(check, {"verdict", "max_used_mib"}, source, "check.")

    def pick(flag_value: Any, flag: str, table: Mapping[str, Any], key: str, prefix: str) -> tuple[Any, str]:
        """The flag's value, else the table's (an empty or false value there is given, and checked: only an
        absent key is "not given"), else None."""
        if flag_value not in (None, []):
            return flag_value, flag
        if key in table:
            return table[key], f"{source}: {prefix}{key}"
        return None, flag  # neither given: the default applies, and the flag is where to change it

    gpn, gpn_where = pick(args.gpus_per_node, "--gpus-per-node", sweep, "gpus_per_node", "sweep.")
    gpus_per_node = _number(DEFAULT_GPUS_PER_NODE if gpn is None else gpn, gpn_where, 1, 1024, integer=True)
    timeout, timeout_where = pick(args.cell_timeout, "--cell-timeout", sweep, "cell_timeout_s", "sweep.")
    timeout_s = DEFAULT_CELL_TIMEOUT_S if timeout is None else timeout
    finite = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and math.isfinite(timeout_s)
    if not (finite and 0 < timeout_s <= MAX_CELL_TIMEOUT_S):  # one range, said as checked ([0, ...] refused 0)
        raise SweepInputError(
            timeout_where, f"expected a number of seconds in (0, {number_text(MAX_CELL_TIMEOUT_S)}], got {timeout_s!r}"
        )
    max_cells, max_where = pick(args.max_cells, "--max-cells", sweep, "max_cells", "sweep.")
    max_cells = _number(DEFAULT_MAX_CELLS if max_cells is None else max_cells, max_where, 1, MAX_CELLS_CEILING, True)

    workloads = _workloads(args, data, source, gpus_per_node)
    scenarios = _scenarios(args, data, source, base)
    if not workloads and not scenarios:
        raise SweepInputError("--workload", "the matrix has no cells: give --workload/--scenario or a matrix file")
    _unique([w.label for w in workloads], "--workload" if args.workload else f"{source}: workload")
    _unique_by(workloads, lambda w: w.config_key, "--workload" if args.workload else f"{source}: workload", "label")
    _unique([s.path for s in scenarios], "--scenario" if args.scenario else f"{source}: scenario")
    variants_seen: dict[tuple[str, str], str] = {}
    for entry in scenarios:  # one file under two spellings of its path: the same variants twice
        for name in entry.variants:
            first = variants_seen.setdefault((entry.resolved, name), entry.path)
            if first != entry.path:
                raise SweepInputError(
                    "--scenario" if args.scenario else f"{source}: scenario",
                    f"{first!r} and {entry.path!r} are the same file: variant {name!r} would be simulated twice",
                )

    policies, policy_where = pick(args.policy, "--policy", axes, "policy", "axes.")
    policies = [] if policies is None else [check_policy(p, policy_where) for p in _list(policies, policy_where, str)]
    for entry in scenarios:  # a capture's steps (as-captured) are replayed, never decided again by another policy
        for name in entry.variants:
            for policy in policies:
                try:
                    replayed_as(entry.scenario.variant(name).policy, policy)
                except ValueError as err:
                    raise SweepInputError(policy_where, f"{entry.path}: variant {name!r}: {err}") from None
    releases, release_where = pick(args.release, "--release", axes, "release", "axes.")
    releases = [DEFAULT_RELEASE] if releases is None else _list(releases, release_where, str)
    gpus, gpu_where = pick(args.gpu, "--gpu", axes, "gpu", "axes.")
    gpus = [DEFAULT_GPU] if gpus is None else _list(gpus, gpu_where, str)
    if args.env_set:
        env_where = "--env-set"
        env_sets = [parse_env_set(text, env_where) for text in _list(args.env_set, env_where, str)]
    else:
        env_where = f"{source}: axes.env"
        raw_sets = _list(axes["env"], env_where, dict) if "env" in axes else [{}]
        env_sets = [check_env(e, f"{env_where}[{i}]") for i, e in enumerate(raw_sets)]
    if args.env:
        fixed_where = "--env"
        twice = repeated_env(args.env)
        if twice is not None:
            raise SweepInputError(fixed_where, twice)
        fixed = check_env(dict(args.env), fixed_where)
    else:
        fixed_where = f"{source}: env"
        fixed = check_env(data.get("env", {}), fixed_where)
    verdicts, verdict_where = pick(args.accept_verdict, "--accept-verdict", check, "verdict", "check.")
    verdicts = ["pass"] if verdicts is None else _list(verdicts, verdict_where, str)
    for verdict in verdicts:  # race: a pass a race decided is ok (``pass_decided_by_race``)
        if verdict not in ACCEPTABLE:
            expected = ", ".join(ACCEPTABLE)
            raise SweepInputError(verdict_where, f"unknown verdict {verdict!r}; expected one of {expected}")
    cap, cap_where = pick(args.max_used_mib, "--max-used-mib", check, "max_used_mib", "check.")
    if cap is not None:
        _number(cap, cap_where, 0, 1e9)

    matrix = Matrix(
        workloads=tuple(workloads),
        scenarios=tuple(scenarios),
        policies=_unique_by(policies, policy_key, policy_where),
        releases=_unique(releases, release_where),
        gpus=_unique(gpus, gpu_where),
        env=fixed,
        env_sets=_unique(env_sets, env_where),
        gpus_per_node=gpus_per_node,
        checks=Checks(_unique(verdicts, verdict_where), None if cap is None else float(cap)),
        policy_sources={spec: policy_sources(spec) for spec in policies},
    )
    _check_profiles(matrix, {"gpu": gpu_where, "release": release_where, "env": env_where, "fixed": fixed_where})
    count = matrix.cell_count()
    if count > max_cells:
        raise SweepInputError(
            max_where,
            f"the matrix has {count} cells, more than the limit of {max_cells} (raise --max-cells, at most "
            f"{MAX_CELLS_CEILING}, or split the sweep)",
        )
    return matrix, Settings(cell_timeout_s=float(timeout_s), max_cells=max_cells)

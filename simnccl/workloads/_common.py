"""What every framework generator shares: typed knobs, argument validation, and Program sharing.

Why one place: the scenario hook (``[workload] generator = "...", args = {...}``) and ``simnccl cost`` both
hand a generator untrusted arguments (DESIGN rule 9), so every generator declares its knobs as ``Param``s and
gets the same checks and the same error texts (``WorkloadError`` names the key). And every generator must give
ranks with identical programs one shared ``Program`` object (rule 8), which ``programs_by_key`` does without
comparing op lists: a generator says which ranks can differ (a key per rank) and builds each list once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simnccl.limits import current as current_limits
from simnccl.limits import exceeded
from simnccl.ops import Op, Program

INT, BOOL, FLOAT, STR, INT_LIST, STR_LIST, TABLE = "int", "bool", "float", "str", "int_list", "str_list", "table"

_KIND_TEXT = {
    INT: "an integer",
    BOOL: "a boolean",
    FLOAT: "a number",
    STR: "a string",
    INT_LIST: "a list of integers",
    STR_LIST: "a list of strings",
    TABLE: "a table",
}


# The largest integer a float holds exactly: a generator knob (minutes, sizes, counts) is used in float arithmetic,
# and an integer past it is either rounded or, past float range, an OverflowError instead of bad input.
LARGEST_EXACT_INT = 2**53


class WorkloadError(ValueError):
    """Bad generator arguments: ``key`` is the argument's name (``args.<key>`` in a scenario)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message


@dataclass(frozen=True, slots=True)
class Param:
    """One framework knob: its name as the framework spells it, its type, default and meaning."""

    name: str
    kind: str
    default: Any
    doc: str
    minimum: float | None = None
    choices: tuple[Any, ...] | None = None

    def check(self, value: Any) -> Any:
        """The validated value, or a WorkloadError naming this knob."""
        if value is None and self.default is None:
            return None
        expected = _KIND_TEXT[self.kind]
        ok = {
            INT: isinstance(value, int) and not isinstance(value, bool),
            BOOL: isinstance(value, bool),
            FLOAT: isinstance(value, int | float) and not isinstance(value, bool),
            STR: isinstance(value, str),
            INT_LIST: isinstance(value, list | tuple)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
            STR_LIST: isinstance(value, list | tuple) and all(isinstance(v, str) for v in value),
            TABLE: isinstance(value, Mapping),
        }[self.kind]
        if not ok:
            raise WorkloadError(self.name, f"expected {expected}, got {_describe(value)}")
        if self.kind in (INT, INT_LIST):
            for v in value if self.kind == INT_LIST else [value]:
                if abs(v) > LARGEST_EXACT_INT:  # knobs become seconds, bytes and counts in float arithmetic
                    raise WorkloadError(self.name, f"expected an integer of magnitude <= 2**53, got {_describe(v)}")
        if self.kind == FLOAT:
            try:
                value = float(value)
            except OverflowError:  # an integer past float range
                value = math.inf
            if not math.isfinite(value):
                raise WorkloadError(self.name, f"expected a finite number, got {value!r}")
        if self.minimum is not None:
            items = value if self.kind == INT_LIST else [value] if self.kind in (INT, FLOAT) else []
            for v in items:
                if v < self.minimum:
                    raise WorkloadError(self.name, f"expected a value >= {self.minimum:g}, got {v!r}")
        if self.choices is not None and value not in self.choices:
            shown = ", ".join(repr(c) for c in self.choices)
            raise WorkloadError(self.name, f"expected one of {shown}, got {value!r}")
        if self.kind in (INT_LIST, STR_LIST):
            return tuple(value)
        if self.kind == TABLE:
            return dict(value)
        return value

    def parse_text(self, text: str) -> Any:
        """A command-line value (``--tp 8``, ``--gloo false``, ``--hierarchical-cp 2,2``) as this knob's type."""
        text = text.strip()
        if self.kind == INT:
            try:
                return int(text)
            except ValueError:
                raise WorkloadError(self.name, f"expected an integer, got {text!r}") from None
        if self.kind == FLOAT:
            try:
                return float(text)
            except ValueError:
                raise WorkloadError(self.name, f"expected a number, got {text!r}") from None
        if self.kind == BOOL:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise WorkloadError(self.name, f"expected true or false, got {text!r}")
        if self.kind == INT_LIST:
            try:
                return [int(p) for p in text.split(",") if p.strip()]
            except ValueError:
                raise WorkloadError(self.name, f"expected comma-separated integers, got {text!r}") from None
        if self.kind == STR_LIST:
            return [p.strip() for p in text.split(",") if p.strip()]
        if self.kind == TABLE:
            import json

            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                raise WorkloadError(self.name, f"expected a JSON object, got {text!r} ({err.msg})") from None
            return value
        return text


def _describe(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    shown = repr(value)
    shown = shown if len(shown) <= 120 else f"{shown[:115]}...{shown[-2:]}"  # one readable line
    return f"{kinds.get(type(value), type(value).__name__)} {shown}"


Config = dict[str, Any]


@dataclass(frozen=True)
class Generator:
    """A framework startup as a function of the framework's own knobs.

    ``build(config, world_size)`` returns one Program per rank; ``config`` holds every knob (defaults filled
    in, validated). ``natural_world(config)`` is the world the knobs imply when they pin it down (tp*pp*dp),
    else None; ``check(config, world_size)`` raises WorkloadError on sizes that don't fit the world.
    """

    name: str
    framework: str
    source: str
    params: tuple[Param, ...]
    build: Callable[[Config, int], tuple[Program, ...]]
    natural_world: Callable[[Config], int | None]
    check: Callable[[Config, int], None]
    doc: str = ""
    _by_name: dict[str, Param] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.params})

    def param(self, name: str) -> Param | None:
        return self._by_name.get(name)

    def config(self, args: Mapping[str, object]) -> Config:
        """Validated knobs with defaults filled in; unknown keys and wrong types raise WorkloadError."""
        if not isinstance(args, Mapping):
            raise WorkloadError("", f"expected a table of arguments, got {_describe(args)}")
        for key in args:
            if key not in self._by_name:
                known = ", ".join(p.name for p in self.params)
                raise WorkloadError(
                    str(key), f"unknown argument for the {self.name} generator; expected one of {known}"
                )
        out: Config = {}
        for p in self.params:
            out[p.name] = p.check(args[p.name]) if p.name in args else p.default
        return out

    def __call__(self, args: Mapping[str, object], world_size: int) -> tuple[Program, ...]:
        if not isinstance(world_size, int) or world_size < 1:
            raise WorkloadError("", f"world size must be a positive integer, got {world_size!r}")
        _check_world(world_size)
        config = self.config(args)
        self.check(config, world_size)
        programs = self.build(config, world_size)
        if len(programs) != world_size:  # pragma: no cover - a generator bug, not bad input
            raise AssertionError(f"{self.name}: {len(programs)} programs for a world of {world_size}")
        return programs

    def world_for(self, args: Mapping[str, object]) -> int | None:
        """The world size the arguments imply, if they pin it down (within ``max_world_size``)."""
        world = self.natural_world(self.config(args))
        if world is not None:
            _check_world(world)
        return world


def _check_world(world_size: int) -> None:
    """Every generator builds one Program per rank: the world is bounded before any is built."""
    limit = current_limits().max_world_size
    if world_size > limit:
        raise WorkloadError("", exceeded("max_world_size", f"a world of {world_size} ranks", limit))


def need_world(key: str, world_size: int, product: int, what: str) -> int:
    """``world_size / product`` when it divides evenly, else a WorkloadError naming ``key``."""
    if product < 1 or world_size % product:
        raise WorkloadError(key, f"the world of {world_size} ranks is not divisible by {what} = {product}")
    return world_size // product


def check_product(key: str, world_size: int, value: int, product_rest: int, what: str) -> None:
    if value * product_rest != world_size:
        raise WorkloadError(key, f"{what} = {value * product_rest} does not match the world of {world_size} ranks")


def programs_by_key(
    world_size: int, key_of: Callable[[int], Hashable], build: Callable[[Hashable], Sequence[Op]]
) -> tuple[Program, ...]:
    """One Program per distinct key, shared by every rank with that key (DESIGN rule 8).

    A generator whose calls do not depend on the rank passes a constant key: every rank then gets the same
    object, which the engine's cohort fast path requires.
    """
    cache: dict[Hashable, Program] = {}
    out = []
    for rank in range(world_size):
        key = key_of(rank)
        program = cache.get(key)
        if program is None:
            program = cache[key] = Program(tuple(build(key)))
        out.append(program)
    return tuple(out)


def same_for_all(world_size: int, ops: Sequence[Op]) -> tuple[Program, ...]:
    shared = Program(tuple(ops))
    return (shared,) * world_size


def local_rank(rank: int, gpus_per_node: int) -> int:
    return rank % gpus_per_node

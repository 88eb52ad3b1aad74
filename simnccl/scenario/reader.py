"""Typed, path-remembering access to untrusted TOML tables, and the number/list checks every table shares.

Why one place: every message a scenario (or a ``[recovery]`` table) error prints names the file, the dotted key
and what was expected, and cuts the offending value to one line; each table reader builds on these.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from simnccl.env_knobs import is_env_name, unknown_knob_message, value_problem
from simnccl.limits import exceeded, number_text
from simnccl.scenario.model import ScenarioError
from simnccl.table_keys import key_problem
from simnccl.visible_text import (
    brief,
    invisible_in,
)


class Reader:
    """Typed access to one TOML table that remembers the key path for error messages."""

    def __init__(self, source: str, path: str, table: Any) -> None:
        if not isinstance(table, dict):
            raise ScenarioError(source, path, f"expected a table, got {kind_of(table)}")
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
                raise self.error(name, f"missing; expected {what or type_name(kind)}")
            return default
        value = self.table[name]
        if isinstance(value, bool) and bool not in as_tuple(kind):
            raise self.error(name, f"expected {what or type_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.error(name, f"expected {what or type_name(kind)}, got {kind_of(value)} {brief(value)}")
        return value

    def label(self, name: str) -> str:
        """A name a report prints in its one-line summary (a scenario's, a variant's): text, not empty, on one
        line, with no character a terminal acts on (``invisible_in``). Why: an empty name printed an empty
        column, and a newline in one split the summary's one line per variant in two."""
        value = self.get(name, str)
        if not value.strip():
            raise self.error(name, f"expected a name, got {brief(value)}")
        bad = invisible_in(value)
        if bad is not None:
            raise self.error(
                name, f"expected a name on one line without control characters, got {bad} in {brief(value)}"
            )
        return value

    def int_list(self, name: str, default: Any = ...) -> tuple[int, ...] | Any:
        value = self.get(name, list, default, what="a list of integers")
        if value is default and default is not ...:
            return default
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(name, f"expected a list of integers, got {brief(value)}")
        return tuple(value)

    def env(self, name: str, extra_knobs: Sequence[str] | None = ()) -> dict[str, str]:
        """An environment table: string values, and knob names torch or NCCL read (simnccl.env_knobs)."""
        value = self.get(name, dict, {}, what="a table of strings")
        for k, v in value.items():
            if not is_env_name(k):  # a name with a newline in it printed as two lines of the report
                raise ScenarioError(self.source, f"{self.key(name)}.{k}", "expected an environment variable name")
            message = unknown_knob_message(k, extra_knobs or ())
            if message is None and isinstance(v, str):
                message = value_problem(k, v)
            if message is not None:
                raise ScenarioError(self.source, f"{self.key(name)}.{k}", message)
            if not isinstance(v, str):
                raise ScenarioError(
                    self.source,
                    f"{self.key(name)}.{k}",
                    f"expected a string (environment values are strings), got {kind_of(v)} {brief(v)}",
                )
        return dict(value)

    def finish(self) -> None:
        problem = key_problem(self.table, allowed=self.used, path=self.path)
        if problem is not None:
            raise ScenarioError(self.source, problem.key, problem.message)


def as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def type_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in as_tuple(kind))


def kind_of(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def finite(
    reader: Reader,
    key: str,
    value: float,
    minimum: float,
    maximum: float | None = None,
    limit: str = "",
    unit: str = "",
    units: tuple[str, str, float] | None = None,
) -> float:
    """``value`` as a float: finite, >= ``minimum`` and, when given, <= ``maximum`` (the limit ``limit``).
    ``units``: (the value's unit, the limit's, how many of the first make one of the second) where they differ (a
    size in bytes under a limit in MiB), so the message states the limit in its own unit and the value in both.

    Non-finite numbers (TOML's ``inf``/``nan``, or an integer past float range) are never a size or a time."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise reader.error(key, f"expected a number{unit}, got {kind_of(value)} {brief(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer past float range
        number = math.inf if value > 0 else -math.inf
    if not math.isfinite(number):
        raise reader.error(key, f"expected a finite number{unit}, got {brief(value)}")
    if number < minimum:
        wanted = f"a non-negative number{unit}" if minimum == 0 else f"a number{unit} >= {number_text(minimum)}"
        raise reader.error(key, f"expected {wanted}, got {number_text(value)}")
    if maximum is not None and number > maximum:
        raise reader.error(
            key,
            exceeded(limit, _past_limit(value, unit, units), maximum / (units[2] if units else 1))
            if limit
            else f"expected at most {number_text(maximum)}",
        )
    return number


def _past_limit(value: float, unit: str, units: tuple[str, str, float] | None) -> str:
    if units is None:
        return f"{number_text(value)}{unit}"
    own, theirs, per = units
    return f"{number_text(value)} {own} ({number_text(value / per)} {theirs})"


def unknown_name(what: str, name: str, known: Iterable[str]) -> str:
    """No such checkpoint/device: the nearest known name, or the known ones when few."""
    known = sorted(known)
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if nearest:
        return f"no {what} {brief(name)} in this scenario; did you mean {nearest[0]!r}?"
    listed = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return f"no {what} {brief(name)} in this scenario; expected one of {listed or '(none)'}"


def str_list(reader: Reader, key: str, what: str) -> tuple[str, ...] | None:
    value = reader.get(key, list, None, what=what)
    if value is not None and not all(isinstance(v, str) for v in value):
        raise reader.error(key, f"expected {what}, got {brief(value)}")
    return None if value is None else tuple(value)


def opt_number(reader: Reader, key: str, minimum: float) -> float | None:
    value = reader.get(key, (int, float), None)
    return None if value is None else finite(reader, key, value, minimum)


def opt_count(reader: Reader, key: str) -> int | None:
    value = reader.get(key, int, None)
    if value is not None and value < 0:
        raise reader.error(key, f"expected an integer >= 0, got {value}")
    return value


def ranks_in_world(reader: Reader, key: str, ranks: Sequence[int], world_size: int) -> None:
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise reader.error(key, f"ranks {brief(bad)} are outside the world of {world_size} (0..{world_size - 1})")
    duplicates = sorted(r for r, times in Counter(ranks).items() if times > 1)  # once: 65,536 ranks may be listed
    if duplicates:
        raise reader.error(key, f"rank(s) {brief(duplicates)} listed more than once")


def first_repeat(values: Sequence[Any]) -> tuple[Any] | None:
    """``(value,)`` for the first value given again later in ``values``, or None when each is given once.

    Why one function: a scenario's ``[matrix]`` axes and a sweep's axes both refuse a value given twice (a
    variant or a set of cells made twice under one name); equality, not hashing, as a value may be a table."""
    for i, value in enumerate(values):
        if value in values[:i]:
            return (value,)
    return None

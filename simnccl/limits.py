"""Input limits: how large a world, a program, a matrix, a fault schedule, a file or a run may be.

Why one module: every size in an untrusted scenario file multiplies into memory or time, so each is bounded
*before* anything is expanded, and the error names the limit (``max_world_size``) so a person knows what to
raise. The values live in ``simnccl/data/limits.toml`` with the reason for each; the person running a command
(never the scenario file) may raise one for that run with ``SIMNCCL_LIMIT_<NAME>=value``.
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

ENV_PREFIX = "SIMNCCL_LIMIT_"
DATA_FILE = "simnccl/data/limits.toml"


class LimitError(ValueError):
    """A malformed ``SIMNCCL_LIMIT_*`` override: bad input from the command's environment (exit 2)."""


@dataclass(frozen=True, slots=True)
class InputLimits:
    """The limits in force (see ``simnccl/data/limits.toml`` for why each value)."""

    max_world_size: int
    max_program_ops: int
    max_expanded_ops: int
    max_built_ops: int
    max_variants: int
    max_faults: int
    max_recoveries: int
    max_file_bytes: int
    max_nesting_depth: int
    max_message_mib: float
    max_alloc_mib: float
    max_sim_time_s: float
    max_wall_s: float
    max_timeout_s: float
    max_real_cases: int
    max_real_parallel: int
    max_capture_jobs: int


_INTEGER = {f.name: f.type == "int" for f in fields(InputLimits)}


@cache
def _tables() -> tuple[dict[str, Any], dict[str, Any]]:
    """``[limits]`` and ``[ceilings]`` of the data file."""
    text = (importlib.resources.files("simnccl") / "data" / "limits.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    names = {f.name for f in fields(InputLimits)}
    for table in ("limits", "ceilings"):
        if set(data[table]) != names:  # pragma: no cover - a packaging defect, not bad input
            raise AssertionError(f"{DATA_FILE}: [{table}] keys {sorted(data[table])} differ from {sorted(names)}")
    return data["limits"], data["ceilings"]


def _defaults() -> dict[str, Any]:
    return _tables()[0]


def current(environ: Mapping[str, str] | None = None) -> InputLimits:
    """The data file's limits with this process's ``SIMNCCL_LIMIT_*`` overrides applied. A variable of the prefix
    that names no limit is refused (a CI job that set ``SIMNCCL_LIMIT_MAX_WROLD_SIZE=3`` to hold its runs small ran
    without it), as is a value past the limit's ceiling (``[ceilings]``)."""
    env = os.environ if environ is None else environ
    values = dict(_defaults())
    upper = {name.upper() for name in values}
    for var in env:
        # names are exact, as the variables read below: SIMNCCL_LIMIT_max_world_size was taken for a limit and not
        # read
        if var.startswith(ENV_PREFIX) and var[len(ENV_PREFIX) :] not in upper:
            raise LimitError(_unknown_limit(var, values))
    for name in values:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        values[name] = _parse_override(name, raw, integer=_INTEGER[name])
    return InputLimits(**values)


def _unknown_limit(var: str, names: Mapping[str, Any]) -> str:
    known = {ENV_PREFIX + name.upper(): name for name in names}
    close = difflib.get_close_matches(var.upper(), list(known), n=1, cutoff=0.85)
    hint = f"did you mean {close[0]}?" if close else f"the limits are {', '.join(sorted(known))}"
    return f"environment {var!r}: no such limit; {hint}"


def _parse_override(name: str, raw: str, *, integer: bool) -> int | float:
    var = ENV_PREFIX + name.upper()
    try:
        value: int | float = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a positive integer" if integer else "a positive number"
        raise LimitError(f"environment {var}: expected {kind}, got {raw!r}") from None
    ceiling = _tables()[1][name]
    if not (math.isfinite(value) and 0 < value <= ceiling):
        raise LimitError(
            f"environment {var}: expected a positive value up to {number_text(ceiling)} (its ceiling in "
            f"{DATA_FILE}), got {raw!r}"
        )
    return value


def number_text(number: float) -> str:
    """A number as written, every digit kept: ``1048576``, ``2592001``, ``1.0000001``. Why: ``%g`` keeps six
    significant digits, so a limit printed as ``1.04858e+06`` and a value of 2,592,001 past a limit of 2,592,000
    printed as equal to it."""
    if isinstance(number, int) and not isinstance(number, bool):
        return str(number)
    value = float(number)
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)


def exceeded(name: str, value: object, limit: float) -> str:
    """The message for ``value`` past limit ``name``: the limit's name, value and how to raise it."""
    return (
        f"{value} exceeds the limit {name} = {number_text(limit)} ({DATA_FILE}; to raise it for one run, set "
        f"{ENV_PREFIX}{name.upper()})"
    )


def file_problem(path: Path, max_bytes: int) -> str | None:
    """Why ``path`` may not be read as an input file (None: it may).

    Only regular files: ``/dev/zero`` would be read until memory runs out and ``/dev/stdin`` or a FIFO
    blocks forever. The size is checked before reading, so a huge file is never loaded.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        return "no such file"
    except OSError as err:
        return f"cannot read: {err.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return "cannot read: not a regular file (folders, devices and pipes are not input files)"
    if info.st_size > max_bytes:
        return f"file of {info.st_size} bytes: " + exceeded("max_file_bytes", info.st_size, max_bytes)
    return None


def nesting_depth(value: Any) -> int:
    """How deeply tables and arrays nest in parsed TOML (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest

"""NCCL's constants, read from ``simnccl/data/nccl_constants.toml`` with the NCCL source each comes from.

Why a data file: the buffer sizes, channel limits and speed tables are NCCL's, not ours, and change between
NCCL versions; each carries the source file and version it was read from, so a reader can check it and a new
NCCL release changes data, not code (DESIGN rules 4 and 12). The file ships with the package; it is still
validated entry by entry, because a hand-edited constant must fail loudly, naming the entry.
"""

from __future__ import annotations

import functools
import importlib.resources
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONSTANTS_FILE = "nccl_constants.toml"


class NcclInputError(ValueError):
    """Bad input to the NCCL memory model: a data file, an environment knob, an option or a layout."""


@dataclass(frozen=True, slots=True)
class Constant:
    """One number (or list, or version string) and where in NCCL it comes from."""

    name: str
    value: Any
    source: str


@dataclass(frozen=True, slots=True)
class NcclConstants:
    """Every constant of the model, by ``section.name`` (e.g. ``buffers.ll_bytes``)."""

    entries: Mapping[str, Constant]

    def __getitem__(self, key: str) -> Any:
        return self.entry(key).value

    def entry(self, key: str) -> Constant:
        try:
            return self.entries[key]
        except KeyError:
            raise NcclInputError(f"{CONSTANTS_FILE}: missing constant {key!r}") from None

    def integer(self, key: str) -> int:
        value = self[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise NcclInputError(f"{CONSTANTS_FILE}: {key}: expected an integer, got {value!r}")
        return value

    def number(self, key: str) -> float:
        value = self[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise NcclInputError(f"{CONSTANTS_FILE}: {key}: expected a number, got {value!r}")
        return float(value)

    def floats(self, key: str) -> tuple[float, ...]:
        value = self[key]
        if not isinstance(value, list) or not value or not all(isinstance(v, int | float) for v in value):
            raise NcclInputError(f"{CONSTANTS_FILE}: {key}: expected a non-empty list of numbers, got {value!r}")
        return tuple(float(v) for v in value)

    def text(self, key: str) -> str:
        value = self[key]
        if not isinstance(value, str):
            raise NcclInputError(f"{CONSTANTS_FILE}: {key}: expected a string, got {value!r}")
        return value

    def source(self, *keys: str) -> str:
        """The sources of ``keys``, joined: what a Part cites."""
        return "; ".join(self.entry(key).source for key in keys)


def parse_constants(text: str, file: str) -> NcclConstants:
    """Parse and validate a constants document: sections of ``name = {value = ..., source = "..."}``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise NcclInputError(f"{file}: not valid TOML: {exc}") from None
    entries: dict[str, Constant] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise NcclInputError(f"{file}: [{section}]: expected a table of constants")
        for name, entry in table.items():
            where = f"{file}: {section}.{name}"
            if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
                raise NcclInputError(f'{where}: expected {{value = ..., source = "..."}}, got {entry!r}')
            source = entry["source"]
            if not isinstance(source, str) or not source.strip():
                raise NcclInputError(f"{where}.source: expected a non-empty string")
            entries[f"{section}.{name}"] = Constant(f"{section}.{name}", entry["value"], source.strip())
    return NcclConstants(entries)


@functools.cache
def constants() -> NcclConstants:
    """The shipped constants (read once)."""
    resource = importlib.resources.files("simnccl") / "data" / CONSTANTS_FILE
    return parse_constants(resource.read_text(encoding="utf-8"), str(resource))

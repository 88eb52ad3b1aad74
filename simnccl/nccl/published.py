"""The published NCCL-memory figures and their conditions (``simnccl/data/nccl_published.toml``), validated.

Why data: each figure is somebody's measurement with its own GPU, NCCL build and method; the conditions the
model needs (layout, knobs, what was measured) and the ones we had to assume are written next to the figure
and its source, where a reader can dispute them, rather than in code.
"""

from __future__ import annotations

import functools
import importlib.resources
import tomllib
from dataclasses import dataclass
from typing import Any

from simnccl.nccl.algorithms import Use
from simnccl.nccl.constants import NcclInputError
from simnccl.nccl.hardware import Topology, parse_topology, topology_for
from simnccl.table_keys import check_keys

PUBLISHED_FILE = "nccl_published.toml"
MEASURES = ("device_init", "device_total", "device_after_init", "suspendable")
MEASURE_PREFIXES = ("mechanism:", "host_connection:")
CLAIM_CHECKS = (
    "linear-in-channels",
    "ring-two-connections",
    "growth-stops-beyond-two-nodes",
    "split-share-saves",
    "eager-equals-lazy-after-use",
)
_POINT_KEYS = {
    "id",
    "title",
    "source",
    "published",
    "published_as",
    "hardware",
    "hardware_changes",
    "assumed_changes",
    "assumed_reason",
    "nccl",
    "nranks",
    "local_ranks",
    "nodes",
    "rank",
    "env",
    "options",
    "parent",
    "uses",
    "measure",
    "multiplier",
    "plus_parameter",
    "conditions",
}
_REQUIRED_POINT_KEYS = ("id", "title", "source", "published", "published_as", "hardware", "nccl", "nranks")
_REQUIRED_POINT_KEYS += ("local_ranks", "nodes", "measure", "conditions")


@dataclass(frozen=True, slots=True)
class ParentSpec:
    """The communicator a point's communicator was split from: its env and options (same layout)."""

    env: dict[str, str]
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Point:
    """One published figure the model expresses (``published`` in MiB)."""

    id: str
    title: str
    source: str
    published: float
    published_as: str
    topology: Topology
    stated_changes: dict[str, Any]
    assumed_changes: dict[str, Any]
    assumed_reason: str
    nccl: str
    nranks: int
    local_ranks: int
    nodes: int
    rank: int
    env: dict[str, str]
    options: dict[str, Any]
    parent: ParentSpec | None
    uses: tuple[Use, ...]
    measure: str
    multiplier: int
    plus_parameter: str | None
    conditions: str


@dataclass(frozen=True, slots=True)
class Parameter:
    """A quantity the model cannot predict, fitted to the listed points' figures (never to others)."""

    name: str
    what: str
    fitted_to: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unreached:
    id: str
    title: str
    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class Claim:
    id: str
    title: str
    source: str
    check: str


@dataclass(frozen=True, slots=True)
class Published:
    points: tuple[Point, ...]
    parameters: tuple[Parameter, ...]
    unreached: tuple[Unreached, ...]
    claims: tuple[Claim, ...]

    def parameter(self, name: str) -> Parameter:
        for parameter in self.parameters:
            if parameter.name == name:
                return parameter
        raise NcclInputError(f"{PUBLISHED_FILE}: unknown parameter {name!r}")


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise NcclInputError(f"{where}: expected a non-empty string, got {value!r}")
    return value.strip()


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NcclInputError(f"{where}: expected a table, got {value!r}")
    return dict(value)


def _uses(where: str, value: Any) -> tuple[Use, ...]:
    if not isinstance(value, list):
        raise NcclInputError(f"{where}: expected a list of {{collective = ..., nbytes = ...}}, got {value!r}")
    uses = []
    for i, item in enumerate(value):
        check_keys(
            item, allowed=("nbytes",), required=("collective",), file="", path=f"{where}[{i}]", error=NcclInputError
        )
        uses.append(Use(item["collective"], item.get("nbytes")))
    return tuple(uses)


def _point(file: str, i: int, raw: Any, hardware: dict[str, Topology], parameters: set[str]) -> Point:
    check_keys(
        raw, allowed=_POINT_KEYS, required=_REQUIRED_POINT_KEYS, file=file, path=f"point[{i}]", error=NcclInputError
    )
    table = dict(raw)
    where = f"{file}: point {table['id']!r}"
    name = _text(f"{where}.hardware", table["hardware"])
    topology = hardware[name] if name in hardware else topology_for(name)
    measure = _text(f"{where}.measure", table["measure"])
    if measure not in MEASURES and not measure.startswith(MEASURE_PREFIXES):
        raise NcclInputError(f"{where}.measure: expected one of {', '.join(MEASURES)} or mechanism:/host_connection:")
    published = table["published"]
    if isinstance(published, bool) or not isinstance(published, int | float) or published <= 0:
        raise NcclInputError(f"{where}.published: expected a positive number of MiB, got {published!r}")
    plus = table.get("plus_parameter")
    if plus is not None and plus not in parameters:
        raise NcclInputError(f"{where}.plus_parameter: unknown parameter {plus!r}")
    parent = None
    if "parent" in table:
        spec = table["parent"]
        check_keys(spec, allowed=("env", "options"), file="", path=f"{where}.parent", error=NcclInputError)
        parent = ParentSpec(
            _table(f"{where}.parent.env", spec.get("env", {})),
            _table(f"{where}.parent.options", spec.get("options", {})),
        )
    stated = _table(f"{where}.hardware_changes", table.get("hardware_changes", {}))
    assumed = _table(f"{where}.assumed_changes", table.get("assumed_changes", {}))
    if assumed and "assumed_reason" not in table:
        raise NcclInputError(f"{where}: assumed_changes needs assumed_reason")
    multiplier = table.get("multiplier", 1)
    if isinstance(multiplier, bool) or not isinstance(multiplier, int) or multiplier < 1:
        raise NcclInputError(f"{where}.multiplier: expected an integer >= 1, got {multiplier!r}")
    for key in (*stated, *assumed):
        if key not in Topology.__dataclass_fields__ or key in ("name", "source"):
            raise NcclInputError(f"{where}: {key!r} is not a topology field")
    return Point(
        id=_text(f"{where}.id", table["id"]),
        title=_text(f"{where}.title", table["title"]),
        source=_text(f"{where}.source", table["source"]),
        published=float(published),
        published_as=_text(f"{where}.published_as", table["published_as"]),
        topology=topology,
        stated_changes=stated,
        assumed_changes=assumed,
        assumed_reason=str(table.get("assumed_reason", "")),
        nccl=_text(f"{where}.nccl", table["nccl"]),
        nranks=table["nranks"],
        local_ranks=table["local_ranks"],
        nodes=table["nodes"],
        rank=table.get("rank", 0),
        env={str(k): str(v) for k, v in _table(f"{where}.env", table.get("env", {})).items()},
        options=_table(f"{where}.options", table.get("options", {})),
        parent=parent,
        uses=_uses(f"{where}.uses", table.get("uses", [])),
        measure=measure,
        multiplier=multiplier,
        plus_parameter=plus,
        conditions=_text(f"{where}.conditions", table["conditions"]),
    )


def parse_published(text: str, file: str) -> Published:
    """Parse and validate a published-figures document (see the file's header for its format)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise NcclInputError(f"{file}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"hardware", "parameter", "point", "unreached", "claim"})
    if unknown:
        raise NcclInputError(f"{file}: unknown table(s) {', '.join(unknown)}")
    hardware = {
        name: parse_topology(f"{file}: [hardware.{name}]", name, table)
        for name, table in _table(f"{file}: [hardware]", data.get("hardware", {})).items()
    }
    parameters = tuple(
        Parameter(
            _text(f"{file}: parameter[{i}].name", p.get("name")),
            _text(f"{file}: parameter[{i}].what", p.get("what")),
            tuple(p.get("fitted_to", [])),
        )
        for i, p in enumerate(data.get("parameter", []))
    )
    names = {p.name for p in parameters}
    points = tuple(_point(file, i, raw, hardware, names) for i, raw in enumerate(data.get("point", [])))
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise NcclInputError(f"{file}: duplicate point ids")
    for parameter in parameters:
        strangers = sorted(set(parameter.fitted_to) - set(ids))
        if not parameter.fitted_to or strangers:
            raise NcclInputError(f"{file}: parameter {parameter.name!r}.fitted_to: unknown or no points {strangers}")
    unreached = tuple(
        Unreached(*(_text(f"{file}: unreached[{i}].{k}", u.get(k)) for k in ("id", "title", "source", "reason")))
        for i, u in enumerate(data.get("unreached", []))
    )
    claims = []
    for i, c in enumerate(data.get("claim", [])):
        claim = Claim(*(_text(f"{file}: claim[{i}].{k}", c.get(k)) for k in ("id", "title", "source", "check")))
        if claim.check not in CLAIM_CHECKS:
            raise NcclInputError(f"{file}: claim[{i}].check: expected one of {', '.join(CLAIM_CHECKS)}")
        claims.append(claim)
    return Published(points, parameters, unreached, tuple(claims))


@functools.cache
def published() -> Published:
    """The shipped published figures (read once)."""
    resource = importlib.resources.files("simnccl") / "data" / PUBLISHED_FILE
    return parse_published(resource.read_text(encoding="utf-8"), str(resource))

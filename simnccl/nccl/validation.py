"""The validation table: every published figure the model expresses, predicted vs published, and leave-one-out.

Why leave-one-out: a model with fitted parameters reproduces the figures it was fitted to by construction.
For each point the table also gives the prediction made *without that point's own figure*: every parameter
refitted on the other points of its ``fitted_to`` list (none left: no leave-one-out), and every condition
assumed because of this figure (``assumed_changes``) dropped. A point whose prediction uses nothing fitted has
a leave-one-out equal to its prediction.

The goal (issue 11): every compared point within 10 %, median within 5 %, both in-sample and leave-one-out.
Points whose only evidence is their own figure ("fitted only") are shown and not counted.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simnccl.nccl.algorithms import Use
from simnccl.nccl.breakdown import MIB, Breakdown
from simnccl.nccl.model import communicator_bytes
from simnccl.nccl.published import Claim, Point, Published, published

POINT_TOLERANCE = 0.10
MEDIAN_TOLERANCE = 0.05
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Row:
    """One point's comparison. Errors are (predicted - published) / published; None where undefined."""

    point: Point
    predicted: float
    error: float
    loo_predicted: float | None
    loo_error: float | None
    figure: str  # predicted | fitted | assumed
    parameters: dict[str, float]

    @property
    def counted(self) -> bool:
        return self.loo_error is not None

    @property
    def ok(self) -> bool:
        return self.counted and abs(self.error) <= POINT_TOLERANCE and abs(self.loo_error or 0.0) <= POINT_TOLERANCE


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claim: Claim
    holds: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Table:
    rows: tuple[Row, ...]
    claims: tuple[ClaimResult, ...]
    data: Published

    def _median(self, errors: list[float]) -> float:
        return statistics.median(abs(e) for e in errors) if errors else 0.0

    @property
    def median_error(self) -> float:
        return self._median([r.error for r in self.rows if r.counted])

    @property
    def median_loo_error(self) -> float:
        return self._median([r.loo_error for r in self.rows if r.loo_error is not None])

    @property
    def misses(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.counted and not r.ok)

    @property
    def goal_met(self) -> bool:
        return (
            not self.misses
            and self.median_error <= MEDIAN_TOLERANCE
            and self.median_loo_error <= MEDIAN_TOLERANCE
            and all(c.holds for c in self.claims)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "goal": {
                "point_tolerance": POINT_TOLERANCE,
                "median_tolerance": MEDIAN_TOLERANCE,
                "met": self.goal_met,
                "median_error": round(self.median_error, 6),
                "median_loo_error": round(self.median_loo_error, 6),
                "misses": [r.point.id for r in self.misses],
            },
            "points": [
                {
                    "id": r.point.id,
                    "title": r.point.title,
                    "source": r.point.source,
                    "published_mib": r.point.published,
                    "published_as": r.point.published_as,
                    "predicted_mib": round(r.predicted, 4),
                    "error": round(r.error, 6),
                    "loo_predicted_mib": None if r.loo_predicted is None else round(r.loo_predicted, 4),
                    "loo_error": None if r.loo_error is None else round(r.loo_error, 6),
                    "figure": r.figure,
                    "counted": r.counted,
                    "ok": r.ok,
                    "parameters_mib": {k: round(v, 4) for k, v in r.parameters.items()},
                    "conditions": r.point.conditions,
                    "assumed": r.point.assumed_reason or None,
                }
                for r in self.rows
            ],
            "parameters": [
                {"name": p.name, "what": p.what, "fitted_to": list(p.fitted_to)} for p in self.data.parameters
            ],
            "unreached": [
                {"id": u.id, "title": u.title, "source": u.source, "reason": u.reason} for u in self.data.unreached
            ],
            "claims": [
                {
                    "id": c.claim.id,
                    "title": c.claim.title,
                    "source": c.claim.source,
                    "holds": c.holds,
                    "detail": c.detail,
                }
                for c in self.claims
            ],
        }


def breakdown_for(point: Point, *, assumed: bool = True) -> Breakdown:
    """The model's Breakdown for a point's communicator, with or without its assumed conditions."""
    topology = point.topology.with_changes(**point.stated_changes)
    if assumed and point.assumed_changes:
        topology = topology.with_changes(**point.assumed_changes)
    common = (topology, point.nranks, point.local_ranks, point.nodes, point.nccl)
    parent = None
    if point.parent is not None:
        parent = communicator_bytes(*common, point.parent.env, point.parent.options, "init", rank=point.rank)
    return communicator_bytes(*common, point.env, point.options, "used", point.uses, rank=point.rank, parent=parent)


def measure_bytes(breakdown: Breakdown, measure: str) -> int:
    """The part of a Breakdown a point's figure is compared with (see nccl_published.toml's header)."""
    if measure == "device_init":
        return breakdown.init_device_bytes
    if measure == "device_total":
        return breakdown.device_bytes
    if measure == "device_after_init":
        return breakdown.device_bytes - breakdown.init_device_bytes
    if measure == "suspendable":
        return breakdown.suspendable_device_bytes
    kind, _, mechanism = measure.partition(":")
    if kind == "mechanism":
        return breakdown.mechanism_bytes(mechanism)
    parts = [p for p in breakdown.parts if p.mechanism == mechanism and p.ledger == "host"]
    return max((p.bytes_each for p in parts), default=0)


def model_mib(point: Point, *, assumed: bool = True) -> float:
    """The model's figure for a point, in MiB, without any fitted parameter."""
    return measure_bytes(breakdown_for(point, assumed=assumed), point.measure) / MIB * point.multiplier


def _fit(data: Published, name: str, leave_out: str | None) -> float | None:
    """A parameter: the mean residual (published - model) over its points, ``leave_out`` excluded."""
    points = [p for p in data.points if p.id in data.parameter(name).fitted_to and p.id != leave_out]
    if not points:
        return None
    return statistics.fmean(p.published - model_mib(p) for p in points)


def _row(data: Published, point: Point) -> Row:
    predicted = model_mib(point)
    loo = model_mib(point, assumed=False) if point.assumed_changes else predicted
    parameters: dict[str, float] = {}
    figure = "assumed" if point.assumed_changes else "predicted"
    if point.plus_parameter:
        figure = "fitted"
        value = _fit(data, point.plus_parameter, None)
        parameters[point.plus_parameter] = value or 0.0
        predicted += value or 0.0
        loo_value = _fit(data, point.plus_parameter, point.id)
        loo = None if loo_value is None else loo + loo_value
    published_mib = point.published
    return Row(
        point=point,
        predicted=predicted,
        error=(predicted - published_mib) / published_mib,
        loo_predicted=loo,
        loo_error=None if loo is None else (loo - published_mib) / published_mib,
        figure=figure,
        parameters=parameters,
    )


# ------------------------------------------------------------------------------------------------ claims

_H100_8 = ("h100-80gb", 8, 8, 1, "2.30.7")


def _linear_in_channels() -> tuple[bool, str]:
    sizes = {}
    for n in (2, 4, 8, 16):
        env = {"NCCL_MAX_NCHANNELS": str(n), "NCCL_NVLS_ENABLE": "0"}
        sizes[n] = communicator_bytes(*_H100_8, env, None, "used", ["all_reduce"]).device_bytes
    slopes = {(sizes[n] - sizes[2]) / (n - 2) for n in (4, 8, 16)}
    per_channel = next(iter(slopes)) / MIB
    return len(slopes) == 1, f"8x H100 after an all_reduce: {per_channel:g} MiB per channel at 2..16 channels"


def _ring_two_connections() -> tuple[bool, str]:
    counts = []
    for layout in ((4, 4, 1), (8, 8, 1), (16, 8, 2), (64, 8, 8)):
        b = communicator_bytes("h100-80gb", *layout, "2.30.7", {"NCCL_ALGO": "ring"}, None, "used", ["all_reduce"])
        ring = [key for key in b.connected if key[3] == 0]  # connIndex 0: collective connections
        counts.append(len(ring) / b.channels.coll)
    return all(c == 2 for c in counts), f"ring connections per channel at 4, 8, 16, 64 ranks: {counts}"


def _growth_stops() -> tuple[bool, str]:
    sizes = []
    for nodes in (2, 3, 4, 8, 16):
        uses = [Use("all_reduce", 1024), Use("all_reduce", 1 << 24)]
        b = communicator_bytes("h100-80gb", 8 * nodes, 8, nodes, "2.30.7", None, None, "used", uses)
        sizes.append(b.device_bytes // MIB)
    return len(set(sizes[1:])) == 1, f"MiB after tree + ring all_reduce at 2, 3, 4, 8, 16 nodes: {sizes}"


def _split_share_saves() -> tuple[bool, str]:
    fresh = communicator_bytes(*_H100_8)
    parent = communicator_bytes(*_H100_8, {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"})
    shared = communicator_bytes(*_H100_8, {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}, parent=parent)
    plain = communicator_bytes(*_H100_8, parent=fresh)
    holds = shared.device_bytes < fresh.device_bytes == plain.device_bytes
    return holds, (
        f"8x H100 at init: fresh {fresh.device_bytes // MIB} MiB, non-shared split {plain.device_bytes // MIB} MiB, "
        f"shared split {shared.device_bytes // MIB} MiB"
    )


def _eager_equals_lazy() -> tuple[bool, str]:
    world = communicator_bytes("h100-96gb", 2, 2, 1, "2.30.7")
    eager = communicator_bytes("h100-96gb", 2, 2, 1, "2.30.7", None, None, "used", ["all_reduce"], parent=world)
    lazy = communicator_bytes("h100-96gb", 2, 2, 1, "2.30.7", None, None, "used", ["all_reduce"])
    return eager.device_bytes == lazy.device_bytes, (
        f"2x H100 group after one all_reduce: split at creation {eager.device_bytes // MIB} MiB, "
        f"created at the first collective {lazy.device_bytes // MIB} MiB"
    )


CLAIM_CHECKERS: dict[str, Callable[[], tuple[bool, str]]] = {
    "linear-in-channels": _linear_in_channels,
    "ring-two-connections": _ring_two_connections,
    "growth-stops-beyond-two-nodes": _growth_stops,
    "split-share-saves": _split_share_saves,
    "eager-equals-lazy-after-use": _eager_equals_lazy,
}


def validation_table(data: Published | None = None) -> Table:
    """Compute the whole table (points, leave-one-out, claims) from the published figures."""
    data = data or published()
    rows = tuple(_row(data, point) for point in data.points)
    claims = tuple(ClaimResult(claim, *CLAIM_CHECKERS[claim.check]()) for claim in data.claims)
    return Table(rows, claims, data)

"""The result of running a scenario: one record per variant, and the documented JSON every command writes.

Other tools script against the JSON, so its shape is a contract (``SCHEMA_VERSION``; see README "Result
JSON"). Every command's ``--json`` writes one *document* (``document``): ``schema``, ``command`` (``run``,
``explain``, ``cost``, ``capture``, ``real run``, ``real compare``, ``real diff``), ``version`` (simnccl's),
``ok`` (the command's check held: its exit status is 0), ``summary`` (one ``SummaryLine`` per variant, cost
column or diff case: ``{"scenario", "variant", "verdict", "ok", "figure"}``, what ``--quiet`` prints) and
``results`` (the command's own records; for ``run`` one ``ScenarioResult.to_dict()`` per scenario file).

A scenario result: ``scenario``, ``source``, ``seed``, ``trace_hash`` (over every variant), ``ok`` (every
expectation held) and ``variants``. Each variant: ``name``, ``verdict``
(pass | fail | hang | error), ``release``, ``torch_version``, ``profile``, ``env``, ``policy``,
``checkpoints`` (``[{"name", "devices": [{"device", "used_mib", "free_mib", "time_s"}]}]``),
``devices`` (peak and owner attribution per device, and the full allocation ``timeline``), ``groups``, ``hangs``
(``[{"rank", "op", "group", "seq", "waiting_for", ...}]``; a process legacy's heartbeat monitor acted on also
has ``monitor``: ``{"reason", "detected_at_s", "terminate_at_s", "heartbeat_timeout_s"}``), ``unhealthy_ranks``
(the sticky health-check mark a watchdog abort leaves), ``errors`` (``kind`` "heartbeat" when the monitor ended
the process; ``replaced_timeout``, a hang entry, where torch raised the error in place of a timeout: a gloo op
on a destroyed group's handle; or, with ``ended_by``, the wait a peer's gloo timeout ended by closing its
pairs), ``slowdowns`` (what each straggler fault cost: ``{"kind": "straggler", "rank", "factor", "extra_s"}``
or ``{"kind": "link-straggler", "link", "ranks", "factor", "ops", "extra_s", "groups"}``),
``faults_unacted`` (each scheduled fault that never struck, described, with why), ``races`` (a store-write race
the simulated timing decided one way that no hang or error names: a one-rank gloo group's key written under a
name another group bootstrapped under; on real gloo the outcome is timing), ``expectations``, ``event_count``,
``trace_hash``, ``end_time_s``, ``decisions`` (the policy's plan and one-line explanation per
group-creation call, as seen by the group's first member; only for a policy other than torch-default).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simnccl import __version__
from simnccl.engine import RunOutcome
from simnccl.faults import FaultSchedule
from simnccl.memory import to_mib

# 2: every command writes one document {"schema", "command", "version", "ok", "summary", "results"}
# (1 was run's scenario object, or a list of them for several files).
# 3: capture's "calls" are [{"ranks", "calls"}], one entry per distinct list of calls (was one list per rank).
SCHEMA_VERSION = 3


@dataclass(frozen=True, slots=True)
class SummaryLine:
    """One variant (cost: column; real diff: case) in one line: what ``--quiet`` prints, the end of normal
    output repeats, and the JSON document's ``summary`` holds. ``ok`` is whether it passes the command's check.
    """

    scenario: str
    variant: str
    verdict: str
    ok: bool
    figure: str

    def text(self) -> str:
        return "  ".join((self.scenario, self.variant, self.verdict, "ok" if self.ok else "FAIL", self.figure)).rstrip()

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "verdict": self.verdict,
            "ok": self.ok,
            "figure": self.figure,
        }


def document(command: str, results: Sequence[Mapping[str, Any]], summary: Sequence[SummaryLine]) -> dict[str, Any]:
    """The one JSON shape every command's ``--json`` writes (``ok``: every summary line passed)."""
    return {
        "schema": SCHEMA_VERSION,
        "command": command,
        "version": __version__,
        "ok": all(line.ok for line in summary),
        "summary": [line.to_dict() for line in summary],
        "results": list(results),
    }


@dataclass(slots=True)
class ExpectationResult:
    key: str
    ok: bool
    message: str


@dataclass(slots=True)
class VariantResult:
    name: str
    description: str
    release: str
    torch_version: str
    profile: str
    env: dict[str, str]
    policy: str
    outcome: RunOutcome
    expectations: list[ExpectationResult] = field(default_factory=list)
    explanations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.outcome.verdict

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.expectations)

    def checkpoint_used_mib(self, checkpoint: str) -> dict[str, float] | None:
        snaps = self.outcome.checkpoints.get(checkpoint)
        if snaps is None:
            return None
        return {device: to_mib(s.used_bytes) for device, s in sorted(snaps.items())}

    def to_dict(self) -> dict[str, Any]:
        outcome = self.outcome
        return {
            "name": self.name,
            "description": self.description,
            "verdict": outcome.verdict,
            "ok": self.ok,
            "release": self.release,
            "torch_version": self.torch_version,
            "profile": self.profile,
            "policy": self.policy,
            "env": dict(sorted(self.env.items())),
            "checkpoints": [
                {
                    "name": label,
                    "devices": [
                        {
                            "device": device,
                            "used_mib": _r(to_mib(s.used_bytes)),
                            "free_mib": _r(to_mib(s.free_bytes)),
                            "time_s": _r(s.time_s),
                        }
                        for device, s in sorted(snaps.items())
                    ],
                }
                for label, snaps in outcome.checkpoints.items()
            ],
            "devices": [
                {
                    "device": ledger.device,
                    "total_mib": _r(to_mib(ledger.total_bytes)),
                    "used_mib": _r(to_mib(ledger.used_bytes)),
                    "peak_mib": _r(to_mib(ledger.peak_bytes)),
                    "peak_by_owner_mib": {k: _r(to_mib(v)) for k, v in ledger.peak_by_owner_kind.items()},
                    "end_by_group_mib": {k: _r(to_mib(v)) for k, v in sorted(ledger.used_by_group().items())},
                    "timeline": [
                        {
                            "time_s": _r(e.time_s),
                            "rank": e.owner.rank,
                            "owner": e.owner.kind,
                            "group": e.owner.group,
                            "phase": e.owner.phase,
                            "op": e.op.name if hasattr(e.op, "name") else str(e.op),
                            "delta_mib": _r(to_mib(e.delta_bytes)),
                            "used_mib": _r(to_mib(e.used_bytes)),
                        }
                        for e in ledger.timeline
                    ],
                }
                for ledger in outcome.ledgers.values()
                if ledger.timeline
            ],
            "host": [  # pinned host memory NCCL holds per node (never in the device figures)
                {
                    "device": ledger.device,
                    "used_mib": _r(to_mib(ledger.used_bytes)),
                    "peak_mib": _r(to_mib(ledger.peak_bytes)),
                }
                for ledger in outcome.host_ledgers.values()
            ],
            "groups": [
                {
                    "name": record.name,
                    "desc": record.desc,
                    "ranks": list(record.ranks),
                    "implementation": record.impl,
                    "via_split": record.via_split,
                    "members": [
                        {
                            "rank": rank,
                            "device": info["device"],
                            "mib": _r(to_mib(info["bytes"])),
                            "allocated_at_s": {phase: _r(t) for phase, t in info["phases"].items()},
                            **_nccl_parts(info, rank, outcome.slots_charged),
                        }
                        for rank, info in sorted(record.members.items())
                    ],
                }
                for record in outcome.groups.values()
            ],
            "hangs": outcome.hangs,
            "unhealthy_ranks": [rt.rank for rt in outcome.ranks if rt.unhealthy],
            "errors": outcome.errors,
            "slowdowns": outcome.slowdowns,
            "faults_unacted": outcome.faults_unacted,
            "races": outcome.races,
            "expectations": [{"key": e.key, "ok": e.ok, "message": e.message} for e in self.expectations],
            "decisions": self.explanations,
            "event_count": outcome.event_count,
            "trace_hash": outcome.trace_hash,
            "end_time_s": _r(outcome.end_time_s),
        }


def _nccl_parts(info: dict[str, Any], rank: int, slots_charged: Mapping[tuple[int, str], int]) -> dict[str, Any]:
    """A member's NCCL memory by moment of payment (``init``, ``first all_reduce (nvls)`` ...), from the
    breakdowns the engine keeps (``simnccl.comm_memory``), and the NVLS multicast slots its communicators took,
    as the multicast ledger charged them (``simnccl.engine.nvls``); empty when none."""
    memories = info.get("memory") or {}
    if not memories:
        return {}
    paid: dict[str, float] = {}
    slots = 0
    for name, memory in memories.items():
        slots += slots_charged.get((rank, name), 0)
        for moment, num_bytes in memory.breakdown.by_paid_at().items():
            paid[moment] = paid.get(moment, 0.0) + to_mib(num_bytes)
    return {"nccl_paid_mib": {k: _r(v) for k, v in paid.items()}, "multicast_slots": slots}


@dataclass(slots=True)
class ScenarioResult:
    scenario: str
    source: str
    seed: int
    variants: list[VariantResult]
    faults: FaultSchedule | None = None  # the schedule every variant ran (``fault_schedule`` in the JSON)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.variants)

    @property
    def trace_hash(self) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for v in self.variants:
            digest.update(f"{v.name}:{v.outcome.trace_hash};".encode())
        return digest.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "source": self.source,
            "seed": self.seed,
            "trace_hash": self.trace_hash,
            "ok": self.ok,
            "fault_schedule": _schedule(self.faults),
            "variants": [v.to_dict() for v in self.variants],
        }


def _schedule(schedule: FaultSchedule | None) -> dict[str, Any]:
    """The fault schedule as the run printed it on stderr: a swarm's drawn faults were in no document, so a seed
    that drew none could not be told from one that drew a fault that acted."""
    if schedule is None:
        return {"seed": None, "classes": [], "faults": []}
    return {
        "seed": schedule.seed,
        "classes": list(schedule.classes),
        "faults": [fault.describe() for fault in schedule.faults],
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)

"""Where each communicator's MiB come from, for ``simnccl cost``: channels x buffers, NVLS, network shared
buffers, fixed overheads, and when each is paid (at init or at a first use).

Why its own module: ``simnccl.cost`` reports *how much* per rank; this explains *why*, from the itemised
breakdown the engine keeps for every rank's communicator (``GroupRecord.members[rank]["memory"]``, see
``simnccl.comm_memory``) and the process overheads it holds (``simnccl.engine.memory.PROCESS_OWNER``). It reads
a finished run and returns plain data (a column may be computed in a worker process and pickled back).

Categories (``Part.mechanism`` of ``simnccl.nccl``):

* ``channels x buffers``: the device communicator and channel tables (init), ring/tree/PAT/CollNet and
  send/recv connections with their protocol buffers (at the first use that needs them);
* ``NVLS``: NVLS channels, credit region and buffers (their multicast slots are counted apart);
* ``net shared``: the NET shared p2p pool;
* ``fixed``: the profile's measured per-communicator overhead;
* ``process``: the profile's once-per-process overheads (first communicator, first collective), per rank.

"NVLS multicast slots" are not read off the breakdown: they are what the per-node multicast ledger
(``simnccl.engine.nvls``) charged each communicator at init (``RunOutcome.slots_charged``), the same count
that fails an init with NCCL's bind error when a node's switches are full.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from simnccl.engine import RunOutcome
from simnccl.engine.memory import PROCESS_FIRST_COLLECTIVE, PROCESS_FIRST_COMM, PROCESS_OWNER
from simnccl.nccl import Breakdown
from simnccl.plain_table import plain_table

MIB = 2**20
CATEGORIES = ("channels x buffers", "NVLS", "net shared", "fixed", "process")
_CATEGORY_OF = {
    "nvls-channels": "NVLS",
    "nvls-credit": "NVLS",
    "nvls-buffers": "NVLS",
    "net-shared-buffers": "net shared",
    "fixed-overhead": "fixed",
    "process-overhead": "process",
}
# The rows ``render`` prints per column (key, label): categories, then when, then what is not device memory.
ROWS = (
    *((f"cat:{c}", f"  {c} MiB") for c in CATEGORIES),
    ("when:init", "  paid at init MiB"),
    ("when:first use", "  paid at first use MiB"),
    ("slots", "NVLS multicast slots"),
    ("host_mib", "pinned host MiB"),
)


def category(mechanism: str) -> str:
    return _CATEGORY_OF.get(mechanism, "channels x buffers")


def _empty() -> dict[str, float]:
    return {key: 0.0 for key, _ in ROWS}


def _figures(breakdown: Breakdown) -> dict[str, float]:
    row = _empty()
    for part in breakdown.parts:
        if part.ledger == "host":
            row["host_mib"] += part.total / MIB
            continue
        row[f"cat:{category(part.mechanism)}"] += part.total / MIB
        row["when:init" if part.paid_at == "init" else "when:first use"] += part.total / MIB
    return row


def _natural(item: tuple[tuple[str, tuple[int, ...]], Any]) -> tuple[Any, ...]:
    """Group names in creation order where torch numbers them ("2" before "10"), user names after."""
    name, ranks = item[0]
    return (0, int(name), ranks) if str(name).isdigit() else (1, str(name), ranks)


def communicators(outcome: RunOutcome, rank: int | None = None) -> dict[int, list[dict[str, Any]]]:
    """Per rank (or only ``rank``), each of its communicators that holds memory: group, size, MiB per category
    and per moment of payment, NVLS multicast slots, pinned host MiB; with ``rank``, also the parts as
    ``Part.to_dict`` gives them and the uses connected. Slots: what the multicast ledger charged that rank's
    communicator on its node (shared by the node's members, so summing over ranks overcounts a node)."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    figures: dict[int, dict[str, float]] = {}  # id(breakdown) -> its figures: ranks of a class share one
    for (name, ranks), record in sorted(outcome.groups.items(), key=_natural):
        members = record.members.items() if rank is None else [(rank, record.members.get(rank))]
        for member_rank, member in members:
            if member is None:
                continue
            for comm_name, memory in sorted(member.get("memory", {}).items()):
                b = memory.breakdown
                row = figures.get(id(b))
                if row is None:
                    row = figures[id(b)] = _figures(b)
                entry: dict[str, Any] = {"group": name, "communicator": comm_name, "desc": record.desc}
                entry["size"] = len(ranks)
                entry.update({key: round(value, 4) for key, value in row.items()})
                entry["slots"] = outcome.slots_charged.get((member_rank, comm_name), 0)
                if rank is not None:
                    entry["shared_with_parent"] = b.split_shared
                    entry["uses"] = [use.label for use in memory.uses]
                    entry["unmodelled_options"] = list(memory.unmodelled)
                    entry["parts"] = [p.to_dict() for p in b.parts]
                per_rank.setdefault(member_rank, []).append(entry)
    return per_rank


def process_overheads(outcome: RunOutcome) -> dict[int, dict[str, float]]:
    """Per rank, the once-per-process MiB it holds (``process-first-comm``, ``process-first-collective``)."""
    out: dict[int, dict[str, float]] = {}
    for ledger in outcome.ledgers.values():
        for owner, held in ledger.by_owner.items():
            if owner.kind == "comm" and owner.group == PROCESS_OWNER and held:
                phases = out.setdefault(owner.rank, {})
                phases[owner.phase] = phases.get(owner.phase, 0.0) + held / MIB
    return out


def per_rank_totals(outcome: RunOutcome) -> dict[int, dict[str, float]]:
    """Per rank, the ``ROWS`` figures summed over its communicators, its process overheads included.

    The same sums as adding up ``communicators``' entries rank by rank, in the same order (so the same floats),
    computed once per rank class: ranks holding the same breakdown objects in the same order (ranks of a class
    share them) share one sum; only the NVLS slots, charged per rank, are added per rank."""
    figures: dict[int, dict[str, float]] = {}  # id(breakdown) -> its figures, rounded as ``communicators`` does
    held: dict[int, list[int]] = {}  # rank -> ids of its communicators' breakdowns, in ``communicators``' order
    slots: dict[int, int] = {}
    charged = outcome.slots_charged
    for (_name, _ranks), record in sorted(outcome.groups.items(), key=_natural):
        for member_rank, member in record.members.items():
            if member is None:
                continue
            memories = member.get("memory")
            if not memories:
                continue
            ids = held.setdefault(member_rank, [])
            for comm_name, memory in sorted(memories.items()):
                b = memory.breakdown
                if id(b) not in figures:
                    figures[id(b)] = {key: round(value, 4) for key, value in _figures(b).items()}
                ids.append(id(b))
                if charged:
                    slots[member_rank] = slots.get(member_rank, 0) + charged.get((member_rank, comm_name), 0)
    sums: dict[tuple[int, ...], dict[str, float]] = {}  # per rank class: its communicators' figures summed
    process = process_overheads(outcome)
    totals: dict[int, dict[str, float]] = {}
    for rt in outcome.ranks:
        ids = tuple(held.get(rt.rank, ()))
        summed = sums.get(ids)
        if summed is None:
            summed = sums[ids] = _empty()
            for key in summed:
                if key != "slots":
                    for figure in ids:
                        summed[key] += figures[figure][key]
        row = dict(summed)
        row["slots"] += slots.get(rt.rank, 0)
        for phase, mib in process.get(rt.rank, {}).items():
            row["cat:process"] += mib
            row["when:init" if phase == PROCESS_FIRST_COMM else "when:first use"] += mib
        totals[rt.rank] = row
    return totals


def _summary(values: Sequence[float]) -> dict[str, float]:
    rounded = [round(v, 1) for v in values]
    counts = Counter(rounded)
    most = max(counts.values())
    return {"typical": min(v for v, n in counts.items() if n == most), "min": min(rounded), "max": max(rounded)}


def breakdown(outcome: RunOutcome) -> dict[str, Any]:
    """A column's breakdown as plain data: per-rank summaries of every ``ROWS`` figure, and the communicators of
    the rank holding the most NCCL device memory (the one a budget must fit), with the process overheads."""
    totals = per_rank_totals(outcome)
    if not totals:
        return {"summary": {}, "rank": None, "communicators": [], "process_mib": {}}
    summary = {key: _summary([row[key] for row in totals.values()]) for key, _ in ROWS}

    def device_mib(rank: int) -> float:
        return sum(totals[rank][f"cat:{c}"] for c in CATEGORIES)

    worst = min(totals, key=lambda rank: (-round(device_mib(rank), 4), rank))
    comms = communicators(outcome, worst).get(worst, [])
    return {
        "summary": summary,
        "rank": worst,
        "communicators": comms,
        "process_mib": {k: round(v, 4) for k, v in process_overheads(outcome).get(worst, {}).items()},
    }


# ---------------------------------------------------------------------------------------------- text


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _cell(summary: dict[str, float] | None) -> str:
    if not summary:
        return "-"
    typical, lo, hi = summary["typical"], summary["min"], summary["max"]
    return _fmt(typical) if lo == hi else f"{_fmt(typical)} [{_fmt(lo)}-{_fmt(hi)}]"


def render(columns: Iterable[tuple[str, dict[str, Any]]]) -> str:
    """The ``--breakdown`` view: per column, where its NCCL MiB per rank come from (typical [min-max]), then
    each communicator of the rank holding the most."""
    columns = list(columns)
    header = ["where the NCCL MiB come from", *(name for name, _ in columns)]
    rows = [header]
    for key, label in ROWS:
        rows.append([label, *(_cell(data.get("summary", {}).get(key)) for _, data in columns)])
    lines = plain_table(rows)
    for name, data in columns:
        comms = data.get("communicators") or []
        if not comms:
            continue
        lines += ["", f"{name}: rank {data['rank']}'s communicators (MiB; init + first use = total)"]
        detail = [["group", "ranks", "ch x buf", "NVLS", "net", "fixed", "init", "1st use", "slots", "host", "uses"]]
        for c in comms:
            detail.append(
                [
                    f"{c['group']} ({c['desc']})" if c["desc"] not in ("", "undefined") else str(c["group"]),
                    str(c["size"]),
                    *(
                        _fmt(round(c[k], 1))
                        for k in ("cat:channels x buffers", "cat:NVLS", "cat:net shared", "cat:fixed")
                    ),
                    _fmt(round(c["when:init"], 1)),
                    _fmt(round(c["when:first use"], 1)),
                    str(c["slots"]),
                    _fmt(round(c["host_mib"], 1)),
                    ", ".join(c["uses"]) or "-",
                ]
            )
        process = data.get("process_mib") or {}
        if process:
            detail.append(
                [
                    "(process)",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    _fmt(round(process.get(PROCESS_FIRST_COMM, 0.0), 1)),
                    _fmt(round(process.get(PROCESS_FIRST_COLLECTIVE, 0.0), 1)),
                    "-",
                    "-",
                    "-",
                ]
            )
        lines += plain_table(detail)
        if process:
            lines.append(
                "(process): NCCL's once-per-process cost, with the first communicator and the first collective"
            )
    return "\n".join(lines)

"""Human-readable output of a run: a header, one block per variant as it finishes, a footer, a summary line each.

rich renders it; the same content is in the JSON, so nothing here is the only place a fact appears. Tables
stay readable at any scale: up to ``MAX_DEVICE_COLUMNS`` devices get a column each; more are summarised per
checkpoint as min / typical / max over devices (typical: the most common value) with where the maximum is,
plus the device classes (devices with the same figures at every checkpoint) when there are few. Hangs and
errors that differ only by rank are one line each, naming the ranks as ranges. User text (names,
descriptions, messages) is always printed literally, never as rich markup.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from simnccl.memory import to_mib
from simnccl.result import ScenarioResult, SummaryLine, VariantResult
from simnccl.visible_text import one_line

MAX_GROUP_ROWS = 24
MAX_DEVICE_COLUMNS = 4  # more devices than this: one min/typical/max table instead of a column per device
MAX_CLASS_ROWS = 8  # device classes listed when there are at most this many
MAX_EXPECT_LINES = 4  # checks of one expectation printed one per line; beyond, failures first and a count
VERDICT_STYLE = {"pass": "green", "fail": "red", "hang": "yellow", "error": "red"}
_DEVICE = re.compile(r"^n(\d+):([a-z]+):(\d+)$")


# ---------------------------------------------------------------------------------------------- compact text


def ranges(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5, 7, 8] -> "0-3, 5, 7-8"."""
    values = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def ranks_text(ranks: Iterable[int]) -> str:
    values = sorted(set(ranks))
    return f"rank {values[0]}" if len(values) == 1 else f"ranks {ranges(values)}"


def devices_text(devices: Sequence[str]) -> str:
    """``n0:cuda:0`` ... ``n3:cuda:7`` -> ``n[0-3]:cuda:[0-7]`` (hostlist style): nodes with the same GPU
    indexes share one entry."""
    by_node: dict[tuple[int, str], list[int]] = defaultdict(list)
    other: list[str] = []
    for name in devices:
        match = _DEVICE.match(name)
        if match is None:
            other.append(name)
        else:
            by_node[(int(match.group(1)), match.group(2))].append(int(match.group(3)))
    nodes_by_indexes: dict[tuple[str, str], list[int]] = defaultdict(list)
    for (node, kind), indexes in sorted(by_node.items()):
        nodes_by_indexes[(kind, _hostlist(indexes))].append(node)
    parts = [f"n{_hostlist(nodes)}:{kind}:{indexes}" for (kind, indexes), nodes in nodes_by_indexes.items()]
    return "; ".join(parts + other)


def _hostlist(numbers: Iterable[int]) -> str:
    text = ranges(numbers).replace(", ", ",")
    return text if text.isdigit() else f"[{text}]"


def _mib(value: float) -> str:
    return f"{value:,.1f}"


def typical(values: Sequence[float]) -> float:
    """The most common value (the smaller one on a tie); values are rounded to 0.1 first."""
    counts = Counter(round(v, 1) for v in values)
    top = max(counts.values())
    return min(v for v, n in counts.items() if n == top)


# ---------------------------------------------------------------------------------------------- a run


def print_header(console: Console, scenario: str, source: str, seed: int) -> None:
    """Printed before the first variant runs, so a long run shows what it is at once."""
    console.print(Text.assemble((scenario, "bold"), f"  ({source})  seed={seed}"))


def print_footer(console: Console, result: ScenarioResult) -> None:
    summary = "all expectations hold" if result.ok else "EXPECTATIONS FAILED"
    console.print(Text.assemble((summary, "green" if result.ok else "bold red"), f"  trace={result.trace_hash[:16]}"))


def print_result(result: ScenarioResult, console: Console | None = None, *, explain: bool = False) -> None:
    """A whole result at once (a library caller's convenience; the CLI streams the same blocks)."""
    console = console or Console(markup=False, highlight=False)
    print_header(console, result.scenario, result.source, result.seed)
    for variant in result.variants:
        print_variant(console, variant, explain=explain)
    print_footer(console, result)


def print_variant(console: Console, variant: VariantResult, *, explain: bool = False) -> None:
    outcome = variant.outcome
    style = VERDICT_STYLE.get(outcome.verdict, "")
    env = one_line(" ".join(f"{k}={v}" for k, v in sorted(variant.env.items()))) or "(default env)"
    if variant.policy != "torch-default":
        env += f"  policy {one_line(variant.policy)}"
    console.print(
        Text.assemble(
            (variant.name, "bold"),
            f"  torch {variant.torch_version}  {env}  profile {variant.profile}  → ",
            (outcome.verdict.upper(), style),
        )
    )
    devices = sorted({d for snaps in outcome.checkpoints.values() for d in snaps}, key=_device_order)
    if devices:
        if len(devices) <= MAX_DEVICE_COLUMNS:
            console.print(_per_device_table(variant, devices))
        else:
            console.print(_summary_table(variant, devices))
            classes = _device_classes(variant, devices)
            if len(classes) <= MAX_CLASS_ROWS:
                console.print(_classes_table(variant, classes))
            else:
                console.print(Text(f"  {len(classes)} device classes (every device: --json)"))
    if 0 < len(outcome.groups) <= MAX_GROUP_ROWS:
        console.print(_groups_table(variant))
    elif outcome.groups:
        console.print(Text(f"  {_groups_line(variant)} (every group: --json)"))
    for line in hang_lines(outcome.hangs):
        console.print(Text(f"  {line}", style="yellow"))
    for line in error_lines(outcome.errors):
        console.print(Text(f"  {line}", style="red"))
    for line in outcome.faults_unacted:  # the run says nothing of surviving a fault that never struck
        console.print(Text(f"  fault {line}", style="yellow"))
    for line in outcome.races:  # a verdict the simulated timing decided, which real timing may not
        console.print(Text(f"  race: {line}", style="yellow"))
    for ok, line in expectation_lines(variant.expectations):
        console.print(Text(f"  {line}", style="" if ok else "red"))
    if explain:
        _print_decisions(console, variant)


def _device_order(name: str) -> tuple[Any, ...]:
    match = _DEVICE.match(name)
    return (0, int(match.group(1)), match.group(2), int(match.group(3))) if match else (1, 0, name, 0)


def _per_device_table(variant: VariantResult, devices: Sequence[str]) -> Table:
    table = Table(show_lines=False)
    table.add_column("checkpoint")
    for device in devices:
        table.add_column(f"{device} used MiB", justify="right")
        table.add_column("Δ", justify="right")
    previous: dict[str, float] = {}
    for label, snaps in variant.outcome.checkpoints.items():
        row: list[str | Text] = [Text(label)]
        for device in devices:
            snap = snaps.get(device)
            if snap is None:
                row += ["-", ""]
                continue
            used = to_mib(snap.used_bytes)
            delta = used - previous[device] if device in previous else None
            row += [_mib(used), "" if delta is None else f"{delta:+,.1f}"]
            previous[device] = used
        table.add_row(*row)
    return table


def _summary_table(variant: VariantResult, devices: Sequence[str]) -> Table:
    """Per checkpoint, over devices: min / typical / max used MiB, the typical step, and where the max is."""
    table = Table(title=f"used MiB over {len(devices)} devices", title_justify="left")
    for column, justify in (
        ("checkpoint", "left"),
        ("devices", "right"),
        ("min", "right"),
        ("typical", "right"),
        ("max", "right"),
        ("Δ typical", "right"),
        ("max on", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    previous: float | None = None
    for label, snaps in variant.outcome.checkpoints.items():
        used = {d: to_mib(s.used_bytes) for d, s in snaps.items()}
        if not used:
            table.add_row(label, "0", "-", "-", "-", "", "")
            continue
        values = list(used.values())
        top = max(values)
        common = typical(values)
        at_max = [d for d in sorted(used, key=_device_order) if used[d] == top]
        where = "all" if len(at_max) == len(used) > 1 else at_max[0]
        if 1 < len(at_max) < len(used):
            where += f" (+{len(at_max) - 1})"
        delta = "" if previous is None else f"{common - previous:+,.1f}"
        table.add_row(label, str(len(used)), _mib(min(values)), _mib(common), _mib(top), delta, where)
        previous = common
    return table


def _device_classes(variant: VariantResult, devices: Sequence[str]) -> list[tuple[tuple[float | None, ...], list[str]]]:
    """Devices grouped by their used MiB at every checkpoint, largest class first."""
    checkpoints = list(variant.outcome.checkpoints.values())
    classes: dict[tuple[float | None, ...], list[str]] = defaultdict(list)
    for device in devices:
        key = tuple(round(to_mib(snaps[device].used_bytes), 1) if device in snaps else None for snaps in checkpoints)
        classes[key].append(device)
    return sorted(classes.items(), key=lambda item: (-len(item[1]), _device_order(item[1][0])))


def _classes_table(variant: VariantResult, classes: Sequence[tuple[tuple[float | None, ...], list[str]]]) -> Table:
    table = Table(title="device classes (the same used MiB at every checkpoint)", title_justify="left")
    table.add_column("devices")
    table.add_column("count", justify="right")
    for label in variant.outcome.checkpoints:
        table.add_column(label, justify="right")
    for key, members in classes:
        table.add_row(devices_text(members), str(len(members)), *("-" if v is None else _mib(v) for v in key))
    return table


def _groups_table(variant: VariantResult) -> Table:
    """Which groups hold GPU memory, on which ranks, since when (small runs only; the JSON has all)."""
    table = Table(title="groups", title_justify="left")
    for column in ("name", "desc", "ranks", "implementation", "split", "MiB per member", "allocated at (s)"):
        table.add_column(column)
    for record in variant.outcome.groups.values():
        members = sorted(record.members.items())
        mib = sorted({round(to_mib(info["bytes"]), 1) for _, info in members})
        first = min((t for _, info in members for t in info["phases"].values()), default=None)
        ranks = ranges(record.ranks)
        if len(ranks) > 24:
            ranks = f"{len(record.ranks)} ranks"
        table.add_row(
            Text(record.name[:12]),
            Text(record.desc),
            ranks,
            record.impl,
            "yes" if record.via_split else "no",
            "/".join(f"{m:g}" for m in mib) or "0",
            "-" if first is None else f"{first:.3f}",
        )
    return table


def _groups_line(variant: VariantResult) -> str:
    records = list(variant.outcome.groups.values())
    impls = Counter(r.impl for r in records)
    holding = sum(1 for r in records if any(info["bytes"] for info in r.members.values()))
    shown = ", ".join(f"{n} {impl}" for impl, n in sorted(impls.items()))
    return f"{len(records)} groups ({shown}); {holding} hold GPU memory"


def hang_lines(hangs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per place ranks are stuck (op, kind, sequence number, group), not one per rank."""
    stuck: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for hang in hangs:
        stuck[(hang.get("op", "?"), hang.get("kind", "?"), hang.get("seq", "?"), hang.get("group", ""))].append(hang)
    lines = []
    for (op, kind, seq, group), items in sorted(stuck.items(), key=lambda item: min(h["rank"] for h in item[1])):
        waiting = sorted({r for h in items for r in h.get("waiting_for", ())})
        first = min(items, key=lambda h: h["rank"])
        waits = waiting_text(waiting)
        lines.append(
            f"hang: {ranks_text(h['rank'] for h in items)} in {op} ({kind} {seq} on group {group!r}), {waits}: "
            f"{first.get('explanation', '')}"
        )
    return lines


def waiting_text(waiting: Sequence[int]) -> str:
    """Whom a hang waits for, in words (a size mismatch waits for no rank: every member came)."""
    return f"waiting for {ranks_text(waiting)}" if waiting else "waiting for no rank"


def replaced_timeout_text(hang: Mapping[str, Any]) -> str:
    """Why an error came where a timeout fired: the hang entry torch's error replaced (an error's
    ``replaced_timeout``), in words. Why: torch's text there (a gloo op on a destroyed group's handle, "Process
    group <...> is not initialized in the world group map") names neither the wait nor whom it waited for."""
    whom = waiting_text(list(hang.get("waiting_for", ())))
    timeout = hang.get("timeout_s")
    after = f"after {timeout:g} s " if isinstance(timeout, int | float) else ""
    where = f"{hang.get('kind', '?')} {hang.get('seq', '?')} on group {hang.get('group', '')!r}"
    why = hang.get("explanation") or ""
    if hang.get("ended_by"):  # a peer's gloo timeout closed the pairs it waited on: its own never fired
        return f"raised while in {where}, {whom}, when {hang['ended_by']}"
    return f"raised in place of its timeout, {after}in {where}, {whom}" + (f": {why}" if why else "")


def error_lines(errors: Sequence[dict[str, Any]]) -> list[str]:
    """One line per (kind, op, exception type): the lowest rank's message stands for the others'; an error torch
    raised where a timeout fired says after it what the rank waited for (``replaced_timeout_text``)."""
    alike: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for error in errors:
        alike[(error.get("kind", "error"), error.get("op", "?"), error.get("type", "?"))].append(error)
    lines = []
    for (kind, op, type_name), items in sorted(alike.items(), key=lambda item: min(e["rank"] for e in item[1])):
        first = min(items, key=lambda e: e["rank"])
        message = str(first.get("message") or "")
        lines_of = message.splitlines()
        last_line = lines_of[-1] if lines_of else ""
        if len(lines_of) > 1:  # the most specific line of torch's errors; the rest is not hidden without a word
            last_line += f" (the last of its {len(lines_of)} lines; --json has them all)"
        if len(items) > 1:
            last_line += f" (rank {first['rank']}'s message; the others' alike)"
        lines.append(f"{kind}: {ranks_text(e['rank'] for e in items)} in {op}: {type_name}: {last_line}")
        if first.get("replaced_timeout"):
            lines[-1] += f" ({replaced_timeout_text(first['replaced_timeout'])})"
    return lines


def expectation_lines(expectations: Sequence[Any]) -> list[tuple[bool, str]]:
    """Per expectation: its checks one line each when few; else the failures (up to ``MAX_EXPECT_LINES``) and
    one line for the checks that hold (a per-device expectation at 512 ranks is 512 checks)."""
    by_key: dict[str, list[Any]] = defaultdict(list)
    for e in expectations:
        by_key[e.key].append(e)
    lines: list[tuple[bool, str]] = []
    for key, checks in by_key.items():
        if len(checks) <= MAX_EXPECT_LINES:
            lines += [(e.ok, f"{'ok  ' if e.ok else 'FAIL'} {key}: {e.message}") for e in checks]
            continue
        failed = [e for e in checks if not e.ok]
        lines += [(False, f"FAIL {key}: {e.message}") for e in failed[:MAX_EXPECT_LINES]]
        if len(failed) > MAX_EXPECT_LINES:
            lines.append((False, f"FAIL {key}: ... and {len(failed) - MAX_EXPECT_LINES} more (every check: --json)"))
        held = [e for e in checks if e.ok]
        if held:
            lines.append((True, f"ok   {key}: {len(held)} of {len(checks)} checks hold, e.g. {held[0].message}"))
    return lines


def _print_decisions(console: Console, variant: VariantResult) -> None:
    """``--explain``: every decision the policy took, with its one-line reason."""
    if not variant.explanations:
        console.print(Text(f"  policy {variant.policy}: no decisions (torch's defaults apply unchanged)"))
        return
    table = Table(title=f"policy {variant.policy}: decisions", title_justify="left")
    for column in ("call", "ranks", "plan", "why"):
        table.add_column(column)
    for d in variant.explanations:
        ranks = d["ranks"] if isinstance(d["ranks"], str) else ",".join(map(str, d["ranks"]))
        # one_line: a policy's explanation with a newline made the cell two lines, and an ESC, escaped only when
        # printed, pushed it past its border (its width was measured before)
        cells = (one_line(d["call"]), one_line(ranks), one_line(d["plan"]), one_line(d["explanation"]))
        table.add_row(*(Text(c) for c in cells))
    console.print(table)


# ---------------------------------------------------------------------------------------------- one line


def variant_figure(variant: VariantResult) -> str:
    """The key figure of a variant: its peak GPU memory, what did not finish, the first failed expectation."""
    outcome = variant.outcome
    peaks = [to_mib(ledger.peak_bytes) for ledger in outcome.ledgers.values()]
    parts = [f"peak {_mib(max(peaks))} MiB/GPU" if peaks else "no GPU memory"]
    if outcome.hangs:
        parts.append(f"{ranks_text(h['rank'] for h in outcome.hangs)} hung")
    if outcome.errors:
        kinds = ", ".join(sorted({str(e.get("kind", "error")) for e in outcome.errors}))
        parts.append(f"{ranks_text(e['rank'] for e in outcome.errors)} failed ({kinds})")
    if outcome.faults_unacted:  # a pass that survived no fault it was meant to: said on the one line -q prints too
        count = len(outcome.faults_unacted)
        parts.append(f"{count} fault{'s' if count > 1 else ''} never acted")
    figure = ", ".join(parts)
    failed = next((e for e in variant.expectations if not e.ok), None)
    if failed is not None:
        figure += f"; {failed.key}: {failed.message}"
    return figure


def variant_summary(scenario: str, variant: VariantResult) -> SummaryLine:
    return SummaryLine(scenario, variant.name, variant.verdict, variant.ok, variant_figure(variant))

"""Human-readable output: one table per variant (memory per device at each checkpoint), verdicts, hangs.

rich renders it; the same content is in the JSON, so nothing here is the only place a fact appears.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from simnccl.memory import to_mib
from simnccl.result import ScenarioResult, VariantResult

MAX_GROUP_ROWS = 24
VERDICT_STYLE = {"pass": "green", "fail": "red", "hang": "yellow", "error": "red"}


def print_result(result: ScenarioResult, console: Console | None = None, *, explain: bool = False) -> None:
    console = console or Console()
    console.print(  # user text (name, file name) as Text: printed literally, never parsed as markup
        Text.assemble(
            (result.scenario, "bold"), f"  ({result.source})  seed={result.seed}  trace={result.trace_hash[:16]}"
        )
    )
    for variant in result.variants:
        _print_variant(console, variant)
        if explain:
            _print_decisions(console, variant)
    summary = "all expectations hold" if result.ok else "EXPECTATIONS FAILED"
    console.print(Text(summary, style="green" if result.ok else "bold red"))


def _print_variant(console: Console, variant: VariantResult) -> None:
    outcome = variant.outcome
    style = VERDICT_STYLE.get(outcome.verdict, "")
    env = " ".join(f"{k}={v}" for k, v in sorted(variant.env.items())) or "(default env)"
    if variant.policy != "torch-default":
        env += f"  policy {variant.policy}"
    title = Text.assemble(
        (f"{variant.name}", "bold"),
        f"  torch {variant.torch_version}  {env}  profile {variant.profile}  → ",
        (outcome.verdict.upper(), style),
    )
    console.print(title)
    table = Table(show_lines=False)
    table.add_column("checkpoint")
    devices = sorted({d for snaps in outcome.checkpoints.values() for d in snaps})
    for device in devices:
        table.add_column(f"{device} used MiB", justify="right")
        table.add_column("Δ", justify="right")
    previous: dict[str, float] = {}
    for label, snaps in outcome.checkpoints.items():
        row: list[str | Text] = [Text(label)]
        for device in devices:
            snap = snaps.get(device)
            if snap is None:
                row += ["-", ""]
                continue
            used = to_mib(snap.used_bytes)
            delta = used - previous[device] if device in previous else None
            row += [f"{used:,.1f}", "" if delta is None else f"{delta:+,.1f}"]
            previous[device] = used
        table.add_row(*row)
    console.print(table)
    if 0 < len(outcome.groups) <= MAX_GROUP_ROWS:
        console.print(_groups_table(variant))
    for hang in outcome.hangs:
        console.print(
            Text(
                f"  hang: rank {hang['rank']} in {hang['op']} ({hang.get('kind', 'wait')} {hang.get('seq')} on group "
                f"{hang['group']!r}), waiting for {hang['waiting_for']}: {hang['explanation']}",
                style="yellow",
            )
        )
    for error in outcome.errors:
        first = error["message"].splitlines()[-1] if error["message"] else ""
        console.print(
            Text(
                f"  {error['kind']}: rank {error['rank']} in {error['op']}: {error['type']}: {first}",
                style="red",
            )
        )
    for e in variant.expectations:
        console.print(Text(f"  {'ok  ' if e.ok else 'FAIL'} {e.key}: {e.message}", style="" if e.ok else "red"))


def _groups_table(variant: VariantResult) -> Table:
    """Which groups hold GPU memory, on which ranks, since when (small runs only; the JSON has all)."""
    table = Table(title="groups", title_justify="left")
    for column in ("name", "desc", "ranks", "implementation", "split", "MiB per member", "allocated at (s)"):
        table.add_column(column)
    for record in variant.outcome.groups.values():
        members = sorted(record.members.items())
        mib = sorted({round(to_mib(info["bytes"]), 1) for _, info in members})
        first = min((t for _, info in members for t in info["phases"].values()), default=None)
        ranks = ",".join(map(str, record.ranks)) if len(record.ranks) <= 8 else f"{len(record.ranks)} ranks"
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


def _print_decisions(console: Console, variant: VariantResult) -> None:
    """``--explain``: every decision the policy took, with its one-line reason."""
    if not variant.explanations:
        console.print(f"  policy {variant.policy}: no decisions (torch's defaults apply unchanged)")
        return
    table = Table(title=f"policy {variant.policy}: decisions", title_justify="left")
    for column in ("call", "ranks", "plan", "why"):
        table.add_column(column)
    for d in variant.explanations:
        ranks = d["ranks"] if isinstance(d["ranks"], str) else ",".join(map(str, d["ranks"]))
        table.add_row(Text(d["call"]), ranks, Text(d["plan"]), Text(d["explanation"]))
    console.print(table)

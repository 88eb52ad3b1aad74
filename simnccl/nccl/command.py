"""``simnccl validate [--json [FILE]] [-q]``: the NCCL memory model against every published figure.

Prints the validation table (predicted vs published, error, leave-one-out error), the fitted parameters and
the points they were fitted to, the figures the model cannot express and why, the qualitative claims checked,
and the model's unmeasured assumptions. Exit 0 when the goal holds (every counted point within 10 %, median
within 5 %, in-sample and leave-one-out, every claim holding), 1 when it does not, 2 when a data file is bad.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from simnccl.cli_options import STDOUT, add_output_options, check_json_target
from simnccl.nccl import UNMEASURED_ASSUMPTIONS
from simnccl.nccl.constants import NcclInputError
from simnccl.nccl.validation import MEDIAN_TOLERANCE, POINT_TOLERANCE, Table, validation_table

EXIT_OK, EXIT_GOAL_MISSED, EXIT_BAD_INPUT = 0, 1, 2


def add_validate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Register ``validate`` on the ``simnccl`` sub-command parser."""
    parser = sub.add_parser(
        "validate",
        help="the NCCL memory model against every published figure (predicted vs published, leave-one-out)",
        description=__doc__.splitlines()[0],
    )
    add_output_options(parser)  # --json [FILE], -q, --version: as every simnccl command
    return parser


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def print_table(table: Table, out: TextIO) -> None:
    """The human table; plain text (no markup), one line per point."""
    w = out.write
    w("NCCL communicator memory: model vs published figures (MiB; error = (model - published) / published)\n\n")
    header = f"{'point':<26} {'published':>10} {'model':>10} {'error':>8} {'LOO model':>10} {'LOO err':>8}"
    header += "  figure     status\n"
    w(header)
    w("-" * (len(header) - 1) + "\n")
    for row in table.rows:
        status = "ok" if row.ok else ("not counted" if not row.counted else "MISS")
        w(
            f"{row.point.id:<26} {_mib(row.point.published):>10} {_mib(row.predicted):>10} {_pct(row.error):>8} "
            f"{_mib(row.loo_predicted):>10} {_pct(row.loo_error):>8}  {row.figure:<10} {status}\n"
        )
    w("\nPoints\n")
    for row in table.rows:
        w(f"  {row.point.id}: {row.point.title}\n")
        w(f"    published: {row.point.published_as} ({row.point.source})\n")
        w(f"    conditions: {row.point.conditions}\n")
        if row.point.assumed_reason:
            w(f"    assumed because of this figure (dropped for leave-one-out): {row.point.assumed_reason}\n")
        if not row.counted:
            w("    not counted: its only evidence is its own figure (no leave-one-out)\n")
    w("\nFitted parameters (everything else is predicted from NCCL's constants)\n")
    for parameter in table.data.parameters:
        values = {v for r in table.rows for k, v in r.parameters.items() if k == parameter.name}
        value = next(iter(values)) if values else 0.0
        w(f"  {parameter.name} = {value:.1f} MiB, fitted to {', '.join(parameter.fitted_to)}: {parameter.what}\n")
    w("\nPublished figures the model cannot express\n")
    for item in table.data.unreached:
        w(f"  {item.id}: {item.title} ({item.source})\n    why: {item.reason}\n")
    w("\nClaims checked\n")
    for claim in table.claims:
        w(f"  [{'holds' if claim.holds else 'FAILS'}] {claim.claim.title} ({claim.claim.source}): {claim.detail}\n")
    w("\nUnmeasured assumptions of the model (simnccl.nccl)\n")
    for i, assumption in enumerate(UNMEASURED_ASSUMPTIONS, 1):
        w(f"  {i}. {assumption}\n")
    w("\n" + _goal_line(table) + "\n")


def _goal_line(table: Table) -> str:
    """The verdict line (the last of the table; alone under ``--quiet``)."""
    counted = sum(1 for r in table.rows if r.counted)
    verdict = "MET" if table.goal_met else "MISSED"
    line = (
        f"Goal (every point within {POINT_TOLERANCE:.0%}, median within {MEDIAN_TOLERANCE:.0%}, in-sample and "
        f"leave-one-out): {verdict}. {counted} points counted; median |error| {table.median_error:.2%}, "
        f"median |LOO error| {table.median_loo_error:.2%}"
    )
    if table.misses:
        line += f"; outside {POINT_TOLERANCE:.0%}: {', '.join(r.point.id for r in table.misses)}"
    return line + "."


def run_validate(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``simnccl validate``; returns the exit code."""
    from simnccl.cli_output import document_stream  # here: the model's import stays free of simpy (rich's too)

    out = out or document_stream()  # stdout, also while the document owns it (cli_output)
    err = err or sys.stderr
    target = getattr(args, "json", None)
    if isinstance(target, str):
        try:
            check_json_target(target)  # before anything runs, as every command
        except ValueError as error:
            err.write(f"error: {error}\n")
            return EXIT_BAD_INPUT
    try:
        table = validation_table()
    except NcclInputError as error:
        err.write(f"error: {error}\n")
        return EXIT_BAD_INPUT
    target = getattr(args, "json", None)
    document = {**table.to_dict(), "ok": table.goal_met}  # "ok" as in every simnccl command's document
    if target in (True, STDOUT):  # True: a caller's namespace from before --json took a FILE
        from simnccl.cli_output import write_all_to_stdout

        write_all_to_stdout(json.dumps(document, indent=2) + "\n", out)
        return EXIT_OK if table.goal_met else EXIT_GOAL_MISSED
    if getattr(args, "quiet", False):
        out.write(_goal_line(table) + "\n")
    else:
        print_table(table, out)
    if target:
        try:
            Path(target).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            err.write(f"error: --json: cannot write {target!r}: {error.strerror or error}\n")
            return EXIT_BAD_INPUT
    return EXIT_OK if table.goal_met else EXIT_GOAL_MISSED

"""A plain-text table: the first column left-aligned, the others right-aligned, a rule under the header.

Why its own module: ``simnccl cost`` prints its per-rank table and its ``--breakdown`` view the same way, and a
CI log or a terminal reads both; one formatter keeps them alike.
"""

from __future__ import annotations

from collections.abc import Sequence


def plain_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of ``rows`` (the first one is the header), columns separated by two spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines

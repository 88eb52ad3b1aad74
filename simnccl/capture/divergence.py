"""A note when captured ranks issue different numbers of collectives on one group.

Why: members of a group issue the same collectives on real GPUs unless the code branches by rank (then the real
run hangs too, and the simulation says so). But a capture runs each rank alone, and a collective's outputs hold
that rank's own data (``collective_values``), so code whose *calls* depend on gathered values (a rejection
loop such as ``trunc_normal_`` on a sharded DTensor) can make ranks issue different sequences where real ranks,
seeing the same global data, would agree. The simulation then reports a hang; this note says which group and
ranks differ, and that the capture may be the cause, so nobody takes such a hang on faith or dismisses a real one.
"""

from __future__ import annotations

from collections.abc import Sequence

from simnccl.ops import Collective, Program

_GROUPS_SHOWN = 3  # groups named in the note; the rest are counted


def divergence_note(programs: Sequence[Program]) -> str | None:
    """The note, or None when every group's members that issue collectives on it issue equally many."""
    counts_by_program: dict[int, dict[str, int]] = {}
    ranks_by_program: dict[int, list[int]] = {}
    for rank, program in enumerate(programs):
        key = id(program)
        ranks_by_program.setdefault(key, []).append(rank)
        if key not in counts_by_program:
            counts: dict[str, int] = {}
            for op in program.ops:
                if isinstance(op, Collective):
                    counts[op.group] = counts.get(op.group, 0) + 1
            counts_by_program[key] = counts
    per_group: dict[str, dict[int, list[int]]] = {}  # group -> count -> ranks issuing that many
    for key, counts in counts_by_program.items():
        for group, count in counts.items():
            per_group.setdefault(group, {}).setdefault(count, []).extend(ranks_by_program[key])
    differing = [(group, by_count) for group, by_count in per_group.items() if len(by_count) > 1]
    if not differing:
        return None
    shown = []
    for group, by_count in differing[:_GROUPS_SHOWN]:
        parts = "; ".join(f"ranks {_ranks(ranks)}: {count}" for count, ranks in sorted(by_count.items()))
        shown.append(f"{group!r} ({parts})")
    more = f" and {len(differing) - _GROUPS_SHOWN} more group(s)" if len(differing) > _GROUPS_SHOWN else ""
    return (
        f"ranks issued different numbers of collectives on {', '.join(shown)}{more}. Code that branches by rank "
        "hangs on GPUs too; but if the calls depended on tensor values (a loop on gathered data, such as "
        "trunc_normal_ on a sharded DTensor), a capture cannot reproduce them: each rank ran alone and its "
        "collectives returned its own data, so a simulated hang on these groups may not happen on GPUs"
    )


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return ",".join(map(str, ranks)) if len(ranks) <= 6 else f"{ranks[0]},{ranks[1]},...,{ranks[-1]} ({len(ranks)})"

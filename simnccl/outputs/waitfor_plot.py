"""``simnccl explain --plot FILE.png|.svg``: the wait-for graph of each variant's hang, cycles in red.

Why: a circular wait is obvious as a picture (two arrows pointing at each other) and easy to miss in a list of
32 "rank r waits for rank s" lines. Nodes are ranks: red for ranks of a cycle, orange for stragglers (ranks
others wait on that wait on nobody), blue for ranks that wait. Each arrow is labelled with the rendezvous the
waiter is blocked in. Ranks that wait alike (the same ranks, in the same call) and that nobody waits on are
drawn as one node ("ranks 4-31"), so a 512-rank hang is still a handful of nodes. Drawn with matplotlib alone
(no graphviz): a circular layout in rank order, deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simnccl.outputs.plot import save
from simnccl.prerequisites import require_matplotlib
from simnccl.result import ScenarioResult, VariantResult
from simnccl.waitfor import WaitForGraph

MAX_EDGE_LABELS = 24  # more arrows than this are drawn unlabelled
PANEL_SIZE_IN = (6.0, 5.0)
COLORS = {"cycle": "tab:red", "straggler": "tab:orange", "waiter": "tab:blue"}


@dataclass(frozen=True, slots=True)
class _Node:
    ranks: tuple[int, ...]
    role: str  # cycle | straggler | waiter

    @property
    def label(self) -> str:
        ranks = self.ranks
        if len(ranks) == 1:
            return f"rank {ranks[0]}"
        if len(ranks) <= 3:
            return "ranks " + ",".join(map(str, ranks))
        if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
            return f"ranks {ranks[0]}-{ranks[-1]}"
        return f"{len(ranks)} ranks"


def write_waitfor_plot(results: Sequence[ScenarioResult], path: Path) -> None:
    require_matplotlib("explain --plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [(r.scenario, v, segment, graph) for r in results for v in r.variants for segment, graph in _graphs(v)]
    columns = 1 if len(panels) == 1 else 2 if len(panels) <= 4 else 3
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(PANEL_SIZE_IN[0] * columns, PANEL_SIZE_IN[1] * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax, (scenario, variant, segment, graph) in zip(axes.flat, panels, strict=False):
        title = f"{scenario} · {variant.name} — {variant.verdict}"
        if segment is not None:
            title += f" (segment {segment})"
        _panel(ax, title, graph)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle("Who waits for whom (wait-for graph of the hang)", fontsize=11)
    save(figure, path)


def _graphs(variant: VariantResult) -> list[tuple[int | None, WaitForGraph]]:
    graphs = WaitForGraph.by_segment(variant.outcome.hangs)
    return sorted(graphs.items(), key=lambda item: item[0] or 0) or [(None, WaitForGraph([]))]


def _nodes(graph: WaitForGraph) -> list[_Node]:
    """Ranks in cycles and stragglers stay single; ranks that wait alike and that nobody waits on merge."""
    waited_on = {w.waited_for for w in graph.waits}
    cycles = {rank for rank in graph.nodes() if (cycle := graph.cycle_of(rank)) is not None and cycle.circular}
    alike: dict[tuple[Any, ...], list[int]] = {}
    nodes: list[_Node] = []
    for rank in graph.nodes():
        if rank in cycles:
            nodes.append(_Node((rank,), "cycle"))
        elif graph.is_sink(rank):
            nodes.append(_Node((rank,), "straggler" if rank in waited_on else "waiter"))
        elif rank in waited_on:
            nodes.append(_Node((rank,), "waiter"))
        else:
            key = tuple((w.waited_for, w.place) for w in graph.waits_of(rank))
            alike.setdefault(key, []).append(rank)
    nodes.extend(_Node(tuple(ranks), "waiter") for ranks in alike.values())
    return sorted(nodes, key=lambda n: n.ranks[0])


def _panel(ax: Any, title: str, graph: WaitForGraph) -> None:
    from matplotlib.lines import Line2D

    ax.set_title(title, fontsize=9, loc="left")
    ax.set_axis_off()
    ax.set_aspect("equal")
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    if not graph.waits and not graph.blocked:
        ax.text(0, 0, "no rank waits for another", ha="center", va="center", fontsize=10)
        return
    nodes = _nodes(graph)
    position: dict[int, tuple[float, float]] = {}
    for i, node in enumerate(nodes):
        angle = math.pi / 2 - 2 * math.pi * i / len(nodes)
        xy = (math.cos(angle), math.sin(angle)) if len(nodes) > 1 else (0.0, 0.0)
        for rank in node.ranks:
            position[rank] = xy
    on_cycle = {(w.waiter, w.waited_for) for cycle in graph.cycles() if cycle.circular for w in cycle.waits}
    drawn: dict[tuple[tuple[float, float], tuple[float, float]], Any] = {}
    for wait in graph.waits:
        start, end = position[wait.waiter], position[wait.waited_for]
        if (start, end) in drawn or start == end:
            continue
        red = (wait.waiter, wait.waited_for) in on_cycle
        drawn[(start, end)] = wait
        ax.annotate(
            "",
            xy=end,
            xytext=start,
            arrowprops={
                "arrowstyle": "-|>",
                "color": COLORS["cycle"] if red else "gray",
                "linewidth": 2.0 if red else 1.0,
                "shrinkA": 16,
                "shrinkB": 16,
                "connectionstyle": "arc3,rad=0.15",
            },
            zorder=1,
        )
    if len(drawn) <= MAX_EDGE_LABELS:
        for (start, end), wait in drawn.items():
            # Beside the arrow's bend (arc3 bends to the left of the direction of travel).
            mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
            dx, dy = end[0] - start[0], end[1] - start[1]
            ax.text(
                mx - 0.15 * dy,
                my + 0.15 * dx,
                f"{wait.kind} #{wait.seq}\non {wait.group!r}" if wait.group else wait.kind,
                fontsize=6,
                ha="center",
                va="center",
                color="dimgray",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
                zorder=2,
            )
    for node in nodes:
        x, y = position[node.ranks[0]]
        ax.scatter([x], [y], s=900, color=COLORS[node.role], alpha=0.85, zorder=3, edgecolors="black")
        ax.text(x, y, node.label.replace(" ", "\n", 1), ha="center", va="center", fontsize=7, color="white", zorder=4)
    handles = [
        Line2D([], [], marker="o", linestyle="none", markersize=9, color=color, label=role)
        for role, color in COLORS.items()
        if any(n.role == role for n in nodes)
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower left", frameon=False)
    summary = [f"circular wait: {', '.join(map(str, c.ranks))}" for c in graph.cycles() if c.circular]
    stragglers = [n.label for n in nodes if n.role == "straggler"]
    if stragglers:
        summary.append("straggler: " + ", ".join(stragglers))
    if summary:
        ax.text(0, -1.45, "; ".join(summary), ha="center", va="bottom", fontsize=8)

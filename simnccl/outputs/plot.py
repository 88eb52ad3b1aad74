"""``--plot FILE.png|.svg``: memory used per device over simulated time, one panel per variant.

Why: the question simnccl answers first is "how much GPU memory do my process groups cost, and when" — a curve
per device shows the staircase of communicator creations, where a checkpoint (a vLLM memory check, a training
step) falls on it, and how close each device comes to its capacity, better than any table. Each panel marks
the run's checkpoints (vertical lines, named) and its group creations (ticks along the bottom, one per
communicator made), and says the verdict in its title. Readable at any scale: up to ``MAX_DEVICE_LINES``
devices each get a line; beyond that the panel draws the envelope of all devices (min to max, and the median)
and a line for each of the ``TOP_DEVICES`` devices with the highest peak.

matplotlib is an extra (``pip install 'simnccl[plots]'``), imported only here and only when a plot is asked
for; figures are drawn on the Agg canvas directly, so no pyplot state or global backend is touched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simnccl.memory import DeviceLedger
from simnccl.prerequisites import require_matplotlib
from simnccl.result import ScenarioResult, VariantResult

GIB = 1024**3
MAX_DEVICE_LINES = 16  # beyond this many devices a panel shows the envelope and the top devices
TOP_DEVICES = 8
CAPACITY_SHOWN_FROM = 0.5  # draw the capacity line when the peak reaches this fraction of it
MAX_CHECKPOINT_LABELS = 12  # more checkpoints than this are drawn without names (a recovery job's commits)
RIGHT_MARGIN = 0.03  # of the run's length, after its end
LABEL_MERGE_FRACTION = 0.015  # checkpoints nearer than this fraction of the time axis share a label
PANEL_SIZE_IN = (7.0, 3.6)
DPI = 120


def write_memory_plot(results: Sequence[ScenarioResult], path: Path) -> None:
    """Draw every variant of ``results`` into one figure at ``path`` (format from its suffix)."""
    require_matplotlib("--plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [(r.scenario, v) for r in results for v in r.variants]
    columns = 1 if len(panels) <= 3 else 2 if len(panels) <= 8 else 3
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(PANEL_SIZE_IN[0] * columns, PANEL_SIZE_IN[1] * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax, (scenario, variant) in zip(axes.flat, panels, strict=False):
        _panel(ax, scenario, variant)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle("GPU memory used per device (simulated by simnccl)", fontsize=11)
    save(figure, path)


def save(figure: Any, path: Path) -> None:
    """PNG or SVG by suffix; SVG keeps its text as text (searchable, selectable) rather than outlines."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(path, dpi=DPI, format=path.suffix.lstrip(".").lower())


def _panel(ax: Any, scenario: str, variant: VariantResult) -> None:
    outcome = variant.outcome
    ledgers = [ledger for ledger in outcome.ledgers.values() if ledger.timeline]
    end_s = max(outcome.end_time_s, max((e.time_s for ledger in ledgers for e in ledger.timeline), default=0.0))
    if end_s <= 0:
        # Everything happened at t=0 (nothing in the run takes simulated time): draw the end state over a
        # nominal second rather than as invisible vertical strokes at the axis.
        end_s = 1.0
        ax.text(
            0.5, 0.5, "the run took no simulated time", ha="center", transform=ax.transAxes, fontsize=8, color="dimgray"
        )
    ax.set_title(
        f"{scenario} · {variant.name} — {variant.verdict} (torch {variant.torch_version}, {variant.policy})",
        fontsize=8,
        loc="left",
    )
    ax.set_xlabel("simulated time (s)", fontsize=8)
    ax.set_ylabel("used (GiB)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    if not ledgers:
        ax.text(0.5, 0.5, "no device memory was used", ha="center", va="center", transform=ax.transAxes, fontsize=9)
        return
    end_s *= 1 + RIGHT_MARGIN  # so a change at the very end (the last checkpoint's charges) shows as a step
    if len(ledgers) <= MAX_DEVICE_LINES:
        for ledger in ledgers:
            times, used = _steps(ledger, end_s)
            ax.step(times, used, where="post", linewidth=1.2, label=ledger.device)
    else:
        _envelope(ax, ledgers, end_s)
    capacity = max(ledger.total_bytes for ledger in ledgers) / GIB
    peak = max(ledger.peak_bytes for ledger in ledgers) / GIB
    if peak >= CAPACITY_SHOWN_FROM * capacity:
        ax.axhline(capacity, color="black", linestyle=":", linewidth=1, label=f"capacity {capacity:.0f} GiB")
        ax.set_ylim(0, capacity * 1.08)
    else:  # the scale of the curves, not of an empty GPU; the capacity is named instead
        ax.plot([], [], " ", label=f"capacity {capacity:.0f} GiB (off scale)")
        ax.set_ylim(0, max(peak, 1e-3) * 1.25)
    ax.set_xlim(0, end_s)
    _checkpoints(ax, outcome)
    _group_creations(ax, outcome)
    _failures(ax, outcome)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)


def _steps(ledger: DeviceLedger, end_s: float) -> tuple[list[float], list[float]]:
    """The ledger's used bytes as a step function from t=0 to the end of the run (GiB)."""
    times, used = [0.0], [0.0]
    for event in ledger.timeline:
        times.append(event.time_s)
        used.append(event.used_bytes / GIB)
    times.append(max(end_s, times[-1]))
    used.append(used[-1])
    return times, used


def _envelope(ax: Any, ledgers: list[DeviceLedger], end_s: float) -> None:
    """Many devices: min-max band and median over all of them, plus the devices with the highest peaks."""
    import numpy as np

    grid = np.unique(np.array([0.0, end_s, *(e.time_s for ledger in ledgers for e in ledger.timeline)]))
    values = np.empty((len(ledgers), len(grid)))
    for row, ledger in enumerate(ledgers):
        times, used = _steps(ledger, end_s)
        # The value in force at each grid time: the last change at or before it (steps-post).
        index = np.searchsorted(np.array(times), grid, side="right") - 1
        values[row] = np.array(used)[index]
    ax.fill_between(
        grid,
        values.min(axis=0),
        values.max(axis=0),
        step="post",
        alpha=0.25,
        color="tab:blue",
        label=f"all {len(ledgers)} devices (min-max)",
    )
    ax.step(
        grid, np.median(values, axis=0), where="post", color="tab:blue", linestyle="--", linewidth=1, label="median"
    )
    top = sorted(ledgers, key=lambda ledger: (-ledger.peak_bytes, ledger.device))[:TOP_DEVICES]
    for ledger in top:
        times, used = _steps(ledger, end_s)
        ax.step(times, used, where="post", linewidth=1, label=f"{ledger.device} (top peak)")


def _checkpoints(ax: Any, outcome: Any) -> None:
    """A vertical line where each checkpoint was first reached (shaded to where the last device reached it).
    Checkpoints closer together than ``LABEL_MERGE_FRACTION`` of the axis share one label, so names never
    print over each other."""
    firsts: list[tuple[float, str]] = []
    for label, snaps in outcome.checkpoints.items():
        if not snaps:
            continue
        first = min(s.time_s for s in snaps.values())
        last = max(s.time_s for s in snaps.values())
        if last > first:
            ax.axvspan(first, last, color="tab:gray", alpha=0.1)
        ax.axvline(first, color="tab:gray", linestyle="--", linewidth=0.8, label=None if firsts else "checkpoint")
        firsts.append((first, label))
    if not firsts or len(firsts) > MAX_CHECKPOINT_LABELS:
        return
    left, right = ax.get_xlim()
    near = (right - left) * LABEL_MERGE_FRACTION
    clusters: list[tuple[float, list[str]]] = []
    for first, label in sorted(firsts, key=lambda item: item[0]):
        if clusters and first - clusters[-1][0] <= near:
            clusters[-1][1].append(label)
        else:
            clusters.append((first, [label]))
    for first, labels in clusters:
        ax.text(
            first,
            0.98,
            " " + ", ".join(labels),
            transform=ax.get_xaxis_transform(),  # x in data, y in axes coordinates
            rotation=90,
            va="top",
            ha="right",
            fontsize=6,
            color="dimgray",
        )


def _group_creations(ax: Any, outcome: Any) -> None:
    """A tick along the bottom edge at each communicator creation (the first member's first charge)."""
    times = sorted(
        min(t for info in record.members.values() for t in info["phases"].values())
        for record in outcome.groups.values()
        if any(info["phases"] for info in record.members.values())
    )
    _edge_marks(
        ax, times, 0.01, "group created", marker="|", markersize=6, markeredgewidth=0.8, alpha=0.6, color="tab:green"
    )


def _failures(ax: Any, outcome: Any) -> None:
    """Red crosses along the top edge where a rank failed (OOM, error, timeout)."""
    times = sorted(e["time_s"] for e in outcome.errors if e.get("time_s") is not None)
    _edge_marks(ax, times, 0.95, "rank failed", marker="x", color="tab:red")


def _edge_marks(ax: Any, times: list[float], height: float, label: str, **style: Any) -> None:
    """Markers at data times, at a fixed height of the axes (so they never hide in the curves' scale)."""
    if times:
        ax.plot(
            times,
            [height] * len(times),
            linestyle="none",
            transform=ax.get_xaxis_transform(),
            label=f"{label} ({len(times)})",
            **style,
        )

"""The command line's picture options: ``--plot``, ``--trace`` and ``--memory-snapshot`` on ``run`` and ``explain``.

Why one module: the CLI needs four small things — declare the options, know whether the run must keep its event
trace, refuse bad options before a long simulation starts, and write the files after it — and the writers
themselves live in ``simnccl.outputs`` (one module per consumer). Errors are one line and exit 2 (bad input or a
missing prerequisite): a file name with the wrong suffix, a folder that does not exist, matplotlib not installed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from simnccl.cli_options import STDOUT, output_file_problem
from simnccl.prerequisites import MissingPrerequisite, require_matplotlib
from simnccl.result import ScenarioResult

PLOT_SUFFIXES = (".png", ".svg")
TRACE_SUFFIXES = (".json",)
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


class PictureError(RuntimeError):
    """A picture option that cannot be honoured; the message is the one line to print."""


def add_picture_arguments(parser: argparse.ArgumentParser, *, explain: bool = False) -> None:
    """``--plot`` draws memory over time for ``run``, the wait-for graph for ``explain``."""
    plot_help = (
        "draw each variant's wait-for graph (who waits for whom; cycles in red) to FILE.png or FILE.svg"
        if explain
        else "draw memory used per device over simulated time, checkpoints and group creations marked, one "
        "panel per variant, to FILE.png or FILE.svg"
    )
    parser.add_argument("--plot", metavar="FILE", type=Path, help=plot_help + " (needs simnccl[plots])")
    parser.add_argument(
        "--trace",
        metavar="FILE",
        type=Path,
        help="write a Chrome/Perfetto trace (JSON; open in ui.perfetto.dev or chrome://tracing): a track per rank "
        "grouped by node, slices for meetings and waits, flow arrows, device memory counters",
    )
    parser.add_argument(
        "--memory-snapshot",
        metavar="FILE",
        type=Path,
        help="write a torch CUDA memory snapshot (pickle, for torch.cuda._memory_viz or pytorch.org/memory_viz) "
        "with communicator buffers as their own segments; one file per variant, FILE-<variant>.pickle when "
        "there are several",
    )


def needs_trace(args: argparse.Namespace) -> bool:
    """Whether the runs must keep their event trace (and meetings): only a ``--trace`` reads them."""
    return getattr(args, "trace", None) is not None


def check_pictures(args: argparse.Namespace) -> None:
    """Refuse, before anything runs, picture options that could not be written."""
    for option, path, suffixes in (
        ("--plot", getattr(args, "plot", None), PLOT_SUFFIXES),
        ("--trace", getattr(args, "trace", None), TRACE_SUFFIXES),
        ("--memory-snapshot", getattr(args, "memory_snapshot", None), SNAPSHOT_SUFFIXES),
    ):
        if path is None:
            continue
        if path.suffix.lower() not in suffixes:
            raise PictureError(f"{option} {path}: expected a file name ending in {' or '.join(suffixes)}")
        folder = path.parent
        if not folder.is_dir():
            raise PictureError(f"{option} {path}: the folder {folder} does not exist")
        if path.exists() and not path.is_file():
            raise PictureError(f"{option} {path}: exists and is not a regular file")
        problem = output_file_problem(str(path))
        if problem is not None:
            raise PictureError(f"{option} {path}: {problem}")
    # one file each: --trace t.json --json t.json wrote the trace, then the document over it (exit 0)
    named: dict[Path, str] = {}
    json_target = getattr(args, "json", None)
    for option, value in (
        ("--json", None if json_target in (None, STDOUT) else Path(json_target)),
        ("--plot", getattr(args, "plot", None)),
        ("--trace", getattr(args, "trace", None)),
        ("--memory-snapshot", getattr(args, "memory_snapshot", None)),
    ):
        if value is None:
            continue
        first = named.setdefault(value.resolve(), option)
        if first != option:
            raise PictureError(f"{option} {value}: the file {first} writes too; give each output its own file")
    if getattr(args, "plot", None) is not None:
        try:
            require_matplotlib(f"simnccl {args.command} --plot")
        except MissingPrerequisite as error:
            raise PictureError(str(error)) from None


def write_pictures(args: argparse.Namespace, results: Sequence[ScenarioResult], err_console: Console) -> None:
    """Write the files the options ask for, and name each on stderr."""
    written: list[tuple[str, Path]] = []
    option = ""
    try:
        if getattr(args, "plot", None) is not None:
            option = "--plot"
            if args.command == "explain":
                from simnccl.outputs.waitfor_plot import write_waitfor_plot

                write_waitfor_plot(results, args.plot)
                written.append(("wait-for graph", args.plot))
            else:
                from simnccl.outputs.plot import write_memory_plot

                write_memory_plot(results, args.plot)
                written.append(("memory plot", args.plot))
        if getattr(args, "trace", None) is not None:
            option = "--trace"
            from simnccl.outputs.chrome_trace import write_trace

            write_trace(results, args.trace)
            written.append(("Perfetto trace", args.trace))
        if getattr(args, "memory_snapshot", None) is not None:
            option = "--memory-snapshot"
            from simnccl.outputs.memory_snapshot import write_snapshots

            written.extend(("memory snapshot", p) for p in write_snapshots(results, args.memory_snapshot))
    except OSError as error:
        raise PictureError(f"{option}: cannot write {error.filename or ''}: {error.strerror or error}") from None
    for what, path in written:
        err_console.print(f"{what}: {path}", markup=False, highlight=False)

"""``simnccl sweep``: the command line, resume, progress, the table, and the exit code.

Exit codes (DESIGN rule 11): 0 every cell ok; 1 a cell's check failed or a cell was stopped by its limit;
2 bad input (the matrix, a flag, an output file that cannot be resumed, a missing extra, a scheduler that
does not answer); 70 a cell raised an exception (a bug: its row holds the traceback). 130 when interrupted,
after the files have been written with the rows finished so far.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from simnccl.cli_options import env_item, output_file_problem
from simnccl.cli_output import PipeAwareConsole, document_stream, write_all_to_stdout
from simnccl.memory import distinct_figures
from simnccl.policy.plans import UserPolicyError
from simnccl.runner import current_journal
from simnccl.sweep import executors
from simnccl.sweep.cell import WORKLOAD, Cell, PolicyCodeMismatch, blank_row, expand
from simnccl.sweep.executors import Executor, ExecutorError, check_address, run_cells
from simnccl.sweep.matrix import (
    DEFAULT_CELL_TIMEOUT_S,
    DEFAULT_MAX_CELLS,
    Matrix,
    SweepInputError,
    build_matrix,
    read_matrix_file,
    scenario_key,
)
from simnccl.sweep.store import (
    DONE_STATUSES,
    IDENTITY_FIELDS,
    Row,
    StoreError,
    append_csv,
    csv_text,
    json_document,
    json_text,
    read_csv,
    read_json,
    summary,
    write_csv,
    write_json,
)
from simnccl.visible_text import one_line

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED = 0, 1, 2, 70, 130
STDOUT = "-"
JSON_EVERY_S = 2.0  # the JSON document is rewritten whole: at most this often while cells finish, and at the end


def add_sweep_parser(sub: Any) -> argparse.ArgumentParser:
    """``simnccl sweep``'s parser, under the CLI's subparsers. The flags shared with other commands (--policy,
    --release, --gpu, --env, --variant, --json [FILE], --quiet) mean what they mean there; --policy, --release
    and --gpu may repeat, each value one value of the matrix's axis."""
    parser = sub.add_parser(
        "sweep",
        help="simulate a matrix of framework configs x policies x releases x GPU kinds x env (local or Dask)",
        description="Simulate every cell of a matrix; results as a table, CSV and JSON, resumable. See README "
        "'Sweeps' for the TOML format.",
        allow_abbrev=False,
    )
    parser.add_argument("matrix", nargs="?", help="a matrix TOML file (flags replace its keys of the same meaning)")
    cells = parser.add_argument_group("the matrix")
    cells.add_argument(
        "--workload",
        action="append",
        metavar="'GEN knob=value ...'",
        help="a framework config, e.g. 'megatron tp=2 pp=2 dp=2' (knobs as in simnccl cost; world=N when the "
        "knobs do not pin it down); repeatable",
    )
    cells.add_argument("--scenario", action="append", metavar="FILE", help="a scenario file's variants; repeatable")
    cells.add_argument("--variant", action="append", metavar="NAME", help="only this scenario variant (repeatable)")
    cells.add_argument(
        "--policy", action="append", metavar="SPEC", help="policy axis (repeatable; default torch-default)"
    )
    cells.add_argument("--release", action="append", metavar="RELEASE", help="release axis (repeatable; default 2.15)")
    cells.add_argument("--gpu", action="append", metavar="KIND", help="GPU kind axis (repeatable; default h100-80gb)")
    cells.add_argument(
        "--env", action="append", type=env_item, default=[], metavar="VAR=VALUE", help="set in every cell (repeatable)"
    )
    cells.add_argument(
        "--env-set",
        action="append",
        metavar="'VAR=V ...'",
        help="env axis: each value a set of variables ('' = none); repeatable",
    )
    cells.add_argument("--gpus-per-node", type=int, default=None, help="GPUs (= ranks) per node (default 8)")
    cells.add_argument(
        "--accept-verdict",
        action="append",
        metavar="VERDICT",
        help="a workload cell is ok with this verdict (repeatable; default pass); race: a pass that a race of the "
        "simulated timing decided (real runs may fail) is ok too, in any cell",
    )
    cells.add_argument(
        "--max-used-mib",
        type=float,
        default=None,
        help="a cell fails when a device's peak use over the run exceeds this (MiB)",
    )
    run = parser.add_argument_group("running")
    run.add_argument(
        "--cell-timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"wall-clock limit per cell (default {DEFAULT_CELL_TIMEOUT_S:g} s)",
    )
    run.add_argument(
        "--max-cells", type=int, default=None, help=f"refuse larger matrices (default {DEFAULT_MAX_CELLS})"
    )
    run.add_argument(
        "--jobs", type=int, default=None, help="local worker processes (default: CPU count; 1 = this process)"
    )
    run.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run the cells on this Dask scheduler's workers")
    run.add_argument("--dask-local", type=int, metavar="N", help="run the cells on a local Dask cluster of N workers")
    run.add_argument("--dry-run", action="store_true", help="validate and list the cells; run nothing")
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        metavar="FILE",
        help="the rows as one JSON document: to FILE (written as cells finish), or to stdout instead of the table",
    )
    out.add_argument("--csv", metavar="FILE", help="the rows as CSV: to FILE (appended as cells finish), or '-'")
    out.add_argument("--resume", action="store_true", help="continue the sweep in the --json/--csv FILE: skip its rows")
    out.add_argument(
        "--accept-matrix-change",
        action="store_true",
        help="with --resume: keep the rows of cells still in a changed matrix, run the rest (the file as it was "
        "is kept as FILE-STEM.matrix-HASH.SUFFIX when rows leave it)",
    )
    out.add_argument("--overwrite", action="store_true", help="replace an existing --json/--csv FILE")
    out.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar, no table: the cells not ok and a summary"
    )
    return parser


# ---------------------------------------------------------------------------------------------- input


def _executor(args: argparse.Namespace, cells: int) -> Executor:
    given = (("--scheduler", args.scheduler), ("--dask-local", args.dask_local))
    chosen = [flag for flag, value in given if value is not None]
    if len(chosen) > 1 or (chosen and args.jobs is not None):
        both = [*chosen, *(["--jobs"] if args.jobs is not None else [])]
        raise SweepInputError(both[1], f"choose one of {', '.join(both)} (where the cells run)")
    if chosen and not executors.dask_installed():  # found by a tester: --dry-run said exit 0
        raise SweepInputError(chosen[0], executors.DASK_MISSING)
    if args.scheduler is not None:
        try:
            return Executor("dask", scheduler=check_address(args.scheduler))
        except ValueError as err:
            raise SweepInputError("--scheduler", str(err)) from None
    if args.dask_local is not None:
        if not 1 <= args.dask_local <= 256:
            raise SweepInputError("--dask-local", f"expected 1 to 256 workers, got {args.dask_local}")
        return Executor("dask", dask_local=args.dask_local)
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if not 1 <= jobs <= 1024:
        raise SweepInputError("--jobs", f"expected 1 to 1024 processes, got {jobs}")
    jobs = min(jobs, max(cells, 1))
    return Executor("local", 1) if jobs == 1 else Executor("pool", jobs)


def _check_distinct(cells: Sequence[Cell]) -> None:
    """Two cells that compute the same thing (two labels for one config, an env set the fixed --env already
    makes) would be one row: refused, naming both."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        other = seen.setdefault(cell.cell_id, cell)
        if other is not cell:
            raise SweepInputError(
                "matrix",
                f"cells #{other.index} and #{cell.index} are the same simulation ({cell.label}, {cell.policy}, "
                f"{cell.release}, {cell.gpu}, env {dict(sorted(cell.env.items()))}); remove one of the values",
            )


def _target(value: str | None, flag: str) -> Path | None:
    if value is None or value == STDOUT:
        return None
    problem = output_file_problem(value)
    if problem is not None:
        raise SweepInputError(flag, problem)
    path = Path(value)
    if path.exists() and not path.is_file():
        # the output is replaced whole (a temporary file renamed over it): over a device or a FIFO that rename
        # replaced the node itself (run as root, --csv /dev/zero left /dev/zero a CSV file)
        raise SweepInputError(
            flag,
            f"{value!r} is not a regular file (a device, a FIFO or a socket); a sweep rewrites its output file "
            f"whole, so give a file path, or '{STDOUT}' for standard output",
        )
    return path


def _existing(path: Path | None) -> bool:
    return path is not None and path.is_file() and path.stat().st_size > 0


def _resume_rows(
    args: argparse.Namespace, json_path: Path | None, csv_path: Path | None, matrix: Matrix, cells: Sequence[Cell]
) -> tuple[dict[str, Row], list[str], list[tuple[Path, Path]]]:
    """The rows of finished cells in the output files, by cell_id (checked against this matrix), notes, and the
    copies to make before the files are rewritten: (a file, where the file as it was is kept).

    Why rows of cells not in this matrix are never dropped without a trace: resuming rewrites the file with this
    matrix's rows only, so a dropped row's result would be gone (hours of a large sweep, or all of it when
    ``--accept-verdict`` changed, as the checks are part of every cell's identity). In a file written for this
    very matrix such a row means the file was edited or mixed with another sweep's: refused (exit 2), naming the
    file, the row and why. With ``--accept-matrix-change`` the user changed the matrix on purpose (narrowed it,
    say), so those rows leave the sweep, but the file as it was is first kept beside it (``_kept_path``) and
    the note says where; a copy that is already there is never replaced (exit 2)."""
    found = [(flag, p) for flag, p in (("--json", json_path), ("--csv", csv_path)) if _existing(p)]
    if args.resume and json_path is None and csv_path is None:
        raise SweepInputError("--resume", "needs the sweep's file: --json FILE or --csv FILE")
    if args.overwrite:
        if args.resume:
            raise SweepInputError("--overwrite", "choose one of --resume (continue the file) and --overwrite")
        return {}, [], []
    current = matrix.fingerprint()
    wanted = {cell.cell_id: cell for cell in cells}
    notes: list[str] = []
    keep: list[tuple[Path, Path]] = []
    rows: dict[str, Row] = {}
    for flag, path in found:
        try:
            file_hash, file_matrix, file_rows = _read(flag, path)
        except StoreError as err:
            if args.resume:
                raise SweepInputError(flag, str(err)) from None
            raise SweepInputError(flag, f"{err}; pass --overwrite to replace it") from None
        if file_rows and not args.resume:
            raise SweepInputError(
                flag, f"{path} already holds a sweep; pass --resume to continue it, or --overwrite to start over"
            )
        if file_rows and file_hash != current and not args.accept_matrix_change:
            changed = _matrix_change(file_matrix, matrix.to_dict())
            raise SweepInputError(
                "--resume",
                f"{path} was written for another matrix ({file_hash}, now {current}){changed}; pass "
                "--accept-matrix-change to keep the rows of cells still in the matrix and run the rest",
            )
        gone = [row for row in file_rows if row["cell_id"] not in wanted]
        if gone and file_hash == current:
            row = gone[0]
            raise SweepInputError(
                "--resume",
                f"{path}: row {row['index']} ({row['workload']}, {row['policy']}, {row['release']}, {row['gpu']}, "
                f"cell {row['cell_id']}) is not a cell of this matrix, though the file was written for it: the "
                "file was edited or mixed with another sweep's, and resuming would drop "
                f"{'this row' if len(gone) == 1 else f'its {len(gone)} such rows'}",
            )
        if gone:
            kept = _kept_path(path, file_hash)
            if kept.exists() or kept.is_symlink():
                raise SweepInputError(
                    "--accept-matrix-change",
                    f"{path} has {len(gone)} row(s) of cells no longer in the matrix, to be kept in {kept}, "
                    "which already exists; move it away first",
                )
            keep.append((path, kept))
            notes.append(f"{len(gone)} row(s) of cells no longer in the matrix left {path}; kept in {kept}")
        in_file: set[str] = set()
        for row in file_rows:
            if row["cell_id"] in in_file:  # which of the two is the cell's result? (the first one silently won)
                raise SweepInputError(
                    "--resume",
                    f"{path} has two rows for cell {row['cell_id']}: the file was edited or damaged; pass "
                    "--overwrite to start over",
                )
            in_file.add(row["cell_id"])
            rows.setdefault(row["cell_id"], row)
    for cid, row in rows.items():
        cell = wanted.get(cid)
        problem = None if cell is None else _row_mismatch(row, cell)
        if problem is not None:
            raise SweepInputError(
                "--resume",
                f"row {row['index']} (cell {cid}) {problem}: the file was edited or damaged, and resuming would "
                "keep a result its cell did not give; pass --overwrite to start over",
            )
    again = [cid for cid, row in rows.items() if cid in wanted and row["status"] not in DONE_STATUSES]
    if again:
        notes.append(f"{len(again)} stopped or crashed cell(s) run again")
    done = {cid: {**row, "index": wanted[cid].index} for cid, row in rows.items() if cid in wanted and cid not in again}
    return done, notes, keep


_IDENTITY = tuple(key for key in IDENTITY_FIELDS if key not in ("index", "cell_id"))  # what a cell computes


def _row_mismatch(row: Row, cell: Cell) -> str | None:
    """How a row read back disagrees with the cell its ``cell_id`` names (None: it does not): a field of what
    the cell computes that differs, or an ``ok`` workload row whose verdict the cell's checks do not accept.
    Why: the id is a hash of the cell, not of the row, so an edited label, GPU or verdict kept its id and was
    taken in as that cell's result (and printed)."""
    blank = blank_row(cell)
    for key in _IDENTITY:
        ours, theirs = row[key], blank[key]
        if key == "scenario" and isinstance(ours, str) and isinstance(theirs, str):
            ours, theirs = scenario_key(ours), scenario_key(theirs)  # as the cell's identity names it
        if ours != theirs:
            return f"has {key} {row[key]!r} where its cell has {blank[key]!r}"
    if cell.kind == WORKLOAD and row["status"] == "ok" and row["verdict"] not in cell.checks.verdicts:
        return f"is ok with verdict {row['verdict']!r}, which its checks do not accept"
    if row["status"] == "ok" and row.get("check"):
        return f"is ok with a failed check {row['check']!r}"
    cap = cell.checks.max_used_mib if cell.kind == WORKLOAD else None
    used = row.get("used_mib_max")
    if row["status"] == "ok" and cap is not None and isinstance(used, int | float) and used > cap:
        # the run's peak is at least what it used at its checkpoint: a row over the cap cannot have passed it
        shown, cap_shown = distinct_figures(used, cap)
        return f"is ok with {shown} used MiB/device, over the cap of {cap_shown}"
    return None


def _kept_path(path: Path, file_hash: str | None) -> Path:
    """Where the file as it was is kept when a changed matrix leaves some of its rows out: beside it, named after
    the matrix it was written for (``out.json`` -> ``out.matrix-<hash>.json``). A hash that is not one (a
    damaged or hand-edited file) is not put in a file name."""
    tag = file_hash if isinstance(file_hash, str) and re.fullmatch(r"[0-9a-f]{1,64}", file_hash) else "unknown"
    return path.with_name(f"{path.stem}.matrix-{tag}{path.suffix}")


def _keep_copies(keep: Sequence[tuple[Path, Path]]) -> None:
    """Copy each file to its keeping place, byte for byte, never over an existing file (SweepInputError)."""
    for path, kept in keep:
        try:
            with path.open("rb") as source, kept.open("xb") as target:
                shutil.copyfileobj(source, target)
        except OSError as err:
            raise SweepInputError("--accept-matrix-change", f"cannot keep {path} as {kept}: {err}") from None


def _read(flag: str, path: Path) -> tuple[str | None, Mapping[str, Any] | None, list[Row]]:
    if flag == "--json":
        return read_json(path)
    file_hash, rows = read_csv(path)
    return file_hash, None, rows


def _matrix_change(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> str:
    if not isinstance(before, Mapping):
        return ""
    keys = [k for k in after if before.get(k) != after[k]]
    return f": {', '.join(keys)} changed" if keys else ""


# ---------------------------------------------------------------------------------------------- output


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() else f"{value:,.1f}"
    return str(value)


def render_table(rows: Sequence[Row], only_not_ok: bool = False) -> str:
    """Plain text (user text printed literally), one line per cell in matrix order."""
    header = ("#", "workload", "policy", "release", "gpu", "env", "status", "verdict", "comms", "NCCL MiB", "used MiB")
    lines = [header]
    for row in sorted(rows, key=lambda r: r["index"]):
        if only_not_ok and row["status"] == "ok":
            continue
        env = " ".join(f"{k}={v}" for k, v in row["env"].items()) or "-"
        text = [one_line(str(row[key])) for key in ("workload", "policy", "release", "gpu")]
        lines.append(
            (
                str(row["index"]),
                *text,
                one_line(env),
                one_line(str(row["status"])),
                one_line(str(row["verdict"] or "-")),
                _fmt(row["comms"]),
                _fmt(row["nccl_mib"]),
                _fmt(row["used_mib_max"]),
            )
        )
    if len(lines) == 1 and only_not_ok:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {0, 8, 9, 10}
    text = []
    for n, line in enumerate(lines):
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        text.append("  ".join(cells).rstrip())
        if n == 0:
            text.append("  ".join("-" * w for w in widths))
    notes = [
        f"  #{r['index']} {one_line(str(r['status']))}: {one_line(str(r['check']))}"
        for r in sorted(rows, key=lambda r: r["index"])
        if r["check"]
    ]
    return "\n".join(text + (["", *notes] if notes else [])) + "\n"


class _Progress:
    """A rich progress bar on ``stream`` (stderr) when it is a terminal and not --quiet; nothing otherwise."""

    def __init__(self, total: int, done: int, enabled: bool, stream: TextIO) -> None:
        self._bar = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=PipeAwareConsole(file=stream),  # a closed stderr: the guard's exit 141, not rich's exit 1
            transient=False,
        )
        self._task = self._bar.add_task("sweep", total=total, completed=done)
        self._bar.start()

    def advance(self, not_ok: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"sweep ({not_ok} not ok)" if not_ok else "sweep")

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# Crashes that are the user's input or a worker's missing prerequisite (exit 2), not simnccl's bug: a user's policy
# raising or answering with no plan (``UserPolicyError``, as ``simnccl run`` says), or a worker without the
# policy code the sweep was planned with (``PolicyCodeMismatch``).
NOT_A_BUG = (f"{UserPolicyError.__name__}:", f"{PolicyCodeMismatch.__name__}:")


def exit_code(rows: Sequence[Row]) -> int:
    """0 every cell ok; 70 a cell crashed in simnccl; 2 every crash was the user's input or a worker's missing
    prerequisite (``NOT_A_BUG``); 1 a check failed or a cell stopped."""
    statuses = {row["status"] for row in rows}
    if "crash" in statuses:
        crashes = [row for row in rows if row["status"] == "crash"]
        if all(str(row.get("check") or "").startswith(NOT_A_BUG) for row in crashes):
            return EXIT_BAD_INPUT
        return EXIT_BUG
    if statuses & {"fail", "stopped"}:
        return EXIT_CHECK_FAILED
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- entry


def run_sweep(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or document_stream(), err or sys.stderr
    if args.json and args.json.endswith(".toml") and args.matrix is None:  # `sweep --json matrix.toml`
        args.matrix, args.json = args.json, STDOUT
    try:
        data, source, base = None, "--matrix", None
        if args.matrix:
            path = Path(args.matrix)
            data, source, base = read_matrix_file(path), str(path), path.parent
        matrix, settings = build_matrix(args, data, source, base)
        count = matrix.cell_count()
        if args.json == STDOUT and args.csv == STDOUT:
            raise SweepInputError("--csv", "only one of --json and --csv can go to stdout")
        json_path, csv_path = _target(args.json, "--json"), _target(args.csv, "--csv")
        if json_path is not None and csv_path is not None and json_path.resolve() == csv_path.resolve():
            raise SweepInputError("--csv", f"{args.csv!r} is the --json file too; give the two different files")
        executor = _executor(args, count)
        cells = list(expand(matrix))  # the count was checked against --max-cells before this
        _check_distinct(cells)
        done, notes, keep = _resume_rows(args, json_path, csv_path, matrix, cells)
    except SweepInputError as error:
        err.write(f"error: {one_line(str(error))}\n")
        return EXIT_BAD_INPUT
    if args.dry_run:
        _print_cells(cells, done, out, err)
        return EXIT_OK
    try:
        _keep_copies(keep)
    except SweepInputError as error:
        err.write(f"error: {one_line(str(error))}\n")
        return EXIT_BAD_INPUT
    todo = [cell for cell in cells if cell.cell_id not in done]
    files = _Files(json_path, csv_path, matrix.to_dict(), matrix.fingerprint(), len(cells), done)
    for note in notes:
        err.write(f"simnccl sweep: {note}\n")
    err.write(
        f"simnccl sweep: {len(cells)} cells ({len(done)} done, {len(todo)} to run) on {executor.describe()}, "
        f"matrix {files.matrix_hash}\n"
    )
    progress = _Progress(len(cells), len(done), enabled=err.isatty() and not args.quiet, stream=err)
    start = time.monotonic()
    interrupted = False
    try:
        for row in run_cells(todo, executor, settings.cell_timeout_s):
            files.add(row)
            progress.advance(files.not_ok)
    except ExecutorError as error:
        err.write(f"error: {one_line(str(error))}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.stop()
        journal = current_journal()
        if journal is not None:  # what an output error's report says finished (it said "nothing had finished")
            journal.lines.append(
                f"finished  sweep: {len(files.rows)}/{len(cells)} cells have rows ({len(files.rows) - len(done)} run "
                "now; --csv appends each as it finishes)"
            )
        files.flush(final=True)
    ordered = files.ordered()
    counts = summary(ordered)
    _emit(args, out, files)
    err.write(
        f"simnccl sweep: {len(ordered)}/{len(cells)} cells: {counts['ok']} ok, {counts['fail']} failed, "
        f"{counts['stopped']} stopped, {counts['crash']} crashed; {len(ordered) - len(done)} run in "
        f"{time.monotonic() - start:.1f} s on {executor.describe()}\n"
    )
    if interrupted:
        err.write("simnccl sweep: interrupted; --resume continues from the output file\n")
        return EXIT_INTERRUPTED
    code = exit_code(ordered)
    if code == EXIT_BUG:  # exit 70 says "a bug": the rows hold the tracebacks (--json), so say where to send them
        bugs = [
            row["index"] for row in ordered if row["status"] == "crash" and not str(row["check"]).startswith(NOT_A_BUG)
        ]
        err.write(
            f"simnccl sweep: cell(s) {', '.join(f'#{i}' for i in bugs)} crashed: a bug in simnccl, or a policy that "
            "ended its own process; please report it (simnccl issue tracker) with the command and each such row's "
            "error field (its traceback: --json)\n"
        )
    return code


class _Files:
    """The rows so far and the files that keep them: the CSV gets each row at once (appended), the JSON document
    is rewritten whole at most every ``JSON_EVERY_S``; both are rewritten in matrix order at the end."""

    def __init__(
        self,
        json_path: Path | None,
        csv_path: Path | None,
        matrix: dict[str, Any],
        matrix_hash: str,
        cells: int,
        done: Mapping[str, Row],
    ) -> None:
        self.json_path, self.csv_path = json_path, csv_path
        self.matrix, self.matrix_hash, self.cells = matrix, matrix_hash, cells
        self.rows: dict[str, Row] = dict(done)
        self.not_ok = sum(1 for r in self.rows.values() if r["status"] != "ok")
        self._last_json = time.monotonic()
        self.flush(final=True)  # the kept rows only: a resumed file drops the cells that run again

    def add(self, row: Row) -> None:
        self.rows[row["cell_id"]] = row
        self.not_ok += row["status"] != "ok"
        if self.csv_path is not None:
            append_csv(self.csv_path, row, self.matrix_hash)
        if time.monotonic() - self._last_json >= JSON_EVERY_S:
            self.flush(final=False)

    def document(self) -> dict[str, Any]:
        return json_document(self.matrix, self.matrix_hash, self.cells, list(self.rows.values()))

    def ordered(self) -> list[Row]:
        return sorted(self.rows.values(), key=lambda r: r["index"])

    def flush(self, final: bool) -> None:
        if self.json_path is not None:
            write_json(self.json_path, self.document())
        if self.csv_path is not None and final:
            write_csv(self.csv_path, self.ordered(), self.matrix_hash)
        self._last_json = time.monotonic()


def _print_cells(cells: Sequence[Cell], done: Mapping[str, Row], out: TextIO, err: TextIO) -> None:
    """``--dry-run``: one tab-separated line per cell (index, cell id, config, policy, release, GPU, env, state)."""
    for cell in cells:
        env = " ".join(f"{k}={v}" for k, v in sorted(cell.env.items()))
        state = "done" if cell.cell_id in done else "to run"
        fields = (cell.index, cell.cell_id, cell.label, cell.policy, cell.release, cell.gpu, env, state)
        out.write("\t".join(one_line(str(f)) for f in fields) + "\n")
    err.write(f"simnccl sweep: {len(cells)} cells, {len(done)} done, {len(cells) - len(done)} to run (dry run)\n")


def _emit(args: argparse.Namespace, out: TextIO, files: _Files) -> None:
    if args.json == STDOUT:  # the document alone on stdout (``cli_output.document_owns_stdout``)
        write_all_to_stdout(json_text(files.document()), out)
    elif args.csv == STDOUT:
        write_all_to_stdout(csv_text(files.ordered(), files.matrix_hash), out)
    else:
        out.write(render_table(files.ordered(), only_not_ok=args.quiet))

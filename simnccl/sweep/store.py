"""A sweep's rows, and the two files they are kept in (CSV and JSON), written as cells finish and read back to
resume.

Why both files carry the matrix's fingerprint: a sweep resumed with another matrix would mix rows of two
experiments. The JSON document holds it (and the matrix itself) at the top; the CSV, which has no place for a
header, in a column of every row. Every row holds its cell's ``cell_id`` (a hash of what the cell computes),
which is what resume matches on: a row is the result of exactly one cell, wherever it sits in the matrix.

Schema (``SCHEMA_VERSION``; a reader refuses another version): the JSON document is
``{"schema": "simnccl.sweep", "schema_version", "simnccl_version", "matrix_hash", "matrix", "cells",
"summary": {status: count}, "rows": [...]}``; a CSV row is the same row with ``knobs`` and ``env`` as JSON text
and ``matrix_hash``, ``schema_version`` appended. ``RESULT_FIELDS`` are a row's result: the same in every run
of the same cell, on one process, a pool or a Dask cluster; ``wall_s`` and ``worker`` say how it ran.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from simnccl import __version__
from simnccl.cost import ROWS
from simnccl.limits import file_problem
from simnccl.scenario import VERDICTS
from simnccl.visible_text import brief

SCHEMA = "simnccl.sweep"
SCHEMA_VERSION = 1
STATUSES = ("ok", "fail", "stopped", "crash")
DONE_STATUSES = ("ok", "fail")  # resume skips these; a stopped or crashed cell runs again

FIGURES = tuple(key for key, _ in ROWS)  # calls, groups, singletons, duplicates, comms, nccl_mib, used_mib
FIGURE_FIELDS = tuple(f"{key}{suffix}" for key in FIGURES for suffix in ("", "_min", "_max"))
IDENTITY_FIELDS = (
    "index",
    "cell_id",
    "kind",
    "workload",
    "generator",
    "knobs",
    "world",
    "scenario",
    "variant",
    "gpu",
    "release",
    "policy",
    "env",
)
OUTCOME_FIELDS = ("status", "verdict", "check", "checkpoint", "event_count", "trace_hash", *FIGURE_FIELDS)
RUN_FIELDS = ("wall_s", "worker", "error")
FIELDS = (*IDENTITY_FIELDS, *OUTCOME_FIELDS, *RUN_FIELDS)
RESULT_FIELDS = tuple(f for f in FIELDS if f not in ("index", "wall_s", "worker", "error"))
CSV_FIELDS = (*FIELDS, "matrix_hash", "schema_version")

_INT_FIELDS = frozenset({"index", "world", "event_count", "schema_version"})
_FLOAT_FIELDS = frozenset({*FIGURE_FIELDS, "wall_s"})
_JSON_FIELDS = frozenset({"knobs", "env"})

Row = dict[str, Any]


class StoreError(ValueError):
    """An output file that cannot be resumed from (exit 2): the message names the file."""


def result_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """What must be identical between two runs of the same cell."""
    return {key: row[key] for key in RESULT_FIELDS}


def summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for row in rows:
        counts[row["status"]] += 1
    return counts


# ---------------------------------------------------------------------------------------------- writing


def _atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it: an interrupted sweep leaves the old file whole.
    A symbolic link is written through (its target is replaced, the link stays a link)."""
    path = path.resolve()
    # a short name of its own: one made from a long file name can be past what the file system takes
    fd, tmp = tempfile.mkstemp(prefix=".simnccl-sweep-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_document(matrix: Mapping[str, Any], matrix_hash: str, cells: int, rows: Sequence[Row]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "simnccl_version": __version__,
        "matrix_hash": matrix_hash,
        "matrix": matrix,
        "cells": cells,
        "summary": summary(rows),
        "rows": sorted(rows, key=lambda r: r["index"]),
    }


def json_text(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    _atomic_write(path, json_text(document))


def _csv_value(key: str, value: Any) -> Any:
    if key in _JSON_FIELDS:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "" if value is None else value


def csv_line(row: Mapping[str, Any], matrix_hash: str) -> str:
    out = io.StringIO()
    full = {**row, "matrix_hash": matrix_hash, "schema_version": SCHEMA_VERSION}
    csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n").writerow(
        {k: _csv_value(k, full[k]) for k in CSV_FIELDS}
    )
    return out.getvalue()


def csv_text(rows: Sequence[Row], matrix_hash: str) -> str:
    header = ",".join(CSV_FIELDS) + "\n"
    return header + "".join(csv_line(r, matrix_hash) for r in sorted(rows, key=lambda r: r["index"]))


def write_csv(path: Path, rows: Sequence[Row], matrix_hash: str) -> None:
    _atomic_write(path, csv_text(rows, matrix_hash))


def append_csv(path: Path, row: Row, matrix_hash: str) -> None:
    """One finished cell, appended and flushed at once (the file is rewritten in order at the end)."""
    with path.open("a", encoding="utf-8", newline="") as handle:
        handle.write(csv_line(row, matrix_hash))
        handle.flush()


# ---------------------------------------------------------------------------------------------- reading


def _typed(key: str, text: str) -> Any:
    if key in _JSON_FIELDS:
        return json.loads(text)
    if text == "":
        return None if key in _INT_FIELDS | _FLOAT_FIELDS else ""
    if key in _INT_FIELDS:
        return int(text)
    if key in _FLOAT_FIELDS:
        return float(text)
    return text


_LARGEST = 2**63  # no count, MiB or seconds figure of a row comes near it


def _row_problem(row: Mapping[str, Any]) -> str | None:
    """What is wrong with the types of a row read back (None: nothing), as this module writes them: integers,
    numbers, the ``knobs`` and ``env`` tables, text; a number may be missing (None).

    Why: a hand-edited or damaged resume file with ``"verdict": 5`` was taken in and crashed the report that
    printed it, a bug (exit 70) for what is bad input (exit 2)."""
    for key in FIELDS:
        value = row[key]
        if key in _INT_FIELDS or key in _FLOAT_FIELDS:
            kinds: tuple[type, ...] = (int,) if key in _INT_FIELDS else (int, float)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                return f"{key}: expected {'an integer' if kinds == (int,) else 'a number'}, got {value!r}"
            # counts, MiB, seconds; compared, never converted: math.isfinite(10**400) raised OverflowError (exit 70)
            if value is not None and not 0 <= value <= _LARGEST:
                return f"{key}: expected a finite number from 0 to 2**63, got {brief(value, 40)}"
        elif key in _JSON_FIELDS:
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                return f"{key}: expected a table, got {value!r}"
        elif not isinstance(value, str):
            return f"{key}: expected text, got {value!r}"
    if row["status"] not in STATUSES:
        return f"unknown status {row['status']!r}"
    if row["verdict"] not in VERDICTS and (row["verdict"] or row["status"] in DONE_STATUSES):
        return f"verdict {row['verdict']!r} is not one of {', '.join(VERDICTS)}"
    return None


def _regular(path: Path) -> None:
    """A file to resume from is a regular file (``limits.file_problem``): ``/dev/zero`` would be read until memory
    runs out, a FIFO blocks forever. No size limit: a sweep's own output grows with its cells. A file that is not
    there is the reader's to report."""
    problem = file_problem(path, sys.maxsize)
    if problem is not None and path.exists():
        raise StoreError(f"{path}: {problem}")


def read_csv(path: Path) -> tuple[str | None, list[Row]]:
    """(the matrix fingerprint, the rows) of a sweep CSV; StoreError naming the file when it is not one."""
    _regular(path)
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if tuple(reader.fieldnames or ()) != CSV_FIELDS:
                raise StoreError(
                    f"{path}: not a simnccl sweep CSV of schema version {SCHEMA_VERSION} (its header differs)"
                )
            rows, hashes = [], set()
            for n, raw in enumerate(reader, start=2):
                try:
                    full = {k: _typed(k, raw[k] or "") for k in CSV_FIELDS}
                except (ValueError, TypeError, RecursionError) as err:
                    raise StoreError(f"{path}: line {n}: unreadable row ({err})") from None
                if full["schema_version"] != SCHEMA_VERSION:
                    raise StoreError(
                        f"{path}: line {n}: schema version {full['schema_version']}, expected {SCHEMA_VERSION}"
                    )
                problem = _row_problem(full)
                if problem is not None:
                    raise StoreError(f"{path}: line {n}: {problem}")
                hashes.add(full.pop("matrix_hash"))
                full.pop("schema_version")
                rows.append(full)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise StoreError(f"{path}: cannot read: {err}") from None
    if len(hashes) > 1:
        raise StoreError(f"{path}: rows of {len(hashes)} different matrices; resume from one sweep's file")
    return (hashes.pop() if hashes else None), rows


def read_json(path: Path) -> tuple[str | None, Mapping[str, Any] | None, list[Row]]:
    """(the matrix fingerprint, the matrix, the rows) of a sweep JSON document."""
    _regular(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: undecodable, not JSON, or an integer of 5,000 digits
        raise StoreError(f"{path}: cannot read a sweep JSON document: {err}") from None
    except RecursionError:  # the decoder recurses once per level of nesting: no sweep document is that deep
        raise StoreError(f"{path}: not a sweep JSON document (nested too deep to read)") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise StoreError(f'{path}: not a simnccl sweep JSON document (no "schema": "{SCHEMA}")')
    if data.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {data.get('schema_version')!r}; this simnccl reads {SCHEMA_VERSION}")
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(FIELDS) <= set(r) for r in rows):
        raise StoreError(f'{path}: "rows" is not a list of sweep rows')
    for n, row in enumerate(rows):
        problem = _row_problem(row)
        if problem is not None:
            raise StoreError(f"{path}: rows[{n}]: {problem}")
    return data.get("matrix_hash"), data.get("matrix"), [{k: r[k] for k in FIELDS} for r in rows]

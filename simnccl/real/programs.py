"""Programs across a process boundary: ops to JSON-able dicts and back (no pickling of simnccl objects).

Why: rank processes are forked from a zygote and receive their program as JSON over a pipe (or, under
torchrun, load the scenario themselves); ``Op.to_dict`` already writes the torch-spelled fields, this is its
inverse. Imports only ``simnccl.ops``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from simnccl.ops import NO_OPTIONS, OP_TYPES, Op, PgOptions, Program


def op_from_dict(data: Mapping[str, Any]) -> Op:
    """The inverse of ``Op.to_dict``: ``{"op": "new_group", "ranks": [0, 1], ...}`` → ``NewGroup(...)``."""
    name = data.get("op")
    op_type = OP_TYPES.get(str(name))
    if op_type is None:
        raise ValueError(f"unknown op {name!r}; expected one of {', '.join(OP_TYPES)}")
    allowed = {f.name for f in fields(op_type)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "op":
            continue
        if key not in allowed:
            raise ValueError(f"unknown field {key!r} for op {name!r}; expected one of {', '.join(sorted(allowed))}")
        if key == "pg_options":
            kwargs[key] = PgOptions(**value) if value else NO_OPTIONS
        elif key == "split_ranks":
            kwargs[key] = tuple(tuple(int(r) for r in split) for split in value)
        elif key == "ranks" and value is not None:
            kwargs[key] = tuple(int(r) for r in value)
        else:
            kwargs[key] = value
    return op_type(**kwargs)


def program_from_list(ops: Sequence[Mapping[str, Any]]) -> Program:
    return Program(tuple(op_from_dict(d) for d in ops))


def programs_to_lists(programs: Sequence[Program]) -> list[list[dict[str, Any]]]:
    return [p.to_list() for p in programs]


def share_identical(programs: Sequence[Program]) -> tuple[Program, ...]:
    """Ranks with equal op lists share one Program object (DESIGN rule 8; lets the simulator use cohorts)."""
    shared: dict[tuple[Op, ...], Program] = {}
    return tuple(shared.setdefault(p.ops, p) for p in programs)

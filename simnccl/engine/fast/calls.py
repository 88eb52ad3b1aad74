"""Per program, per ``new_group`` op: a key shared by equal ops, and what an outsider needs to take the call.

Why: generators share op objects between ranks, but programs built per rank (captured ones) have equal,
distinct ops; decisions and outsider plans must be shared between those too (else every rank would decide, and
leave a step, on its own). So each op maps to the id of one canonical op per value, computed once per Program.
"""

from __future__ import annotations

from simnccl.c10d import Members
from simnccl.engine.planning import Planner
from simnccl.ops import NewGroup, Program

OutsiderEntry = tuple[int, dict[int, int], str | None, NewGroup]  # (op key, member index, bind, canonical op)


class CallTable:
    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self._tables: dict[int, tuple[Program, list[OutsiderEntry | None]]] = {}
        self._canonical: dict[NewGroup, NewGroup] = {}  # one op object per value (programs keep theirs alive)
        self._keys: dict[int, int] = {}  # id(program's op) -> id(its canonical op)
        self._last: tuple[Program | None, list[OutsiderEntry | None]] = (None, [])  # most ranks run one program

    def table(self, program: Program) -> list[OutsiderEntry | None]:
        """Per op of a program: (key, member index, bind, op) where a rank outside the group might take it as
        an outsider call (a world-wide ``new_group`` with a valid rank list), else None. Built once per Program."""
        last = self._last
        if last[0] is program:
            return last[1]
        cached = self._tables.get(id(program))
        if cached is not None and cached[0] is program:
            self._last = cached
            return cached[1]
        table: list[OutsiderEntry | None] = []
        canonical = self._canonical
        keys = self._keys
        for op in program.ops:
            entry = None
            if type(op) is NewGroup:
                same = canonical.setdefault(op, op)
                keys[id(op)] = id(same)
                members = self.planner.members(op)
                if not op.use_local_synchronization and isinstance(members, Members):
                    entry = (id(same), members.index, op.bind, same)
            table.append(entry)
        self._tables[id(program)] = self._last = (program, table)
        return table

    def op_key(self, program: Program, op: NewGroup) -> int:
        """The shared key of one of ``program``'s ``new_group`` ops (see ``table``)."""
        key = self._keys.get(id(op))
        if key is None:
            self.table(program)
            key = self._keys[id(op)]
        return key

"""``[workload]``: a generator's programs, or explicit steps expanded into one Program per rank.

Why the care: expansion is where a small file becomes big, so lengths are checked against the limits before an
op is built, and ranks reached by the same steps share one Program (DESIGN rule 8).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from simnccl import dtypes
from simnccl.limits import InputLimits, exceeded, number_text
from simnccl.nccl.knobs import nccl_config_problem
from simnccl.ops import (
    MIB,
    ON_A_GROUP,
    OP_TYPES,
    WORLD,
    Checkpoint,
    EmptyCache,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    PointToPoint,
    Program,
    SplitGroup,
    check_option,
    retired_field,
    type_name_problem,
)
from simnccl.policy.plans import TRAFFIC_KINDS
from simnccl.release import RELEASES, ReleaseError, resolve_backend
from simnccl.scenario.model import ScenarioError
from simnccl.scenario.reader import Reader, brief, finite, kind_of, ranks_in_world
from simnccl.visible_text import invisible_in

_OPTION_FIELDS = {f.name for f in fields(PgOptions)}


def read_programs(
    workload: Reader, world_size: int, limits: InputLimits, bound_elsewhere: tuple[str, ...] = ()
) -> tuple[Program, ...]:
    """Every rank's Program, from the framework generator or the steps. ``bound_elsewhere``: handles another
    section binds (``[recovery]``'s groups), which the steps may use without binding."""
    if "generator" in workload.table:
        # A framework startup (simnccl.workloads): the framework's own knobs in, every rank's Program out,
        # on the cluster's world; bad knobs are reported as workload.args.<key>.
        from simnccl.workloads import GENERATORS, WorkloadError

        generator = workload.get("generator", str)
        args = workload.get("args", dict, {}, what="a table of the generator's arguments")
        chosen = GENERATORS.get(generator)
        if chosen is None:
            raise workload.error(
                "generator",
                f"unknown workload generator {brief(generator)}; expected one of {', '.join(GENERATORS)}",
            )
        try:
            return chosen(args, world_size)
        except WorkloadError as err:
            key = f"args.{err.key}" if err.key else "args"
            raise workload.error(key, f"{err.message} (generator {generator!r}, world of {world_size} ranks)") from None
    raw_steps = workload.get("steps", list, what="a list of step tables")
    if not raw_steps:
        raise workload.error("steps", "expected at least one step")
    steps = [_step(Reader(workload.source, f"workload.steps[{i}]", raw), world_size) for i, raw in enumerate(raw_steps)]
    programs = _expand(workload, steps, world_size, limits)
    _check_names(workload, programs, bound_elsewhere)
    return programs


def _check_names(workload: Reader, programs: tuple[Program, ...], bound_elsewhere: tuple[str, ...]) -> None:
    """Every group handle a step uses is bound by some step, on some rank (or is ``world``), and no rank's program
    meets one checkpoint label twice.

    Why: a handle no step binds anywhere can only be a typo (``group = "wrold"``); it ran, failed every rank with
    NameError and ended as a failed expectation (exit 1). A handle bound on other ranks only is the program's
    own business (torch's ``NON_GROUP_MEMBER`` there), so it stays a simulated failure."""
    bound: set[str] = {WORLD, *bound_elsewhere}
    distinct = {id(p): p for p in programs}.values()
    used: dict[str, str] = {}
    seen: set[int] = set()
    for program in distinct:
        for op in program.ops:
            if id(op) in seen:
                continue
            seen.add(id(op))
            bind = getattr(op, "bind", None)
            if bind is not None:
                bound.add(bind)
            for field_name in ("group", "parent"):
                handle = getattr(op, field_name, None)
                if isinstance(handle, str):
                    used.setdefault(handle, f"{op.name}'s {field_name}")
    for program in distinct:  # an [[expect]] at a label met twice measured the last one, silently
        labels = [op.label for op in program.ops if type(op) is Checkpoint]
        if len(labels) != len(set(labels)):
            twice = next(label for label in labels if labels.count(label) > 1)
            raise workload.error(
                "steps", f"checkpoint {brief(twice)} is met twice in one rank's program; give each its own name"
            )
    unbound = sorted(h for h in used if h not in bound)
    if unbound:
        handle = unbound[0]
        known = ", ".join(sorted(bound)[:20]) + (", ..." if len(bound) > 20 else "")
        raise workload.error(
            "steps", f"{used[handle]} {brief(handle)} is a group handle no step binds; the bound handles: {known}"
        )


@dataclass(slots=True)
class _Step:
    """One parsed ``[workload] steps`` entry, before expansion."""

    reader: Reader
    op_type: type[Op]
    repeat: int
    targets: tuple[int, ...] | None  # None: every rank
    fields: dict[str, Any]
    per_rank: bool  # a field uses {rank}: every rank gets its own ops
    ops: tuple[Op, ...] = ()  # the repeat's ops when they are the same on every rank


def _step(reader: Reader, world_size: int) -> _Step:
    op_name = reader.get("op", str)
    op_type = OP_TYPES.get(op_name)
    if op_type is None:
        raise reader.error("op", f"unknown op {brief(op_name)}; expected one of {', '.join(OP_TYPES)}")
    retired = retired_field(op_name, reader.table)
    if retired is not None:
        raise reader.error(*retired)
    repeat = reader.get("repeat", int, 1)
    if repeat < 1:
        raise reader.error("repeat", f"expected an integer >= 1, got {repeat}")
    on_ranks = reader.int_list("on_ranks", None)
    if on_ranks is not None:
        if not on_ranks:
            raise reader.error("on_ranks", "expected at least one rank (omit the key for every rank)")
        ranks_in_world(reader, "on_ranks", on_ranks, world_size)  # as a group's ranks: in the world, each once
    raw_fields = {k: v for k, v in reader.table.items() if k not in ("op", "repeat", "on_ranks")}
    reader.used.update(raw_fields)
    per_rank = any(isinstance(v, str) and "{rank}" in v for v in raw_fields.values())
    targets = None if on_ranks is None else tuple(sorted(set(on_ranks)))
    return _Step(reader, op_type, repeat, targets, raw_fields, per_rank)


def _expand(workload: Reader, steps: list[_Step], world_size: int, limits: InputLimits) -> tuple[Program, ...]:
    """Every rank's Program. Ranks reached by the same steps share one Program (DESIGN rule 8), so the work
    is the distinct programs' length, not world x length; that length is checked against the limits
    (``max_program_ops``, ``max_expanded_ops``) before a single op is built."""
    everyone = [i for i, st in enumerate(steps) if st.targets is None]
    reached: dict[int, list[int]] = {}  # rank -> the on_ranks steps that reach it, in order
    for i, st in enumerate(steps):
        for rank in st.targets or ():
            reached.setdefault(rank, []).append(i)
    common_length = sum(steps[i].repeat for i in everyone)
    common_per_rank = any(steps[i].per_rank for i in everyone)
    total = 0
    # Op objects built: a step's ops once, a {rank}-templated step's once per rank it reaches.
    built = sum(st.repeat for st in steps if not st.per_rank)
    common_built = sum(steps[i].repeat for i in everyone if steps[i].per_rank)
    seen: set[tuple[int, ...]] = set()
    for rank in range(world_size):
        own = tuple(reached.get(rank, ()))
        length = common_length + sum(steps[i].repeat for i in own)
        if length > limits.max_program_ops:
            shown = f"rank {rank}'s program of {length} ops (the sum of repeat over its steps)"
            raise workload.error("steps", exceeded("max_program_ops", shown, limits.max_program_ops))
        if common_per_rank or any(steps[i].per_rank for i in own) or own not in seen:
            seen.add(own)
            total += length
        built += common_built + sum(steps[i].repeat for i in own if steps[i].per_rank)
    if total > limits.max_expanded_ops:
        shown = f"{total} ops over the distinct programs of {world_size} ranks"
        raise workload.error("steps", exceeded("max_expanded_ops", shown, limits.max_expanded_ops))
    if built > limits.max_built_ops:
        shown = f"{built} op objects ({{rank}}-templated steps make one per rank)"
        raise workload.error("steps", exceeded("max_built_ops", shown, limits.max_built_ops))
    for st in steps:
        if not st.per_rank:
            st.ops = tuple(
                _build_op(st.reader, st.op_type, st.fields, i, None, world_size, limits) for i in range(st.repeat)
            )
    by_steps: dict[tuple[int, ...], Program] = {}
    by_ops: dict[tuple[Op, ...], Program] = {}
    programs = []
    for rank in range(world_size):
        own = tuple(reached.get(rank, ()))
        program = by_steps.get(own)
        if program is None:
            ops: list[Op] = []
            for i in heapq.merge(everyone, own):
                st = steps[i]
                if st.per_rank:
                    ops.extend(
                        _build_op(st.reader, st.op_type, st.fields, n, rank, world_size, limits)
                        for n in range(st.repeat)
                    )
                else:
                    ops.extend(st.ops)
            key = tuple(ops)
            program = by_ops.setdefault(key, Program(key))
            if not common_per_rank and not any(steps[i].per_rank for i in own):
                by_steps[own] = program
        programs.append(program)
    return tuple(programs)


def _fill(value: Any, i: int, rank: int | None) -> Any:
    if isinstance(value, str):
        value = value.replace("{i}", str(i))
        if rank is not None:
            value = value.replace("{rank}", str(rank))
    return value


# Field names as the file spells them where the op's dataclass field differs (checkpoint ``name``: ``label``).
_FIELD_ALIASES: dict[tuple[str, str], str] = {("checkpoint", "name"): "label"}


def build_op(reader: Reader, op_type: type[Op], raw: Mapping[str, Any], world_size: int, limits: InputLimits) -> Op:
    """An op from its fields as a file gives them (no ``{i}``/``{rank}`` left to fill), checked as a step's op is:
    what a saved case's op is checked with (``simnccl.testing.case_file``)."""
    return _build_op(reader, op_type, raw, 0, None, world_size, limits)


def _build_op(
    reader: Reader,
    op_type: type[Op],
    raw: Mapping[str, Any],
    i: int,
    rank: int | None,
    world_size: int,
    limits: InputLimits,
) -> Op:
    """One op of a step, its fields checked. ``limits``: the load's (read once: ``current_limits`` reads the
    environment, and a step repeated 150,000 times spent most of its load reading it)."""
    allowed = {f.name: f for f in fields(op_type)}
    kwargs: dict[str, Any] = {}
    options: dict[str, Any] = {}
    if "size_mib" in raw and "size_bytes" in raw:  # one silently won
        raise reader.error("size_mib", "give size_mib or size_bytes, not both")
    for key, value in raw.items():
        value = _fill(value, i, rank)
        if key == "size_mib" and issubclass(op_type, ON_A_GROUP):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise reader.error(key, f"expected a non-negative number of MiB, got {brief(value)}")
            mib = finite(reader, key, value, 0, limits.max_message_mib, "max_message_mib", " of MiB")
            kwargs["size_bytes"] = round(mib * MIB)
            continue
        name = _FIELD_ALIASES.get((op_type.name, key), key)
        if name in _OPTION_FIELDS and "pg_options" in allowed:
            options[name] = _check_option(reader, key, name, value)
            continue
        if name not in allowed or name == "pg_options":
            expected = sorted(_REVERSE_ALIASES.get((op_type.name, k), k) for k in allowed if k != "pg_options")
            if "pg_options" in allowed:
                expected += sorted(_OPTION_FIELDS)
            if issubclass(op_type, ON_A_GROUP):
                expected.append("size_mib")
            raise reader.error(key, f"unknown field for op {op_type.name!r}; expected one of {', '.join(expected)}")
        kwargs[name] = _check_field(
            reader, key, name, _coerce(reader, key, value, allowed[name].type), world_size, limits
        )
    if options:
        kwargs["pg_options"] = PgOptions(**options)
    _check_backend(reader, op_type, kwargs.get("backend"))
    if op_type is SplitGroup and "split_ranks" not in kwargs:
        raise reader.error("split_ranks", "missing; expected a list of lists of parent ranks")
    if op_type is EmptyCache and "mib" not in kwargs:
        raise reader.error("mib", "missing; expected the MiB of the tag's memory given back to the device")
    if issubclass(op_type, PointToPoint):
        peer = kwargs.get("peer")
        if peer is None:
            raise reader.error("peer", "missing; expected the global rank of the other side")
        if not 0 <= peer < world_size:
            raise reader.error("peer", f"expected a rank in 0..{world_size - 1}, got {peer}")
    try:
        return op_type(**kwargs)
    except ValueError as err:  # a check the op makes of its fields together (a batch's sizes, one per peer)
        field_name, _, problem = str(err).removeprefix(f"{op_type.name}: ").partition(": ")
        raise reader.error(field_name, problem) from None


_REVERSE_ALIASES = {(op, field): key for (op, key), field in _FIELD_ALIASES.items()}
_OP_CLASSES = frozenset(OP_TYPES.values())


def check_op(op: object, source: str, where: str, limits: InputLimits) -> Op:
    """An op object of a program given in Python (``simnccl.testing.simulate``) through the checks a step's op
    passes, field by field (``ScenarioError``, a ValueError, naming ``source``, ``where`` and the field), but for
    its ranks; returned with lists of ranks made tuples (``NewGroup(ranks=[0, 1])`` is natural Python).

    Why: the dataclasses take any value, and the Python API ran what a file is refused for: a size of NaN spun
    until the wall-clock guard, a negative one passed, ``traffic="P2P"`` changed what a policy decides, a string
    where a number goes crashed deep in the engine. The ranks (``ranks``, ``src``, ``peer``, ``split_ranks``)
    are left to the simulated torch, which raises for them at the call as torch does: a program may test that."""
    op_type = type(op)
    plan = _FIELD_PLANS.get(op_type)
    if plan is None:
        if op_type not in _OP_CLASSES:
            raise ScenarioError(
                source, where, f"expected an op of simnccl.ops ({', '.join(OP_TYPES)}), got {kind_of(op)} {brief(op)}"
            )
        plan = _FIELD_PLANS[op_type] = tuple((f.name, f.default, str(f.type)) for f in fields(op_type))
    reader = Reader(source, where, {})
    as_tuples: dict[str, Any] = {}
    for name, default, text in plan:
        value = getattr(op, name)
        if value is default:  # most fields of most ops (NO_OPTIONS included): nothing to check
            continue
        if name == "pg_options":
            if not isinstance(value, PgOptions):
                raise reader.error(name, f"expected a PgOptions, got {kind_of(value)} {brief(value)}")
            for option, setting in value.to_dict().items():  # its types are checked when it is made
                _check_option(reader, f"pg_options.{option}", option, setting)
            continue
        if value == default and type(value) is type(default):
            continue
        lists = False
        if text.startswith("tuple") and value is not None:
            nested = name == "split_ranks"
            sequences = (list, tuple)
            if not isinstance(value, sequences) or (nested and not all(isinstance(v, sequences) for v in value)):
                wanted = "a list of lists of integers" if nested else "a list of integers"
                raise reader.error(name, f"expected {wanted}, got {kind_of(value)} {brief(value)}")
            lists = not isinstance(value, tuple) or (nested and not all(isinstance(v, tuple) for v in value))
            value = [list(v) for v in value] if nested else list(value)
        checked = _coerce(reader, name, value, text) if value is not None or "None" not in text else None
        _check_field(reader, name, name, checked, 0, limits, ranks=False)
        if name == "backend":
            _check_backend(reader, op_type, checked)
        if lists:
            as_tuples[name] = checked  # ``_coerce`` made them tuples
    return replace(op, **as_tuples) if as_tuples else op  # type: ignore[type-var]


_FIELD_PLANS: dict[type, tuple[tuple[str, Any, str], ...]] = {}  # op type -> (field, default, annotation) each


def _check_option(reader: Reader, key: str, name: str, value: Any) -> Any:
    """One ``pg_options`` field: torch's type for it (``check_option``) and NCCL's range (``nccl_config_problem``)."""
    try:
        value = check_option(name, value)
    except ValueError as err:
        raise reader.error(key, str(err).removeprefix(f"{name}: ")) from None
    problem = nccl_config_problem(name, value)
    if problem is not None:
        raise reader.error(key, problem)
    return value


def _check_backend(reader: Reader, op_type: type[Op], backend: Any) -> None:
    """A group-making op's backend is one torch knows (a name any release resolves)."""
    if op_type in (NewGroup, SplitGroup, InitProcessGroup) and backend is not None:
        try:
            resolve_backend(RELEASES["2.15"], backend, {})
        except ReleaseError as err:
            raise reader.error("backend", str(err)) from None


BYTES_IN_MIB = ("bytes", "MiB", MIB)  # a message's size is given in bytes, its limit (max_message_mib) in MiB


def _check_field(
    reader: Reader, key: str, name: str, value: Any, world_size: int, limits: InputLimits, *, ranks: bool = True
) -> Any:
    """Ranges of op fields whose values are sizes, times or ranks (the type is already checked); ``ranks``:
    whether ranks are checked against the world (a file's are; ``check_op`` leaves them to the simulated torch)."""
    if value is None:
        return value
    if name == "size_bytes":
        most = limits.max_message_mib * MIB
        return int(finite(reader, key, value, 0, most, "max_message_mib", " of bytes", BYTES_IN_MIB))
    if name == "seconds":
        return finite(reader, key, value, 0, limits.max_sim_time_s, "max_sim_time_s", " of seconds")
    if name == "timeout_s":
        if value <= 0:
            raise reader.error(key, f"expected a positive number of seconds, got {number_text(value)}")
        return finite(reader, key, value, 0, limits.max_sim_time_s, "max_sim_time_s", " of seconds")
    if name == "mib":
        return finite(reader, key, value, 0, limits.max_alloc_mib, "max_alloc_mib", " of MiB")
    if name == "gpu_memory_utilization":
        if not (math.isfinite(value) and 0 < value <= 1):
            raise reader.error(key, f"expected a fraction of the GPU's memory in (0, 1], got {number_text(value)}")
        return value
    if name == "error_type" and (problem := type_name_problem(value)) is not None:
        raise reader.error(key, problem)
    if name in ("sends", "recvs", "send_bytes", "recv_bytes") and len(value) > limits.max_program_ops:
        # a batch's ops count as a program's
        raise reader.error(key, exceeded("max_program_ops", f"a batch of {len(value)} {name}", limits.max_program_ops))
    if name in ("send_bytes", "recv_bytes"):
        most = limits.max_message_mib * MIB
        return tuple(int(finite(reader, key, v, 0, most, "max_message_mib", " of bytes", BYTES_IN_MIB)) for v in value)
    if name == "traffic" and value not in TRAFFIC_KINDS:  # a typo would change what a policy decides, silently
        raise reader.error(key, f"expected one of {', '.join(TRAFFIC_KINDS)}, got {brief(value)}")
    if name == "label" and (bad := invisible_in(value)) is not None:  # a checkpoint's name: [[expect]] quotes it
        raise reader.error(key, f"expected a name on one line without control characters, got {bad} in {brief(value)}")
    if name == "dtype" and not dtypes.is_known(value):
        raise reader.error(key, f"expected one of {dtypes.expected_text()}, got {brief(value)}")
    if ranks:
        _check_ranks(reader, key, name, value, world_size)
    if name in ("device", "device_id") and isinstance(value, int) and value < 0:
        raise reader.error(key, f"expected a device index >= 0, got {value}")
    return value


def _check_ranks(reader: Reader, key: str, name: str, value: Any, world_size: int) -> None:
    """A file's ranks (``src``, ``root``, ``ranks``, ``split_ranks``): in the world, each once, no split empty."""
    if name in ("src", "root"):
        ranks_in_world(reader, key, (value,), world_size)
    elif name == "ranks":
        ranks_in_world(reader, key, value, world_size)
    elif name in ("sends", "recvs"):  # a batch's peers: one may come twice (two messages to it, in order)
        for peer in value:
            if not 0 <= peer < world_size:
                raise reader.error(key, f"expected ranks in 0..{world_size - 1}, got {peer}")
    elif name == "split_ranks":
        if not value:
            raise reader.error(key, "expected at least one split (a list of parent ranks)")
        for index, split in enumerate(value):
            if not split:
                raise reader.error(key, f"split {index} is empty; expected at least one parent rank")
            ranks_in_world(reader, key, split, world_size)


def _coerce(reader: Reader, key: str, value: Any, annotation: str) -> Any:
    """Check one op field against its annotation (the dataclasses use string annotations)."""
    text = str(annotation)
    if key == "split_ranks":
        if not isinstance(value, list) or not all(
            isinstance(s, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in s) for s in value
        ):
            raise reader.error(key, f"expected a list of lists of integers, got {brief(value)}")
        return tuple(tuple(s) for s in value)
    if text.startswith("tuple[int"):
        if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
            raise reader.error(key, f"expected a list of integers, got {brief(value)}")
        return tuple(value)
    if text == "bool":
        if not isinstance(value, bool):
            raise reader.error(key, f"expected a boolean, got {kind_of(value)} {brief(value)}")
        return value
    if text == "float" or text.startswith("float"):
        return finite(reader, key, value, -math.inf)
    if text.startswith("int | str"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise reader.error(key, f"expected an integer or a device string, got {kind_of(value)} {brief(value)}")
        return value
    if text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise reader.error(key, f"expected an integer, got {kind_of(value)} {brief(value)}")
        return value
    if text.startswith("str"):
        if not isinstance(value, str):
            raise reader.error(key, f"expected a string, got {kind_of(value)} {brief(value)}")
        return value
    return value  # pragma: no cover - every op field type is handled above

"""A saved case file (what the pytest plugin writes when a property test fails) checked before it is replayed.

Why: ``python -m simnccl.testing.replay CASE.json`` runs a file a person may have edited, trimmed to the ops
that matter, or received from a colleague, and every field went straight into the simulator: a ``null`` env, an
unknown GPU, a negative ``size_bytes``, a NaN ``seconds`` or a ``rank_program`` of -1 crashed it (exit 70, a
bug) or ran something the file does not say. Each field is checked here as a scenario's is (the ops through the
scenario reader's own field checks, ``simnccl.scenario.steps``), so a bad file is exit 2, one line naming the
key, whatever is wrong with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from simnccl.cluster import ClusterError, get_gpu_kind
from simnccl.env_knobs import env_problem
from simnccl.limits import current as current_limits
from simnccl.limits import exceeded
from simnccl.ops import OP_TYPES, retired_field
from simnccl.profiles import ProfileError, find_profile
from simnccl.release import RELEASES
from simnccl.scenario import ScenarioError
from simnccl.scenario.reader import Reader, brief
from simnccl.scenario.steps import build_op

_KEYS = ("schema", "gpu", "nodes", "gpus_per_node", "release", "env", "policy", "note", "programs", "rank_program")


class CaseFileError(ValueError):
    """A case file that cannot be replayed: ``key: what was expected`` (exit 2)."""


def _count(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CaseFileError(f"{key}: expected an integer >= 1, got {brief(value)}")
    return value


def check_case(data: Any) -> None:
    """Raise ``CaseFileError`` naming the first key of ``data`` (a case file's JSON) that cannot be replayed."""
    if not isinstance(data, dict):
        raise CaseFileError(f"expected a JSON object, got {brief(data)}")
    unknown = sorted(set(data) - {*_KEYS, "failure"})
    if unknown:
        raise CaseFileError(f"{brief(unknown[0])}: unknown key; expected one of {', '.join(_KEYS)}")
    gpu, release = data.get("gpu"), data.get("release")
    if not isinstance(gpu, str):
        raise CaseFileError(f"gpu: expected a GPU kind, got {brief(gpu)}")
    try:
        get_gpu_kind(gpu)
    except ClusterError as err:
        raise CaseFileError(f"gpu: {err}") from None
    if not isinstance(release, str) or release not in RELEASES:
        raise CaseFileError(f"release: expected one of {', '.join(RELEASES)}, got {brief(release)}")
    try:
        find_profile(gpu, release)
    except ProfileError as err:
        raise CaseFileError(f"gpu/release: {err}") from None
    world = _count(data, "nodes") * _count(data, "gpus_per_node")
    limits = current_limits()
    if world > limits.max_world_size:
        too_many = exceeded("max_world_size", f"{world} ranks", limits.max_world_size)
        raise CaseFileError(f"nodes x gpus_per_node: {too_many}")
    env = data.get("env", {})
    if not isinstance(env, dict):
        raise CaseFileError(f"env: expected an object of strings, got {brief(env)}")
    for name, value in env.items():
        problem = env_problem(name, value, ()) if isinstance(value, str) else f"expected a string, got {brief(value)}"
        if problem is not None:
            raise CaseFileError(f"env.{name}: {problem}")
    note = data.get("note", "")
    if not isinstance(note, str):
        raise CaseFileError(f"note: expected text, got {brief(note)}")
    programs = data.get("programs")
    if not isinstance(programs, list) or not programs or len(programs) > world:
        raise CaseFileError(f"programs: expected 1 to {world} lists of ops, got {brief(programs)}")
    for p, ops in enumerate(programs):
        if not isinstance(ops, list) or len(ops) > limits.max_program_ops:
            raise CaseFileError(f"programs[{p}]: expected a list of at most {limits.max_program_ops} ops")
        for i, op in enumerate(ops):
            _check_op(op, f"programs[{p}][{i}]", world)
    chosen = data.get("rank_program")
    valid = range(len(programs))
    if (
        not isinstance(chosen, list)
        or len(chosen) != world
        or not all(type(i) is int and i in valid for i in chosen)  # bool and -1 (the last one) are no index
    ):
        raise CaseFileError(
            f"rank_program: expected {world} indexes (one per rank) in 0..{len(programs) - 1}, got {brief(chosen)}"
        )


def _check_op(op: Any, where: str, world: int) -> None:
    """One op's dict (``Op.to_dict``: its options as one ``pg_options`` object) through the scenario reader's
    field checks, which a scenario step's op passes."""
    if not isinstance(op, dict) or not isinstance(op.get("op"), str) or op["op"] not in OP_TYPES:
        raise CaseFileError(f"{where}: expected an op object ({{'op': one of {', '.join(OP_TYPES)}, ...}})")
    retired = retired_field(op["op"], op)  # a field an older simnccl wrote: named with what replaced it
    if retired is not None:
        raise CaseFileError(f"{where}: {op['op']} op: {retired[0]}: {retired[1]}")
    known = {f.name for f in fields(OP_TYPES[op["op"]])}
    unknown = [k for k in op if k != "op" and k not in known]
    if unknown:  # a scenario's spelling (size_mib, a checkpoint's name, an option at the top): not a case's
        raise CaseFileError(
            f"{where}: {brief(unknown[0])}: unknown field for op {op['op']!r} in a case file (written as "
            f"Op.to_dict writes it); expected one of {', '.join(sorted(known))}"
        )
    raw = {k: v for k, v in op.items() if k not in ("op", "pg_options")}
    options = op.get("pg_options", {})
    if not isinstance(options, dict):
        raise CaseFileError(f"{where}.pg_options: expected an object, got {brief(options)}")
    raw.update(options)
    try:
        build_op(Reader("", where, raw), OP_TYPES[op["op"]], raw, world, current_limits())
    except ScenarioError as err:
        raise CaseFileError(str(err).removeprefix(": ")) from None
